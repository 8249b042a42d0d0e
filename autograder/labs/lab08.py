"""Lab 08's probes: the student's scores, pruning and distillation run where they live, on
models built there from a spec (`build`: a shipped checkpoint's name, `random_model`'s keyword
arguments, or {"config", "state"}); the tests compare what they return with minillm.pruning and
minillm.distill, run in the tester on the same models built from the same specs:

    from autograder.labs import lab08
    lab08.importance_of(dict(seed=811, n_heads=4), batches, head_scores)   # the rest score 0
    lab08.pruned(prune_model, "target", keep, x)       # -> config, weights, logits, ...
    lab08.loss_and_grad(distillation_loss, s, t, 2.0)   # -> the loss and d loss / d s
    lab08.distill_steps(distill_step, lab08.spec_of(student), "target", x, 0.5, 2.0)

`score_model` is the notebook's helper: forward hooks at the four places
`minillm.pruning.importance` reads hand each batch's activations to the student's three score
functions, whose results are averaged over the batches, weighted by tokens. No timing here.
"""
from __future__ import annotations

import dataclasses
import tempfile

import torch

import minillm
from autograder.probes import fresh_model, probe
from minillm.config import ModelConfig
from minillm.model import Transformer
from minillm.pruning import Importance, Keep


def score_model(model, batches, head_scores, neuron_scores, block_influence) -> Importance:
    """Importance of `model` on `batches` ([b, T] token ids each), from the given functions:

    * head_scores(o_in [b, T, N*H], n_heads) -> [N]: o_proj's input, the heads side by side;
    * neuron_scores(a [b, T, F or D]) -> [F or D]: down_proj's input silu(gate) * up (neurons),
      and every RMSNorm's output (channels: the mean over the 2L + 1 norms);
    * block_influence(x_in [b, T, D], x_out [b, T, D]) -> a number: a block's input and output.
    """
    c = model.config
    L, N = c.n_layers, c.n_heads
    heads, neurons = torch.zeros(L, N), torch.zeros(L, c.hidden_dim)
    channels, layers, size = torch.zeros(c.dim), torch.zeros(L), [0]

    def on(into, i, fn):      # a hook: fn(the module's input[, its output]), weighted by tokens
        def hook(mod, args, out=None):
            xs = [t.detach().float().clone() for t in (args[0], out) if t is not None]
            into[i] += torch.as_tensor(fn(*xs), dtype=torch.float32) * size[0]
        return hook

    def on_norm(norm):
        return norm.register_forward_hook(on(channels, ..., lambda x, y: neuron_scores(y)))

    hooks = [on_norm(model.norm)]
    for i, layer in enumerate(model.layers):
        hooks += [layer.self_attn.o_proj.register_forward_pre_hook(
                      on(heads, i, lambda a: head_scores(a, N))),
                  layer.mlp.down_proj.register_forward_pre_hook(on(neurons, i, neuron_scores)),
                  layer.register_forward_hook(
                      on(layers, i, lambda x, y: float(block_influence(x, y)))),
                  on_norm(layer.input_layernorm), on_norm(layer.post_attention_layernorm)]
    total = 0
    try:
        with torch.no_grad():
            for ids in batches:
                size[0] = ids.numel()
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
    norms' weights random, so that slicing them in the wrong order shows): the same from the
    same seed, in the tester and in the kernel; the global RNG is left as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Transformer(ModelConfig(vocab_size=vocab_size, dim=dim, n_layers=n_layers,
                                        n_heads=n_heads, head_dim=head_dim,
                                        hidden_dim=hidden_dim, max_seq_len=64,
                                        tie_embeddings=tie_embeddings)).eval()
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("norm.weight"):
                    p.uniform_(0.5, 1.5)
                else:
                    p.normal_(0.0, 0.3)
    return model


