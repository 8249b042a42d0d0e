"""Batch-1 matrix-vector kernels (M = 1, the decode case) with split-K: y = x @ W.T, W in bf16,
int8 (one scale per row) or packed int4 (scale and zero per group).

At M = 1 a weight is used once: the kernel's only job is to stream W from memory as fast as the
memory allows, turning each weight into a float on the way. Two things decide whether it does:

* **enough loads in flight.** One program owns BLOCK_N output rows. With N = 4096 and 8 rows per
  program there are 512 programs, about four per SM of an H100/H200: too few warps to cover the
  memory's latency. Split-K cuts K into SPLIT_K ranges, so SPLIT_K times as many programs stream
  the matrix. Each writes its partial sums to a float32 workspace [SPLIT_K, N]; the program that
  finishes last for a row block (an atomic counter per block says which) adds the partials,
  scales, and writes y -- one launch, no zero-filled buffer and no extra cast kernel. The
  counters are reset by that last program, so they are zero again for the next call (one
  shared set per device: calls on two streams at once must not share it).
* **few instructions per weight.** With FAST_CVT (compiled on a GPU, not in the interpreter)
  int8 codes become floats with byte permutes: one `prmt` builds the float32 bit pattern
  0x4B0000uu (= 2**23 + u) for one byte u of a 32-bit word that holds four codes, so a code
  costs one integer instruction, one subtraction and the multiply-add (the portable path:
  sign-extend, add, OR, subtract). int4: two ANDs and a shift isolate the eight nibbles of a
  word, one `prmt` per nibble builds its float.

Formats, argument checks and references are those of kernels/dequant_matmul.py (the M >= 1
kernels); `kernels.dequant_matmul` sends every M = 1 call here (`pick_config` returns a config
with `gemv=True`). Without a GPU the kernels run in Triton's interpreter (FAST_CVT off) for the
tests. Measured (H200): benchmarks/RESULTS.md, "Second run: a cache tensor per layer and a
Triton GEMV", from `python benchmarks/gemv_sweep.py`.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .interpret import INTERPRET
from .intmath import cdiv

__all__ = ["gemv_float", "gemv_launch_w8", "gemv_launch_w4", "gemv_launch_float"]


# ---- conversions ---------------------------------------------------------------------------
@triton.jit
def _int8_to_f32(q, FAST_CVT: tl.constexpr):
    """int8 codes -> float32 values, exactly."""
    if FAST_CVT:
        # four codes per 32-bit register: flip the sign bits (u = q + 128 in each byte), then
        # one byte permute per code builds 0x4B0000uu, the float 2**23 + u
        f = tl.inline_asm_elementwise(
            asm="""{
            .reg .b32 t, c;
            mov.b32 c, 0x4B000000;
            xor.b32 t, $4, 0x80808080;
            prmt.b32 $0, t, c, 0x7650;
            prmt.b32 $1, t, c, 0x7651;
            prmt.b32 $2, t, c, 0x7652;
            prmt.b32 $3, t, c, 0x7653;
            }""",
            constraints="=r,=r,=r,=r,r", args=[q], dtype=tl.float32, is_pure=True, pack=4)
        return f - 8388736.0
    else:
        return ((q.to(tl.int32) + 128) | 0x4B000000).to(tl.float32, bitcast=True) - 8388736.0


@triton.jit
def _int4_halves_to_f32(b, FAST_CVT: tl.constexpr):
    """uint8 bytes [...] -> (low nibbles, high nibbles) as float32 codes [...], exactly: the
    codes of k = 2j and k = 2j + 1, in the bytes' own layout (no join, no reshape)."""
    if FAST_CVT:
        lo, hi = tl.inline_asm_elementwise(
            asm="""{
            .reg .b32 l, h, c;
            mov.b32 c, 0x4B000000;
            and.b32 l, $8, 0x0F0F0F0F;
            shr.u32 h, $8, 4;
            and.b32 h, h, 0x0F0F0F0F;
            prmt.b32 $0, l, c, 0x7650;
            prmt.b32 $1, l, c, 0x7651;
            prmt.b32 $2, l, c, 0x7652;
            prmt.b32 $3, l, c, 0x7653;
            prmt.b32 $4, h, c, 0x7650;
            prmt.b32 $5, h, c, 0x7651;
            prmt.b32 $6, h, c, 0x7652;
            prmt.b32 $7, h, c, 0x7653;
            }""",
            constraints="=r,=r,=r,=r,=r,=r,=r,=r,r", args=[b],
            dtype=(tl.float32, tl.float32), is_pure=True, pack=4)
        return lo - 8388608.0, hi - 8388608.0
    else:
        bi = b.to(tl.int32)
        return ((bi & 0xF) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0, \
            ((bi >> 4) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0


@triton.jit
def _int4_pairs_to_f32(b, FAST_CVT: tl.constexpr):
    """uint8 bytes [..., J] -> float32 codes [..., J, 2]: [..., j, 0] = low nibble (k = 2j),
    [..., j, 1] = high nibble (k = 2j + 1), exactly."""
    lo, hi = _int4_halves_to_f32(b, FAST_CVT)
    return tl.join(lo, hi)


# ---- the end of every kernel: one program's partial sums -> y --------------------------------
@triton.jit
def _finish(part, s_ptr, ss, b_ptr, sb, y_ptr, syn, ws_ptr, cnt_ptr, offs_n, n_ok, N, pid_n,
            pid_k, HAS_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr):
    """part [BLOCK_N] float32: this program's sum over its K range. Without split-K it is the
    row's whole sum; with it, the last of the SPLIT_K programs of this row block adds them."""
    if SPLIT_K > 1:
        tl.store(ws_ptr + pid_k * N + offs_n, part, mask=n_ok)
        tl.debug_barrier()                           # every thread's partials are written ...
        done = tl.atomic_add(cnt_ptr + pid_n, 1)     # ... before the count (acq_rel, GPU scope)
        if done == SPLIT_K - 1:                      # the last one: the others are all written
            total = tl.zeros_like(part)
            for s in tl.static_range(SPLIT_K):       # .cg: read L2, not a stale L1 line
                total += tl.load(ws_ptr + s * N + offs_n, mask=n_ok, other=0.0,
                                 cache_modifier=".cg")
            _store(total, s_ptr, ss, b_ptr, sb, y_ptr, syn, offs_n, n_ok, HAS_SCALE, HAS_BIAS)
            tl.atomic_xchg(cnt_ptr + pid_n, 0)       # ready for the next call
    else:
        _store(part, s_ptr, ss, b_ptr, sb, y_ptr, syn, offs_n, n_ok, HAS_SCALE, HAS_BIAS)


@triton.jit
def _store(total, s_ptr, ss, b_ptr, sb, y_ptr, syn, offs_n, n_ok, HAS_SCALE: tl.constexpr,
           HAS_BIAS: tl.constexpr):
    if HAS_SCALE:
        total *= tl.load(s_ptr + offs_n * ss, mask=n_ok, other=0.0).to(tl.float32)
    if HAS_BIAS:
        total += tl.load(b_ptr + offs_n * sb, mask=n_ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs_n * syn, total.to(y_ptr.dtype.element_ty), mask=n_ok)


# ---- kernels --------------------------------------------------------------------------------
@triton.jit
def _gemv_rows_kernel(x_ptr, w_ptr, s_ptr, b_ptr, y_ptr, ws_ptr, cnt_ptr, N, K,
                      sxk, swn, swk, ss, sb, syn,
                      IS_INT8: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, FAST_CVT: tl.constexpr):
    """Float (bf16/fp16/fp32) or int8 rows. Products are summed elementwise into a
    [BLOCK_N, BLOCK_K] accumulator and reduced once, after the loop."""
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    k_per = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K) * BLOCK_K       # this program's K range
    k_lo = pid_k * k_per
    k_hi = tl.minimum(k_lo + k_per, K)
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < k_hi
        w = tl.load(w_ptr + offs_n[:, None] * swn + k[None, :] * swk,
                    mask=n_ok[:, None] & k_ok[None, :], other=0)
        if IS_INT8:
            w = _int8_to_f32(w, FAST_CVT)
        else:
            w = w.to(tl.float32)
        x = tl.load(x_ptr + k * sxk, mask=k_ok, other=0.0).to(tl.float32)
        acc += w * x[None, :]
    _finish(tl.sum(acc, axis=1), s_ptr, ss, b_ptr, sb, y_ptr, syn, ws_ptr, cnt_ptr, offs_n, n_ok,
            N, pid_n, pid_k, IS_INT8, HAS_BIAS, SPLIT_K)


@triton.jit
def _gemv_w4_kernel(x_ptr, q_ptr, s_ptr, z_ptr, b_ptr, y_ptr, ws_ptr, cnt_ptr, N, K,
                    sxk, sqn, sqk, ssn, ssg, szn, szg, sb, syn,
                    HAS_BIAS: tl.constexpr, GROUP: tl.constexpr, BLOCK_N: tl.constexpr,
                    GROUPS_PER_STEP: tl.constexpr, SPLIT_K: tl.constexpr,
                    FAST_CVT: tl.constexpr, HALVES: tl.constexpr):
    """Packed int4, GROUPS_PER_STEP groups per step as a [BLOCK_N, groups, GROUP] tile; within
    a group sum_k x (q - z) s = s (sum_k x q - z sum_k x), so scale and zero act once per
    group. Split-K cuts the groups into SPLIT_K ranges."""
    HALF: tl.constexpr = GROUP // 2
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_g = tl.arange(0, GROUPS_PER_STEP)
    n_ok = offs_n < N
    n_groups = K // GROUP
    g_per = tl.cdiv(tl.cdiv(n_groups, SPLIT_K), GROUPS_PER_STEP) * GROUPS_PER_STEP
    g_lo = pid_k * g_per
    g_hi = tl.minimum(g_lo + g_per, n_groups)
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for g0 in range(g_lo, g_hi, GROUPS_PER_STEP):
        grp = g0 + offs_g
        g_ok = grp < g_hi
        byte = grp[None, :, None] * HALF + tl.arange(0, HALF)[None, None, :]
        b = tl.load(q_ptr + offs_n[:, None, None] * sqn + byte * sqk,
                    mask=n_ok[:, None, None] & g_ok[None, :, None], other=0)
        sz_ok = n_ok[:, None] & g_ok[None, :]
        s = tl.load(s_ptr + offs_n[:, None] * ssn + grp[None, :] * ssg, mask=sz_ok,
                    other=0.0).to(tl.float32)
        z = tl.load(z_ptr + offs_n[:, None] * szn + grp[None, :] * szg, mask=sz_ok,
                    other=0.0).to(tl.float32)
        if HALVES:      # low nibbles meet the even inputs, high nibbles the odd ones
            lo, hi = _int4_halves_to_f32(b, FAST_CVT)                  # [BLOCK_N, groups, HALF]
            k = grp[:, None] * GROUP + 2 * tl.arange(0, HALF)[None, :]
            xe = tl.load(x_ptr + k * sxk, mask=g_ok[:, None], other=0.0).to(tl.float32)
            xo = tl.load(x_ptr + (k + 1) * sxk, mask=g_ok[:, None], other=0.0).to(tl.float32)
            qx = tl.sum(lo * xe[None, :, :] + hi * xo[None, :, :], axis=2)
            xsum = tl.sum(xe + xo, axis=1)
        else:           # the codes in k order: [BLOCK_N, groups, GROUP]
            codes = tl.reshape(_int4_pairs_to_f32(b, FAST_CVT),
                               (BLOCK_N, GROUPS_PER_STEP, GROUP))
            k = grp[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
            xr = tl.load(x_ptr + k * sxk, mask=g_ok[:, None], other=0.0).to(tl.float32)
            qx = tl.sum(codes * xr[None, :, :], axis=2)                # [BLOCK_N, groups]
            xsum = tl.sum(xr, axis=1)
        acc += tl.sum(s * (qx - z * xsum[None, :]), axis=1)
    _finish(acc, s_ptr, ssn, b_ptr, sb, y_ptr, syn, ws_ptr, cnt_ptr, offs_n, n_ok, N, pid_n,
            pid_k, False, HAS_BIAS, SPLIT_K)


# ---- launchers (arguments already checked by the callers) -------------------------------------
_WORK: dict = {}


def _workspace(y1, split_k: int, n: int, blocks: int):
    """(float32 partials [split_k, n], int32 counters [blocks], zero) for y1's device, reused
    while large enough: a CUDA graph that captured a call keeps using the same buffers. Without
    split-K, y1 twice: any valid pointer, never read."""
    if split_k == 1:
        return y1, y1
    key = (y1.device.type, y1.device.index)
    ws, cnt = _WORK.get(key, (None, None))
    if ws is None or ws.numel() < split_k * n:
        ws = torch.empty(split_k * n, device=y1.device, dtype=torch.float32)
    if cnt is None or cnt.numel() < blocks:
        cnt = torch.zeros(blocks, device=y1.device, dtype=torch.int32)
    _WORK[key] = ws, cnt
    return ws, cnt


def _fast(fast_cvt: bool) -> bool:
    return bool(fast_cvt) and not INTERPRET


def gemv_launch_float(x1, w, bias, y1, block_n=8, block_k=512, split_k=1, num_warps=4,
                      num_stages=3):
    """y1[N] = w[N, K] @ x1[K] (+ bias) for float weights."""
    N, K = w.shape
    ws, cnt = _workspace(y1, split_k, N, cdiv(N, block_n))
    b = bias if bias is not None else y1
    _gemv_rows_kernel[(cdiv(N, block_n), split_k)](
        x1, w, y1, b, y1, ws, cnt, N, K,
        x1.stride(0), w.stride(0), w.stride(1), 0, b.stride(0), y1.stride(0),
        IS_INT8=False, HAS_BIAS=bias is not None, BLOCK_N=block_n, BLOCK_K=block_k,
        SPLIT_K=split_k, FAST_CVT=False, num_warps=num_warps, num_stages=num_stages)


def gemv_launch_w8(x1, qweight, scales, bias, y1, block_n=8, block_k=1024, split_k=1,
                   num_warps=4, num_stages=3, fast_cvt=True):
    """y1[N] = dequant(qweight)[N, K] @ x1[K] (+ bias), int8 codes with a scale per row."""
    N, K = qweight.shape
    ws, cnt = _workspace(y1, split_k, N, cdiv(N, block_n))
    b = bias if bias is not None else scales
    _gemv_rows_kernel[(cdiv(N, block_n), split_k)](
        x1, qweight, scales, b, y1, ws, cnt, N, K, x1.stride(0), qweight.stride(0),
        qweight.stride(1), scales.stride(0), b.stride(0), y1.stride(0),
        IS_INT8=True, HAS_BIAS=bias is not None, BLOCK_N=block_n, BLOCK_K=block_k,
        SPLIT_K=split_k, FAST_CVT=_fast(fast_cvt), num_warps=num_warps, num_stages=num_stages)


def gemv_launch_w4(x1, qweight, scales, zeros, group_size, bias, y1, block_n=16, block_k=1024,
                   split_k=1, num_warps=8, num_stages=3, fast_cvt=True, halves=False):
    """y1[N] = dequant(qweight, scales, zeros)[N, K] @ x1[K] (+ bias), packed int4."""
    N = qweight.shape[0]
    K = 2 * qweight.shape[1]
    ws, cnt = _workspace(y1, split_k, N, cdiv(N, block_n))
    b = bias if bias is not None else scales[:, 0]
    _gemv_w4_kernel[(cdiv(N, block_n), split_k)](
        x1, qweight, scales, zeros, b, y1, ws, cnt, N, K, x1.stride(0), qweight.stride(0),
        qweight.stride(1), scales.stride(0), scales.stride(1), zeros.stride(0),
        zeros.stride(1), b.stride(0), y1.stride(0),
        HAS_BIAS=bias is not None, GROUP=group_size, BLOCK_N=block_n,
        GROUPS_PER_STEP=block_k // group_size, SPLIT_K=split_k, FAST_CVT=_fast(fast_cvt),
        HALVES=halves, num_warps=num_warps, num_stages=num_stages)


# ---- as a torch operator: what torch.compile and CUDA graphs see -----------------------------
FLOAT_CONFIG = dict(block_n=4, block_k=2048, num_warps=4, split_k=1)   # benchmarks/gemv_sweep.py


@torch.library.custom_op("minillm_kernels::gemv_float", mutates_args=())
def gemv_float(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [1, K] @ w[N, K].T -> [1, N] in x's dtype (float weights, float32 accumulation): the
    Triton GEMV with FLOAT_CONFIG, one operator to torch.compile (which does not trace into
    it) and one kernel in a CUDA graph."""
    if x.dim() != 2 or x.shape[0] != 1 or w.dim() != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"gemv_float takes x [1, K] and w [N, K], got {tuple(x.shape)} and "
                         f"{tuple(w.shape)}")
    y = torch.empty((1, w.shape[0]), device=x.device, dtype=x.dtype)
    gemv_launch_float(x[0], w, None, y[0], **FLOAT_CONFIG)
    return y


@gemv_float.register_fake
def _(x, w):
    return x.new_empty((1, w.shape[0]))
