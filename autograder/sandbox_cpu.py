"""The CPU time of a student's kernel, read from outside it: the clock of the tester's speed
checks (autograder/tester.py).

A test that runs in the tester calls the student's code in the student's kernel
(autograder/kernel_side.py), so the tester's own CPU time (`time.process_time`) leaves out the
work it is meant to time: lab 01 timed `serve_batched` at 1.26x instead of the 1.8x it reaches,
because only the tester's share of each call was counted. Nothing the kernel says about itself can be trusted, so the tester reads
the kernel's CPU time from Linux, from outside:

* which processes: the kernel's whole sandbox. The kernel's pid comes from the connection it
  opened to the tester (`SO_PEERCRED`, translated by Linux into the tester's PID namespace). In
  the sandbox (its own PID namespace, autograder/sandbox.py) every process the kernel starts,
  orphans included, descends from the namespace's first process, so the meter walks up from the
  kernel to that process and counts it and all its descendants; without a sandbox, the kernel
  and its descendants;
* the fine clock: the sum of each process's CPU clock (`clock_gettime` on the process's CPU-time
  clock, in nanoseconds), which counts every thread the process ran, ended ones included: a
  thread pool is timed like any other work;
* the coarse check: a child process that ends takes its nanoseconds with it (only its parent's
  `cutime` / `cstime` in `/proc/<pid>/stat`, clock ticks of 10 ms, keep them), so work done in
  short-lived processes would vanish from the fine clock. `SandboxMeter.check` compares the two
  over a whole measurement: when the children's ticks grew by more than a few, the measurement
  is refused (`UnaccountedWork`, an AssertionError: the test fails and says why).

What it does not see: time spent in the kernel on behalf of the process outside its threads
(interrupts, other processes' page-ins), as any CPU clock.
"""
from __future__ import annotations

import os
import socket
import struct
import time

__all__ = ["SandboxMeter", "UnaccountedWork", "peer_pid"]

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01
SLACK_TICKS = 4              # rounding of the coarse count, per measurement
SLACK_FRACTION = 0.05        # of the fine clock that ended children may use


class UnaccountedWork(AssertionError):
    """The student's code did work the fine clock cannot time (processes that ended during a
    timed check)."""


def peer_pid(conn: socket.socket) -> int:
    """The pid, in this process's PID namespace, of the process that connected `conn`."""
    pid, _uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                          struct.calcsize("3i")))
    if pid <= 0:
        raise OSError("the peer of the tester's socket has no pid in this namespace")
    return pid


def _status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


def _ns_depth(pid: int) -> int:
    return len(_status(pid).get("NSpid", "").split())


def sandbox_root(pid: int) -> int:
    """The first process of `pid`'s PID namespace when that namespace is below this process's
    (the sandbox's), else `pid` itself."""
    mine = _ns_depth(os.getpid())
    if _ns_depth(pid) <= mine:
        return pid
    current = pid
    while True:
        status = _status(current)
        nspid = status.get("NSpid", "").split()
        if len(nspid) > mine and nspid[-1] == "1":
            return current
        parent = int(status["PPid"])
        if parent <= 1:
            return pid
        current = parent


def _children(pid: int) -> list[int]:
    found = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    found += [int(x) for x in f.read().split()]
            except (FileNotFoundError, ProcessLookupError):
                pass
    except (FileNotFoundError, ProcessLookupError):
        pass
    return found


def _coarse_ticks(pid: int) -> int:
    """The ticks of the children `pid` waited for (cutime + cstime)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # after the command: state ppid ... utime(14) stime(15) cutime(16) cstime(17), 1-based
    return int(fields[13]) + int(fields[14])


def _fine_ns(pid: int) -> int:
    """The process's CPU time, all its threads (ended ones too): its CPU-time clock."""
    try:
        return time.clock_gettime_ns(((~pid) << 3) | 2)     # CPUCLOCK_SCHED, process-wide
    except OSError:
        raise ProcessLookupError(pid) from None


class SandboxMeter:
    """CPU seconds of the processes of a kernel's sandbox (see the module docstring)."""

    def __init__(self, pid: int):
        self.root = sandbox_root(pid)

    @classmethod
    def of_peer(cls, conn: socket.socket) -> "SandboxMeter":
        return cls(peer_pid(conn))

    def processes(self) -> list[int]:
        seen, todo = [], [self.root]
        while todo:
            pid = todo.pop()
            if pid not in seen:
                seen.append(pid)
                todo += _children(pid)
        return seen

    def read(self) -> tuple[float, float]:
        """(fine, coarse) CPU seconds of the sandbox's processes so far."""
        fine = coarse = 0
        for pid in self.processes():
            try:
                fine += _fine_ns(pid)
                coarse += _coarse_ticks(pid)
            except (FileNotFoundError, ProcessLookupError):
                pass                # ended while being read: its parent's cutime has it next
        return fine * 1e-9, coarse * TICK_S

    def seconds(self) -> float:
        """The fine clock alone (read twice per timed call: no tick counts)."""
        fine = 0
        for pid in self.processes():
            try:
                fine += _fine_ns(pid)
            except (FileNotFoundError, ProcessLookupError):
                pass
        return fine * 1e-9

    def check(self, before: tuple[float, float], after: tuple[float, float]) -> None:
        """UnaccountedWork when, between the two readings, the ended children's ticks grew by
        more than a few (see the module docstring)."""
        fine = after[0] - before[0]
        coarse = after[1] - before[1]
        if coarse > SLACK_FRACTION * fine + SLACK_TICKS * TICK_S:
            raise UnaccountedWork(
                f"during this timed check your kernel's child processes used {coarse:.2f} s "
                "of CPU and ended before they could be timed: do the work in your kernel's "
                "process (threads are fine), not in processes you start and end per call")


def cpu_clock(meter_of):
    """A clock for minillm.timing: this process's CPU seconds plus those of the sandbox that
    `meter_of()` returns (None: this process only)."""
    process_time = time.process_time

    def clock() -> float:
        meter = meter_of()
        return process_time() + (meter.seconds() if meter is not None else 0.0)
    return clock
