"""Figures for the slide decks, computed by the same `minillm` code the labs use.

A deck refers to a figure by name: `![caption](fig:roofline)` calls `roofline()` below. A figure
function takes no arguments and returns either

  * a matplotlib `Figure` (made with `new_figure`, never pyplot): embedded as a base64 PNG, or
  * a string of HTML (a table, a tokenised prompt, sampled text): inserted as is.

To add figures for a new lab, add a section `# --- lab NN ---` with functions decorated by
`@figure`; the name of the function is the name used in the deck. Everything is computed on the
CPU in a few seconds: no timing (figures must be reproducible), only counts and napkin math on the
real model, its real logits and the real hardware presets.
"""
from __future__ import annotations

import functools
import html
from typing import Callable

import matplotlib

matplotlib.use("Agg")                          # before anything imports pyplot
from matplotlib.figure import Figure          # noqa: E402

FIGURES: dict[str, Callable[[], "Figure | str"]] = {}

# A palette that survives a projector and colour-blind viewers (Okabe-Ito).
BLUE, ORANGE, GREEN, RED, PURPLE, GREY, SKY = ("#0072B2", "#E69F00", "#009E73", "#D55E00",
                                               "#CC79A7", "#777777", "#56B4E9")


def figure(fn: Callable[[], "Figure | str"]) -> Callable[[], "Figure | str"]:
    """Register `fn` as the figure called `fn.__name__`."""
    if fn.__name__ in FIGURES:
        raise ValueError(f"figure {fn.__name__!r} is defined twice")
    FIGURES[fn.__name__] = fn
    return fn


def new_figure(width: float = 10.0, height: float = 4.6, **subplots) -> tuple[Figure, object]:
    """A Figure (object-oriented API: no global pyplot state) and its axes."""
    fig = Figure(figsize=(width, height), dpi=110, layout="constrained")
    axes = fig.subplots(**subplots) if subplots else fig.add_subplot()
    return fig, axes


def _style(ax, grid: bool = True):
    ax.spines[["top", "right"]].set_visible(False)
    if grid:
        ax.grid(alpha=0.25)


