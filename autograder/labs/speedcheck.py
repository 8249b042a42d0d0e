"""A lab's timed claim as one record: `SpeedCheck`.

Each lab with a timed claim defines, in autograder/labs/labNN.py, its workload (how to build
the inputs and time the student's candidate against a baseline) and one record:

    SPEED_CHECK = SpeedCheck(grade_id="03_mla_speed_test", threshold=1.5, measure=absorbed_ratio,
                             reference=..., counter_example=..., hint="...", disabled=(...))

* `measure(candidate, guard, *args, **workload)` returns a `RatioResult` (> 1: the candidate is
  faster). It must call the candidate only inside `with guard:`, and its own baseline and
  expected output outside it;
* `guard` disables the `disabled` references (`ReferenceGuard`) while the candidate runs, so
  a candidate that delegates to the course's implementation fails, while the baseline, which may
  be that very implementation, keeps working between the candidate's calls. The graded cell
  therefore calls the check without wrapping it in `reference_disabled`;
* `reference` is a correct candidate in the notebook's signature built on the library; it must
  pass when run *unguarded* (tests/test_speed_checks.py) and fail when guarded (it delegates);
* `counter_example` is the usual way to get the claim wrong (a loop, padding, no cache...); it
  must fail every time, also under a competing load;
* `hint` is the message of a failed check: a format string with the measured `ratio`,
  `at_least`, `baseline_ms`, `candidate_ms`, `runs` and the workload's own values;
* `solution` names the notebook's own answer, for the instructor's measurements only: the
  function's name and the grade ids of the solution cells that define it (and what it calls).
  `python -m autograder.labs --solution` runs those cells from the source notebook
  (autograder/labs/solutions.py); the course keeps no copy of a solution in this package.

The measurement runs on one torch thread (`one_torch_thread`): a parallel region whose other
thread a busy neighbour preempts adds noise, and no claim needs parallelism. Why each threshold
sits where it does is said next to it; the measured ranges behind it are in the table of
autograder/README.md.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable

import torch

from autograder.checks import ReferenceGuard
from autograder.timing import RatioResult

__all__ = ["SpeedCheck", "one_torch_thread"]

# captured at import (the grader imports autograder before student code runs)
_get_threads, _set_threads = torch.get_num_threads, torch.set_num_threads
_nullcontext = contextlib.nullcontext


@contextlib.contextmanager
def one_torch_thread():
    """Run the block on one torch thread; the previous thread count is restored afterwards."""
    threads = _get_threads()
    _set_threads(1)
    try:
        yield
    finally:
        _set_threads(threads)


@dataclass(frozen=True)
class SpeedCheck:
    grade_id: str                       # the graded cell that runs it
    threshold: float                    # required RatioResult.ratio
    measure: Callable[..., RatioResult]  # measure(candidate, guard, *args, **workload)
    reference: Callable                 # correct, on the library: passes unguarded
    counter_example: Callable           # the usual mistake: fails
    hint: str                           # the failure message (a format string)
    disabled: tuple[str, ...] = ()      # references the candidate may not call
    workload: dict = field(default_factory=dict)     # the measure's keyword defaults
    fixture: Callable[[], tuple] = tuple  # extra positional args for the registry's runs
    solution: tuple[str, ...] = ()      # (function name, solution cell grade ids...)

    def ratio(self, candidate, *args, guarded: bool = True, **workload) -> RatioResult:
        """Measure `candidate` (guarded unless told otherwise); returns the RatioResult."""
        guard = ReferenceGuard(*self.disabled) if guarded else _nullcontext()
        with one_torch_thread():
            return self.measure(candidate, guard, *args, **{**self.workload, **workload})

    def check(self, candidate, *args, at_least: float | None = None, guarded: bool = True,
              **workload) -> float:
        """AssertionError with the hint unless the ratio reaches `at_least` (default: the
        threshold); returns the ratio."""
        at_least = self.threshold if at_least is None else at_least
        r = self.ratio(candidate, *args, guarded=guarded, **workload)
        if not r.ratio >= at_least:
            raise AssertionError(self.hint.format(
                ratio=r.ratio, at_least=at_least, baseline_ms=r.baseline_s * 1e3,
                candidate_ms=r.candidate_s * 1e3, runs=len(r.baseline_times),
                **{**self.workload, **workload}))
        return r.ratio

    def passes(self, candidate, *, guarded: bool = False) -> bool:
        """The registry's verdict on `candidate` with the fixture's arguments: True if the check
        passes, False if it raises AssertionError."""
        try:
            self.check(candidate, *self.fixture(), guarded=guarded)
        except AssertionError:
            return False
        return True
