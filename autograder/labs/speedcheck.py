"""A lab's timed claim as one record: `SpeedCheck`.

Each lab with a timed claim defines, in autograder/labs/labNN.py, its workload (how to build
the inputs and time the student's candidate against a baseline) and one record:

    SPEED_CHECK = SpeedCheck(grade_id="03_mla_speed_test", threshold=1.5, measure=absorbed_ratio,
                             reference=..., counter_example=..., hint="...")

* `measure(candidate, *args, **workload)` returns a `RatioResult` (> 1: the candidate is
  faster). The candidate is the student's function: it runs the student's code through one of
  the lab's probes (autograder/probes.py), which runs in the student's kernel during grading, so
  its calls are timed from the tester, counting the kernel's CPU (autograder/tester.py); the
  baseline may be the course's own implementation, which runs in the tester (in the kernel it
  is withheld: autograder/withheld.py);
* `reference` is a correct candidate in the notebook's signature built on the library; it must
  pass (tests/test_speed_checks.py) and fail where the lab's references are withheld;
* `counter_example` is the usual way to get the claim wrong (a loop, padding, no cache...); it
  must fail every time, also under a competing load;
* `hint` is the message of a failed check: a format string with the measured `ratio`,
  `at_least`, `baseline_ms`, `candidate_ms`, `runs` and the workload's own values;
* `solution` names the notebook's own answer, for the instructor's measurements only: the
  function's name and the grade ids of the solution cells that define it (and what it calls).
  `python -m autograder.labs --solution` runs those cells from the source notebook
  (autograder/labs/solutions.py); the course keeps no copy of a solution in this package.

The measurement runs on one torch thread (`one_torch_thread`, in the tester and in each timed
probe): a parallel region whose other thread a busy neighbour preempts adds noise, and no claim
needs parallelism. Why each threshold
sits where it does is said next to it; the measured ranges behind it are in the table of
autograder/README.md.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable

import torch

from autograder.timing import RatioResult

__all__ = ["SpeedCheck", "one_torch_thread"]

@contextlib.contextmanager
def one_torch_thread():
    """Run the block on one torch thread; the previous thread count is restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@dataclass(frozen=True)
class SpeedCheck:
    grade_id: str                       # the graded cell that runs it
    threshold: float                    # required RatioResult.ratio
    measure: Callable[..., RatioResult]  # measure(candidate, *args, **workload)
    reference: Callable                 # correct, on the library: passes
    counter_example: Callable           # the usual mistake: fails
    hint: str                           # the failure message (a format string)
    workload: dict = field(default_factory=dict)     # the measure's keyword defaults
    fixture: Callable[[], tuple] = tuple  # extra positional args for the registry's runs
    solution: tuple[str, ...] = ()      # (function name, solution cell grade ids...)

    def ratio(self, candidate, *args, **workload) -> RatioResult:
        """Measure `candidate`; returns the RatioResult."""
        with one_torch_thread():
            return self.measure(candidate, *args, **{**self.workload, **workload})

    def check(self, candidate, *args, at_least: float | None = None, **workload) -> float:
        """AssertionError with the hint unless the ratio reaches `at_least` (default: the
        threshold); prints the threshold and the ratio; returns the ratio."""
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
        """The registry's verdict on `candidate` with the fixture's arguments: True if the check
        passes, False if it raises."""
        try:
            self.check(candidate, *self.fixture())
        except Exception:           # noqa: BLE001 - a failed check, or a withheld reference
            return False
        return True
