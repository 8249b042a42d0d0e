"""Paged attention for decoding: the KV-cache layout, argument checks and a plain-torch reference.

A paged KV cache stores keys and values in fixed-size *blocks* (pages) of `block_size` token
slots, shared by all sequences, instead of one max-length buffer per sequence. A sequence owns a
list of blocks, its *block table*; token position `pos` of a sequence lives in slot

    slot = block_table[pos // block_size] * block_size + pos % block_size

and slot `s` is row `s % block_size` of block `s // block_size`. Per layer:

    k_cache, v_cache   [num_blocks, block_size, K, H]     K key/value heads of head_dim H
    q                  [B, N, H]                          one new token per sequence, N % K == 0
    block_tables       int32 [B, max_blocks]              entries past a sequence's length unused
    context_lens       int32 [B]                          tokens to attend to, >= 1 (new one incl.)
    slot_mapping       int64 [T]                          where write_kv puts token t; < 0 = skip

Functions (same names and signatures in `kernels/paged_attention.py`, the Triton kernels):

    write_kv(k, v, k_cache, v_cache, slot_mapping)           scatter new K/V [T, K, H] in place
    paged_attention_decode(q, k_cache, v_cache, block_tables, context_lens, scale=None)
    paged_attention_decode_split(..., scale=None, num_splits=None)   flash-decoding, same result

Query head n reads KV head n // (N // K) (grouped-query attention; K = 1 is multi-query).
`scale` defaults to 1 / sqrt(H). Outputs have q's dtype; the math is done in float32.

Every function also takes a keyword-only `validate=True`: besides the shape/dtype/device checks
(always done, free), it checks the *values* -- context lengths within the block table, block
ids within the cache, slots within the cache and not repeated. Reading values on a GPU waits for
the GPU (a sync), so a serving loop that builds this metadata itself may pass validate=False.
On the CPU the check is cheap; keep it on.

The package exports these as `write_kv_ref`, `paged_attention_decode_ref`,
`paged_attention_decode_split_ref`; inside this module the unsuffixed names are aliases, so
`kernels.paged_attention_ref` and `kernels.paged_attention` can stand in for each other.
"""
from __future__ import annotations

import math

import torch

from .intmath import cdiv

__all__ = ["write_kv_ref", "paged_attention_decode_ref", "paged_attention_decode_split_ref",
           "write_kv", "paged_attention_decode", "paged_attention_decode_split",
           "check_write_kv_args", "check_decode_args", "pick_num_splits", "split_bounds",
           "merge_splits", "gather_kv", "slot_mapping_ref", "PagedShape", "CACHE_DTYPES"]

CACHE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


class PagedShape(tuple):
    """(B, N, K, H, num_blocks, block_size, max_blocks) of a checked decode call."""
    __slots__ = ()
    B = property(lambda s: s[0])
    N = property(lambda s: s[1])
    K = property(lambda s: s[2])
    H = property(lambda s: s[3])
    num_blocks = property(lambda s: s[4])
    block_size = property(lambda s: s[5])
    max_blocks = property(lambda s: s[6])


# ---- argument checks (shared with the Triton versions) -----------------------------------------
def _desc(t) -> str:
    if not isinstance(t, torch.Tensor):
        return type(t).__name__
    return f"{t.dtype} {tuple(t.shape)} on {t.device}"


def _check_caches(k_cache, v_cache) -> tuple[int, int, int, int]:
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(c, torch.Tensor) or c.dim() != 4:
            raise ValueError(f"{name} must be a 4-D tensor [num_blocks, block_size, K, H], "
                             f"got {_desc(c)}")
        if c.dtype not in CACHE_DTYPES:
            raise ValueError(f"{name} must be float16, bfloat16 or float32, got {c.dtype}")
    if k_cache.shape != v_cache.shape or k_cache.dtype != v_cache.dtype:
        raise ValueError(f"k_cache and v_cache must match: {_desc(k_cache)} vs {_desc(v_cache)}")
    if k_cache.device != v_cache.device:
        raise ValueError(f"k_cache is on {k_cache.device} but v_cache is on {v_cache.device}")
    num_blocks, block_size, K, H = k_cache.shape
    if min(num_blocks, block_size, K, H) < 1:
        raise ValueError(f"k_cache has an empty dimension: {tuple(k_cache.shape)} "
                         f"[num_blocks, block_size, K, H]")
    return num_blocks, block_size, K, H


