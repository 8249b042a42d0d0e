"""Weight-only quantized matmul at decode batch sizes: bf16 cuBLAS vs the Triton w8a16 / w4a16
kernels (kernels/dequant_matmul.py), on one GPU, in one run.

    python benchmarks/dequant_matmul.py                    # 4096^2 and 8192^2, M = 1..16
    python benchmarks/dequant_matmul.py --json > out.json  # figures for benchmarks/RESULTS.md
    python benchmarks/dequant_matmul.py --sizes 4096 --batch 1 --sweep   # try other block sizes

What it measures. For each square weight N = K and each batch M, three ways to compute
y = x @ W.T with x [M, K] in bf16: `x @ W.T` with W in bf16 (cuBLAS), and the two fused
kernels with int8 and packed int4 weights (float32 scales; int4 with groups of --group inputs).
At these M the matmul is memory-bound, so the figure of merit is bytes / time:

  bytes moved   every tensor the call must read or write once: weight (+ scales, zeros), x, y
  GB/s          bytes moved / median time
  % of copy     GB/s relative to a device-to-device copy measured here (2 bytes per byte copied:
                read + write) -- what this GPU's memory can actually deliver
  speedup       median bf16 time / median kernel time (> 1: faster than cuBLAS)

How it times (the rules of minillm.bench.timing, on the GPU): every kernel is checked against its torch
reference first; then warm-up rounds of the same calls (at least 0.3 s, 2 s in the first run,
so that the SM clock is up: these kernels' time follows it); then rounds that call bf16, w8, w4
in turn (interleaved). Before each call the L2 cache (50 MB on an H100, more than a 4096 x 4096
bf16 weight) is flushed by reading a 256 MiB buffer, so every call streams its weight from HBM
as in a real forward pass, and a 50 us GPU sleep is queued so that the call is enqueued before
its start event fires; CUDA events around the call give its GPU time, without the CPU's launch
cost. Reported: the median over --repeats rounds. (benchmarks/common.py; RESULTS.md has the
experiments behind these choices.)

Goals (issue 5, batch 1): w4a16 >= 2.5x and w8a16 >= 1.6x faster than bf16. The ideal is the
byte ratio: bf16 = 2 bytes per weight, int8 = 1 (+ 4 / K), int4 = 0.5 + 8 / G.
Nothing is measured without a CUDA GPU: the script says so and exits 0.

Its figures feed benchmarks/RESULTS.md: "Fused dequant-matmul kernels" and "What the kernels
tried" (H100), and the batch-1 kernel tables of "Decode on the bandwidth scale on a GPU"
(second to fifth runs).
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import torch

# Run from anywhere: import the repo's kernels/ package rather than whatever is installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import Timer, check, copy_bandwidth, nbytes  # noqa: E402

GOALS = {"w4a16": 2.5, "w8a16": 1.6}  # speed-up over bf16 at batch 1


def make_layer(N: int, K: int, group: int, gen: torch.Generator):
    from kernels import quantize_w4, quantize_w8
    w = (torch.randn(N, K, generator=gen) * K**-0.5).cuda()
    q8, s8 = quantize_w8(w)
    q4, s4, z4 = quantize_w4(w, group)
    return {"bf16": w.to(torch.bfloat16), "w8": (q8, s8), "w4": (q4, s4, z4)}


def bench_shape(N: int, K: int, batches, group: int, timer: Timer, copy_gbps: float,
                warmup: int, repeats: int, gen: torch.Generator) -> list[dict]:
    from kernels import w4a16_matmul, w4a16_matmul_ref, w8a16_matmul, w8a16_matmul_ref
    layer = make_layer(N, K, group, gen)
    W = layer["bf16"]
    q8, s8 = layer["w8"]
    q4, s4, z4 = layer["w4"]
    rows = []
    for M in batches:
        x = torch.randn(M, K, generator=gen).to("cuda", torch.bfloat16)
        y_bytes = M * N * 2
        check(w8a16_matmul(x, q8, s8), w8a16_matmul_ref(x, q8, s8), f"w8a16 {N}x{K} M={M}")
        check(w4a16_matmul(x, q4, s4, z4, group), w4a16_matmul_ref(x, q4, s4, z4, group),
              f"w4a16 {N}x{K} M={M}")
        fns = {"bf16": lambda: x @ W.T,
               "w8a16": lambda: w8a16_matmul(x, q8, s8),
               "w4a16": lambda: w4a16_matmul(x, q4, s4, z4, group)}
        moved = {"bf16": nbytes(W, x) + y_bytes, "w8a16": nbytes(q8, s8, x) + y_bytes,
                 "w4a16": nbytes(q4, s4, z4, x) + y_bytes}
        t = timer.run(fns, warmup, repeats)
        if warning := timer.late_warning(f"{N}x{K} M={M}"):
            print(warning, flush=True)
        for name in fns:
            gbps = moved[name] / t[name] / 1e9
            rows.append({"N": N, "K": K, "M": M, "kernel": name, "time_us": t[name] * 1e6,
                         "launch": timer.launch_report[name],
                         "bytes": moved[name], "GBps": gbps, "pct_of_copy": 100 * gbps / copy_gbps,
                         "speedup_vs_bf16": t["bf16"] / t[name],
                         "group_size": group if name == "w4a16" else None})
    return rows


def candidates(kind: str, M: int, group: int) -> list:
    """Block sizes the sweep tries for one (kernel, M): the FMA path's tiles (M = 1), bounded
    so that a float32 copy of one tile holds at most 64 values per thread, or the dot path's."""
    from kernels import dequant_matmul as dm
    if M == 1 or (kind == "w4" and group < 32):
        bm = min(dm._pow2_at_least(M), 4)
        return [dm.Config(False, bm, bn, bk, w, st) for bn in (4, 8, 16)
                for bk in ((256, 512, 1024) if kind == "w8" else (256, 512, 1024, 2048))
                for w in (4, 8) for st in (1, 2, 3)
                if bm * bn * bk <= 64 * 32 * w and (kind == "w8" or bk % group == 0)]
    if M > 16:
        return [dm.Config(True, 16, bn, 64 if kind == "w8" else group, w, st)
                for bn in (16, 32, 64) for w in (4, 8) for st in (2, 3, 4)]
    # M <= 16: one row block, so K can be split: split_k times as many programs stream W
    return [dm.Config(True, 16, bn, bk, 4, 4 if kind == "w8" else 3, split_k=sk)
            for bn in (16, 32, 64) for bk in ((64, 128) if kind == "w8" else (group,))
            for sk in (1, 2, 4, 8)]


