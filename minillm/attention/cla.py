"""Cross-layer attention (CLA): adjacent layers share one set of keys and values.

GQA shares a key/value head across query heads *within* a layer; CLA (Brandon et al. 2024,
"Reducing Transformer Key-Value Cache Size with Cross-Layer Attention", arXiv 2405.12981) shares
keys and values *across* layers. Layers are cut into groups of `share` consecutive layers:

    producer   the group's first layer: normal q/k/v/o projections, writes K/V to the cache
    consumers  the other layers: only q/o projections; they attend with their own queries to
               the producer's keys and values

With share = 2 (CLA2) the cache halves, on top of whatever GQA/MQA already saves (the paper pairs
CLA with MQA and trains from scratch; character.ai combines it with local/global layers). A
consumer reports `kv_spec() is None`, so `KVCache` allocates nothing for it.

How the keys travel: the producer and its consumers hold the same small `SharedKV` object. The
producer publishes what it attends to -- (k_all, v_all, key_positions), from the cache when there
is one, else its fresh keys -- and the consumers, which run later in the same forward pass, read
it. The model's forward loop needs no change.

`to_cla` converts a trained model without training; consumers lose the keys/values their own
projections made, so expect a large perplexity cost that training (as in the paper) would recover.
"""
from __future__ import annotations

import copy

import torch
import torch.nn as nn

from ..model import Attention, apply_rope, attend


class SharedKV:
    """The keys/values a producer layer attended to in the current forward pass."""

    def __init__(self):
        self.k = self.v = self.positions = None
        self.ready = False

    def publish(self, k, v, positions) -> None:
        self.k, self.v, self.positions, self.ready = k, v, positions, True

    def read(self, layer_idx: int):
        if not self.ready:
            raise ValueError(f"cross-layer attention layer {layer_idx} ran before its producer "
                             f"published keys and values")
        return self.k, self.v, self.positions

    def __deepcopy__(self, memo):          # a copied model starts with nothing published
        return SharedKV()


class KVProducerAttention(Attention):
    """Standard attention that also publishes its keys/values for the consumer layers."""

    def __init__(self, config, layer_idx: int, shared: SharedKV):
        super().__init__(config, layer_idx)
        self.shared = shared

    def forward(self, x, cos, sin, positions, cache=None):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if cache is not None:
            k, v, k_pos = cache.update(self.layer_idx, k, v, positions)
        else:
            k_pos = positions
        self.shared.publish(k, v, k_pos)
        out = attend(q, k, v, positions, k_pos, self.window)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))


class CrossLayerAttention(nn.Module):
    """A consumer layer: its own queries, the producer's keys and values, no cache storage."""

    def __init__(self, config, layer_idx: int, shared: SharedKV):
        super().__init__()
        c = config
        self.layer_idx = layer_idx
        self.window: int | None = None
        self.n_heads, self.head_dim = c.n_heads, c.head_dim
        self.shared = shared
        self.q_proj = nn.Linear(c.dim, c.n_heads * c.head_dim, bias=c.qkv_bias)
        self.o_proj = nn.Linear(c.n_heads * c.head_dim, c.dim, bias=c.o_bias)

    def kv_spec(self):
        return None          # borrows the producer's keys/values: nothing to cache

    def forward(self, x, cos, sin, positions, cache=None):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        q = apply_rope(q, cos, sin)
        k, v, k_pos = self.shared.read(self.layer_idx)
        out = attend(q, k, v, positions, k_pos, self.window)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))


CLA_INITS = ("own", "mean")
# Measured on the shipped model (8192 held-out tokens, MHA ppl 49.5): share 2 -> ppl 70 with "own",
# 94 with "mean"; share 3 -> 104 vs 137. A layer's own keys suit its own queries best.
DEFAULT_INIT = "own"


def to_cla(model, share: int = 2, init: str = DEFAULT_INIT):
    """A new model where each group of `share` consecutive layers shares the first one's K/V.

    init: "own"  the producer keeps its own k/v projections;
          "mean" the producer's k/v projections are the mean of the group's (so the shared keys
                 are a compromise between what every layer of the group used to see).
    The input model is not modified. A last group shorter than `share` is fine.
    """
    if not isinstance(share, int) or isinstance(share, bool) or share < 1:
        raise ValueError(f"share must be a positive integer (layers per group), got {share!r}")
    if init not in CLA_INITS:
        raise ValueError(f"init must be one of {CLA_INITS}, got {init!r}")
    cfg = model.config
    for i, layer in enumerate(model.layers):
        if type(layer.self_attn) is not Attention:
            raise ValueError(f"to_cla converts standard Attention layers; layer {i} is "
                             f"{type(layer.self_attn).__name__}")
    n = len(model.layers)
    groups = [list(range(s, min(s + share, n))) for s in range(0, n, share)]
    for g in groups:
        windows = {model.layers[i].self_attn.window for i in g}
        if len(windows) > 1:
            raise ValueError(f"layers {g} share keys/values but have different windows "
                             f"{sorted(windows, key=str)}; give every layer of a group the "
                             f"same window")
    new = copy.deepcopy(model)
    for g in groups:
        old = [new.layers[i].self_attn for i in g]
        ref = old[0].q_proj.weight
        shared = SharedKV()
        producer = KVProducerAttention(cfg, g[0], shared).to(ref.device, ref.dtype)
        producer.load_state_dict(old[0].state_dict())
        if init == "mean":
            with torch.no_grad():
                for name in ("k_proj", "v_proj"):
                    for p in ("weight", "bias"):
                        if getattr(getattr(producer, name), p) is None:
                            continue
                        mean = torch.stack([getattr(getattr(a, name), p) for a in old]).mean(0)
                        getattr(getattr(producer, name), p).copy_(mean)
        producer.window = old[0].window
        new.layers[g[0]].self_attn = producer
        for i, a in zip(g[1:], old[1:]):
            consumer = CrossLayerAttention(cfg, i, shared).to(ref.device, ref.dtype)
            consumer.q_proj.load_state_dict(a.q_proj.state_dict())
            consumer.o_proj.load_state_dict(a.o_proj.state_dict())
            consumer.window = a.window
            new.layers[i].self_attn = consumer
    return new
