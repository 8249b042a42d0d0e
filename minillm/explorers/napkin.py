"""Interactive explorers (ipywidgets) on the roofline napkin math of `minillm.roofline`.

    from minillm.explorers import napkin_explorer
    napkin_explorer()                       # in JupyterLab: a panel of controls, readouts and a plot

Pick a model (or type your own D, L, N, K, H, F, V), a GPU (or your own bandwidth and HBM size),
a batch size B, a context length S and the bytes per parameter. The readout shows what one decode
step of the whole batch costs according to the lecture's formulas

    memory     = B * S*K*H*L*2*bytes + params * bytes
    latency    = memory / bandwidth          (decoding is memory-bound)
    throughput = B / latency

and the plot shows the latency/throughput trade-off over batch sizes, with the batch size at
which the KV cache fills the GPU's memory marked. With "GPUs" above 1 the model is split over
that many GPUs (tensor parallelism, `minillm.roofline.tensor_parallel_napkin`): each reads its
share of the bytes, and two all-reduces per layer cross the chosen link; the readout also gives
the same GPUs running copies of the model. Nothing here is new math: every number comes
from `minillm.roofline` (`napkin`, `tensor_parallel_napkin`, `max_batch_that_fits`), so the
explorer and the lab agree. Lab 01 hands it the student's own functions instead
(`formulas=`, in the lecture's notation: `LectureFormulas`).

The returned `NapkinExplorer` is itself the widget (a VBox). For scripts and tests it exposes
`controls` (name -> widget), `readout` (an HTML widget with CSS class `minillm-napkin-readout`),
`plot` (an Output widget, class `minillm-napkin-plot`) and `state` (the last napkin row, curve,
plotted data and error message).
"""
from __future__ import annotations

import dataclasses
import html
import math

import ipywidgets as widgets
from matplotlib.figure import Figure

from .. import roofline as rf
from ..config import ModelConfig
from .display import LAYOUT, SLIDER_LAYOUT, STYLE, show_png

CUSTOM = "custom"

# (ModelConfig field, widget description): the lecture's letters first, so students recognise them
DIM_FIELDS = (
    ("dim", "D (model dim)"),
    ("n_layers", "L (layers)"),
    ("n_heads", "N (query heads)"),
    ("n_kv_heads", "K (KV heads)"),
    ("head_dim", "H (head dim)"),
    ("hidden_dim", "F (MLP dim)"),
    ("vocab_size", "V (vocab)"),
)
BYTES_PER_PARAM = (("fp32 (4 bytes)", 4.0), ("bf16 (2 bytes)", 2.0),
                   ("int8 / fp8 (1 byte)", 1.0), ("int4 (0.5 byte)", 0.5))
READOUT_CLASS = "minillm-napkin-readout"
PLOT_CLASS = "minillm-napkin-plot"
ERROR_CLASS = "minillm-napkin-error"


class CourseFormulas:
    """The explorer's numbers from `minillm.roofline` (the default)."""

    def napkin(self, cfg, hw, batch, seq_len, bpp) -> dict:
        return rf.napkin(cfg, hw, batch, seq_len, bytes_per_param=bpp)

    def split(self, cfg, hw, batch, seq_len, gpus, link, bpp, alpha_s) -> dict:
        return rf.tensor_parallel_napkin(cfg, hw, batch, seq_len, gpus, link,
                                         bytes_per_param=bpp, allreduce_latency_s=alpha_s)

    def max_batch(self, cfg, hw, seq_len, bpp, gpus, link, alpha_s) -> int:
        if gpus == 1:
            return rf.max_batch_that_fits(cfg, hw, seq_len, bytes_per_param=bpp)
        return self.split(cfg, hw, 1, seq_len, gpus, link, bpp, alpha_s)["max_batch"]


LECTURE_FORMULAS = ("napkin", "tensor_parallel", "max_batch_that_fits", "accelerator_intensity")


