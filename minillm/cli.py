"""`minillm` command line (also `python -m minillm`): `generate`, `eval ppl|kv-variants`,
`napkin`, `bench decode|quant|speculative|batching|serve|tp`, `serve` (an OpenAI-compatible HTTP
server) and `train` (as `python -m minillm.train`); `minillm COMMAND --help` gives the options.

Commands that print figures share --json (one JSON object on stdout); those that run a model
share --model NAME|PATH and --threads N (argparse parent parsers); `_report` prints every result.
The `bench` commands live in minillm/bench/commands.py. `generate` and `serve` take --tp N
(tensor parallelism over N ranks, minillm/parallel); `generate` also runs as one rank of
`torchrun --nproc-per-node N -m minillm generate ...`.
"""
from __future__ import annotations

import argparse
import sys
import time

import torch

from .bench.commands import (
    cmd_bench_batching,
    cmd_bench_decode,
    cmd_bench_quant,
    cmd_bench_serve,
    cmd_bench_speculative,
    cmd_bench_tp,
)
from .bench.commands import report as _report
from .parallel.launch import RankFailure
from .quant import SCHEMES


def _set_threads(a) -> None:
    """--threads N: torch's intra-op threads for the whole command (default: torch's)."""
    if getattr(a, "threads", None) is not None:
        if a.threads < 1:
            raise ValueError(f"--threads must be >= 1, got {a.threads}")
        torch.set_num_threads(a.threads)


def _load(name):
    import minillm
    return minillm.load(name), minillm.load_tokenizer(name)


def _load_tokenizer(name):
    import minillm
    return minillm.load_tokenizer(name)


