"""Paged attention for decoding, in Triton: write new K/V into their slots, and attend one new
token per sequence to a KV cache scattered over fixed-size blocks.

    write_kv(k, v, k_cache, v_cache, slot_mapping)
    out = paged_attention_decode(q, k_cache, v_cache, block_tables, context_lens, scale=None)
    out = paged_attention_decode_split(q, k_cache, v_cache, block_tables, context_lens,
                                       scale=None, num_splits=None)

Same signatures, layout and argument checks as the torch references in
`kernels/paged_attention_ref.py` (read its docstring for the layout). Each also takes a
keyword-only `validate=True`; pass False to skip the checks that read tensor values (a GPU sync).

Why it is memory-bound (lecture: arithmetic intensity of attention at decode time). One decode
step of one sequence reads its whole cache, 2 * L * K * H values, and does about 4 * L * N * H
FLOPs with them: 2 * N / K FLOPs per value, i.e. N / K FLOPs per byte in bf16 (4 for Llama-3-8B
style 32/8 heads), nowhere near the ~300 an H100 needs. The time is the bytes of K/V read divided
by the bandwidth, so the kernel is judged by GB/s against a plain device copy, and its one job is
to read every needed K/V byte exactly once and nothing else.

Kernel design:

* One program per (sequence b, KV head kvh): grid (B, K). It loads the G = N / K query heads
  that share that KV head as one [G, H] tile (padded to 16 rows for tl.dot), so each K/V byte is
  read once for the whole group -- GQA's saving shows up as fewer bytes, not just fewer heads.
* The context is walked in tiles of BLOCK_N token positions. Position t lives in block
  block_tables[b, t // block_size] at row t % block_size; the kernel loads the block id for each
  position of the tile (a small gather that hits the cache) and then the [BLOCK_N, H] K and V
  rows with one masked gather. BLOCK_N need not equal block_size, and block ids may be in any
  order: nothing assumes the blocks of a sequence are adjacent in memory.
* Online softmax (the flash-attention recurrence): keep the running max m, the running sum
  l = sum e^{s - m} and the unnormalized output acc per query head; for each tile
      m' = max(m, max_j s_j),  acc = acc * e^{m - m'} + e^{s - m'} @ V,  l = l * e^{m - m'} + ...
  and output acc / l at the end. Scores use exp2 with log2(e) folded into q's scale.
* Positions at or past context_lens[b] are masked: their K/V are never loaded (masked loads
  return 0), so blocks a sequence does not own can hold anything, NaN included.
* Flash-decoding (paged_attention_decode_split): at batch 1 the grid above has only K programs
  (8 for a 32/8-head model) on a GPU with 132 SMs. The split variant adds a third grid axis: split
  s handles positions [s * tps, (s + 1) * tps) (tps = whole blocks, `split_bounds`), writes its
  normalized partial output and its log-sum-exp lse_s = log sum_j e^{s_j} to float32 scratch, and
  a second small kernel merges: o = sum_s e^{lse_s - M} o_s / sum_s e^{lse_s - M}, M = max lse.
* Numerics: every load is upcast to float32 right away (the Triton CPU interpreter computes
  garbage in bf16/fp16); scores, softmax and accumulation are float32. On a GPU the two dots run
  on the tensor cores in the cache's 16-bit dtype (q and K/V already are that dtype; the softmax
  weights p are rounded to it, as in flash attention); float32 caches use full-precision dots.
* Offsets into the cache are 64-bit (block id * block stride exceeds 2**31 elements for caches
  over 4 GiB of bf16); all tensors are addressed through their strides.

`write_kv` is one program per new token: it reads the token's slot, and unless the slot is
negative (padding), copies the token's [K, H] keys and values to row slot % block_size of block
slot // block_size.

Without a GPU these kernels run in Triton's CPU interpreter (kernels/interpret.py), slowly, for
the tests.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .dequant_matmul import _dot_args
from .interpret import INTERPRET
from .intmath import next_power_of_2
from .paged_attention_ref import (
    check_decode_args,
    check_write_kv_args,
    pick_num_splits,
    split_bounds,
)

__all__ = ["write_kv", "paged_attention_decode", "paged_attention_decode_split",
           "DecodeConfig", "pick_decode_config", "INTERPRET"]

LOG2E = 1.4426950408889634


# ---- launch parameters -------------------------------------------------------------------------
@dataclass(frozen=True)
class DecodeConfig:
    """block_n = token positions per loop step (a power of two >= 16, any multiple or fraction
    of the cache's block_size)."""
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 2


def pick_decode_config(head_dim: int, group: int) -> DecodeConfig:
    """[128, H] tiles of K and of V per step (32 KiB each in bf16 at H = 128) with 8 warps: the
    best of `benchmarks/paged_attention.py --sweep` (figures and the alternatives in
    benchmarks/RESULTS.md). Heads over 128 halve the tile to keep the float32 copies of K and V
    in registers. `group` (query heads per KV head) does not change the choice."""
    block_n = 128 if head_dim <= 128 else 64
    return DecodeConfig(block_n=block_n, num_warps=8, num_stages=2)


def _check_config(cfg: DecodeConfig) -> None:
    if cfg.block_n < 16 or cfg.block_n & (cfg.block_n - 1):
        raise ValueError(f"block_n must be a power of two >= 16 (tl.dot), got {cfg.block_n}")


def _check_device(t: torch.Tensor) -> None:
    if not INTERPRET and not t.is_cuda:
        raise ValueError(f"the Triton kernels need CUDA tensors, got the cache on {t.device} "
                         f"(without a GPU, import kernels with TRITON_INTERPRET=1, or use the "
                         f"*_ref functions)")


# ---- kernels -----------------------------------------------------------------------------------
@triton.jit
def _write_kv_kernel(k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr, K, H, block_size,
                     skt, skk, skh, svt, svk, svh, ss,
                     skcb, skcs, skck, skch, svcb, svcs, svck, svch,
                     BLOCK_K: tl.constexpr, BLOCK_H: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + t * ss)                                    # int64, < 0 = skip
    blk = slot // block_size
    row = slot % block_size
    offs_k = tl.arange(0, BLOCK_K)
    offs_h = tl.arange(0, BLOCK_H)
    mask = (slot >= 0) & (offs_k < K)[:, None] & (offs_h < H)[None, :]
    kk, hh = offs_k[:, None], offs_h[None, :]
    x = tl.load(k_ptr + t * skt + kk * skk + hh * skh, mask=mask)
    tl.store(kc_ptr + blk * skcb + row * skcs + kk * skck + hh * skch, x, mask=mask)
    y = tl.load(v_ptr + t * svt + kk * svk + hh * svh, mask=mask)
    tl.store(vc_ptr + blk * svcb + row * svcs + kk * svck + hh * svch, y, mask=mask)


@triton.jit
def _load_q_group(q_ptr, b, kvh, G, H, sqb, sqn, sqh, qk_scale,
                  BLOCK_G: tl.constexpr, BLOCK_H: tl.constexpr):
    """The G query heads served by KV head kvh, as a float32 [BLOCK_G, BLOCK_H] tile (padding
    rows and columns are 0), pre-multiplied by scale * log2(e) so that exp2 gives e^{scale s}."""
    offs_g = tl.arange(0, BLOCK_G)
    offs_h = tl.arange(0, BLOCK_H)
    heads = kvh * G + offs_g
    mask = (offs_g < G)[:, None] & (offs_h < H)[None, :]
    q = tl.load(q_ptr + b * sqb + heads[:, None] * sqn + offs_h[None, :] * sqh, mask=mask,
                other=0.0).to(tl.float32)
    return q * qk_scale


@triton.jit
def _attend(q, kc_ptr, vc_ptr, table_ptr, b, kvh, t_start, t_end, H, block_size,
            stb, stc, skcb, skcs, skck, skch, svcb, svcs, svck, svch,
            BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr,
            DOT_DTYPE: tl.constexpr, DOT_IEEE: tl.constexpr):
    """Online softmax of the query tile q over positions [t_start, t_end) of sequence b.
    Returns (acc [BLOCK_G, BLOCK_H] = sum_j e^{s_j - m} v_j, m [BLOCK_G] = max_j s_j in log2
    units (-1e30 if the range is empty), l [BLOCK_G] = sum_j e^{s_j - m})."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_h = tl.arange(0, BLOCK_H)
    h_ok = offs_h < H
    m = tl.full((BLOCK_G,), -1e30, dtype=tl.float32)
    l = tl.zeros((BLOCK_G,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_G, BLOCK_H), dtype=tl.float32)
    for t0 in range(t_start, t_end, BLOCK_N):
        tok = t0 + offs_n
        t_ok = tok < t_end
        # position -> (block id from the table, row inside the block)
        blk = tl.load(table_ptr + b * stb + (tok // block_size) * stc, mask=t_ok, other=0)
        blk = blk.to(tl.int64)
        row = tok % block_size
        kv_mask = t_ok[:, None] & h_ok[None, :]
        k = tl.load(kc_ptr + (blk * skcb + row * skcs + kvh * skck)[:, None]
                    + offs_h[None, :] * skch, mask=kv_mask, other=0.0).to(tl.float32)
        if DOT_IEEE:                                                     # [BLOCK_G, BLOCK_N]
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q.to(DOT_DTYPE), tl.trans(k.to(DOT_DTYPE)))
        s = tl.where(t_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - m_new[:, None])                            # masked -> 0
        l = l * alpha + tl.sum(p, axis=1)
        v = tl.load(vc_ptr + (blk * svcb + row * svcs + kvh * svck)[:, None]
                    + offs_h[None, :] * svch, mask=kv_mask, other=0.0).to(tl.float32)
        if DOT_IEEE:
            pv = tl.dot(p, v, input_precision="ieee")
        else:
            pv = tl.dot(p.to(DOT_DTYPE), v.to(DOT_DTYPE))
        acc = acc * alpha[:, None] + pv
        m = m_new
    return acc, m, l


@triton.jit
def _decode_kernel(q_ptr, kc_ptr, vc_ptr, table_ptr, lens_ptr, out_ptr, qk_scale,
                   G, H, block_size, sqb, sqn, sqh, stb, stc, sl,
                   skcb, skcs, skck, skch, svcb, svcs, svck, svch, sob, son, soh,
                   BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr,
                   DOT_DTYPE: tl.constexpr, DOT_IEEE: tl.constexpr):
    b, kvh = tl.program_id(0), tl.program_id(1)
    length = tl.load(lens_ptr + b * sl)
    q = _load_q_group(q_ptr, b, kvh, G, H, sqb, sqn, sqh, qk_scale, BLOCK_G, BLOCK_H)
    acc, m, l = _attend(q, kc_ptr, vc_ptr, table_ptr, b, kvh, 0, length, H, block_size,
                        stb, stc, skcb, skcs, skck, skch, svcb, svcs, svck, svch,
                        BLOCK_G, BLOCK_N, BLOCK_H, DOT_DTYPE, DOT_IEEE)
    out = acc / tl.maximum(l, 1e-30)[:, None]
    offs_g = tl.arange(0, BLOCK_G)
    offs_h = tl.arange(0, BLOCK_H)
    mask = (offs_g < G)[:, None] & (offs_h < H)[None, :]
    heads = kvh * G + offs_g
    tl.store(out_ptr + b * sob + heads[:, None] * son + offs_h[None, :] * soh,
             out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _decode_split_kernel(q_ptr, kc_ptr, vc_ptr, table_ptr, lens_ptr, part_ptr, lse_ptr,
                         qk_scale, G, H, block_size, tokens_per_split,
                         sqb, sqn, sqh, stb, stc, sl,
                         skcb, skcs, skck, skch, svcb, svcs, svck, svch,
                         spb, spn, sps, sph, slb, sln, sls,
                         BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr,
                         DOT_DTYPE: tl.constexpr, DOT_IEEE: tl.constexpr):
    b, kvh, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    length = tl.load(lens_ptr + b * sl)
    t_start = split * tokens_per_split
    t_end = tl.minimum(t_start + tokens_per_split, length)              # may be <= t_start
    q = _load_q_group(q_ptr, b, kvh, G, H, sqb, sqn, sqh, qk_scale, BLOCK_G, BLOCK_H)
    acc, m, l = _attend(q, kc_ptr, vc_ptr, table_ptr, b, kvh, t_start, t_end, H, block_size,
                        stb, stc, skcb, skcs, skck, skch, svcb, svcs, svck, svch,
                        BLOCK_G, BLOCK_N, BLOCK_H, DOT_DTYPE, DOT_IEEE)
    part = acc / tl.maximum(l, 1e-30)[:, None]                           # 0 for an empty split
    # natural-log LSE of the scaled scores: m and the exponents are in log2 units
    lse = tl.where(l > 0, (m + tl.log2(tl.maximum(l, 1e-30))) / 1.4426950408889634,
                   float("-inf"))
    offs_g = tl.arange(0, BLOCK_G)
    offs_h = tl.arange(0, BLOCK_H)
    g_ok = offs_g < G
    heads = kvh * G + offs_g
    tl.store(part_ptr + b * spb + heads[:, None] * spn + split * sps + offs_h[None, :] * sph,
             part, mask=g_ok[:, None] & (offs_h < H)[None, :])
    tl.store(lse_ptr + b * slb + heads * sln + split * sls, lse, mask=g_ok)


@triton.jit
def _merge_splits_kernel(part_ptr, lse_ptr, out_ptr, S, H,
                         spb, spn, sps, sph, slb, sln, sls, sob, son, soh,
                         BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr):
    """out[b, n] = sum_s w_s part[b, n, s], w_s = e^{lse_s - M} / sum_r e^{lse_r - M}."""
    b, n = tl.program_id(0), tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_h = tl.arange(0, BLOCK_H)
    s_ok = offs_s < S
    lse = tl.load(lse_ptr + b * slb + n * sln + offs_s * sls, mask=s_ok, other=float("-inf"))
    big = tl.max(lse, axis=0)                                            # split 0 is never empty
    w = tl.exp(lse - big)                                                # empty splits: 0
    mask = s_ok[:, None] & (offs_h < H)[None, :]
    part = tl.load(part_ptr + b * spb + n * spn + offs_s[:, None] * sps + offs_h[None, :] * sph,
                   mask=mask, other=0.0)
    out = tl.sum(w[:, None] * part, axis=0) / tl.sum(w, axis=0)
    tl.store(out_ptr + b * sob + n * son + offs_h * soh, out.to(out_ptr.dtype.element_ty),
             mask=offs_h < H)


# ---- launchers ---------------------------------------------------------------------------------
def _cache_strides(k_cache, v_cache) -> tuple:
    return tuple(k_cache.stride()) + tuple(v_cache.stride())


def _launch_write_kv(k, v, k_cache, v_cache, slot_mapping) -> None:
    """The scatter; arguments already checked."""
    T = k.shape[0]
    if T == 0:
        return
    K, H = k.shape[1:]
    _write_kv_kernel[(T,)](k, v, k_cache, v_cache, slot_mapping, K, H, k_cache.shape[1],
                           *k.stride(), *v.stride(), slot_mapping.stride(0),
                           *_cache_strides(k_cache, v_cache),
                           BLOCK_K=max(2, next_power_of_2(K)),   # >= 2: no size-1 aranges
                           BLOCK_H=max(2, next_power_of_2(H)))


def _tile_sizes(N: int, K: int, H: int) -> dict:
    G = N // K
    return {"BLOCK_G": max(16, next_power_of_2(G)), "BLOCK_H": max(16, next_power_of_2(H))}


def _launch_decode(q, k_cache, v_cache, block_tables, context_lens, scale: float, out,
                   config: DecodeConfig | None = None) -> None:
    """out[B, N, H] = paged decode attention; arguments already checked."""
    B, N, H = q.shape
    K = k_cache.shape[2]
    if B == 0:
        return
    cfg = config or pick_decode_config(H, N // K)
    _check_config(cfg)
    _decode_kernel[(B, K)](
        q, k_cache, v_cache, block_tables, context_lens, out, scale * LOG2E,
        N // K, H, k_cache.shape[1], *q.stride(), *block_tables.stride(), context_lens.stride(0),
        *_cache_strides(k_cache, v_cache), *out.stride(),
        BLOCK_N=cfg.block_n, **_tile_sizes(N, K, H), **_dot_args(q),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)


def _launch_decode_split(q, k_cache, v_cache, block_tables, context_lens, scale: float, out,
                         num_splits: int, config: DecodeConfig | None = None,
                         scratch: tuple | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Flash-decoding into out[B, N, H]; arguments already checked. Returns the float32 scratch
    (partial outputs [B, N, S, H], lse [B, N, S]) for inspection."""
    B, N, H = q.shape
    K, block_size = k_cache.shape[2], k_cache.shape[1]
    tps = split_bounds(block_tables.shape[1], block_size, num_splits)
    if scratch is None:
        part = torch.empty(B, N, num_splits, H, device=q.device, dtype=torch.float32)
        lse = torch.empty(B, N, num_splits, device=q.device, dtype=torch.float32)
    else:
        part, lse = scratch
    if B == 0:
        return part, lse
    cfg = config or pick_decode_config(H, N // K)
    _check_config(cfg)
    tiles = _tile_sizes(N, K, H)
    _decode_split_kernel[(B, K, num_splits)](
        q, k_cache, v_cache, block_tables, context_lens, part, lse, scale * LOG2E,
        N // K, H, block_size, tps, *q.stride(), *block_tables.stride(), context_lens.stride(0),
        *_cache_strides(k_cache, v_cache), *part.stride(), *lse.stride(),
        BLOCK_N=cfg.block_n, **tiles, **_dot_args(q),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    _merge_splits_kernel[(B, N)](
        part, lse, out, num_splits, H, *part.stride(), *lse.stride(), *out.stride(),
        BLOCK_S=max(2, next_power_of_2(num_splits)), BLOCK_H=tiles["BLOCK_H"], num_warps=4)
    return part, lse


def _n_sm(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 132  # an H100 SXM, so that the CPU picks what the GPU would


# ---- the public functions (signatures of kernels/paged_attention_ref.py) -----------------------
def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor, *, validate: bool = True) -> None:
    """k_cache/v_cache[slot // block_size, slot % block_size] = k/v[t] for every token t with
    slot_mapping[t] >= 0 (negative: padding, skipped). In place."""
    check_write_kv_args(k, v, k_cache, v_cache, slot_mapping, validate)
    _check_device(k_cache)
    _launch_write_kv(k, v, k_cache, v_cache, slot_mapping)


def paged_attention_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor,
                           scale: float | None = None, *, validate: bool = True) -> torch.Tensor:
    """Decode attention of q [B, N, H] over each sequence's paged cache: [B, N, H] in q.dtype."""
    shape, scale = check_decode_args(q, k_cache, v_cache, block_tables, context_lens, scale,
                                     validate)
    _check_device(q)
    out = torch.empty_like(q)
    _launch_decode(q, k_cache, v_cache, block_tables, context_lens, scale, out)
    return out


def paged_attention_decode_split(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                 block_tables: torch.Tensor, context_lens: torch.Tensor,
                                 scale: float | None = None, num_splits: int | None = None, *,
                                 validate: bool = True) -> torch.Tensor:
    """paged_attention_decode, flash-decoding style: the context is cut into num_splits ranges
    of whole blocks, handled in parallel, then merged by log-sum-exp. num_splits=None picks
    enough splits for about two programs per SM (pick_num_splits)."""
    shape, scale = check_decode_args(q, k_cache, v_cache, block_tables, context_lens, scale,
                                     validate)
    _check_device(q)
    if num_splits is None:
        num_splits = pick_num_splits(shape.B, shape.K, shape.max_blocks, shape.block_size,
                                     n_sm=_n_sm(q.device))
    out = torch.empty_like(q)
    _launch_decode_split(q, k_cache, v_cache, block_tables, context_lens, scale, out,
                         num_splits)
    return out

