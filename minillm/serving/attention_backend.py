"""The paged KV cache and attention over a ragged batch (selective batching's attention half).

The model runner flattens every scheduled sequence's new tokens into ONE row of
sum-of-lengths tokens, so the dense layers (projections, MLP: most of the FLOPs) run as one big
matmul. Attention cannot be flattened: each sequence attends to its own past. `PagedKVCache`
plugs into the model's cache hook (`attention(layer, q, k, v, positions, window)`, see
minillm/model.py) and, in every layer:

    1. write_kv: scatter the new keys/values of all tokens into their slots (slot_mapping);
    2. decodes (one new token per sequence): one batched paged-attention call over the block
       tables -- the kernel of lab 07 (torch here, Triton on a GPU);
    3. prefills (several new tokens): per sequence, causal attention over its cached prefix and
       its new tokens (query at position p sees keys 0..p).

Writing all sequences before any attention matters: a block shared by prefix caching may be
filled by one sequence in the same step another one reads it.

Storage, per layer: k[layer], v[layer] of shape [num_blocks, block_size, n_kv_heads, head_dim];
slot s is row s % block_size of block s // block_size (the layout of kernels/paged_attention*.py).

Backends (`backend=`) for the decode half: "torch" (ragged gather + segment softmax, the CPU
default), "reference" (kernels/paged_attention_ref.py, the kernels' plain-torch spec), "triton"
(kernels/paged_attention.py, the default on CUDA) and "triton-split" (its flash-decoding
variant). Prefills always use the torch path (gather + scaled_dot_product_attention).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from kernels.paged_attention_ref import gather_kv, write_kv_ref

from ..model import sdpa

BACKENDS = ("auto", "torch", "reference", "triton", "triton-split")


# ---- the torch backend ------------------------------------------------------------------------
def context_slots(block_tables, context_lens, block_size: int) -> torch.Tensor:
    """Every cached slot of every sequence, concatenated: positions 0..context_lens[b]-1 of
    sequence b through its table -> int64 [sum(context_lens)] (ragged: no padding)."""
    width = block_tables.shape[1] * block_size
    slots = (block_tables.long()[:, :, None] * block_size
             + torch.arange(block_size, device=block_tables.device)).reshape(-1, width)
    valid = torch.arange(width, device=block_tables.device)[None, :] < context_lens[:, None]
    return slots[valid]


def decode_torch(q, k_cache, v_cache, ctx_slots, ctx_seq, scale: float | None = None):
    """One query per sequence (q [B, N, H]) over its own cached tokens -> [B, N, H].

    Ragged, with no padding to the longest context: the keys/values of ALL sequences are
    gathered in one index_select (ctx_slots, sum of context lengths rows), ctx_seq[j] says
    which sequence row j belongs to, and the softmax runs per segment:

        s_j = q[seq_j] . k_j * scale      m_b = max_{j in b} s_j      (scatter max)
        out_b = sum_{j in b} e^{s_j - m_b} v_j  /  sum_{j in b} e^{s_j - m_b}   (index_add)

    With n_kv_heads K < N, query head n reads KV head n // (N // K)."""
    B, N, H = q.shape
    K = k_cache.shape[2]
    scale = H ** -0.5 if scale is None else scale
    k = k_cache.view(-1, K, H).index_select(0, ctx_slots)           # [S, K, H]
    v = v_cache.view(-1, K, H).index_select(0, ctx_slots)
    S, G = k.shape[0], N // K
    qs = q.index_select(0, ctx_seq).view(S, K, G, H)                 # head n = (n // G, n % G)
    scores = (qs * k[:, :, None]).sum(-1).float().view(S, N) * scale  # [S, N]
    idx = ctx_seq[:, None].expand_as(scores)
    m = torch.full((B, N), float("-inf"), device=q.device).scatter_reduce(
        0, idx, scores, "amax")
    e = torch.exp(scores - m.index_select(0, ctx_seq))
    den = torch.zeros(B, N, device=q.device).index_add_(0, ctx_seq, e)
    ev = (e.view(S, K, G, 1) * v[:, :, None].float()).view(S, N, H)
    num = torch.zeros(B, N, H, device=q.device).index_add_(0, ctx_seq, ev)
    return (num / den[..., None]).to(q.dtype)


