"""Lab 08 helpers: the activations that pruning scores read, and a random model to grade them on.

`score_model` runs a model over calibration batches with forward hooks -- the same four places
`minillm.pruning.importance` reads -- and hands each batch's activations to the student's three
score functions (pure functions of tensors, each returning a mean over the batch's positions).
It averages their results over the batches, weighted by tokens, into a
`minillm.pruning.Importance`, so that the student's scores can be compared with the reference's
on the shipped target and, in the hidden tests, on random models with the reference disabled.

    from autograder.labs import lab08_pruning
    imp = lab08_pruning.score_model(model, batches, head_scores, neuron_scores, block_influence)

No timing here: lab 08 grades correctness only (its speed figures are measured, not graded).
"""
from __future__ import annotations

import torch

from minillm.config import ModelConfig
from minillm.model import Transformer
from minillm.pruning import Importance

# captured at import (the grader imports autograder before student code runs)
_no_grad, _as_tensor, _zeros = torch.no_grad, torch.as_tensor, torch.zeros
_float32 = torch.float32


def score_model(model, batches, head_scores, neuron_scores, block_influence) -> Importance:
    """Importance of `model` on `batches` ([b, T] token ids each), from the given functions:

    * head_scores(o_in [b, T, N*H], n_heads) -> [N]: o_proj's input, the heads side by side;
    * neuron_scores(a [b, T, F or D]) -> [F or D]: down_proj's input silu(gate) * up (neurons),
      and every RMSNorm's output (channels: the mean over the 2L + 1 norms);
    * block_influence(x_in [b, T, D], x_out [b, T, D]) -> a number: a block's input and output.
    """
    c = model.config
    L, N, D = c.n_layers, c.n_heads, c.dim
    heads, neurons = _zeros(L, N), _zeros(L, c.hidden_dim)
    channels, layers = _zeros(D), _zeros(L)
    hooks, batch = [], {}

    def per_layer(i, into, fn, *extra):
        def hook(mod, args):
            into[i] += _as_tensor(fn(args[0].detach().float().clone(), *extra),
                                  dtype=_float32) * batch["n"]
        return hook

    def on_norm(mod, args, out):
        channels.add_(_as_tensor(neuron_scores(out.detach().float().clone()),
                                 dtype=_float32) * batch["n"])

    def on_block(i):
        def hook(mod, args, out):
            layers[i] += float(block_influence(args[0].detach().float().clone(),
                                               out.detach().float().clone())) * batch["n"]
        return hook

    for i, layer in enumerate(model.layers):
        hooks += [layer.self_attn.o_proj.register_forward_pre_hook(per_layer(i, heads,
                                                                             head_scores, N)),
                  layer.mlp.down_proj.register_forward_pre_hook(per_layer(i, neurons,
                                                                          neuron_scores)),
                  layer.input_layernorm.register_forward_hook(on_norm),
                  layer.post_attention_layernorm.register_forward_hook(on_norm),
                  layer.register_forward_hook(on_block(i))]
    hooks.append(model.norm.register_forward_hook(on_norm))
    total = 0
    try:
        with _no_grad():
            for ids in batches:
                batch["n"] = ids.numel()
                model(ids)
                total += ids.numel()
    finally:
        for h in hooks:
            h.remove()
    n = max(total, 1)
    return Importance(heads / n, neurons / n, channels / (n * (2 * L + 1)), layers / n, total)


def random_model(seed: int, vocab_size: int = 97, dim: int = 48, n_layers: int = 3,
                 n_heads: int = 4, head_dim: int = 12, hidden_dim: int = 40,
                 tie_embeddings: bool = True) -> Transformer:
    """A small random model whose weights are large enough for every part to matter (and the
    norms' weights random, so that slicing them in the wrong order shows)."""
    torch.manual_seed(seed)
    model = Transformer(ModelConfig(vocab_size=vocab_size, dim=dim, n_layers=n_layers,
                                    n_heads=n_heads, head_dim=head_dim, hidden_dim=hidden_dim,
                                    max_seq_len=64, tie_embeddings=tie_embeddings)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0.0, 0.3)
    return model


class SGD:
    """Plain gradient descent, w <- w - lr * grad, with torch.optim's `zero_grad` / `step`.

    The graded cells use this rather than torch.optim: constructing a torch.optim optimizer
    imports torch._dynamo, which rewraps torch functions such as torch.manual_seed, and the
    grader's integrity check (autograder/sealed.py) would report that as tampering. The lab's
    ungraded training runs after the last graded cell use torch.optim.AdamW."""

    def __init__(self, params, lr: float):
        self.params, self.lr = list(params), float(lr)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    def step(self) -> None:
        with _no_grad():
            for p in self.params:
                if p.grad is not None:
                    p.sub_(self.lr * p.grad)
