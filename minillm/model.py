"""A Llama-family decoder in one readable file.

    ids [B, T] -> embed -> L x Block(RMSNorm -> attention -> +, RMSNorm -> SwiGLU MLP -> +)
               -> RMSNorm -> lm_head -> logits [B, T, V]

Every lab uses this one class. Later labs change *how keys and values are stored* by passing a
``cache`` object into ``forward``; the model never forks. A cache only has to provide

    cache.update(layer_idx, k, v, positions) -> (k_all, v_all, key_positions)

where ``k``/``v`` are the new keys/values [B, K, T, H] at ``positions`` and the return values are
every key/value the layer may attend to, with the position of each key. The attention mask is
derived from positions alone: query at position p sees keys at positions <= p.
A cache that also has ``attention(layer_idx, q, k, v, positions, window) -> out [B, N, T, H]``
stores the new keys/values and attends by itself instead (the serving engine's paged cache, whose
"batch" is many sequences of different lengths flattened into one row; minillm/serving).

Module and parameter names follow Hugging Face's Llama layout (``embed_tokens``, ``self_attn.q_proj``,
``mlp.gate_proj`` ...) so real checkpoints load with a one-line key mapping (see weights.py).
"""
from __future__ import annotations

import math
from typing import Protocol, runtime_checkable

import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import ModelConfig


# ---- the two kinds of cache a forward pass takes ----------------------------------------------
@runtime_checkable
class KVStore(Protocol):
    """A cache the attention layers write to and read from: `update` stores the new keys and
    values of a layer and returns everything cached (with their positions); after the last layer
    the model calls `advance` once (minillm.kvcache.KVCache, the labs' caches)."""

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor, positions): ...

    def advance(self, positions) -> None: ...


@runtime_checkable
class AttentionCache(Protocol):
    """A cache that stores the keys and values AND runs the attention itself, for batches the
    model cannot mask alone (serving: paged KV over ragged batches, padded static batches)."""

    def attention(self, layer: int, q, k, v, positions, window) -> torch.Tensor: ...


_kinds: dict = {}      # (type of cache, protocol) -> bool: one isinstance check per class


def cache_is(cache, protocol) -> bool:
    """isinstance(cache, protocol), remembered per class (Protocol checks are slow per call)."""
    key = (type(cache), protocol)
    kind = _kinds.get(key)
    if kind is None:
        kind = _kinds[key] = isinstance(cache, protocol)
    return kind


def require_softmax_decoder(model, what: str) -> None:
    """Refuse lab 09's hybrid (linear-attention layers) and diffusion (bidirectional) models in
    code written for a causal decoder with softmax attention in every layer, which would
    otherwise run them as if they were one and return wrong numbers. `model`: a model, or its
    ModelConfig (to refuse before any weights load)."""
    c = getattr(model, "config", model)
    if c.mixers is not None or not c.causal:
        kind = "a hybrid with linear-attention layers" if c.mixers is not None else \
            "a bidirectional (masked-diffusion) model"
        raise ValueError(f"{what} runs causal decoders with softmax attention in every layer; "
                         f"this is {kind} (lab 09): use its forward pass, minillm.generate or "
                         f"minillm.diffusion instead")


class RMSNorm(nn.Module):
    """x / rms(x) * weight, computed in fp32 (as Llama does) and cast back."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # = x * rsqrt(mean(x^2) + eps), as one fused op (torch >= 2.4)
        normed = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
        return self.weight * normed.to(x.dtype)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """Rotary angles for each position: cos/sin of shape [..., T, head_dim].

    Pair i of the head dimension rotates by angle position * theta^(-2i / head_dim).
    """
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device,
                                             dtype=torch.float32) / head_dim))
    angles = positions.to(torch.float32)[..., None] * inv_freq      # [..., T, H/2]
    angles = torch.cat([angles, angles], dim=-1)                      # [..., T, H]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [B, heads, T, H] by the angles; halves layout (x1, x2) -> (x1 c - x2 s, x2 c + x1 s)."""
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return x * cos + rotated * sin


def causal_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None = None):
    """Boolean mask [..., T, S]: True where the query may attend to the key."""
    mask = k_pos[..., None, :] <= q_pos[..., :, None]
    if window is not None:
        mask = mask & (k_pos[..., None, :] > q_pos[..., :, None] - window)
    return mask


class Attention(nn.Module):
    """Multi-head attention with n_kv_heads key/value heads: MHA (K=N), GQA (1<K<N), MQA (K=1)."""

    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__()
        c = config
        self.layer_idx = layer_idx
        self.n_heads, self.n_kv_heads, self.head_dim = c.n_heads, c.n_kv_heads, c.head_dim
        self.rope_theta = c.rope_theta
        self.window: int | None = None       # a sliding-window layer sets this (lab 03)
        self.causal = c.causal               # False: every token sees every token (lab 09)
        self.q_proj = nn.Linear(c.dim, c.n_heads * c.head_dim, bias=c.qkv_bias)
        self.k_proj = nn.Linear(c.dim, c.n_kv_heads * c.head_dim, bias=c.qkv_bias)
        self.v_proj = nn.Linear(c.dim, c.n_kv_heads * c.head_dim, bias=c.qkv_bias)
        self.o_proj = nn.Linear(c.n_heads * c.head_dim, c.dim, bias=c.o_bias)

    def kv_spec(self):
        """What a cache must hold per token for this layer (see kvcache.KVSpec)."""
        from .kvcache import KVSpec
        return KVSpec(self.n_kv_heads, self.head_dim, self.head_dim, self.window)

    def forward(self, x, cos, sin, positions, cache=None):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)      # [B, heads, T, H]

        if not self.causal:
            if cache is not None:
                raise ValueError("a bidirectional model has no KV cache: every token changes "
                                 "every other token's keys, so each pass recomputes them")
            out = sdpa(q, k, v)
        elif cache is not None and cache_is(cache, AttentionCache):
            # the cache stores k/v AND attends itself (serving: paged KV, ragged batches)
            out = cache.attention(self.layer_idx, q, k, v, positions, self.window)
        else:
            if cache is not None:
                k, v, k_pos = cache.update(self.layer_idx, k, v, positions)
            else:
                k_pos = positions           # None: plain causal prefill
            out = attend(q, k, v, positions, k_pos, self.window)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))


