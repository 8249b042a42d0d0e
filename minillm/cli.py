"""`minillm` command line (also `python -m minillm`): `generate`, `eval ppl|kv-variants`,
`napkin`, `bench decode|quant|speculative|batching|serve`, `serve` (an OpenAI-compatible HTTP
server) and `train` (as `python -m minillm.train`); `minillm COMMAND --help` gives the options.

Commands that print figures share --json (one JSON object on stdout); those that run a model
share --model NAME|PATH and --threads N (argparse parent parsers); `_report` prints every result.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time

import torch

from .quant import SCHEMES


def _report(a, result: dict, text) -> int:
    """Print a command's result: one JSON object with --json, else the text `text(result)`."""
    print(json.dumps(result) if a.json else text(result))
    return 0


def _set_threads(a) -> None:
    """--threads N: torch's intra-op threads for the whole command (default: torch's)."""
    if getattr(a, "threads", None) is not None:
        if a.threads < 1:
            raise ValueError(f"--threads must be >= 1, got {a.threads}")
        torch.set_num_threads(a.threads)


def _load(name):
    import minillm
    return minillm.load(name), minillm.load_tokenizer(name)


def cmd_generate(a) -> int:
    from .generate import generate_naive
    from .sampling import SamplingParams
    model, tok = _load(a.model)
    params = SamplingParams(temperature=a.temperature, top_k=a.top_k, top_p=a.top_p,
                            max_new_tokens=a.max_new_tokens, seed=a.seed,
                            stop_ids=(tok.eos_id,) if tok.eos_id is not None else ())
    prompt = tok.encode(a.prompt)
    if not prompt:
        raise ValueError("the prompt is empty: give at least one character")
    t0 = time.perf_counter()
    if model.config.causal:
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
    dt = time.perf_counter() - t0
    return _report(a, {"model": a.model, "prompt": a.prompt, "completion": tok.decode(new),
                       "prompt_tokens": len(prompt), "new_tokens": len(new), "seconds": dt,
                       "tok_s": len(new) / dt if dt else None},
                   lambda r: r["prompt"] + r["completion"])


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


def cmd_bench_decode(a) -> int:
    import minillm

    from .bench.decode import DTYPES, bench_decode
    dtypes = a.dtype.split(",")
    bad = [d for d in dtypes if d not in DTYPES]
    if bad:
        raise ValueError(f"--dtype takes a comma-separated list of {', '.join(DTYPES)}; got "
                         f"{a.dtype!r}")
    formats = {}
    for name in dtypes:                      # one format after the other, each interleaved
        model = minillm.load(a.model).to(DTYPES[name])
        formats[name] = bench_decode(
            model, prompt_len=a.prompt_len, new_tokens=a.new_tokens, batch=a.batch,
            naive=not a.no_naive, vs_hf=a.vs_hf, compile=a.compile,
            fused_step=not a.no_fused_step, repeats=a.repeats, seed=a.seed,
            threads=a.threads, cpu_time=a.cpu_time)

    def text(r):
        return "\n".join([f"model: {r['model']}"] + [
            f"{name}:\n" + "\n".join(f"{k:>32}: {v:.3f}" if isinstance(v, float)
                                      else f"{k:>32}: {v}" for k, v in f.items())
            for name, f in r["formats"].items()])
    return _report(a, {"model": a.model, "formats": formats}, text)


def _tokens_match(t: dict) -> str:
    where = "match fp32" if t["matches_fp32"] else f"part from fp32 at {t['first_divergence']}"
    return f", greedy tokens {where}, top-1 agreement {t['top1_agreement']:.3f}"


def cmd_bench_quant(a) -> int:
    from .bench.quant import bench_quant
    from .data import load_text
    model, tok = _load(a.model)
    prompt = tok.encode(load_text("val")[:20 * a.prompt_len])[:a.prompt_len]
    if len(prompt) < a.prompt_len:
        raise ValueError(f"--prompt-len {a.prompt_len}: the validation text's start gives only "
                         f"{len(prompt)} tokens")
    r = {"model": a.model, **bench_quant(model, prompt, new_tokens=a.new_tokens,
                                         repeats=a.repeats, group_size=a.group_size,
                                         threads=a.threads, compiled=a.step == "compiled")}
    return _report(a, r, lambda r: "\n".join(
        [f"{r['model']}, {r['step']} step, batch 1, {r['threads']} thread(s), "
         f"{r['new_tokens']} tokens after a "
         f"{r['prompt_len']}-token prompt; reads at {r['read_gb_s']:.1f} GB/s"] +
        [f"{n:>5}: {r[f'{n}_tok_s']:7.1f} tok/s"
         + (f" = {r[f'{n}_vs_fp32']:.2f}x fp32" if n != "fp32" else " (baseline)   ")
         + f", stores {r['model_bytes'][n] / 1e6:5.1f} MB, reads {r['bytes_per_token'][n] / 1e6:5.1f}"
         f" MB/token, {r['bandwidth_fraction'][n]:.2f} of its limit"
         + ("" if n == "fp32" else _tokens_match(r["tokens_match"][n]))
         for n in ("fp32", "bf16", "int8", "int4")]))


