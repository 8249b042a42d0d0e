"""Lab 06's explorer: a live `minillm serve` under open-loop load, measured against a napkin.

    srv = BackgroundServer(model, tok, "target")          # minillm.serving.server
    serve_explorer(srv, token_ids)                        # sliders: request rate, max batch
"""
from __future__ import annotations

import dataclasses
import html
import math
import time

import ipywidgets as widgets
from matplotlib.figure import Figure

from ..serving import metrics
from .display import SLIDER_LAYOUT, STYLE, show_png, side_panel

# --- lab 06: a live server under open-loop load ----------------------------------------------
SERVE_READOUT_CLASS = "minillm-serve-readout"
SERVE_PLOT_CLASS = "minillm-serve-plot"
SERVE_ERROR_CLASS = "minillm-serve-error"


def _interp(x: float, xs: list, ys: list) -> float:
    """Piecewise-linear interpolation of ys over sorted xs, flat beyond both ends."""
    if x <= xs[0]:
        return ys[0]
    for x0, x1, y0, y1 in zip(xs, xs[1:], ys, ys[1:]):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return ys[-1]


def _shown(percentile):
    """The student's `percentile` on a copy of the values; whatever it raises is a ValueError
    naming it, which the explorer shows."""
    def mine(values, p):
        try:
            return float(percentile(list(values), p))
        except Exception as e:      # noqa: BLE001 - the student's function: shown, not raised
            raise ValueError(f"your percentile raised {type(e).__name__}: {e}") from e
    return mine


