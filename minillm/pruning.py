"""Structured pruning: score the parts of a trained model by their activations, slice away the
weakest, and get a real, smaller model (a smaller `ModelConfig`, smaller weight tensors).

NVIDIA's Minitron recipe (Muralidharan et al. 2024, "Compact Language Models via Pruning and
Knowledge Distillation"; Sreenivas et al. 2024) in the shapes of this course's models:

* run the trained model on a small calibration set (the paper: 1,024 samples) and record
  activations -- no gradients, one forward pass per batch;
* **width**: score each attention head by the size of what it writes (the L2 norm of its output,
  before o_proj), each MLP neuron by the size of its activation (silu(gate) * up, the input of
  down_proj), each embedding channel by the size of the RMSNorm outputs in that channel;
* **depth**: score each layer by how much it changes the residual stream (block influence:
  1 - cos(x_in, x_out), Men et al. 2024 "ShortGPT") or by how much the loss rises when it is
  skipped (`layer_drop_loss`);
* keep the top-scoring parts (in their original order) and slice the weight tensors: rows of
  q/k/v/gate/up, columns of o_proj/down_proj for heads and neurons; the matching columns of every
  matrix that reads the residual stream, rows of every matrix that writes it, the embedding's
  columns and the norms' weights for channels.

Pruning alone loses accuracy -- an RMSNorm over fewer channels even changes its own scale -- and
distillation from the original model (minillm.distill) wins most of it back for a small fraction
of the tokens that training from scratch spends.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from .model import Transformer


@dataclass
class Importance:
    """Activation-based scores; higher = more important. heads [L, N], neurons [L, F],
    channels [D], layers [L] (block influence), tokens: how many calibration tokens."""
    heads: torch.Tensor
    neurons: torch.Tensor
    channels: torch.Tensor
    layers: torch.Tensor
    tokens: int


@dataclass
class Keep:
    """What survives pruning, as indices into the original model (each sorted ascending):
    layers; per kept layer, its heads and its MLP neurons; the embedding channels."""
    layers: list[int]
    heads: list[list[int]]
    neurons: list[list[int]]
    channels: list[int]


def calibration_batches(ids: torch.Tensor, n_samples: int, seq_len: int, batch_size: int = 8,
                        seed: int = 0) -> list[torch.Tensor]:
    """n_samples random windows of seq_len tokens from a 1-D token tensor, in batches [b, T]."""
    if ids.dim() != 1:
        raise ValueError(f"ids must be a 1-D token tensor, got shape {tuple(ids.shape)}")
    if n_samples < 1 or seq_len < 1 or batch_size < 1:
        raise ValueError(f"need n_samples, seq_len and batch_size >= 1, got {n_samples}, "
                         f"{seq_len}, {batch_size}")
    if len(ids) <= seq_len:
        raise ValueError(f"{len(ids)} tokens do not hold a window of {seq_len}")
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(ids) - seq_len, (n_samples,), generator=gen)
    windows = torch.stack([ids[s:s + seq_len] for s in starts.tolist()])
    return list(windows.split(batch_size))


@torch.no_grad()
def importance(model: Transformer, batches) -> Importance:
    """Score heads, neurons, channels and layers of `model` from its activations on `batches`
    (each [b, T] token ids): the mean over calibration tokens of each part's activation size."""
    c = model.config
    L, N, H, D = c.n_layers, c.n_heads, c.head_dim, c.dim
    heads, neurons = torch.zeros(L, N), torch.zeros(L, c.hidden_dim)
    channels, layers = torch.zeros(D), torch.zeros(L)
    hooks, count = [], [0]

    def on_o_proj(i):                 # input of o_proj: the heads' outputs, side by side
        def hook(mod, args):
            a = args[0].float()
            heads[i] += a.reshape(-1, N, H).norm(dim=-1).sum(0)
        return hook

    def on_down(i):                   # input of down_proj: silu(gate) * up, one value per neuron
        def hook(mod, args):
            neurons[i] += args[0].float().abs().reshape(-1, c.hidden_dim).sum(0)
        return hook

    def on_norm(mod, args, out):      # every RMSNorm output: what each channel carries
        channels.add_(out.float().abs().reshape(-1, D).sum(0))

    def on_block(i):                  # block influence: 1 - cos(residual in, residual out)
        def hook(mod, args, out):
            x = args[0].float()
            layers[i] += (1 - F.cosine_similarity(x, out.float(), dim=-1)).sum()
        return hook

    for i, layer in enumerate(model.layers):
        hooks += [layer.self_attn.o_proj.register_forward_pre_hook(on_o_proj(i)),
                  layer.mlp.down_proj.register_forward_pre_hook(on_down(i)),
                  layer.input_layernorm.register_forward_hook(on_norm),
                  layer.post_attention_layernorm.register_forward_hook(on_norm),
                  layer.register_forward_hook(on_block(i))]
    hooks.append(model.norm.register_forward_hook(on_norm))
    was_training = model.training
    model.eval()
    try:
        for ids in batches:
            model(ids)
            count[0] += ids.numel()
    finally:
        for h in hooks:
            h.remove()
        model.train(was_training)
    n = max(count[0], 1)
    return Importance(heads / n, neurons / n, channels / (n * (2 * L + 1)), layers / n,
                      count[0])


