"""Figures for the deck of lab 03: shrinking the KV cache (slides/03_shrinking_kv.md)."""
from __future__ import annotations

import functools

from matplotlib.figure import Figure

from .common import (
    BLUE,
    GREEN,
    GREY,
    ORANGE,
    PURPLE,
    RED,
    SKY,
    figure,
    html_table,
    model_and_tokenizer,
    new_figure,
    style_axes,
)


def _llama_layouts() -> dict:
    """Llama-2-13B-shaped cache layouts (40 layers, 40 query heads of 128) as KVSpec lists; MLA
    in DeepSeek-V2's proportions (C = 4H = 512, R = H/2 = 64)."""
    from minillm.kvcache import KVSpec
    L, N, H = 40, 40, 128
    return {
        "MHA, K = 40": [KVSpec(N, H, H)] * L,
        "GQA, K = 8": [KVSpec(8, H, H)] * L,
        "MQA, K = 1": [KVSpec(1, H, H)] * L,
        "MLA, C + R = 512 + 64": [KVSpec(1, 4 * H, H // 2)] * L,
        "CLA share 2, K = 8": [KVSpec(8, H, H), None] * (L // 2),
        "1 global in 6 (w = 1024), K = 8": [KVSpec(8, H, H, None if (i + 1) % 6 == 0 else 1024)
                                            for i in range(L)],
    }


@figure
def kv_variants_table() -> str:
    """Cache per token and per 4096-token sequence for Llama-2-13B-shaped layouts, from
    minillm.kvcache.kv_bytes_per_token (bf16; local layers amortised over the sequence)."""
    from minillm.kvcache import kv_bytes_per_token
    S = 4096
    layouts = _llama_layouts()
    mha = kv_bytes_per_token(layouts["MHA, K = 40"], 2, S)
    rows = []
    for name, specs in layouts.items():
        per_tok = kv_bytes_per_token(specs, 2, S)
        stored = [s for s in specs if s is not None]
        per_layer = stored[0].elems_per_token()
        rows.append([name, f"{per_layer:,}", f"{len(stored)} of {len(specs)}",
                     f"{per_tok / 1024:,.0f} KiB", f"{per_tok * S / 1e9:.2f} GB",
                     f"<b>{mha / per_tok:.0f}×</b>"])
    return html_table(["layout (Llama-2-13B shape)", "numbers / token / layer", "layers storing",
                   "per token", f"per {S}-token sequence", "smaller"], rows)


@figure
def gqa_groups() -> Figure:
    """Which KV head each query head reads for N = 6 and K = 6, 3, 2, 1: KV head j is repeated
    G = N / K times (minillm.model.attend's repeat_interleave), so groups are consecutive."""
    import torch
    from matplotlib.patches import FancyBboxPatch
    N = 6
    fig, axes = new_figure(11, 3.0, nrows=1, ncols=4)
    for ax, K in zip(axes, (6, 3, 2, 1)):
        reads = torch.arange(K).repeat_interleave(N // K).tolist()    # KV head of query head h
        for h in range(N):
            ax.add_patch(FancyBboxPatch((h - 0.35, 1.6), 0.7, 0.5, boxstyle="round,pad=0.02",
                                        color=BLUE))
            ax.text(h, 1.85, f"q{h}", ha="center", va="center", color="white", fontsize=10)
        x_kv = [(N - 1) / 2] if K == 1 else [j * (N - 1) / (K - 1) for j in range(K)]
        for j, x in enumerate(x_kv):
            ax.add_patch(FancyBboxPatch((x - 0.35, 0.0), 0.7, 0.5, boxstyle="round,pad=0.02",
                                        color=ORANGE))
            ax.text(x, 0.25, f"kv{j}", ha="center", va="center", color="white", fontsize=10)
        for h, j in enumerate(reads):
            ax.plot([h, x_kv[j]], [1.6, 0.5], color=GREY, lw=1)
        name = "MHA" if K == N else "MQA" if K == 1 else "GQA"
        ax.set_title(f"{name}: K = {K}, groups of {N // K}\ncache ×{K / N:.2f}")
        ax.set_xlim(-0.6, N - 0.4)
        ax.set_ylim(-0.2, 2.3)
        ax.axis("off")
    return fig


@figure
def mla_cache_sizes() -> Figure:
    """Numbers cached per token per layer at DeepSeek-V2's attention shape (N = 128 heads of
    H = 128): KVSpec.elems_per_token for MHA, GQA, MQA and MLA (C = 512, R = 64)."""
    from minillm.kvcache import KVSpec
    N, H = 128, 128
    specs = [("MHA", KVSpec(N, H, H)), ("GQA, K = 8", KVSpec(8, H, H)),
             ("MQA, K = 1", KVSpec(1, H, H)), ("MLA, 512 + 64", KVSpec(1, 512, 64))]
    vals = [s.elems_per_token() for _, s in specs]
    fig, ax = new_figure(7.5, 4.0)
    bars = ax.barh(range(len(specs)), vals, color=[GREY, BLUE, SKY, ORANGE])
    for b, v in zip(bars, vals):
        ax.text(v * 1.15, b.get_y() + b.get_height() / 2, f"{v:,}  ({vals[0] / v:.0f}× smaller)"
                if v != vals[0] else f"{v:,}", va="center", fontsize=11)
    ax.set_yticks(range(len(specs)), [n for n, _ in specs])
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlim(100, vals[0] * 12)
    ax.set_xlabel("numbers cached per token and layer (log scale)")
    ax.set_title(f"DeepSeek-V2's attention shape: {N} heads of {H}")
    style_axes(ax, grid=False)
    return fig


@figure
def mla_flops() -> Figure:
    """FLOPs of one MLA decode step, naive (expand every cached latent) vs absorbed (attend in
    latent space), counted by torch's FlopCounterMode on the lab's two reference functions
    (MLAAttention's two attention paths, minillm/attention/mla.py) at the shipped model's shape
    (N = 6, H = 64, R = 32, C = 224), one query per sequence."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from minillm.attention.mla import MLAAttention
    from minillm.config import ModelConfig
    torch.manual_seed(0)
    attn = MLAAttention(ModelConfig(dim=384, n_heads=6, head_dim=64), 0, latent_dim=224,
                        rope_dim=32).eval()
    seqs = [64, 128, 256, 512, 1024, 2048, 4096]
    counts = {"naive": [], "absorbed": []}
    for S in seqs:
        g = torch.Generator().manual_seed(S)
        q_nope, q_rope = torch.randn(1, 6, 1, 32, generator=g), torch.randn(1, 6, 1, 32, generator=g)
        c, k_rope = torch.randn(1, 1, S, 224, generator=g), torch.randn(1, 1, S, 32, generator=g)
        pos = (torch.tensor([S - 1]), torch.arange(S))
        for name, fn in (("naive", attn.attend_naive), ("absorbed", attn.attend_absorbed)):
            with torch.no_grad(), FlopCounterMode(display=False) as fc:
                fn(q_nope, q_rope, c, k_rope, *pos)
            counts[name].append(fc.get_total_flops())
    fig, (a1, a2) = new_figure(11, 4.0, nrows=1, ncols=2)
    a1.loglog(seqs, counts["naive"], "o-", color=RED, label="naive: up-project K and V for every s")
    a1.loglog(seqs, counts["absorbed"], "s-", color=GREEN, label="absorbed: attend to the latents")
    a1.set_xlabel("cached positions S")
    a1.set_ylabel("FLOPs per decode step (one layer)")
    a1.legend()
    style_axes(a1)
    ratio = [n / a for n, a in zip(counts["naive"], counts["absorbed"])]
    a2.semilogx(seqs, ratio, "o-", color=BLUE)
    a2.set_ylim(0, max(ratio) * 1.15)
    a2.set_xlabel("cached positions S")
    a2.set_ylabel("naive FLOPs / absorbed FLOPs")
    a2.set_title("counted by torch's FlopCounterMode")
    style_axes(a2)
    return fig


@functools.lru_cache(maxsize=1)
def _shipped_layouts() -> dict:
    """The shipped target converted to the lab's cache layouts (no training)."""
    from minillm.attention import to_cla, to_gqa, to_mla, to_sliding
    model, _ = model_and_tokenizer()
    return {
        "MHA": model,
        "GQA, K = 2": to_gqa(model, 2),
        "MLA, C = 96": to_mla(model, 96),
        "CLA, share 2": to_cla(model, 2),
        "1 global in 6, w = 128": to_sliding(model, 128, global_every=6),
        "1 global in 6 + MQA": to_gqa(to_sliding(model, 128, global_every=6), 1),
    }


@figure
def cache_layouts() -> Figure:
    """What each layer of the converted shipped model caches per token (its KVSpec, from
    minillm.kvcache.layer_specs): bar length = numbers per token; light blue = a ring of w slots."""
    from matplotlib.patches import Rectangle

    from minillm.kvcache import layer_specs
    layouts = _shipped_layouts()
    fig, ax = new_figure(11, 4.2)
    full = 2 * 6 * 64
    for row, (name, m) in enumerate(layouts.items()):
        for i, s in enumerate(layer_specs(m)):
            x = i * 1.1
            if s is None:
                ax.add_patch(Rectangle((x, -row - 0.35), 1.0, 0.7, fill=False,
                                                          ls=":", ec=GREY))
                ax.text(x + 0.5, -row, "borrows", ha="center", va="center", fontsize=9,
                        color=GREY)
                continue
            frac = s.elems_per_token() / full
            ax.add_patch(Rectangle(
                (x, -row - 0.35), frac, 0.7, color=BLUE if s.window is None else SKY))
            label = f"{s.elems_per_token()}" + ("" if s.window is None else f", w={s.window}")
            ax.text(x + 0.02, -row + 0.45, label, fontsize=8, color="#333333")
        ax.text(-0.15, -row, name, ha="right", va="center", fontsize=11)
    ax.set_xlim(-2.3, 6 * 1.1)
    ax.set_ylim(-len(layouts) + 0.3, 1.0)
    for i in range(6):
        ax.text(i * 1.1 + 0.5, 0.75, f"layer {i}", ha="center", fontsize=10)
    ax.axis("off")
    ax.set_title("numbers cached per token, per layer (a full bar is MHA's 768); light blue: "
                 "a local layer, whose ring holds only the last w tokens", fontsize=11)
    return fig


@figure
def cache_vs_length() -> Figure:
    """KV cache of one sequence against its length for the shipped model's layouts:
    minillm.attention.cache_bytes_vs_length (bf16)."""
    import numpy as np

    from minillm.attention import cache_bytes_vs_length
    layouts = _shipped_layouts()
    lengths = np.unique(np.logspace(0, np.log10(32768), 80).astype(int)).tolist()
    fig, ax = new_figure(9, 4.4)
    colors = [GREY, BLUE, ORANGE, GREEN, RED, PURPLE]
    for (name, m), color in zip(layouts.items(), colors):
        mb = np.array(cache_bytes_vs_length(m, lengths)) / 1e6
        ax.loglog(lengths, mb, color=color, lw=2, label=name)
    ax.axvline(512, color=GREY, lw=1, ls=":")
    ax.text(560, 0.002, "shipped model's\ncontext (512)", fontsize=10, color=GREY)
    ax.set_xlabel("sequence length S (tokens)")
    ax.set_ylabel("KV cache of one sequence (MB, bf16)")
    ax.set_title("global layers grow with S; a local layer's ring stops at w")
    ax.legend(fontsize=9)
    style_axes(ax)
    return fig


@figure
def kv_pareto() -> Figure:
    """Held-out perplexity (first 1024 val tokens) against KV bytes per token for six variants
    of the shipped model, converted without training: minillm.attention.survey."""
    from minillm.attention import survey
    model, tok = model_and_tokenizer()
    names = ["MHA", "GQA K=2", "MQA (K=1)", "MLA C=96 R=32 svd key", "CLA share=2",
             "SWA w=64, 1 global in 6"]
    rows = survey(model, tok, max_tokens=1024, variants=names)
    colors = {"MHA": "k", "GQA": BLUE, "MLA": ORANGE, "CLA": GREEN, "sliding": RED}
    fig, ax = new_figure(9, 4.6)
    for r in rows:
        ax.scatter(r["kv_bytes_per_token"], r["ppl"], s=60, color=colors[r["family"]], zorder=3)
        ax.annotate(r["name"], (r["kv_bytes_per_token"], r["ppl"]), textcoords="offset points",
                    xytext=(7, 4), fontsize=10)
    ax.set_xscale("log")
    ax.set_xlim(1000, 20000)
    ax.set_xlabel("KV cache bytes per token (bf16; local layers amortised over 512 tokens)")
    ax.set_ylabel("held-out perplexity")
    ax.set_title("converted from the trained MHA model, no training: lower-left is better")
    style_axes(ax)
    return fig


@figure
def llama_layouts() -> str:
    """Napkin decode step of Llama-2-13B-shaped layouts on an H100 at S = 4096, B = 256:
    memory = B · S · kv_bytes_per_token + MHA weights, latency = memory / bandwidth."""
    from minillm import roofline as rf
    from minillm.kvcache import kv_bytes_per_token
    hw = rf.get_hardware("h100")
    S, B = 4096, 256
    weights = rf.napkin("llama-2-13b", hw, 1, S)["param_bytes"]
    rows = []
    for name, specs in _llama_layouts().items():
        per_seq = S * kv_bytes_per_token(specs, 2, S)
        memory = B * per_seq + weights
        fits = "yes" if memory <= hw.memory_bytes else '<span class="bad">no</span>'
        rows.append([name, f"{per_seq / 1e9:.2f} GB", f"{memory / 1e9:.0f} GB", fits,
                     f"{B * hw.mem_bandwidth_bytes_per_s / memory:,.0f}",
                     f"{int((hw.memory_bytes - weights) // per_seq)}"])
    return html_table(["layout", "KV / sequence", f"memory at B = {B}", "fits in 80 GB?",
                   "throughput (tok/s)", "largest B"], rows)