class ServeExplorer(widgets.VBox):
    """Sliders request rate and max batch -> a short open-loop load on a live server -> measured
    TTFT, TPOT and throughput next to a napkin prediction, and a plot of both against the rate.

    Every move sends the same seeded workload (`num_requests` Poisson arrivals of
    `prompt_len`-token prompts, `max_tokens` greedy tokens each; `minillm.bench.load_gen`) over
    HTTP to `server`, a running `BackgroundServer`, after setting its batch limit
    (`engine_loop.set_max_num_seqs`). Measured points accumulate on the plot. A move blocks
    until its run ends: at most its last arrival plus `timeout_s`.

    The napkin comes from a calibration the explorer runs once, through the same server: bursts
    of 1, 2, 4, ... requests (up to the max-batch slider's top) that all arrive at once. The
    lone request (three times, the median) gives `ttft0` (HTTP, prefill and detokenizing at
    batch 1); the engine's decode-only steps (`engine.steps`: start, end, sequences in the
    step) give t(b), the median time of one decode step at batch b, interpolated between the
    batch sizes seen. Then, for rate lambda, max batch m, N requests of O tokens each:

        capacity    m / t(m) tokens/s                  (every seat busy)
        batch       b = lambda O t(b)                  (Little's law, steady state), at most m;
                    b reaches m when lambda O >= capacity: the server cannot keep up (saturated)
        TPOT        t(b)
        seats       m seats; request k holds one for ttft0 + (O - 1) t(b) seconds, from
                    start_k = max(A_k, start_(k-m) + that hold): it waits for the seat of
                    request k - m once all are taken (A_k: its arrival in the run's seeded
                    schedule, first arrival = 0)
        TTFT_k      start_k - A_k + ttft0 + t(b) / 2   (queue, half a step in flight, its own)
        throughput  N O / (last start_k + hold)         (this short run: from the first arrival
                    to the last token)

    It assumes every request sees the steady-state batch b (a 12-request run spends much of its
    time ramping up and down, so the engine's measured mean batch is lower), that a request
    holds its seat exactly O steps, no prefill cost beyond what ttft0 holds (a newcomer's
    prefill also slows the running decodes) and no jitter from other programs. Bursts of a
    Poisson process make the measured p99 worse than the napkin says.

    `percentile(values, p)` reads every p50 and p99, measured and predicted (default
    `minillm.serving.metrics.percentile`; lab 06 passes the student's).

    For scripts and tests: `controls` (rate, max_batch), `readout` (HTML, class
    `minillm-serve-readout`), `plot` (Output, class `minillm-serve-plot`), `state` (the last
    measurement, prediction and calibration, or the error), `history` (every measured point),
    `set(rate=..., max_batch=...)`.
    """

    def __init__(self, server, token_ids, *, rate: float = 8.0, max_batch: int = 8,
                 num_requests: int = 12, prompt_len: int = 16, max_tokens: int = 24,
                 timeout_s: float = 20.0, seed: int = 0, min_rate: float = 2.0,
                 max_rate: float = 32.0, max_batch_slider: int = 16, percentile=None):
        from ..bench import load_gen
        self._load_gen = load_gen
        self._percentile = metrics.percentile if percentile is None else _shown(percentile)
        self.server = server
        self.token_ids = token_ids.tolist() if hasattr(token_ids, "tolist") else list(token_ids)
        self.num_requests, self.prompt_len, self.max_tokens = num_requests, prompt_len, max_tokens
        self.timeout_s, self.seed = timeout_s, seed
        self.calibration: dict | None = None
        self.history: list[dict] = []
        self.state: dict = {}
        self._holding = False
        c = {"rate": widgets.FloatSlider(value=min(max(rate, min_rate), max_rate), min=min_rate,
                                         max=max_rate, step=1.0, description="rate (req/s)",
                                         continuous_update=False, style=STYLE,
                                         layout=SLIDER_LAYOUT),
             "max_batch": widgets.IntSlider(value=min(max(int(max_batch), 1), max_batch_slider),
                                            min=1, max=max_batch_slider,
                                            description="max batch", continuous_update=False,
                                            style=STYLE, layout=SLIDER_LAYOUT)}
        self.controls = c
        for w in c.values():
            w.observe(self._on_change, names="value")
        self.readout, self.plot = side_panel(SERVE_READOUT_CLASS, SERVE_PLOT_CLASS)
        title = widgets.HTML(f"<b>Serving under open-loop load</b>: {num_requests} requests "
                             f"({prompt_len}-token prompts, {max_tokens} tokens each) per move, "
                             "measured over HTTP against the napkin")
        sliders = widgets.VBox(list(c.values()), layout=widgets.Layout(flex="0 0 auto",
                                                                        min_width="440px"))
        super().__init__([title, widgets.HBox([sliders, self.readout]), self.plot])
        self.add_class("minillm-serve-explorer")
        bad = self._check_values({"rate": rate, "max_batch": max_batch})
        if bad:
            self._show_error(bad)
        else:
            self.update()

    # ---- controls ---------------------------------------------------------------------------
    def _on_change(self, change):
        if not self._holding:
            self.update()

    def _check_values(self, values: dict) -> str | None:
        for name, v in values.items():
            w = self.controls[name]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                return f"{name} must be a number, got {v!r}"
            if name == "max_batch" and int(v) != v:
                return f"max batch must be a whole number of sequences, got {v}"
            if not w.min <= v <= w.max:
                return (f"{w.description} must lie in [{w.min:g}, {w.max:g}], got {v:g}"
                        + (" (a rate must be > 0)" if name == "rate" and v <= 0 else ""))
        return None

    def set(self, **values) -> dict:
        """Set rate and/or max_batch and measure once, e.g. ``ex.set(rate=16, max_batch=4)``.
        A value outside a slider's range is shown as a message, not applied."""
        unknown = set(values) - set(self.controls)
        if unknown:
            raise ValueError(f"unknown controls {sorted(unknown)}; choose from "
                             f"{sorted(self.controls)}")
        bad = self._check_values(values)
        if bad:
            return self._show_error(bad)
        self._holding = True
        try:
            for name, value in values.items():
                self.controls[name].value = value
        finally:
            self._holding = False
        return self.update()

    # ---- talking to the server --------------------------------------------------------------
    def _check_server(self) -> str | None:
        s = self.server
        if s is None or not hasattr(s, "url") or not hasattr(s, "engine_loop"):
            return ("no server: start one with srv = BackgroundServer(model, tok, \"target\") "
                    "(minillm.serving.server) and pass it: serve_explorer(srv, token_ids)")
        if not s.engine_loop.alive:
            why = s.engine_loop.error
            return ("the server has stopped" + (f": its engine failed with {why!r}" if why else
                    " (srv.stop() was called?); start a new BackgroundServer"))
        return None

    def _workload(self, rate: float, n: int | None = None):
        return self._load_gen.Workload(rate=rate, num_requests=n or self.num_requests,
                                       prompt_len=self.prompt_len, max_tokens=self.max_tokens,
                                       seed=self.seed, timeout_s=self.timeout_s)

    def _run(self, w) -> dict:
        """load_test in a worker thread: it calls asyncio.run, which a notebook's running event
        loop forbids in its own thread. The whole run is bounded by its last arrival plus
        timeout_s."""
        from concurrent.futures import ThreadPoolExecutor
        last = self._load_gen.schedule(w, self.token_ids)[-1][0]
        w = dataclasses.replace(w, timeout_s=last + self.timeout_s)
        with ThreadPoolExecutor(1) as pool:
            return pool.submit(self._load_gen.load_test, self.server.url,
                               self.server.model_name, w, self.token_ids,
                               self._percentile).result()

    def _apply_max_batch(self, m: int, wait_s: float = 5.0) -> None:
        """Set the engine's batch limit and wait until its thread has taken it (between steps)."""
        loop = self.server.engine_loop
        loop.set_max_num_seqs(m)
        deadline = time.monotonic() + wait_s
        while loop.engine.scheduler.max_num_seqs != m:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the engine did not take max_num_seqs = {m} in {wait_s} s")
            time.sleep(0.005)

    def _wait_idle(self, wait_s: float = 5.0) -> None:
        loop = self.server.engine_loop
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            st = loop.stats()
            if st["running"] == 0 and st["waiting"] == 0:
                return
            time.sleep(0.01)

    def _measure(self, w) -> tuple[dict, list]:
        """Run `w`; returns its summary and the engine's step records of the run."""
        engine = self.server.engine_loop.engine
        self._wait_idle()
        t0 = engine.clock()
        result = self._run(w)
        return result, [s for s in list(engine.steps) if s.start >= t0]

    def calibrate(self) -> dict:
        """Bursts of 1, 2, 4, ... requests up to the max-batch slider's top, all arriving at
        once (a lone request three times): ttft0 (the lone request's median TTFT) and the
        median decode step time at each batch size the engine ran at least 3 times (its
        decode-only steps: one new token per sequence)."""
        top = self.controls["max_batch"].max
        sizes = sorted({2 ** i for i in range(top.bit_length()) if 2 ** i <= top} | {top})
        self._apply_max_batch(top)
        steps_by_batch: dict[int, list[float]] = {}
        try:
            self._run(self._workload(1000.0, 1))                      # warm-up
            alone = []
            for n in [1, 1] + sizes:                    # the lone request three times
                r, steps = self._measure(self._workload(1000.0 * n, n))
                if r["completed"] != r["requests"]:
                    raise RuntimeError(f"calibration: {r['errors']} of {r['requests']} requests "
                                       f"failed: {r['error_examples']}")
                if n == 1:
                    alone.append(r["ttft_p50_s"])
                for st in steps:
                    if st.runs and all(k == 1 for _r, _s, k in st.runs):
                        steps_by_batch.setdefault(len(st.runs), []).append(st.end - st.start)
        finally:
            self._apply_max_batch(self.controls["max_batch"].value)
        # a burst's ramp leaves a step or two at odd batch sizes: too few for a median
        batches = sorted(b for b, v in steps_by_batch.items() if len(v) >= 3)
        if not batches or batches[0] != 1:
            raise RuntimeError("calibration: too few decode steps at batch 1 were recorded")
        self.calibration = {
            "ttft0_s": self._percentile(alone, 50), "batches": batches,
            "step_s": [self._percentile(steps_by_batch[b], 50) for b in batches],
            "decode_steps": sum(len(steps_by_batch[b]) for b in batches),
            "arrivals_at_rate_1": [t for t, *_ in self._load_gen.schedule(
                self._workload(1.0), self.token_ids)]}
        return self.calibration

    def step_time(self, batch: float) -> float:
        """t(b): the calibrated decode step time at batch b, interpolated (batch 1 below 1)."""
        cal = self.calibration
        return _interp(max(batch, 1.0), cal["batches"], cal["step_s"])

    # ---- the napkin ---------------------------------------------------------------------------
    def predict(self, rate: float, max_batch: int) -> dict:
        """The napkin of the class docstring for this workload at (rate, max_batch)."""
        cal = self.calibration
        ttft0, t = cal["ttft0_s"], self.step_time
        n, o, m = self.num_requests, self.max_tokens, max_batch
        capacity = m / t(m)
        saturated = rate * o * t(m) >= m            # Little's law: b = rate O t(b) reaches m
        if saturated:
            b = float(m)
        else:                                       # the fixed point of b = rate O t(b) < m
            lo, hi = 0.0, float(m)
            for _ in range(50):
                mid = (lo + hi) / 2
                lo, hi = (mid, hi) if rate * o * t(mid) > mid else (lo, mid)
            b = hi
        tpot = t(b)
        hold = ttft0 + (o - 1) * tpot               # seconds a request holds its seat
        first = cal["arrivals_at_rate_1"][0]
        arrivals = [(a - first) / rate for a in cal["arrivals_at_rate_1"]]   # seeded, scaled
        start: list[float] = []
        for k, a in enumerate(arrivals):            # request k takes the seat of request k - m
            start.append(max(a, start[k - m] + hold) if k >= m else a)
        ttft = [s - a + ttft0 + tpot / 2 for s, a in zip(start, arrivals)]
        duration = start[-1] + hold                 # starts never decrease: the last ends last
        return {"rate": rate, "max_batch": m, "batch": b, "saturated": saturated,
                "capacity_tok_s": capacity, "tpot_s": tpot,
                "ttft_p50_s": self._percentile(ttft, 50),
                "ttft_p99_s": self._percentile(ttft, 99),
                "throughput_tok_s": n * o / duration}

    # ---- one move -----------------------------------------------------------------------------
    def update(self) -> dict:
        rate, m = float(self.controls["rate"].value), int(self.controls["max_batch"].value)
        problem = self._check_server() or self._check_values({"rate": rate, "max_batch": m})
        if problem:
            return self._show_error(problem)
        self.readout.value = (f"<i>measuring: {self.num_requests} requests at {rate:g} req/s, "
                              f"max batch {m} ...</i>")
        try:
            if self.calibration is None:
                self.readout.value = "<i>calibrating: a request alone, then bursts of 2, 4, ... ...</i>"
                self.calibrate()
            self._apply_max_batch(m)
            measured, steps = self._measure(self._workload(rate))
        except (RuntimeError, ValueError, OSError) as e:
            return self._show_error(f"{type(e).__name__}: {e}")
        if not measured.get("completed"):
            return self._show_error(f"no request completed ({measured['errors']} errors, e.g. "
                                    f"{measured['error_examples']}): is the server alive?")
        batches = [len(s.runs) for s in steps if s.runs]
        measured["mean_batch"] = sum(batches) / len(batches) if batches else 0.0
        measured["max_batch"] = m
        pred = self.predict(rate, m)
        self.history.append(measured)
        self.state = {"error": None, "rate": rate, "max_batch": m, "measured": measured,
                      "napkin": pred, "calibration": self.calibration, "history": self.history}
        self.readout.value = self._readout_html(measured, pred)
        self.state["readout_text"] = self.readout.value
        self._draw()
        return self.state

    def _show_error(self, message: str) -> dict:
        self.state = {"error": message, "measured": None, "napkin": None,
                      "calibration": self.calibration, "history": self.history}
        self.readout.value = (f'<div class="{SERVE_ERROR_CLASS}" style="color:#b00020">'
                              f"<b>Cannot measure:</b> {html.escape(message)}</div>")
        self.state["readout_text"] = self.readout.value
        self.plot.outputs = ()
        return self.state

    def _readout_html(self, r: dict, p: dict) -> str:
        cal = self.calibration

        def ms(x):
            return f"{1e3 * x:.1f}" if x is not None else "&ndash;"

        rows = [("TTFT p50 / p99 (ms)", f"{ms(r.get('ttft_p50_s'))} / {ms(r.get('ttft_p99_s'))}",
                 f"{ms(p['ttft_p50_s'])} / {ms(p['ttft_p99_s'])}"),
                ("TPOT p50 / p99 (ms)", f"{ms(r.get('tpot_p50_s'))} / {ms(r.get('tpot_p99_s'))}",
                 ms(p["tpot_s"])),
                ("throughput (tok/s)", f"{r['throughput_tok_s']:.1f}",
                 f"{p['throughput_tok_s']:.1f}")]
        table = "".join(f"<tr><td>{a}</td><td style='text-align:right'><b>{b}</b></td>"
                        f"<td style='text-align:right'>{c}</td></tr>" for a, b, c in rows)
        warn = ""
        if r["errors"]:
            warn = (f"<br><span style='color:#b00020'>{r['errors']} of {r['requests']} requests "
                    f"failed: {html.escape(str(r['error_examples']))}</span>")
        load = ("<b>saturated</b>: requests queue" if p["saturated"] else "keeps up")
        return (
            '<div style="line-height: 1.5">'
            f"{r['completed']}/{r['requests']} requests at <b>{r['rate']:g} req/s</b>, "
            f"max batch <b>{r['max_batch']}</b> &rarr; napkin: {load}"
            "<table><tr><th></th><th>measured</th><th>napkin</th></tr>" + table + "</table>"
            f"offered {r['rate'] * self.max_tokens:.0f} tok/s, capacity m / t(m) = "
            f"{p['capacity_tok_s']:.0f} tok/s<br>"
            f"batch: napkin b = &lambda; O t(b) = {p['batch']:.1f} (steady state), "
            f"engine's mean over the run's steps {r['mean_batch']:.1f}<br>"
            f"<small>calibrated: t(b) at b = {', '.join(map(str, cal['batches']))}: "
            f"{', '.join(ms(x) for x in cal['step_s'])} ms ({cal['decode_steps']} decode steps); "
            f"a request alone: TTFT {ms(cal['ttft0_s'])} ms</small>{warn}</div>")

    def _draw(self):
        s = self.state
        m = s["max_batch"]
        lo, hi = self.controls["rate"].min, self.controls["rate"].max
        rates = [lo + (hi - lo) * i / 60 for i in range(61)]
        curve = [self.predict(x, m) for x in rates]
        fig = Figure(figsize=(8.4, 3.6), dpi=80)
        ax1, ax2 = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
        ax1.plot(rates, [p["throughput_tok_s"] for p in curve], "-", color="C0",
                 label=f"napkin, max batch {m}")
        ax1.axhline(curve[0]["capacity_tok_s"], color="0.5", lw=0.8, ls=":",
                    label="capacity m / t(m)")
        ax2.plot(rates, [1e3 * p["ttft_p50_s"] for p in curve], "-", color="C0",
                 label="TTFT p50 napkin")
        ax2.plot(rates, [1e3 * p["ttft_p99_s"] for p in curve], "--", color="C0",
                 label="TTFT p99 napkin")
        ax2.plot(rates, [1e3 * p["tpot_s"] for p in curve], "-", color="C2", label="TPOT napkin")
        for h in self.history:                      # other max batches: faded, unlabelled
            mine = h["max_batch"] == m
            kw = {"alpha": 1.0 if mine else 0.25}
            ax1.plot([h["rate"]], [h["throughput_tok_s"]], "s", color="C3" if mine else "0.5",
                     label="measured" if mine else None, **kw)
            for key, mark, col, name in (("ttft_p50_s", "s", "C0", "TTFT p50"),
                                         ("ttft_p99_s", "^", "C0", "TTFT p99"),
                                         ("tpot_p50_s", "s", "C2", "TPOT p50")):
                if h.get(key) is not None:
                    ax2.plot([h["rate"]], [1e3 * h[key]], mark, color=col, mfc="none", ms=7,
                             label=f"{name} measured" if mine else None, **kw)
        cur = s["measured"]
        ax1.plot([cur["rate"]], [cur["throughput_tok_s"]], "*", ms=14, color="C1",
                 label="this move")
        ax1.set_xlabel("request rate (req/s)")
        ax1.set_ylabel("throughput (tokens/s)")
        ax1.set_ylim(0, 1.15 * max([curve[0]["capacity_tok_s"]] +
                                   [h["throughput_tok_s"] for h in self.history]))
        ax1.set_title(f"max batch {m} (faded: other max batches)", fontsize=8)
        ax2.set_xlabel("request rate (req/s)")
        ax2.set_ylabel("ms")
        ax2.set_yscale("log")
        ys = [1e3 * p[k] for p in curve for k in ("ttft_p50_s", "ttft_p99_s", "tpot_s")] + [
            1e3 * h[k] for h in self.history for k in ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s")
            if h.get(k)]
        ax2.set_ylim(0.7 * min(ys), 6 * max(ys))         # room for the legend above the data
        for ax in (ax1, ax2):
            ax.set_xlim(0, hi * 1.02)
            ax.grid(alpha=0.3)
            handles, labels = ax.get_legend_handles_labels()
            uniq = dict(zip(labels, handles))
            ax.legend(uniq.values(), uniq.keys(), fontsize=6.5, ncol=1 if ax is ax1 else 2,
                      loc="lower right" if ax is ax1 else "upper left")
        fig.subplots_adjust(left=0.08, right=0.98, bottom=0.14, top=0.93, wspace=0.25)
        self.state["png"] = show_png(self.plot, fig, f"<serving plot, rate {s['rate']:g} req/s, "
                                                     f"max batch {m}>")


def serve_explorer(server, token_ids, **kwargs) -> ServeExplorer:
    """Build the lab 06 serving explorer over a running `BackgroundServer` and prompt token ids
    (e.g. ``minillm.data.load_tokens(tok, "val").tolist()``); display it by leaving it as the
    last expression of a cell. Keyword arguments: rate, max_batch (starting values),
    num_requests, prompt_len, max_tokens, timeout_s, seed, min_rate, max_rate,
    max_batch_slider, percentile (default minillm.serving.metrics.percentile)."""
    return ServeExplorer(server, token_ids, **kwargs)