def skip_layers(model: Transformer, drop: set[int]) -> Transformer:
    """A view of `model` without the layers in `drop` (shares the weights; for scoring)."""
    small = Transformer.__new__(Transformer)
    torch.nn.Module.__init__(small)
    small.config = replace(model.config, n_layers=model.config.n_layers - len(drop))
    small.embed_tokens, small.norm, small.lm_head = model.embed_tokens, model.norm, model.lm_head
    small.layers = torch.nn.ModuleList(l for i, l in enumerate(model.layers) if i not in drop)
    return small.eval()


@torch.no_grad()
def lm_loss(model: Transformer, batches) -> float:
    """Mean next-token cross-entropy (nats/token) over the batches."""
    total, count = 0.0, 0
    for ids in batches:
        logits = model(ids[:, :-1]).float()
        total += F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten(),
                                 reduction="sum").item()
        count += ids[:, 1:].numel()
    return total / count


@torch.no_grad()
def layer_drop_loss(model: Transformer, batches) -> torch.Tensor:
    """Depth importance by cost: the loss with layer i skipped minus the full model's loss [L]."""
    base = lm_loss(model, batches)
    return torch.tensor([lm_loss(skip_layers(model, {i}), batches) - base
                         for i in range(model.config.n_layers)])


def top(scores: torch.Tensor, k: int) -> list[int]:
    """Indices of the k highest scores, in ascending index order (ties: the lower index)."""
    if not 1 <= k <= len(scores):
        raise ValueError(f"cannot keep {k} of {len(scores)}")
    order = sorted(range(len(scores)), key=lambda i: (-float(scores[i]), i))
    return sorted(order[:k])


def choose(imp: Importance, n_layers: int | None = None, n_heads: int | None = None,
           hidden_dim: int | None = None, dim: int | None = None,
           layer_scores: torch.Tensor | None = None) -> Keep:
    """Keep the top n_layers layers (by `layer_scores`, default block influence), in each kept
    layer its top n_heads heads and hidden_dim neurons, and the top dim channels (None: all)."""
    L, N = imp.heads.shape
    F_, D = imp.neurons.shape[1], imp.channels.shape[0]
    scores = imp.layers if layer_scores is None else layer_scores
    layers = top(scores, n_layers or L)
    return Keep(layers, [top(imp.heads[i], n_heads or N) for i in layers],
                [top(imp.neurons[i], hidden_dim or F_) for i in layers],
                top(imp.channels, dim or D))