def cmd_bench_speculative(a) -> int:
    import minillm

    from .bench.speculative import bench_speculative, repetitive_prompt
    target, draft = minillm.load(a.model), minillm.load(a.draft)
    tok = minillm.load_tokenizer(a.model)
    prompt = tok.encode(a.prompt)
    if not prompt:
        raise ValueError("the prompt is empty: give at least one character")
    ks = [int(k) for k in a.k.split(",")]
    r = {"model": a.model, "draft": a.draft,
         **bench_speculative(target, draft, prompt, ks, a.new_tokens, a.repeats,
                             lookup_prompt=None if a.no_lookup else repetitive_prompt(tok),
                             lookup_k=a.lookup_k, lookup_new_tokens=a.lookup_new_tokens,
                             cpu_time=a.cpu_time, draft_engine=a.draft_engine,
                             sample_temperature=a.temperature or None, sample_k=a.sample_k,
                             predict=not a.no_predict)}
    return _report(a, r, lambda r: "\n".join(
        [f"target alone: {r['target_tok_s']:.1f} tok/s (its step at "
         f"{r['target_step_bandwidth_fraction']:.2f} of the {r['limit_tok_s']:.0f} tok/s "
         f"bandwidth limit; the best k at {r['speculative_vs_limit']:.2f} of it); draft/target "
         f"step cost c = {r['c']:.3f}"] +
        [f"{row['drafter']:>13} k={row['k']}: alpha {row['alpha']:.2f}, "
         f"{row['tokens_per_step']:.2f} tokens/step"
         + (f" (formula {row['predicted_tokens_per_step']:.2f})"
            if "predicted_tokens_per_step" in row else "")
         + f", speed-up {row['speedup']:.2f}x"
         + (f", exact {row['exact_greedy']}" if "exact_greedy" in row else
            f" at temperature {row['temperature']}") for row in r["runs"]]))


def cmd_bench_batching(a) -> int:
    import minillm

    from .bench.batching import bench_batching
    model = minillm.load(a.model)
    r = {"model": a.model,
         **bench_batching(model, num_requests=a.requests, rate=a.rate, seed=a.seed,
                          max_batch=a.max_batch, block_size=a.block_size,
                          threads=1 if a.threads is None else a.threads)}
    return _report(a, r, lambda r: (
        f"{r['requests']} requests ({r['completed']} completed): static "
        f"{r['static_tok_s']:.1f} tok/s, continuous {r['continuous_tok_s']:.1f} tok/s "
        f"({r['speedup']:.2f}x); p50 TTFT {r['static_ttft_p50_s']:.2f} s vs "
        f"{r['continuous_ttft_p50_s']:.2f} s"))


def cmd_serve(a) -> int:
    if a.replicas != 1:                 # N copies behind one front (serving/replicas.py)
        from .serving.replicas import serve_replicas
        return serve_replicas(a.model, a.replicas, threads=a.threads, host=a.host, port=a.port,
                              engine_args=_serve_engine_args(a))
    from .serving.server import serve
    model, tok = _load(a.model)
    if a.device == "cuda":
        model = model.to("cuda")
    serve(model, tok, a.model, host=a.host, port=a.port, max_num_seqs=a.max_num_seqs,
          kv_blocks=a.kv_blocks, block_size=a.block_size,
          max_batched_tokens=a.max_batched_tokens, backend=a.backend,
          on_ready=lambda msg: print(msg, flush=True))
    return 0


def _serve_engine_args(a) -> list[str]:
    """The engine options of `serve`, as each replica's command line takes them."""
    args = ["--max-num-seqs", a.max_num_seqs, "--block-size", a.block_size,
            "--backend", a.backend, "--device", a.device]
    for flag, value in (("--kv-blocks", a.kv_blocks), ("--max-batched-tokens",
                                                      a.max_batched_tokens)):
        if value is not None:
            args += [flag, value]
    return [str(x) for x in args]


# the figures of a load_test summary that `bench serve` takes the median of across rounds
_SERVE_KEYS = ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "itl_p50_s", "itl_p99_s",
               "throughput_tok_s")


def _parse_rates(text: str) -> list[float]:
    try:
        rates = [float(r) for r in text.split(",")]
    except ValueError:
        rates = []
    if not rates or not all(math.isfinite(r) and r > 0 for r in rates):
        raise ValueError(f"--rates takes a comma-separated list of request rates > 0 (requests "
                         f"per second), e.g. 2,4,8; got {text!r}")
    return rates


