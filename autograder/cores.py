"""Each of `grade --jobs N`'s jobs gets its own share of the cores: cores // N torch threads and
compile workers (share_of_cores), and whole physical cores no other running job has (CoreSlots;
the seccomp filter keeps it there). Memory bandwidth and the last-level cache stay shared.
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
    """{variable: cores // workers} for each THREAD_ENV variable the instructor did not set."""
    if workers <= 1:
        return {}
    share = str(max(1, len(os.sched_getaffinity(0)) // workers))
    return {name: share for name in THREAD_ENV if name not in os.environ}


def torch_threads() -> int:
    """OMP_NUM_THREADS, else one per physical core (torch's default): CORES_ENV, else /sys."""
    return _count(os.environ.get("OMP_NUM_THREADS")) or _count(os.environ.get(CORES_ENV)) or \
        len(physical_cores())


def restore_torch_threads() -> int:
    """Give torch torch_threads() threads; returns that number. For the sandboxed kernel: the
    seccomp filter refuses the sched_setaffinity of torch's CPU probe, which then leaves torch
    on one thread whatever OMP_NUM_THREADS says."""
    import torch
    torch.set_num_threads(n := torch_threads())
    return n


def _count(value: str | None) -> int:
    """A thread count from an environment variable, else 0 (unset, or OpenMP's nested "4,2")."""
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
    """This process's CPUs (or `cpus`) grouped by physical core (thread_siblings_list)."""
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
    """`workers` sets of cores // workers whole cores (disjoint if there are enough; the rest
    idle, so every job runs on as many); `take()` lends one for a job."""

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
        i = self._free.get()
        try:
            yield list(self.sets[i])
        finally:
            self._free.put(i)

    def describe(self) -> str:
        return ", ".join("{" + ",".join(map(str, s)) + "}" for s in self.sets)
