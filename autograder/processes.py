"""Child processes under limits (autograder/README.md, "The sandbox and the limits"): their own
session, a wall clock, RLIMIT_FSIZE, no core dumps, CPUs, and RLIMIT_DATA, not RLIMIT_AS, which
counts the PROT_NONE reservations of CUDA, glibc arenas and stacks and breaks `import torch`.
"""
from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

FSIZE_LIMIT = 1 << 30
# a kernel's figures become image/png outputs, as the student saw them. Set, not defaulted: an
# instructor's MPLBACKEND (Agg drops every figure, a GUI one opens windows) never reaches a kernel.
KERNEL_MPLBACKEND = "module://matplotlib_inline.backend_inline"


def package_parent() -> Path:
    """The directory that holds the `autograder` package."""
    return Path(__file__).resolve().parent.parent


def packages_sha256(packages) -> str:
    """A SHA-256 of the paths and bytes of the packages' .py files."""
    import hashlib
    digest = hashlib.sha256()
    for pkg in packages:
        folder = package_parent() / pkg
        digest.update(pkg.encode() + b"\0")
        for p in sorted(x for x in folder.rglob("*.py") if x.is_file()):
            digest.update(str(p.relative_to(folder)).encode() + b"\0" + p.read_bytes())
    return digest.hexdigest()


def environment_fingerprint(packages) -> dict:
    """What a result kept between batches depends on: Python, torch, the course's sources."""
    import torch
    return {"python": sys.version, "torch": torch.__version__,
            "packages_sha256": packages_sha256(packages)}


def subprocess_env(extra: dict | None = None) -> dict:
    """Environment for child processes: the venv's bin first on PATH (nbgrader runs `alembic`),
    the course on PYTHONPATH, MPLBACKEND for their kernels, then `extra`."""
    env = dict(os.environ)
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([bindir] + [p for p in env.get("PATH", "").split(os.pathsep)
                                              if p and p != bindir])
    pp = [str(package_parent())] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(pp))
    env.setdefault("PYTHONUNBUFFERED", "1")
    env["MPLBACKEND"] = KERNEL_MPLBACKEND
    env.pop("JUPYTER_PLATFORM_DIRS", None)
    if extra:
        env.update(extra)
    return env


def limits_preexec(mem_bytes: int | None, cpus: list[int] | None = None):
    def apply():
        import resource
        if cpus:
            os.sched_setaffinity(0, cpus)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_FSIZE, (FSIZE_LIMIT, FSIZE_LIMIT))
        if mem_bytes:
            resource.setrlimit(resource.RLIMIT_DATA, (mem_bytes, mem_bytes))
    return apply


def kill_tree(pid: int) -> None:
    """SIGKILL a process, its group and its descendants (the kernel has a session of its own)."""
    import psutil  # comes with ipykernel
    try:
        parent = psutil.Process(pid)
        procs = parent.children(recursive=True) + [parent]
    except psutil.NoSuchProcess:
        procs = []
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


@dataclass
class RunResult:
    cmd: list[str]
    returncode: int | None          # None when killed on timeout
    seconds: float
    timed_out: bool
    log: Path | None
    output: str = ""                # the captured output (also in `log`)


def run_logged(cmd: list[str], *, cwd: Path, log: Path | None = None, timeout: float | None = None,
               mem_bytes: int | None = None, env: dict | None = None,
               cpus: list[int] | None = None) -> RunResult:
    """Run `cmd` in its own session with limits, on `cpus` if given; output to `log`."""
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        fh = open(log, "w+b")
    else:
        fh = tempfile.TemporaryFile()
    t0 = time.monotonic()
    timed_out = False
    with fh:
        proc = subprocess.Popen(cmd, cwd=str(cwd), stdout=fh, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env or subprocess_env(),
                                start_new_session=True,
                                preexec_fn=limits_preexec(mem_bytes, cpus))
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            kill_tree(proc.pid)
            proc.wait()
        except BaseException:
            kill_tree(proc.pid)
            proc.wait()
            raise
        seconds = time.monotonic() - t0
        fh.seek(0)
        output = fh.read().decode("utf-8", "replace")
    return RunResult(cmd=cmd, returncode=None if timed_out else proc.returncode,
                     seconds=seconds, timed_out=timed_out, log=log, output=output)


_PROBE = ("import torch, autograder\n"
          "x = torch.randn(256, 256) @ torch.randn(256, 256)\n"
          "if torch.cuda.is_available():\n"
          "    torch.ones(1, device='cuda'); torch.cuda.synchronize()\n"
          "print('probe ok')\n")


@functools.lru_cache(maxsize=None)
def memory_limit_works(mem_bytes: int) -> bool:
    """Does `import torch` (and CUDA init, if present) work under RLIMIT_DATA = mem_bytes?"""
    r = run_logged([sys.executable, "-c", _PROBE], cwd=Path(tempfile.gettempdir()),
                   timeout=300, mem_bytes=mem_bytes)
    return r.returncode == 0 and "probe ok" in r.output


def default_mem_bytes() -> int:
    """Half the machine's memory, between 2 and 8 GiB."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        total = 8 << 30
    return int(min(8 << 30, max(2 << 30, total // 2)))