def sdpa(q, k, v, attn_mask=None, is_causal=False):
    """scaled_dot_product_attention where a KV head may serve a group of query heads (GQA).

    torch >= 2.5 reads each KV head in place (enable_gqa); older torch gets copies of the KV
    heads (query head h reads KV head h // n_rep)."""
    n_rep = q.shape[1] // k.shape[1]
    if n_rep == 1:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)
    if _HAS_ENABLE_GQA:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal,
                                              enable_gqa=True)
    k, v = k.repeat_interleave(n_rep, dim=1), v.repeat_interleave(n_rep, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)


_HAS_ENABLE_GQA = "enable_gqa" in (F.scaled_dot_product_attention.__doc__ or "")


def attend(q, k, v, q_pos, k_pos, window: int | None = None):
    """softmax(q k^T / sqrt(H) + mask) v, with each KV head shared by a group of query heads.

    q_pos None means "plain causal prefill from position 0" (no cache): the fast is_causal path.
    A single query token without a window (a decode step) sees every key a cache returns -- a
    cache only returns keys at or before the newest position -- so it needs no mask either.
    """
    if q_pos is None and window is None:
        return sdpa(q, k, v, is_causal=True)
    if window is None and q.shape[-2] == 1:
        return sdpa(q, k, v)
    if q_pos is None:
        q_pos = k_pos = torch.arange(q.shape[-2], device=q.device)
    mask = causal_mask(q_pos, k_pos, window)
    if mask.dim() == 3:          # per-sequence positions [B, T, S] -> [B, 1, T, S]
        mask = mask[:, None]
    return sdpa(q, k, v, attn_mask=mask)


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        c = config
        self.gate_proj = nn.Linear(c.dim, c.hidden_dim, bias=c.mlp_bias)
        self.up_proj = nn.Linear(c.dim, c.hidden_dim, bias=c.mlp_bias)
        self.down_proj = nn.Linear(c.hidden_dim, c.dim, bias=c.mlp_bias)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__()
        self.input_layernorm = RMSNorm(config.dim, config.norm_eps)
        if config.mixers is None or config.mixers[layer_idx] == "attention":
            self.self_attn = Attention(config, layer_idx)
        else:                                 # lab 09: a fixed-size state instead of a KV cache
            from .linear_attention import LinearAttention
            self.self_attn = LinearAttention(config, layer_idx)
        self.post_attention_layernorm = RMSNorm(config.dim, config.norm_eps)
        self.mlp = MLP(config)

    def forward(self, x, cos, sin, positions, cache=None):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, positions, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class Transformer(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.dim)
        self.layers = nn.ModuleList(Block(config, i) for i in range(config.n_layers))
        self.norm = RMSNorm(config.dim, config.norm_eps)
        self.lm_head = nn.Linear(config.dim, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.apply(self._init_weights)
        for name, p in self.named_parameters():   # GPT-2 style: shrink residual-branch outputs
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layers))

    @staticmethod
    def _init_weights(m):
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())   # tied weights are counted once

    def forward(self, ids: torch.Tensor, positions: torch.Tensor | None = None, cache=None,
                last_only: bool = False, rows: torch.Tensor | None = None) -> torch.Tensor:
        """ids [B, T] -> logits [B, T, V] (or [B, 1, V] with last_only, [B, len(rows), V] with
        rows: the LM head runs only on those positions along T).

        positions: [T] or [B, T] absolute positions of the ids; default 0..T-1, or, with a cache
        that tracks its length (``cache.seq_len``), the positions right after what it holds.
        """
        if last_only and rows is not None:
            raise ValueError("give last_only or rows, not both")
        if ids.dim() != 2:
            raise ValueError(f"ids must have shape [batch, seq_len], got {tuple(ids.shape)}")
        B, T = ids.shape
        if T == 0:
            raise ValueError("ids is empty: need at least one token")
        plain_causal = positions is None and cache is None   # lets attention skip the mask
        if positions is None:
            start = int(getattr(cache, "seq_len", 0)) if cache is not None else 0
            positions = torch.arange(start, start + T, device=ids.device)
        if positions.shape[-1] != T or positions.dim() > 2:
            raise ValueError(f"positions shape {tuple(positions.shape)} does not match ids "
                             f"{tuple(ids.shape)}")
        h = self.embed_tokens(ids)
        cos, sin = rope_cos_sin(positions, self.config.head_dim, self.config.rope_theta, h.dtype)
        if positions.dim() == 2:             # per-sequence positions: [B, 1, T, H] for the heads
            cos, sin = cos[:, None], sin[:, None]
        mask_positions = None if plain_causal else positions
        for layer in self.layers:
            h = layer(h, cos, sin, mask_positions, cache)
        if cache is not None and cache_is(cache, KVStore):
            cache.advance(positions)
        h = self.norm(h)
        if last_only:
            h = h[:, -1:]
        elif rows is not None:
            h = h[:, rows]
        return self.lm_head(h)