def sweep(N: int, K: int, batches, group: int, timer: Timer, warmup: int, repeats: int,
          gen: torch.Generator) -> list[dict]:
    """Time other block sizes than pick_config's; prints the best per (kernel, M)."""
    from kernels import dequant_matmul as dm
    layer = make_layer(N, K, group, gen)
    q8, s8 = layer["w8"]
    q4, s4, z4 = layer["w4"]
    out = []
    for M in batches:
        x = torch.randn(M, K, generator=gen).to("cuda", torch.bfloat16)
        y = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        for kind in ("w8", "w4"):
            default = dm.pick_config(kind, M, N, K, group)

            def launch(cfg, kind=kind, x=x, y=y):
                if kind == "w8":
                    dm._launch_w8(x, q8, s8, None, y, cfg)
                else:
                    dm._launch_w4(x, q4, s4, z4, group, None, y, cfg)
                return y

            want = launch(default).clone()
            fns = {}
            for cfg in [default] + [c for c in candidates(kind, M, group) if c != default]:
                check(launch(cfg), want, f"{kind} {cfg}")
                fns[cfg] = (lambda cfg=cfg: launch(cfg))
            t = timer.run(fns, warmup, repeats)
            best = min(t, key=t.get)
            print(f"sweep {kind} {N}x{K} M={M}: default {t[default] * 1e6:.1f} us {default}; "
                  f"best {t[best] * 1e6:.1f} us {best}; next: " + ", ".join(
                      f"{t[c] * 1e6:.1f} {tuple(vars(c).values())}"
                      for c in sorted(t, key=t.get)[1:4]), flush=True)
            out.append({"kernel": kind, "N": N, "K": K, "M": M, "default": vars(default),
                        "default_us": t[default] * 1e6, "best": vars(best),
                        "best_us": t[best] * 1e6,
                        "all_us": [[vars(c), t[c] * 1e6] for c in sorted(t, key=t.get)]})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="4096,8192", help="square weights N = K, comma-separated")
    ap.add_argument("--batch", default="1,2,4,8,16", help="batch sizes M, comma-separated")
    ap.add_argument("--group", type=int, default=128, help="int4 group size G")
    ap.add_argument("--warmup", type=int, default=5, help="untimed interleaved rounds")
    ap.add_argument("--repeats", type=int, default=50, help="timed interleaved rounds")
    ap.add_argument("--sweep", action="store_true", help="also time other block sizes")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    ap.add_argument("--json-out", metavar="FILE", help="also write the JSON object to FILE")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    batches = [int(b) for b in args.batch.split(",")]
    if not torch.cuda.is_available():
        print("benchmarks/dequant_matmul.py times GPU kernels (Triton vs cuBLAS) and needs a CUDA "
              "GPU; none here, so nothing was measured. (The kernels' correctness is tested on "
              "the CPU by tests/test_kernels_dequant.py.)")
        return 0
    import triton

    gen = torch.Generator().manual_seed(0)
    copy_gbps = copy_bandwidth()
    timer = Timer(torch.device("cuda"))
    rows, sweeps = [], []
    for n in sizes:
        rows += bench_shape(n, n, batches, args.group, timer, copy_gbps, args.warmup,
                            args.repeats, gen)
        if args.sweep:
            sweeps += sweep(n, n, batches, args.group, timer, args.warmup,
                            max(10, args.repeats // 2), gen)
    goals = {}
    for name, want in GOALS.items():
        got = [r["speedup_vs_bf16"] for r in rows if r["kernel"] == name and r["M"] == 1]
        if got:
            goals[name] = {"want_speedup_at_M1": want, "got": got, "met": min(got) >= want}
    report = {"device": torch.cuda.get_device_name(), "date": datetime.datetime.now().isoformat(
              timespec="seconds"), "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]),
              "torch": torch.__version__, "triton": triton.__version__, "copy_GBps": copy_gbps,
              "group_size": args.group, "repeats": args.repeats, "rows": rows, "goals": goals}
    if sweeps:
        report["sweep"] = sweeps
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(report, indent=1))
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    print(f"{report['device']}  torch {torch.__version__}  triton {triton.__version__}  "
          f"{report['date']}\ndevice-to-device copy: {copy_gbps:.0f} GB/s   int4 group size "
          f"{args.group}   median of {args.repeats} interleaved rounds, L2 flushed\n")
    print(f"{'N=K':>5} {'M':>3} {'kernel':>6} {'time us':>8} {'MB moved':>9} {'GB/s':>7} "
          f"{'% copy':>7} {'vs bf16':>8}")
    for r in rows:
        print(f"{r['N']:>5} {r['M']:>3} {r['kernel']:>6} {r['time_us']:>8.1f} "
              f"{r['bytes'] / 1e6:>9.2f} {r['GBps']:>7.0f} {r['pct_of_copy']:>6.0f}% "
              f"{r['speedup_vs_bf16']:>7.2f}x")
    for name, g in goals.items():
        print(f"goal {name} >= {g['want_speedup_at_M1']}x over bf16 at M=1: "
              f"{', '.join(f'{s:.2f}x' for s in g['got'])} -> {'met' if g['met'] else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
