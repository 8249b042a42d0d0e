"""How close each matrix-vector product on this CPU comes to a plain read of the same bytes.

    .venv/bin/python benchmarks/gemv_bandwidth.py [--threads 1] [--rounds 7]

Batch-1 decode is a chain of matrix-vector products, so no decode step can beat the slowest GEMV
available for its weight format. The script times, interleaved (median of `--rounds`, 20 passes
each), one pass over the shipped target's weight matrices as `minillm.decode.compiled` holds
them, in four formats (`minillm.bench.quant.model_formats`; fp32 and bf16 with lm_head, int8 and
int4 without it, since the quantized models keep it in bf16), with:

* `read`: `buf.sum()` over a buffer of the same bytes (codes, scales and zeros included);
* `generated`: the product `minillm.decode.compiled.gemv` uses, compiled as the decode step
  compiles it (fp32: `torch.mv`, which Inductor generates as a loop of its own; bf16: a loop
  Inductor generates that widens each weight in registers; int8: that loop on an AVX-512 CPU,
  torch's int8 kernel elsewhere (`minillm.decode.compiled.inductor_vectorizes_int8`); int4: torch's
  int4 CPU kernel);
* fp32 and bf16 `blas`: x @ W with [in, out] weights (MKL for fp32, oneDNN's matmul for bf16);
  bf16 `onednn`: oneDNN's inner product on weights packed for it;
* int8 `torch_kernel`: torch's `_weight_int8pack_mm` (kernels/cpu_weight_only.py, what
  QuantLinear calls on a CPU), and int8 `inductor_loop`: the loop Inductor generates for it,
  whichever `gemv` picks on this CPU; int4 `inductor_loop`: the int4 product written for Inductor to
  generate (per group of 64: unpack both nibbles, multiply-add, scale; subtract scale * zero *
  the group's input sum), the alternative `gemv` rejects.

Prints GB/s and the fraction of `read` per method and format. Its figures feed
benchmarks/RESULTS.md, "Decode on the bandwidth scale (issue 20, CPU)" and "Quantized decode on
the CPU (issue 19, lab 04)".
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

import minillm
from kernels import cpu_weight_only
from minillm.bench.bandwidth import nbytes
from minillm.bench.quant import model_formats
from minillm.decode import PackedDecoder
from minillm.decode.compiled import INDUCTOR_OPTIONS, Int8Rows, gemv, step_matrix

G = 64


def matrices(model, lm_head: bool) -> list:
    """The matrices one compiled decode step reads (q/k/v and gate/up concatenated), as
    `minillm.decode.compiled.step_matrix` keeps them."""
    packed = PackedDecoder(model, layout="out_in")
    ws = [w[k] for w in packed.layers for k in ("qkv", "o", "gu", "down")]
    return [step_matrix(w) for w in ws + ([packed.lm_head] if lm_head else [])]


def shape(w) -> tuple[int, int]:
    if isinstance(w, Int8Rows):
        return tuple(w.codes.shape)
    if isinstance(w, cpu_weight_only.W4Packed):
        return w.N, w.K
    return tuple(w.shape)


def int4_loop(x, packed, scales, scaled_zeros):
    """The int4 product as plain tensor code for Inductor: codes [N, K / 2] (low nibble = even
    k), scales and scale * zero [N, K / G]."""
    N, K = packed.shape[0], 2 * packed.shape[1]
    q = torch.stack([packed & 15, packed >> 4], -1).view(N, K // G, G).float()
    part = (q * x.view(K // G, G)).sum(-1)                       # [N, groups]
    return (part * scales).sum(-1) - scaled_zeros @ x.view(K // G, G).sum(-1)


def methods(ws: list, model) -> dict:
    xs = {n: torch.randn(n) for n in {shape(w)[1] for w in ws}}
    buf = torch.ones(sum(nbytes(w) for w in ws) // 4)
    compiled = torch.compile(lambda ws, xs: [gemv(xs[shape(w)[1]], w) for w in ws],
                             options=INDUCTOR_OPTIONS)
    fns = {"read": lambda: buf.sum(), "generated": lambda: compiled(ws, xs)}
    if isinstance(ws[0], Int8Rows):
        xs_b = {n: x.bfloat16()[None] for n, x in xs.items()}
        fns["torch_kernel"] = lambda: [torch.ops.aten._weight_int8pack_mm(
            xs_b[w.codes.shape[1]], w.codes, w.scales.bfloat16()) for w in ws]
        loop8 = torch.compile(lambda ws, xs: [(w.codes.float() * xs[w.codes.shape[1]]).sum(-1)
                                              * w.scales.float() for w in ws],
                              options=INDUCTOR_OPTIONS)
        fns["inductor_loop"] = lambda: loop8(ws, xs)
    elif isinstance(ws[0], cpu_weight_only.W4Packed):
        packed = PackedDecoder(model, layout="out_in")
        qs = [w[k] for w in packed.layers for k in ("qkv", "o", "gu", "down")]
        args = [(q.qweight, q.scales.float(), (q.scales * q.zeros).float()) for q in qs]
        loop = torch.compile(lambda xs, args: [int4_loop(xs[2 * a[0].shape[1]], *a)
                                               for a in args])
        fns["inductor_loop"] = lambda: loop(xs, args)
    else:
        dtype = ws[0].dtype
        xs_d = {n: x.to(dtype)[None] for n, x in xs.items()}
        wts = [w.t().contiguous() for w in ws]
        fns["blas"] = lambda: [xs_d[w.shape[0]] @ w for w in wts]
        if dtype == torch.bfloat16 and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"):
            try:
                onednn = [torch.ops.mkldnn._reorder_linear_weight(w, 1) for w in ws]
            except RuntimeError as e:           # needs AVX-512 (or AVX-NE-CONVERT) for bf16
                print(f"bf16 onednn: not on this CPU ({str(e).splitlines()[0][:120]})",
                      file=sys.stderr)
                return fns
            linear = torch.ops.mkldnn._linear_pointwise
            fns["onednn"] = lambda: [linear(xs_d[w.shape[1]], p, None, "none", [], "")
                                     for w, p in zip(ws, onednn)]
    return fns


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    report = {"threads": a.threads, "formats": {}}
    for name, model in model_formats(minillm.load("target"), G).items():
        ws = matrices(model, lm_head=name in ("fp32", "bf16"))
        total = sum(nbytes(w) for w in ws)
        fns = methods(ws, model)
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
        report["formats"][name] = {
            "bytes": total, **{f"{k}_gb_s": total / t / 1e9 for k, t in med.items()},
            **{f"{k}_vs_read": med["read"] / t for k, t in med.items() if k != "read"}}
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