def _table(header: list[str], rows: list[list[str]], cls: str = "data") -> str:
    head = "".join(f"<th>{h}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


# ============================================================================================
# --- lab 00: sampling from a tiny LLM ---
# ============================================================================================

PROMPT = "ROMEO:\nBut soft, what light through yonder window breaks?"


@functools.lru_cache(maxsize=1)
def _model_and_tokenizer():
    import torch

    import minillm
    torch.set_num_threads(1)
    return minillm.load("target"), minillm.load_tokenizer("target")


@functools.lru_cache(maxsize=1)
def _next_logits():
    """The shipped model's logits for the token after PROMPT (what lab 00 looks at)."""
    import torch
    model, tok = _model_and_tokenizer()
    with torch.no_grad():
        return model(torch.tensor([tok.encode(PROMPT)]))[0, -1].float()


def _label(tok, i: int) -> str:
    s = tok.decode([i])
    return repr(s)[1:-1] if s.strip() else repr(s)


@figure
def tokens() -> str:
    """The lab's prompt cut into tokens by the shipped byte-level BPE tokenizer."""
    _, tok = _model_and_tokenizer()
    ids = tok.encode(PROMPT)
    chips = "".join(f'<span class="tok"><b>{html.escape(repr(s)[1:-1])}</b><i>{i}</i></span>'
                    for i, s in zip(ids, tok.token_strings(ids)))
    return (f'<div class="tokens">{chips}</div><p class="small">{len(PROMPT)} characters &rarr; '
            f"{len(ids)} tokens, vocabulary of {tok.vocab_size}</p>")


@figure
def next_token() -> Figure:
    """softmax of the real next-token logits: the 20 most probable tokens."""
    import torch
    _, tok = _model_and_tokenizer()
    probs = torch.softmax(_next_logits(), -1)
    top = torch.topk(probs, 20)
    fig, ax = new_figure(10, 4.2)
    ax.bar(range(20), top.values.numpy(), color=BLUE)
    ax.set_xticks(range(20), [_label(tok, i) for i in top.indices.tolist()], rotation=60,
                  fontsize=11, family="monospace")
    ax.set_ylabel("p(next token)")
    rest = 1 - float(top.values.sum())
    ax.set_title(f"the 20 most probable next tokens after “…{PROMPT[-22:]}” "
                 f"(the other {tok.vocab_size - 20} share p = {rest:.2f})")
    _style(ax)
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
        _style(ax)
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
    model, tok = _model_and_tokenizer()
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
    (autograder.WorkCounter around minillm.generate.stream_naive), against the closed form
    and against a loop that would recompute nothing; and the FLOPs of the naive loop."""
    import numpy as np
    import torch

    from autograder import WorkCounter
    model, _ = _model_and_tokenizer()
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
    _style(a1)

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
    _style(a2)
    return fig


# ============================================================================================
# --- lab 01: arithmetic intensity and the roofline ---
# ============================================================================================


@figure
def hardware_table() -> str:
    from minillm import roofline as rf
    rows = []
    for name in ("a100", "h100", "h200"):
        hw = rf.get_hardware(name)
        rows.append([name.upper(), f"{hw.flops_per_s / 1e12:.0f} TFLOP/s",
                     f"{hw.mem_bandwidth_bytes_per_s / 1e12:.2f} TB/s",
                     f"{hw.memory_bytes / 1e9:.0f} GB",
                     f"<b>{rf.accelerator_intensity(hw):.0f}</b> FLOPs/byte"])
    return _table(["GPU", "bf16 peak", "HBM bandwidth", "HBM", "accelerator intensity"], rows)


def _derivation(lines: list[str]) -> str:
    """Display-math lines (mathtext) as HTML: a figure that scales with the slide's text."""
    from slides.build import math_html
    lines = [x.replace(r"\frac{", r"\dfrac{") for x in lines]    # display-size fractions
    return '<div class="derivation">' + "".join(math_html(x) for x in lines) + "</div>"


@figure
def matmul_derivation() -> str:
    """The matmul's counts and intensity, as SymPy derives them in minillm.roofline."""
    import sympy

    from minillm import roofline as rf
    flops, nbytes = rf.matmul_flops_and_bytes()
    return _derivation([
        rf"\mathrm{{FLOPs}} = {sympy.latex(flops)}",
        rf"\mathrm{{bytes}} = {sympy.latex(sympy.factor(nbytes))}",
        rf"\mathrm{{intensity}} = {sympy.latex(rf.matmul_intensity())}",
        r"D = F = cB,\ c \to \infty:\quad \mathrm{intensity} \to "
        + sympy.latex(rf.matmul_intensity_limit()),
    ])


@figure
def matmul_intensity() -> Figure:
    """Exact matmul intensity at D = F = 5120 (Llama-2-13B) against its limit B."""
    import numpy as np
    import sympy

    from minillm import roofline as rf
    f = sympy.lambdify(rf.B, rf.matmul_intensity().subs({rf.D: 5120, rf.F: 5120}), "numpy")
    b = np.logspace(0, 4, 200)
    fig, ax = new_figure(6.5, 4.6)
    ax.loglog(b, f(b), color=BLUE, label="exact, D = F = 5120")
    ax.loglog(b, b, "--", color=GREY, label="limit: B")
    for name, color in (("h100", RED), ("a100", ORANGE)):
        ridge = rf.accelerator_intensity(name)
        ax.axhline(ridge, color=color, lw=1)
        ax.text(1.2, ridge * 1.12, f"{name.upper()} ridge ≈ {ridge:.0f}", color=color,
                fontsize=11)
    ax.set_xlabel("batch B (rows of X)")
    ax.set_ylabel("FLOPs per byte")
    ax.legend(loc="lower right")
    _style(ax)
    return fig


@figure
def mlp_intensity() -> Figure:
    """The SwiGLU MLP's exact intensity (minillm.roofline.mlp_intensity) at Llama-2-13B's D and
    F, as a function of the tokens sharing one weight read, B·T."""
    import numpy as np
    import sympy

    from minillm import roofline as rf
    cfg = rf.get_model("llama-2-13b")
    f = sympy.lambdify((rf.B, rf.T), rf.mlp_intensity().subs({rf.D: cfg.dim,
                                                              rf.F: cfg.hidden_dim}), "numpy")
    bt = np.logspace(0, 4.5, 200)
    fig, ax = new_figure(6.5, 4.6)
    ax.loglog(bt, f(bt, 1.0), color=BLUE, lw=2, label=f"exact, D = {cfg.dim}, F = {cfg.hidden_dim}")
    ax.loglog(bt, bt, "--", color=GREY, label="limit: B·T")
    ridge = rf.accelerator_intensity("h100")
    ax.axhline(ridge, color=RED, lw=1)
    ax.text(1.2, ridge * 1.15, f"H100 ridge ≈ {ridge:.0f}", color=RED, fontsize=11)
    for label, x, offset in (("decode, B = 1", 1, (10, 4)), ("decode, B = 64", 64, (10, -16)),
                             ("prefill, S = 1000", 1000, (12, -18))):
        y = float(f(x, 1.0))
        ax.plot([x], [y], "s", color=ORANGE, ms=7, zorder=5)
        ax.annotate(label, (x, y), xytext=offset, textcoords="offset points", fontsize=10.5,
                    color=ORANGE)
    ax.set_xlabel("tokens per weight read, B·T")
    ax.set_ylabel("FLOPs per byte")
    ax.legend(loc="lower right")
    _style(ax)
    return fig


@figure
def roofline() -> Figure:
    """Attainable FLOP/s = min(peak, bandwidth × intensity) for the H100 and the A100, with the
    ridge points and where the pieces of a Llama-2-13B step land (S = 1000)."""
    import numpy as np

    from minillm import roofline as rf
    x = np.logspace(-1, 4, 400)
    fig, ax = new_figure(10, 4.8)
    for name, color in (("h100", RED), ("a100", ORANGE)):
        hw = rf.get_hardware(name)
        y = [rf.roofline_flops_per_s(i, hw.flops_per_s, hw.mem_bandwidth_bytes_per_s) / 1e12
             for i in x]
        ridge = rf.accelerator_intensity(hw)
        ax.loglog(x, y, color=color, lw=2.5, label=f"{name.upper()}: {hw.flops_per_s / 1e12:.0f}"
                  f" TFLOP/s, {hw.mem_bandwidth_bytes_per_s / 1e12:.2f} TB/s")
        ax.plot([ridge], [hw.flops_per_s / 1e12], "o", color=color, ms=8)
        ax.annotate(f"ridge {ridge:.0f}", (ridge, hw.flops_per_s / 1e12), xytext=(8, -18),
                    textcoords="offset points", color=color)
    h100 = rf.get_hardware("h100")
    S = 1000
    points = [  # (label, intensity, label offset in points)
        ("decode: matmul at B = 1,\nattention at any B", 1.0, (10, -34)),
        ("decode MLP, B = 64", 64.0, (-150, 8)),
        ("prefill attention S/2", float(rf.prefill_attention_intensity().subs(rf.S, S)),
         (-150, 10)),
        ("prefill MLP, B·T = 1000", 1000.0, (6, 10)),
    ]
    for label, inten, offset in points:
        yv = rf.roofline_flops_per_s(inten, h100.flops_per_s, h100.mem_bandwidth_bytes_per_s)
        ax.plot([inten], [yv / 1e12], "s", color=BLUE, ms=7, zorder=5)
        ax.annotate(label, (inten, yv / 1e12), xytext=offset, textcoords="offset points",
                    fontsize=10.5, color=BLUE)
    ax.axvspan(x[0], rf.accelerator_intensity(h100), color=SKY, alpha=0.08)
    ax.text(0.12, 600, "memory-bound\n(on an H100)", color=GREY)
    ax.set_xlabel("arithmetic intensity (FLOPs per byte moved)")
    ax.set_ylabel("attainable TFLOP/s")
    ax.set_ylim(0.1, 3000)
    ax.legend(loc="lower right")
    _style(ax)
    return fig


@figure
def attention_intensity() -> Figure:
    """S·T/(S+T) from minillm.roofline for prefill (T = S) and decode (T = 1), any batch."""
    import numpy as np
    import sympy

    from minillm import roofline as rf
    pre = sympy.lambdify(rf.S, rf.prefill_attention_intensity(), "numpy")
    dec = sympy.lambdify(rf.S, rf.decode_attention_intensity(), "numpy")
    s = np.logspace(0, 5, 200)
    fig, ax = new_figure(8.5, 4.0)
    ax.loglog(s, pre(s), color=ORANGE, lw=2, label="prefill, T = S: S/2")
    ax.loglog(s, dec(s) * np.ones_like(s), color=BLUE, lw=2, label="decode, T = 1: S/(S+1) < 1")
    ridge = rf.accelerator_intensity("h100")
    ax.axhline(ridge, color=RED, lw=1)
    ax.text(1.3, ridge * 1.15, f"H100 ridge ≈ {ridge:.0f}", color=RED, fontsize=11)
    ax.set_xlabel("context length S (keys in the KV cache)")
    ax.set_ylabel("FLOPs per byte")
    ax.set_title("attention intensity has no B in it: batching cannot help")
    ax.legend(loc="upper left")
    _style(ax)
    return fig


@figure
def napkin_table() -> str:
    """The lecture's table: Llama-2-13B on an H100 at S = 1000, from minillm.roofline.napkin."""
    from minillm import roofline as rf
    rows = []
    for kv in (None, 8):
        for b in (1, 64, 256):
            r = rf.napkin("llama-2-13b", "h100", batch=b, seq_len=1000, kv_heads=kv)
            fits = "yes" if r["fits"] else '<span class="bad">no</span>'
            rows.append([f"{r['kv_heads']}", f"{b}", f"{r['memory_bytes'] / 1e9:.1f} GB", fits,
                         f"{r['latency_s'] * 1e3:.1f} ms", f"{r['throughput_tok_s']:,.0f}"])
    return _table(["K (KV heads)", "batch B", "memory", "fits in 80 GB?", "latency / token",
                   "throughput (tok/s)"], rows)


@figure
def kv_memory() -> Figure:
    """Weights + B × KV cache for Llama-2-13B at S = 1000 on an H100, K = 40 (MHA) vs K = 8."""
    import numpy as np

    from minillm import roofline as rf
    hw = rf.get_hardware("h100")
    batches = np.array([1, 8, 16, 32, 64, 96, 128, 192, 256])
    fig, axes = new_figure(11, 4.2, nrows=1, ncols=2, sharey=True)
    for ax, kv in zip(axes, (None, 8)):
        rows = [rf.napkin("llama-2-13b", hw, batch=int(b), seq_len=1000, kv_heads=kv)
                for b in batches]
        w = np.array([r["param_bytes"] for r in rows]) / 1e9
        k = np.array([r["kv_bytes"] for r in rows]) / 1e9
        pos = np.arange(len(batches))
        ax.bar(pos, w, color=GREY, label="weights (bf16)")
        ax.bar(pos, k, bottom=w, color=BLUE, label="KV cache = B · S·K·H·L·2·2")
        ax.axhline(hw.memory_bytes / 1e9, color=RED, lw=1.5)
        ax.text(-0.4, hw.memory_bytes / 1e9 + 4, "H100: 80 GB", color=RED, fontsize=11)
        mb = rf.max_batch_that_fits("llama-2-13b", hw, 1000, kv_heads=kv)
        ax.set_xticks(pos, [str(b) for b in batches])
        ax.set_xlabel("batch B")
        ax.set_title(f"K = {rows[0]['kv_heads']}: {rows[0]['kv_bytes_per_seq'] / 1e6:.0f} MB "
                     f"per sequence, B ≤ {mb} fits")
        _style(ax)
    axes[0].set_ylabel("GB")
    axes[0].legend(loc="upper left")
    return fig


@figure
def latency_throughput() -> Figure:
    """The latency/throughput trade-off of Llama-2-13B on an H100 (S = 1000), where the memory
    runs out, and what GQA (K = 8) does to it: minillm.roofline.latency_throughput_curve."""
    from minillm import roofline as rf
    batches = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
    fig, ax = new_figure(10, 5.0)
    for kv, color, name in ((None, BLUE, "MHA, K = 40"), (8, GREEN, "GQA, K = 8")):
        c = rf.latency_throughput_curve("llama-2-13b", "h100", 1000, batches, kv_heads=kv)
        lat, thr, fits = c["latency_ms"], c["throughput_tok_s"], c["fits"]
        ax.plot([x for x, f in zip(lat, fits) if f], [y for y, f in zip(thr, fits) if f], "o-",
                color=color, label=f"{name}: fits in 80 GB")
        last = max(i for i, f in enumerate(fits) if f) if any(fits) else 0
        ax.plot(lat[last:], thr[last:], "o--", color=color, alpha=0.35,
                label=f"{name}: needs more than 80 GB")
        ax.axhline(c["max_throughput_tok_s"], color=color, lw=0.8, ls=":")
        cap = rf.napkin("llama-2-13b", "h100", c["max_batch"], 1000, kv_heads=kv)
        ax.plot([cap["latency_s"] * 1e3], [cap["throughput_tok_s"]], "*", ms=16, color=RED,
                zorder=5)
        ax.annotate(f"memory full: B = {c['max_batch']}", (cap["latency_s"] * 1e3,
                    cap["throughput_tok_s"]), xytext=(8, -14), textcoords="offset points",
                    color=RED, fontsize=11)
        for b, x, y in zip(c["batch"], lat, thr):
            if b in (16, 64, 256) or (b == 1 and kv is None):
                ax.annotate(f"B={b}", (x, y), xytext=(-6, 8), textcoords="offset points",
                            fontsize=10, color=color)
    ax.set_xscale("log")
    ax.set_xlabel("latency per token (ms, log scale)")
    ax.set_ylabel("throughput (tokens / s)")
    ax.set_title("Llama-2-13B, H100, S = 1000 (dotted: the limit as B → ∞)")
    ax.legend(loc="upper left")
    _style(ax)
    return fig


@figure
def decode_formulas() -> str:
    """The napkin model of one decode step, as SymPy writes minillm.roofline's formulas."""
    import sympy

    from minillm import roofline as rf
    d = rf.decode_step_symbolic()
    return _derivation([
        rf"\mathrm{{KV\ per\ sequence}} = {sympy.latex(d['kv_cache_size'])}\ \mathrm{{bytes}}",
        rf"\mathrm{{memory}} = {sympy.latex(d['memory'])}",
        r"\mathrm{latency} = \frac{\mathrm{memory}}{\mathrm{bandwidth}},\qquad"
        r"\mathrm{throughput} = \frac{B}{\mathrm{latency}}",
        rf"\mathrm{{throughput}} \to {sympy.latex(d['throughput_limit'])}"
        r"\quad \mathrm{as}\ B \to \infty",
    ])


# ============================================================================================
# --- lab 02: the KV cache ---
# ============================================================================================


@figure
def cached_work() -> Figure:
    """Tokens through the model per step and in total, naive loop vs KV-cached loop, counted on
    the shipped model (autograder.WorkCounter around minillm.generate.stream_naive/stream_cached),
    and the ratio of the two totals from the closed forms."""
    import numpy as np
    import torch

    from autograder import WorkCounter
    from minillm.generate import stream_cached, stream_naive
    from minillm.sampling import SamplingParams
    model, _ = _model_and_tokenizer()
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
    _style(a1)
    n = np.unique(np.logspace(0, np.log10(4096), 80).astype(int))
    for p, color in ((8, BLUE), (128, GREEN), (1024, PURPLE)):
        naive = n * p + n * (n - 1) / 2
        cached = p + n - 1
        a2.loglog(n, naive / cached, color=color, label=f"prompt P = {p}")
    a2.set_xlabel("new tokens n")
    a2.set_ylabel("naive tokens / cached tokens")
    a2.set_title("(nP + n(n−1)/2) / (P + n − 1): grows linearly with n")
    a2.legend()
    _style(a2)
    return fig


@figure
def kv_layout() -> Figure:
    """What a static cache holds: per layer a [B, K, max_len, H] key and value tensor, filled up
    to seq_len, drawn from a real minillm KVCache after a 6-token prefill and 2 decode steps."""
    import torch
    from matplotlib.patches import Rectangle

    from minillm.kvcache import KVCache
    model, _ = _model_and_tokenizer()
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
    return _table(["model", "L", "K / N heads", "H", "per token", "S", "per sequence",
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
    _style(ax)
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
    _style(ax)
    return fig


# ============================================================================================
# --- lab 03: shrinking the KV cache ---
# ============================================================================================


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
    return _table(["layout (Llama-2-13B shape)", "numbers / token / layer", "layers storing",
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
    _style(ax, grid=False)
    return fig


@figure
def mla_flops() -> Figure:
    """FLOPs of one MLA decode step, naive (expand every cached latent) vs absorbed (attend in
    latent space), counted by torch's FlopCounterMode on the lab's two reference functions
    (autograder.labs.lab03) at the shipped model's shape (N = 6, H = 64, R = 32, C = 224)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from autograder.labs import lab03
    seqs = [64, 128, 256, 512, 1024, 2048, 4096]
    counts = {"naive": [], "absorbed": []}
    for S in seqs:
        attn, q_nope, q_rope, c, k_rope = lab03.make_inputs(seq=S)
        for name, fn in (("naive", lab03.naive_expand), ("absorbed", lab03.reference_absorbed)):
            with torch.no_grad(), FlopCounterMode(display=False) as fc:
                fn(attn, q_nope, q_rope, c, k_rope)
            counts[name].append(fc.get_total_flops())
    fig, (a1, a2) = new_figure(11, 4.0, nrows=1, ncols=2)
    a1.loglog(seqs, counts["naive"], "o-", color=RED, label="naive: up-project K and V for every s")
    a1.loglog(seqs, counts["absorbed"], "s-", color=GREEN, label="absorbed: attend to the latents")
    a1.set_xlabel("cached positions S")
    a1.set_ylabel("FLOPs per decode step (one layer)")
    a1.legend()
    _style(a1)
    ratio = [n / a for n, a in zip(counts["naive"], counts["absorbed"])]
    a2.semilogx(seqs, ratio, "o-", color=BLUE)
    a2.set_ylim(0, max(ratio) * 1.15)
    a2.set_xlabel("cached positions S")
    a2.set_ylabel("naive FLOPs / absorbed FLOPs")
    a2.set_title("counted by torch's FlopCounterMode")
    _style(a2)
    return fig


@functools.lru_cache(maxsize=1)
def _shipped_layouts() -> dict:
    """The shipped target converted to the lab's cache layouts (no training)."""
    from minillm.attention import to_cla, to_gqa, to_mla, to_sliding
    model, _ = _model_and_tokenizer()
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
    _style(ax)
    return fig


@figure
def kv_pareto() -> Figure:
    """Held-out perplexity (first 1024 val tokens) against KV bytes per token for six variants
    of the shipped model, converted without training: minillm.attention.survey."""
    from minillm.attention import survey
    model, tok = _model_and_tokenizer()
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
    _style(ax)
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
    return _table(["layout", "KV / sequence", f"memory at B = {B}", "fits in 80 GB?",
                   "throughput (tok/s)", "largest B"], rows)


# Larger type than matplotlib's default: a slide is read from the back of a room.
STYLE = {"font.size": 12, "axes.titlesize": 12, "axes.labelsize": 12, "xtick.labelsize": 11,
         "ytick.labelsize": 11, "legend.fontsize": 10, "svg.hashsalt": "minillm"}


def render(name: str) -> "Figure | str":
    """Call the figure function `name` (KeyError with the known names if there is none)."""
    if name not in FIGURES:
        raise KeyError(f"no figure {name!r} in slides/figures.py; known: {sorted(FIGURES)}")
    with matplotlib.rc_context(STYLE):
        out = FIGURES[name]()
    if not isinstance(out, (Figure, str)):
        raise TypeError(f"figure {name!r} returned {type(out).__name__}, not a Figure or HTML")
    return out


__all__ = ["FIGURES", "figure", "new_figure", "render"]


# ============================================================================================
# --- lab 07: paged attention ---
# ============================================================================================
# Counts only: the serving trace and BlockManager, the kernels' pick_num_splits, napkin bytes.

def _frag_history(paged: bool, capacity: int = 2048, block: int = 16, max_new: int = 256):
    """Lab 07's replay of a lab 06 trace on a contiguous (first-fit, prompt + max_new reserved)
    or paged KV memory: per step, slots used / internal / external / free."""
    from minillm.serving.trace import make_trace
    trace = make_trace(num_requests=64, rate=40.0, seed=0, output_max=max_new)
    reqs = [(int(r.arrival_time / 0.02), len(r.prompt_ids), r.max_new_tokens) for r in trace]
    todo, waiting, running, done, hist, step = list(range(len(reqs))), [], {}, {}, [], 0
    while todo or waiting or running:
        while todo and reqs[todo[0]][0] <= step:
            waiting.append(todo.pop(0))
        while waiting:
            i = waiting[0]
            length = reqs[i][1] + done.get(i, 0)
            if paged:
                held = sum(-(-s["len"] // block) for s in running.values())
                if held + -(-(length + 1) // block) > capacity // block:
                    break
                running[i] = {"len": length}
            else:
                size, end, start = reqs[i][1] + max_new, 0, None
                for a, b in sorted((s["start"], s["size"]) for s in running.values()) + \
                        [(capacity, 0)]:
                    if a - end >= size:
                        start = end
                        break
                    end = a + b
                if start is None:
                    break
                running[i] = {"len": length, "start": start, "size": size}
            waiting.pop(0)
        for i, s in running.items():
            s["len"] += 1
            done[i] = done.get(i, 0) + 1
        used = sum(s["len"] for s in running.values())
        if paged:
            held = sum(-(-s["len"] // block) for s in running.values()) * block
            row = (used, held - used, 0, capacity - held)
        else:
            need = reqs[waiting[0]][1] + max_new if waiting else None
            ext = free = end = 0
            for a, b in sorted((s["start"], s["size"]) for s in running.values()) + \
                    [(capacity, 0)]:
                if need is not None and a - end < need:
                    ext += a - end
                else:
                    free += a - end
                end = a + b
            held = sum(s["size"] for s in running.values())
            row = (used, held - used, ext, free)
        hist.append(row + (len(running),))
        for i in [i for i in running if done[i] >= reqs[i][2]]:
            del running[i]
        step += 1
    return hist


@figure
def fragmentation() -> Figure:
    """KV slots over time for the lab 06 trace (minillm.serving.trace.make_trace, 64 requests,
    40/s, 2048 slots): contiguous first-fit reservations of prompt + 256 vs 16-token blocks."""
    import numpy as np
    fig, axes = new_figure(11, 4.4, nrows=1, ncols=2, sharey=True)
    for ax, paged in zip(axes, (False, True)):
        h = np.array(_frag_history(paged))
        ax.stackplot(np.arange(len(h)), h[:, 0], h[:, 1], h[:, 2], h[:, 3],
                     colors=[GREEN, ORANGE, RED, "#e8e8e8"],
                     labels=["used (tokens)", "internal", "external", "free"])
        frac = h[:, 0].sum() / (h[:, 0].sum() + h[:, 1].sum())
        ax.set_title(f"{'paged, blocks of 16' if paged else 'contiguous, prompt + 256 reserved'}"
                     f"\ntokens fill {100 * frac:.0f} % of held memory; done after {len(h)} "
                     f"steps", fontsize=11)
        ax.set_xlabel("decode step")
        _style(ax, grid=False)
    axes[0].set_ylabel("KV slots (2048)")
    axes[1].legend(loc="upper right", fontsize=9)
    return fig


@figure
def block_table() -> Figure:
    """One sequence of 11 tokens in blocks of 4: its block table [7, 2, 5] and where each
    position lands in the pool (kernels.paged_attention_ref.slot_mapping_ref)."""
    import torch
    from matplotlib.patches import FancyArrowPatch, Rectangle

    from kernels.paged_attention_ref import slot_mapping_ref
    B, table, L = 4, [7, 2, 5], 11
    slots = slot_mapping_ref(torch.tensor(table), torch.arange(L), B).tolist()
    fig, ax = new_figure(8.5, 4.4)
    colors = [BLUE, ORANGE, GREEN]
    for pos in range(12):                                        # logical view
        j = pos // B
        ax.add_patch(Rectangle((pos + j * 0.4, 2.2), 0.9, 0.8,
                               color=colors[j] if pos < L else "#eeeeee"))
        ax.text(pos + j * 0.4 + 0.45, 2.6, str(pos) if pos < L else "", ha="center",
                va="center", fontsize=9, color="white")
    ax.text(-0.4, 2.6, "positions", ha="right", va="center", fontsize=11)
    for j, b in enumerate(table):                                # the table
        ax.add_patch(Rectangle((1.2 + j * 4.4, 0.9), 1.4, 0.7, fill=False, lw=1.5))
        ax.text(1.9 + j * 4.4, 1.25, str(b), ha="center", va="center", fontsize=12)
    ax.text(-0.4, 1.25, "block table", ha="right", va="center", fontsize=11)
    for b in range(9):                                           # the pool
        x0 = b * 2.0
        owner = table.index(b) if b in table else None
        for r in range(B):
            slot = b * B + r
            filled = slot in slots
            ax.add_patch(Rectangle((x0 + r * 0.45, -1.0), 0.42, 0.7,
                                   color=colors[owner] if filled else "#eeeeee"))
        ax.text(x0 + 0.9, -1.35, f"block {b}", ha="center", va="top", fontsize=9)
        if owner is not None:
            ax.add_patch(FancyArrowPatch((1.9 + owner * 4.4, 0.85), (x0 + 0.9, -0.25),
                                         arrowstyle="->", mutation_scale=12, color=GREY))
    ax.text(-0.4, -0.65, "KV pool", ha="right", va="center", fontsize=11)
    ax.set_title("slot = table[pos // 4] · 4 + pos % 4\nposition 9 → table[2] · 4 + 1 = "
                 f"{slots[9]}  (block 5, row 1)", fontsize=12)
    ax.set_xlim(-3.2, 18.2)
    ax.set_ylim(-1.9, 3.3)
    ax.axis("off")
    return fig


def _block_map_history(steps: int = 40, num_blocks: int = 32, block: int = 4):
    """The serving BlockManager (no prefix caching) under a scripted load: a 10-token system
    prompt kept as sequence 0; every 3rd step a request forks it, appends 2-6 prompt tokens and
    4-12 answer tokens; every 3rd request forks a sibling answer after its prompt."""
    import numpy as np

    from minillm.serving import BlockManager, Sequence
    bm = BlockManager(num_blocks, block, enable_prefix_caching=False)
    root = Sequence(0, [1] * 10, prompt_len=10)
    bm.allocate(root)
    seqs, plans, next_id, copies = {}, {}, 1, 0
    owner = np.full((steps, num_blocks), -1)
    for step in range(steps):
        if step % 3 == 0 and bm.num_free_blocks > 6:
            s = Sequence(next_id, [1] * 10, prompt_len=10)
            bm.fork(root, s)
            seqs[next_id], plans[next_id] = s, [2 + next_id % 5, 4 + (3 * next_id) % 9,
                                                next_id % 3 == 0]
            next_id += 1
        for sid in list(plans):
            s, plan = seqs[sid], plans[sid]
            s.token_ids.append(1)
            if not bm.can_append(s):
                s.token_ids.pop()
                continue
            copies += len(bm.append_slot(s))
            if plan[0] > 0:
                plan[0] -= 1
                if plan[0] == 0 and plan[2]:
                    sib = Sequence(next_id, list(s.token_ids), prompt_len=s.prompt_len)
                    bm.fork(s, sib)
                    seqs[next_id], plans[next_id] = sib, [0, 3 + next_id % 7, False]
                    next_id += 1
            else:
                plan[1] -= 1
                if plan[1] == 0:
                    bm.free(s)
                    del plans[sid]
        for sid, table in bm.tables.items():
            for b in table:
                owner[step, b] = sid if bm.blocks[b].ref_count == 1 else -2
    return owner, copies


@figure
def block_map() -> Figure:
    """Which sequence owns which physical block, step by step (minillm.serving.BlockManager under
    a scripted load with a shared system prompt and forked sibling answers)."""
    import numpy as np
    from matplotlib import colormaps
    owner, copies = _block_map_history()
    palette = colormaps["tab20"]([i for i in range(20) if i not in (14, 15)])
    rgb = np.ones(owner.shape + (3,))
    for s in range(owner.max() + 1):
        rgb[owner == s] = palette[s % len(palette), :3]
    rgb[owner == -2] = 0.35
    fig, ax = new_figure(10, 4.6)
    ax.imshow(rgb, aspect="auto", interpolation="nearest")
    ax.set_xlabel("physical block")
    ax.set_ylabel("step")
    ax.set_title(f"colour: owner; dark gray: shared (ref count > 1); white: free — "
                 f"{copies} copy-on-write copies", fontsize=11)
    return fig


@figure
def sharing_table() -> str:
    """Blocks in use, counted by minillm.serving.BlockManager: a shared system prompt (prefix
    caching on vs off) and parallel sampling (fork + copy-on-write vs independent copies)."""
    from minillm.serving import BlockManager, Sequence
    B, rows = 16, []
    for P, s, n in ((512, 32, 64), (100, 20, 16)):
        used = []
        for cache in (False, True):
            bm = BlockManager(n * (-(-(P + s) // B)), B, enable_prefix_caching=cache)
            for i in range(n):
                ids = list(range(1, P + 1)) + [10_000 + 100 * i + j for j in range(s)]
                bm.allocate(Sequence(i, ids, prompt_len=len(ids)))
            used.append(bm.num_used_blocks)
        rows.append([f"system prompt {P} + {n} questions of {s}", str(used[0]), str(used[1]),
                     f"{used[0] / used[1]:.1f}×"])
    for P, T, n in ((500, 200, 8), (500, 20, 8)):
        bm = BlockManager(n * (-(-(P + T) // B)), B, enable_prefix_caching=False)
        seqs = [Sequence(0, [1] * P, prompt_len=P)]
        bm.allocate(seqs[0])
        for c in range(1, n):
            seqs.append(Sequence(c, [1] * P, prompt_len=P))
            bm.fork(seqs[0], seqs[c])
        copies = 0
        for _ in range(T):
            for s in seqs:
                s.token_ids.append(1)
                copies += len(bm.append_slot(s))
        alone = n * (-(-(P + T) // B))
        rows.append([f"{n} answers of {T} to a {P}-token prompt (fork; {copies} CoW copies)",
                     str(alone), str(bm.num_used_blocks), f"{alone / bm.num_used_blocks:.1f}×"])
    return _table(["workload (blocks of 16)", "blocks, no sharing", "blocks, shared", "saving"],
                  rows)


@figure
def decode_bytes() -> str:
    """Napkin for one paged decode step per layer (bf16, 32 query / 8 KV heads of 128): bytes
    of K/V read, FLOPs per byte, and the time floor on an H100 (minillm.roofline preset)."""
    from minillm import roofline as rf
    h100 = rf.get_hardware("h100")
    rows = []
    for B, L in ((32, 4096), (1, 32768), (64, 1024)):
        kv = 2 * B * L * 8 * 128 * 2
        flops = 4 * B * L * 32 * 128
        rows.append([f"B = {B}, context {L:,}", f"{kv / 1e6:,.0f} MB", f"{flops / kv:.0f}",
                     f"{kv / h100.mem_bandwidth_bytes_per_s * 1e6:,.0f} µs"])
    return _table(["decode step", "K/V bytes read", "FLOPs / byte",
                   f"floor at {h100.mem_bandwidth_bytes_per_s / 1e12:.2f} TB/s"], rows)


@figure
def split_programs() -> Figure:
    """Programs in the decode grid, unsplit (B · K) and split (B · K · S, S from
    kernels.paged_attention_ref.pick_num_splits), against an H100's 132 SMs; 8 KV heads,
    32k-token context, blocks of 16."""
    import numpy as np
    from matplotlib.ticker import FuncFormatter

    from kernels.paged_attention_ref import pick_num_splits
    batches = np.array([1, 2, 4, 8, 16, 32, 64])
    K, blocks = 8, 32768 // 16
    unsplit = batches * K
    split = np.array([b * K * pick_num_splits(int(b), K, blocks, 16) for b in batches])
    fig, ax = new_figure(7, 4.6)
    ax.plot(batches, unsplit, "o-", color=ORANGE, label="unsplit: one program per (sequence, "
                                                        "KV head)")
    ax.plot(batches, split, "s-", color=BLUE, label="flash-decoding: × num_splits")
    ax.axhline(132, color=GREY, ls="--", lw=1)
    ax.text(1.05, 150, "132 SMs (H100)", color=GREY, fontsize=10)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:.0f}"))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:.0f}"))
    ax.set_xlabel("batch B (sequences)")
    ax.set_ylabel("programs in the grid")
    ax.set_title("at small batch the unsplit grid leaves most SMs idle", fontsize=11)
    ax.legend(fontsize=9)
    _style(ax)
    return fig


# ============================================================================================
# --- lab 05: speculative sampling ---
# ============================================================================================
SPEC_PROMPT = "HAMLET.\nTo be, or not to be, that is the question:\n"


@functools.lru_cache(maxsize=1)
def _draft_model():
    import minillm
    return minillm.load("draft")


def _tok_chips(tok, ids, style: str = "") -> str:
    return "".join(f'<span class="tok" style="{style}"><b>{html.escape(_label(tok, i))}</b></span>'
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
    target, tok = _model_and_tokenizer()
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
    _style(ax)
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
    _style(a1)
    for c, color in ((0.0, GREY), (0.05, GREEN), (0.1, BLUE), (0.3, RED)):
        a2.plot(ks, [expected_speedup(0.8, k, c) for k in ks], "o-", ms=3, color=color,
                label=f"c = {c}")
    a2.axhline(1, color="black", lw=0.8)
    a2.set_xlabel("k")
    a2.set_ylabel("speed-up over the target alone")
    a2.set_title("α = 0.8: an expensive draft wants a short k", fontsize=11)
    a2.legend()
    _style(a2)
    return fig


@figure
def spec_counted() -> Figure:
    """Counted (not timed) on the shipped models, greedy, 64 new tokens after SPEC_PROMPT:
    acceptance rate α (accepted / judged drafts) and tokens per target pass for k = 1..6 with
    minillm.speculative.speculative_generate, against the formula with each k's α; prompt lookup
    on minillm.speculative.repetitive_prompt (96 tokens) for comparison."""
    from minillm.sampling import SamplingParams
    from minillm.speculative import (ModelDrafter, PromptLookupDrafter, expected_tokens_per_step,
                                     repetitive_prompt, speculative_generate)
    target, tok = _model_and_tokenizer()
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
    _style(a1)
    a2.plot(ks, [s.alpha for s in stats], "o-", color=BLUE, label="draft model")
    a2.plot(ks, [s.alpha for s in look], "s-", color=ORANGE, label="prompt lookup")
    a2.set_ylim(0, 1)
    a2.set_xlabel("k")
    a2.set_ylabel("α = accepted / judged drafts")
    a2.legend()
    _style(a2)
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
    _style(a1)
    a2.axhline(1, color="black", lw=0.8)
    a2.set_xlabel("k")
    a2.set_ylabel("speed-up, α = 0.8, c = 0.1")
    a2.set_title("E[tokens] / (k c + v)", fontsize=11)
    a2.legend(fontsize=9)
    _style(a2)
    return fig


@figure
def spec_lookup() -> str:
    """Prompt lookup on the shipped target's own greedy output after the repetitive prompt: the
    last 3 tokens, their latest earlier occurrence and the proposal
    (minillm.speculative.prompt_lookup)."""
    from minillm.generate import generate_cached
    from minillm.sampling import SamplingParams
    from minillm.speculative import prompt_lookup, repetitive_prompt
    target, tok = _model_and_tokenizer()
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


# ============================================================================================
# --- lab 06: continuous batching ---
# ============================================================================================
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
        _style(ax)
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
        _style(ax, grid=False)
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
    _style(ax)
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
    for `minillm bench batching`'s default trace (minillm.serving.bench.TRACE, 128 requests,
    max_batch 32), with the two napkin speed-ups they imply."""
    from minillm.serving.bench import TRACE
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
    return _table(["trace", "steps static / continuous", "token slots / tokens",
                   "speed-up if steps cost the same", "speed-up if cost ∝ tokens"], rows)


# ============================================================================================
# --- lab 04: quantization ---
# ============================================================================================
def _lab04_calib_inputs(names: tuple) -> dict:
    """Inputs of the named linear layers on the first 1024 training tokens (lab 04's
    calibration text)."""
    import torch

    from minillm.data import load_text
    from minillm.quant import linear_inputs
    model, tok = _model_and_tokenizer()
    ids = torch.tensor(tok.encode(load_text("train")[:20000]))[:1024].view(4, 256)
    return linear_inputs(model, ids, list(names))


@figure
def number_formats() -> str:
    """minillm.quant.format_table (read from torch.finfo), plus what one weight costs."""
    from minillm.quant import format_table
    rows = [[r["format"], str(r["bits"]), f"{r['bytes']:g}", f"{r['max']:.4g}",
             f"{r['eps']:.3g}" if r["format"] not in ("int8", "int4") else "uniform steps of s"]
            for r in format_table()]
    return _table(["format", "bits", "bytes", "largest", "relative precision (eps)"], rows)


@figure
def quant_napkin() -> Figure:
    """Lab 01's napkin (minillm.roofline.napkin) for Llama-2-13B on an H100, batch 1, S = 1000,
    bf16 KV cache: weights at 16, 8 (+ a 16-bit scale per 5120-row) and 4 bits (+ 16-bit scale
    and zero per group)."""
    from minillm import roofline
    schemes = {"bf16": 16, "int8 per channel": 8 + 16 / 5120, "int4, g = 128": 4 + 32 / 128,
               "int4, g = 64": 4 + 32 / 64}
    rows = {n: roofline.napkin("llama-2-13b", "h100", 1, 1000, bytes_per_param=b / 8,
                               kv_bytes_per_value=2) for n, b in schemes.items()}
    fig, ax = new_figure(9, 3.4)
    names = list(rows)
    ms = [rows[n]["latency_s"] * 1e3 for n in names]
    ax.barh(names, ms, color=[GREY, BLUE, ORANGE, GREEN])
    for y, (n, t) in enumerate(zip(names, ms)):
        ax.text(t + 0.1, y, f"{t:.2f} ms  ({ms[0] / t:.2f}× faster, {schemes[n]:.2f} bits)",
                va="center", fontsize=9)
    ax.invert_yaxis()
    ax.set_xlim(0, ms[0] * 1.55)
    ax.set_xlabel("napkin time per token = bytes read / 3.35 TB/s")
    _style(ax)
    return fig


@figure
def row_scales() -> Figure:
    """Largest |w| of every output row of the shipped model's layers.0.mlp.down_proj: one
    per-tensor scale gives every row the step of the largest one."""
    model, _ = _model_and_tokenizer()
    w = model.layers[0].mlp.down_proj.weight.detach()
    row_max = w.abs().amax(dim=1).sort(descending=True).values
    fig, ax = new_figure(7, 3.2)
    ax.plot(row_max.numpy(), color=BLUE, label="max |w| of the row (per-channel scale × 127)")
    ax.axhline(row_max[0].item(), color=RED, ls="--", lw=1, label="per-tensor: one max for all rows")
    ax.set_xlabel("output channel (sorted)")
    ax.set_ylabel("max |w|")
    ax.set_ylim(0, None)
    ax.legend(fontsize=9)
    _style(ax)
    return fig


@figure
def zeropoint_grid() -> Figure:
    """The 16 codes of 4-bit absmax and 4-bit zero-point quantization (minillm.quant) for a
    one-sided row of values in [-0.3, 3] (SiLU-like)."""
    import torch

    from minillm.quant import absmax_quantize, zeropoint_quantize
    w = torch.linspace(-0.3, 3.0, 400)[None]
    q, s = absmax_quantize(w, bits=4)
    zq, zs, zz = zeropoint_quantize(w, bits=4)
    fig, axes = new_figure(9, 3.0, nrows=2, ncols=1, sharex=True)
    for ax, levels, used, title in [
            (axes[0], torch.arange(-7, 8) * s.item(), torch.unique(q).numel(), "absmax (symmetric)"),
            (axes[1], (torch.arange(16) - zz.item()) * zs.item(), torch.unique(zq).numel(),
             "zero-point (asymmetric)")]:
        ax.axvspan(-0.3, 3.0, color=SKY, alpha=0.25, lw=0)
        ax.vlines(levels.numpy(), 0, 1, color=BLUE)
        ax.set_yticks([])
        ax.set_title(f"{title}: {used} of its codes used by values in [−0.3, 3]", fontsize=10,
                     loc="left")
    axes[1].set_xlabel("value represented by each 4-bit code (shaded: the range of the values)")
    return fig


@figure
def int4_packing() -> str:
    """Eight int4 codes of one row packed by minillm.quant.pack_int4 (the kernels' layout)."""
    import torch

    from minillm.quant import pack_int4
    codes = torch.tensor([[3, 12, 0, 15, 7, 8, 1, 10]], dtype=torch.uint8)
    packed = pack_int4(codes)[0].tolist()
    head = ["k"] + [str(k) for k in range(8)]
    rows = [["code q[k]"] + [str(c) for c in codes[0].tolist()],
            ["byte j = k // 2"] + [f"{k // 2}" for k in range(8)],
            ["nibble"] + ["low" if k % 2 == 0 else "high" for k in range(8)]]
    table = _table(head, rows)
    bytes_row = " &nbsp; ".join(f"byte {j}: <b>0x{b:02X}</b> = {codes[0, 2 * j].item()} | "
                                f"({codes[0, 2 * j + 1].item()} &lt;&lt; 4)"
                                for j, b in enumerate(packed))
    return table + f'<p class="small">{bytes_row}</p>'


@figure
def group_tradeoff() -> Figure:
    """Relative weight error ||W_hat - W|| / ||W|| over all of the shipped model's linear layers
    (minillm.quant.group_quantize, round to nearest) against stored bits per weight (16-bit
    scale and zero per group)."""
    import torch

    from minillm.quant import dequantize, group_quantize
    model, _ = _model_and_tokenizer()
    ws = [m.weight.detach() for n, m in model.named_modules()
          if isinstance(m, torch.nn.Linear) and n != "lm_head"]
    fig, ax = new_figure(8, 3.6)
    for bits, color in ((2, RED), (3, ORANGE), (4, BLUE)):
        pts = []
        for G in (16, 32, 64, 128, None):
            err = num = stored = 0.0
            for w in ws:
                g = w.shape[1] if G is None else G
                d = dequantize(*group_quantize(w, g, bits), g) - w
                err += d.pow(2).sum().item()
                num += w.pow(2).sum().item()
                stored += w.numel() * (bits + 32 / g)
            pts.append((stored / sum(w.numel() for w in ws), (err / num) ** 0.5, G))
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color=color, label=f"int{bits}")
        for b, e, G in pts:
            ax.annotate("row" if G is None else f"g{G}", (b, e), fontsize=7,
                        xytext=(3, 3), textcoords="offset points")
    ax.set_yscale("log")
    ax.set_xlabel("stored bits per weight (codes + 16-bit scale and zero per group)")
    ax.set_ylabel("relative weight error")
    ax.legend(fontsize=9)
    _style(ax)
    return fig


@figure
def quant_pareto() -> Figure:
    """KL divergence from the shipped model to its quantized copies on the first 512 held-out
    tokens (minillm.quant.quantize_model; int3 / int2 with minillm.quant.group_quantize), against
    stored bits per linear weight."""
    import copy

    import torch

    from minillm.data import load_tokens
    from minillm.quant import dequantize, group_quantize, quantize_model
    model, tok = _model_and_tokenizer()
    x = load_tokens(tok, "val")[:512][None]
    names = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)
             and n != "lm_head"]
    shapes = [model.get_submodule(n).weight.shape for n in names]
    total = sum(N * K for N, K in shapes)

    def bits(b, G=None, zp=True):
        return sum(N * K * (b + 16 * (1 + zp) / (K if G is None else G))
                   for N, K in shapes) / total

    def lowbit(b, G):
        m = copy.deepcopy(model)
        with torch.no_grad():
            for n in names:
                w = m.get_submodule(n).weight
                w.copy_(dequantize(*group_quantize(w, G, b), G))
        return m

    with torch.no_grad():
        ref = model(x).log_softmax(-1)
        points = {}
        for label, b, m in [("int8 per channel", bits(8, zp=False), quantize_model(model, "int8")),
                            ("int8 per tensor", 8.0, quantize_model(model, "int8-tensor")),
                            ("int4 g=128", bits(4, 128), quantize_model(model, "int4-g128")),
                            ("int4 g=64", bits(4, 64), quantize_model(model, "int4-g64")),
                            ("int4 g=32", bits(4, 32), quantize_model(model, "int4-g32")),
                            ("int3 g=64", bits(3, 64), lowbit(3, 64)),
                            ("int2 g=64", bits(2, 64), lowbit(2, 64))]:
            lp = m(x).log_softmax(-1)
            points[label] = (b, (ref.exp() * (ref - lp)).sum(-1).mean().item())
    fig, ax = new_figure(8, 3.8)
    for label, (b, kl) in points.items():
        ax.plot(b, kl, "o", color=ORANGE if "int8" in label else BLUE)
        ax.annotate(label, (b, kl), fontsize=8, textcoords="offset points",
                    xytext=(-40, -13) if label == "int4 g=128" else (4, 3))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks([2, 3, 4, 8, 16], ["2", "3", "4", "8", "16"])
    ax.set_xlim(2, 16)
    ax.set_xlabel("stored bits per linear weight")
    ax.set_ylabel("KL to the float model (nats/token)")
    _style(ax)
    return fig


@figure
def outlier_features() -> Figure:
    """Largest |x| of every feature of the attention inputs (q_proj) and the down_proj inputs of
    the shipped model on 1024 training tokens (minillm.quant.linear_inputs); dashed: LLM.int8's
    threshold 6."""
    L = 6
    names = tuple(f"layers.{i}.{k}" for i in range(L) for k in ("self_attn.q_proj",
                                                                 "mlp.down_proj"))
    xs = _lab04_calib_inputs(names)
    fig, axes = new_figure(11, 3.4, nrows=1, ncols=2, sharey=True)
    colors = [BLUE, ORANGE, GREEN, RED, PURPLE, GREY]
    for ax, kind, title in ((axes[0], "self_attn.q_proj", "attention input (after RMSNorm)"),
                            (axes[1], "mlp.down_proj", "down_proj input (SwiGLU product)")):
        for i in range(L):
            ax.plot(xs[f"layers.{i}.{kind}"].abs().amax(0).numpy(), lw=0.7, color=colors[i],
                    label=f"layer {i}")
        ax.axhline(6.0, color="k", ls="--", lw=1)
        ax.set_yscale("log")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("feature (column)")
        _style(ax, grid=False)
    axes[0].set_ylabel("max |x|")
    axes[0].legend(fontsize=7, ncol=2)
    return fig


@figure
def awq_alpha() -> Figure:
    """minillm.quant.awq_search's output error against alpha (int4, groups of 64), relative to
    RTN (alpha = 0): a random layer whose inputs have 4 channels 30x larger than the rest, and two
    layers of the shipped model on calibration text."""
    import torch

    from minillm.quant import awq_search
    model, _ = _model_and_tokenizer()
    g = torch.Generator().manual_seed(0)
    lin = torch.nn.Linear(128, 64, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(64, 128, generator=g) * 0.05)
    salient = torch.ones(128)
    salient[torch.randperm(128, generator=g)[:4]] = 30.0
    cases = {"synthetic: 4 salient input channels": (lin, torch.randn(512, 128, generator=g)
                                                     * salient)}
    names = ("layers.2.self_attn.v_proj", "layers.5.mlp.down_proj")
    xs = _lab04_calib_inputs(names)
    for n in names:
        cases[f"shipped model: {n}"] = (model.get_submodule(n), xs[n])
    fig, ax = new_figure(8, 3.6)
    grid = 20
    for (label, (layer, x)), color in zip(cases.items(), (RED, BLUE, GREEN)):
        _, alpha, errors = awq_search(layer, x, group_size=64, grid=grid)
        ax.plot([i / grid for i in range(grid + 1)], [e / errors[0] for e in errors], "o-",
                ms=3, color=color, label=f"{label} (best α = {alpha:.2f})")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xlabel("α in s = mean|x|^α  (α = 0: plain round-to-nearest)")
    ax.set_ylabel("output error / RTN's")
    ax.legend(fontsize=8)
    _style(ax)
    return fig


@figure
def kv_int8_napkin() -> str:
    """Lab 01's napkin for Llama-2-13B on an H100 at S = 1000 with a bf16 and an int8 KV cache
    (1 byte per value; the per-token fp16 scales add 2/128 ≈ 1.6 %, left out), bf16 weights."""
    from minillm import roofline
    rows = []
    for label, kvb in (("bf16 cache", 2), ("int8 cache", 1)):
        b_max = roofline.max_batch_that_fits("llama-2-13b", "h100", 1000, kv_bytes_per_value=kvb)
        r64 = roofline.napkin("llama-2-13b", "h100", 64, 1000, kv_bytes_per_value=kvb)
        rmax = roofline.napkin("llama-2-13b", "h100", b_max, 1000, kv_bytes_per_value=kvb)
        rows.append([label, f"{r64['kv_bytes_per_seq'] / 1e6:.0f} MB",
                     f"{r64['memory_bytes'] / 1e9:.1f} GB, {r64['throughput_tok_s']:,.0f} tok/s",
                     f"{b_max}", f"{rmax['throughput_tok_s']:,.0f} tok/s"])
    return _table(["Llama-2-13B, S = 1000", "KV per sequence", "B = 64: read per step, throughput",
                   "largest batch", "throughput there"], rows)


@figure
def dequant_bytes() -> str:
    """Bytes one 4096 x 4096 linear layer moves at batch 1 in the formats of kernels/ (fp32
    scales and zeros, groups of 128) and the napkin floor on an H100 (3.35 TB/s)."""
    from minillm import roofline
    N = K = 4096
    G = 128
    bw = roofline.get_hardware("h100").mem_bandwidth_bytes_per_s
    moved = {"bf16 (cuBLAS)": 2 * N * K, "w8a16 (int8 + scale per row)": N * K + 4 * N,
             "w4a16 (int4 + scale, zero per 128)": N * K // 2 + 8 * N * (K // G)}
    rows = [[name, f"{b / 1e6:.1f} MB", f"{b / bw * 1e6:.1f} µs",
             f"<b>{moved['bf16 (cuBLAS)'] / b:.2f}×</b>"] for name, b in moved.items()]
    return _table(["weights", "bytes moved", "napkin floor", "faster than bf16"], rows)
