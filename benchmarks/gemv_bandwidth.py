"""How close each matrix-vector product on this CPU comes to a plain read of the same bytes.

    .venv/bin/python benchmarks/gemv_bandwidth.py [--threads 1] [--rounds 7]

Batch-1 decode is a chain of matrix-vector products, so no decode step can beat the slowest GEMV
available for its weight format. The script times, interleaved (median of `--rounds`, 20 passes
each), one pass over the shipped target's weight matrices (its shapes, random values) with:
`read` (`buf.sum()` over a buffer of the same bytes), `blas` (x @ W, [in, out] weights: MKL for
fp32, oneDNN's matmul for bf16), `onednn` (bf16: oneDNN's inner product on weights packed for it)
and `generated` (the product `minillm.compiled_decode.gemv` has Inductor generate: for bf16 a loop
that widens each weight in registers; for fp32 it calls the BLAS). Prints GB/s and the fraction
of `read` per method and format.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import minillm
from minillm.compiled_decode import INDUCTOR_OPTIONS, gemv
from minillm.fast_decode import PackedDecoder


def matrices(model) -> list[torch.Tensor]:
    """The [out, in] matrices one packed decode step reads (q/k/v and gate/up concatenated)."""
    packed = PackedDecoder(model, layout="out_in")
    return [w[k] for w in packed.layers for k in ("qkv", "o", "gu", "down")] + [packed.lm_head]


def methods(ws: list[torch.Tensor]) -> dict:
    dtype = ws[0].dtype
    xs = {n: torch.randn(n) for n in {w.shape[1] for w in ws}}
    xs_d = {n: x.to(dtype)[None] for n, x in xs.items()}
    wts = [w.t().contiguous() for w in ws]
    buf = torch.ones(sum(w.nbytes for w in ws) // 4)
    compiled = torch.compile(lambda ws, xs: [gemv(xs[w.shape[1]], w) for w in ws],
                             options=INDUCTOR_OPTIONS)
    fns = {"read": lambda: buf.sum(),
           "blas": lambda: [xs_d[w.shape[0]] @ w for w in wts],
           "generated": lambda: compiled(ws, xs)}
    if dtype == torch.bfloat16 and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"):
        packed = [torch.ops.mkldnn._reorder_linear_weight(w, 1) for w in ws]
        linear = torch.ops.mkldnn._linear_pointwise
        fns["onednn"] = lambda: [linear(xs_d[w.shape[1]], p, None, "none", [], "")
                                 for w, p in zip(ws, packed)]
    return fns


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    report = {"threads": a.threads, "formats": {}}
    for dtype in (torch.float32, torch.bfloat16):
        ws = matrices(minillm.load("target").to(dtype))
        nbytes = sum(w.nbytes for w in ws)
        fns = methods(ws)
        times = {k: [] for k in fns}
        with torch.no_grad():
            for f in fns.values():
                f()                                   # compile and warm up
            for _ in range(a.rounds):
                for k, f in fns.items():
                    f()
                    t0 = time.perf_counter()
                    for _ in range(20):
                        f()
                    times[k].append((time.perf_counter() - t0) / 20)
        med = {k: statistics.median(v) for k, v in times.items()}
        report["formats"][str(dtype).removeprefix("torch.")] = {
            "bytes": nbytes, **{f"{k}_gb_s": nbytes / t / 1e9 for k, t in med.items()},
            **{f"{k}_vs_read": med["read"] / t for k, t in med.items() if k != "read"}}
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
