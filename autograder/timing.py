"""Speed checks for test cells: `time_ratio` and `check_ratio`.

Time is only ever graded as a ratio of two medians measured interleaved (see minillm/timing.py).
In the tester, `_cpu_time_interleaved` counts the tester's CPU time and that of the student's
kernel's whole sandbox, read from Linux (autograder/tester.py, autograder/sandbox_cpu.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from minillm import timing as _timing

__all__ = ["RatioResult", "time_ratio", "check_ratio", "cuda_sync"]

_time_interleaved = _timing.time_interleaved
_cpu_time_interleaved = _timing.cpu_time_interleaved
_median = _timing.median
_ratio = _timing.ratio
_cuda_synchronize = torch.cuda.synchronize
_cuda_is_available = torch.cuda.is_available


def cuda_sync() -> None:
    """torch.cuda.synchronize as it was when this module was imported (a no-op without CUDA);
    pass `sync=autograder.cuda_sync` when timing GPU work."""
    if _cuda_is_available():
        _cuda_synchronize()


@dataclass(frozen=True)
class RatioResult:
    ratio: float                    # median(baseline) / median(candidate): > 1 = candidate faster
    baseline_s: float               # median seconds per baseline call
    candidate_s: float              # median seconds per candidate call
    baseline_times: list[float] = field(repr=False)
    candidate_times: list[float] = field(repr=False)

    def __str__(self) -> str:
        return (f"candidate {self.ratio:.2f}x faster than baseline (median "
                f"{self.baseline_s * 1e3:.3g} ms vs {self.candidate_s * 1e3:.3g} ms over "
                f"{len(self.baseline_times)} interleaved runs)")


def time_ratio(baseline: Callable[[], object], candidate: Callable[[], object], *,
               warmup: int = 2, repeats: int = 7,
               sync: Callable[[], object] | None = None) -> RatioResult:
    """How many times faster `candidate` is than `baseline`.

    After `warmup` untimed rounds, runs baseline, candidate, baseline, candidate, ...
    (`repeats` timed runs each), calling `sync` after each run inside the timing, and returns
    median(baseline) / median(candidate) with both medians and the raw timings.

    The clock: without `sync` (CPU work) each run is timed by this process's CPU time
    (`time.process_time`, all threads), which a competing process cannot inflate by taking the
    core away mid-run; with wall-clock time, CI once measured a median ratio of at least 1.5
    between two *identical* functions under load. Sleeping or waiting costs no CPU time, so
    time real work. With `sync` (GPU work) it is wall-clock time.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    timer = _time_interleaved if sync is not None else _cpu_time_interleaved
    times = timer({"baseline": baseline, "candidate": candidate}, warmup=warmup,
                  repeats=repeats, sync=sync)
    b, c = times["baseline"], times["candidate"]
    return RatioResult(ratio=_ratio(b, c), baseline_s=_median(b), candidate_s=_median(c),
                       baseline_times=list(b), candidate_times=list(c))


def check_ratio(baseline: Callable[[], object], candidate: Callable[[], object], *,
                at_least: float, what: str, **kw) -> RatioResult:
    """`time_ratio(...)`, then AssertionError with the measured figures unless the candidate is
    at least `at_least` times faster than the baseline. `what` names the claim, e.g.
    "the cached loop vs the naive loop for 64 new tokens"."""
    r = time_ratio(baseline, candidate, **kw)
    if not r.ratio >= at_least:
        raise AssertionError(
            f"{what}: expected the candidate to be at least {at_least:g}x faster than the "
            f"baseline, measured {r.ratio:.2f}x (median {r.candidate_s * 1e3:.3g} ms vs "
            f"{r.baseline_s * 1e3:.3g} ms over {len(r.baseline_times)} interleaved runs each)")
    return r
