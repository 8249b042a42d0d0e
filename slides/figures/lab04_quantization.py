"""Figures for the deck of lab 04: quantization (slides/04_quantization.md)."""
from __future__ import annotations

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


def _lab04_calib_inputs(names: tuple) -> dict:
    """Inputs of the named linear layers on the first 1024 training tokens (lab 04's
    calibration text)."""
    import torch

    from minillm.data import load_text
    from minillm.quant import linear_inputs
    model, tok = model_and_tokenizer()
    ids = torch.tensor(tok.encode(load_text("train")[:20000]))[:1024].view(4, 256)
    return linear_inputs(model, ids, list(names))


@figure
def number_formats() -> str:
    """minillm.quant.format_table (read from torch.finfo), plus what one weight costs."""
    from minillm.quant import format_table
    rows = [[r["format"], str(r["bits"]), f"{r['bytes']:g}", f"{r['max']:.4g}",
             f"{r['eps']:.3g}" if r["format"] not in ("int8", "int4") else "uniform steps of s"]
            for r in format_table()]
    return html_table(["format", "bits", "bytes", "largest", "relative precision (eps)"], rows)


@figure
def quant_napkin() -> Figure:
    """Lab 01's napkin (minillm.roofline.napkin) for Llama-2-13B on an H100, batch 1, S = 1000,
    bf16 KV cache: weights at 16, 8 (+ a 16-bit scale per 5120-row) and 4 bits (+ 16-bit scale
    and zero per group)."""
    from minillm import roofline
    from minillm.quant import stored_bits_per_weight as bpw
    schemes = {"bf16": 16, "int8 per channel": bpw(8, 5120),
               "int4, g = 128": bpw(4, 128, zero_point=True),
               "int4, g = 64": bpw(4, 64, zero_point=True)}
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
    style_axes(ax)
    return fig


@figure
def row_scales() -> Figure:
    """Largest |w| of every output row of the shipped model's layers.0.mlp.down_proj: one
    per-tensor scale gives every row the step of the largest one."""
    model, _ = model_and_tokenizer()
    w = model.layers[0].mlp.down_proj.weight.detach()
    row_max = w.abs().amax(dim=1).sort(descending=True).values
    fig, ax = new_figure(7, 3.2)
    ax.plot(row_max.numpy(), color=BLUE, label="max |w| of the row (per-channel scale × 127)")
    ax.axhline(row_max[0].item(), color=RED, ls="--", lw=1, label="per-tensor: one max for all rows")
    ax.set_xlabel("output channel (sorted)")
    ax.set_ylabel("max |w|")
    ax.set_ylim(0, None)
    ax.legend(fontsize=9)
    style_axes(ax)
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
    table = html_table(head, rows)
    bytes_row = " &nbsp; ".join(f"byte {j}: <b>0x{b:02X}</b> = {codes[0, 2 * j].item()} | "
                                f"({codes[0, 2 * j + 1].item()} &lt;&lt; 4)"
                                for j, b in enumerate(packed))
    return table + f'<p class="small">{bytes_row}</p>'


@figure
def group_tradeoff() -> Figure:
    """Relative weight error ||W_hat - W|| / ||W|| over all of the shipped model's linear layers
    (minillm.quant.fake_quantize, round to nearest) against stored bits per weight
    (minillm.quant.linear_bits_per_weight: 16-bit scale and zero per group)."""
    import torch

    from minillm.quant import fake_quantize, linear_bits_per_weight
    model, _ = model_and_tokenizer()
    ws = [m.weight.detach() for n, m in model.named_modules()
          if isinstance(m, torch.nn.Linear) and n != "lm_head"]
    fig, ax = new_figure(8, 3.6)
    for bits, color in ((2, RED), (3, ORANGE), (4, BLUE)):
        pts = []
        for G in (16, 32, 64, 128, None):
            err = num = 0.0
            for w in ws:
                err += (fake_quantize(w, bits, G) - w).pow(2).sum().item()
                num += w.pow(2).sum().item()
            pts.append((linear_bits_per_weight(model, bits, G, zero_point=True),
                        (err / num) ** 0.5, G))
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color=color, label=f"int{bits}")
        for b, e, G in pts:
            ax.annotate("row" if G is None else f"g{G}", (b, e), fontsize=7,
                        xytext=(3, 3), textcoords="offset points")
    ax.set_yscale("log")
    ax.set_xlabel("stored bits per weight (codes + 16-bit scale and zero per group)")
    ax.set_ylabel("relative weight error")
    ax.legend(fontsize=9)
    style_axes(ax)
    return fig


@figure
def quant_pareto() -> Figure:
    """KL divergence from the shipped model to its quantized copies on the first 512 held-out
    tokens (minillm.quant.quantize_model; int3 / int2 with minillm.quant.fake_quantize_model),
    against stored bits per linear weight (minillm.quant.linear_bits_per_weight)."""
    import torch

    from minillm.data import load_tokens
    from minillm.quant import (
        fake_quantize,
        fake_quantize_model,
        linear_bits_per_weight,
        quantize_model,
    )
    model, tok = model_and_tokenizer()
    x = load_tokens(tok, "val")[:512][None]

    def bits(b, G=None, zp=True):
        return linear_bits_per_weight(model, b, G, zero_point=zp)

    def lowbit(b, G):
        return fake_quantize_model(model, lambda w: fake_quantize(w, b, G))

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
    style_axes(ax)
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
        style_axes(ax, grid=False)
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
    model, _ = model_and_tokenizer()
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
    style_axes(ax)
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
    return html_table(["Llama-2-13B, S = 1000", "KV per sequence", "B = 64: read per step, throughput",
                   "largest batch", "throughput there"], rows)


