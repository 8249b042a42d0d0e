"""The tester: a process of the grader's that runs a lab's test cells (visible and hidden
parts), apart from the student's kernel.

The job process (autograder/jobs.py) starts it with `python -m autograder.tester SOCKET` beside
the student's kernel and talks to it in JSON lines on its stdin / stdout:

    {"op": "setup", "grade_id": ..., "source": ...}   a locked setup cell of the lab, run here
                                                      too (imports, the model, the lab's helpers)
    {"op": "test", "seq": n, "grade_id": ...,         a test cell: wait for the student's kernel
     "source": ..., "names": [...]}                   to connect to SOCKET, run the cell, tell the
                                                      kernel it is done
    {"op": "abort", "seq": n}                         (while test n waits) the kernel will not
                                                      connect; ignored once it has
    {"op": "quit"}

and answers each setup and test with {"ok": bool, "ename": ..., "evalue": ..., "stdout": ...}.

A test reads the student's definitions by name, only the `names` the lab's unlocked cells bind
(autograder/tester_plan.py): a function or class of theirs is a `StudentFunction`, whose calls
run in the kernel with plain values both ways (autograder/plain.py, autograder/kernel_side.py);
any other value of theirs is fetched by value. A probe (autograder/probes.py) runs in the kernel.
The tester never runs the student's code, never unpickles what the kernel sends, and sends it
nothing but plain values and the names of the student's own objects. Speed checks time the
tester's CPU and the kernel's whole sandbox's, read from Linux (autograder/sandbox_cpu.py).
"""
from __future__ import annotations

import builtins
import contextlib
import io
import json
import os
import select
import socket
import sys
import time

from . import probes, steady_malloc
from .kernel_side import MAX_TEXT
from .plain import Codec, Disconnected, ProtocolError, StudentRef, recv, send
from .sandbox_cpu import SandboxMeter, UnaccountedWork, cpu_clock

MAX_STDOUT = 100_000         # characters of a test's own printing that are kept

# exceptions of the student's code that keep their type when they cross; others: StudentError
BUILTIN_ERRORS = {e.__name__: e for e in (
    AssertionError, ValueError, TypeError, RuntimeError, IndexError, KeyError, AttributeError,
    NotImplementedError, ZeroDivisionError, ArithmeticError, OverflowError, LookupError,
    StopIteration, NameError)}
BUILTIN_ERRORS["NotPlain"] = TypeError       # a result that cannot cross (autograder/plain.py)


class StudentError(Exception):
    """An exception of a type the tester does not recreate, raised by the student's code."""


class StudentFunction(StudentRef):
    """A function or class of the student's notebook: calling it runs it in their kernel."""

    def __call__(self, *args, **kwargs):
        kernel = probes.connection()
        if kernel is None:
            raise RuntimeError(f"{self.name} belongs to a test that has ended")
        return kernel.request({"op": "call", "name": self.name}, args, kwargs)


class Kernel:
    """The tester's connection to the student's kernel during one test."""

    def __init__(self, conn: socket.socket):
        self.conn = conn

    def request(self, message: dict, args: tuple = (), kwargs: dict | None = None):
        out = Codec()
        message = {**message, "args": out.enc(tuple(args), where="an argument"),
                   "kwargs": out.enc(dict(kwargs or {}), where="an argument")}
        send(self.conn, message, out.blobs)
        reply, blobs = recv(self.conn)
        if "err" in reply:
            name, text = (list(reply["err"]) + ["", ""])[:2]
            cls = BUILTIN_ERRORS.get(name)
            text = str(text)[:MAX_TEXT]
            raise cls(text) if cls is not None else StudentError(f"{str(name)[:80]}: {text}")
        got = Codec(blobs)
        value = got.dec(reply.get("ok"))
        for change in reply.get("changed", []) if type(reply.get("changed")) is list else ():
            if type(change) is not list or len(change) != 2 or type(change[0]) is not int \
                    or not 0 <= change[0] < len(args):
                raise ProtocolError("a changed argument out of range")
            _copy_into(args[change[0]], got.dec(change[1]))
        return value

    def lookup(self, name: str):
        value = self.request({"op": "lookup", "name": name})
        if value == {"callable": True}:
            return StudentFunction(name)
        return value

    def probe(self, name: str, args: tuple, kwargs: dict):
        return self.request({"op": "probe", "fn": name}, args, kwargs)

    def done(self) -> None:
        send(self.conn, {"op": "done"}, [])
        recv(self.conn)


