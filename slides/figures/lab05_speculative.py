"""Figures for the deck of lab 05: speculative sampling (slides/05_speculative.md)."""
from __future__ import annotations

import functools
import html

from matplotlib.figure import Figure

from .common import (
    BLUE,
    GREEN,
    GREY,
    ORANGE,
    PURPLE,
    RED,
    figure,
    model_and_tokenizer,
    new_figure,
    style_axes,
    token_label,
)

SPEC_PROMPT = "HAMLET.\nTo be, or not to be, that is the question:\n"


@functools.lru_cache(maxsize=1)
def _draft_model():
    import minillm
    return minillm.load("draft-distilled")


def _tok_chips(tok, ids, style: str = "") -> str:
    return "".join(f'<span class="tok" style="{style}"><b>{html.escape(token_label(tok, i))}</b></span>'
                   for i in ids)


@figure
def spec_step() -> str:
    """One greedy speculative step on the shipped models: the draft's 6 tokens (greedy, with
    minillm.generate.generate_cached), the target's argmax at each of the 7 positions from ONE
    forward pass, and what is kept."""
    import torch

    from minillm.generate import generate_cached
    from minillm.sampling import SamplingParams
    from minillm.speculative import verify_greedy
    target, tok = model_and_tokenizer()
    ctx, k = tok.encode(SPEC_PROMPT), 6
    drafted = generate_cached(_draft_model(), ctx, SamplingParams(temperature=0,
                                                                  max_new_tokens=k))[0]
    with torch.no_grad():
        choice = target(torch.tensor([ctx + drafted]))[0, len(ctx) - 1:].argmax(-1).tolist()
    n, nxt = verify_greedy(choice, drafted)
    ok, bad = "background:#d8f0e6", "background:#f6d7c8;text-decoration:line-through"
    draft_row = (_tok_chips(tok, drafted[:n], ok) + _tok_chips(tok, drafted[n:n + 1], bad)
                 + _tok_chips(tok, drafted[n + 1:], "opacity:0.45"))
    rows = [("draft proposes (k = 6)", draft_row),
            ("target's argmax, one pass", _tok_chips(tok, choice)),
            ("kept", _tok_chips(tok, drafted[:n], ok) + _tok_chips(tok, [nxt], "background:#cfe3f3"))]
    body = "".join(f'<tr><td>{label}</td><td><div class="tokens">{chips}</div></td></tr>'
                   for label, chips in rows)
    return (f'<table class="data"><tbody>{body}</tbody></table><p class="small">after '
            f'{html.escape(repr(SPEC_PROMPT))}: {n} drafts accepted, then the target\'s own token '
            f"&rarr; {n + 1} tokens for one target pass</p>")


@figure
def spec_exactness() -> Figure:
    """200,000 speculative samples at one position (vectorised, seeded), with the right residual
    (minillm.speculative.residual_distribution) and with the order swapped, against q and p."""
    import numpy as np
    import torch

    from minillm.speculative import residual_distribution
    q = torch.tensor([0.30, 0.25, 0.20, 0.12, 0.08, 0.05])
    p = torch.tensor([0.05, 0.10, 0.15, 0.20, 0.25, 0.25])
    n = 200_000

    def sample(residual):
        g = torch.Generator().manual_seed(0)
        x = torch.multinomial(p, n, replacement=True, generator=g)
        keep = torch.rand(n, generator=g) < (q[x] / p[x]).clamp(max=1)
        y = torch.multinomial(residual, n, replacement=True, generator=g)
        return torch.bincount(torch.where(keep, x, y), minlength=6).float() / n

    right = sample(residual_distribution(q, p))
    wrong = sample(residual_distribution(p, q))
    fig, ax = new_figure(9, 4.2)
    xs, w = np.arange(6), 0.2
    ax.bar(xs - 1.5 * w, q, w, color="black", label="target q")
    ax.bar(xs - 0.5 * w, p, w, color=GREY, alpha=0.6, label="draft p")
    ax.bar(xs + 0.5 * w, right, w, color=GREEN, label="speculative, residual (q − p)⁺")
    ax.bar(xs + 1.5 * w, wrong, w, color=RED, label="speculative, residual (p − q)⁺ (wrong)")
    ax.set_xlabel("token")
    ax.set_ylabel("probability / frequency")
    ax.set_title(f"{n:,} samples: the right residual reproduces q, the swapped one reproduces p",
                 fontsize=11)
    ax.legend(fontsize=9)
    style_axes(ax)
    return fig