@figure
def dequant_bytes() -> str:
    """Bytes one 4096 x 4096 linear layer moves at batch 1 in the formats of kernels/ (fp32
    scales and zeros, groups of 128) and the napkin floor on an H100 (3.35 TB/s)."""
    from minillm import roofline
    from minillm.quant import stored_bits_per_weight as bpw
    N = K = 4096
    G = 128
    bw = roofline.get_hardware("h100").mem_bandwidth_bytes_per_s
    moved = {"bf16 (cuBLAS)": 2 * N * K,
             "w8a16 (int8 + scale per row)": N * K * bpw(8, K, scale_bits=32) / 8,
             "w4a16 (int4 + scale, zero per 128)": N * K * bpw(4, G, 32, zero_point=True) / 8}
    rows = [[name, f"{b / 1e6:.1f} MB", f"{b / bw * 1e6:.1f} µs",
             f"<b>{moved['bf16 (cuBLAS)'] / b:.2f}×</b>"] for name, b in moved.items()]
    return html_table(["weights", "bytes moved", "napkin floor", "faster than bf16"], rows)


@figure
def triton_program_map() -> Figure:
    """kernels.tiles.program_map: which program stores each of 100 values in blocks of 32 (the
    tracer kernel runs in Triton's interpreter without a GPU); lanes past n are masked."""
    import numpy as np

    from kernels.tiles import program_map
    owner = program_map(100, 32).numpy()
    lanes = np.full(128, -1)
    lanes[:100] = owner
    colours = [BLUE, ORANGE, GREEN, PURPLE]
    from matplotlib.patches import Rectangle
    fig, ax = new_figure(10, 1.9)
    for i, p in enumerate(lanes):
        ax.add_patch(Rectangle((i, 0), 1, 1, color=colours[p] if p >= 0 else "0.88", lw=0))
    for p in range(3):
        ax.text(p * 32 + 16, 0.5, f"program {p}\n{int((owner == p).sum())} live lanes",
                ha="center", va="center", fontsize=9, color="white")
    ax.text(98, 1.04, f"program 3: {int((owner == 3).sum())} live lanes", ha="center",
            va="bottom", fontsize=9)
    ax.text(114, 0.5, "program 3, masked:\noffs >= n", ha="center", va="center", fontsize=9)
    ax.set_xlim(0, 128)
    ax.set_ylim(0, 1)
    ax.set_yticks([])
    ax.set_xticks([0, 32, 64, 96, 100, 128])
    ax.set_xlabel("offs = program_id * BLOCK + tl.arange(0, BLOCK)    (n = 100, BLOCK = 32)")
    return fig


@figure
def triton_tile_walk() -> Figure:
    """kernels.tiles.tile_walk: for W [40, 96], the program that loads each element (colour)
    and the step of its loop over K (number), BLOCK_N = 16, BLOCK_K = 32."""
    from kernels.tiles import tile_walk
    prog, step = tile_walk(40, 96, 16, 32)
    fig, ax = new_figure(7.5, 3.4)
    from matplotlib.colors import ListedColormap
    ax.imshow(prog.numpy(), aspect="auto", interpolation="nearest",
              cmap=ListedColormap([BLUE, ORANGE, GREEN]))
    for p in range(3):
        rows = (prog[:, 0] == p).nonzero().flatten()
        for s in range(int(step.max()) + 1):
            ax.text(s * 32 + 15.5, float(rows.float().mean()), f"step {s}", ha="center",
                    va="center", color="white", fontsize=9)
    for edge in (31.5, 63.5):
        ax.axvline(edge, color="white", lw=1.5)
    ax.set_xlabel("k  (tiles of BLOCK_K = 32; K = 96)")
    ax.set_ylabel("n  (BLOCK_N = 16 rows per program;\nthe last has 8: masked)")
    return fig


@figure
def w4_tile_groups() -> Figure:
    """One program's walk over K = 256 packed int4 codes in tiles of BLOCK_K = 64
    (kernels.tiles.tile_walk) against the groups of G = 32 and G = 128: the group index must be
    taken per k (k // G), not once per tile."""
    from kernels.tiles import tile_walk
    _, step = tile_walk(1, 256, 1, 64)
    k = list(range(256))
    fig, axes = new_figure(10, 2.6, nrows=3, sharex=True)
    rows = [("tile (loop step)", step[0].tolist()), ("group, G = 32", [i // 32 for i in k]),
            ("group, G = 128", [i // 128 for i in k])]
    colours = [BLUE, ORANGE, GREEN, PURPLE, RED, SKY, GREY, "0.6"]
    for ax, (label, idx) in zip(axes, rows):
        for i, g in enumerate(idx):
            ax.axvspan(i, i + 1, color=colours[g % len(colours)], lw=0)
        for g in sorted(set(idx)):
            first = idx.index(g)
            width = idx.count(g)
            ax.text(first + width / 2, 0.5, str(g), ha="center", va="center", color="white",
                    fontsize=9)
        ax.set_yticks([])
        ax.set_ylabel(label, rotation=0, ha="right", va="center", fontsize=9)
        ax.set_xlim(0, 256)
    axes[-1].set_xlabel("k (byte k // 2 holds it: low nibble for even k, high for odd)")
    return fig