def _copy_into(old, new):
    """Make the tester's argument `old` hold what the student's call left in its copy, in
    place where it can (the tensors inside a tuple too); returns what stands for it now."""
    import numpy as np
    import torch
    if isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor):
        with torch.no_grad():
            if old.shape == new.shape and old.dtype == new.dtype:
                old.copy_(new)
            else:
                old.set_(new.clone())
    elif type(old) in (list, tuple) and type(new) in (list, tuple):
        same = len(old) == len(new)
        items = [_copy_into(a, b) for a, b in zip(old, new)] if same else list(new)
        if type(old) is list:
            old[:] = items
        elif not same or any(a is not b for a, b in zip(old, items)):
            raise ProtocolError("your code changed a tuple it was given")
    elif type(old) is dict and type(new) is dict:
        items = {k: _copy_into(old[k], v) if k in old else v for k, v in new.items()}
        old.clear()
        old.update(items)
    elif isinstance(old, torch.Generator) and isinstance(new, torch.Generator):
        old.set_state(new.get_state())
    elif isinstance(old, np.ndarray) and isinstance(new, np.ndarray) and old.shape == new.shape:
        old[...] = new
    else:
        return new
    return old


class Namespace(dict):
    """The tests' globals: what the setup cells and the tests bind, then the student's names
    (`student_names`), fetched from the kernel on first use in a test."""

    def __init__(self):
        super().__init__()
        self.student_names: frozenset[str] = frozenset()

    def __missing__(self, name):
        kernel = probes.connection()
        if hasattr(builtins, name) or name not in self.student_names or kernel is None:
            raise KeyError(name)
        try:
            value = kernel.lookup(name)
        except NameError:
            raise KeyError(name) from None
        self[name] = value
        return value


class Tester:
    def __init__(self, socket_path: str):
        self.ns = Namespace()
        self.ns["__name__"] = "__main__"
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(socket_path)
        self.listener.bind(socket_path)
        self.listener.listen(1)
        self.meter: SandboxMeter | None = None     # the connected kernel's CPU time
        steady_malloc.steady()      # the same work costs the same here and in the kernel
        _time_the_kernel_too(self)

    def run_source(self, source: str, grade_id: str) -> dict:
        out = io.StringIO()
        result = {"ok": True, "ename": "", "evalue": ""}
        try:
            code = compile(source, f"<{grade_id}>", "exec")
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                exec(code, self.ns)
        except Disconnected:
            result.update(ok=False, ename="KernelStopped",
                          evalue="your kernel stopped answering the tests (it died, was "
                                 "interrupted at the time limit, or closed the connection)")
        except ProtocolError as e:
            result.update(ok=False, ename="UnreadableAnswer", evalue=_text(e))
        except BaseException as e:   # noqa: BLE001 - a failed test, whatever it raised
            result.update(ok=False, ename=type(e).__name__, evalue=_text(e))
        text = out.getvalue()
        if len(text) > MAX_STDOUT:
            text = text[:MAX_STDOUT] + f"\n[output cut at {MAX_STDOUT} characters]\n"
        result["stdout"] = text
        return result

    def test(self, cmd: dict, commands) -> dict:
        """Wait for the kernel (or an abort on stdin), then run the test against it."""
        deadline = time.monotonic() + float(cmd.get("timeout", 600))
        conn = None
        while conn is None:
            left = deadline - time.monotonic()
            if left <= 0:
                return {"ok": False, "ename": "KernelStopped", "stdout": "",
                        "evalue": "your kernel did not start answering this test in time"}
            if commands.has_line():
                ready = [commands]
            else:
                ready, _, _ = select.select([self.listener, commands.fd], [], [], left)
            if commands in ready or commands.fd in ready:
                line = commands.readline()
                if not line:
                    return {"ok": False, "ename": "NotRun", "stdout": "",
                            "evalue": "the grader stopped before this test ran"}
                other = json.loads(line)
                if other.get("op") == "abort" and other.get("seq") == cmd.get("seq"):
                    return {"ok": False, "ename": "NotRun", "stdout": "",
                            "evalue": "this test did not run: your kernel never started "
                                      "answering it"}
            if self.listener in ready:
                conn, _ = self.listener.accept()
        conn.settimeout(max(1.0, deadline - time.monotonic()))
        try:
            self.meter = SandboxMeter.of_peer(conn)
        except (OSError, ValueError, KeyError) as e:
            self.meter = None       # the speed checks then refuse to run: a candidate whose
            print(f"tester: cannot read the kernel's CPU time: {e}",   # work went uncounted
                  file=sys.stderr)                                    # would look free
        kernel = Kernel(conn)
        probes._CONNECTION = kernel
        self.ns.student_names = frozenset(cmd.get("names", []))
        for name in self.ns.student_names:     # the kernel holds the student's value
            self.ns.pop(name, None)
        try:
            result = self.run_source(cmd["source"], cmd.get("grade_id", "test"))
            with contextlib.suppress(OSError, ProtocolError):
                kernel.done()
            return result
        finally:
            probes._CONNECTION = None
            for name in self.ns.student_names:     # never kept from one test to the next
                self.ns.pop(name, None)
            self.ns.student_names = frozenset()
            self.meter = None
            conn.close()


