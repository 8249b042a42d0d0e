"""Figures for the deck of lab 08: pruning and distillation (slides/08_pruning_distillation.md).

Everything is computed with minillm.pruning and minillm.distill on the shipped checkpoints and a
small seeded calibration set; held-out figures use the first tokens of the validation split. No
timing: the deck's speed statements are the lab's measured ranges, in the text."""
from __future__ import annotations

import functools

from matplotlib.figure import Figure

from .common import (
    BLUE,
    GREEN,
    GREY,
    ORANGE,
    figure,
    html_table,
    model_and_tokenizer,
    new_figure,
    style_axes,
)

CALIB_SAMPLES, CALIB_LEN = 16, 128          # the lab uses 64; the shipped draft-distilled 1,024
HELD_OUT = 4096                             # held-out tokens per loss


@functools.lru_cache(maxsize=1)
def _data():
    """Training and held-out token ids of the shipped corpus."""
    from minillm.data import load_tokens
    _, tok = model_and_tokenizer()
    return load_tokens(tok, "train"), load_tokens(tok, "val")


@functools.lru_cache(maxsize=1)
def _scores():
    """The target's importance and layer-drop losses on a small calibration set."""
    from minillm import pruning
    target, _ = model_and_tokenizer()
    calib = pruning.calibration_batches(_data()[0], CALIB_SAMPLES, CALIB_LEN, batch_size=8)
    return pruning.importance(target, calib), pruning.layer_drop_loss(target, calib[:1])


def _held_out(model) -> float:
    from minillm.train import evaluate
    return evaluate(model, _data()[1], 256, max_tokens=HELD_OUT)[0]


@functools.lru_cache(maxsize=1)
def _models():
    """The shipped draft (from scratch), draft-distilled, and the target pruned to its shape."""
    import json

    import torch

    import minillm
    from minillm import pruning
    target, _ = model_and_tokenizer()
    distilled = minillm.load("draft-distilled")
    log = json.loads((minillm.resolve("draft-distilled") / "train_log.json").read_text())
    shape = log["pruned_from"]
    imp, _ = _scores()
    prefer = torch.tensor([1.0 if i in shape["layers"] else 0.0
                           for i in range(target.config.n_layers)])
    keep = pruning.choose(imp, len(shape["layers"]), shape["n_heads"], shape["hidden_dim"],
                          shape["dim"], layer_scores=prefer)
    return {"pruned only": pruning.prune(target, keep), "pruned + distilled": distilled,
            "from scratch": minillm.load("draft")}, log


@figure
def prune_scores() -> Figure:
    """minillm.pruning.importance on the target: head scores, sorted neuron scores per layer,
    and the two depth scores (block influence; loss increase when skipped)."""
    import numpy as np
    target, _ = model_and_tokenizer()
    imp, drop = _scores()
    fig, (a1, a2, a3) = new_figure(12, 3.9, nrows=1, ncols=3)
    im = a1.imshow(imp.heads.numpy(), cmap="viridis")
    a1.set_xlabel("head")
    a1.set_ylabel("layer")
    a1.set_title("head: mean ‖output‖₂", fontsize=11)
    fig.colorbar(im, ax=a1, fraction=0.046)
    for i in range(target.config.n_layers):
        a2.plot(imp.neurons[i].sort(descending=True).values.numpy(), lw=1.2, label=f"layer {i}")
    a2.set_xlabel("neuron rank")
    a2.set_title("MLP neuron: mean |silu(g)·u|, sorted", fontsize=11)
    a2.legend(fontsize=7)
    style_axes(a2)
    xs = np.arange(target.config.n_layers)
    a3.bar(xs - 0.2, imp.layers.numpy(), 0.4, color=BLUE, label="block influence 1 − cos")
    a3.bar(xs + 0.2, drop.numpy(), 0.4, color=ORANGE, label="loss increase if skipped")
    a3.set_yscale("log")
    a3.set_xlabel("layer")
    a3.set_title("depth: layer 0 is indispensable", fontsize=11)
    a3.legend(fontsize=8)
    style_axes(a3)
    return fig


