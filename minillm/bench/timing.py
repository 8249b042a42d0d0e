"""Timing you can trust: warm-up, interleaving, device sync, medians and ratios.

    from minillm.bench.timing import time_interleaved, median, ratio
    times = time_interleaved({"naive": lambda: slow(x), "cached": lambda: fast(x)},
                             warmup=2, repeats=7)
    print(ratio(times["naive"], times["cached"]))      # how many times faster "cached" is

Rules this module follows:

* **Interleave.** Round r runs every function once, in dict order (a, b, a, b, ...), so a noisy
  neighbour, a CPU frequency change or a cache warming up hits both sides of a comparison alike.
* **Warm up.** The first calls pay for lazy initialisation, allocator growth, kernel autotuning;
  `warmup` interleaved rounds run first and are thrown away.
* **Sync.** GPU work is asynchronous: without `sync` (e.g. `torch.cuda.synchronize`) you time the
  launch, not the work. `sync` is called after each run, inside the timed region.
* **Medians, ratios.** A median ignores the odd preempted run; a ratio of two medians taken in the
  same process and minute is far more stable than any absolute time.

* **CPU time for CPU work under load.** `cpu_time_interleaved` is the same loop timed with
  `time.process_time`: the CPU seconds of this process, on all its threads. Another process
  that takes the core for a while (a busy neighbour on a shared grading host) adds nothing to
  it, where it adds its whole time slice to a wall-clock run; work handed to another thread of
  the process still counts. It is wrong for GPU work (the device's time is not CPU time) and
  it charges a thread pool's spin-waiting, so wall-clock `time_interleaved` stays the default.

* **Count the work too.** A time is a ratio on one machine; a count is exact anywhere.
  `WorkCounter(model)` counts the forward calls and the tokens fed to a model while a block
  runs, so a claim such as "the cached loop feeds each token once" is checked exactly.
"""
from __future__ import annotations

from statistics import median as _stat_median
from time import perf_counter, process_time
from typing import Callable, Mapping

import torch

__all__ = ["time_interleaved", "cpu_time_interleaved", "median", "ratio", "perf_counter",
           "WorkCounter"]

def _build(clock: Callable[[], float], med: Callable):
    """time_interleaved, median and ratio on `clock` (the grader's tester builds them on a clock
    that also counts the student's kernel: autograder/tester.py)."""

    def median(values) -> float:
        """Median of a non-empty sequence of numbers."""
        values = list(values)
        if not values:
            raise ValueError("median of an empty list of timings")
        return float(med(values))

    def ratio(baseline_times, candidate_times) -> float:
        """median(baseline) / median(candidate): > 1 means the candidate is faster."""
        c = median(candidate_times)
        b = median(baseline_times)
        if c <= 0:
            return float("inf") if b > 0 else 1.0
        return b / c

    def time_interleaved(fns: Mapping[str, Callable[[], object]], warmup: int = 2,
                         repeats: int = 7, sync: Callable[[], object] | None = None
                         ) -> dict[str, list[float]]:
        """Seconds per call of each function, measured in interleaved rounds.

        `warmup` untimed rounds, then `repeats` timed rounds; each round calls every function
        once in the order of `fns`. `sync` (if given) runs after each call, inside the timing.
        Returns {name: [seconds of round 1, ..., seconds of round `repeats`]}.
        """
        fns = dict(fns)
        if not fns:
            raise ValueError("time_interleaved needs at least one function")
        for name, fn in fns.items():
            if not callable(fn):
                raise TypeError(f"{name!r} is not callable: {fn!r}")
        warmup, repeats = int(warmup), int(repeats)
        if warmup < 0 or repeats < 1:
            raise ValueError(f"need warmup >= 0 and repeats >= 1, got {warmup}, {repeats}")
        for _ in range(warmup):
            for fn in fns.values():
                fn()
                if sync is not None:
                    sync()
        times: dict[str, list[float]] = {name: [] for name in fns}
        for _ in range(repeats):
            for name, fn in fns.items():
                t0 = clock()
                fn()
                if sync is not None:
                    sync()
                times[name].append(clock() - t0)
        return times

    return time_interleaved, median, ratio


time_interleaved, median, ratio = _build(perf_counter, _stat_median)
cpu_time_interleaved = _build(process_time, _stat_median)[0]


# ---- counting -------------------------------------------------------------------------------
class WorkCounter:
    """Count the work a model does while the block runs.

        with WorkCounter(model) as work:
            generate(model, prompt, ...)
        work.calls    # forward calls of `model`
        work.tokens   # sum over those calls of ids.numel() (first positional or `ids` argument)

    Uses a forward pre-hook on `model` (so `model(ids)` is counted, a direct `model.forward(...)`
    is not), removed on exit.
    """

    def __init__(self, model: torch.nn.Module):
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"WorkCounter needs a torch.nn.Module, got {type(model).__name__}")
        self.model = model
        self.calls = 0
        self.tokens = 0
        self._handle = None

    def _hook(self, module, args, kwargs):
        self.calls += 1
        ids = args[0] if args else kwargs.get("ids")
        if torch.is_tensor(ids):
            self.tokens += int(ids.numel())
        return None

    def __enter__(self) -> "WorkCounter":
        if self._handle is not None:
            raise RuntimeError("WorkCounter is already active")
        self.calls = 0
        self.tokens = 0
        self._handle = self.model.register_forward_pre_hook(self._hook, with_kwargs=True)
        return self

    def __exit__(self, *exc) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def __repr__(self) -> str:
        return f"WorkCounter(calls={self.calls}, tokens={self.tokens})"
