"""Batch-1 products on a GPU: every configuration of the split-K GEMV kernels (kernels/gemv.py)
against cuBLAS bf16 and the M >= 1 kernels of kernels/dequant_matmul.py, in one run.

    python benchmarks/gemv_sweep.py --json-out out.json        # needs a CUDA GPU

1. The byte-permute conversions (FAST_CVT, inline PTX) are checked against the torch references
   first; a configuration that fails its check is reported and never timed.
2. Square weights (--sizes, N = K): cuBLAS bf16 `x @ W.T`, `w8a16_matmul` / `w4a16_matmul` as
   they are, and every split-K configuration of the int8 and int4 GEMV kernels (--kinds), each
   with and without prefetch; speed-up = cuBLAS time / kernel time.
3. Float weights: the bf16 GEMV kernel's configurations (with and without prefetch) against
   cuBLAS on the matrices of the 1b and 7b decoders of benchmarks/gpu_decode.py (q/k/v merged,
   o, gate/up merged, down, LM head; --float-models).
Timing: minillm.bench.gpu_timer.Timer (L2 flushed before each call, interleaved, median).
Its figures feed benchmarks/RESULTS.md, "Decode on the bandwidth scale on a GPU" (the second,
third and fifth runs).
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import Timer, check, copy_bandwidth, nbytes  # noqa: E402

FLOAT_SHAPES = {"7b": [(12288, 4096), (4096, 4096), (22016, 4096), (4096, 11008), (32000, 4096)],
                "1b": [(2560, 2048), (2048, 2048), (11264, 2048), (2048, 5632), (32000, 2048)]}


def tiles(kind: str):
    """(block_n, block_k, warps): a float32 copy of a tile holds 16..64 values per thread."""
    if kind == "w4":
        bns, bks, lo = (8, 16, 32), (256, 512, 1024), 16
    else:
        bns, bks, lo = (4, 8, 16), (256, 512, 1024, 2048), 16
    return [(bn, bk, w) for w in (4, 8) for bn in bns for bk in bks
            if lo * 32 * w <= bn * bk <= 64 * 32 * w]


def configs(kind: str):
    fast = {} if kind == "float" else {"fast_cvt": True}
    out = [dict(block_n=bn, block_k=bk, num_warps=w, split_k=s, **fast)
           for bn, bk, w in tiles(kind) for s in (1, 2, 4)]
    out += [dict(c, prefetch=True) for c in out]    # the next step's loads in flight
    if kind != "float":    # the portable conversion, on the kernel's default tile
        bn, bk, w = (8, 1024, 4) if kind == "w8" else (16, 1024, 8)
        out += [dict(block_n=bn, block_k=bk, num_warps=w, split_k=s, fast_cvt=False)
                for s in (1, 2, 4)]
    return out


def name(cfg: dict) -> str:
    return (f"bn{cfg['block_n']}_bk{cfg['block_k']}_w{cfg['num_warps']}_s{cfg['split_k']}"
            + ("_fast" if cfg.get("fast_cvt") else "") + ("_prefetch" if cfg.get("prefetch") else ""))


def time_configs(kind, launch, want, baselines: dict, timer, repeats, label, log):
    """Check then time every configuration of `kind` with the baselines interleaved."""
    fns, failed = dict(baselines), {}
    for cfg in configs(kind):
        try:
            got = launch(cfg)
            if got.is_cuda:
                torch.cuda.synchronize()
            check(got, want, f"{label} {name(cfg)}")
        except (Exception, SystemExit) as e:            # noqa: BLE001 - reported, not timed
            failed[name(cfg)] = repr(e)[:300]
            continue
        fns[name(cfg)] = (lambda cfg=cfg: launch(cfg))
    t = timer.run(fns, 5, repeats)
    late = timer.late_calls()
    if warning := timer.late_warning(label):
        log(warning)
    base = t["cublas_bf16"]
    ranked = sorted((k for k in t if k not in baselines), key=t.get)
    row = {"label": label, "us": {k: round(v * 1e6, 2) for k, v in t.items()},
           "speedup_vs_cublas": {k: round(base / v, 3) for k, v in t.items()},
           "best": ranked[0] if ranked else None, "failed": failed,
           "late_launches": {k: r["late"] for k, r in late.items()}}
    log(f"{label}: cuBLAS {base * 1e6:.1f} us; " + "; ".join(
        f"{k} {t[k] * 1e6:.1f} us ({base / t[k]:.2f}x)" for k in list(baselines)[1:] + ranked[:4])
        + (f"; {len(failed)} failed: {sorted(failed)[:3]}" if failed else ""))
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="4096,8192")
    ap.add_argument("--group", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--float-models", default="7b,1b")
    ap.add_argument("--kinds", default="w8,w4", help="quantized kernels to sweep")
    ap.add_argument("--json-out")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks/gemv_sweep.py times GPU kernels and needs a CUDA GPU; nothing measured.")
        return 0
    import triton

    from kernels import (
        gemv,
        quantize_w4,
        quantize_w8,
        w4a16_matmul,
        w4a16_matmul_ref,
        w8a16_matmul,
        w8a16_matmul_ref,
    )
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "triton": triton.__version__, "date": datetime.datetime.now().isoformat(
                  timespec="seconds"), "command": " ".join(["gemv_sweep.py"] + sys.argv[1:]),
              "copy_GBps": copy_bandwidth(), "square": [], "float": []}

    def save():
        if args.json_out:
            Path(args.json_out).write_text(json.dumps(report, indent=1))

    def log(s):
        print(s, flush=True)
    log(f"{report['device']} torch {torch.__version__} triton {triton.__version__} copy "
        f"{report['copy_GBps']:.0f} GB/s")
    timer = Timer(torch.device("cuda"))
    gen = torch.Generator().manual_seed(0)
    G = args.group
    for n in [int(s) for s in args.sizes.split(",")]:
        w = (torch.randn(n, n, generator=gen) * n ** -0.5).cuda()
        wb = w.to(torch.bfloat16)
        q8, s8 = quantize_w8(w)
        q4, s4, z4 = quantize_w4(w, G)
        x = torch.randn(1, n, generator=gen).to("cuda", torch.bfloat16)
        y = torch.empty(n, device="cuda", dtype=torch.bfloat16)
        base = {"cublas_bf16": lambda: x @ wb.T}
        w8_ref, w4_ref = w8a16_matmul_ref(x, q8, s8)[0], w4a16_matmul_ref(x, q4, s4, z4, G)[0]
        kinds = args.kinds.split(",")
        if "w8" in kinds:
            report["square"].append({**time_configs(
                "w8", lambda c: (gemv.gemv_launch_w8(x[0], q8, s8, None, y, **c), y)[1],
                w8_ref, {**base, "w8a16_matmul": lambda: w8a16_matmul(x, q8, s8)}, timer,
                args.repeats, f"w8 {n}x{n}", log), "N": n, "K": n, "kind": "w8",
                "bytes": nbytes(q8, s8, x) + 2 * n, "bf16_bytes": nbytes(wb, x) + 2 * n})
            save()
        if "w4" in kinds:
            report["square"].append({**time_configs(
                "w4", lambda c: (gemv.gemv_launch_w4(x[0], q4, s4, z4, G, None, y, **c), y)[1],
                w4_ref, {**base, "w4a16_matmul": lambda: w4a16_matmul(x, q4, s4, z4, G)},
                timer, args.repeats, f"w4 {n}x{n}", log), "N": n, "K": n, "kind": "w4",
                "bytes": nbytes(q4, s4, z4, x) + 2 * n, "bf16_bytes": nbytes(wb, x) + 2 * n})
            save()
    for model in [m for m in args.float_models.split(",") if m]:
        for N, K in FLOAT_SHAPES[model]:
            wb = (torch.randn(N, K, generator=gen) * K ** -0.5).to("cuda", torch.bfloat16)
            x = torch.randn(1, K, generator=gen).to("cuda", torch.bfloat16)
            y = torch.empty(N, device="cuda", dtype=torch.bfloat16)
            report["float"].append({**time_configs(
                "float", lambda c: (gemv.gemv_launch_float(x[0], wb, None, y, **c), y)[1],
                (x @ wb.T)[0], {"cublas_bf16": lambda: x @ wb.T}, timer, args.repeats,
                f"bf16 {model} {N}x{K}", log), "N": N, "K": K, "model": model,
                "bytes": nbytes(wb, x) + 2 * N})
            save()
    save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
