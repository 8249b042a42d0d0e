"""Batch-1 matrix-vector kernels (M = 1, the decode case) with split-K: y = x @ W.T, W in bf16,
int8 (one scale per row) or packed int4 (scale and zero per group).

At M = 1 a weight is used once: the kernel's only job is to stream W from memory as fast as the
memory allows, turning each weight into a float on the way. What decides whether it does:

* **enough loads in flight.** One program owns BLOCK_N output rows. With N = 4096 and 8 rows per
  program there are 512 programs, about four per SM of an H100/H200: too few warps to cover the
  memory's latency. Split-K cuts K into SPLIT_K ranges, so SPLIT_K times as many programs stream
  the matrix. Each writes its partial sums to a float32 workspace [SPLIT_K, N]; the program that
  finishes last for a row block (an atomic counter per block says which) adds the partials,
  scales, and writes y -- one launch, no zero-filled buffer and no extra cast kernel. The
  counters are reset by that last program, so they are zero again for the next call (one
  shared set per device: calls on two streams at once must not share it).
* **loads that overlap the arithmetic.** A step loads its tile, waits for it, then converts and
  multiply-adds; with PREFETCH the next step's tile is requested first, so it is in flight while
  this step computes. The codes are read as int32 words (four int8 or eight int4 codes each),
  the width in which the prefetched tile waits in registers (a tile of int8 elements would be
  repacked into words by extra byte permutes every step).
* **few instructions per weight.** With FAST_CVT (compiled on a GPU, not in the interpreter)
  codes become floats with byte permutes: one `prmt` builds the float32 bit pattern 0x4B0000uu
  (= 2**23 + u) for one byte u of a word, so an int8 code costs one permute, one subtraction
  and the multiply-add (the portable path: shift, mask, OR, subtract). int4: one LOP3 (mask and
  OR in one instruction) puts two nibbles of a word, shifted into place, under the exponent of
  two bfloat16s (0x4300 | code = 128 + code), and a shift or an AND widens each to float32; the
  kernel takes the 128 off with the zero point, once per group, so no subtraction per code is
  left. tl.join puts the codes of a word side by side and a reshape gives them in k order, so
  x is read contiguously.
  `python benchmarks/kernel_sass.py` shows the result without a GPU: registers, instructions
  per weight and barriers in the loop of each kernel as compiled for sm_90.

Formats, argument checks and references are those of kernels/dequant_matmul.py (the M >= 1
kernels); `kernels.dequant_matmul` sends every M = 1 call here (`pick_config` returns a config
with `gemv=True`) when the codes are whole aligned words (`words_ok`; other views take its M >= 2
kernels). Without a GPU the kernels run in Triton's interpreter (FAST_CVT off) for the tests.
Measured (H100 and H200): benchmarks/RESULTS.md, "Third run: words, prefetch and split-K for
M = 2..16" and "Fifth run" (the int4 conversion), from `python benchmarks/gemv_sweep.py`.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .interpret import INTERPRET
from .intmath import cdiv

__all__ = ["gemv_float", "gemv_launch_w8", "gemv_launch_w4", "gemv_launch_float", "words_ok"]


# ---- conversions: one 32-bit word of codes -> floats -------------------------------------------
@triton.jit
def _int8x4_to_f32(word, FAST_CVT: tl.constexpr):
    """int32 words holding four int8 codes (byte j = code j) -> float32 [..., 2, 2], exactly;
    reshaping the last two axes into one gives the codes in memory order."""
    if FAST_CVT:
        # flip the sign bits (u = q + 128 in each byte), then one byte permute per code
        # builds 0x4B0000uu, the float 2**23 + u
        c0, c1, c2, c3 = tl.inline_asm_elementwise(
            asm="""{
            .reg .b32 t, c;
            mov.b32 c, 0x4B000000;
            xor.b32 t, $4, 0x80808080;
            prmt.b32 $0, t, c, 0x7650;
            prmt.b32 $1, t, c, 0x7651;
            prmt.b32 $2, t, c, 0x7652;
            prmt.b32 $3, t, c, 0x7653;
            }""",
            constraints="=r,=r,=r,=r,r", args=[word], dtype=(tl.float32,) * 4, is_pure=True,
            pack=1)
    else:
        t = word ^ -2139062144                                  # 0x80808080 as an int32
        c0, c1, c2, c3 = _u(t & 0xFF), _u((t >> 8) & 0xFF), _u((t >> 16) & 0xFF), \
            _u((t >> 24) & 0xFF)
    # tl.join adds a last axis: join(join(a, c), join(b, d))[..., i, j] is code 2i + j
    return tl.join(tl.join(c0, c2), tl.join(c1, c3)) - 8388736.0


@triton.jit
def _int4x8_to_f32(word, FAST_CVT: tl.constexpr):
    """int32 words holding eight int4 codes (byte j: code 2j in the low nibble, 2j + 1 in the
    high one) -> float32 128 + code [..., 2, 2, 2], exactly, codes in memory order once
    reshaped. The kernel takes the 128 off with the zero point (it multiplies by x first)."""
    if FAST_CVT:
        # a shift and one LOP3 put two nibbles (codes i and i + 4) under the exponent of two
        # bfloat16s, 0x4300 | code = 128 + code; a bfloat16 is the top half of a float32, so a
        # shift by 16 (low half) or an AND (high half) makes each a float32
        c0, c1, c2, c3, c4, c5, c6, c7 = tl.inline_asm_elementwise(
            asm="""{
            .reg .b32 t0, t1, t2, t3, s;
            lop3.b32 t0, $8, 0x000F000F, 0x43004300, 0xEA;
            shr.u32 s, $8, 4;
            lop3.b32 t1, s, 0x000F000F, 0x43004300, 0xEA;
            shr.u32 s, $8, 8;
            lop3.b32 t2, s, 0x000F000F, 0x43004300, 0xEA;
            shr.u32 s, $8, 12;
            lop3.b32 t3, s, 0x000F000F, 0x43004300, 0xEA;
            shl.b32 $0, t0, 16;
            shl.b32 $1, t1, 16;
            shl.b32 $2, t2, 16;
            shl.b32 $3, t3, 16;
            and.b32 $4, t0, 0xFFFF0000;
            and.b32 $5, t1, 0xFFFF0000;
            and.b32 $6, t2, 0xFFFF0000;
            and.b32 $7, t3, 0xFFFF0000;
            }""",
            constraints="=r,=r,=r,=r,=r,=r,=r,=r,r", args=[word], dtype=(tl.float32,) * 8,
            is_pure=True, pack=1)
    else:
        c0, c1, c2, c3 = _u(word & 0xF), _u((word >> 4) & 0xF), _u((word >> 8) & 0xF), \
            _u((word >> 12) & 0xF)
        c4, c5, c6, c7 = _u((word >> 16) & 0xF), _u((word >> 20) & 0xF), \
            _u((word >> 24) & 0xF), _u((word >> 28) & 0xF)
    # [..., i, j, l] is code 4i + 2j + l (each join's new axis is the last one)
    codes = tl.join(tl.join(tl.join(c0, c4), tl.join(c2, c6)),
                    tl.join(tl.join(c1, c5), tl.join(c3, c7)))
    if not FAST_CVT:
        codes = codes - 8388480.0                             # 2**23 + code -> 128 + code
    return codes


@triton.jit
def _u(b):
    """int32 0 <= b < 2**23 -> the float32 2**23 + b (its bits are 0x4B000000 | b)."""
    return (b | 0x4B000000).to(tl.float32, bitcast=True)


# ---- the end of every kernel: one program's partial sums -> y --------------------------------
@triton.jit
def _split_k_sum(part, ws_ptr, cnt_ptr, offs, ok, size, counter, pid_k, SPLIT_K: tl.constexpr):
    """Split-K in one launch, for any tile: each of the SPLIT_K programs that share counter
    `counter` stores its partial sums `part` (at `offs` in its [size] slice of the float32
    workspace, mask `ok`) and counts itself in. Returns (the sum of all SPLIT_K parts, whether
    this program is the last): only the last one reads the parts (the others' loads are masked
    off), since only it knows they are all written; it also puts the counter back to zero for
    the next call. The caller stores the sum when it is the last."""
    tl.store(ws_ptr + pid_k * size + offs, part, mask=ok)
    tl.debug_barrier()                               # every thread's partials are written ...
    last = tl.atomic_add(cnt_ptr + counter, 1) == SPLIT_K - 1   # ... before the count (acq_rel)
    total = tl.zeros_like(part)
    for s in tl.static_range(SPLIT_K):               # .cg: read L2, not a stale L1 line
        total += tl.load(ws_ptr + s * size + offs, mask=ok & last, other=0.0,
                         cache_modifier=".cg")
    if last:
        tl.atomic_xchg(cnt_ptr + counter, 0)         # ready for the next call
    return total, last


@triton.jit
def _finish(part, s_ptr, ss, b_ptr, sb, y_ptr, syn, ws_ptr, cnt_ptr, offs_n, n_ok, N, pid_n,
            pid_k, HAS_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr):
    """part [BLOCK_N] float32: this program's sum over its K range. Without split-K it is the
    row's whole sum; with it, the last of the SPLIT_K programs of this row block adds them."""
    if SPLIT_K > 1:
        total, last = _split_k_sum(part, ws_ptr, cnt_ptr, offs_n, n_ok, N, pid_n, pid_k, SPLIT_K)
        if last:
            _store(total, s_ptr, ss, b_ptr, sb, y_ptr, syn, offs_n, n_ok, HAS_SCALE, HAS_BIAS)
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
# Each step of a kernel's loop loads a tile (_*_tile), converts it and multiply-adds. With
# PREFETCH the next step's tile is loaded before this step's arithmetic, so it is in flight while
# the arithmetic runs: without it a program waits for memory, then computes, and the two add up.
# The codes are loaded as int32 words (4 int8 or 8 int4 codes each), the width they wait in.
@triton.jit
def _float_tile(x_ptr, w_ptr, offs_n, n_ok, k0, k_hi, sxk, swn, swk, BLOCK_K: tl.constexpr):
    k = k0 + tl.arange(0, BLOCK_K)
    k_ok = k < k_hi
    w = tl.load(w_ptr + offs_n[:, None] * swn + k[None, :] * swk,
                mask=n_ok[:, None] & k_ok[None, :], other=0.0)
    return w, tl.load(x_ptr + k * sxk, mask=k_ok, other=0.0)