@figure
def spec_formula() -> Figure:
    """E[tokens per step] = (1 − α^(k+1)) / (1 − α) and the speed-up / (k c + 1), from
    minillm.speculative.expected_tokens_per_step / expected_speedup."""
    import numpy as np

    from minillm.speculative import expected_speedup, expected_tokens_per_step
    ks = np.arange(1, 13)
    fig, (a1, a2) = new_figure(11, 4.2, nrows=1, ncols=2)
    for alpha, color in ((0.5, ORANGE), (0.7, BLUE), (0.8, GREEN), (0.9, PURPLE)):
        a1.plot(ks, [expected_tokens_per_step(alpha, k) for k in ks], "o-", ms=3, color=color,
                label=f"α = {alpha}")
        a1.axhline(1 / (1 - alpha), color=color, lw=0.8, ls=":")
    a1.set_xlabel("k (draft tokens per step)")
    a1.set_ylabel("E[tokens per target pass]")
    a1.set_title("saturates at 1 / (1 − α) (dotted)", fontsize=11)
    a1.legend()
    style_axes(a1)
    for c, color in ((0.0, GREY), (0.05, GREEN), (0.1, BLUE), (0.3, RED)):
        a2.plot(ks, [expected_speedup(0.8, k, c) for k in ks], "o-", ms=3, color=color,
                label=f"c = {c}")
    a2.axhline(1, color="black", lw=0.8)
    a2.set_xlabel("k")
    a2.set_ylabel("speed-up over the target alone")
    a2.set_title("α = 0.8: an expensive draft wants a short k", fontsize=11)
    a2.legend()
    style_axes(a2)
    return fig


@figure
def spec_counted() -> Figure:
    """Counted (not timed) on the shipped models, greedy, 64 new tokens after SPEC_PROMPT:
    acceptance rate α (accepted / judged drafts) and tokens per target pass for k = 1..6 with
    minillm.speculative.speculative_generate, against the formula with each k's α; prompt lookup
    on minillm.bench.speculative.repetitive_prompt (96 tokens) for comparison."""
    from minillm.bench.speculative import repetitive_prompt
    from minillm.sampling import SamplingParams
    from minillm.speculative import (
        ModelDrafter,
        PromptLookupDrafter,
        expected_tokens_per_step,
        speculative_generate,
    )
    target, tok = model_and_tokenizer()
    drafter, prompt = ModelDrafter(_draft_model()), tok.encode(SPEC_PROMPT)
    ks = list(range(1, 7))
    stats = [speculative_generate(target, drafter, prompt, k,
                                  SamplingParams(temperature=0, max_new_tokens=64))[1] for k in ks]
    looker = PromptLookupDrafter(target.config.vocab_size)
    look = [speculative_generate(target, looker, repetitive_prompt(tok), k,
                                 SamplingParams(temperature=0, max_new_tokens=96))[1] for k in ks]
    fig, (a1, a2) = new_figure(11, 4.2, nrows=1, ncols=2)
    a1.plot(ks, [s.tokens_per_step for s in stats], "o", ms=8, color=BLUE,
            label="draft model: counted")
    a1.plot(ks, [expected_tokens_per_step(s.alpha, k) for s, k in zip(stats, ks)], "x--",
            color=BLUE, label="draft model: formula with its α")
    a1.plot(ks, [s.tokens_per_step for s in look], "s", ms=7, color=ORANGE,
            label="prompt lookup (repetitive prompt): counted")
    a1.plot(ks, [k + 1 for k in ks], ":", color=GREY, label="k + 1")
    a1.set_xlabel("k")
    a1.set_ylabel("tokens per target pass")
    a1.legend(fontsize=9)
    style_axes(a1)
    a2.plot(ks, [s.alpha for s in stats], "o-", color=BLUE, label="draft model")
    a2.plot(ks, [s.alpha for s in look], "s-", color=ORANGE, label="prompt lookup")
    a2.set_ylim(0, 1)
    a2.set_xlabel("k")
    a2.set_ylabel("α = accepted / judged drafts")
    a2.legend()
    style_axes(a2)
    return fig


