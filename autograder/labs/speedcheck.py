"""A lab's timed claim as one record, `SpeedCheck` (autograder/README.md, "Timed claims"); the
reference must pass and the counter-example fail. Measured on one torch thread: a preempted
second thread adds noise and no claim needs parallelism."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable

import torch

from autograder.checks import assert_close
from autograder.timing import RatioResult

__all__ = ["SpeedCheck", "one_torch_thread", "assert_tensor_close"]


def assert_tensor_close(got, want, tol: float, name: str) -> None:
    """AssertionError unless `got` is a tensor of want's shape within atol = rtol = tol."""
    if not torch.is_tensor(got) or tuple(got.shape) != tuple(want.shape):
        raise AssertionError(f"{name}: got {type(got).__name__} "
                             f"{tuple(getattr(got, 'shape', ()))}, expected a tensor "
                             f"{tuple(want.shape)}")
    assert_close(got, want, atol=tol, rtol=tol, name=name)


@contextlib.contextmanager
def one_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@dataclass(frozen=True)
class SpeedCheck:
    grade_id: str
    threshold: float                    # required RatioResult.ratio
    measure: Callable[..., RatioResult]  # measure(candidate, *args, **workload)
    reference: Callable
    counter_example: Callable
    hint: str                           # format string: ratio, at_least, baseline_ms, ...
    workload: dict = field(default_factory=dict)     # the measure's keyword defaults
    solution: tuple[str, ...] = ()      # (function name, solution cell grade ids...)

    def ratio(self, candidate, *args, **workload) -> RatioResult:
        with one_torch_thread():
            return self.measure(candidate, *args, **{**self.workload, **workload})

    def check(self, candidate, *args, at_least: float | None = None, **workload) -> float:
        """Print and return the ratio; AssertionError with the hint below at_least/threshold."""
        at_least = self.threshold if at_least is None else at_least
        r = self.ratio(candidate, *args, **workload)
        print(f"{self.grade_id}: measured {r.ratio:.2f}x, at least {at_least:g}x required")
        if not r.ratio >= at_least:
            raise AssertionError(self.hint.format(
                ratio=r.ratio, at_least=at_least, baseline_ms=r.baseline_s * 1e3,
                candidate_ms=r.candidate_s * 1e3, runs=len(r.baseline_times),
                **{**self.workload, **workload}))
        return r.ratio

    def passes(self, candidate) -> bool:
        """True if the check passes on `candidate`."""
        try:
            self.check(candidate)
        except Exception:           # noqa: BLE001 - a failed check, or a withheld reference
            return False
        return True
