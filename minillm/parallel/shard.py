"""Tensor parallelism (Megatron-style): one model split over W ranks, two all-reduces per layer.

A decoder layer is two blocks, attention and the MLP, and each is a pair of matmuls whose first
half is split by output columns and whose second half by input rows:

    attention:  q, k, v = x Wq, x Wk, x Wv    column-parallel: rank r computes ITS heads only
                out     = attn(q, k, v) Wo    row-parallel: rank r multiplies its heads' slice
                                              of Wo -> a partial sum [B, T, D]; all-reduce adds them
    MLP:        g, u    = x Wgate, x Wup      column-parallel: rank r computes F/W of the columns
                out     = (silu(g) u) Wdown   row-parallel -> partial sums; all-reduce

Nothing is communicated between the two halves: a head's attention needs only that head's q, k
and v, and silu(g) * u is elementwise. So each block costs one all-reduce of B*T*D values, and a
layer two (the lecture's napkin, `minillm.roofline.tensor_parallel_napkin`). The KV cache is
split with the heads: rank r stores only its KV heads. With GQA, rank r's query heads share the
KV heads they read; when there are fewer KV heads than ranks (W a multiple of K), each rank keeps
the one KV head its query heads read, and W/K ranks hold copies of it.

What stays whole on every rank: the embedding, the norms and the LM head (replicated: the
vocabulary-parallel head of large engines would add a gather per step).

`shard(model, rank, world)` returns rank r's model: an ordinary `Transformer` of the per-rank
shape (N/W heads, F/W MLP columns), holding its slices of the weights, whose o_proj and down_proj
are `RowParallelLinear`s. Every cache, the serving engine and the samplers work on it unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from ..config import ModelConfig
from ..model import Transformer, require_softmax_decoder
from .launch import explain


@dataclass(frozen=True)
class RankShard:
    """What rank `rank` of `world` holds: query heads [q0, q1), KV heads [k0, k1), MLP columns
    [f0, f1)."""
    rank: int
    world: int
    q0: int
    q1: int
    k0: int
    k1: int
    f0: int
    f1: int


def shard_plan(config: ModelConfig, world: int, rank: int) -> RankShard:
    """Rank `rank`'s share of the heads and MLP columns; a world size that cannot split the model
    evenly is refused (an uneven split would leave one rank the slowest every step)."""
    if not isinstance(world, int) or isinstance(world, bool) or world < 1:
        raise ValueError(f"the world size (--tp) must be a positive integer, got {world!r}")
    if not isinstance(rank, int) or not 0 <= rank < world:
        raise ValueError(f"rank must be in 0..{world - 1}, got {rank!r}")
    N, K, Fd = config.n_heads, config.n_kv_heads, config.hidden_dim
    if N % world:
        raise ValueError(f"tensor parallelism over {world} ranks needs the {N} query heads to "
                         f"divide evenly; use a world size that divides {N}")
    if K % world and world % K:
        raise ValueError(f"tensor parallelism over {world} ranks needs the {K} KV heads to "
                         f"divide evenly, or {world} to be a multiple of {K} (a KV head is "
                         f"never split)")
    if Fd % world:
        raise ValueError(f"tensor parallelism over {world} ranks needs the MLP width "
                         f"{Fd} to divide evenly")
    q = N // world
    if K % world == 0:
        k0, k1 = rank * (K // world), (rank + 1) * (K // world)
    else:                               # W > K: the one KV head this rank's query heads read
        k0 = (rank * q) // (N // K)
        k1 = k0 + 1
    f = Fd // world
    return RankShard(rank, world, rank * q, (rank + 1) * q, k0, k1, rank * f, (rank + 1) * f)


def local_config(config: ModelConfig, s: RankShard) -> ModelConfig:
    """The shape of one rank's model: its heads and MLP columns, the full model width."""
    return replace(config, n_heads=s.q1 - s.q0, n_kv_heads=s.k1 - s.k0,
                   hidden_dim=s.f1 - s.f0, head_dim=config.head_dim)