@figure
def spec_verify_cost() -> Figure:
    """Napkin cost of one pass over T = k + 1 tokens relative to one decode step,
    v = max(2·P·T / peak, bytes / bandwidth) / max(2·P / peak, bytes / bandwidth), for an H100
    (bf16, minillm.roofline preset) and an illustrative CPU core (fp32, 40 GFLOP/s achieved,
    20 GB/s); and the speed-up at α = 0.8, c = 0.1 that each v allows."""
    import numpy as np

    from minillm import roofline as rf
    from minillm.speculative import expected_speedup
    h100 = rf.get_hardware("h100")
    P = 12.2e6
    machines = [("H100, bf16", h100.flops_per_s, h100.mem_bandwidth_bytes_per_s, 2, BLUE),
                ("a CPU core, fp32 (40 GFLOP/s, 20 GB/s)", 40e9, 20e9, 4, RED)]
    ks = np.arange(0, 16)
    fig, (a1, a2) = new_figure(11, 4.2, nrows=1, ncols=2)
    for name, peak, bw, nbytes, color in machines:
        step = max(2 * P / peak, nbytes * P / bw)
        v = np.array([max(2 * P * (k + 1) / peak, nbytes * P / bw) / step for k in ks])
        a1.plot(ks + 1, v, "o-", ms=3, color=color, label=name)
        a2.plot(ks[1:], [expected_speedup(0.8, int(k), 0.1, float(vk))
                         for k, vk in zip(ks[1:], v[1:])], "o-", ms=3, color=color, label=name)
    a1.set_xlabel("tokens scored in one pass (k + 1)")
    a1.set_ylabel("v: cost / one decode step")
    a1.set_title("checking is free only below the ridge point", fontsize=11)
    a1.legend(fontsize=9)
    style_axes(a1)
    a2.axhline(1, color="black", lw=0.8)
    a2.set_xlabel("k")
    a2.set_ylabel("speed-up, α = 0.8, c = 0.1")
    a2.set_title("E[tokens] / (k c + v)", fontsize=11)
    a2.legend(fontsize=9)
    style_axes(a2)
    return fig


@figure
def spec_lookup() -> str:
    """Prompt lookup on the shipped target's own greedy output after the repetitive prompt: the
    last 3 tokens, their latest earlier occurrence and the proposal
    (minillm.speculative.prompt_lookup)."""
    from minillm.bench.speculative import repetitive_prompt
    from minillm.generate import generate_cached
    from minillm.sampling import SamplingParams
    from minillm.speculative import prompt_lookup
    target, tok = model_and_tokenizer()
    prompt = repetitive_prompt(tok)
    full = prompt + generate_cached(target, prompt, SamplingParams(temperature=0,
                                                                   max_new_tokens=60))[0]
    k = 6

    def agreed(t, proposal):
        n = 0
        while n < len(proposal) and t + n < len(full) and proposal[n] == full[t + n]:
            n += 1
        return n
    for t in range(len(prompt) + 12, len(full)):     # the first 3-gram match that pays off
        ctx = full[:t]
        tail = ctx[-3:]
        starts = [s for s in range(len(ctx) - 4, -1, -1) if ctx[s:s + 3] == tail]
        proposal = prompt_lookup(ctx, k, 3)
        if starts and len(proposal) == k and agreed(t, proposal) >= 3:
            s = starts[0]
            break
    n_ok = agreed(t, proposal)
    shown = ctx[max(0, s - 12):]
    off = s - max(0, s - 12)
    chips = []
    for j, t in enumerate(shown):
        if off <= j < off + 3 or j >= len(shown) - 3:
            style = "background:#cfe3f3"
        elif off + 3 <= j < off + 3 + len(proposal):
            style = "background:#d8f0e6"
        else:
            style = ""
        chips.append(_tok_chips(tok, [t], style))
    return (f'<div class="tokens">{"".join(chips)}</div><p class="small">blue: the last 3 tokens '
            f"and their latest earlier occurrence; green: the {len(proposal)} tokens that "
            f"followed it &mdash; the proposal, at zero cost: "
            f"{html.escape(repr(tok.decode(proposal)))}; the target's greedy continuation "
            f"agrees with the first {n_ok}</p>")
