"""Lab 05's explorer: speculative sampling's expected speed-up against acceptance rate alpha,
draft length k and draft cost c (the formulas of `minillm.speculative`), next to measured runs."""
from __future__ import annotations

import html

import ipywidgets as widgets
from matplotlib.figure import Figure

from .display import SLIDER_LAYOUT, STYLE, show_png, side_panel

# --- lab 05: speculative sampling -------------------------------------------------------------
SPEC_READOUT_CLASS = "minillm-spec-readout"
SPEC_PLOT_CLASS = "minillm-spec-plot"
SPEC_ERROR_CLASS = "minillm-spec-error"
SPEC_FORMULAS = ("expected_tokens_per_step", "expected_speedup")


class SpeculativeExplorer(widgets.VBox):
    """Sliders alpha, k, c (and beta, the verification cost) -> the formulas of
    `minillm.speculative`, drawn against k, with measured points overlaid.

        E[tokens per step] = (1 - alpha^(k+1)) / (1 - alpha)
        speed-up           = E[tokens per step] / (k c + v),   v = 1 + beta k

    beta = 0 is the lecture's picture (scoring k + 1 tokens costs one step: memory-bound); a CPU
    core or a tiny model is nearer the ridge and pays beta > 0 per extra scored token.
    `measured`: one dict or a list of dicts with `k`, `tokens_per_step` and/or `speedup` (and an
    optional `label`), e.g. rows of `minillm bench speculative --json`'s "runs".
    `formulas`: {"expected_tokens_per_step": f(alpha, k), "expected_speedup": g(alpha, k, c,
    verify_cost)} to draw instead of `minillm.speculative`'s (lab 05 hands in the student's);
    what they raise is shown in the readout.
    """

    def __init__(self, alpha: float = 0.7, k: int = 4, c: float = 0.1, beta: float = 0.0,
                 measured=None, max_k: int = 12, formulas: dict | None = None):
        from .. import speculative as spec
        if formulas is None:
            formulas = {name: getattr(spec, name) for name in SPEC_FORMULAS}
        missing = [name for name in SPEC_FORMULAS if not callable(formulas.get(name))]
        if missing:
            raise ValueError(f"formulas needs the functions {list(SPEC_FORMULAS)}; missing or "
                             f"not callable: {missing}")
        self.formulas = {name: formulas[name] for name in SPEC_FORMULAS}
        self.measured = self._check_measured(measured)
        self._holding = False
        self.state: dict = {}
        top_k = max(max_k, k, *(int(m["k"]) for m in self.measured)) if self.measured else \
            max(max_k, k)
        c_ = {"alpha": widgets.FloatSlider(value=alpha, min=0.0, max=0.99, step=0.01,
                                           description="α (acceptance)", continuous_update=False,
                                           style=STYLE, layout=SLIDER_LAYOUT),
              "k": widgets.IntSlider(value=k, min=1, max=top_k, description="k (drafts/step)",
                                     continuous_update=False, style=STYLE,
                                     layout=SLIDER_LAYOUT),
              "c": widgets.FloatSlider(value=c, min=0.0, max=1.0, step=0.01,
                                       description="c (draft/target)", continuous_update=False,
                                       style=STYLE, layout=SLIDER_LAYOUT),
              "beta": widgets.FloatSlider(value=beta, min=0.0, max=1.0, step=0.01,
                                          description="β (verify/token)",
                                          continuous_update=False, style=STYLE,
                                          layout=SLIDER_LAYOUT)}
        self.controls = c_
        for w in c_.values():
            w.observe(self._on_change, names="value")
        self.readout, self.plot = side_panel(SPEC_READOUT_CLASS, SPEC_PLOT_CLASS)
        title = widgets.HTML("<b>Speculative sampling</b>: expected tokens per target pass and "
                             "speed-up against k")
        super().__init__([title, widgets.HBox([widgets.VBox(list(c_.values())), self.readout]),
                          self.plot])
        self.add_class("minillm-spec-explorer")
        self.update()

    @staticmethod
    def _check_measured(measured) -> list[dict]:
        if measured is None:
            return []
        rows = [measured] if isinstance(measured, dict) else list(measured)
        for r in rows:
            if not isinstance(r, dict) or "k" not in r or not (
                    "tokens_per_step" in r or "speedup" in r):
                raise ValueError("each measured point needs 'k' and 'tokens_per_step' or "
                                 f"'speedup', got {r!r}")
            if int(r["k"]) < 1:
                raise ValueError(f"a measured point's k must be >= 1, got {r['k']}")
        return rows

    def _on_change(self, change):
        if not self._holding:
            self.update()

    def set(self, **values) -> dict:
        """Set several sliders (alpha, k, c, beta) and redraw once, e.g.
        ``ex.set(alpha=0.8, k=6)``."""
        unknown = set(values) - set(self.controls)
        if unknown:
            raise ValueError(f"unknown controls {sorted(unknown)}; choose from "
                             f"{sorted(self.controls)}")
        self._holding = True
        try:
            for name, value in values.items():
                self.controls[name].value = value
        finally:
            self._holding = False
        return self.update()

    def curves(self, alpha: float, c: float, beta: float, ks) -> dict:
        """Expected tokens per step and speed-up at each k (`formulas`); a ValueError names the
        formula that raised or returned no number."""
        return {"k": list(ks),
                "tokens_per_step": [self._call("expected_tokens_per_step", alpha, k) for k in ks],
                "speedup": [self._call("expected_speedup", alpha, k, c, 1 + beta * k)
                            for k in ks]}

    def _call(self, name: str, *args) -> float:
        try:
            value = self.formulas[name](*args)
        except Exception as e:      # noqa: BLE001 - maybe the student's function: shown
            raise ValueError(f"your {name} raised {type(e).__name__}: {e}") from e
        try:
            return float(value)
        except (TypeError, ValueError) as e:
            raise ValueError(f"your {name}{args} returned {value!r}, not a number") from e

    def update(self) -> dict:
        v = {name: w.value for name, w in self.controls.items()}
        alpha, k, c, beta = v["alpha"], v["k"], v["c"], v["beta"]
        ks = range(1, self.controls["k"].max + 1)
        try:
            cur = self.curves(alpha, c, beta, ks)
        except ValueError as e:
            self.state = {"alpha": alpha, "k": k, "c": c, "beta": beta, "error": str(e),
                          "curves": None, "measured": self.measured}
            self.readout.value = (f'<div class="{SPEC_ERROR_CLASS}" style="color:#b00020">'
                                  f"<b>Cannot draw the formulas:</b> {html.escape(str(e))}</div>")
            self.state["readout_text"] = self.readout.value
            self.plot.outputs = ()
            return self.state
        i_best = max(range(len(ks)), key=lambda i: cur["speedup"][i])
        tokens = cur["tokens_per_step"][k - 1]
        speedup = cur["speedup"][k - 1]
        self.state = {"alpha": alpha, "k": k, "c": c, "beta": beta, "error": None, "curves": cur,
                      "tokens_per_step": tokens, "speedup": speedup,
                      "best_k": cur["k"][i_best], "best_speedup": cur["speedup"][i_best],
                      "measured": self.measured}
        self.readout.value = (
            '<div style="line-height: 1.5">'
            f"E[tokens per target pass] = <b>{tokens:.2f}</b> (at most k + 1 = {k + 1})<br>"
            f"cost per step = k c + v = {k} &times; {c:.2f} + {1 + beta * k:.2f} target steps<br>"
            f"speed-up = <b>{speedup:.2f}&times;</b><br>"
            f"best k for this α, c, β: <b>{cur['k'][i_best]}</b> "
            f"({cur['speedup'][i_best]:.2f}&times;)"
            "</div>")
        self.state["readout_text"] = self.readout.value
        self._draw()
        return self.state

    def _draw(self):
        s = self.state
        cur, k = s["curves"], s["k"]
        fig = Figure(figsize=(8.4, 3.4), dpi=80)
        ax1, ax2 = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
        ax1.plot(cur["k"], [x + 1 for x in cur["k"]], ":", color="0.6", label="k + 1 (α = 1)")
        ax1.plot(cur["k"], cur["tokens_per_step"], "o-", ms=3, color="C0",
                 label=f"formula, α = {s['alpha']:.2f}")
        ax1.plot([k], [s["tokens_per_step"]], "*", ms=13, color="C1", label=f"k = {k}")
        ax2.axhline(1.0, color="0.5", lw=0.8, ls=":")
        ax2.plot(cur["k"], cur["speedup"], "o-", ms=3, color="C0",
                 label=f"c = {s['c']:.2f}, β = {s['beta']:.2f}")
        ax2.plot([k], [s["speedup"]], "*", ms=13, color="C1")
        for m in self.measured:
            lab = m.get("label", "measured")
            if "tokens_per_step" in m:
                ax1.plot([m["k"]], [m["tokens_per_step"]], "s", ms=7, mfc="none", color="C3",
                         label=lab)
            if "speedup" in m:
                ax2.plot([m["k"]], [m["speedup"]], "s", ms=7, mfc="none", color="C3", label=lab)
        ax1.set_xlabel("k (draft tokens per step)")
        ax1.set_ylabel("tokens per target pass")
        ax2.set_xlabel("k (draft tokens per step)")
        ax2.set_ylabel("speed-up vs the target alone")
        ax2.set_ylim(0, max(1.2, 1.1 * max(cur["speedup"] +
                                           [m.get("speedup", 0) for m in self.measured])))
        for ax in (ax1, ax2):
            ax.grid(alpha=0.3)
            handles, labels = ax.get_legend_handles_labels()
            uniq = dict(zip(labels, handles))          # one legend entry per label
            ax.legend(uniq.values(), uniq.keys(), fontsize=7,
                      loc="upper left" if ax is ax1 else "upper right")
        fig.subplots_adjust(left=0.08, right=0.98, bottom=0.15, top=0.95, wspace=0.28)
        self.state["png"] = show_png(self.plot, fig, f"<speculative plot, k = {k}>")


def speculative_explorer(**kwargs) -> SpeculativeExplorer:
    """Build the lab 05 explorer; display it by leaving it as the last expression of a cell.
    Keyword arguments: alpha, k, c, beta (starting values), measured (points to overlay),
    formulas (the two functions drawn; default minillm.speculative's)."""
    return SpeculativeExplorer(**kwargs)
