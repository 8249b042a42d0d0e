"""Figures for the deck of lab 06: continuous batching (slides/06_continuous_batching.md)."""
from __future__ import annotations

import matplotlib
from matplotlib.figure import Figure

from .common import BLUE, GREEN, ORANGE, RED, SKY, figure, html_table, new_figure, style_axes

# Counts only: the seeded trace (minillm.serving.trace), the two schedules
# (minillm.serving.simulate) and exact slot counts; no timing.

def _lab06_trace():
    """The notebook's measurement trace: 48 requests at 400/s, prompts median 12 (sigma 1,
    <= 64), outputs median 8 (sigma 1.3, <= 64)."""
    from minillm.serving.trace import make_trace
    return make_trace(48, rate=400.0, seed=0, prompt_median=12, prompt_sigma=1.0, prompt_max=64,
                      output_median=8, output_sigma=1.3, output_max=64)


@figure
def serving_workload() -> Figure:
    """Poisson arrivals of the lab trace and 5000 log-normal output lengths
    (minillm.serving.trace.poisson_arrivals / lognormal_lengths, seeded)."""
    import numpy as np
    import torch

    from minillm.serving.trace import lognormal_lengths
    trace = _lab06_trace()
    many = lognormal_lengths(5000, 8, 1.3, 64, torch.Generator().manual_seed(3))
    fig, (ax1, ax2) = new_figure(11, 4.0, nrows=1, ncols=2)
    ax1.step([r.arrival_time * 1e3 for r in trace], range(1, len(trace) + 1), where="post",
             color=BLUE)
    ax1.set_xlabel("arrival time (ms)")
    ax1.set_ylabel("requests arrived")
    ax1.set_title("Poisson arrivals, 400 per second: gaps ~ Exp(λ)")
    ax2.hist(many, bins=np.arange(0.5, 65.5, 1.0), color=BLUE)
    ax2.axvline(np.median(many), color=RED, ls=":", label=f"median {np.median(many):.0f}")
    ax2.axvline(np.mean(many), color="k", ls="--", label=f"mean {np.mean(many):.1f}")
    ax2.axvline(np.percentile(many, 90), color=ORANGE, ls="-.",
                label=f"p90 {np.percentile(many, 90):.0f}")
    ax2.set_xlabel("output length (tokens)")
    ax2.set_title("log-normal lengths: median 8, σ = 1.3, clipped at 64")
    ax2.legend(fontsize=10)
    for ax in (ax1, ax2):
        style_axes(ax)
    return fig


@figure
def batching_timelines() -> Figure:
    """Who produces a token in which step, for the lab trace's output lengths, max_batch 12:
    minillm.serving.simulate.simulate_static vs simulate_continuous."""
    from minillm.serving.simulate import simulate_continuous, simulate_static
    outs = [r.max_new_tokens for r in _lab06_trace()]
    fig, axes = new_figure(11, 4.2, nrows=1, ncols=2, sharey=True)
    for ax, name, tl in ((axes[0], "static", simulate_static(outs, 12)),
                         (axes[1], "continuous (iteration-level)", simulate_continuous(outs, 12))):
        xs = [s for s, ids in enumerate(tl) for _ in ids]
        ys = [i for ids in tl for i in ids]
        ax.scatter(xs, ys, s=4, marker="s", color=BLUE, linewidths=0)
        busy = sum(len(ids) for ids in tl) / (12 * len(tl))
        ax.set_title(f"{name}: {len(tl)} steps, {100 * busy:.0f} % of seats busy")
        ax.set_xlabel("step")
        style_axes(ax, grid=False)
    axes[0].set_ylabel("request (queue order)")
    axes[0].invert_yaxis()
    return fig


