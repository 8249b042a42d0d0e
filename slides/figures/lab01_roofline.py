"""Figures for the deck of lab 01: arithmetic intensity and the roofline (slides/01_roofline.md)."""
from __future__ import annotations

from matplotlib.figure import Figure

from .common import BLUE, GREEN, GREY, ORANGE, RED, SKY, figure, html_table, new_figure, style_axes


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
    return html_table(["GPU", "bf16 peak", "HBM bandwidth", "HBM", "accelerator intensity"], rows)


def _derivation(lines: list[str]) -> str:
    """Display-math lines (mathtext) as HTML: a figure that scales with the slide's text."""
    from slides.mathrender import math_html
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
    style_axes(ax)
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
    style_axes(ax)
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
    style_axes(ax)
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
    style_axes(ax)
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
    return html_table(["K (KV heads)", "batch B", "memory", "fits in 80 GB?", "latency / token",
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
        style_axes(ax)
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
    style_axes(ax)
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


@figure
def tensor_parallel() -> Figure:
    """minillm.roofline.tensor_parallel_napkin: Llama-2-13B on 4 H100s, S = 1000, as 4 copies
    or split 4 ways over NVLink / PCIe (all-reduce latency 5 µs), B = 1, 2, 4, ... while it fits."""
    from minillm import roofline as rf
    fig, ax = new_figure(8, 4.2)
    batches = [2 ** k for k in range(10)]
    rows = [rf.tensor_parallel_napkin("llama-2-13b", "h100", b, 1000, 4, "nvlink-h100",
                                      allreduce_latency_s=5e-6) for b in batches]
    ax.plot([1e3 * r["copies_latency_s"] for r in rows if r["copies_fit"]],
            [r["copies_throughput_tok_s"] for r in rows if r["copies_fit"]], "o-", color=BLUE,
            label="4 copies (no communication)")
    for link, label, colour in (("nvlink-h100", "split 4 ways, NVLink 450 GB/s", GREEN),
                                ("pcie", "split 4 ways, PCIe 60 GB/s", ORANGE)):
        rs = [rf.tensor_parallel_napkin("llama-2-13b", "h100", b, 1000, 4, link,
                                        allreduce_latency_s=5e-6) for b in batches]
        ax.plot([1e3 * r["latency_s"] for r in rs if r["fits"]],
                [r["throughput_tok_s"] for r in rs if r["fits"]], "s-", color=colour, label=label)
    ax.set_xlabel("latency per token (ms)")
    ax.set_ylabel("tokens / s, all 4 GPUs")
    ax.legend(fontsize=9)
    style_axes(ax)
    return fig