def kept_params(config, keep: Keep) -> int:
    """Parameters of the model `prune` makes with `keep` from a model of `config`."""
    return replace(config, n_layers=len(keep.layers), n_heads=len(keep.heads[0]),
                   n_kv_heads=None, hidden_dim=len(keep.neurons[0]),
                   dim=len(keep.channels)).num_params()


def width_plan(imp: Importance, config, budget: int) -> Keep:
    """Lab 08's reference pruning plan: width only, two thirds of every layer's heads (the
    top-scored ones), then the most MLP neurons (a multiple of 8) that fit `budget` parameters."""
    n_heads = max(1, round(config.n_heads * 2 / 3))
    for hidden in range(config.hidden_dim - config.hidden_dim % 8, 0, -8):
        keep = choose(imp, n_heads=n_heads, hidden_dim=hidden)
        if kept_params(config, keep) <= budget:
            return keep
    raise ValueError(f"no width-only plan fits {budget} parameters")


@torch.no_grad()
def prune(model: Transformer, keep: Keep) -> Transformer:
    """A new, smaller Transformer holding the kept slices of `model`'s weights."""
    c = model.config
    if c.n_kv_heads != c.n_heads:
        raise ValueError("prune() handles multi-head attention (n_kv_heads == n_heads); a GQA "
                         "model would have to drop whole key/value groups")
    if c.qkv_bias or c.o_bias or c.mlp_bias:
        raise ValueError("prune() handles bias-free projections only")
    n_heads, hidden = {len(h) for h in keep.heads}, {len(n) for n in keep.neurons}
    if len(n_heads) != 1 or len(hidden) != 1 or len(keep.heads) != len(keep.layers) or \
            len(keep.neurons) != len(keep.layers) or not keep.layers:
        raise ValueError("every kept layer must keep the same number of heads and of neurons "
                         "(one ModelConfig describes every layer)")
    for name, idx, size in [("layers", keep.layers, c.n_layers), ("channels", keep.channels, c.dim)] \
            + [("heads", h, c.n_heads) for h in keep.heads] \
            + [("neurons", n, c.hidden_dim) for n in keep.neurons]:
        if len(set(idx)) != len(idx) or not all(0 <= i < size for i in idx):
            raise ValueError(f"kept {name} {idx} are not distinct indices in 0..{size - 1}")
    H = c.head_dim
    new = replace(c, n_layers=len(keep.layers), n_heads=n_heads.pop(), n_kv_heads=None,
                  hidden_dim=hidden.pop(), dim=len(keep.channels), head_dim=H)
    small = Transformer(new)
    ch = torch.tensor(keep.channels)
    small.embed_tokens.weight.copy_(model.embed_tokens.weight[:, ch])
    small.norm.weight.copy_(model.norm.weight[ch])
    if not c.tie_embeddings:
        small.lm_head.weight.copy_(model.lm_head.weight[:, ch])
    for j, i in enumerate(keep.layers):
        src, dst = model.layers[i], small.layers[j]
        rows = torch.tensor([h * H + e for h in keep.heads[j] for e in range(H)])
        neu = torch.tensor(keep.neurons[j])
        for name in ("q_proj", "k_proj", "v_proj"):      # reads the stream, writes heads
            getattr(dst.self_attn, name).weight.copy_(
                getattr(src.self_attn, name).weight[rows][:, ch])
        dst.self_attn.o_proj.weight.copy_(src.self_attn.o_proj.weight[ch][:, rows])
        dst.mlp.gate_proj.weight.copy_(src.mlp.gate_proj.weight[neu][:, ch])
        dst.mlp.up_proj.weight.copy_(src.mlp.up_proj.weight[neu][:, ch])
        dst.mlp.down_proj.weight.copy_(src.mlp.down_proj.weight[ch][:, neu])
        dst.input_layernorm.weight.copy_(src.input_layernorm.weight[ch])
        dst.post_attention_layernorm.weight.copy_(src.post_attention_layernorm.weight[ch])
    return small.eval()