def prefill_torch(q, k_new, v_new, k_cache, v_cache, block_table, context_len: int):
    """The T new tokens of one sequence (q [T, N, H]) attend causally to its context_len tokens:
    a cached prefix (read through block_table) followed by the new ones -> [T, N, H]."""
    T = q.shape[0]
    start = context_len - T                      # tokens already cached (prefix-cache hits)
    if start == 0:                               # nothing cached: the new k/v are the context
        out = sdpa(q.transpose(0, 1)[None], k_new.transpose(0, 1)[None],
                   v_new.transpose(0, 1)[None], is_causal=True)
        return out[0].transpose(0, 1)
    k = gather_kv(k_cache, block_table[None], context_len)[0].transpose(0, 1)       # [K, S, H]
    v = gather_kv(v_cache, block_table[None], context_len)[0].transpose(0, 1)
    q_pos = torch.arange(start, context_len, device=q.device)
    mask = torch.arange(context_len, device=q.device)[None, :] <= q_pos[:, None]     # [T, S]
    out = sdpa(q.transpose(0, 1)[None], k[None], v[None], attn_mask=mask)
    return out[0].transpose(0, 1)


def _kernels(backend: str, device):
    """(write_kv, paged_attention_decode) of the chosen backend. On a GPU the kernels skip the
    checks that read tensor values (a sync each): the runner builds the metadata itself."""
    import functools
    if backend == "torch":          # the slot writes are the kernels' reference (one definition)
        return functools.partial(write_kv_ref, validate=False), None
    if backend == "reference":
        from kernels import paged_attention_ref as mod
    else:
        from kernels import paged_attention as mod
    validate = torch.device(device).type != "cuda"
    decode = mod.paged_attention_decode_split if backend == "triton-split" \
        else mod.paged_attention_decode
    return (functools.partial(mod.write_kv, validate=validate),
            functools.partial(decode, validate=validate))


def resolve_backend(backend: str, device) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"unknown attention backend {backend!r}: use one of {BACKENDS}")
    on_cuda = torch.device(device).type == "cuda"
    if backend == "auto":
        return "triton" if on_cuda else "torch"
    if backend.startswith("triton") and not on_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(f"the {backend} backend needs the KV cache on a CUDA device (or Triton's "
                         f"CPU interpreter, TRITON_INTERPRET=1, for tests); use backend='torch' "
                         f"or 'reference' on the CPU")
    return backend


# ---- per-step metadata ------------------------------------------------------------------------
@dataclass
class DecodeMetadata:
    """The decoding sequences of a step (one new token each), gathered for one batched decode."""
    rows: torch.Tensor               # int64 [D]: their query rows in the flattened batch
    block_tables: torch.Tensor       # int32 [D, max blocks]: their block tables
    context_lens: torch.Tensor       # int32 [D]: their tokens after this step
    slots: torch.Tensor | None       # int64 [sum of context_lens]: every cached slot, in order
    seq_index: torch.Tensor | None   # int64 [sum of context_lens]: which sequence a slot is of
    # slots / seq_index: only for the torch backend's ragged decode (one gather per layer)


@dataclass
class AttentionMetadata:
    """Where each scheduled sequence's tokens sit in the flattened batch and in the cache."""
    query_starts: list[int]          # first row of sequence i in the flattened batch
    query_lens: list[int]            # its new tokens this step
    context_lens: list[int]          # its tokens after this step (cached + new)
    slot_mapping: torch.Tensor       # int64 [sum of query_lens]
    block_tables: torch.Tensor       # int32 [num seqs, max blocks] (unused entries: 0)
    decode_seqs: list[int]           # sequences with one new token: batched paged decode
    prefill_seqs: list[int]          # the others: per-sequence causal attention
    decode: DecodeMetadata | None = None     # the decode_seqs' rows, tables and lengths

    @classmethod
    def build(cls, query_lens, context_lens, slot_mapping, block_tables, block_size: int,
              device="cpu", ragged_decode: bool = True):
        starts, acc = [], 0
        for n in query_lens:
            starts.append(acc)
            acc += n
        width = max(len(t) for t in block_tables)
        tables = torch.zeros(len(block_tables), width, dtype=torch.int32)
        for i, t in enumerate(block_tables):
            tables[i, :len(t)] = torch.tensor(t, dtype=torch.int32)
        tables = tables.to(device)
        dec = [i for i, n in enumerate(query_lens) if n == 1]
        decode = None
        if dec:
            dec_tables = tables[dec]
            ctx = torch.tensor([context_lens[i] for i in dec], dtype=torch.int32, device=device)
            slots = seq_index = None
            if ragged_decode:              # the torch backend's one gather per layer
                lens = ctx.long()
                slots = context_slots(dec_tables, lens, block_size)
                seq_index = torch.repeat_interleave(torch.arange(len(dec), device=device), lens)
            decode = DecodeMetadata(
                rows=torch.tensor([starts[i] for i in dec], dtype=torch.long, device=device),
                block_tables=dec_tables, context_lens=ctx, slots=slots, seq_index=seq_index)
        return cls(starts, list(query_lens), list(context_lens),
                   torch.tensor(slot_mapping, dtype=torch.int64, device=device), tables,
                   dec, [i for i, n in enumerate(query_lens) if n > 1], decode)


