"""Figures for the deck of lab 00: sampling from a tiny LLM (slides/00_sampling.md)."""
from __future__ import annotations

import functools
import html

from matplotlib.figure import Figure

from .common import (
    BLUE,
    GREEN,
    GREY,
    ORANGE,
    RED,
    figure,
    model_and_tokenizer,
    new_figure,
    style_axes,
    token_label,
)

PROMPT = "ROMEO:\nBut soft, what light through yonder window breaks?"


@functools.lru_cache(maxsize=1)
def _next_logits():
    """The shipped model's logits for the token after PROMPT (what lab 00 looks at)."""
    import torch
    model, tok = model_and_tokenizer()
    with torch.no_grad():
        return model(torch.tensor([tok.encode(PROMPT)]))[0, -1].float()


@figure
def tokens() -> str:
    """The lab's prompt cut into tokens by the shipped byte-level BPE tokenizer."""
    _, tok = model_and_tokenizer()
    ids = tok.encode(PROMPT)
    chips = "".join(f'<span class="tok"><b>{html.escape(repr(s)[1:-1])}</b><i>{i}</i></span>'
                    for i, s in zip(ids, tok.token_strings(ids)))
    return (f'<div class="tokens">{chips}</div><p class="small">{len(PROMPT)} characters &rarr; '
            f"{len(ids)} tokens, vocabulary of {tok.vocab_size}</p>")


@figure
def next_token() -> Figure:
    """softmax of the real next-token logits: the 20 most probable tokens."""
    import torch
    _, tok = model_and_tokenizer()
    probs = torch.softmax(_next_logits(), -1)
    top = torch.topk(probs, 20)
    fig, ax = new_figure(10, 4.2)
    ax.bar(range(20), top.values.numpy(), color=BLUE)
    ax.set_xticks(range(20), [token_label(tok, i) for i in top.indices.tolist()], rotation=60,
                  fontsize=11, family="monospace")
    ax.set_ylabel("p(next token)")
    rest = 1 - float(top.values.sum())
    ax.set_title(f"the 20 most probable next tokens after “…{PROMPT[-22:]}” "
                 f"(the other {tok.vocab_size - 20} share p = {rest:.2f})")
    style_axes(ax)
    return fig


def _filtered_panels(settings: list[tuple[str, dict]], n_show: int = 40) -> Figure:
    """One panel per sampling setting: the exact distribution `minillm.sampling.probabilities`
    gives for the real logits, over the n_show most probable tokens (sorted)."""
    import torch

    from minillm.sampling import probabilities
    logits = _next_logits()
    order = torch.argsort(logits, descending=True)[:n_show]
    base = torch.softmax(logits, -1)[order].numpy()
    fig, axes = new_figure(11, 4.0, nrows=1, ncols=len(settings), sharey=True)
    ymax = 0.0
    for ax, (title, kw) in zip(axes, settings):
        p = probabilities(logits, **kw)[order].numpy()
        kept = int((probabilities(logits, **kw) > 0).sum())
        ymax = max(ymax, float(p.max()))
        ax.bar(range(n_show), base, color="#dddddd", label="plain softmax")
        ax.bar(range(n_show), p, color=[BLUE if v > 0 else GREY for v in p], width=0.8,
               label="after the filter")
        ax.set_title(f"{title}\n{kept} of {len(logits)} tokens can be drawn")
        ax.set_xlabel(f"the {n_show} most probable tokens (rank)")
        style_axes(ax)
    axes[0].set_ylabel("probability")
    axes[0].set_ylim(0, ymax * 1.1)
    axes[0].legend(loc="upper right")
    return fig


@figure
def temperature() -> Figure:
    """Temperature reshapes the real distribution: tau < 1 sharpens, tau > 1 flattens."""
    return _filtered_panels([("temperature τ = 0.5", {"temperature": 0.5}),
                             ("τ = 1 (the model as trained)", {"temperature": 1.0}),
                             ("τ = 2", {"temperature": 2.0})])


@figure
def top_k_top_p() -> Figure:
    """Top-k cuts a fixed number of tokens, top-p a fixed amount of probability."""
    return _filtered_panels([("top-k, k = 10", {"top_k": 10}),
                             ("top-p, p = 0.5", {"top_p": 0.5}),
                             ("τ = 0.8, then top-p = 0.9", {"temperature": 0.8, "top_p": 0.9})])


@figure
def samples() -> str:
    """What the shipped model writes with three sampling settings (naive loop, seeded)."""
    import torch

    from minillm.generate import generate_naive
    from minillm.sampling import SamplingParams
    model, tok = model_and_tokenizer()
    prompt = "ROMEO:\n"
    rows = []
    for label, kw in [("greedy (τ = 0)", {"temperature": 0.0}),
                      ("τ = 0.8, top-p = 0.9", {"temperature": 0.8, "top_p": 0.9}),
                      ("τ = 1.5", {"temperature": 1.5})]:
        params = SamplingParams(max_new_tokens=24, seed=0, stop_ids=(tok.eos_id,)
                                if tok.eos_id is not None else (), **kw)
        with torch.no_grad():
            new = generate_naive(model, tok.encode(prompt), params)[0]
        lines = (prompt + tok.decode(new)).splitlines()
        text = html.escape("\n".join(lines[:8] + (["…"] if len(lines) > 8 else [])))
        rows.append(f'<div class="sample"><h4>{label}</h4><pre>{text}</pre></div>')
    return '<div class="samples">' + "".join(rows) + "</div>"