def all_reduce_sum(x: torch.Tensor, group=None) -> torch.Tensor:
    """Sum x over the ranks of the group, in place (a no-op on a single process)."""
    if dist.is_initialized() and dist.get_world_size(group) > 1:
        try:
            dist.all_reduce(x, op=dist.ReduceOp.SUM, group=group)
        except RuntimeError as e:        # a peer died or hung: say so in one sentence
            raise explain(e) from e
    return x


class ColumnParallelLinear(nn.Linear):
    """Rows [start, stop) of a full linear layer's weight (its output features): x -> x W_r^T.
    No communication; the output is this rank's slice of the full output."""

    @classmethod
    def from_full(cls, full: nn.Linear, start: int, stop: int) -> "ColumnParallelLinear":
        layer = cls(full.in_features, stop - start, bias=full.bias is not None,
                    device=full.weight.device, dtype=full.weight.dtype)
        with torch.no_grad():
            layer.weight.copy_(full.weight[start:stop])
            if full.bias is not None:
                layer.bias.copy_(full.bias[start:stop])
        return layer


class RowParallelLinear(nn.Linear):
    """Columns [start, stop) of a full linear layer's weight (its input features): each rank
    multiplies its slice of the input and the all-reduce sums the partial outputs. The bias is
    added once, after the sum."""

    group = None                      # the process group (None: the default one)

    @classmethod
    def from_full(cls, full: nn.Linear, start: int, stop: int, group=None) -> "RowParallelLinear":
        layer = cls(stop - start, full.out_features, bias=full.bias is not None,
                    device=full.weight.device, dtype=full.weight.dtype)
        layer.group = group
        with torch.no_grad():
            layer.weight.copy_(full.weight[:, start:stop])
            if full.bias is not None:
                layer.bias.copy_(full.bias)
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = all_reduce_sum(F.linear(x, self.weight), self.group)
        return out if self.bias is None else out + self.bias


@torch.no_grad()
def shard(model: Transformer, rank: int, world: int, group=None) -> Transformer:
    """Rank `rank`'s part of `model` for a world of `world` ranks (see the module docstring);
    world 1 returns a plain copy of the shape. `model` is left unchanged."""
    require_softmax_decoder(model, "tensor parallelism")
    c = model.config
    s = shard_plan(c, world, rank)
    H = c.head_dim
    p = next(model.parameters())
    with torch.device("meta"):
        local = Transformer(local_config(c, s))
    local = local.to_empty(device=p.device).to(p.dtype)
    local.embed_tokens.weight.copy_(model.embed_tokens.weight)
    local.norm.weight.copy_(model.norm.weight)
    if c.tie_embeddings:
        local.lm_head.weight = local.embed_tokens.weight
    else:
        local.lm_head.weight.copy_(model.lm_head.weight)
    for mine, full in zip(local.layers, model.layers):
        mine.input_layernorm.weight.copy_(full.input_layernorm.weight)
        mine.post_attention_layernorm.weight.copy_(full.post_attention_layernorm.weight)
        a, fa = mine.self_attn, full.self_attn
        a.window = fa.window
        a.q_proj = ColumnParallelLinear.from_full(fa.q_proj, s.q0 * H, s.q1 * H)
        a.k_proj = ColumnParallelLinear.from_full(fa.k_proj, s.k0 * H, s.k1 * H)
        a.v_proj = ColumnParallelLinear.from_full(fa.v_proj, s.k0 * H, s.k1 * H)
        a.o_proj = RowParallelLinear.from_full(fa.o_proj, s.q0 * H, s.q1 * H, group)
        m, fm = mine.mlp, full.mlp
        m.gate_proj = ColumnParallelLinear.from_full(fm.gate_proj, s.f0, s.f1)
        m.up_proj = ColumnParallelLinear.from_full(fm.up_proj, s.f0, s.f1)
        m.down_proj = RowParallelLinear.from_full(fm.down_proj, s.f0, s.f1, group)
    local.tp_shard = s
    return local.eval()


def shard_bytes(model: Transformer) -> int:
    """Bytes of weights one rank reads per step (tied embeddings counted once)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())