def _tp_threads(a) -> int:
    """Torch threads per rank with --tp: --threads (default: the cores) is the total, shared
    out over the ranks, as `serve --replicas` shares it over its copies."""
    import os
    if a.tp < 1:
        raise ValueError(f"--tp must be >= 1 (the number of ranks), got {a.tp}")
    return max(1, (a.threads or os.cpu_count() or 1) // a.tp)


def cmd_generate(a) -> int:
    from .parallel.launch import from_torchrun
    from .sampling import SamplingParams
    _tp_threads(a)                                   # checks --tp
    if from_torchrun() is not None or a.tp > 1:
        tok = _load_tokenizer(a.model)
    else:
        model, tok = _load(a.model)
    params = SamplingParams(temperature=a.temperature, top_k=a.top_k, top_p=a.top_p,
                            max_new_tokens=a.max_new_tokens, seed=a.seed,
                            stop_ids=(tok.eos_id,) if tok.eos_id is not None else ())
    prompt = tok.encode(a.prompt)
    if not prompt:
        raise ValueError("the prompt is empty: give at least one character")
    t0 = time.perf_counter()
    dt = None                           # with --tp: the generation's time, not the ranks' start
    if from_torchrun() is not None:     # torchrun started this rank: run its part, rank 0 reports
        out, rank = _generate_torchrun(a, prompt, params)
        if rank != 0:
            return 0
        new, dt = out
    elif a.tp > 1:
        if a.steps is not None:
            raise ValueError("--steps is for a masked-diffusion model, which --tp does not split")
        from .parallel.generate import generate_tp
        new, dt = generate_tp(a.model, prompt, params, a.tp, threads=_tp_threads(a),
                              timeout_s=a.tp_timeout)
    elif model.config.causal:
        from .generate import generate_naive
        if a.steps is not None:
            raise ValueError("--steps is for a masked-diffusion model (e.g. --model diffusion)")
        new = generate_naive(model, prompt, params)[0]
    else:                       # lab 09: unmask max_new_tokens in --steps passes
        from .diffusion import sample
        if a.top_k or a.top_p != 1.0:
            raise ValueError("a diffusion model samples with --temperature only (no top-k/top-p)")
        steps = a.steps if a.steps is not None else max(1, a.max_new_tokens // 4)
        new, _ = sample(model, prompt, a.max_new_tokens, steps, temperature=a.temperature,
                        seed=a.seed)
    dt = time.perf_counter() - t0 if dt is None else dt
    return _report(a, {"model": a.model, "prompt": a.prompt, "completion": tok.decode(new),
                       "prompt_tokens": len(prompt), "new_tokens": len(new), "seconds": dt,
                       "tok_s": len(new) / dt if dt else None, "tp": a.tp},
                   lambda r: r["prompt"] + r["completion"])


def _generate_torchrun(a, prompt, params):
    """`torchrun --nproc-per-node W -m minillm generate ...`: this process is one rank."""
    from .parallel.generate import generate_rank
    from .parallel.launch import close_group, from_torchrun, init_group
    rank, world = from_torchrun()
    if a.tp not in (1, world):
        raise ValueError(f"--tp {a.tp} disagrees with torchrun's world size {world}")
    a.tp = world
    init_group(rank, world, "env://", timeout_s=a.tp_timeout)
    try:
        return generate_rank(rank, world, a.model, prompt, params), rank
    finally:
        close_group(together=True)


def cmd_eval(a) -> int:
    from .evaluate import perplexity
    from .quant import model_bytes, quantize_model
    model, tok = _load(a.model)
    model = model.float()
    if a.quant is not None:
        calib = None
        if a.quant == "int4-awq":          # calibration text from the TRAIN split, never val
            from .data import load_tokens
            calib = load_tokens(tok, "train")[:4 * 256].reshape(4, 256)
        model = quantize_model(model, a.quant, calib_ids=calib)
    if a.kv_int8:                          # attention reads an int8 KV cache (minillm.kvquant)
        from .kvquant import with_kv_cache
        model = with_kv_cache(model)
    r = perplexity(model, tok, split=a.split, max_tokens=a.max_tokens)
    out = {"model": a.model, "quant": a.quant, "kv_int8": a.kv_int8, "split": r["split"],
           "tokens": r["tokens"], "loss": r["loss"], "ppl": r["ppl"],
           "model_bytes": model_bytes(model)}
    return _report(a, out, lambda o: (
        f"{a.model} ({a.quant or 'bf16 weights'}, {o['model_bytes'] / 1e6:.2f} MB): "
        f"{o['tokens']} {a.split} tokens, loss {o['loss']:.4f}, perplexity {o['ppl']:.2f}"))


def cmd_eval_kv(a) -> int:
    from .attention import survey
    model, tok = _load(a.model)
    rows = survey(model.float(), tok, max_tokens=a.max_tokens)
    return _report(a, {"model": a.model, "max_tokens": a.max_tokens, "variants": rows},
                   lambda o: "\n".join([f"{'variant':<28}{'KV bytes/token':>16}{'ppl':>9}"] + [
                       f"{r['name']:<28}{r['kv_bytes_per_token']:>16.0f}{r['ppl']:>9.2f}"
                       for r in o["variants"]]))


def cmd_napkin(a) -> int:
    from .roofline import napkin
    r = napkin(a.model, a.gpu, a.batch, a.seq_len, kv_heads=a.kv_heads,
               bytes_per_param=a.bytes_per_param)
    return _report(a, r, lambda r: (
        f"{r['model']} on {r['gpu']}, B={r['batch']}, S={r['seq_len']}, K={r['kv_heads']}: "
        f"params {r['params'] / 1e9:.2f}B, memory {r['memory_bytes'] / 1e9:.1f} GB "
        f"({'fits' if r['fits'] else 'does NOT fit'}), latency {r['latency_s'] * 1e3:.2f} "
        f"ms/token, throughput {r['throughput_tok_s']:.0f} tok/s"))


def cmd_serve(a) -> int:
    from .parallel.launch import from_torchrun
    from .serving.server import serve
    _tp_threads(a)                                   # checks --tp
    if a.replicas != 1:                 # N copies behind one front (serving/replicas.py)
        from .serving.replicas import serve_replicas
        return serve_replicas(a.model, a.replicas, threads=a.threads, host=a.host, port=a.port,
                              engine_args=_serve_engine_args(a), ranks_each=a.tp)
    kw = dict(max_num_seqs=a.max_num_seqs, kv_blocks=a.kv_blocks, block_size=a.block_size,
              max_batched_tokens=a.max_batched_tokens, backend=a.backend)
    torchrun = from_torchrun()
    if torchrun is not None:           # torchrun started this rank
        if a.tp not in (1, torchrun[1]):
            raise ValueError(f"--tp {a.tp} disagrees with torchrun's world size {torchrun[1]}")
        a.tp = torchrun[1]
    if a.tp > 1:                       # rank 0 here serves; ranks 1.. follow its steps
        if a.device == "cuda":
            raise ValueError("--tp runs its ranks on the CPU (gloo); NCCL serving is not built")
        import minillm
        from kernels.intmath import cdiv

        from .parallel.serving import follow, start_tp_serving
        tok = minillm.load_tokenizer(a.model)
        from .weights import read_config
        ctx = read_config(minillm.resolve(a.model))[0].max_seq_len    # the weights load once, per rank
        kw["kv_blocks"] = a.kv_blocks or a.max_num_seqs * cdiv(ctx, a.block_size)
        torch.set_num_threads(_tp_threads(a))
        if torchrun is not None and torchrun[0] != 0:        # a worker rank: follow rank 0
            from .parallel.launch import close_group, init_group
            init_group(torchrun[0], a.tp, "env://", timeout_s=a.tp_timeout)
            try:
                follow(torchrun[0], a.tp, a.model, kw["kv_blocks"], a.block_size, a.backend,
                       a.tp_timeout)
            finally:
                close_group(together=True)
            return 0
        model, kw["runner"] = start_tp_serving(
            a.model, a.tp, num_blocks=kw["kv_blocks"], block_size=a.block_size,
            backend=a.backend, threads=_tp_threads(a), timeout_s=a.tp_timeout,
            torchrun=torchrun is not None)
    else:
        model, tok = _load(a.model)
        if a.device == "cuda":
            model = model.to("cuda")
    serve(model, tok, a.model, host=a.host, port=a.port,
          on_ready=lambda msg: print(msg, flush=True), **kw)
    return 0


def _serve_engine_args(a) -> list[str]:
    """The engine options of `serve`, as each replica's command line takes them."""
    args = ["--max-num-seqs", a.max_num_seqs, "--block-size", a.block_size,
            "--backend", a.backend, "--device", a.device]
    for flag, value in (("--kv-blocks", a.kv_blocks), ("--max-batched-tokens",
                                                      a.max_batched_tokens)):
        if value is not None:
            args += [flag, value]
    if a.tp > 1:
        args += ["--tp", a.tp, "--tp-timeout", a.tp_timeout]
    return [str(x) for x in args]


def _tp_options(parser) -> None:
    from .parallel.launch import DEFAULT_TIMEOUT_S
    parser.add_argument("--tp", type=int, default=1,
                        help="tensor parallelism: split the model over this many ranks "
                             "(spawned processes on gloo; --threads, the total, is shared out)")
    parser.add_argument("--tp-timeout", type=float, default=DEFAULT_TIMEOUT_S,
                        help="seconds a rank waits for its peers before it gives up "
                             "(a rank that died or hung)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="minillm", description="tiny LLM inference stack")
    sub = p.add_subparsers(dest="command", required=True)
    # the options every figure-printing command shares (argparse parents)
    out = argparse.ArgumentParser(add_help=False)
    out.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    run = argparse.ArgumentParser(add_help=False, parents=[out])
    run.add_argument("--model", default="target",
                     help="shipped name (target, draft, draft-distilled, hybrid, diffusion) or "
                          "directory")
    run.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")

    g = sub.add_parser("generate", parents=[run],
                       help="continue a prompt with a model (naive loop)")
    g.add_argument("prompt")
    g.add_argument("--max-new-tokens", type=int, default=64)
    g.add_argument("--temperature", type=float, default=0.8)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--steps", type=int, default=None,
                   help="diffusion models: forward passes (default: max-new-tokens / 4)")
    _tp_options(g)
    g.set_defaults(func=cmd_generate)

    e = sub.add_parser("eval", help="evaluation figures")
    esub = e.add_subparsers(dest="metric", required=True)
    ppl = esub.add_parser("ppl", parents=[run], help="held-out perplexity")
    ppl.add_argument("--split", default="val", choices=["val", "train"])
    ppl.add_argument("--max-tokens", type=int, default=None, help="evaluate a prefix only")
    ppl.add_argument("--quant", default=None, choices=SCHEMES,
                     help="quantize the linear layers first (see minillm.quant)")
    ppl.add_argument("--kv-int8", action="store_true",
                     help="run attention through an int8 KV cache (see minillm.kvquant)")
    ppl.set_defaults(func=cmd_eval)

    kv = esub.add_parser("kv-variants", parents=[run], help="KV bytes/token and held-out "
                         "perplexity of every KV-shrinking conversion (lab 03)")
    kv.add_argument("--max-tokens", type=int, default=8192)
    kv.set_defaults(func=cmd_eval_kv)

    n = sub.add_parser("napkin", parents=[out],
                       help="the lecture's memory / latency / throughput napkin math")
    n.add_argument("--model", default="llama-2-13b", help="preset name (see minillm.roofline)")
    n.add_argument("--gpu", default="h100", help="h100, a100, h200")
    n.add_argument("--batch", type=int, default=1)
    n.add_argument("--seq-len", type=int, default=1000)
    n.add_argument("--kv-heads", type=int, default=None, help="override K (GQA what-if)")
    n.add_argument("--bytes-per-param", type=float, default=2.0)
    n.set_defaults(func=cmd_napkin)

    b = sub.add_parser("bench", help="measured speed comparisons (ratios from one run)")
    bsub = b.add_subparsers(dest="bench", required=True)
    bd = bsub.add_parser("decode", parents=[run],
                         help="naive vs KV-cached decode (and Hugging Face) tokens/s")
    bd.add_argument("--prompt-len", type=int, default=32)
    bd.add_argument("--new-tokens", type=int, default=256)
    bd.add_argument("--batch", type=int, default=1)
    bd.add_argument("--repeats", type=int, default=3)
    bd.add_argument("--seed", type=int, default=0)
    bd.add_argument("--dtype", default="float32,bfloat16",
                    help="weight formats to time, comma-separated (float32, bfloat16)")
    bd.add_argument("--no-fused-step", action="store_true",
                    help="skip the fused batch-1 step (minillm.decode.compiled: torch.compile "
                         "takes 10-40 s the first time)")
    bd.add_argument("--vs-hf", action="store_true", help="also time Hugging Face generate")
    bd.add_argument("--compile", action="store_true",
                    help="also time the cached loop under torch.compile (compiles for ~1 min)")
    bd.add_argument("--no-naive", action="store_true", help="skip the (slow) naive loop")
    bd.add_argument("--cpu-time", action="store_true",
                    help="time in CPU seconds of this process (time.process_time): with "
                         "--threads 1, a busy neighbour then adds nothing to any variant")
    bd.set_defaults(func=cmd_bench_decode)

    bq = bsub.add_parser("quant", parents=[run],
                         help="batch-1 decode with fp32, bf16, int8 and int4 weights")
    bq.add_argument("--prompt-len", type=int, default=32,
                    help="tokens from the start of the validation text")
    bq.add_argument("--new-tokens", type=int, default=256)
    bq.add_argument("--repeats", type=int, default=5)
    bq.add_argument("--group-size", type=int, default=64, help="int4 group size (32, 64, 128)")
    bq.add_argument("--step", choices=("compiled", "packed"), default="compiled",
                    help="each format's batch-1 step: one function compiled by torch.compile "
                         "(minillm.decode.compiled; compiles on first use, cached on disk) or "
                         "op by op (minillm.decode.packed.PackedDecoder; no compiler)")
    bq.set_defaults(func=cmd_bench_quant)

    bs = bsub.add_parser("speculative", parents=[run], help="speculative vs plain greedy decoding")
    bs.add_argument("--draft", default="draft-distilled",
                    help="the draft model: a shipped name (draft-distilled, the best measured; "
                         "draft) or a checkpoint directory")
    bs.add_argument("--draft-engine", choices=("packed", "compiled-int8"),
                    default="compiled-int8", help="how the draft runs its steps: int8 weights "
                    "in one compiled function (compiles on first use), or fp32 op by op")
    bs.add_argument("--temperature", type=float, default=0.8,
                    help="also time sampling at this temperature (0: greedy runs only)")
    bs.add_argument("--sample-k", type=int, default=3, help="draft length of the sampled run")
    bs.add_argument("--prompt", default="HAMLET.\nTo be, or not to be, that is the question:\n")
    bs.add_argument("--k", default="1,2,3,4,6", help="comma-separated draft lengths")
    bs.add_argument("--new-tokens", type=int, default=128)
    bs.add_argument("--repeats", type=int, default=3)
    bs.add_argument("--lookup-k", type=int, default=6,
                    help="draft length of prompt lookup (on a repetitive prompt)")
    bs.add_argument("--lookup-new-tokens", type=int, default=None,
                    help="new tokens of the prompt-lookup runs (default: --new-tokens)")
    bs.add_argument("--no-lookup", action="store_true", help="skip the prompt-lookup runs")
    bs.add_argument("--no-predict", action="store_true",
                    help="report the measurements only, not the formulas' predictions "
                         "(lab 05 predicts with the student's own formulas)")
    bs.add_argument("--cpu-time", action="store_true",
                    help="time in CPU seconds of this process (time.process_time): with "
                         "--threads 1, a busy neighbour then adds nothing to any run")
    bs.set_defaults(func=cmd_bench_speculative)

    bb = bsub.add_parser("batching", parents=[run], help="static vs continuous batching on a "
                         "seeded Poisson trace (lab 06)")
    bb.add_argument("--requests", type=int, default=128)
    bb.add_argument("--rate", type=float, default=200.0, help="arrivals per second")
    bb.add_argument("--seed", type=int, default=0)
    bb.add_argument("--max-batch", type=int, default=32, help="batch limit of both servers")
    bb.add_argument("--block-size", type=int, default=16, help="KV block size (continuous)")
    bb.set_defaults(func=cmd_bench_batching)     # without --threads: both servers on 1 thread

    bt = bsub.add_parser("tp", parents=[run], help="tensor parallelism on this CPU: the "
                         "all-reduce and its fitted alpha and link, the step at TP = 1 and 2 "
                         "over a sweep of widths against the napkin, the crossover, copies "
                         "against split (lab 11)")
    bt.add_argument("--quick", action="store_true", help="a few sizes and widths (tests)")
    bt.add_argument("--widths", type=int, nargs="+", default=None,
                    help="model widths D of the random-weight sweep (multiples of 128)")
    bt.add_argument("--layers", type=int, default=2, help="layers of the sweep's models")
    bt.add_argument("--context", type=int, default=16, help="cached tokens before the step")
    bt.add_argument("--repeats", type=int, default=40, help="interleaved rounds per step")
    bt.set_defaults(func=cmd_bench_tp)           # the ranks run 1 thread each (--threads: unused)

    bv = bsub.add_parser("serve", parents=[run], help="request-rate sweep and chunked vs whole "
                         "prefill over real HTTP (open-loop Poisson load, minillm/bench/"
                         "load_gen.py)")
    bv.add_argument("--url", default=None, help="a running server (minillm serve) to sweep; "
                    "without it the bench starts its own on loopback and also compares chunked "
                    "prefill. With --url, --model only names the prompts' tokenizer")
    bv.add_argument("--rates", default="2,4,8,16", help="request rates of the sweep (req/s)")
    bv.add_argument("--requests", type=int, default=24, help="requests per run")
    bv.add_argument("--prompt-len", type=int, default=16, help="tokens of each short prompt")
    bv.add_argument("--max-tokens", type=int, default=48, help="tokens out per short prompt")
    bv.add_argument("--max-num-seqs", type=int, default=16, help="batch limit of its servers")
    bv.add_argument("--duration", type=float, default=60.0,
                    help="seconds each run may take; requests unfinished by then are errors")
    bv.add_argument("--long-prompt-len", type=int, default=448,
                    help="tokens of the long prompts of the chunked-prefill comparison")
    bv.add_argument("--long-every", type=int, default=4, help="every n-th request is long")
    bv.add_argument("--chunk", type=int, default=64,
                    help="token budget per step of the chunked server (max_batched_tokens)")
    bv.add_argument("--chunk-rate", type=float, default=8.0,
                    help="request rate of the chunked-prefill comparison")
    bv.add_argument("--rounds", type=int, default=3,
                    help="interleaved runs of each config in the comparison (medians reported)")
    bv.add_argument("--seed", type=int, default=0)
    bv.set_defaults(func=cmd_bench_serve)        # without --threads: its servers on 1 thread

    sv = sub.add_parser("serve", parents=[run], help="OpenAI-compatible HTTP server over the "
                        "continuous-batching engine (minillm/serving/server.py)")
    sv.add_argument("--host", default="127.0.0.1")
    sv.add_argument("--port", type=int, default=8000, help="0 picks a free port (printed)")
    sv.add_argument("--max-num-seqs", type=int, default=16, help="batch limit (sequences)")
    sv.add_argument("--kv-blocks", type=int, default=None,
                    help="KV cache blocks (default: max-num-seqs full contexts)")
    sv.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    sv.add_argument("--max-batched-tokens", type=int, default=None,
                    help="token budget per step; turns on chunked prefill (default: whole "
                         "prompts, no chunking)")
    sv.add_argument("--backend", default="auto", help="attention backend: auto, torch, triton, "
                    "triton-split")
    sv.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                    choices=["cpu", "cuda"])
    _tp_options(sv)
    sv.add_argument("--replicas", type=int, default=1,
                    help="copies of the model, each its own server process (of --tp ranks), "
                         "behind this one endpoint (least requests in flight first); --threads "
                         "is then the total, divided between every process (default: every core)")
    sv.set_defaults(func=cmd_serve)

    t = sub.add_parser("train", help="train the tokenizer or a model (see python -m minillm.train)",
                       add_help=False)
    t.set_defaults(func=None)
    return p


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["train"]:
        from .train import main as train_main
        train_main(argv[1:])
        return 0
    a = build_parser().parse_args(argv)
    try:
        _set_threads(a)
        rc = a.func(a)
    except (ValueError, FileNotFoundError) as err:
        print(f"minillm: error: {err}", file=sys.stderr)
        rc = 2
    except RankFailure as err:             # tensor parallelism: a rank died, hung or raised
        print(f"minillm: error: {err}", file=sys.stderr)
        rc = 1
    sys.exit(rc)


if __name__ == "__main__":
    main()
