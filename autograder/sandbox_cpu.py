"""The CPU time of a kernel's whole sandbox, read from Linux outside it, for the tester's speed
checks (the tester's own time missed the kernel's: lab 01 timed 1.26x instead of 1.8x). Each
process's CPU clock counts ended threads; a child process that ends keeps only its parent's
cutime ticks, so `SandboxMeter.check` refuses a measurement they grew in (`UnaccountedWork`).
"""
from __future__ import annotations

import contextlib
import os
import socket
import struct
import time

__all__ = ["SandboxMeter", "UnaccountedWork", "peer_pid"]

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01
SLACK_TICKS = 4              # rounding of the coarse count, per measurement
SLACK_FRACTION = 0.05        # of the fine clock that ended children may use
_GONE = (FileNotFoundError, ProcessLookupError)


class UnaccountedWork(AssertionError):
    """Work in processes that ended during a timed check: the fine clock cannot time it."""


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


def sandbox_root(pid: int) -> int:
    """The first process of `pid`'s PID namespace if it is below this process's, else `pid`."""
    mine = len(_status(os.getpid()).get("NSpid", "").split())
    if len(_status(pid).get("NSpid", "").split()) <= mine:
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
    with contextlib.suppress(*_GONE):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(*_GONE), open(f"/proc/{pid}/task/{tid}/children") as f:
                found += [int(x) for x in f.read().split()]
    return found


def _coarse_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # after the command: state ppid ... utime(14) stime(15) cutime(16) cstime(17), 1-based
    return int(fields[13]) + int(fields[14])


def _fine_ns(pid: int) -> int:
    try:
        return time.clock_gettime_ns(((~pid) << 3) | 2)     # CPUCLOCK_SCHED, process-wide
    except OSError:
        raise ProcessLookupError(pid) from None


class SandboxMeter:
    """CPU seconds of the processes of a kernel's sandbox."""

    def __init__(self, conn: socket.socket):
        self.root = sandbox_root(peer_pid(conn))     # the process that connected `conn`

    def processes(self) -> list[int]:
        seen, todo = [], [self.root]
        while todo:
            pid = todo.pop()
            if pid not in seen:
                seen.append(pid)
                todo += _children(pid)
        return seen

    def read(self, coarse: bool = True) -> tuple[float, float]:
        """(fine, coarse) seconds; coarse=False: the fine clock alone (read twice per timed call)."""
        fine = ticks = 0
        for pid in self.processes():
            with contextlib.suppress(*_GONE):   # ended while read: its parent's cutime has it
                fine += _fine_ns(pid)
                ticks += _coarse_ticks(pid) if coarse else 0
        return fine * 1e-9, ticks * TICK_S

    def check(self, before: tuple[float, float], after: tuple[float, float]) -> None:
        fine, coarse = after[0] - before[0], after[1] - before[1]
        if coarse > SLACK_FRACTION * fine + SLACK_TICKS * TICK_S:
            raise UnaccountedWork(
                f"during this timed check your kernel's child processes used {coarse:.2f} s "
                "of CPU and ended before they could be timed: do the work in your kernel's "
                "process (threads are fine), not in processes you start and end per call")


def cpu_clock(meter_of):
    """This process's CPU seconds plus those of the sandbox `meter_of()` returns (or None)."""
    process_time = time.process_time

    def clock() -> float:
        meter = meter_of()
        return process_time() + (meter.read(coarse=False)[0] if meter is not None else 0.0)
    return clock
