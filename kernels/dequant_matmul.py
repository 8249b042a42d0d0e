"""Fused dequantize-matmul kernels for weight-only quantized linear layers (Triton).

    y = w8a16_matmul(x, qweight, scales, bias=None)
    y = w4a16_matmul(x, qweight, scales, zeros, group_size, bias=None)

Same signatures, formats and checks as the torch references in `kernels/dequant_ref.py`; the
difference is *where* the weight becomes float. The reference writes a float32 copy of W to
memory and reads it back; these kernels read the 8- or 4-bit codes once and turn them into floats
in registers, so the only big memory traffic is the packed weight itself.

Why that matters (the roofline, lab 01): at decode time M (tokens in the batch) is 1..16, so a
linear layer does 2*M*N*K FLOPs on N*K weights: at most 16 FLOPs per weight byte in bf16, far
below the ~300 FLOPs/byte an H100 needs to be compute-bound. The time is bytes / bandwidth:
bf16 weights = 2 bytes each, int8 = 1, int4 = 0.5 (+ group scales), so up to 2x and 4x faster.

Kernel design (one program = one BLOCK_N slice of output features, looping over all of K):

* Grid (cdiv(N, BLOCK_N), cdiv(M, BLOCK_M), SPLIT_K). Decode has M <= 16, so the N axis must
  provide the parallelism: BLOCK_N = 8 gives 512 programs for N = 4096, about four per H100 SM.
  M = 1 goes to kernels/gemv.py (`pick_config` says so with `gemv=True`): the same FMA path for
  one row, with codes read as int32 words and converted with inline PTX on a GPU, optional
  split-K and prefetch. M = 2..16 on the dot path splits K too (one launch: the last program
  of a column block adds the partial sums, `_finish_split`): with [64, 128] tiles N = 4096
  alone gives only 64 programs.
* Every weight byte is loaded once and dequantized in registers; all M rows of x are applied to
  it before the next tile is loaded (x is tiny and stays in L1/L2).
* M = 1 (with a config without `gemv`, as the sweeps of benchmarks/dequant_matmul.py try): the
  "FMA path" on the CUDA cores. int8: the products are summed elementwise into a
  [BLOCK_M, BLOCK_N, BLOCK_K] float32 accumulator and reduced over k once, after the loop, so a
  step is loads, converts and multiply-adds with no cross-thread reduction. int4: one tl.sum
  per group per step (the group's scale and zero point are applied to that sum, below); the
  rows of x are an unrolled tl.static_range loop reusing the unpacked tile.
  M >= 2: the "dot path", tl.dot with the rows of x padded to 16 or 64 and masked: the FMA
  path's CUDA-core work grows with M, while the padded rows of a dot cost no memory traffic.
  int8: x [16 or 64, BLOCK_K] @ codes [BLOCK_K, BLOCK_N]. int4: the other way round, codes
  [BLOCK_N, G] @ x.T [G, 16 or 64], so on an H100/H200 the weights fill the 64-row side of the
  warp-group tensor-core instruction (wgmma) and x its narrow side; the codes are read as int16
  half-words and become bfloat16 128 + code with one LOP3 per two codes (inline PTX, below).
  (The order, bf16 instead of float32 codes and half-words gave 8-10 % at M = 2..16 on an H200:
  benchmarks/RESULTS.md, "Fourth run".) Codes a kernel cannot read as half-words (an odd row
  stride) take the FMA path.
* int4 nibbles: a byte holds k = 2j (low) and k = 2j + 1 (high). `tl.join(b & 0xF, b >> 4)`
  puts them side by side on a new last axis and a reshape merges (j, 2) back into k, so codes
  come out in natural k order and x is read contiguously. The dot path does the same with the
  four codes of a half-word (`_int4x4_to_16bit`).
* int -> float with a bit trick: for 0 <= u < 2**23, the float32 with bits 0x4B000000 | u is
  exactly 2**23 + u, so an OR and a subtraction replace an int-to-float conversion instruction
  (a quarter of the float32 rate on recent NVIDIA GPUs; int4 needs two per byte).
* Zero points folded out of the inner loop: within a group, sum_k x_k (q_k - z) s =
  s * (sum_k x_k q_k - z * sum_k x_k), so the per-weight work is unpack + one multiply-add per
  row of x; scale and zero are applied once per group. The int4 FMA path loads a 3-D tile
  [BLOCK_N, groups per step, G] so the per-group sums are one tl.sum; the dot path steps one
  group at a time. int8 has one scale per row, applied once at the end.
* Numerics: every load is upcast to float32 right away (the Triton CPU interpreter computes
  garbage in bf16/fp16), accumulation is float32. The dot path feeds the tensor cores codes and
  x in x's 16-bit dtype -- exact, since codes (and 128 + code) are small integers and x already
  is that dtype -- and uses full float32 ("ieee") for float32 x; in the interpreter it always
  dots in float32.
* Every load and store is masked: N need not be a multiple of BLOCK_N, M of BLOCK_M, K of
  BLOCK_K; tensors can be strided views (offsets use the strides passed in).

Measured speed, what limits it, and the variants tried and dropped: benchmarks/RESULTS.md
("Fused dequant-matmul kernels" and "What the kernels tried").

Without a GPU these kernels run in Triton's CPU interpreter (kernels/interpret.py), slowly, for
the tests.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .dequant_ref import check_w4a16_args, check_w8a16_args
from .gemv import _split_k_sum, _workspace, gemv_launch_w4, gemv_launch_w8, words_ok
from .interpret import INTERPRET
from .intmath import cdiv, next_power_of_2

__all__ = ["w8a16_matmul", "w4a16_matmul", "Config", "pick_config", "halfwords_ok", "INTERPRET"]



# ---- block sizes -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Config:
    """Launch parameters. block_k = input features per loop step: for the int4 FMA path a
    multiple of the group size (several groups per step), for the int4 dot path the group size."""
    use_dot: bool
    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3
    gemv: bool = False      # M = 1 only: the split-K GEMV kernels of kernels/gemv.py
    split_k: int = 1        # (gemv, dot) programs per tile of y, each over 1/split_k of K
    prefetch: bool = False  # (gemv) the next step's loads issued before this step's arithmetic


def pick_config(kind: str, M: int, N: int, K: int, group_size: int | None = None) -> Config:
    """The block sizes used for a call: a fixed rule, no autotuning (`python
    benchmarks/dequant_matmul.py --sweep` times the alternatives; the sweeps that chose it are
    in benchmarks/RESULTS.md).

    M = 1 (a matrix-vector product, the decode case): the GEMV kernels of kernels/gemv.py,
    which convert codes with byte permutes on a GPU. w8: [8, 1024] int8 tiles with 4 warps
    ([8, 512] for N >= 8192); w4: [8, 1024] codes with 4 warps, and for N >= 8192 [32, 256]
    tiles with the groups split four ways (split-K), each loading its next tile before it
    computes (prefetch): the best of `python benchmarks/gemv_sweep.py` on an H200.
    M >= 2: the tensor-core path, 16 rows of x (64 for prefill-sized M): the FMA path's
    CUDA-core work grows with M, while the padded rows of the dot cost no memory traffic. Up to
    M = 16 with split-K (one launch, as in the GEMV): N = 4096 alone gives only 64 column
    blocks of 64, too few programs to keep the memory busy. int4 groups under 32 codes always
    take the FMA path (tl.dot needs K tiles >= 16)."""
    if kind not in ("w8", "w4"):
        raise ValueError(f"kind must be 'w8' or 'w4', got {kind!r}")
    small_group = kind == "w4" and group_size is not None and group_size < 32
    if M == 1:
        if kind == "w8":
            return Config(False, 1, 8, 512 if N >= 8192 else 1024, num_warps=4, num_stages=3,
                          gemv=True)
        g = group_size or 0
        if N >= 8192 and g <= 256:
            return Config(False, 1, 32, max(256, g), num_warps=4, num_stages=3, gemv=True,
                          split_k=4, prefetch=True)
        return Config(False, 1, 8, max(1024, g), num_warps=4, num_stages=3, gemv=True,
                      prefetch=True)
    if small_group:
        return _fma_config(M, group_size)
    if M > 16:
        return Config(True, 64, 64, 64 if kind == "w8" else group_size)
    # M = 2..16: one row block of 16. int8: [64, 128] weight tiles, K split four ways where
    # each part still has 4 tiles (the sweeps' best on an H100 and an H200 within 5 %). int4:
    # [64, group] tiles, K split so that there are about 512 programs (four per SM of an
    # H200), each with at least 4 groups (benchmarks/RESULTS.md, "Fourth run", on an H200)
    if kind == "w8":
        return Config(True, 16, 64, 128, num_stages=4,
                      split_k=max(1, min(4, K // (4 * 128))))
    split = max(1, min(8, 512 // cdiv(N, 64), K // group_size // 4))
    return Config(True, 16, 64, group_size, num_stages=3, split_k=split)


def _fma_config(M: int, group_size: int) -> Config:
    """The int4 FMA path for any M (small groups, codes the dot kernel cannot read): up to 4
    rows of x per program, [16, 256] code tiles (a whole group when groups are longer)."""
    return Config(False, min(next_power_of_2(M), 4), 16, max(256, group_size))


def _check_config(cfg: Config, kind: str, group_size: int | None) -> None:
    for name in ("block_m", "block_n", "block_k"):
        v = getattr(cfg, name)
        if v < 1 or v & (v - 1):
            raise ValueError(f"config {name} must be a power of two, got {v}")
    if cfg.gemv and (cfg.use_dot or cfg.block_m != 1 or cfg.split_k < 1):
        raise ValueError(f"a gemv config is for M = 1 on the FMA path, split_k >= 1: {cfg}")
    if cfg.split_k < 1 or (cfg.split_k > 1 and not (cfg.gemv or cfg.use_dot)):
        raise ValueError(f"split_k > 1 is for the gemv and dot paths, split_k >= 1: {cfg}")
    if cfg.prefetch and not cfg.gemv:
        raise ValueError(f"prefetch is an option of the gemv kernels: {cfg}")
    if cfg.use_dot and min(cfg.block_m, cfg.block_n, cfg.block_k) < 16:
        raise ValueError(f"tl.dot needs blocks >= 16, got {cfg}")
    if kind == "w4":
        if cfg.use_dot and cfg.block_k != group_size:
            raise ValueError(f"the int4 dot path steps one group at a time: block_k must equal "
                             f"group_size = {group_size}, got {cfg.block_k}")
        if not cfg.use_dot and cfg.block_k % group_size:
            raise ValueError(f"the int4 FMA path needs block_k a multiple of group_size = "
                             f"{group_size}, got {cfg.block_k}")


# ---- small helpers inside the kernels ----------------------------------------------------------
@triton.jit
def _uint_to_f32(u):
    """int32 u with 0 <= u < 2**23 -> float32, exactly, without an int-to-float instruction."""
    return (u | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0


@triton.jit
def _int8_to_f32(q):
    """int8 -> float32 through the same trick: shift to 0..255, convert, shift back."""
    return ((q.to(tl.int32) + 128) | 0x4B000000).to(tl.float32, bitcast=True) - 8388736.0


@triton.jit
def _nibbles(b):
    """uint8 bytes [..., J] -> int32 codes [..., J, 2]: [..., j, 0] = k 2j, [..., j, 1] = k 2j+1.
    Reshaping the last two axes into one gives the codes in k order."""
    bi = b.to(tl.int32)
    return tl.join(bi & 0xF, bi >> 4)


@triton.jit
def _dot(a, b, DOT_DTYPE: tl.constexpr, DOT_IEEE: tl.constexpr):
    """a @ b in float32, from operands of any float dtype: full float32 with DOT_IEEE, else on
    the tensor cores in DOT_DTYPE."""
    if DOT_IEEE:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a.to(DOT_DTYPE), b.to(DOT_DTYPE))


@triton.jit
def _finish(acc, b_ptr, sb, y_ptr, sym, syn, offs_m, offs_n, M, N, HAS_BIAS: tl.constexpr):
    """Add the bias, cast to y's dtype, store the [BLOCK_M, BLOCK_N] tile (masked)."""
    n_ok = offs_n < N
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n * sb, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    mask = (offs_m < M)[:, None] & n_ok[None, :]
    tl.store(y_ptr + offs_m[:, None] * sym + offs_n[None, :] * syn,
             acc.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _finish_split(acc, ws_ptr, cnt_ptr, b_ptr, sb, y_ptr, sym, syn, offs_m, offs_n, M, N,
                  pid_k, HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr):
    """The dot path's end with split-K (M <= BLOCK_M: one row block): the SPLIT_K programs of a
    column block add their [BLOCK_M, BLOCK_N] tiles through a float32 workspace [SPLIT_K, M, N]
    (kernels/gemv.py's `_split_k_sum`, one counter per column block), the last one stores y."""
    if SPLIT_K > 1:
        ok = (offs_m < M)[:, None] & (offs_n < N)[None, :]
        total, last = _split_k_sum(acc, ws_ptr, cnt_ptr, offs_m[:, None] * N + offs_n[None, :],
                                   ok, M * N, tl.program_id(0), pid_k, SPLIT_K)
        if last:
            _finish(total, b_ptr, sb, y_ptr, sym, syn, offs_m, offs_n, M, N, HAS_BIAS)
    else:
        _finish(acc, b_ptr, sb, y_ptr, sym, syn, offs_m, offs_n, M, N, HAS_BIAS)


# ---- int8 weights ------------------------------------------------------------------------------
@triton.jit
def _w8a16_fma_kernel(x_ptr, q_ptr, s_ptr, b_ptr, y_ptr, M, N, K,
                      sxm, sxk, sqn, sqk, ss, sb, sym, syn,
                      HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr):
    pid_n, pid_m = tl.program_id(0), tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    n_ok, m_ok = offs_n < N, offs_m < M
    # products are summed elementwise and reduced over k once, after the loop: no cross-thread
    # reduction inside it, so each step is loads + converts + multiply-adds
    acc = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < K
        q = tl.load(q_ptr + offs_n[:, None] * sqn + k[None, :] * sqk,
                    mask=n_ok[:, None] & k_ok[None, :], other=0)
        w = _int8_to_f32(q)                                              # [BLOCK_N, BLOCK_K]
        xt = tl.load(x_ptr + offs_m[:, None] * sxm + k[None, :] * sxk,
                     mask=m_ok[:, None] & k_ok[None, :], other=0.0).to(tl.float32)
        acc += w[None, :, :] * xt[:, None, :]                            # every row of x
    s = tl.load(s_ptr + offs_n * ss, mask=n_ok, other=0.0).to(tl.float32)
    _finish(tl.sum(acc, axis=2) * s[None, :], b_ptr, sb, y_ptr, sym, syn, offs_m, offs_n, M, N,
            HAS_BIAS)


@triton.jit
def _w8a16_dot_kernel(x_ptr, q_ptr, s_ptr, b_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, K,
                      sxm, sxk, sqn, sqk, ss, sb, sym, syn,
                      HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, DOT_DTYPE: tl.constexpr, DOT_IEEE: tl.constexpr,
                      SPLIT_K: tl.constexpr):
    pid_n, pid_m, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    n_ok, m_ok = offs_n < N, offs_m < M
    k_per = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K) * BLOCK_K           # this program's K range
    k_lo = pid_k * k_per
    k_hi = tl.minimum(k_lo + k_per, K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < k_hi
        xt = tl.load(x_ptr + offs_m[:, None] * sxm + k[None, :] * sxk,
                     mask=m_ok[:, None] & k_ok[None, :], other=0.0).to(tl.float32)
        q = tl.load(q_ptr + k[:, None] * sqk + offs_n[None, :] * sqn,      # [BLOCK_K, BLOCK_N]
                    mask=k_ok[:, None] & n_ok[None, :], other=0)
        acc += _dot(xt, _int8_to_f32(q), DOT_DTYPE, DOT_IEEE)  # int8 values are exact in 16 bit
    s = tl.load(s_ptr + offs_n * ss, mask=n_ok, other=0.0).to(tl.float32)
    _finish_split(acc * s[None, :], ws_ptr, cnt_ptr, b_ptr, sb, y_ptr, sym, syn, offs_m, offs_n,
                  M, N, pid_k, HAS_BIAS, SPLIT_K)


# ---- int4 weights, group-wise scales and zeros ------------------------------------------------
@triton.jit
def _w4a16_fma_kernel(x_ptr, q_ptr, s_ptr, z_ptr, b_ptr, y_ptr, M, N, K,
                      sxm, sxk, sqn, sqk, ssn, ssg, szn, szg, sb, sym, syn,
                      HAS_BIAS: tl.constexpr, GROUP: tl.constexpr, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, GROUPS_PER_STEP: tl.constexpr):
    HALF: tl.constexpr = GROUP // 2                                      # bytes per group
    pid_n, pid_m = tl.program_id(0), tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_g = tl.arange(0, GROUPS_PER_STEP)
    n_ok = offs_n < N
    n_groups = K // GROUP
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for g0 in range(0, n_groups, GROUPS_PER_STEP):
        grp = g0 + offs_g                                                # [G_STEP]
        g_ok = grp < n_groups
        # packed bytes, 3-D tile [BLOCK_N, G_STEP, HALF]
        byte = grp[None, :, None] * HALF + tl.arange(0, HALF)[None, None, :]
        b = tl.load(q_ptr + offs_n[:, None, None] * sqn + byte * sqk,
                    mask=n_ok[:, None, None] & g_ok[None, :, None], other=0)
        codes = _uint_to_f32(tl.reshape(_nibbles(b), (BLOCK_N, GROUPS_PER_STEP, GROUP)))
        sz_mask = n_ok[:, None] & g_ok[None, :]                          # [BLOCK_N, G_STEP]
        s = tl.load(s_ptr + offs_n[:, None] * ssn + grp[None, :] * ssg, mask=sz_mask,
                    other=0.0).to(tl.float32)
        z = tl.load(z_ptr + offs_n[:, None] * szn + grp[None, :] * szg, mask=sz_mask,
                    other=0.0).to(tl.float32)
        k = grp[:, None] * GROUP + tl.arange(0, GROUP)[None, :]          # [G_STEP, GROUP]
        for i in tl.static_range(BLOCK_M):                               # reuse codes per row
            m = pid_m * BLOCK_M + i
            xr = tl.load(x_ptr + m * sxm + k * sxk, mask=g_ok[:, None] & (m < M),
                         other=0.0).to(tl.float32)
            qx = tl.sum(codes * xr[None, :, :], axis=2)                  # sum_k q x per group
            xsum = tl.sum(xr, axis=1)                                    # sum_k x   per group
            part = tl.sum(s * (qx - z * xsum[None, :]), axis=1)          # [BLOCK_N]
            acc = tl.where(offs_m[:, None] == m, acc + part[None, :], acc)
    _finish(acc, b_ptr, sb, y_ptr, sym, syn, offs_m, offs_n, M, N, HAS_BIAS)


@triton.jit
def _int4x4_to_16bit(h, FAST_CVT: tl.constexpr):
    """int16 half-words of four int4 codes (code j in bits 4j..4j+3) -> bfloat16 128 + code,
    [..., 2, 2] with code 2p + q at [..., p, q]: reshaped, the codes come in memory order.
    With FAST_CVT (a GPU) one LOP3 per two codes: a register holds two half-words, so
    (bits >> 4j) & 0x000F000F | 0x43004300 is the bfloat16 pair 128 + code j of each (0x4300
    is 128.0, whose last mantissa bit weighs 1). The 128 is taken off with the zero point."""
    if FAST_CVT:
        c0, c1, c2, c3 = tl.inline_asm_elementwise(
            asm="""{
            .reg .b32 t;
            lop3.b32 $0, $4, 0x000F000F, 0x43004300, 0xEA;
            shr.u32 t, $4, 4;
            lop3.b32 $1, t, 0x000F000F, 0x43004300, 0xEA;
            shr.u32 t, $4, 8;
            lop3.b32 $2, t, 0x000F000F, 0x43004300, 0xEA;
            shr.u32 t, $4, 12;
            lop3.b32 $3, t, 0x000F000F, 0x43004300, 0xEA;
            }""",
            constraints="=r,=r,=r,=r,r", args=[h], dtype=(tl.bfloat16,) * 4, is_pure=True,
            pack=2)
    else:
        hi = h.to(tl.int32)
        c0 = ((hi & 0xF) + 128).to(tl.float32)
        c1 = (((hi >> 4) & 0xF) + 128).to(tl.float32)
        c2 = (((hi >> 8) & 0xF) + 128).to(tl.float32)
        c3 = (((hi >> 12) & 0xF) + 128).to(tl.float32)
    return tl.join(tl.join(c0, c2), tl.join(c1, c3))


@triton.jit
def _w4a16_dot_kernel(x_ptr, q_ptr, s_ptr, z_ptr, b_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, K,
                      sxm, sxk, sqn, ssn, ssg, szn, szg, sb, sym, syn,
                      HAS_BIAS: tl.constexpr, GROUP: tl.constexpr, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, DOT_DTYPE: tl.constexpr, DOT_IEEE: tl.constexpr,
                      SPLIT_K: tl.constexpr, FAST_CVT: tl.constexpr):
    """Codes read as int16 half-words (sqn: row stride in half-words). The weight tile is the
    dot's first operand, [BLOCK_N, GROUP] @ x.T [GROUP, BLOCK_M]: on an H100/H200 the codes
    then fill the tensor-core instruction's 64-row side (wgmma), and the few rows of x its
    narrow side. One group per step: qx = sum_k (128 + q) x, then s (qx - (z + 128) sum_k x)."""
    HW: tl.constexpr = GROUP // 4                                        # half-words per group
    pid_n, pid_m, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    n_ok, m_ok = offs_n < N, offs_m < M
    q16 = q_ptr.to(tl.pointer_type(tl.int16))
    g_per = tl.cdiv(K // GROUP, SPLIT_K)                                 # this program's groups
    g_lo = pid_k * g_per
    g_hi = tl.minimum(g_lo + g_per, K // GROUP)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for g in range(g_lo, g_hi):                                          # one group per step
        k = g * GROUP + tl.arange(0, GROUP)
        h = tl.load(q16 + offs_n[:, None] * sqn + (g * HW + tl.arange(0, HW))[None, :],
                    mask=n_ok[:, None], other=0)                         # [BLOCK_N, HW]
        codes = tl.reshape(_int4x4_to_16bit(h, FAST_CVT), (BLOCK_N, GROUP))   # 128 + q, exact
        xt = tl.load(x_ptr + offs_m[None, :] * sxm + k[:, None] * sxk, mask=m_ok[None, :],
                     other=0.0)                                          # [GROUP, BLOCK_M]
        qx = _dot(codes, xt, DOT_DTYPE, DOT_IEEE)                        # [BLOCK_N, BLOCK_M]
        s = tl.load(s_ptr + offs_n * ssn + g * ssg, mask=n_ok, other=0.0).to(tl.float32)
        z = tl.load(z_ptr + offs_n * szn + g * szg, mask=n_ok, other=0.0).to(tl.float32)
        xsum = tl.sum(xt.to(tl.float32), axis=0)                         # [BLOCK_M]
        acc += s[:, None] * (qx - (z + 128.0)[:, None] * xsum[None, :])
    _finish_split(tl.trans(acc), ws_ptr, cnt_ptr, b_ptr, sb, y_ptr, sym, syn, offs_m, offs_n,
                  M, N, pid_k, HAS_BIAS, SPLIT_K)


# ---- launchers ---------------------------------------------------------------------------------
_TL_DTYPE = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}


def _check_device(x: torch.Tensor) -> None:
    if not INTERPRET and not x.is_cuda:
        raise ValueError(f"the Triton kernels need CUDA tensors, got x on {x.device} (without a "
                         f"GPU, import kernels with TRITON_INTERPRET=1, or use the *_ref "
                         f"functions)")


def _dot_args(x: torch.Tensor) -> dict:
    ieee = x.dtype == torch.float32 or INTERPRET  # interpreter: bf16 dots are not trustworthy
    return {"DOT_DTYPE": tl.float32 if ieee else _TL_DTYPE[x.dtype], "DOT_IEEE": ieee}


def _grid(cfg: Config, M: int, N: int, out: torch.Tensor):
    """(grid, workspace, counters) of the M >= 2 kernels; split-K needs M <= block_m."""
    if cfg.split_k > 1 and M > cfg.block_m:
        raise ValueError(f"split-K on the dot path takes at most block_m = {cfg.block_m} rows, "
                         f"got M = {M}")
    grid = (cdiv(N, cfg.block_n), cdiv(M, cfg.block_m), cfg.split_k)
    ws, cnt = _workspace(out, cfg.split_k, M * N, grid[0])
    return grid, ws, cnt


def _launch_w8(x2, qweight, scales, bias, out, config: Config | None = None) -> None:
    """out[M, N] = x2[M, K] @ dequant(qweight).T (+ bias); arguments already checked."""
    M, K = x2.shape
    N = qweight.shape[0]
    if M == 0 or N == 0:
        return
    cfg = config or pick_config("w8", M, N, K)
    _check_config(cfg, "w8", None)
    if cfg.gemv and not words_ok(qweight):      # a view the GEMV cannot read as words
        cfg = pick_config("w8", 2, N, K)
    if cfg.gemv and M == 1:
        return gemv_launch_w8(x2[0], qweight, scales, bias, out[0], cfg.block_n, cfg.block_k,
                              cfg.split_k, cfg.num_warps, cfg.num_stages, prefetch=cfg.prefetch)
    grid, ws, cnt = _grid(cfg, M, N, out)
    b = bias if bias is not None else scales  # any valid pointer; unused without HAS_BIAS
    args = (x2, qweight, scales, b, out, ws, cnt, M, N, K, x2.stride(0), x2.stride(1),
            qweight.stride(0), qweight.stride(1), scales.stride(0), b.stride(0),
            out.stride(0), out.stride(1))
    meta = dict(HAS_BIAS=bias is not None, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                BLOCK_K=cfg.block_k, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    if cfg.use_dot:
        _w8a16_dot_kernel[grid](*args, **meta, **_dot_args(x2), SPLIT_K=cfg.split_k)
    else:
        _w8a16_fma_kernel[grid](*(args[:5] + args[7:]), **meta)


def halfwords_ok(codes: torch.Tensor) -> bool:
    """Can the int4 dot kernel read these packed codes as int16 half-words: unit column stride,
    an even row stride and a 2-byte aligned start?"""
    return (codes.dim() == 2 and codes.stride(1) == 1 and codes.stride(0) % 2 == 0
            and codes.data_ptr() % 2 == 0)


def _launch_w4(x2, qweight, scales, zeros, group_size, bias, out,
               config: Config | None = None) -> None:
    """out[M, N] = x2[M, K] @ dequant(qweight, scales, zeros).T (+ bias); arguments checked."""
    M, K = x2.shape
    N = qweight.shape[0]
    if M == 0 or N == 0:
        return
    cfg = config or pick_config("w4", M, N, K, group_size)
    _check_config(cfg, "w4", group_size)
    if cfg.gemv and (group_size % 8 or not words_ok(qweight)):   # not whole int32 words
        cfg = pick_config("w4", 2, N, K, group_size)
    if cfg.gemv and M == 1:
        return gemv_launch_w4(x2[0], qweight, scales, zeros, group_size, bias, out[0],
                              cfg.block_n, cfg.block_k, cfg.split_k, cfg.num_warps,
                              cfg.num_stages, prefetch=cfg.prefetch)
    if cfg.use_dot and not halfwords_ok(qweight):    # an odd view: the FMA path takes any
        cfg = _fma_config(M, group_size)
    grid, ws, cnt = _grid(cfg, M, N, out)
    b = bias if bias is not None else scales[:, 0]
    meta = dict(HAS_BIAS=bias is not None, GROUP=group_size, BLOCK_M=cfg.block_m,
                BLOCK_N=cfg.block_n, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    if cfg.use_dot:
        _w4a16_dot_kernel[grid](
            x2, qweight, scales, zeros, b, out, ws, cnt, M, N, K, x2.stride(0), x2.stride(1),
            qweight.stride(0) // 2, scales.stride(0), scales.stride(1), zeros.stride(0),
            zeros.stride(1), b.stride(0), out.stride(0), out.stride(1), **meta,
            **_dot_args(x2), SPLIT_K=cfg.split_k, FAST_CVT=not INTERPRET)
    else:
        _w4a16_fma_kernel[grid](
            x2, qweight, scales, zeros, b, out, M, N, K, x2.stride(0), x2.stride(1),
            qweight.stride(0), qweight.stride(1), scales.stride(0), scales.stride(1),
            zeros.stride(0), zeros.stride(1), b.stride(0), out.stride(0), out.stride(1), **meta,
            GROUPS_PER_STEP=cfg.block_k // group_size)


# ---- public API: same signatures as the references ---------------------------------------------
def w8a16_matmul(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                 bias: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ (qweight * scales[:, None]).T (+ bias), int8 weights dequantized in registers.
    x [..., K] float16/bfloat16/float32 -> y [..., N] in x.dtype, float32 accumulation."""
    x2, lead, N, _ = check_w8a16_args(x, qweight, scales, bias)
    _check_device(x2)
    out = torch.empty((x2.shape[0], N), device=x.device, dtype=x.dtype)
    _launch_w8(x2, qweight, scales, bias, out)
    return out.reshape(*lead, N)


def w4a16_matmul(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                 zeros: torch.Tensor, group_size: int,
                 bias: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ W.T (+ bias), W = (unpack(qweight) - zeros) * scales per group of `group_size`,
    the packed int4 codes dequantized in registers. Output in x.dtype, float32 accumulation."""
    x2, lead, N, _ = check_w4a16_args(x, qweight, scales, zeros, group_size, bias)
    _check_device(x2)
    out = torch.empty((x2.shape[0], N), device=x.device, dtype=x.dtype)
    _launch_w4(x2, qweight, scales, zeros, group_size, bias, out)
    return out.reshape(*lead, N)
