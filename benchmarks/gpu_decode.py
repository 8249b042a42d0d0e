"""Batch-1 greedy decode on a GPU, placed against what the memory can deliver (issue 20's GPU
half; issue 19's end-to-end quantized decode).

    python benchmarks/gpu_decode.py --json-out out.json              # shipped, 1b, 7b
    python benchmarks/gpu_decode.py --models 1b --compile            # + torch.compile variant

Models: the shipped target (minillm.load("target"), trained weights) and two Llama shapes with
random weights, which are as good as trained ones for speed: "1b" (TinyLlama-1.1B: D 2048, 22
layers, 32 heads, 4 KV heads, F 5632, V 32000) and "7b" (Llama-2-7B: D 4096, 32 layers, MHA,
F 11008, V 32000). Weights in bf16, or int8 / int4 (groups of 128) through minillm.quant's
QuantLinear, which runs the Triton fused dequant-matmul kernels on a GPU (the LM head stays
bf16, as `quantize_model` leaves it).

Each format decodes with `minillm.decode.graph.GraphDecoder`: a CUDA graph per step (``graph``)
and, on the same decoder, the same step launched kernel by kernel from Python (``eager``);
``bf16_triton`` is bf16 with the products on the Triton GEMV of kernels/gemv.py instead of
cuBLAS; ``--compile`` adds bf16 through torch.compile (cuBLAS or the Triton GEMV), with and
without the graph. For each: prefill a
32-token prompt, then time `--steps` decode steps with CUDA events (the prefill untimed); rounds
interleave the variants; the median round counts.

    bytes_per_token   counted from the decoder's tensors (`minillm.bench.bandwidth.step_bytes`: every
                      weight matrix with its scales, norms, one embedding row, the keys and
                      values of the mean context)
    limit_tok_s       device copy bandwidth / bytes_per_token (copy: bytes read + written per
                      second by a 1 GiB device-to-device copy, measured in the same run)
    bandwidth_fraction   tok/s / limit_tok_s (goal, issue 20: >= 0.7 for a model large enough
                      to be bound by bandwidth)

The shipped target's bf16 weights (~24 MB) fit in an H100's 50 MB L2 cache, so its step is not
bound by HBM at all: it shows what launches cost (eager against graph).

Correctness first: on the shipped model, GraphDecoder's greedy tokens (graph and eager) are
compared with `generate_naive` on the same device and dtype (fp32 and bf16), and the quantized
decoders' with the naive loop over the same quantized model; the first divergence is reported.
Nothing is measured without a CUDA GPU: the script says so and exits 0.

Its figures feed benchmarks/RESULTS.md, "Decode on the bandwidth scale on a GPU" (the first,
second, third and fifth runs).
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from minillm.bench.gpu_timer import copy_bandwidth  # noqa: E402

SHAPES = {
    "1b": dict(vocab_size=32000, dim=2048, n_layers=22, n_heads=32, n_kv_heads=4,
               hidden_dim=5632),
    "7b": dict(vocab_size=32000, dim=4096, n_layers=32, n_heads=32, n_kv_heads=32,
               hidden_dim=11008),
}
SCHEMES = {"bf16": None, "int8": "int8", "int4": "int4-g128"}
PROMPT_LEN = 32


def build(name: str):
    import minillm
    from minillm import ModelConfig, Transformer
    if name == "shipped":
        return minillm.load("target", dtype=torch.bfloat16, device="cuda")
    cfg = ModelConfig(**SHAPES[name], max_seq_len=2048, tie_embeddings=False)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            return Transformer(cfg).eval()
    finally:
        torch.set_default_dtype(default)


def quantized(model, scheme: str | None):
    from minillm.quant import quantize_model
    if scheme is None:
        return model
    with torch.device("cuda"):                 # QuantLinear's buffers made on the GPU
        return quantize_model(model, scheme)


def check_tokens(n: int = 48) -> list[dict]:
    """GraphDecoder against the naive loop on the shipped model, on the GPU."""
    import minillm
    from minillm.bench.quant import first_divergence
    from minillm.decode import GraphDecoder
    from minillm.generate import generate_naive
    from minillm.sampling import SamplingParams
    prompt = list(range(5, 5 + PROMPT_LEN))
    out = []
    for dtype in (torch.float32, torch.bfloat16):
        base = minillm.load("target", dtype=dtype, device="cuda")
        for fmt, scheme in SCHEMES.items():
            if scheme is not None and dtype != torch.bfloat16:
                continue
            model = quantized(base, scheme)
            want = generate_naive(model, prompt, SamplingParams(temperature=0,
                                                                max_new_tokens=n))[0]
            gemvs = (False, True) if scheme is None else (False,)
            for graph, triton_gemv in [(g, t) for g in (True, False) for t in gemvs]:
                got = GraphDecoder(model, max_len=PROMPT_LEN + n, graph=graph,
                                   triton_gemv=triton_gemv).generate(prompt, n)
                row = {"dtype": str(dtype).removeprefix("torch."),
                       "format": fmt if dtype == torch.bfloat16 else "fp32",
                       "graph": graph, "triton_gemv": triton_gemv, "tokens": n,
                       "match": got == want, "first_divergence": first_divergence(got, want)}
                print("tokens", row, flush=True)
                out.append(row)
    return out


def bench_model(name: str, steps: int, rounds: int, copy_gbps: float, compile_: bool,
                gen_matvec: bool = False) -> dict:
    from minillm.bench.bandwidth import step_bytes
    from minillm.decode import GraphDecoder
    t0 = time.perf_counter()
    base = build(name)
    max_len = PROMPT_LEN + steps
    decoders = {}
    for fmt, scheme in reversed(SCHEMES.items()):       # quantized copies first, then bf16
        model = quantized(base, scheme)
        decoders[fmt] = GraphDecoder(model, max_len=max_len)
        del model
    decoders["bf16_triton"] = GraphDecoder(base, max_len=max_len, triton_gemv=True)
    if compile_:
        decoders["bf16_compiled"] = GraphDecoder(base, max_len=max_len, compile=True)
        decoders["bf16_compiled_triton"] = GraphDecoder(base, max_len=max_len, compile=True,
                                                        triton_gemv=True)
    if gen_matvec:
        decoders["bf16_gen_matvec"] = GraphDecoder(base, max_len=max_len, compile=True,
                                                   generated_matvec=True)
    del base
    torch.cuda.empty_cache()
    build_s = time.perf_counter() - t0
    prompt = torch.arange(PROMPT_LEN) % 1000 + 3

    def run(dec, eager: bool) -> float:
        dec.prefill(prompt)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(steps - 1):
            dec.eager_step() if eager else dec.step()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1e3 / (steps - 1)

    variants = [(fmt, mode) for fmt in decoders for mode in ("graph", "eager")]
    t0 = time.perf_counter()
    for fmt, mode in variants:                          # warm-up: compiles, captures, clocks
        run(decoders[fmt], mode == "eager")
    warm_s = time.perf_counter() - t0
    times = {v: [] for v in variants}
    for _ in range(rounds):
        for v in variants:
            times[v].append(run(decoders[v[0]], v[1] == "eager"))
    rows = []
    for (fmt, mode), ts in times.items():
        sec = statistics.median(ts)
        b = step_bytes(decoders[fmt].packed, PROMPT_LEN + steps / 2)["bytes_per_step"]
        limit = copy_gbps * 1e9 / b
        rows.append({"model": name, "format": fmt, "mode": mode, "tok_s": 1 / sec,
                     "step_us": sec * 1e6, "bytes_per_token": b, "limit_tok_s": limit,
                     "bandwidth_fraction": 1 / sec / limit,
                     "spread_tok_s": [1 / max(ts), 1 / min(ts)]})
    bf16 = {r["mode"]: r["tok_s"] for r in rows if r["format"] == "bf16"}
    for r in rows:
        r["vs_bf16_same_mode"] = r["tok_s"] / bf16[r["mode"]]
    c = decoders["bf16"].config
    return {"model": name, "params": sum(w.numel() for w in _tensors(decoders["bf16"])),
            "config": {k: getattr(c, k) for k in ("dim", "n_layers", "n_heads", "n_kv_heads",
                                                  "hidden_dim", "vocab_size")},
            "steps": steps, "rounds": rounds, "build_s": build_s, "warmup_s": warm_s,
            "rows": rows}


def profile(name: str, compile_: bool, triton_gemv: bool = False, steps: int = 20) -> None:
    """Where a bf16 step's GPU time goes: torch.profiler over `steps` graph replays, kernels
    sorted by their total device time (the graph's kernels are recorded one by one)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from minillm.decode import GraphDecoder
    dec = GraphDecoder(build(name), max_len=PROMPT_LEN + 2 * steps, compile=compile_,
                       triton_gemv=triton_gemv)
    dec.prefill(torch.arange(PROMPT_LEN) % 1000 + 3)
    for _ in range(steps):                       # warm-up, clocks up
        dec.step()
    dec.prefill(torch.arange(PROMPT_LEN) % 1000 + 3)
    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            dec.step()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    total = sum(e.self_device_time_total for e in events)
    calls = sum(e.count for e in events)
    print(f"\nprofile {name} bf16{' compiled' if compile_ else ''}"
          f"{' triton_gemv' if triton_gemv else ''}: {calls / steps:.0f} kernels "
          f"per step, {total / steps:.0f} us of kernel time per step")
    for e in sorted(events, key=lambda e: -e.self_device_time_total)[:25]:
        print(f"{e.self_device_time_total / steps:9.1f} us/step {e.count / steps:6.1f} calls/step "
              f"{e.self_device_time_total / e.count:8.2f} us/call  {e.key[:90]}", flush=True)


def _tensors(dec):
    for layer in dec.layers:
        for k in ("qkv", "o", "gu", "down"):
            yield layer[k]
    yield dec.lm_head


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="shipped,1b,7b")
    ap.add_argument("--steps", type=int, default=256, help="decode steps timed per round")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved timed rounds")
    ap.add_argument("--compile", action="store_true",
                    help="also bf16 through torch.compile, with cuBLAS's products and with the "
                         "Triton GEMV (GraphDecoder's triton_gemv)")
    ap.add_argument("--gen-matvec", action="store_true",
                    help="also bf16 compiled with Inductor's own products (generated_matvec)")
    ap.add_argument("--triton-gemv", action="store_true",
                    help="with --profile: the step with the Triton GEMV")
    ap.add_argument("--no-check", action="store_true", help="skip the greedy-token check")
    ap.add_argument("--json-out", metavar="FILE", help="write the JSON report to FILE")
    ap.add_argument("--profile", action="store_true",
                    help="only print where a bf16 step's kernel time goes, per model")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks/gpu_decode.py times decode on a CUDA GPU; none here, so nothing was "
              "measured. (GraphDecoder's tokens are tested on the CPU by "
              "tests/test_graph_decode.py.)")
        return 0
    import triton
    report = {"device": torch.cuda.get_device_name(),
              "date": datetime.datetime.now().isoformat(timespec="seconds"),
              "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]),
              "torch": torch.__version__, "triton": triton.__version__, "models": []}

    def save():
        if args.json_out:
            Path(args.json_out).write_text(json.dumps(report, indent=1))

    if args.profile:
        for name in args.models.split(","):
            profile(name, args.compile, args.triton_gemv)
        return 0
    if not args.no_check:
        report["tokens"] = check_tokens()
        save()
    report["copy_GBps"] = copy_gbps = copy_bandwidth()
    print(f"{report['device']}  torch {torch.__version__}  triton {triton.__version__}  "
          f"copy {copy_gbps:.0f} GB/s", flush=True)
    for name in args.models.split(","):
        steps = args.steps if name != "7b" else max(2, args.steps // 2)
        m = bench_model(name, steps, args.rounds, copy_gbps, args.compile, args.gen_matvec)
        report["models"].append(m)
        save()
        print(f"\n{name}: {m['params'] / 1e9:.3f}B matrix weights, {steps} steps x "
              f"{args.rounds} rounds (build {m['build_s']:.0f} s, warm-up {m['warmup_s']:.0f} s)")
        print(f"{'format':>15} {'mode':>6} {'tok/s':>8} {'us/step':>8} {'MB/token':>9} "
              f"{'limit':>8} {'fraction':>8} {'vs bf16':>8}")
        for r in m["rows"]:
            print(f"{r['format']:>15} {r['mode']:>6} {r['tok_s']:>8.0f} {r['step_us']:>8.1f} "
                  f"{r['bytes_per_token'] / 1e6:>9.1f} {r['limit_tok_s']:>8.0f} "
                  f"{r['bandwidth_fraction']:>8.2f} {r['vs_bf16_same_mode']:>7.2f}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
