"""Figures for the deck of lab 02: the KV cache (slides/02_kv_cache.md)."""
from __future__ import annotations

from matplotlib.figure import Figure

from .common import (
    BLUE,
    GREEN,
    GREY,
    ORANGE,
    PURPLE,
    RED,
    figure,
    html_table,
    model_and_tokenizer,
    new_figure,
    style_axes,
)


@figure
def cached_work() -> Figure:
    """Tokens through the model per step and in total, naive loop vs KV-cached loop, counted on
    the shipped model (minillm.bench.timing.WorkCounter around minillm.generate.stream_naive/stream_cached),
    and the ratio of the two totals from the closed forms."""
    import numpy as np
    import torch

    from minillm.bench.timing import WorkCounter
    from minillm.generate import stream_cached, stream_naive
    from minillm.sampling import SamplingParams
    model, _ = model_and_tokenizer()
    P, N = 8, 32
    prompt = list(range(1, P + 1))
    counted = {}
    for name, stream in (("naive", stream_naive), ("cached", stream_cached)):
        per_step = []
        with WorkCounter(model) as wc, torch.no_grad():
            for _ in stream(model, prompt, SamplingParams(temperature=0, max_new_tokens=N)):
                per_step.append(wc.tokens - sum(per_step))
        counted[name] = np.array(per_step)
    fig, (a1, a2) = new_figure(11, 4.2, nrows=1, ncols=2)
    steps = np.arange(N)
    a1.bar(steps - 0.2, counted["naive"], 0.4, color=ORANGE, label="naive: P + t tokens")
    a1.bar(steps + 0.2, counted["cached"], 0.4, color=BLUE, label="cached: P, then 1 per step")
    a1.set_xlabel(f"step t (prompt P = {P})")
    a1.set_ylabel("tokens through the model in this step")
    a1.set_title("counted on the shipped model (WorkCounter)")
    a1.legend()
    style_axes(a1)
    n = np.unique(np.logspace(0, np.log10(4096), 80).astype(int))
    for p, color in ((8, BLUE), (128, GREEN), (1024, PURPLE)):
        naive = n * p + n * (n - 1) / 2
        cached = p + n - 1
        a2.loglog(n, naive / cached, color=color, label=f"prompt P = {p}")
    a2.set_xlabel("new tokens n")
    a2.set_ylabel("naive tokens / cached tokens")
    a2.set_title("(nP + n(n−1)/2) / (P + n − 1): grows linearly with n")
    a2.legend()
    style_axes(a2)
    return fig


@figure
def kv_layout() -> Figure:
    """What a static cache holds: per layer a [B, K, max_len, H] key and value tensor, filled up
    to seq_len, drawn from a real minillm KVCache after a 6-token prefill and 2 decode steps."""
    import torch
    from matplotlib.patches import Rectangle

    from minillm.kvcache import KVCache
    model, _ = model_and_tokenizer()
    cache = KVCache.for_model(model, 1, 12)
    with torch.no_grad():
        model(torch.arange(1, 7)[None], cache=cache)                 # prefill: 6 positions
        for t in (7, 8):
            model(torch.tensor([[t]]), cache=cache)                  # two decode steps
    held, slots = cache.seq_len, cache.max_len
    fig, ax = new_figure(10, 3.6)
    rows = [("layer 0 keys", 0), ("layer 0 values", 1), ("…", None),
            (f"layer {len(cache.k) - 1} keys", 3), (f"layer {len(cache.k) - 1} values", 4)]
    for label, y in rows:
        if y is None:
            ax.text(slots / 2, -2 + 0.5, "⋮", ha="center", va="center", fontsize=16)
            continue
        for s in range(slots):
            if s < 6:
                color = ORANGE
            elif s < held:
                color = BLUE
            elif s == held:
                color = GREEN
            else:
                color = "#eeeeee"
            ax.add_patch(Rectangle((s, -y), 0.92, 0.8, color=color))
        ax.text(-0.3, -y + 0.4, label, ha="right", va="center", fontsize=11)
    ax.annotate(f"seq_len = {held}: the next write", (held + 0.46, 0.85),
                xytext=(held + 2.2, 1.55), ha="center", arrowprops={"arrowstyle": "->"},
                fontsize=11)
    ax.text(3, 1.1, "prefill (6 positions)", ha="center", fontsize=11, color=ORANGE)
    ax.text(7, 1.1, "decode", ha="center", fontsize=11, color=BLUE)
    ax.text(slots - 0.5, -4.9, f"max_len = {slots}: allocated once", ha="right", fontsize=11,
            color=GREY)
    ax.set_xlim(-4.5, slots + 1.5)
    ax.set_ylim(-5.2, 2.1)
    ax.axis("off")
    ax.set_title(f"each square: one position, [B, K, H] = [{cache.batch_size}, "
                 f"{cache.k[0].shape[1]}, {cache.k[0].shape[3]}] numbers; update returns a view "
                 f"of slots 0 … seq_len + T − 1", fontsize=11)
    return fig