@figure
def timeline() -> Figure:
    """TTFT, per-token latency and total time of one request, drawn to scale from the napkin
    latency of one Llama-2-13B decode step on an H100 (prefill taken as compute-bound)."""
    from minillm import roofline as rf
    hw = rf.get_hardware("h100")
    S, n = 1000, 8
    params = rf.lecture_num_params("llama-2-13b")
    step = rf.napkin("llama-2-13b", hw, batch=1, seq_len=S)["latency_s"] * 1e3
    prefill = max(2 * params * S / hw.flops_per_s * 1e3, step)   # 2*params FLOPs per token
    fig, ax = new_figure(10, 2.6)
    ax.barh(0, prefill, color=ORANGE, edgecolor="white")
    ax.text(prefill / 2, 0, f"prefill\n{S} prompt tokens", ha="center", va="center", fontsize=11)
    for i in range(n):
        ax.barh(0, step, left=prefill + i * step, color=BLUE, edgecolor="white")
        ax.text(prefill + (i + 0.5) * step, 0, f"t{i + 1}", ha="center", va="center",
                color="white", fontsize=11)
    y = 0.55
    ax.annotate("", (0, y), (prefill + step, y), arrowprops={"arrowstyle": "<->"})
    ax.text((prefill + step) / 2, y + 0.08, f"TTFT ≈ {prefill + step:.0f} ms", ha="center")
    ax.annotate("", (prefill + 3 * step, -y), (prefill + 4 * step, -y),
                arrowprops={"arrowstyle": "<->"})
    ax.text(prefill + 3.5 * step, -y - 0.25, f"latency ≈ {step:.1f} ms / token", ha="center")
    ax.set_ylim(-1, 1)
    ax.set_yticks([])
    ax.set_xlabel("time (ms) — Llama-2-13B, one request, H100, napkin math")
    ax.spines[["top", "right", "left"]].set_visible(False)
    return fig


def generate_naive_steps(model, prompt: list[int], n: int):
    """minillm.generate.stream_naive, greedy: one yield per naive step."""
    from minillm.generate import stream_naive
    from minillm.sampling import SamplingParams
    yield from stream_naive(model, prompt, SamplingParams(temperature=0, max_new_tokens=n))


@figure
def naive_cost() -> Figure:
    """Token positions the naive loop pushes through the model, counted on the real model
    (minillm.bench.timing.WorkCounter around minillm.generate.stream_naive), against the closed form
    and against a loop that would recompute nothing; and the FLOPs of the naive loop."""
    import numpy as np
    import torch

    from minillm.bench.timing import WorkCounter
    model, _ = model_and_tokenizer()
    cfg = model.config
    P, N = 8, 40
    per_step = []                 # tokens of each forward call, counted by the lab's WorkCounter
    with WorkCounter(model) as wc, torch.no_grad():
        for _ in generate_naive_steps(model, list(range(1, P + 1)), N):
            per_step.append(wc.tokens - sum(per_step))
    ns = [1, 2, 4, 8, 16, 24, 32, 40]
    counted = [sum(per_step[:n]) for n in ns]
    n_line = np.arange(1, N + 1)
    closed = n_line * P + n_line * (n_line - 1) / 2
    fig, (a1, a2) = new_figure(11, 4.2, nrows=1, ncols=2)
    a1.plot(n_line, closed, "-", color=BLUE, label="naive: Σ (P + t) = nP + n(n−1)/2")
    a1.plot(ns, counted, "o", color=BLUE, label="counted on the model (WorkCounter)")
    a1.plot(n_line, P + n_line - 1, "--", color=GREEN, label="recompute nothing: P + n − 1")
    a1.set_xlabel(f"new tokens n (prompt P = {P})")
    a1.set_ylabel("token positions through the model")
    a1.set_title("work of the naive loop grows like n²")
    a1.legend()
    style_axes(a1)

    # FLOPs of naive step t (1-token prompt, so it runs T = t + 1 tokens): per token and layer the
    # weights cost 2(4D² + 3DF) (Q, K, V, O and the SwiGLU MLP), and query i attends to i + 1
    # keys at 4·D FLOPs each (scores and weighted sum).
    D, F, L = cfg.dim, cfg.hidden_dim, cfg.n_layers
    n_big = np.unique(np.logspace(0, 5, 60).astype(int))
    t = np.arange(n_big.max())
    T = 1 + t
    weights = np.cumsum(L * 2 * (4 * D * D + 3 * D * F) * T)
    attention = np.cumsum(L * 4 * D * T * (T + 1) / 2)        # query i attends to i + 1 keys
    a2.loglog(n_big, weights[n_big - 1] + attention[n_big - 1], color=BLUE, label="total")
    a2.loglog(n_big, weights[n_big - 1], "--", color=ORANGE, label="weights part ∝ n²")
    a2.loglog(n_big, attention[n_big - 1], ":", color=RED, label="attention part ∝ n³")
    a2.axvline(cfg.max_seq_len, color=GREY, lw=1)
    a2.text(cfg.max_seq_len * 1.1, weights[1], f"context of the\nshipped model\n"
            f"({cfg.max_seq_len})", fontsize=10, color=GREY)
    a2.set_xlabel("new tokens n (from a 1-token prompt)")
    a2.set_ylabel("FLOPs of the whole naive generation")
    a2.set_title(f"FLOPs, this model's shape (D={D}, F={F}, L={L})")
    a2.legend()
    style_axes(a2)
    return fig