# ---- the cache the model calls ----------------------------------------------------------------
class PagedKVCache:
    def __init__(self, n_layers: int, num_blocks: int, block_size: int, n_kv_heads: int,
                 head_dim: int, dtype=torch.float32, device="cpu", backend: str = "auto"):
        self.backend = resolve_backend(backend, device)
        self.num_blocks, self.block_size = num_blocks, block_size
        shape = (num_blocks, block_size, n_kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.meta: AttentionMetadata | None = None
        self._write_kv, self._decode = _kernels(self.backend, device)

    @classmethod
    def for_model(cls, model, num_blocks: int, block_size: int, backend: str = "auto"):
        c, p = model.config, next(model.parameters())
        for layer in model.layers:
            spec = layer.self_attn.kv_spec()
            if spec is None or spec.window is not None or spec.k_dim != c.head_dim \
                    or spec.heads != c.n_kv_heads:
                raise ValueError("the paged KV cache serves plain full-attention layers, not "
                                 "sliding-window or latent ones "
                                 "(MHA/GQA/MQA); this model has a layer it cannot store "
                                 f"({type(layer.self_attn).__name__}, spec {spec})")
        return cls(c.n_layers, num_blocks, block_size, c.n_kv_heads, c.head_dim, p.dtype,
                   p.device, backend)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    def copy_blocks(self, copies) -> None:
        """Copy-on-write: block dst becomes a copy of block src, in every layer."""
        if not copies:
            return
        src = torch.tensor([s for s, _ in copies], device=self.k[0].device)
        dst = torch.tensor([d for _, d in copies], device=self.k[0].device)
        for k, v in zip(self.k, self.v):
            k[dst] = k[src]
            v[dst] = v[src]

    def attention(self, layer: int, q, k, v, positions, window):
        """q [1, N, T, H], k/v [1, K, T, H] for the T flattened tokens -> out [1, N, T, H]."""
        if window is not None:
            raise ValueError("the paged KV cache does not serve sliding-window layers")
        m = self.meta
        if m is None or q.shape[0] != 1 or q.shape[2] != m.slot_mapping.shape[0]:
            raise ValueError("PagedKVCache.attention needs the step's metadata (set .meta) and "
                             "a flattened batch [1, sum of lengths]")
        q, k, v = q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1)  # [T, *, H]
        kc, vc = self.k[layer], self.v[layer]
        self._write_kv(k.contiguous(), v.contiguous(), kc, vc, m.slot_mapping)
        out = torch.empty_like(q)
        d = m.decode
        if d is not None:
            qd = q[d.rows]
            if self._decode is None:
                od = decode_torch(qd, kc, vc, d.slots, d.seq_index)
            else:
                od = self._decode(qd.contiguous(), kc, vc, d.block_tables, d.context_lens)
            out[d.rows] = od
        for i in m.prefill_seqs:
            a, n = m.query_starts[i], m.query_lens[i]
            out[a:a + n] = prefill_torch(q[a:a + n], k[a:a + n], v[a:a + n], kc, vc,
                                         m.block_tables[i], m.context_lens[i])
        return out.transpose(0, 1)[None]


# ---- selective batching without a KV cache (lab 06) -------------------------------------------
def ragged_causal_attention(q, k, v, lens) -> torch.Tensor:
    """Several sequences laid end to end in one row: q [1, N, sum(lens), H], k/v [1, K, ...].
    Each sequence attends causally to its own tokens only -> [1, N, sum(lens), H]."""
    if sum(lens) != q.shape[2]:
        raise ValueError(f"lens add up to {sum(lens)} tokens but the batch has {q.shape[2]}")
    out, a = torch.empty_like(q), 0
    for n in lens:
        out[:, :, a:a + n] = sdpa(q[:, :, a:a + n], k[:, :, a:a + n], v[:, :, a:a + n],
                                  is_causal=True)
        a += n
    return out


class RaggedPrefill:
    """Plugs into the model's cache hook so `model(ids [1, sum], positions, cache=...)` runs
    several whole prompts flattened: dense layers on all tokens at once, attention per prompt."""

    def __init__(self, lens):
        self.lens = [int(n) for n in lens]

    def attention(self, layer, q, k, v, positions, window):
        if window is not None:
            raise ValueError("RaggedPrefill does not serve sliding-window layers")
        return ragged_causal_attention(q, k, v, self.lens)