@figure
def static_waste() -> Figure:
    """Decode slots computed / useful tokens of a static batch of B log-normal answers
    (median 8, clipped at 64): B * max(O) / sum(O), 2000 seeded batches per point."""
    import numpy as np
    import torch

    from minillm.serving.trace import lognormal_lengths
    sizes = [1, 2, 4, 8, 16, 32, 64]
    fig, ax = new_figure(6.4, 4.0)
    for sigma, color in ((0.5, SKY), (1.0, BLUE), (1.3, RED)):
        g = torch.Generator().manual_seed(4)
        w = []
        for B in sizes:
            L = np.array(lognormal_lengths(2000 * B, 8, sigma, 64, g)).reshape(2000, B)
            w.append((B * L.max(1)).sum() / L.sum())
        ax.plot(sizes, w, "o-", color=color, label=f"σ = {sigma}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(b) for b in sizes])
    ax.set_xlabel("batch size B")
    ax.set_ylabel("slots computed / useful")
    ax.set_title("static batching runs every row to the longest")
    ax.legend()
    style_axes(ax)
    return fig


@figure
def selective_batching() -> Figure:
    """Three prompts of 3, 9 and 5 tokens: the padded [3, 9] rectangle (27 slots) vs one
    flattened row of 17 tokens; attention per sequence = a block-diagonal causal mask."""
    import numpy as np
    from matplotlib.patches import Rectangle
    lens, colors = [3, 9, 5], [BLUE, ORANGE, GREEN]
    fig, (ax1, ax2, ax3) = new_figure(12, 3.8, nrows=1, ncols=3,
                                      gridspec_kw={"width_ratios": [1, 1.9, 1.1]})
    P = max(lens)
    for r, n in enumerate(lens):                          # padded rectangle, left padding
        for c in range(P):
            pad = c < P - n
            ax1.add_patch(Rectangle((c, -r), 0.92, 0.85,
                                    color="#dddddd" if pad else colors[r]))
    ax1.set_xlim(-0.2, P + 0.2)
    ax1.set_ylim(-len(lens) + 0.7, 1.1)
    ax1.set_title(f"static: pad to [{len(lens)}, {P}]\n{len(lens) * P} slots, "
                  f"{len(lens) * P - sum(lens)} of them padding")
    ax1.axis("off")
    x = 0
    for r, n in enumerate(lens):                          # the flattened row
        for _ in range(n):
            ax2.add_patch(Rectangle((x * 0.55, 0), 0.5, 0.85, color=colors[r]))
            x += 1
    ax2.set_xlim(-0.2, sum(lens) * 0.55 + 0.2)
    ax2.set_ylim(-1.5, 2.2)
    ax2.set_title(f"selective: one row of {sum(lens)} tokens [3 + 9 + 5, D]\n"
                  "norms, projections, MLP: one matmul")
    ax2.axis("off")
    T = sum(lens)                                         # block-diagonal causal mask
    mask = np.zeros((T, T, 3)) + 1.0
    a = 0
    for r, n in enumerate(lens):
        rgb = matplotlib.colors.to_rgb(colors[r])
        for i in range(n):
            mask[a + i, a:a + i + 1] = rgb
        a += n
    ax3.imshow(mask, interpolation="nearest")
    ax3.set_title("attention: each sequence\nsees only its own past")
    ax3.set_xlabel("key")
    ax3.set_ylabel("query")
    ax3.set_xticks([])
    ax3.set_yticks([])
    return fig


@figure
def batching_counts() -> str:
    """Exact work of the two schedules (minillm.serving.simulate) for the notebook trace and
    for `minillm bench batching`'s default trace (minillm.bench.batching.TRACE, 128 requests,
    max_batch 32), with the two napkin speed-ups they imply."""
    from minillm.bench.batching import TRACE
    from minillm.serving.simulate import simulate_continuous, simulate_static, static_slots
    from minillm.serving.trace import make_trace
    rows = []
    for name, trace, B in (("lab notebook: 48 requests, B = 12", _lab06_trace(), 12),
                           ("bench batching: 128 requests, B = 32",
                            make_trace(128, 200.0, 0, **TRACE), 32)):
        P = [len(r.prompt_ids) for r in trace]
        O = [r.max_new_tokens for r in trace]
        s_steps, c_steps = len(simulate_static(O, B)), len(simulate_continuous(O, B))
        slots = sum(static_slots(P[a:a + B], O[a:a + B])[0] for a in range(0, len(P), B))
        tokens = sum(P) + sum(o - 1 for o in O)
        rows.append([name, f"{s_steps} / {c_steps}", f"{slots} / {tokens}",
                     f"{s_steps / c_steps:.1f}×", f"{slots / tokens:.1f}×"])
    return html_table(["trace", "steps static / continuous", "token slots / tokens",
                   "speed-up if steps cost the same", "speed-up if cost ∝ tokens"], rows)
