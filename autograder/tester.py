"""The tester: the grader's process that runs a lab's test cells beside the student's kernel.
`python -m autograder.tester SOCKET` reads JSON-line commands (setup, test, abort, quit) and
answers each setup and test with {"ok", "ename", "evalue", "stdout"}.
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
from .kernel_side import MAX_TEXT, _text
from .plain import Codec, Disconnected, ProtocolError, StudentRef, recv, send
from .sandbox_cpu import SandboxMeter, UnaccountedWork, cpu_clock

MAX_STDOUT = 100_000         # characters of a test's own printing kept

# the student's exceptions that keep their type when they cross; others: StudentError
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
        return Codec(blobs).dec(reply.get("ok"))

    def lookup(self, name: str):
        value = self.request({"op": "lookup", "name": name})
        return StudentFunction(name) if value == {"callable": True} else value

    def probe(self, name: str, args: tuple, kwargs: dict):
        return self.request({"op": "probe", "fn": name}, args, kwargs)

    def done(self) -> None:
        send(self.conn, {"op": "done"}, [])
        recv(self.conn)


class Namespace(dict):
    """The tests' globals; the student's names are fetched from the kernel on first use."""

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
            ready = [commands] if commands.has_line() else \
                select.select([self.listener, commands.fd], [], [], left)[0]
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
            self.meter = SandboxMeter(conn)
        except (OSError, ValueError, KeyError) as e:
            self.meter = None       # the speed checks then refuse: uncounted work looks free
            print(f"tester: cannot read the kernel's CPU time: {e}", file=sys.stderr)
        kernel = Kernel(conn)
        probes._CONNECTION = kernel
        self.ns.student_names = frozenset(cmd.get("names", []))
        for name in self.ns.student_names:
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
    """Lines from a file descriptor, unbuffered, so that `select` says whether one waits."""

    def __init__(self, fd: int):
        self.fd, self.buf = fd, b""

    def has_line(self) -> bool:
        return b"\n" in self.buf

    def fill(self) -> None:
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
    """The job process's handle on a tester."""

    def __init__(self, socket_path: str, cwd: str, env: dict | None = None):
        import subprocess
        self.socket_path = socket_path
        self.proc = subprocess.Popen([sys.executable, "-m", "autograder.tester", socket_path],
                                     cwd=cwd, env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE)     # stderr: the job's log
        self.replies = Commands(self.proc.stdout.fileno())
        self.pending, self.seq = None, 0

    def begin(self, cmd: dict) -> None:
        self.seq += 1
        cmd = {**cmd, "seq": self.seq}
        self._write(cmd)
        self.pending = cmd

    def end(self, wait: float) -> dict:
        """The answer to the last command, waiting `wait` s; a test whose kernel never
        connected is told to abort."""
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
        with contextlib.suppress(OSError):          # a dead tester: end() says so
            self.proc.stdin.write((json.dumps(cmd) + "\n").encode())
            self.proc.stdin.flush()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._write({"op": "quit"})
            self.proc.stdin.close()
        try:
            self.proc.wait(5)
        except Exception:        # noqa: BLE001
            self.proc.kill()
            self.proc.wait(5)


def _time_the_kernel_too(tester: Tester) -> None:
    """time_ratio's CPU clock: the tester's plus the kernel's sandbox's (sandbox_cpu.py)."""
    from autograder import timing as checks_timing
    from minillm.bench import timing
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
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)    # stray C-level writes must not reach it
    tester, commands = Tester(argv[0]), Commands(0)
    while line := commands.readline():
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