@figure
def kv_size_table() -> str:
    """KV cache per token and per sequence for the shipped models and real presets (bf16),
    from ModelConfig.kv_bytes_per_token and minillm.roofline.lecture_num_params."""
    from minillm import roofline as rf
    from minillm.config import PRESETS, SHIPPED_SHAPES
    rows = []
    models = [("minillm target", SHIPPED_SHAPES["target"]), ("Llama-2-7B", PRESETS["llama-2-7b"]),
              ("Llama-2-13B", PRESETS["llama-2-13b"]), ("Llama-3-8B", PRESETS["llama-3-8b"])]
    for name, c in models:
        per_tok = c.kv_bytes_per_token(2)
        S = min(4096, c.max_seq_len)
        weights = 2 * rf.lecture_num_params(c)
        seq = per_tok * S
        seq_txt = f"{seq / 1e9:.2f} GB" if seq >= 1e9 else f"{seq / 1e6:.0f} MB"
        rows.append([name, f"{c.n_layers}", f"{c.n_kv_heads} / {c.n_heads}", f"{c.head_dim}",
                     f"{per_tok / 1024:,.0f} KiB", f"{S}", seq_txt,
                     f"{per_tok * S / weights:.0%}"])
    return html_table(["model", "L", "K / N heads", "H", "per token", "S", "per sequence",
                   "of the weights"], rows)


@figure
def kv_batch_vs_context() -> Figure:
    """How many sequences fit next to the weights on an 80 GB H100 (bf16), against the context
    length: minillm.roofline.max_batch_that_fits for three presets."""
    import numpy as np

    from minillm import roofline as rf
    S = np.unique(np.logspace(np.log10(256), np.log10(32768), 40).astype(int))
    fig, ax = new_figure(9, 4.4)
    for name, label, color in (("llama-2-7b", "Llama-2-7B (K = 32)", BLUE),
                               ("llama-2-13b", "Llama-2-13B (K = 40)", ORANGE),
                               ("llama-3-8b", "Llama-3-8B (K = 8, GQA)", GREEN)):
        b = [rf.max_batch_that_fits(name, "h100", int(s)) for s in S]
        ax.loglog(S, np.maximum(b, 0.5), "-", color=color, lw=2, label=label)
    ax.axhline(1, color=GREY, lw=1, ls=":")
    ax.set_xlabel("context length S (tokens per sequence)")
    ax.set_ylabel("sequences that fit (B)")
    ax.set_title("memory = B · S·K·H·L·2·2 + weights ≤ 80 GB")
    ax.legend()
    style_axes(ax)
    return fig


@figure
def tokens_per_pass() -> Figure:
    """Napkin time per token of one forward pass of Llama-2-13B on an H100 against the number of
    tokens it processes together (prefill: T = prompt length; decode: B sequences), weights only:
    max(2·params·n / peak, 2·params / bandwidth) / n."""
    import numpy as np

    from minillm import roofline as rf
    hw = rf.get_hardware("h100")
    params = rf.lecture_num_params("llama-2-13b")
    n = np.logspace(0, 4, 200)
    t = np.maximum(2 * params * n / hw.flops_per_s, 2 * params / hw.mem_bandwidth_bytes_per_s)
    ridge = rf.accelerator_intensity(hw)
    fig, ax = new_figure(9, 4.4)
    ax.loglog(n, t / n * 1e3, color=BLUE, lw=2.5)
    ax.axvline(ridge, color=RED, lw=1)
    ax.text(ridge * 1.1, t[0] * 0.6e3, f"ridge ≈ {ridge:.0f} tokens", color=RED, fontsize=11)
    ax.text(1.3, 0.04, "memory-bound:\nevery token shares\none read of the\n26 GB of weights",
            fontsize=11)
    ax.text(ridge * 1.6, 0.06, "compute-bound:\n2·params FLOPs per token", fontsize=11)
    ax.annotate("one decode step, B = 1", (1, t[0] * 1e3), xytext=(6, t[0] * 1.2e3),
                arrowprops={"arrowstyle": "->"}, fontsize=11)
    ax.annotate("prefill of a 1000-token prompt", (1000, t[np.searchsorted(n, 1000)] / 1000 * 1e3),
                xytext=(40, 0.013), arrowprops={"arrowstyle": "->"}, fontsize=11)
    ax.set_ylim(0.01, 20)
    ax.set_xlabel("tokens in one forward pass (prompt length, or B sequences × 1)")
    ax.set_ylabel("ms per token (napkin)")
    ax.set_title("Llama-2-13B on an H100, bf16 weights (attention and KV reads left out)")
    style_axes(ax)
    return fig