class LectureFormulas:
    """The explorer's numbers from lab 01's four functions, in the lecture's notation:

        napkin(B, S, model, gpu, bytes_per_param)         -> params, param_bytes,
            kv_bytes_per_seq, memory_bytes, latency_s, throughput_tok_s, fits
        tensor_parallel(B, S, model, gpu, G, link_bandwidth, allreduce_latency_s,
                        bytes_per_param)                  -> memory_per_gpu_bytes, comm_s,
            latency_s, throughput_tok_s, fits
        max_batch_that_fits(S, model, gpu, bytes_per_param) -> an int
        accelerator_intensity(flops_per_s, bytes_per_s)   -> FLOPs per byte

    with model = {D, F, N, K, H, L, V} and gpu = {flops, bandwidth, memory}. What the lecture's
    functions do not return is read off them: the throughput limit as B grows is 1 / (the
    latency one more sequence adds), the largest batch split over G GPUs the largest B whose
    `tensor_parallel` fits. They count what the lecture counts (every layer attends, the output
    head is not tied to the embedding). Whatever a function raises, or a result it lacks, is a
    ValueError naming it: the explorer shows it."""

    def __init__(self, formulas):
        missing = [name for name in LECTURE_FORMULAS if not callable(formulas.get(name))]
        if missing:
            raise ValueError(f"formulas needs the functions {list(LECTURE_FORMULAS)}; "
                             f"missing or not callable: {missing}")
        self.formulas = {name: formulas[name] for name in LECTURE_FORMULAS}

    def _call(self, name, *args, **kwargs):
        try:
            return self.formulas[name](*args, **kwargs)
        except Exception as e:      # noqa: BLE001 - the student's function: shown, not raised
            raise ValueError(f"your {name} raised {type(e).__name__}: {e}") from e

    @staticmethod
    def _number(result, key: str, name: str) -> float:
        try:
            return float(result[key])
        except Exception as e:      # noqa: BLE001
            raise ValueError(f"your {name} returned no number under {key!r}: "
                             f"{type(e).__name__}: {e}") from e

    @staticmethod
    def model(cfg) -> dict:
        return dict(D=cfg.dim, F=cfg.hidden_dim, N=cfg.n_heads, K=cfg.n_kv_heads,
                    H=cfg.head_dim, L=cfg.n_layers, V=cfg.vocab_size)

    @staticmethod
    def gpu(hw) -> dict:
        return dict(flops=hw.flops_per_s, bandwidth=hw.mem_bandwidth_bytes_per_s,
                    memory=hw.memory_bytes)

    def _napkin(self, cfg, hw, batch, seq_len, bpp) -> dict:
        r = self._call("napkin", batch, seq_len, self.model(cfg), self.gpu(hw),
                       bytes_per_param=bpp)
        out = {k: self._number(r, k, "napkin") for k in (
            "params", "param_bytes", "kv_bytes_per_seq", "memory_bytes", "latency_s",
            "throughput_tok_s")}
        try:
            out["fits"] = bool(r["fits"])
        except Exception as e:      # noqa: BLE001
            raise ValueError(f"your napkin returned no 'fits': {type(e).__name__}: {e}") from e
        return out

    def _limit(self, latency, what: str) -> float:
        """B / latency(B) as B grows: 1 / (latency(2) - latency(1)) for a latency linear in B."""
        per_seq = latency(2) - latency(1)
        if not (per_seq > 0 and math.isfinite(per_seq)):
            raise ValueError(f"your {what}'s latency does not grow with B (B = 1: "
                             f"{latency(1):.4g} s, B = 2: {latency(2):.4g} s): each sequence "
                             f"adds its KV cache")
        return 1 / per_seq

    def napkin(self, cfg, hw, batch, seq_len, bpp) -> dict:
        r = self._napkin(cfg, hw, batch, seq_len, bpp)
        intensity = self._call("accelerator_intensity", hw.flops_per_s,
                               hw.mem_bandwidth_bytes_per_s)
        return {"gpu": hw.name, "batch": batch, "seq_len": seq_len, "kv_heads": cfg.n_kv_heads,
                "n_heads": cfg.n_heads, "bytes_per_param": bpp, "kv_bytes_per_value": bpp, **r,
                "kv_bytes": batch * r["kv_bytes_per_seq"],
                "max_throughput_tok_s": self._limit(
                    lambda b: self._napkin(cfg, hw, b, seq_len, bpp)["latency_s"], "napkin"),
                "accelerator_intensity": self._number({"x": intensity}, "x",
                                                      "accelerator_intensity")}

    def _split(self, cfg, hw, batch, seq_len, gpus, link, bpp, alpha_s) -> dict:
        if cfg.n_heads % gpus or cfg.n_kv_heads % gpus:
            raise ValueError(f"G = {gpus} GPUs must divide N = {cfg.n_heads} query heads and "
                             f"K = {cfg.n_kv_heads} KV heads (tensor_parallel gives each GPU "
                             f"whole heads)")
        link_bw = rf.LINKS[link] if isinstance(link, str) else link
        r = self._call("tensor_parallel", batch, seq_len, self.model(cfg), self.gpu(hw), gpus,
                       link_bw, allreduce_latency_s=alpha_s, bytes_per_param=bpp)
        out = {k: self._number(r, k, "tensor_parallel") for k in (
            "memory_per_gpu_bytes", "comm_s", "latency_s", "throughput_tok_s")}
        try:
            out["fits"] = bool(r["fits"])
        except Exception as e:      # noqa: BLE001
            raise ValueError(f"your tensor_parallel returned no 'fits': "
                             f"{type(e).__name__}: {e}") from e
        return out

    def split(self, cfg, hw, batch, seq_len, gpus, link, bpp, alpha_s) -> dict:
        one = self._napkin(cfg, hw, batch, seq_len, bpp)
        r = self._split(cfg, hw, batch, seq_len, gpus, link, bpp, alpha_s)
        return {"gpus": gpus, **r, "copies_latency_s": one["latency_s"],
                "copies_throughput_tok_s": gpus * one["throughput_tok_s"],
                "copies_fit": one["fits"],
                "max_throughput_tok_s": self._limit(lambda b: self._split(
                    cfg, hw, b, seq_len, gpus, link, bpp, alpha_s)["latency_s"],
                    "tensor_parallel")}

    def max_batch(self, cfg, hw, seq_len, bpp, gpus, link, alpha_s) -> int:
        if gpus == 1:
            got = self._call("max_batch_that_fits", seq_len, self.model(cfg), self.gpu(hw),
                             bytes_per_param=bpp)
            try:
                return int(got)
            except Exception as e:  # noqa: BLE001
                raise ValueError(f"your max_batch_that_fits returned {got!r}, not an "
                                 f"integer") from e

        def fits(b):
            return self._split(cfg, hw, b, seq_len, gpus, link, bpp, alpha_s)["fits"]
        if not fits(1):
            return 0
        lo, cap = 1, 1 << 40
        while lo < cap and fits(2 * lo):          # fits(lo); then fits(lo) and not fits(hi)
            lo *= 2
        hi = 2 * lo
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        return lo