@figure
def prune_width_depth() -> Figure:
    """Held-out loss of the target pruned to about half its layers' parameters by depth (3 of 6
    layers, by loss increase) and by width (3 of 6 heads, 512 of 1,024 neurons), no repair."""
    from minillm import pruning
    target, _ = model_and_tokenizer()
    imp, drop = _scores()
    cands = {"target": target,
             "depth\n3 of 6 layers": pruning.prune(target, pruning.choose(imp, n_layers=3,
                                                                          layer_scores=drop)),
             "width\n3 heads, MLP 512": pruning.prune(target, pruning.choose(imp, n_heads=3,
                                                                             hidden_dim=512))}
    losses = [_held_out(m) for m in cands.values()]
    fig, ax = new_figure(7.5, 3.8)
    bars = ax.bar(list(cands), losses, color=[GREY, BLUE, ORANGE])
    for b, m, loss in zip(bars, cands.values(), losses):
        ax.text(b.get_x() + b.get_width() / 2, loss + 0.03, f"{loss:.2f}\n{m.num_params() / 1e6:.2f}M",
                ha="center", va="bottom", fontsize=9)
    ax.set_ylim(0, max(losses) * 1.25)
    ax.set_ylabel("held-out loss (nats/token)")
    ax.set_title("equal parameters, right after pruning (no repair)", fontsize=11)
    style_axes(ax)
    return fig


@figure
def distill_tokens() -> Figure:
    """Held-out loss against training tokens, from the train_log.json of the shipped draft (from
    scratch) and draft-distilled; the pruned start's loss at zero tokens."""
    import json

    import minillm
    models, log_d = _models()
    log_s = json.loads((minillm.resolve("draft") / "train_log.json").read_text())
    fig, ax = new_figure(8.5, 3.9)
    run = [p for p in log_d["curve"] if "val_loss" in p]
    per = log_d["batch_size"] * log_d["seq_len"]
    start = _held_out(models["pruned only"])
    ax.plot([log_d["calibration"]["tokens"]] + [p["step"] * per for p in run],
            [start] + [p["val_loss"] for p in run], "o-", color=GREEN,
            label="pruned from the target, then distilled")
    per_s = log_s["batch_size"] * log_s["seq_len"]
    ax.plot([p["step"] * per_s for p in log_s["curve"]], [p["val_loss"] for p in log_s["curve"]],
            "s-", color=BLUE, label="draft, trained from scratch")
    ax.set_xscale("log")
    ax.set_xlabel("training tokens (log)")
    ax.set_ylabel("held-out loss")
    ax.set_title("the shipped runs (train_log.json)", fontsize=11)
    ax.legend(fontsize=9)
    style_axes(ax)
    return fig


@figure
def distill_overlap() -> str:
    """Per model: parameters, held-out perplexity, and on held-out text the mean overlap
    sum min(p, q) = 1 − TV(p, q) with the target's distribution and KL(q || p) (temperature 1)."""
    import math

    import torch
    import torch.nn.functional as F
    target, _ = model_and_tokenizer()
    models, _ = _models()
    x = _data()[1][:2048].reshape(8, -1)
    with torch.no_grad():
        log_q = F.log_softmax(target(x).float(), -1)
        rows = []
        for name, m in models.items():
            log_p = F.log_softmax(m(x).float(), -1)
            overlap = float(torch.minimum(log_q.exp(), log_p.exp()).sum(-1).mean())
            kl = float((log_q.exp() * (log_q - log_p)).sum(-1).mean())
            rows.append([name, f"{m.num_params() / 1e6:.2f}M", f"{math.exp(_held_out(m)):.0f}",
                         f"{kl:.2f}", f"{overlap:.2f}"])
    return html_table(["model", "parameters", "held-out perplexity", "KL(q ‖ p)",
                       "1 − TV = Σ min(p, q)"], rows)