def _check_int(name: str, t, dtype: torch.dtype, dim: int, what: str, device) -> None:
    if not isinstance(t, torch.Tensor) or t.dtype != dtype or t.dim() != dim:
        raise ValueError(f"{name} must be a {dim}-D {str(dtype).replace('torch.', '')} tensor "
                         f"{what}, got {_desc(t)}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but the cache is on {device}")


def check_write_kv_args(k, v, k_cache, v_cache, slot_mapping, validate: bool = True) -> int:
    """Validate a write_kv call; returns T, the number of tokens."""
    num_blocks, block_size, K, H = _check_caches(k_cache, v_cache)
    for name, t in (("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 3 or tuple(t.shape[1:]) != (K, H):
            raise ValueError(f"{name} must be a 3-D tensor [T, K={K}, H={H}] to match the cache, "
                             f"got {_desc(t)}")
        if t.dtype != k_cache.dtype:
            raise ValueError(f"{name} is {t.dtype} but the cache is {k_cache.dtype}; "
                             f"cast it first (nothing is converted silently)")
        if t.device != k_cache.device:
            raise ValueError(f"{name} is on {t.device} but the cache is on {k_cache.device}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and "
                         f"{tuple(v.shape)}")
    T = k.shape[0]
    _check_int("slot_mapping", slot_mapping, torch.int64, 1, f"[T={T}]", k_cache.device)
    if slot_mapping.shape[0] != T:
        raise ValueError(f"slot_mapping has {slot_mapping.shape[0]} entries for T = {T} tokens")
    if validate and T:
        n_slots = num_blocks * block_size
        used = slot_mapping[slot_mapping >= 0]
        if used.numel() and int(used.max()) >= n_slots:
            raise ValueError(f"slot_mapping has slot {int(used.max())} but the cache has only "
                             f"{n_slots} slots ({num_blocks} blocks of {block_size})")
        if used.numel() != torch.unique(used).numel():
            raise ValueError("slot_mapping sends two tokens to the same slot; each token needs "
                             "its own slot (negative = skip)")
    return T


def check_decode_args(q, k_cache, v_cache, block_tables, context_lens, scale,
                      validate: bool = True) -> tuple[PagedShape, float]:
    """Validate a paged decode call; returns (PagedShape, scale as a float)."""
    num_blocks, block_size, K, H = _check_caches(k_cache, v_cache)
    if not isinstance(q, torch.Tensor) or q.dim() != 3:
        raise ValueError(f"q must be a 3-D tensor [B, N, H] (one new token per sequence), "
                         f"got {_desc(q)}")
    B, N, Hq = q.shape
    if q.dtype != k_cache.dtype:
        raise ValueError(f"q is {q.dtype} but the cache is {k_cache.dtype}; they must match")
    if q.device != k_cache.device:
        raise ValueError(f"q is on {q.device} but the cache is on {k_cache.device}")
    if Hq != H:
        raise ValueError(f"q has head_dim {Hq} but the cache has head_dim H = {H}")
    if N < 1 or N % K:
        raise ValueError(f"q has N = {N} query heads, not a positive multiple of the cache's "
                         f"K = {K} KV heads (each KV head serves N // K query heads)")
    _check_int("block_tables", block_tables, torch.int32, 2, "[B, max_blocks]", q.device)
    _check_int("context_lens", context_lens, torch.int32, 1, "[B]", q.device)
    if block_tables.shape[0] != B or context_lens.shape[0] != B:
        raise ValueError(f"q has B = {B} sequences but block_tables has {block_tables.shape[0]} "
                         f"rows and context_lens {context_lens.shape[0]} entries")
    max_blocks = block_tables.shape[1]
    if max_blocks < 1:
        raise ValueError("block_tables has no columns: every sequence needs at least one block")
    if scale is None:
        scale = 1.0 / math.sqrt(H)
    elif isinstance(scale, bool) or not isinstance(scale, (int, float)) or \
            not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale must be a positive finite number (default 1/sqrt(H)), "
                         f"got {scale!r}")
    if validate and B:
        lo, hi = int(context_lens.min()), int(context_lens.max())
        if lo < 1:
            raise ValueError(f"context_lens must be >= 1 (the new token attends to itself), "
                             f"got {lo}")
        if hi > max_blocks * block_size:
            raise ValueError(f"a context length of {hi} needs {cdiv(hi, block_size)} blocks of "
                             f"{block_size}, but block_tables has only {max_blocks} columns")
        n_used = (context_lens.long() + block_size - 1) // block_size               # [B]
        in_use = torch.arange(max_blocks, device=q.device)[None, :] < n_used[:, None]
        ids = block_tables[in_use]
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= num_blocks):
            bad = int(ids.min()) if int(ids.min()) < 0 else int(ids.max())
            raise ValueError(f"block_tables uses block id {bad}, outside the cache's "
                             f"{num_blocks} blocks")
    return PagedShape((B, N, K, H, num_blocks, block_size, max_blocks)), float(scale)


