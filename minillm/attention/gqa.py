"""Grouped-query attention (GQA): fewer key/value heads than query heads.

Multi-head attention (MHA) gives each of the N query heads its own key head and value head, so
the cache holds 2 * N * H values per token per layer. GQA keeps the N query heads but only K
key/value heads; each KV head serves a *group* of G = N / K consecutive query heads (query head h
reads KV head h // G). The cache shrinks by N / K:

    MHA  K = N          2 * N * H values per token per layer
    GQA  1 < K < N      2 * K * H
    MQA  K = 1          2 * H            (multi-query attention, Shazeer 2019)

Compute barely changes -- the query projection and the attention scores are the same size -- but
a decode step reads K/N as many cache bytes, and decode is memory-bound (lab 02), so it runs
faster and fits bigger batches.

Converting a trained MHA checkpoint (Ainslie et al. 2023, "GQA: Training Generalized Multi-Query
Transformer Models from Multi-Head Checkpoints", arXiv 2305.13245): build each new KV head by
*mean-pooling* the key (and value) projection rows of the heads in its group, then "uptrain" for
a few percent of the original training compute. The paper found mean pooling better than keeping
one head of the group or starting from random. We only do the pooling (no uptraining), so the
smaller K, the larger the quality drop: on the shipped model (6 heads, 8192 held-out tokens)
perplexity goes from 49.5 (K=6) to 85 (K=3), 119 (K=2) and 144 (MQA).

Nothing else in the stack changes: `minillm.model.Attention` already handles n_kv_heads < n_heads
and `KVCache` sizes itself from each layer's `kv_spec()`.
"""
from __future__ import annotations

import copy
import dataclasses

import torch
import torch.nn as nn

from ..model import Attention


def mean_pool_kv_heads(weight: torch.Tensor, n_kv_heads: int, new_kv_heads: int,
                       head_dim: int) -> torch.Tensor:
    """Average groups of consecutive heads: [n_kv_heads*H, ...] -> [new_kv_heads*H, ...].

    The rows of a k/v projection weight (or the entries of its 1-D bias) come in blocks of
    head_dim, one block per head. New head j is the mean of old heads j*g .. j*g+g-1 with
    g = n_kv_heads // new_kv_heads -- the same heads whose query heads it will serve.
    """
    for name, val in (("n_kv_heads", n_kv_heads), ("new_kv_heads", new_kv_heads),
                      ("head_dim", head_dim)):
        if not isinstance(val, int) or isinstance(val, bool) or val < 1:
            raise ValueError(f"{name} must be a positive integer, got {val!r}")
    if n_kv_heads % new_kv_heads:
        raise ValueError(f"new_kv_heads={new_kv_heads} must divide n_kv_heads={n_kv_heads}: "
                         f"every new head averages a whole group of old heads")
    if weight.dim() not in (1, 2) or weight.shape[0] != n_kv_heads * head_dim:
        raise ValueError(f"weight must have n_kv_heads*head_dim = {n_kv_heads * head_dim} rows "
                         f"(a 2-D weight or a 1-D bias), got shape {tuple(weight.shape)}")
    group = n_kv_heads // new_kv_heads
    rest = weight.shape[1:]
    # [old heads, H, ...] -> [new heads, group, H, ...] -> mean over the group
    return weight.reshape(new_kv_heads, group, head_dim, *rest).mean(dim=1).reshape(
        new_kv_heads * head_dim, *rest)


def _pooled_linear(old: nn.Linear, n_kv_heads: int, new_kv_heads: int, head_dim: int):
    new = nn.Linear(old.in_features, new_kv_heads * head_dim, bias=old.bias is not None,
                    device=old.weight.device, dtype=old.weight.dtype)
    with torch.no_grad():
        new.weight.copy_(mean_pool_kv_heads(old.weight, n_kv_heads, new_kv_heads, head_dim))
        if old.bias is not None:
            new.bias.copy_(mean_pool_kv_heads(old.bias, n_kv_heads, new_kv_heads, head_dim))
    return new


def to_gqa(model, n_kv_heads: int):
    """A new model with `n_kv_heads` key/value heads, built by mean-pooling `model`'s KV heads.

    n_kv_heads = n_heads returns an exact copy (same logits); 1 gives multi-query attention.
    The input model is not modified.
    """
    cfg = model.config
    if not isinstance(n_kv_heads, int) or isinstance(n_kv_heads, bool) or n_kv_heads < 1:
        raise ValueError(f"n_kv_heads must be a positive integer, got {n_kv_heads!r}")
    if cfg.n_heads % n_kv_heads:
        raise ValueError(f"n_heads={cfg.n_heads} is not divisible by n_kv_heads={n_kv_heads}: "
                         f"each KV head must serve a whole group of query heads")
    if n_kv_heads > cfg.n_kv_heads or cfg.n_kv_heads % n_kv_heads:
        raise ValueError(f"cannot pool the model's {cfg.n_kv_heads} KV heads into {n_kv_heads}: "
                         f"the new count must divide the current one")
    for i, layer in enumerate(model.layers):
        if type(layer.self_attn) is not Attention:
            raise ValueError(f"to_gqa converts standard Attention layers; layer {i} is "
                             f"{type(layer.self_attn).__name__} (convert to GQA first)")
    new = copy.deepcopy(model)
    new.config = dataclasses.replace(cfg, n_kv_heads=n_kv_heads)
    for layer in new.layers:
        attn = layer.self_attn
        attn.k_proj = _pooled_linear(attn.k_proj, cfg.n_kv_heads, n_kv_heads, cfg.head_dim)
        attn.v_proj = _pooled_linear(attn.v_proj, cfg.n_kv_heads, n_kv_heads, cfg.head_dim)
        attn.n_kv_heads = n_kv_heads
    return new
