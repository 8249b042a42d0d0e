"""Figures for the deck of lab 09: beyond attention (slides/09_beyond_attention.md).

Computed with minillm.linear_attention and minillm.roofline on the shipped checkpoints (counts and
napkin math); the recall curves and the diffusion trade-off plot the seeded runs
benchmarks/RESULTS.md records (minillm.recall's trainings and minillm.diffusion's samples). No
timing: the deck's speed statements are the lab's measured ranges, in the text."""
from __future__ import annotations

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
    recorded_row,
    style_axes,
)

CONTEXTS = [256, 1024, 2048, 4096, 8192]


@figure
def linear_forms() -> str:
    """The three forms of one linear-attention head (H = 64): work per token and what decode keeps."""
    from minillm.linear_attention import flops_per_token, state_bytes
    H, T, C = 64, 4096, 64
    rows = [["parallel (training)", "T × T matrix, like attention",
             f"{flops_per_token(1, H, 'parallel', T):,}", "—"],
            ["recurrent (decode)", "S ← gS + φ(k)vᵀ, read φ(q)ᵀS",
             f"{flops_per_token(1, H, 'recurrent'):,}", f"{state_bytes(1, H, 2):,} B"],
            ["chunked (kernels)", f"parallel in chunks of {C}, state between",
             f"{flops_per_token(1, H, 'chunked', T, C):,}", "—"],
            ["softmax attention decode", "q·k and p·v over the KV cache",
             f"{4 * H * T:,}", f"{2 * H * T * 2:,} B"]]
    return html_table(["form", "what it computes", f"FLOPs per token (T = {T})",
                       "decode state (bf16)"], rows)


@figure
def state_vs_context() -> Figure:
    """Decode state per sequence (fp32, as the lab's caches hold it) of the target and the
    hybrid against the context, from minillm.bench.decode_memory.filled_cache."""
    import minillm
    from minillm.bench.decode_memory import filled_cache
    target, _ = model_and_tokenizer()
    hybrid = minillm.load("hybrid")
    fig, ax = new_figure(7.5, 3.8)
    for name, m, col in [("target: 6 attention layers", target, BLUE),
                         ("hybrid: 1 attention + 7 linear", hybrid, GREEN)]:
        ax.plot(CONTEXTS, [filled_cache(m, S).nbytes / 2**20 for S in CONTEXTS], "o-", color=col,
                label=name)
    ax.axhline(4 * target.num_params() / 2**20, color=GREY, ls=":", label="target's weights (fp32)")
    ax.set_xlabel("context S (tokens)")
    ax.set_ylabel("decode state (MiB)")
    ax.legend(fontsize=9)
    style_axes(ax)
    return fig


@figure
def llama_hybrid_batch() -> str:
    """Largest batch on an 80 GB H100 (bf16): Llama-2-13B against the same model with 35 of
    its 40 layers linear (one attention layer in 8), minillm.roofline.max_batch_that_fits."""
    from dataclasses import replace

    from minillm import roofline
    from minillm.config import PRESETS
    llama = PRESETS["llama-2-13b"]
    hyb = replace(llama, mixers=tuple("attention" if i % 8 == 7 else "linear" for i in range(40)))
    rows = []
    for S in (1000, 4096, 16384, 65536):
        rows.append([f"{S:,}", f"{roofline.kv_cache_bytes_per_seq(llama, S) / 1e9:.2f} GB",
                     str(roofline.max_batch_that_fits(llama, "h100", S)),
                     f"{roofline.kv_cache_bytes_per_seq(hyb, S) / 1e9:.3f} GB",
                     str(roofline.max_batch_that_fits(hyb, "h100", S))])
    return html_table(["S", "Llama-2-13B state", "max B", "1-in-8 hybrid state", "max B"], rows)


SECTION = "Beyond attention: a hybrid and a diffusion model"      # in benchmarks/RESULTS.md


@figure
def recall_curves() -> Figure:
    """MQAR accuracy against the number of pairs for one-layer models of width 64 trained as in
    the lab (minillm.recall, 400 steps, seed 0): the run benchmarks/RESULTS.md records (four
    trainings: too slow to repeat for every build)."""
    ns = [4, 8, 16, 32, 64]
    acc = {name: [float(x) for x in recorded_row(SECTION, label)]
           for name, label in (("attention", "softmax attention"),
                               ("linear, H = 64", "linear, H = 64"),
                               ("linear, H = 16", "linear, H = 16"))}
    fig, ax = new_figure(7.5, 3.8)
    for (name, a), col in zip(acc.items(), [BLUE, GREEN, ORANGE]):
        ax.plot(ns, a, "o-", color=col, label=name)
    ax.set_xscale("log", base=2)
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("key-value pairs N")
    ax.set_ylabel("recall accuracy")
    ax.legend(fontsize=9)
    style_axes(ax)
    return fig


@figure
def diffusion_tradeoff() -> Figure:
    """Judge perplexity (under the target, median of three prompts) of 64 tokens written by the
    shipped diffusion model as in the lab (temperature 0.7, blocks of 16, confidence order, seeds
    0..2), against tokens per forward pass; the target's own samples at the same temperature.
    The seeded run benchmarks/RESULTS.md records, which tests/test_lab_measurements.py repeats."""
    import statistics
    steps = [64, 32, 16, 8, 4]
    cells = [[int(x) for x in c.split(", ")]
             for c in recorded_row(SECTION, "judge perplexity, 3 prompts")]
    ppl, ar = dict(zip(steps, cells[:5])), cells[5]
    fig, ax = new_figure(7.5, 3.8)
    ax.plot([64 / s for s in steps], [statistics.median(ppl[s]) for s in steps], "o-", color=BLUE,
            label="diffusion (confidence order, T = 0.7, blocks of 16)")
    ax.axhline(statistics.median(ar), color=ORANGE, ls="--", label="target, autoregressive, T = 0.7")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("tokens per forward pass")
    ax.set_ylabel("perplexity under the target")
    ax.legend(fontsize=8)
    style_axes(ax)
    return fig
