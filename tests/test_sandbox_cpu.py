"""autograder/sandbox_cpu.py: the tester reads the CPU time of the student's kernel from
outside, for the whole sandbox, and refuses a measurement whose work it could not see."""
from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autograder.sandbox import (
    SandboxSpec,
    bwrap_argv,
    default_env,
    default_ro_paths,
    sandbox_unavailable_reason,
)
from autograder.sandbox_cpu import SandboxMeter, UnaccountedWork, _status

REPO = Path(__file__).resolve().parent.parent

# A stand-in for the student's kernel: connects to the tester's socket, then on each line
# spins for the given CPU seconds here, in a thread that ends, or in a child process.
WORKER = r"""
import os, socket, sys, threading, time

def spin(s):
    t = time.process_time()
    while time.process_time() - t < s:
        pass

def in_child(s):
    pid = os.fork()
    if pid == 0:
        spin(s)
        os._exit(0)
    os.waitpid(pid, 0)

conn = socket.socket(socket.AF_UNIX)
conn.connect(sys.argv[1])
f = conn.makefile("rw")
def in_thread(s):
    n = len(os.listdir("/proc/self/task"))
    t = threading.Thread(target=spin, args=(s,))
    t.start()
    t.join()
    while len(os.listdir("/proc/self/task")) >= n + 1:    # until the OS thread is gone too
        time.sleep(0.01)

for line in f:
    how, s = line.split()
    {"here": spin, "thread": in_thread, "child": in_child}[how](float(s))
    f.write("done\n")
    f.flush()
"""


class Worker:
    def __init__(self, tmp_path: Path, sandboxed: bool):
        path = str(tmp_path / "rt" / "t.sock")
        (tmp_path / "rt").mkdir()
        (tmp_path / "work").mkdir()
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(path)
        listener.listen(1)
        cmd = [sys.executable, "-c", WORKER, path]
        if sandboxed:
            cmd = bwrap_argv(SandboxSpec(tmp_path / "work", tmp_path / "rt", default_ro_paths(),
                                         default_env(Path("/tmp/home"))), cmd)
        self.proc = subprocess.Popen(cmd)
        listener.settimeout(60)
        self.conn, _ = listener.accept()
        self.file = self.conn.makefile("rw")
        self.meter = SandboxMeter(self.conn)

    def do(self, how: str, seconds: float):
        before = self.meter.read()
        self.file.write(f"{how} {seconds}\n")
        self.file.flush()
        assert self.file.readline() == "done\n"
        return before, self.meter.read()

    def close(self):
        self.file.close()
        self.conn.close()
        try:
            self.proc.wait(30)
        finally:
            self.proc.kill()


def _check_the_meter(worker: Worker):
    for how in ("here", "thread"):          # a thread pool is timed like any other work, even
        before, after = worker.do(how, 0.3)        # once its threads have ended
        assert 0.25 < after[0] - before[0] < 0.6, (how, before, after)
        worker.meter.check(before, after)
    before, after = worker.do("child", 0.3)        # a child process that ended: unseen
    assert after[0] - before[0] < 0.1, (before, after)
    with pytest.raises(UnaccountedWork, match="child processes used"):
        worker.meter.check(before, after)


def test_the_meter_times_the_kernel_and_refuses_work_it_cannot_see(tmp_path):
    worker = Worker(tmp_path, sandboxed=False)
    try:
        assert worker.meter.root == worker.proc.pid
        _check_the_meter(worker)
    finally:
        worker.close()


@pytest.mark.skipif(sandbox_unavailable_reason() is not None,
                    reason=f"no bubblewrap sandbox: {sandbox_unavailable_reason()}")
def test_in_the_sandbox_the_meter_counts_the_whole_pid_namespace(tmp_path):
    """The kernel's pid comes from its connection (translated into our namespace); the meter
    counts from the sandbox's first process down, so an orphan the kernel leaves is counted."""
    worker = Worker(tmp_path, sandboxed=True)
    try:
        root = worker.meter.root
        nspid = _status(root)["NSpid"].split()
        assert nspid[-1] == "1" and len(nspid) > 1, nspid
        assert int(_status(root)["PPid"]) == worker.proc.pid, "bwrap's child starts it"
        _check_the_meter(worker)
    finally:
        worker.close()


def test_the_tester_refuses_to_time_without_a_meter(monkeypatch):
    """A kernel whose CPU time cannot be read must not look free: the timed check fails."""
    from autograder import probes, timing
    from autograder.tester import Tester

    monkeypatch.setattr(timing, "_cpu_time_interleaved", timing._cpu_time_interleaved)
    monkeypatch.setattr(probes, "_CONNECTION", object())
    tester = Tester.__new__(Tester)
    from autograder import tester as tester_module
    tester.meter = None
    tester_module._time_the_kernel_too(tester)
    with pytest.raises(UnaccountedWork, match="cannot read your kernel's CPU time"):
        timing.time_ratio(lambda: None, lambda: None, warmup=0, repeats=1)
    monkeypatch.setattr(probes, "_CONNECTION", None)      # no test running: the tester's own
    assert timing.time_ratio(lambda: time.sleep(0), lambda: None, warmup=0, repeats=1).ratio > 0
