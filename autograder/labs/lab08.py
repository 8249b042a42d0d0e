"""Lab 08: probes run the student's scores, pruning and distillation on models built in their
kernel from a spec (`build`), and ask their pruning plan for a budget; the plan is graded by the
held-out loss of the pruned model against the course's plan for the same budget. No timing."""
from __future__ import annotations

import dataclasses
import tempfile

import torch

import minillm
from autograder import labs
from autograder.probes import fresh_model, probe
from minillm import pruning
from minillm.config import ModelConfig
from minillm.model import Transformer
from minillm.pruning import Importance, Keep
from minillm.train import evaluate


def score_model(model, batches, head_scores, neuron_scores, block_influence) -> Importance:
    """The notebook's helper: hooks hand each part's activations to its score function; the
    Importance averages them over the batches, weighted by tokens."""
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
    """Large weights (every part matters), random norms; the global RNG is left as it was."""
    with torch.random.fork_rng(devices=[]):
        return labs.random_model(seed, dict(
            vocab_size=vocab_size, dim=dim, n_layers=n_layers, n_heads=n_heads,
            head_dim=head_dim, hidden_dim=hidden_dim, max_seq_len=64,
            tie_embeddings=tie_embeddings), 0.3, (0.5, 1.5))


def build(spec) -> Transformer:
    """A shipped checkpoint's name, random_model's kwargs, or {"config", "state"}: the model."""
    if isinstance(spec, str):
        return fresh_model(spec)
    if "state" not in spec:
        return random_model(**spec)
    with torch.random.fork_rng(devices=[]):
        model = Transformer(ModelConfig(**spec["config"])).eval()
    model.load_state_dict(spec["state"])
    return model


def spec_of(model: Transformer) -> dict:
    """The spec that rebuilds `model` on the other side."""
    return {"config": dataclasses.asdict(model.config),
            "state": {k: v.detach().clone() for k, v in model.state_dict().items()}}


@probe
def importance_of(model, batches, head_scores=None, neuron_scores=None,
                  block_influence=None) -> dict:
    """The fields of score_model(build(model), batches, ...); a None score is 0."""
    scores = [fn or (lambda *args: 0.0) for fn in (head_scores, neuron_scores, block_influence)]
    return dataclasses.asdict(score_model(build(model), batches, *scores))


@probe
def _pruned(prune_model, model, keep: dict, x, reload: bool) -> dict:
    m = build(model)
    before = spec_of(m)
    small = prune_model(m, Keep(**keep))
    out = {"new_model": small is not m, "is_transformer": isinstance(small, Transformer),
           "num_params": small.num_params(), **spec_of(small)}
    with torch.no_grad():
        out["logits"] = small(x)
        if reload:
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
    """`prune_model(build(model), keep)`: the result (reload: saved and loaded back)."""
    return _pruned(prune_model, model, dataclasses.asdict(keep), x, reload)


@probe
def loss_and_grad(distillation_loss, student_logits, teacher_logits, *args):
    """(the loss, its gradient in student_logits, or None if not a differentiable scalar)."""
    s = student_logits.clone().requires_grad_(True)
    loss = distillation_loss(s, teacher_logits.clone(), *args)
    if not (isinstance(loss, torch.Tensor) and loss.requires_grad and loss.numel() == 1):
        return loss, None
    return loss.detach(), torch.autograd.grad(loss, s)[0]


@probe
def distill_steps(distill_step, student, teacher, x, lr: float, temperature: float,
                  steps: int = 2) -> dict:
    """`steps` calls of distill_step(s, t, x, SGD(s, lr), temperature) and their effects."""
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


# The pruning-plan task: a plan passes if the pruned target (no repair) fits the parameter
# budget and its held-out loss is at most PLAN_MARGIN nats above the course's plan's
PLAN_MARGIN = 0.1
PLAN_TOKENS = 2048            # held-out tokens per evaluation (8 windows of 256)


@probe
def plan_of(pruning_plan, imp: dict, layer_loss, budget: int) -> dict:
    """The student's `pruning_plan(Importance, layer_loss, budget)`, as Keep's fields."""
    keep = pruning_plan(Importance(**imp), layer_loss.clone(), int(budget))
    return {"layers": [int(i) for i in keep.layers], "channels": [int(i) for i in keep.channels],
            "heads": [[int(i) for i in h] for h in keep.heads],
            "neurons": [[int(i) for i in n] for n in keep.neurons]}


def check_plan(pruning_plan, model: Transformer, imp: Importance, layer_loss, budget: int,
               val_ids, offset: int = 0) -> dict:
    """Ask the plan for `budget`, prune `model` with the course's prune, and compare held-out
    losses (PLAN_TOKENS tokens from `offset`) with the course's plan (`pruning.width_plan`,
    withheld from the student's kernel); print, then assert."""
    keep = Keep(**plan_of(pruning_plan, dataclasses.asdict(imp), layer_loss, budget))
    try:
        small = pruning.prune(model, keep)
    except (ValueError, IndexError, RuntimeError) as e:
        raise AssertionError(f"your plan is not a valid Keep for the target: {e}") from None
    ref = pruning.prune(model, pruning.width_plan(imp, model.config, budget))
    data = val_ids[offset:]
    loss = evaluate(small, data, 256, max_tokens=PLAN_TOKENS)[0]
    ref_loss = evaluate(ref, data, 256, max_tokens=PLAN_TOKENS)[0]
    c = small.config
    print(f"budget {budget:,} parameters: your plan keeps {c.n_layers} layers x {c.dim}, "
          f"{c.n_heads} heads, MLP {c.hidden_dim}: {small.num_params():,} parameters, held-out "
          f"loss {loss:.3f}; the course's plan {ref_loss:.3f}; yours must be <= "
          f"{ref_loss + PLAN_MARGIN:.3f} (+{PLAN_MARGIN} nats)")
    assert small.num_params() <= budget, \
        f"{small.num_params():,} parameters: over the budget of {budget:,}"
    assert loss <= ref_loss + PLAN_MARGIN, (
        f"held-out loss {loss:.3f}, more than {PLAN_MARGIN} nats above the course's plan "
        f"({ref_loss:.3f}): which parts did you remove, and what did their scores say?")
    return {"loss": loss, "ref_loss": ref_loss, "params": small.num_params()}


__all__ = ["score_model", "random_model", "build", "spec_of", "importance_of", "pruned",
           "loss_and_grad", "distill_steps", "plan_of", "check_plan"]
