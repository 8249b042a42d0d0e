"""The int4 M = 2..16 tensor-core kernel's variants, timed against cuBLAS bf16 and
`w4a16_matmul` on a GPU: the probe that chose kernels/dequant_matmul.py's `_w4a16_dot_kernel`.

    python benchmarks/w4_dot_probe.py --run 1      # needs a CUDA GPU; --run 1, 2 or 3

Each run is one recorded sweep (benchmarks/RESULTS.md, "Fourth run"), its configurations
fixed here. The kernel below, `w4_mma_kernel`, holds every variant tried:

* `w_as_a`: codes [BLOCK_N, G] @ x.T (the weights on the tensor-core instruction's 64-row side)
  or x [16, G] @ codes.T (the order the int4 dot kernel had);
* `order`: how the int16 half-words of codes become bfloat16 128 + code: "plain" (three shifts
  and four LOP3 per word, then the pairs re-ordered into k order), "pairs" (a PRMT and a LOP3
  per pair of neighbouring codes, no re-ordering), "reg" (no re-ordering either: x read in the
  codes' register order instead);
* `deq`: the weight (code - zero) * scale made in bf16 in registers (one bf16x2 FMA per two
  codes) so the dot accumulates directly; it failed its check against the reference in run 2
  (relative error 0.12) and was never timed;
* `pf_sz`: the program's scales and zeros requested into L2 at its start (prefetch.global.L2).

Every configuration is compiled first in 14 processes (filling Triton's cache), then checked
against `w4a16_matmul_ref` (a wrong one is reported and never timed), then timed with
minillm.gpu_timer.Timer (L2 flushed before each call, interleaved, median). `DRY=1
TRITON_INTERPRET=1` runs five configurations on the CPU at 256 x 256 to try the script.
"""
import argparse
import itertools
import json
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kernels.dequant_matmul import _int4x4_to_16bit  # noqa: E402
from kernels.gemv import _split_k_sum, _workspace  # noqa: E402
from kernels.interpret import INTERPRET  # noqa: E402
from kernels.intmath import cdiv  # noqa: E402


@triton.jit
def _nib(word, i: tl.constexpr):
    return (((word >> (4 * i)) & 0xF) + 128).to(tl.float32).to(tl.bfloat16)