def plot_batches(max_batch: int, batch: int, cap: int = 4096) -> list[int]:
    """Batch sizes for the curve: powers of two up to a little past the memory limit (at least
    up to the chosen batch), plus the chosen batch and the largest batch that fits."""
    top = min(cap, max(8, 4 * max_batch, batch))
    batches, b = set(), 1
    while b <= top:
        batches.add(b)
        b *= 2
    batches.add(batch)
    if max_batch >= 1:
        batches.add(max_batch)
    return sorted(batches)


class NapkinExplorer(widgets.VBox):
    """Controls -> `minillm.roofline.napkin` -> readout + latency/throughput plot.

    `formulas`: None (`minillm.roofline`'s), or lab 01's functions {"napkin",
    "tensor_parallel", "max_batch_that_fits", "accelerator_intensity"} (`LectureFormulas`)."""

    def __init__(self, model: str = "llama-2-13b", gpu: str = "h100", batch: int = 64,
                 seq_len: int = 1000, kv_heads: int | None = None, bytes_per_param: float = 2.0,
                 max_batch_slider: int = 1024, max_seq_len_slider: int = 32768,
                 formulas: dict | None = None):
        self.formulas = CourseFormulas() if formulas is None else LectureFormulas(formulas)
        base = rf.get_model(model)
        hw = rf.get_hardware(gpu)
        self._syncing = False
        self._holding = False    # set(): many controls, one redraw
        self._base = base        # the last preset picked: a custom model keeps its tied/untied head
        self.state: dict = {}
        c: dict[str, widgets.Widget] = {}
        c["model"] = widgets.Dropdown(options=list(rf.MODELS) + [CUSTOM], value=model,
                                      description="model", style=STYLE, layout=LAYOUT)
        for name, desc in DIM_FIELDS:
            value = getattr(base, name) if name != "n_kv_heads" or kv_heads is None else kv_heads
            c[name] = widgets.IntText(value=value, description=desc, style=STYLE, layout=LAYOUT)
        c["gpu"] = widgets.Dropdown(options=list(rf.HARDWARE) + [CUSTOM], value=hw.name,
                                    description="GPU", style=STYLE, layout=LAYOUT)
        c["bandwidth_tb_s"] = widgets.FloatText(value=hw.mem_bandwidth_bytes_per_s / 1e12,
                                                description="bandwidth (TB/s)", style=STYLE,
                                                layout=LAYOUT)
        c["memory_gb"] = widgets.FloatText(value=hw.memory_bytes / 1e9, description="HBM (GB)",
                                           style=STYLE, layout=LAYOUT)
        c["peak_tflops"] = widgets.FloatText(value=hw.flops_per_s / 1e12,
                                             description="peak (TFLOP/s)", style=STYLE,
                                             layout=LAYOUT)
        c["batch"] = widgets.IntSlider(value=batch, min=1, max=max(max_batch_slider, batch),
                                       description="batch B", continuous_update=False,
                                       style=STYLE, layout=SLIDER_LAYOUT)
        c["seq_len"] = widgets.IntSlider(value=seq_len, min=1,
                                         max=max(max_seq_len_slider, seq_len),
                                         description="seq len S", continuous_update=False,
                                         style=STYLE, layout=SLIDER_LAYOUT)
        c["bytes_per_param"] = widgets.Dropdown(options=BYTES_PER_PARAM,
                                                value=float(bytes_per_param),
                                                description="bytes/param", style=STYLE,
                                                layout=LAYOUT)
        c["gpus"] = widgets.Dropdown(options=[1, 2, 4, 8, 16], value=1, description="GPUs G",
                                     style=STYLE, layout=LAYOUT)
        c["link"] = widgets.Dropdown(options=list(rf.LINKS), value="nvlink-h100",
                                     description="link", style=STYLE, layout=LAYOUT)
        c["allreduce_us"] = widgets.FloatText(value=5.0, description="all-reduce α (µs)",
                                              style=STYLE, layout=LAYOUT)
        self.controls = c
        for w in c.values():
            w.observe(self._on_change, names="value")

        self.readout = widgets.HTML().add_class(READOUT_CLASS)
        self.plot = widgets.Output(layout=widgets.Layout(min_width="480px")).add_class(PLOT_CLASS)
        model_box = widgets.VBox([widgets.HTML("<b>model</b>"), c["model"]] +
                                 [c[name] for name, _ in DIM_FIELDS])
        gpu_box = widgets.VBox([widgets.HTML("<b>GPU</b>"), c["gpu"], c["bandwidth_tb_s"],
                                c["memory_gb"], c["peak_tflops"]])
        work_box = widgets.VBox([widgets.HTML("<b>workload</b>"), c["batch"], c["seq_len"],
                                 c["bytes_per_param"], widgets.HTML("<b>GPUs</b>"), c["gpus"],
                                 c["link"], c["allreduce_us"]])
        title = widgets.HTML("<b>Napkin math of one decode step</b> (memory-bound: "
                             "latency = bytes / bandwidth)")
        super().__init__([title, widgets.HBox([
            widgets.VBox([model_box, gpu_box, work_box]),
            widgets.VBox([self.readout, self.plot]),
        ])])
        self.add_class("minillm-napkin-explorer")
        self.update()

    # ---- control syncing ----------------------------------------------------------------
    def _on_change(self, change):
        if self._syncing:
            return
        owner = change["owner"]
        c = self.controls
        self._syncing = True
        try:
            if owner is c["model"] and change["new"] != CUSTOM:
                cfg = self._base = rf.get_model(change["new"])
                for name, _ in DIM_FIELDS:
                    c[name].value = getattr(cfg, name)
            elif owner is c["gpu"] and change["new"] != CUSTOM:
                hw = rf.get_hardware(change["new"])
                c["bandwidth_tb_s"].value = hw.mem_bandwidth_bytes_per_s / 1e12
                c["memory_gb"].value = hw.memory_bytes / 1e9
                c["peak_tflops"].value = hw.flops_per_s / 1e12
            elif any(owner is c[name] for name, _ in DIM_FIELDS if name != "n_kv_heads"):
                # K is a what-if on top of a preset (GQA); any other dimension makes a new model
                if c["model"].value != CUSTOM and self._dims() != self._preset_dims():
                    c["model"].value = CUSTOM
            elif owner in (c["bandwidth_tb_s"], c["memory_gb"], c["peak_tflops"]):
                if c["gpu"].value != CUSTOM:
                    c["gpu"].value = CUSTOM
        finally:
            self._syncing = False
        if not self._holding:
            self.update()

    def set(self, **values) -> dict:
        """Set several controls (by their `controls` names) and redraw once, e.g.
        ``ex.set(model="llama-2-13b", gpu="h100", batch=256, n_kv_heads=8)``. A model or GPU
        preset is applied first, so the other values override its fields."""
        unknown = set(values) - set(self.controls)
        if unknown:
            raise ValueError(f"unknown controls {sorted(unknown)}; choose from {sorted(self.controls)}")
        order = sorted(values, key=lambda k: k not in ("model", "gpu"))
        self._holding = True
        try:
            for name in order:
                self.controls[name].value = values[name]
        finally:
            self._holding = False
        return self.update()

    def _dims(self) -> dict:
        return {name: self.controls[name].value for name, _ in DIM_FIELDS if name != "n_kv_heads"}

    def _preset_dims(self) -> dict:
        cfg = rf.get_model(self.controls["model"].value)
        return {name: getattr(cfg, name) for name, _ in DIM_FIELDS if name != "n_kv_heads"}

    # ---- what the controls describe -------------------------------------------------------
    def model_config(self) -> ModelConfig:
        """The model the controls describe (raises ValueError on an impossible shape)."""
        c = self.controls
        base = rf.get_model(c["model"].value) if c["model"].value != CUSTOM else self._base
        values = {name: c[name].value for name, _ in DIM_FIELDS}
        for name, value in values.items():
            if value is None or value < 1:
                raise ValueError(f"{dict(DIM_FIELDS)[name]} must be a positive integer, got {value}")
        n, k = values["n_heads"], values["n_kv_heads"]
        if n % k:
            divisors = [d for d in range(1, n + 1) if n % d == 0]
            raise ValueError(f"K = {k} KV heads does not divide N = {n} query heads (each KV head "
                             f"serves a whole group of query heads); try one of {divisors}")
        return dataclasses.replace(base, **values)

    def hardware(self) -> rf.Hardware:
        c = self.controls
        name = c["gpu"].value
        if name != CUSTOM:
            return rf.get_hardware(name)   # exact preset figures (no TB/s -> bytes/s rounding)
        return rf.Hardware(name, flops_per_s=c["peak_tflops"].value * 1e12,
                           mem_bandwidth_bytes_per_s=c["bandwidth_tb_s"].value * 1e12,
                           memory_bytes=c["memory_gb"].value * 1e9)

    # ---- recompute ------------------------------------------------------------------------
    def update(self) -> dict:
        c = self.controls
        try:
            cfg, hw = self.model_config(), self.hardware()
            batch, seq_len, bpp = c["batch"].value, c["seq_len"].value, c["bytes_per_param"].value
            G = c["gpus"].value
            alpha = c["allreduce_us"].value
            if alpha is None or alpha < 0:
                raise ValueError(f"the all-reduce latency must be >= 0 µs, got {alpha}")

            f, link, alpha_s = self.formulas, c["link"].value, alpha * 1e-6

            def step(b):
                one = f.napkin(cfg, hw, b, seq_len, bpp)
                if G == 1:
                    return one
                tp = f.split(cfg, hw, b, seq_len, G, link, bpp, alpha_s)
                return {**one, **{k: tp[k] for k in (
                    "gpus", "latency_s", "throughput_tok_s", "fits", "memory_per_gpu_bytes",
                    "comm_s", "copies_latency_s", "copies_throughput_tok_s", "copies_fit",
                    "max_throughput_tok_s")}}

            row = step(batch)
            max_batch = f.max_batch(cfg, hw, seq_len, bpp, G, link, alpha_s)
            rows = [step(b) for b in plot_batches(max_batch, batch)]
            at_cap = step(max_batch) if max_batch >= 1 else None
            curve = {"batch": [r["batch"] for r in rows],
                     "latency_ms": [1e3 * r["latency_s"] for r in rows],
                     "throughput_tok_s": [r["throughput_tok_s"] for r in rows],
                     "fits": [r["fits"] for r in rows],
                     "max_throughput_tok_s": row["max_throughput_tok_s"]}
        except (ValueError, TypeError) as e:
            self._show_error(str(e))
            return self.state
        row["model"] = c["model"].value
        capacity = None
        if at_cap is not None:
            capacity = {"batch": max_batch, "latency_ms": 1e3 * at_cap["latency_s"],
                        "throughput_tok_s": at_cap["throughput_tok_s"],
                        "memory_bytes": hw.memory_bytes}
        plot = {"batch": curve["batch"], "latency_ms": curve["latency_ms"],
                "throughput_tok_s": curve["throughput_tok_s"], "fits": curve["fits"],
                "current": {"batch": batch, "latency_ms": 1e3 * row["latency_s"],
                            "throughput_tok_s": row["throughput_tok_s"]},
                "capacity": capacity, "max_throughput_tok_s": curve["max_throughput_tok_s"]}
        self.state = {"error": None, "config": cfg, "hardware": hw, "row": row, "curve": curve,
                      "max_batch": max_batch, "plot": plot}
        self.readout.value = self._readout_html(row, hw, max_batch)
        self.state["readout_text"] = self.readout.value
        self._draw(plot, row, hw)
        return self.state

    def _show_error(self, message: str):
        self.state = {"error": message, "row": None, "curve": None, "plot": None}
        self.readout.value = (f'<div class="{ERROR_CLASS}" style="color:#b00020">'
                              f"<b>Cannot compute this combination:</b> {html.escape(message)}"
                              "</div>")
        self.state["readout_text"] = self.readout.value
        self.plot.outputs = ()

    @staticmethod
    def _readout_html(row: dict, hw: rf.Hardware, max_batch: int) -> str:
        G = row.get("gpus", 1)
        fits = ('<span style="color:#1b7f3b"><b>fits</b></span>' if row["fits"] else
                '<span style="color:#b00020"><b>does NOT fit</b></span>')
        cap = (f"largest batch that fits: <b>B = {max_batch}</b>" if max_batch >= 1 else
               "the weights alone do not fit in HBM")
        lines = [
            f"weights: {row['params'] / 1e9:.2f} B params = {row['param_bytes'] / 1e9:.1f} GB",
            f"KV cache: {row['batch']} &times; {row['kv_bytes_per_seq'] / 1e6:.1f} MB = "
            f"{row['kv_bytes'] / 1e9:.1f} GB",
            (f"memory: <b>{row['memory_bytes'] / 1e9:.1f} GB</b> of {hw.memory_bytes / 1e9:.0f} GB"
             f" &rarr; {fits}" if G == 1 else
             f"memory: {row['memory_bytes'] / 1e9:.1f} GB split over {G} GPUs = <b>"
             f"{row['memory_per_gpu_bytes'] / 1e9:.1f} GB per GPU</b> of "
             f"{hw.memory_bytes / 1e9:.0f} GB &rarr; {fits}"),
            f"latency: <b>{row['latency_s'] * 1e3:.2f} ms</b> per token",
            f"throughput: <b>{row['throughput_tok_s']:.1f} tok/s</b> "
            f"(limit as B &rarr; &infin;: {row['max_throughput_tok_s']:.0f} tok/s)",
            cap,
            f"accelerator intensity: {row['accelerator_intensity']:.0f} FLOPs/byte",
        ]
        if G > 1:
            copies_fit = "fits" if row["copies_fit"] else "does NOT fit on one GPU"
            lines[3:3] = [f"all-reduces: {row['comm_s'] * 1e3:.3f} ms of the step"]
            lines.append(f"{G} copies instead (B = {row['batch']} each): "
                         f"{row['copies_latency_s'] * 1e3:.2f} ms per token, "
                         f"{row['copies_throughput_tok_s']:.0f} tok/s in all ({copies_fit})")
        return "<div>" + "<br>".join(lines) + "</div>"

    def _draw(self, plot: dict, row: dict, hw: rf.Hardware):
        fig = Figure(figsize=(5.6, 3.8), dpi=80)
        ax = fig.add_subplot()
        lat, thr, fits = plot["latency_ms"], plot["throughput_tok_s"], plot["fits"]
        ax.plot([x for x, f in zip(lat, fits) if f], [y for y, f in zip(thr, fits) if f],
                "o-", color="C0", label="fits in HBM")
        if not all(fits):
            i0 = max(0, fits.index(False) - 1) if False in fits else 0
            ax.plot(lat[i0:], thr[i0:], "o--", color="0.6", label="needs more HBM")
        for b, x, y in zip(plot["batch"], lat, thr):
            if b & (b - 1) == 0 and b >= 4:
                ax.annotate(f"B={b}", (x, y), textcoords="offset points", xytext=(4, -10),
                            fontsize=7, color="0.35")
        ax.axhline(plot["max_throughput_tok_s"], color="0.5", lw=0.8, ls=":")
        cap = plot["capacity"]
        if cap is not None:
            ax.axvline(cap["latency_ms"], color="C3", lw=1, ls="--",
                       label=f"HBM full ({hw.memory_bytes / 1e9:.0f} GB): B = {cap['batch']}")
        cur = plot["current"]
        ax.plot([cur["latency_ms"]], [cur["throughput_tok_s"]], "*", ms=14, color="C1",
                label=f"B = {cur['batch']}")
        ax.set_xlabel("latency per token (ms)")
        ax.set_ylabel("throughput (tokens/s)")
        ax.set_ylim(0, 1.08 * plot["max_throughput_tok_s"])
        split = f", split over {row['gpus']} GPUs" if row.get("gpus", 1) > 1 else ""
        ax.set_title(f"{row['model']} on {hw.name}{split}, S = {row['seq_len']}, "
                     f"K = {row['kv_heads']}", fontsize=9)
        ax.legend(fontsize=7, loc="lower right")
        ax.grid(alpha=0.3)
        fig.subplots_adjust(left=0.14, right=0.97, bottom=0.13, top=0.92)   # cheaper than tight_layout
        self.state["png"] = show_png(self.plot, fig,
                                     f"<latency/throughput plot, B = {cur['batch']}>")


def napkin_explorer(**kwargs) -> NapkinExplorer:
    """Build the explorer; display it by leaving it as the last expression of a cell.
    Keyword arguments set the starting values (model, gpu, batch, seq_len, kv_heads,
    bytes_per_param) and `formulas` (default `minillm.roofline`'s; lab 01 passes the
    student's napkin, tensor_parallel, max_batch_that_fits and accelerator_intensity)."""
    return NapkinExplorer(**kwargs)