class Commands:
    """Lines from a file descriptor, read without Python's buffering, so that `select` on the
    descriptor says whether a command is waiting."""

    def __init__(self, fd: int):
        self.fd, self.buf = fd, b""

    def has_line(self) -> bool:
        return b"\n" in self.buf

    def fill(self) -> None:
        """Read what is waiting (call after `select` says the descriptor is readable)."""
        chunk = os.read(self.fd, 1 << 16)
        self.buf += chunk if chunk else b"\n"    # end of file reads as an empty line

    def readline(self) -> str:
        while b"\n" not in self.buf:
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                line, self.buf = self.buf, b""
                return line.decode()
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return line.decode() + "\n"


class TesterProcess:
    """The job process's handle on a tester: start it, hand it cells, read its answers."""

    def __init__(self, socket_path: str, cwd: str, env: dict | None = None):
        import subprocess
        self.socket_path = socket_path
        self.proc = subprocess.Popen([sys.executable, "-m", "autograder.tester", socket_path],
                                     cwd=cwd, env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE)     # stderr: the job's log
        self.replies = Commands(self.proc.stdout.fileno())
        self.pending = None
        self.seq = 0

    def begin(self, cmd: dict) -> None:
        """Send a setup cell or a test; its answer is read by `end`."""
        self.seq += 1
        cmd = {**cmd, "seq": self.seq}
        self._write(cmd)
        self.pending = cmd

    def end(self, wait: float) -> dict:
        """The answer to the last command. A test whose kernel never connected (its visible
        part failed, or the kernel died first) is told to abort. Waits at most `wait` seconds,
        then stops the tester: its answer is then a failure of the grader's own."""
        cmd, self.pending = self.pending, None
        if cmd is None:
            return {"ok": True, "ename": "", "evalue": "", "stdout": ""}
        deadline = time.monotonic() + wait
        aborted = False
        while not self.replies.has_line():
            left = deadline - time.monotonic()
            if left <= 0 or self.proc.poll() is not None:
                self.close()
                return {"ok": False, "ename": "TesterStopped", "stdout": "",
                        "evalue": "the grader's tester did not answer: this test could not be "
                                  "run (a problem of the grader's, not of your notebook)"}
            step = min(left, 0.5 if cmd.get("op") == "test" and not aborted else left)
            ready, _, _ = select.select([self.replies.fd], [], [], step)
            if ready:
                self.replies.fill()
            elif cmd.get("op") == "test" and not aborted:
                self._write({"op": "abort", "seq": cmd["seq"]})  # moot once it connected
                aborted = True
        line = self.replies.readline()
        try:
            return json.loads(line)
        except ValueError:
            self.close()
            return {"ok": False, "ename": "TesterStopped", "stdout": "",
                    "evalue": "the grader's tester stopped: this test could not be run"}

    def _write(self, cmd: dict) -> None:
        try:
            self.proc.stdin.write((json.dumps(cmd) + "\n").encode())
            self.proc.stdin.flush()
        except OSError:
            pass                         # a dead tester: end() says so

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._write({"op": "quit"})
            self.proc.stdin.close()
        try:
            self.proc.wait(5)
        except Exception:        # noqa: BLE001
            self.proc.kill()
            self.proc.wait(5)


def _text(e: BaseException) -> str:
    try:
        return str(e)[:MAX_TEXT]
    except Exception:        # noqa: BLE001
        return "(its message could not be read)"


def _time_the_kernel_too(tester: Tester) -> None:
    """The speed checks' CPU clock (autograder.timing.time_ratio) counts the tester's CPU time
    and the connected kernel's sandbox's (autograder/sandbox_cpu.py), and refuses a measurement
    during which the student's code did work that clock cannot see."""
    from autograder import timing as checks_timing
    from minillm import timing
    timed = timing._build(cpu_clock(lambda: tester.meter), timing._stat_median)[0]

    def cpu_time_interleaved(fns, warmup: int = 2, repeats: int = 7, sync=None):
        meter = tester.meter
        if meter is None and probes.connection() is not None:
            raise UnaccountedWork("the grader cannot read your kernel's CPU time, so this "
                                  "timed check cannot run (see the job's log)")
        before = meter.read() if meter is not None else None
        times = timed(fns, warmup=warmup, repeats=repeats, sync=sync)
        if meter is not None:
            meter.check(before, meter.read())
        return times

    checks_timing._cpu_time_interleaved = cpu_time_interleaved


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m autograder.tester SOCKET", file=sys.stderr)
        return 2
    channel = os.fdopen(os.dup(1), "w", buffering=1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)                 # stray C-level writes must not reach the channel
    tester = Tester(argv[0])
    commands = Commands(0)
    while True:
        line = commands.readline()
        if not line:
            break
        cmd = json.loads(line)
        op = cmd.get("op")
        if op == "quit":
            break
        if op == "abort":               # for a test that has already run: nothing to say
            continue
        if op == "setup":
            reply = tester.run_source(cmd["source"], cmd.get("grade_id", "setup"))
        elif op == "test":
            reply = tester.test(cmd, commands)
        else:
            reply = {"ok": True, "ename": "", "evalue": "", "stdout": ""}
        channel.write(json.dumps(reply) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
