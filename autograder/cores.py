"""Each of `grade --jobs N`'s jobs gets its own share of this machine's cores.

Two things, for N jobs at a time on one machine:

* threads (share_of_cores): each job's process and its kernel get cores // N torch threads and
  Inductor compile workers, unless the grader's environment sets them (the sandbox passes both
  through). Without it, N kernels each run torch, and Inductor's compile pool, on every core;
* cores of its own (CoreSlots): each running job is pinned (sched_setaffinity, inherited by the
  kernel and everything it starts) to a set of CPUs that no other running job of the batch
  has, whole physical cores (hyperthread siblings stay together). The sandbox's seccomp filter
  refuses sched_setaffinity (autograder/syscall_filter.py), so student code cannot put itself
  back on every core: a submission that spins on as many threads as it can start slows itself,
  not the timed checks of the students graded beside it.

What it does not isolate: the memory bandwidth and the last-level cache the cores share; with
more jobs than physical cores, jobs share cores (each slot then reuses one); the jobs of a
Dask cluster (`--scheduler`), whose workers decide where their jobs run (start each worker
with `--nthreads 1` under `taskset` to give it cores of its own).
"""
from __future__ import annotations

import os
import queue
from contextlib import contextmanager
from pathlib import Path

__all__ = ["THREAD_ENV", "share_of_cores", "physical_cores", "CoreSlots", "restore_torch_threads",
           "torch_threads", "CORES_ENV"]

THREAD_ENV = ("OMP_NUM_THREADS", "TORCHINDUCTOR_COMPILE_THREADS")
CORES_ENV = "AUTOGRADER_CORES"      # a sandboxed kernel's physical cores, counted outside it
_SYS_CPU = Path("/sys/devices/system/cpu")


def share_of_cores(workers: int) -> dict[str, str]:
    """{variable: cores // workers (at least 1)} for each THREAD_ENV variable the grader's own
    environment does not set (a value the instructor sets wins); {} for one worker."""
    if workers <= 1:
        return {}
    share = str(max(1, len(os.sched_getaffinity(0)) // workers))
    return {name: share for name in THREAD_ENV if name not in os.environ}


def torch_threads() -> int:
    """The threads torch should use in this process: OMP_NUM_THREADS, else one per physical core
    it may run on (torch's own default), CORES_ENV when set, else counted from /sys."""
    return _count(os.environ.get("OMP_NUM_THREADS")) or _count(os.environ.get(CORES_ENV)) or \
        len(physical_cores())


def restore_torch_threads() -> int:
    """Give torch, in this process, torch_threads() threads; returns that number.

    For the sandboxed kernel (autograder/execute.py runs it before any student code): the
    sandbox's syscall filter refuses sched_setaffinity (autograder/syscall_filter.py), which a
    CPU probe uses when torch loads, and torch then starts on one thread whatever
    OMP_NUM_THREADS says."""
    import torch
    n = torch_threads()
    torch.set_num_threads(n)
    return n


def _count(value: str | None) -> int:
    """A positive thread count from an environment variable, else 0 (unset, or a value such as
    OpenMP's nested "4,2" that torch reads its own way)."""
    try:
        return max(0, int(value or 0))
    except ValueError:
        return 0


def _parse_cpu_list(text: str) -> set[int]:
    """'0-3,8,10-11' (the kernel's cpu list format) -> {0, 1, 2, 3, 8, 10, 11}."""
    out: set[int] = set()
    for part in text.strip().split(","):
        if part:
            lo, _, hi = part.partition("-")
            out.update(range(int(lo), int(hi or lo) + 1))
    return out


def physical_cores(cpus=None, sys_cpu: Path = _SYS_CPU) -> list[list[int]]:
    """The CPUs this process may run on (or `cpus`), grouped by physical core (the hyperthread
    siblings of /sys/.../cpuN/topology/thread_siblings_list), groups in CPU order; a CPU whose
    topology cannot be read is a core of its own."""
    allowed = sorted(os.sched_getaffinity(0) if cpus is None else set(cpus))
    groups, seen = [], set()
    for cpu in allowed:
        if cpu in seen:
            continue
        try:
            siblings = _parse_cpu_list(
                (sys_cpu / f"cpu{cpu}" / "topology" / "thread_siblings_list").read_text())
        except (OSError, ValueError):
            siblings = {cpu}
        group = sorted((siblings | {cpu}) & set(allowed))
        seen.update(group)
        groups.append(group)
    return groups


class CoreSlots:
    """`workers` sets of CPUs, disjoint whenever there are at least `workers` physical cores:
    each gets cores // workers whole cores (the cores left over stay idle, so that every job
    runs on as many cores as the others). `take()` lends a free set for the duration of a job.
    """

    def __init__(self, workers: int, cores: list[list[int]] | None = None):
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        cores = physical_cores() if cores is None else cores
        if not cores:
            raise ValueError("no CPU to run on")
        per = len(cores) // workers
        if per:
            self.sets = [sorted(c for core in cores[i * per:(i + 1) * per] for c in core)
                         for i in range(workers)]
        else:                               # more jobs than cores: some share one
            self.sets = [list(cores[i % len(cores)]) for i in range(workers)]
        self.disjoint = per > 0
        self._free: queue.SimpleQueue = queue.SimpleQueue()
        for i in range(workers):
            self._free.put(i)

    @contextmanager
    def take(self):
        """A free CPU set (a sorted list); waits while all are lent."""
        i = self._free.get()
        try:
            yield list(self.sets[i])
        finally:
            self._free.put(i)

    def describe(self) -> str:
        return ", ".join("{" + ",".join(map(str, s)) + "}" for s in self.sets)