@triton.jit
def _gemv_float_kernel(x_ptr, w_ptr, b_ptr, y_ptr, ws_ptr, cnt_ptr, N, K, sxk, swn, swk, sb,
                       syn, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, PREFETCH: tl.constexpr):
    """Float (bf16/fp16/fp32) rows. Products are summed elementwise into a [BLOCK_N, BLOCK_K]
    accumulator and reduced once, after the loop."""
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    k_per = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K) * BLOCK_K       # this program's K range
    k_lo = pid_k * k_per
    k_hi = tl.minimum(k_lo + k_per, K)
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    if PREFETCH:
        nxt = _float_tile(x_ptr, w_ptr, offs_n, n_ok, k_lo, k_hi, sxk, swn, swk, BLOCK_K)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        if PREFETCH:
            w, x = nxt
            nxt = _float_tile(x_ptr, w_ptr, offs_n, n_ok, k0 + BLOCK_K, k_hi, sxk, swn, swk,
                              BLOCK_K)
        else:
            w, x = _float_tile(x_ptr, w_ptr, offs_n, n_ok, k0, k_hi, sxk, swn, swk, BLOCK_K)
        acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
    _finish(tl.sum(acc, axis=1), b_ptr, sb, b_ptr, sb, y_ptr, syn, ws_ptr, cnt_ptr, offs_n,
            n_ok, N, pid_n, pid_k, False, HAS_BIAS, SPLIT_K)