# ---- helpers the Triton version shares ---------------------------------------------------------
def pick_num_splits(batch: int, n_kv_heads: int, max_blocks: int, block_size: int,
                    n_sm: int = 132, min_tokens_per_split: int = 256) -> int:
    """How many pieces to cut each sequence's context into (flash-decoding).

    The unsplit kernel runs one program per (sequence, KV head). At batch 1 with 8 KV heads that
    is 8 programs on a GPU with 132 SMs: 94% of the chip idles while 8 SMs stream the whole
    cache. Splitting the context into S ranges gives B * K * S programs; aim for about two per SM,
    but keep each split at least `min_tokens_per_split` tokens long so the extra partial results
    (and the merge) stay small next to the K/V they summarize."""
    programs = max(1, batch * n_kv_heads)
    want = cdiv(2 * n_sm, programs)
    most = max(1, (max_blocks * block_size) // min_tokens_per_split)
    return int(max(1, min(want, most)))


def split_bounds(max_blocks: int, block_size: int, num_splits: int) -> int:
    """Tokens per split: split s covers positions [s * tps, (s + 1) * tps) of every sequence,
    tps a whole number of blocks. The splits span the block table's width, so size the tables
    to the longest sequence of the batch; splits past a sequence's end are empty."""
    if isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 1:
        raise ValueError(f"num_splits must be a positive int, got {num_splits!r}")
    blocks_per_split = cdiv(max_blocks, num_splits)
    return blocks_per_split * block_size


def slot_mapping_ref(block_tables: torch.Tensor, positions: torch.Tensor,
                     block_size: int) -> torch.Tensor:
    """Slots of token positions: slot = table[pos // block_size] * block_size + pos % block_size.

    block_tables [max_blocks] (one sequence) or [B, max_blocks]; positions [T] or [B, T]
    (same leading dims), each in 0 .. max_blocks * block_size - 1. Returns int64 slots, the
    shape of positions."""
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")
    if not isinstance(block_tables, torch.Tensor) or block_tables.dtype.is_floating_point \
            or block_tables.dim() not in (1, 2):
        raise ValueError(f"block_tables must be an integer tensor [max_blocks] or [B, "
                         f"max_blocks], got {_desc(block_tables)}")
    if not isinstance(positions, torch.Tensor) or positions.dtype.is_floating_point \
            or positions.dim() != block_tables.dim() \
            or positions.shape[:-1] != block_tables.shape[:-1]:
        raise ValueError(f"positions must be an integer tensor with the table's leading dims "
                         f"{tuple(block_tables.shape[:-1])}, got {_desc(positions)}")
    pos = positions.long()
    if pos.numel() and (int(pos.min()) < 0
                        or int(pos.max()) >= block_tables.shape[-1] * block_size):
        raise ValueError(f"positions must lie in 0..{block_tables.shape[-1] * block_size - 1} "
                         f"({block_tables.shape[-1]} blocks of {block_size}), got "
                         f"{int(pos.min())}..{int(pos.max())}")
    blocks = block_tables.long().gather(-1, pos // block_size)
    return blocks * block_size + pos % block_size


def gather_kv(cache: torch.Tensor, block_tables: torch.Tensor, n_tokens: int) -> torch.Tensor:
    """Positions 0..n_tokens-1 of every sequence, read through its block table: [B, n_tokens,
    K, H] (n_tokens <= max_blocks * block_size). Position p of sequence b comes from block
    block_tables[b, p // block_size], row p % block_size. Table entries a sequence does not use
    may hold anything (-1, stale ids): they are clamped into the cache here, and the caller must
    mask those positions out."""
    num_blocks, block_size = cache.shape[:2]
    pos = torch.arange(n_tokens, device=cache.device)
    blk = block_tables[:, pos // block_size].long()                           # [B, n_tokens]
    blk = blk.clamp(0, num_blocks - 1)       # unused table entries may hold anything (e.g. -1)
    return cache[blk, (pos % block_size)[None, :]]                            # [B, n, K, H]


def _partial_attention(q, k_cache, v_cache, block_tables, context_lens, scale, t0: int, t1: int):
    """Attention of each query over positions [t0, t1) of its sequence, in float32.
    Returns (out [B, N, H] normalized over that range, lse [B, N] = log sum exp of the scaled
    scores; -inf and out = 0 where the range holds none of the sequence's tokens).

    Every sequence is padded to the range's L = t1 - t0 positions. The cache is read with ONE
    index_select of whole [K, H] rows per position (contiguous copies); the padding positions
    read the sequence's own first slot, so unused table entries (-1, stale ids) and whatever
    their blocks hold (garbage, NaN) are never touched, and the mask then zeroes their weight.
    The scores and the weighted sum are one batched matmul per KV head: the gathered rows are
    [B, L, K, H], and slicing one head gives matrices with a row stride of K * H, which matmul
    reads in place (an einsum over all heads would first copy the cache into [B, K, L, H])."""
    B, N, H = q.shape
    block_size, K = k_cache.shape[1], k_cache.shape[2]
    G, L = N // K, t1 - t0
    pos = torch.arange(t0, t1, device=q.device)
    valid = pos[None, :] < context_lens[:, None].long()                       # [B, L]
    slots = block_tables[:, pos // block_size].long() * block_size + pos % block_size
    first = block_tables[:, :1].long() * block_size                           # position 0's slot
    slots = torch.where(valid, slots, first).reshape(-1)
    k = k_cache.view(-1, K, H).index_select(0, slots).view(B, L, K, H).float()
    v = v_cache.view(-1, K, H).index_select(0, slots).view(B, L, K, H).float()
    qg = q.float().view(B, K, G, H)                                # head n -> (n // G, n % G)
    padding = ~valid[:, None, :]                                              # [B, 1, L]
    outs, lses = [], []
    for h in range(K):
        s = torch.matmul(qg[:, h], k[:, :, h].transpose(1, 2)) * scale       # [B, G, L]
        s = s.masked_fill(padding, float("-inf"))
        lse = torch.logsumexp(s, dim=-1)                                      # [B, G]
        p = torch.exp(s - lse[..., None].clamp(min=-1e30))             # empty range: p = 0
        outs.append(torch.matmul(p, v[:, :, h]))                             # [B, G, H]
        lses.append(lse)
    return torch.stack(outs, dim=1).view(B, N, H), torch.stack(lses, dim=1).view(B, N)


def merge_splits(outs: torch.Tensor, lses: torch.Tensor) -> torch.Tensor:
    """Combine per-split results with the log-sum-exp rule.

    Split s saw scores x_j for its tokens and returned o_s = sum_j e^{x_j} v_j / sum_j e^{x_j}
    and lse_s = log sum_j e^{x_j}. The full softmax is then o = sum_s w_s o_s with
    w_s = e^{lse_s - M} / sum_r e^{lse_r - M}, M = max_s lse_s (subtracted so nothing overflows).
    outs [..., S, H], lses [..., S] (float32; an empty split has lse = -inf and gets w = 0)."""
    m = lses.max(dim=-1, keepdim=True).values                                  # [..., 1]
    w = torch.exp(lses - m)                                                    # [..., S]
    return (w[..., None] * outs).sum(dim=-2) / w.sum(dim=-1, keepdim=True)


# ---- the references ----------------------------------------------------------------------------
def write_kv_ref(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slot_mapping: torch.Tensor, *, validate: bool = True) -> None:
    """k_cache/v_cache[slot // block_size, slot % block_size] = k/v[t] for each token t with
    slot_mapping[t] >= 0; tokens with a negative slot (padding) are skipped. In place."""
    check_write_kv_args(k, v, k_cache, v_cache, slot_mapping, validate)
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    block_size = k_cache.shape[1]
    blk, off = slots // block_size, slots % block_size
    k_cache[blk, off] = k[keep]
    v_cache[blk, off] = v[keep]


def paged_attention_decode_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                               block_tables: torch.Tensor, context_lens: torch.Tensor,
                               scale: float | None = None, *, validate: bool = True
                               ) -> torch.Tensor:
    """out[b, n] = softmax_j(scale * q[b, n] . k_j) @ v_j over the context_lens[b] tokens of
    sequence b, read through block_tables[b], with k_j, v_j from KV head n // (N // K).
    Returns [B, N, H] in q's dtype."""
    shape, scale = check_decode_args(q, k_cache, v_cache, block_tables, context_lens, scale,
                                     validate)
    if shape.B == 0:
        return q.new_empty(q.shape)
    longest = int(context_lens.max())
    out, _ = _partial_attention(q, k_cache, v_cache, block_tables, context_lens, scale, 0,
                                longest)
    return out.to(q.dtype)


def paged_attention_decode_split_ref(q: torch.Tensor, k_cache: torch.Tensor,
                                     v_cache: torch.Tensor, block_tables: torch.Tensor,
                                     context_lens: torch.Tensor, scale: float | None = None,
                                     num_splits: int | None = None, *, validate: bool = True
                                     ) -> torch.Tensor:
    """The same result as paged_attention_decode, computed the flash-decoding way: the context
    is cut into num_splits ranges of whole blocks (split_bounds), each range gives a partial
    (out, lse), and merge_splits combines them. num_splits=None: pick_num_splits."""
    shape, scale = check_decode_args(q, k_cache, v_cache, block_tables, context_lens, scale,
                                     validate)
    if num_splits is None:
        num_splits = pick_num_splits(shape.B, shape.K, shape.max_blocks, shape.block_size)
    tps = split_bounds(shape.max_blocks, shape.block_size, num_splits)
    if shape.B == 0:
        return q.new_empty(q.shape)
    longest = int(context_lens.max())
    outs, lses = [], []
    for s in range(num_splits):
        t0, t1 = s * tps, min((s + 1) * tps, longest)
        if t0 >= t1:                             # past every sequence's end: an empty split
            outs.append(q.new_zeros(q.shape, dtype=torch.float32))
            lses.append(torch.full(q.shape[:2], float("-inf"), device=q.device))
            continue
        o, lse = _partial_attention(q, k_cache, v_cache, block_tables, context_lens, scale,
                                    t0, t1)
        outs.append(o)
        lses.append(lse)
    out = merge_splits(torch.stack(outs, dim=2), torch.stack(lses, dim=2))
    return out.to(q.dtype)


# the unsuffixed names: this module mirrors kernels/paged_attention.py
write_kv = write_kv_ref
paged_attention_decode = paged_attention_decode_ref
paged_attention_decode_split = paged_attention_decode_split_ref
