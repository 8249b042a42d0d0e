"""Speed checks for test cells: ratios of medians measured interleaved. In the tester
`_cpu_time_interleaved` also counts the kernel's sandbox (autograder/tester.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from minillm.bench import timing as _timing

__all__ = ["RatioResult", "time_ratio", "check_ratio", "cuda_sync"]

_cpu_time_interleaved = _timing.cpu_time_interleaved     # the tester's counts its kernel too


def cuda_sync() -> None:
    """torch.cuda.synchronize (no-op without CUDA), for `sync=` on GPU work."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


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
    """median(baseline) / median(candidate) over `repeats` interleaved runs after `warmup`.
    Without `sync`, CPU time (wall-clock under load once gave 1.5x between identical functions;
    sleeping costs nothing); with `sync` (GPU work, called inside the timing), wall-clock."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    timer = _timing.time_interleaved if sync is not None else _cpu_time_interleaved
    times = timer({"baseline": baseline, "candidate": candidate}, warmup=warmup,
                  repeats=repeats, sync=sync)
    b, c = times["baseline"], times["candidate"]
    return RatioResult(ratio=_timing.ratio(b, c), baseline_s=_timing.median(b),
                       candidate_s=_timing.median(c),
                       baseline_times=list(b), candidate_times=list(c))


def check_ratio(baseline: Callable[[], object], candidate: Callable[[], object], *,
                at_least: float, what: str, **kw) -> RatioResult:
    """`time_ratio(...)`; AssertionError naming `what` unless it is `at_least` times faster."""
    r = time_ratio(baseline, candidate, **kw)
    if not r.ratio >= at_least:
        raise AssertionError(
            f"{what}: expected the candidate to be at least {at_least:g}x faster than the "
            f"baseline, measured {r.ratio:.2f}x (median {r.candidate_s * 1e3:.3g} ms vs "
            f"{r.baseline_s * 1e3:.3g} ms over {len(r.baseline_times)} interleaved runs each)")
    return r
