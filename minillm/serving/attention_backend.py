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

Backends (`backend=`) for the slot writes and the decode half: "torch" (the kernels' plain-torch
reference, kernels/paged_attention_ref.py: the CPU default), "triton" (kernels/paged_attention.py,
the default on CUDA) and "triton-split" (its flash-decoding variant). There is one torch paged
decode, the reference; the engine calls it rather than keeping a second one. Prefills always
use the torch path here (gather + scaled_dot_product_attention).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from kernels.paged_attention_ref import gather_kv

from ..model import sdpa

BACKENDS = ("auto", "torch", "triton", "triton-split")


# ---- prefills (decodes go through the kernels' functions: _kernels) ---------------------------
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
    """(write_kv, paged_attention_decode) of the chosen backend: the kernels' plain-torch
    reference ("torch") or the Triton kernels. On a GPU they skip the checks that read tensor
    values (a sync each): the runner builds the metadata itself."""
    import functools
    if backend == "torch":
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
                         f"CPU interpreter, TRITON_INTERPRET=1, for tests); use backend='torch' on the "
                         f"CPU")
    return backend


# ---- per-step metadata ------------------------------------------------------------------------
@dataclass
class DecodeMetadata:
    """The decoding sequences of a step (one new token each), gathered for one batched decode."""
    rows: torch.Tensor               # int64 [D]: their query rows in the flattened batch
    block_tables: torch.Tensor       # int32 [D, max blocks]: their block tables
    context_lens: torch.Tensor       # int32 [D]: their tokens after this step


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
    def build(cls, query_lens, context_lens, slot_mapping, block_tables, device="cpu"):
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
            decode = DecodeMetadata(
                rows=torch.tensor([starts[i] for i in dec], dtype=torch.long, device=device),
                block_tables=tables[dec],
                context_lens=torch.tensor([context_lens[i] for i in dec], dtype=torch.int32,
                                          device=device))
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
            out[d.rows] = self._decode(q[d.rows].contiguous(), kc, vc, d.block_tables,
                                       d.context_lens)
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