def _probe_server(url: str) -> tuple[str, int]:
    """(model id, context) of the OpenAI-style server at `url`, or a ValueError saying why not."""
    import httpx
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"--url must start with http:// or https://, got {url!r}")
    url = url.rstrip("/")
    try:
        health = httpx.get(url + "/health", timeout=5.0)
        models = httpx.get(url + "/v1/models", timeout=5.0)
        models.raise_for_status()
        info = models.json()["data"][0]
    except httpx.HTTPError as e:
        raise ValueError(f"cannot reach a minillm server at {url} ({type(e).__name__}: {e}); "
                         f"start one with `minillm serve --port 0`, or leave out --url to let "
                         f"the bench start its own") from e
    except (ValueError, KeyError, IndexError, TypeError) as e:
        raise ValueError(f"{url}/v1/models did not answer like an OpenAI-compatible server: "
                         f"{e!r}") from e
    if health.status_code != 200:
        raise ValueError(f"the server at {url} is not healthy: GET /health answered "
                         f"{health.status_code} {health.text[:200]!r}")
    return info["id"], int(info.get("max_model_len") or 0)


def _median_summary(runs: list[dict]) -> dict:
    """Median of each latency figure across rounds; completed and errors summed."""
    from .serving.metrics import percentile
    out = {"completed": sum(r["completed"] for r in runs),
           "requests": sum(r["requests"] for r in runs),
           "errors": sum(r["errors"] for r in runs)}
    for k in _SERVE_KEYS:
        xs = [r[k] for r in runs if k in r]
        out[k] = percentile(xs, 50) if xs else None
    return out