@triton.jit
def _int4_pairs(h, FAST_CVT: tl.constexpr, BLOCK_N: tl.constexpr, HW: tl.constexpr):
    """[BLOCK_N, HW] int16 half-words (each register: one word, 8 codes) -> [BLOCK_N, 4 * HW]
    bf16 128 + code in memory order; register j of a word holds codes 2j, 2j + 1."""
    h2 = tl.reshape(h, (BLOCK_N, HW // 2, 2))
    if FAST_CVT:
        c0, c1, c2, c3 = tl.inline_asm_elementwise(
            asm="""{
            .reg .b32 s;
            shr.u32 s, $4, 4;
            prmt.b32 $0, $4, s, 0x4400;
            lop3.b32 $0, $0, 0x000F000F, 0x43004300, 0xEA;
            prmt.b32 $1, $4, s, 0x5511;
            lop3.b32 $1, $1, 0x000F000F, 0x43004300, 0xEA;
            prmt.b32 $2, $4, s, 0x6622;
            lop3.b32 $2, $2, 0x000F000F, 0x43004300, 0xEA;
            prmt.b32 $3, $4, s, 0x7733;
            lop3.b32 $3, $3, 0x000F000F, 0x43004300, 0xEA;
            }""",
            constraints="=r,=r,=r,=r,r", args=[h2], dtype=(tl.bfloat16,) * 4, is_pure=True,
            pack=2)
    else:
        lo, hi = tl.split(h2)
        word = (lo.to(tl.int32) & 0xFFFF) | (hi.to(tl.int32) << 16)
        c0 = tl.join(_nib(word, 0), _nib(word, 1))
        c1 = tl.join(_nib(word, 2), _nib(word, 3))
        c2 = tl.join(_nib(word, 4), _nib(word, 5))
        c3 = tl.join(_nib(word, 6), _nib(word, 7))
    t = tl.join(tl.join(c0, c2), tl.join(c1, c3))                        # [n, w, e, p, q]
    return tl.reshape(tl.permute(t, (0, 1, 3, 4, 2)), (BLOCK_N, 4 * HW))


@triton.jit
def _int4_dequant(h, s2, c2, FAST_CVT: tl.constexpr, BLOCK_N: tl.constexpr, HW: tl.constexpr):
    """[BLOCK_N, HW] int16 half-words -> bf16 weights (code - zero) * scale = code' * s + c in
    memory order (code' = 128 + code; s2, c2: int32 [BLOCK_N] holding bf16x2 (s, s), (c, c))."""
    h2 = tl.reshape(h, (BLOCK_N, HW // 2, 2))
    s3 = tl.broadcast_to(s2[:, None, None], (BLOCK_N, HW // 2, 2))
    c3 = tl.broadcast_to(c2[:, None, None], (BLOCK_N, HW // 2, 2))
    c0, c1, c2_, c3_ = tl.inline_asm_elementwise(
        asm="""{
        .reg .b32 s;
        shr.u32 s, $4, 4;
        prmt.b32 $0, $4, s, 0x4400;
        lop3.b32 $0, $0, 0x000F000F, 0x43004300, 0xEA;
        fma.rn.bf16x2 $0, $0, $5, $7;
        prmt.b32 $1, $4, s, 0x5511;
        lop3.b32 $1, $1, 0x000F000F, 0x43004300, 0xEA;
        fma.rn.bf16x2 $1, $1, $5, $7;
        prmt.b32 $2, $4, s, 0x6622;
        lop3.b32 $2, $2, 0x000F000F, 0x43004300, 0xEA;
        fma.rn.bf16x2 $2, $2, $5, $7;
        prmt.b32 $3, $4, s, 0x7733;
        lop3.b32 $3, $3, 0x000F000F, 0x43004300, 0xEA;
        fma.rn.bf16x2 $3, $3, $5, $7;
        }""",
        constraints="=r,=r,=r,=r,r,r,r,r,r", args=[h2, s3, c3], dtype=(tl.bfloat16,) * 4,
        is_pure=True, pack=2)
    t = tl.join(tl.join(c0, c2_), tl.join(c1, c3_))                      # [n, w, e, p, q]
    return tl.reshape(tl.permute(t, (0, 1, 3, 4, 2)), (BLOCK_N, 4 * HW))


@triton.jit
def _bf16x2(v):
    """float32 [..] -> int32 whose two halves are v in bf16."""
    b = v.to(tl.bfloat16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    return b | (b << 16)


@triton.jit
def _int4_regorder(h, FAST_CVT: tl.constexpr, BLOCK_N: tl.constexpr, HW: tl.constexpr):
    """[BLOCK_N, HW] half-words -> [BLOCK_N, 4 * HW] bf16 in register order: position
    8w + 2i + e holds code 8w + 4e + i."""
    t = _int4x4_to_16bit(tl.reshape(h, (BLOCK_N, HW // 2, 2)), FAST_CVT)   # [n, w, e, p, q]
    return tl.reshape(tl.permute(t, (0, 1, 3, 4, 2)), (BLOCK_N, 4 * HW))


@triton.jit
def _mma(a, b, DOT_F32: tl.constexpr):
    if DOT_F32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit
def w4_mma_kernel(x_ptr, q_ptr, s_ptr, z_ptr, b_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, K,
                  sxm, sxk, sqn, ssn, ssg, szn, szg, sb, sym, syn,
                  HAS_BIAS: tl.constexpr, GROUP: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr, FAST_CVT: tl.constexpr,
                  W_AS_A: tl.constexpr, REG_ORDER: tl.constexpr = False,
                  PAIRS: tl.constexpr = False, DOT_F32: tl.constexpr = False,
                  DEQ: tl.constexpr = False, PF_SZ: tl.constexpr = False, s_addr=0, z_addr=0):
    """sqn: row stride in int16 half-words."""
    HW: tl.constexpr = GROUP // 4
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    n_ok, m_ok = offs_n < N, offs_m < M
    q16 = q_ptr.to(tl.pointer_type(tl.int16))
    g_per = tl.cdiv(K // GROUP, SPLIT_K)
    g_lo = pid_k * g_per
    g_hi = tl.minimum(g_lo + g_per, K // GROUP)
    if W_AS_A:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if PF_SZ:              # this program's scales and zeros into L2 now, one request per row
        off = (offs_n.to(tl.int64) * ssn + g_lo * ssg) * 2
        tl.inline_asm_elementwise(             # kept: not pure
            asm="prefetch.global.L2 [$1];\n\tprefetch.global.L2 [$2];\n\tmov.u32 $0, 0;",
            constraints="=r,l,l",
            args=[s_addr + off, z_addr + (offs_n.to(tl.int64) * szn + g_lo * szg) * 2],
            dtype=tl.int32, is_pure=False, pack=1)
    for g in range(g_lo, g_hi):
        k = g * GROUP + tl.arange(0, GROUP)
        s = tl.load(s_ptr + offs_n * ssn + g * ssg, mask=n_ok, other=0.0).to(tl.float32)
        z = tl.load(z_ptr + offs_n * szn + g * szg, mask=n_ok, other=0.0).to(tl.float32) + 128.0
        h = tl.load(q16 + offs_n[:, None] * sqn + (g * HW + tl.arange(0, HW))[None, :],
                    mask=n_ok[:, None], other=0)
        if DEQ:
            codes = h
        elif PAIRS:
            codes = _int4_pairs(h, FAST_CVT, BLOCK_N, HW)
        elif REG_ORDER:
            codes = _int4_regorder(h, FAST_CVT, BLOCK_N, HW)
            j = tl.arange(0, GROUP)
            k = g * GROUP + (j // 8) * 8 + (j % 2) * 4 + (j % 8) // 2
        else:
            codes = tl.reshape(_int4x4_to_16bit(h, FAST_CVT), (BLOCK_N, GROUP))   # 128 + q
        if DEQ:
            xt = tl.load(x_ptr + offs_m[None, :] * sxm + k[:, None] * sxk, mask=m_ok[None, :],
                         other=0.0)                                           # [GROUP, BLOCK_M]
            w = _int4_dequant(h, _bf16x2(s), _bf16x2(-z * s), FAST_CVT, BLOCK_N, HW)
            acc = tl.dot(w, xt.to(tl.bfloat16), acc)
        elif W_AS_A:
            xt = tl.load(x_ptr + offs_m[None, :] * sxm + k[:, None] * sxk, mask=m_ok[None, :],
                         other=0.0)                                           # [GROUP, BLOCK_M]
            xsum = tl.sum(xt.to(tl.float32), axis=0)
            qx = _mma(codes, xt.to(tl.bfloat16), DOT_F32)                    # [BLOCK_N, BLOCK_M]
            acc += s[:, None] * (qx - z[:, None] * xsum[None, :])
        else:
            xt = tl.load(x_ptr + offs_m[:, None] * sxm + k[None, :] * sxk, mask=m_ok[:, None],
                         other=0.0)                                           # [BLOCK_M, GROUP]
            xsum = tl.sum(xt.to(tl.float32), axis=1)
            qx = _mma(xt.to(tl.bfloat16), tl.trans(codes), DOT_F32)         # [BLOCK_M, BLOCK_N]
            acc += s[None, :] * (qx - xsum[:, None] * z[None, :])
    if W_AS_A:
        offs = offs_m[None, :] * N + offs_n[:, None]
        ok = m_ok[None, :] & n_ok[:, None]
        yoffs = offs_m[None, :] * sym + offs_n[:, None] * syn
        bias_n = offs_n[:, None]
    else:
        offs = offs_m[:, None] * N + offs_n[None, :]
        ok = m_ok[:, None] & n_ok[None, :]
        yoffs = offs_m[:, None] * sym + offs_n[None, :] * syn
        bias_n = offs_n[None, :]
    if SPLIT_K > 1:
        total, last = _split_k_sum(acc, ws_ptr, cnt_ptr, offs, ok, M * N, pid_n, pid_k, SPLIT_K)
        if last:
            if HAS_BIAS:
                total += tl.load(b_ptr + bias_n * sb, mask=ok, other=0.0).to(tl.float32)
            tl.store(y_ptr + yoffs, total.to(y_ptr.dtype.element_ty), mask=ok)
    else:
        if HAS_BIAS:
            acc += tl.load(b_ptr + bias_n * sb, mask=ok, other=0.0).to(tl.float32)
        tl.store(y_ptr + yoffs, acc.to(y_ptr.dtype.element_ty), mask=ok)




def w4_mma(x, q, s, z, group, bias=None, block_n=64, split_k=1, num_warps=4, num_stages=3,
           w_as_a=True, order="pairs", fast_cvt=True, deq=False, pf_sz=False):
    M, K = x.shape
    N = q.shape[0]
    y = torch.empty((M, N), device=x.device, dtype=x.dtype)
    ws, cnt = _workspace(y, split_k, M * N, cdiv(N, block_n))
    b = bias if bias is not None else s[:, 0]
    w4_mma_kernel[(cdiv(N, block_n), split_k)](
        x, q, s, z, b, y, ws, cnt, M, N, K, x.stride(0), x.stride(1), q.stride(0) // 2,
        s.stride(0), s.stride(1), z.stride(0), z.stride(1), b.stride(0), y.stride(0), y.stride(1),
        HAS_BIAS=bias is not None, GROUP=group, BLOCK_M=16, BLOCK_N=block_n, SPLIT_K=split_k,
        FAST_CVT=fast_cvt and not INTERPRET, W_AS_A=w_as_a, REG_ORDER=order == "reg",
        PAIRS=order == "pairs", DOT_F32=INTERPRET or x.dtype == torch.float32,
        DEQ=deq, PF_SZ=pf_sz and not INTERPRET, s_addr=s.data_ptr(), z_addr=z.data_ptr(),
        num_warps=num_warps, num_stages=num_stages)
    return y


# ---- the sweep ------------------------------------------------------------------------------
G = 128


DRY = os.environ.get("DRY") == "1"
DEV = "cpu" if DRY else "cuda"
SIZES = (256,) if DRY else (4096, 8192)


def configs(run: int) -> list:
    """The configurations each recorded run timed (benchmarks/RESULTS.md, "Fourth run")."""
    out = []
    if run == 1:
        for order, wa in (("pairs", True), ("reg", True), ("pairs", False), ("plain", True)):
            for bn, warps, stages, split in itertools.product((64, 128), (4, 8), (3, 4),
                                                              (1, 2, 4, 8)):
                if order == "plain" and (stages != 3 or warps != 4):
                    continue
                out.append(dict(order=order, w_as_a=wa, block_n=bn, num_warps=warps,
                                num_stages=stages, split_k=split))
    elif run == 2:
        for v in (dict(order="pairs"), dict(order="pairs", pf_sz=True),
                  dict(order="pairs", deq=True), dict(order="pairs", deq=True, pf_sz=True),
                  dict(order="plain", pf_sz=True)):
            for bn, warps, stages, split in itertools.product((64, 128), (4, 8), (3, 4),
                                                              (2, 4, 8)):
                if bn == 64 and warps == 8:
                    continue
                out.append(dict(v, w_as_a=True, block_n=bn, num_warps=warps,
                                num_stages=stages, split_k=split))
    else:
        for v in (dict(order="plain"), dict(order="pairs")):
            for bn, stages, split in itertools.product((32, 64), (2, 3), (4, 8, 16)):
                out.append(dict(v, w_as_a=True, block_n=bn, num_warps=4, num_stages=stages,
                                split_k=split))
    return out[:3] + out[-2:] if DRY else out


def name(c):
    v = c['order'] + ("D" if c.get("deq") else "") + ("P" if c.get("pf_sz") else "")
    return (f"{v}_{'A' if c['w_as_a'] else 'B'}_bn{c['block_n']}_w{c['num_warps']}"
            f"_st{c['num_stages']}_s{c['split_k']}")


def layer(N, K, dev):
    from kernels.dequant_ref import quantize_w4
    g = torch.Generator().manual_seed(N)
    w = torch.randn(N, K, generator=g) * 0.02
    q, s, z = quantize_w4(w, G)
    return w.to(torch.bfloat16).to(dev), q.to(dev), s.to(dev), z.to(dev)


def warm(run_chunk):
    """compile a chunk of configs in this process (fills Triton's disk cache)"""
    chunk = run_chunk
    dev = torch.device(DEV)
    w, q, s, z = layer(SIZES[0], SIZES[0], dev)
    x = torch.randn(1, SIZES[0], device=dev, dtype=torch.bfloat16)
    bad = {}
    for c in chunk:
        try:
            w4_mma(x, q, s, z, G, **c)
        except Exception as e:       # noqa: BLE001
            bad[name(c)] = repr(e)[:300]
    if not DRY:
        torch.cuda.synchronize()
    return bad


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", type=int, choices=(1, 2, 3), default=3)
    args = ap.parse_args(argv)
    from benchmarks.common import Timer, check, copy_bandwidth
    from kernels.dequant_matmul import w4a16_matmul
    from kernels.dequant_ref import w4a16_matmul_ref
    t0 = time.time()
    batches = (1, 2, 16) if args.run < 3 else (2, 16)
    cfgs = configs(args.run)
    chunks = [cfgs[i::14] for i in range(14)]
    bad = {}
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(14, mp_context=spawn) as ex:
        for b in ex.map(warm, chunks):
            bad.update(b)
    print(f"compiled {len(cfgs)} configs in {time.time() - t0:.0f} s; failed {len(bad)}: "
          f"{list(bad.items())[:3]}", flush=True)
    dev = torch.device(DEV)
    copy = 0.0 if DRY else copy_bandwidth(dev)
    print(f"{DEV if DRY else torch.cuda.get_device_name()} copy {copy:.0f} GB/s torch "
          f"{torch.__version__}", flush=True)
    timer = Timer(dev)
    out = {"device": DEV if DRY else torch.cuda.get_device_name(), "copy_gbps": copy, "rows": []}
    for n in SIZES:
        w, q, s, z = layer(n, n, dev)
        for M in batches:
            x = torch.randn(M, n, device=dev, dtype=torch.bfloat16)
            want = w4a16_matmul_ref(x, q, s, z, G)
            fns = {"cublas": lambda x=x, w=w: x @ w.T,
                   "w4a16_matmul": lambda x=x: w4a16_matmul(x, q, s, z, G)}
            fails = {}
            for c in cfgs:
                if name(c) in bad:
                    continue
                try:
                    check(w4_mma(x, q, s, z, G, **c), want, name(c))
                except (Exception, SystemExit) as e:   # noqa: BLE001
                    fails[name(c)] = repr(e)[:200]
                    continue
                fns[name(c)] = (lambda c=c, x=x: w4_mma(x, q, s, z, G, **c))
            t = timer.run(fns, 5, 20 if args.run < 3 else 15)
            base = t["cublas"]
            ranked = sorted((k for k in t if k != "cublas"), key=t.get)
            mine = t["w4a16_matmul"]
            print(f"N=K={n} M={M}: cuBLAS {base * 1e6:.1f} us; w4a16_matmul {mine * 1e6:.1f} "
                  f"({base / mine:.2f}x); best: " + "; ".join(
                      f"{k} {t[k] * 1e6:.1f} ({base / t[k]:.2f}x)" for k in ranked[:6]),
                  flush=True)
            by_order = {}
            for k in ranked:
                o = "_".join(k.split("_")[:2])
                by_order.setdefault(o, k)
            print("   best per variant: " + "; ".join(
                f"{k} {t[k] * 1e6:.1f}" for k in by_order.values()), flush=True)
            if fails:
                print("   check failures:", list(fails.items())[:3], flush=True)
            out["rows"].append({"N": n, "M": M, "fails": fails,
                                "us": {k: round(v * 1e6, 2) for k, v in t.items()}})
    outdir = os.environ.get("OUT", "/tmp")
    Path(outdir, f"w4_dot_probe_run{args.run}.json").write_text(json.dumps(out, indent=1))
    print(f"total {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
