"""What a serving system is judged by, per request and for the whole run.

    TTFT  time to first token  = first_token_time - arrival_time   (queueing + prefill)
    TPOT  time per output token = (finish_time - first_token_time) / (output tokens - 1)
    E2E   end-to-end latency    = finish_time - arrival_time
    throughput                  = output tokens of all requests / (last finish - first arrival)

Users feel the tail, not the mean: report p50 and p99 beside the mean. Percentiles here use
linear interpolation between order statistics (numpy's default): p of n sorted values sits at
rank (n - 1) * p / 100.

A live server exports the same quantities as Prometheus histograms (`Histogram`): counts of
observations at or under each bucket's upper bound, plus their sum and count.

A step log (engine.steps, or the static server's) gives the timeline: which request ran in which
step, and whether as a prefill (many tokens) or a decode (one).
"""
from __future__ import annotations

import math


def percentile(values, p: float) -> float:
    """The p-th percentile (0 <= p <= 100) of `values`, linearly interpolated."""
    xs = sorted(float(v) for v in values)
    if not xs:
        raise ValueError("percentile of an empty list")
    if not 0 <= p <= 100:
        raise ValueError(f"p must be in [0, 100], got {p}")
    rank = (len(xs) - 1) * p / 100
    lo = math.floor(rank)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (rank - lo)


def request_latencies(seq) -> dict:
    """TTFT, TPOT and E2E of one finished sequence (anything with arrival_time,
    first_token_time, finish_time and num_output_tokens)."""
    return latencies(seq)


def latencies(seq) -> dict:
    """`request_latencies`' computation, for the server: lab 06 withholds that function from
    its grading kernel, where the server runs."""
    if seq.finish_time is None or seq.first_token_time is None:
        raise ValueError(f"sequence {getattr(seq, 'seq_id', '?')} has not finished")
    n = seq.num_output_tokens
    tpot = (seq.finish_time - seq.first_token_time) / (n - 1) if n > 1 else 0.0
    return {"ttft": seq.first_token_time - seq.arrival_time, "tpot": tpot,
            "e2e": seq.finish_time - seq.arrival_time, "output_tokens": n}


def stats(values) -> dict:
    values = list(values)
    return {"mean": sum(values) / len(values), "p50": percentile(values, 50),
            "p99": percentile(values, 99)}


def summarize(seqs, num_requests: int | None = None) -> dict:
    """Throughput and latency statistics of a served workload (finished sequences only;
    `completed` counts them, `requests` what was submitted)."""
    done = [s for s in seqs if s.finish_time is not None]
    if not done:
        raise ValueError("no request finished")
    lat = [request_latencies(s) for s in done]
    tokens = sum(x["output_tokens"] for x in lat)
    span = max(s.finish_time for s in done) - min(s.arrival_time for s in seqs)
    out = {"requests": len(seqs) if num_requests is None else num_requests,
           "completed": len(done), "output_tokens": tokens, "makespan_s": span,
           "throughput_tok_s": tokens / span if span > 0 else float("inf")}
    for key in ("ttft", "tpot", "e2e"):
        for stat, v in stats(x[key] for x in lat).items():
            out[f"{key}_{stat}_s"] = v
    return out


def timeline(steps) -> list[tuple[int, int, int]]:
    """(step, request id, new tokens) for every request in every step of a step log."""
    return [(r.step, req, n) for r in steps for req, _seq, n in r.runs]


def plot_timeline(steps, ax=None, title: str = ""):
    """Which request ran in which step: one row per request, a dark cell for a prefill (many
    tokens), a light one for a decode (one token), nothing while it waited or was done."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 3.5))
    cells = timeline(steps)
    if cells:
        xs = [c[0] for c in cells]
        ys = [c[1] for c in cells]
        colors = ["tab:red" if c[2] > 1 else "tab:blue" for c in cells]
        ax.scatter(xs, ys, c=colors, marker="s", s=4, linewidths=0)
    ax.set_xlabel("step")
    ax.set_ylabel("request")
    ax.set_title(title or "timeline (red: prefill, blue: decode)")
    ax.invert_yaxis()
    return ax


class Histogram:
    """Prometheus-style cumulative histogram: how many observations were <= each bound."""

    def __init__(self, bounds):
        self.bounds = tuple(sorted(float(b) for b in bounds))
        if not self.bounds:
            raise ValueError("a histogram needs at least one bucket bound")
        self.counts = [0] * len(self.bounds)
        self.count, self.sum = 0, 0.0

    def observe(self, value: float) -> None:
        value = float(value)
        for i, b in enumerate(self.bounds):
            if value <= b:
                self.counts[i] += 1
        self.count += 1
        self.sum += value

    def prometheus(self, name: str, help_text: str) -> list[str]:
        lines = [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
        lines += [f'{name}_bucket{{le="{b:g}"}} {c}' for b, c in zip(self.bounds, self.counts)]
        lines += [f'{name}_bucket{{le="+Inf"}} {self.count}', f"{name}_sum {self.sum:.6f}",
                  f"{name}_count {self.count}"]
        return lines