@triton.jit
def _w8_tile(x_ptr, w32_ptr, offs_n, n_ok, c0, c_hi, sxk, swn, BLOCK_W: tl.constexpr):
    """Words [BLOCK_N, BLOCK_W] from word column c0 on, x [4 * BLOCK_W]."""
    col = c0 + tl.arange(0, BLOCK_W)
    c_ok = col < c_hi
    words = tl.load(w32_ptr + offs_n[:, None] * swn + col[None, :],
                    mask=n_ok[:, None] & c_ok[None, :], other=0)
    k = 4 * c0 + tl.arange(0, 4 * BLOCK_W)
    return words, tl.load(x_ptr + k * sxk, mask=k < 4 * c_hi, other=0.0)


@triton.jit
def _gemv_w8_kernel(x_ptr, w_ptr, s_ptr, b_ptr, y_ptr, ws_ptr, cnt_ptr, N, K, sxk, swn, ss, sb,
                    syn, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    SPLIT_K: tl.constexpr, FAST_CVT: tl.constexpr, PREFETCH: tl.constexpr):
    """int8 rows with a scale per row, read as int32 words (swn: row stride in words; K a
    multiple of 4). Accumulates like the float kernel; the scale acts once, at the end."""
    BLOCK_W: tl.constexpr = BLOCK_K // 4
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    w32 = w_ptr.to(tl.pointer_type(tl.int32))
    KW = K // 4
    c_per = tl.cdiv(tl.cdiv(KW, SPLIT_K), BLOCK_W) * BLOCK_W      # this program's word columns
    c_lo = pid_k * c_per
    c_hi = tl.minimum(c_lo + c_per, KW)
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    if PREFETCH:
        nxt = _w8_tile(x_ptr, w32, offs_n, n_ok, c_lo, c_hi, sxk, swn, BLOCK_W)
    for c0 in range(c_lo, c_hi, BLOCK_W):
        if PREFETCH:
            words, x = nxt
            nxt = _w8_tile(x_ptr, w32, offs_n, n_ok, c0 + BLOCK_W, c_hi, sxk, swn, BLOCK_W)
        else:
            words, x = _w8_tile(x_ptr, w32, offs_n, n_ok, c0, c_hi, sxk, swn, BLOCK_W)
        codes = tl.reshape(_int8x4_to_f32(words, FAST_CVT), (BLOCK_N, BLOCK_K))
        acc += codes * x.to(tl.float32)[None, :]
    _finish(tl.sum(acc, axis=1), s_ptr, ss, b_ptr, sb, y_ptr, syn, ws_ptr, cnt_ptr, offs_n, n_ok,
            N, pid_n, pid_k, True, HAS_BIAS, SPLIT_K)