def build(spec) -> Transformer:
    """The model a spec names: a shipped checkpoint (a fresh copy), `random_model(**spec)`, or
    {"config": ModelConfig fields, "state": a state dict}."""
    if isinstance(spec, str):
        return fresh_model(spec)
    if "state" not in spec:
        return random_model(**spec)
    with torch.random.fork_rng(devices=[]):
        model = Transformer(ModelConfig(**spec["config"])).eval()
    model.load_state_dict(spec["state"])
    return model


def spec_of(model: Transformer) -> dict:
    """The spec that rebuilds `model` on the other side: its config and weights."""
    return {"config": dataclasses.asdict(model.config),
            "state": {k: v.detach().clone() for k, v in model.state_dict().items()}}


@probe
def importance_of(model, batches, head_scores=None, neuron_scores=None,
                  block_influence=None) -> dict:
    """The fields of `score_model(build(model), batches, ...)`; None scores every part 0."""
    def zero(*args):
        return 0.0
    return dataclasses.asdict(score_model(build(model), batches, head_scores or zero,
                                          neuron_scores or zero, block_influence or zero))


@probe
def _pruned(prune_model, model, keep: dict, x, reload: bool) -> dict:
    m = build(model)
    before = spec_of(m)
    small = prune_model(m, Keep(**keep))
    out = {"new_model": small is not m, "is_transformer": isinstance(small, Transformer),
           "num_params": small.num_params(), **spec_of(small)}
    with torch.no_grad():
        out["logits"] = small(x)
        if reload:                       # a real checkpoint, saved and loaded back
            from minillm.weights import save_checkpoint
            with tempfile.TemporaryDirectory() as d:
                save_checkpoint(small, d)
                again = minillm.load(d)
                out["reloaded_config"] = dataclasses.asdict(again.config)
                out["reloaded_logits"] = again(x)
    after = spec_of(m)
    out["input_unchanged"] = after["config"] == before["config"] and \
        after["state"].keys() == before["state"].keys() and \
        all(torch.equal(v, after["state"][k]) for k, v in before["state"].items())
    return out


def pruned(prune_model, model, keep: Keep, x, reload: bool = False) -> dict:
    """`prune_model(m, keep)` on m = build(model): {"config", "state": the pruned model's,
    "logits": on ids x, "num_params", "new_model": not m, "is_transformer", "input_unchanged":
    m as before}; with `reload`, "reloaded_config" and "reloaded_logits" after a
    save_checkpoint and minillm.load."""
    return _pruned(prune_model, model, dataclasses.asdict(keep), x, reload)


@probe
def loss_and_grad(distillation_loss, student_logits, teacher_logits, *args):
    """(`distillation_loss(s, teacher_logits, *args)`, its gradient with respect to s =
    student_logits), the gradient None where the loss is not a differentiable scalar."""
    s = student_logits.clone().requires_grad_(True)
    loss = distillation_loss(s, teacher_logits.clone(), *args)
    if not (isinstance(loss, torch.Tensor) and loss.requires_grad and loss.numel() == 1):
        return loss, None
    return loss.detach(), torch.autograd.grad(loss, s)[0]


@probe
def distill_steps(distill_step, student, teacher, x, lr: float, temperature: float,
                  steps: int = 2) -> dict:
    """`steps` calls of `distill_step(s, t, x, torch.optim.SGD(s.parameters(), lr),
    temperature)`, s = build(student), t = build(teacher): {"losses": what each returned,
    "params": s's parameters after each, "teacher_grads": whether t got a nonzero gradient}."""
    s, t = build(student), build(teacher)
    t.requires_grad_(True)               # as loaded: only the step can keep the teacher frozen
    opt = torch.optim.SGD(s.parameters(), lr=lr)
    out = {"losses": [], "params": []}
    for _ in range(steps):
        out["losses"].append(distill_step(s, t, x, opt, temperature))
        out["params"].append({k: p.detach().clone() for k, p in s.named_parameters()})
    out["teacher_grads"] = any(p.grad is not None and bool(p.grad.abs().sum())
                               for p in t.parameters())
    return out


__all__ = ["score_model", "random_model", "build", "spec_of", "importance_of", "pruned",
           "loss_and_grad", "distill_steps"]