def cmd_bench_serve(a) -> int:
    from .bench.load_gen import Workload, load_test
    rates = _parse_rates(a.rates)
    for name in ("requests", "prompt_len", "max_tokens", "max_num_seqs", "long_prompt_len",
                 "long_every", "chunk", "rounds"):
        if getattr(a, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")
    if not a.duration > 0 or not a.chunk_rate > 0:
        raise ValueError(f"--duration and --chunk-rate must be > 0, got {a.duration} and "
                         f"{a.chunk_rate}")
    if a.url is None and a.chunk < a.max_num_seqs:
        raise ValueError(f"--chunk {a.chunk} must be >= --max-num-seqs {a.max_num_seqs}: a "
                         f"chunked step first gives each running sequence its decode token")
    url = served = None
    if a.url is not None:                    # someone else's server: the sweep only
        url = a.url.rstrip("/")
        served, ctx = _probe_server(url)
    import minillm

    from .data import load_tokens
    tok = minillm.load_tokenizer(a.model)    # with --url: only the prompts' tokenizer
    ids = load_tokens(tok, "val").tolist()
    model = None
    if url is None:
        model = minillm.load(a.model)
        ctx = model.config.max_seq_len
    if ctx and a.prompt_len + a.max_tokens > ctx:
        raise ValueError(f"--prompt-len {a.prompt_len} + --max-tokens {a.max_tokens} exceeds the "
                         f"model's context of {ctx} tokens")
    if url is None and a.long_prompt_len + 1 > ctx:
        raise ValueError(f"--long-prompt-len {a.long_prompt_len} + 1 output token exceeds the "
                         f"model's context of {ctx} tokens")

    def workload(rate, seed, long=False, **kw):
        return Workload(**{**dict(rate=rate, num_requests=a.requests, prompt_len=a.prompt_len,
                                  max_tokens=a.max_tokens, seed=seed, timeout_s=a.duration,
                                  long_prompt_len=a.long_prompt_len if long else None,
                                  long_every=a.long_every), **kw})

    threads = None if url else (1 if a.threads is None else a.threads)
    settings = {"rates": rates, "requests": a.requests, "prompt_len": a.prompt_len,
                "max_tokens": a.max_tokens, "duration_s": a.duration, "seed": a.seed,
                "max_num_seqs": None if url else a.max_num_seqs}
    result = {"model": served or a.model, "url": url, "threads": threads, "settings": settings}
    if url is not None:
        result["sweep"] = [load_test(url, served, workload(r, a.seed), ids) for r in rates]
        result["chunked"] = None
        return _report(a, result, _bench_serve_text)

    from .serving.server import BackgroundServer
    settings.update(long_prompt_len=a.long_prompt_len, long_every=a.long_every, chunk=a.chunk,
                    chunk_rate=a.chunk_rate, rounds=a.rounds)
    old_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    servers = {}
    try:
        for name, budget in (("unchunked", None), ("chunked", a.chunk)):
            srv = servers[name] = BackgroundServer(model, tok, a.model,
                                                   max_num_seqs=a.max_num_seqs,
                                                   max_batched_tokens=budget)
            # warm-up, untimed: a short and a long prompt through the fresh engine
            load_test(srv.url, a.model, workload(50.0, a.seed, long=True, num_requests=2,
                                                 long_every=2, max_tokens=2), ids)
        # (1) the rate sweep: one server, whole-prompt prefill, the short workload
        result["sweep"] = [load_test(servers["unchunked"].url, a.model, workload(r, a.seed), ids)
                           for r in rates]
        # (2) chunked prefill under long prompts: both servers up, runs interleaved (ABBA...)
        runs = {"unchunked": [], "chunked": []}
        for i in range(a.rounds):
            w = workload(a.chunk_rate, a.seed + i, long=True)
            order = ("unchunked", "chunked") if i % 2 == 0 else ("chunked", "unchunked")
            for name in order:
                runs[name].append(load_test(servers[name].url, a.model, w, ids))
    finally:
        for srv in servers.values():
            srv.stop()
        torch.set_num_threads(old_threads)
    med = {name: _median_summary(rs) for name, rs in runs.items()}

    def ratio(k):
        u, c = med["unchunked"][k], med["chunked"][k]
        return u / c if u is not None and c else None
    result["chunked"] = {
        "rate": a.chunk_rate, "rounds": a.rounds, "chunk": a.chunk,
        "long_prompt_len": a.long_prompt_len, "long_every": a.long_every, **med,
        "itl_p99_ratio": ratio("itl_p99_s"), "tpot_p99_ratio": ratio("tpot_p99_s"),
        "ttft_p99_ratio": ratio("ttft_p99_s"), "runs": runs}
    return _report(a, result, _bench_serve_text)


def _bench_serve_text(r: dict) -> str:
    def f(v, fmt=".3f"):
        return "-" if v is None else format(v, fmt)
    s = r["settings"]
    where = r["url"] or f"its own servers on loopback, {r['threads']} torch thread(s), " \
                        f"max_num_seqs {s['max_num_seqs']}"
    lines = [f"bench serve: {r['model']} at {where}",
             f"rate sweep ({s['requests']} requests per rate, {s['prompt_len']}-token prompts, "
             f"{s['max_tokens']} tokens out):",
             f"{'req/s':>7}{'done':>7}{'errors':>7}{'tok/s':>8}{'TTFT p50':>10}{'p99':>8}"
             f"{'TPOT p50':>10}{'p99':>8}{'ITL p99':>9}  (seconds)"]
    for x in r["sweep"]:
        lines.append(f"{x['rate']:>7g}{x['completed']:>4}/{x['requests']:<2}{x['errors']:>7}"
                     f"{f(x.get('throughput_tok_s'), '.1f'):>8}{f(x.get('ttft_p50_s')):>10}"
                     f"{f(x.get('ttft_p99_s')):>8}{f(x.get('tpot_p50_s')):>10}"
                     f"{f(x.get('tpot_p99_s')):>8}{f(x.get('itl_p99_s')):>9}")
        if x["errors"]:
            lines.append(f"{'':>7}errors: {'; '.join(x['error_examples'])}")
    c = r["chunked"]
    if c is not None:
        lines += [f"chunked prefill at {c['rate']:g} req/s, 1 prompt in {c['long_every']} of "
                  f"{c['long_prompt_len']} tokens (1 out), medians of {c['rounds']} interleaved "
                  f"rounds (short requests only):",
                  f"{'':>16}{'TTFT p50':>10}{'p99':>8}{'TPOT p50':>10}{'p99':>8}{'ITL p50':>9}"
                  f"{'p99':>8}{'errors':>8}"]
        for name, label in (("unchunked", "whole prompts"), ("chunked", f"chunks of {c['chunk']}")):
            m = c[name]
            lines.append(f"{label:>16}{f(m['ttft_p50_s']):>10}{f(m['ttft_p99_s']):>8}"
                         f"{f(m['tpot_p50_s']):>10}{f(m['tpot_p99_s']):>8}{f(m['itl_p50_s']):>9}"
                         f"{f(m['itl_p99_s']):>8}{m['errors']:>8}")
        lines.append(f"whole / chunked: ITL p99 {f(c['itl_p99_ratio'], '.2f')}x, TPOT p99 "
                     f"{f(c['tpot_p99_ratio'], '.2f')}x, TTFT p99 {f(c['ttft_p99_ratio'], '.2f')}x")
    return "\n".join(lines)


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
    sv.add_argument("--replicas", type=int, default=1,
                    help="copies of the model, each its own server process, behind this one "
                         "endpoint (least requests in flight first); --threads is divided "
                         "between them (default total: every core)")
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
    sys.exit(rc)


if __name__ == "__main__":
    main()