@triton.jit
def _w4_tile(x_ptr, q32_ptr, s_ptr, z_ptr, offs_n, n_ok, g0, g_hi, sxk, sqn, ssn, ssg, szn, szg,
             GROUP: tl.constexpr, GROUPS_PER_STEP: tl.constexpr):
    """Words [BLOCK_N, groups, GROUP / 8], scales and zeros [BLOCK_N, groups], x [groups,
    GROUP], for the groups from g0 on."""
    WPG: tl.constexpr = GROUP // 8                      # words per group
    grp = g0 + tl.arange(0, GROUPS_PER_STEP)
    g_ok = grp < g_hi
    col = grp[None, :, None] * WPG + tl.arange(0, WPG)[None, None, :]
    words = tl.load(q32_ptr + offs_n[:, None, None] * sqn + col,
                    mask=n_ok[:, None, None] & g_ok[None, :, None], other=0)
    sz_ok = n_ok[:, None] & g_ok[None, :]
    s = tl.load(s_ptr + offs_n[:, None] * ssn + grp[None, :] * ssg, mask=sz_ok, other=0.0)
    z = tl.load(z_ptr + offs_n[:, None] * szn + grp[None, :] * szg, mask=sz_ok, other=0.0)
    k = grp[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
    return words, s, z, tl.load(x_ptr + k * sxk, mask=g_ok[:, None], other=0.0)


@triton.jit
def _gemv_w4_kernel(x_ptr, q_ptr, s_ptr, z_ptr, b_ptr, y_ptr, ws_ptr, cnt_ptr, N, K,
                    sxk, sqn, ssn, ssg, szn, szg, sb, syn,
                    HAS_BIAS: tl.constexpr, GROUP: tl.constexpr, BLOCK_N: tl.constexpr,
                    GROUPS_PER_STEP: tl.constexpr, SPLIT_K: tl.constexpr,
                    FAST_CVT: tl.constexpr, PREFETCH: tl.constexpr):
    """Packed int4 read as int32 words (sqn: row stride in words), GROUPS_PER_STEP groups per
    step as a [BLOCK_N, groups, GROUP] tile; within a group sum_k x (q - z) s =
    s (sum_k x q - z sum_k x), so scale and zero act once per group. Split-K cuts the groups
    into SPLIT_K ranges."""
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    q32 = q_ptr.to(tl.pointer_type(tl.int32))
    n_groups = K // GROUP
    g_per = tl.cdiv(tl.cdiv(n_groups, SPLIT_K), GROUPS_PER_STEP) * GROUPS_PER_STEP
    g_lo = pid_k * g_per
    g_hi = tl.minimum(g_lo + g_per, n_groups)
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    if PREFETCH:
        nxt = _w4_tile(x_ptr, q32, s_ptr, z_ptr, offs_n, n_ok, g_lo, g_hi, sxk, sqn, ssn, ssg,
                       szn, szg, GROUP, GROUPS_PER_STEP)
    for g0 in range(g_lo, g_hi, GROUPS_PER_STEP):
        if PREFETCH:
            words, s, z, x = nxt
            nxt = _w4_tile(x_ptr, q32, s_ptr, z_ptr, offs_n, n_ok, g0 + GROUPS_PER_STEP, g_hi,
                           sxk, sqn, ssn, ssg, szn, szg, GROUP, GROUPS_PER_STEP)
        else:
            words, s, z, x = _w4_tile(x_ptr, q32, s_ptr, z_ptr, offs_n, n_ok, g0, g_hi, sxk, sqn,
                                      ssn, ssg, szn, szg, GROUP, GROUPS_PER_STEP)
        codes = tl.reshape(_int4x8_to_f32(words, FAST_CVT), (BLOCK_N, GROUPS_PER_STEP, GROUP))
        x = x.to(tl.float32)
        qx = tl.sum(codes * x[None, :, :], axis=2)                     # [BLOCK_N, groups]
        z = z.to(tl.float32) + 128.0                                   # codes are 128 + q
        acc += tl.sum(s.to(tl.float32) * (qx - z * tl.sum(x, axis=1)[None, :]), axis=1)
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


def words_ok(codes: torch.Tensor) -> bool:
    """Can the int8/int4 kernels read these codes as int32 words: unit column stride, rows of
    a whole number of words, 4-byte aligned start?"""
    return (codes.dim() == 2 and codes.stride(1) == 1 and codes.shape[1] % 4 == 0
            and codes.stride(0) % 4 == 0 and codes.data_ptr() % 4 == 0)


def _need_words(codes: torch.Tensor) -> None:
    if not words_ok(codes):
        raise ValueError(f"the batch-1 kernels read codes as int32 words: they need unit column "
                         f"stride, a row length and row stride that are multiples of 4 bytes "
                         f"and a 4-byte aligned start; got shape {tuple(codes.shape)}, stride "
                         f"{codes.stride()} (kernels.dequant_matmul takes any layout)")


def gemv_launch_float(x1, w, bias, y1, block_n=8, block_k=512, split_k=1, num_warps=4,
                      num_stages=3, prefetch=False):
    """y1[N] = w[N, K] @ x1[K] (+ bias) for float weights."""
    N, K = w.shape
    ws, cnt = _workspace(y1, split_k, N, cdiv(N, block_n))
    b = bias if bias is not None else y1
    _gemv_float_kernel[(cdiv(N, block_n), split_k)](
        x1, w, b, y1, ws, cnt, N, K, x1.stride(0), w.stride(0), w.stride(1), b.stride(0),
        y1.stride(0), HAS_BIAS=bias is not None, BLOCK_N=block_n, BLOCK_K=block_k,
        SPLIT_K=split_k, PREFETCH=prefetch, num_warps=num_warps, num_stages=num_stages)


def gemv_launch_w8(x1, qweight, scales, bias, y1, block_n=8, block_k=1024, split_k=1,
                   num_warps=4, num_stages=3, fast_cvt=True, prefetch=False):
    """y1[N] = dequant(qweight)[N, K] @ x1[K] (+ bias), int8 codes with a scale per row."""
    _need_words(qweight)
    N, K = qweight.shape
    ws, cnt = _workspace(y1, split_k, N, cdiv(N, block_n))
    b = bias if bias is not None else scales
    _gemv_w8_kernel[(cdiv(N, block_n), split_k)](
        x1, qweight, scales, b, y1, ws, cnt, N, K, x1.stride(0), qweight.stride(0) // 4,
        scales.stride(0), b.stride(0), y1.stride(0), HAS_BIAS=bias is not None,
        BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_K=split_k, FAST_CVT=_fast(fast_cvt),
        PREFETCH=prefetch, num_warps=num_warps, num_stages=num_stages)


def gemv_launch_w4(x1, qweight, scales, zeros, group_size, bias, y1, block_n=16, block_k=1024,
                   split_k=1, num_warps=8, num_stages=3, fast_cvt=True, prefetch=False):
    """y1[N] = dequant(qweight, scales, zeros)[N, K] @ x1[K] (+ bias), packed int4 (groups of
    a multiple of 8 codes: whole words)."""
    _need_words(qweight)
    if group_size % 8:
        raise ValueError(f"the int4 batch-1 kernel takes groups of a multiple of 8 codes (whole "
                         f"words), got {group_size}")
    N = qweight.shape[0]
    K = 2 * qweight.shape[1]
    ws, cnt = _workspace(y1, split_k, N, cdiv(N, block_n))
    b = bias if bias is not None else scales[:, 0]
    _gemv_w4_kernel[(cdiv(N, block_n), split_k)](
        x1, qweight, scales, zeros, b, y1, ws, cnt, N, K, x1.stride(0), qweight.stride(0) // 4,
        scales.stride(0), scales.stride(1), zeros.stride(0), zeros.stride(1), b.stride(0),
        y1.stride(0), HAS_BIAS=bias is not None, GROUP=group_size, BLOCK_N=block_n,
        GROUPS_PER_STEP=block_k // group_size, SPLIT_K=split_k, FAST_CVT=_fast(fast_cvt),
        PREFETCH=prefetch, num_warps=num_warps, num_stages=num_stages)


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
