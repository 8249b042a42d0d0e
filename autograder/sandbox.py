"""Run a notebook's kernel in a bubblewrap sandbox (autograder/README.md), talking over ZeroMQ's
`ipc` transport (the sandbox has no network). No resource limits here. --die-with-parent ties it
to the *thread* that started bwrap: start kernels from a thread that outlives them.
"""
from __future__ import annotations

import contextlib
import functools
import glob
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import psutil
from jupyter_client.manager import AsyncKernelManager
from traitlets import Instance

from . import syscall_filter
from .processes import KERNEL_MPLBACKEND, package_parent

__all__ = ["SandboxSpec", "SandboxKernelManager", "bwrap_path", "sandbox_unavailable_reason",
           "default_ro_paths", "default_env", "bwrap_argv", "PACKAGES"]

PACKAGES = ("minillm", "kernels", "autograder")
SYSTEM_DIRS = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
MASKED_FILES = ("/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-")
# copied from the grader's environment when set (threading, triton's CPU mode)
PASSTHROUGH_ENV = ("TRITON_INTERPRET", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                   "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
                   "TORCHINDUCTOR_COMPILE_THREADS", "TZ")
MAX_IPC_PATH = 100            # sockaddr_un.sun_path is 108 bytes; jupyter appends "-<port>"


def bwrap_path() -> str | None:
    """The bwrap executable, or None. AUTOGRADER_BWRAP names another (the tests: a missing one)."""
    override = os.environ.get("AUTOGRADER_BWRAP")
    if override is not None:
        return override if os.access(override, os.X_OK) else None
    return shutil.which("bwrap") or next(
        (p for p in ("/usr/bin/bwrap", "/usr/local/bin/bwrap") if os.access(p, os.X_OK)), None)


@functools.lru_cache(maxsize=1)
def sandbox_unavailable_reason() -> str | None:
    """None when bwrap can build the sandbox here (probed once), else one line saying why not."""
    if (exe := bwrap_path()) is None:
        return "bubblewrap (bwrap) is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
    argv = [exe, *_namespace_args()]
    for d in map(Path, ("/usr", "/bin", "/lib", "/lib64")):
        if d.is_symlink():
            argv += ["--symlink", os.readlink(d), str(d)]
        elif d.is_dir():
            argv += ["--ro-bind", str(d), str(d)]
    fd = syscall_filter.filter_fd()
    argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--remount-ro", "/"]
    argv += ["--seccomp", str(fd)] if fd is not None else []
    try:
        r = subprocess.run(argv + ["--", "true"], stdin=subprocess.DEVNULL, capture_output=True,
                           text=True, timeout=20, env={"PATH": "/usr/bin:/bin"},
                           pass_fds=() if fd is None else (fd,))
    except (OSError, subprocess.SubprocessError) as e:
        return f"bwrap could not be run: {e}"
    finally:
        if fd is not None:
            os.close(fd)
    if r.returncode == 0:
        return None
    err = (r.stderr.strip().splitlines() or [f"exit status {r.returncode}"])[-1]
    hint = (" (user namespaces refused: check sysctl kernel.unprivileged_userns_clone, "
            "kernel.apparmor_restrict_unprivileged_userns, or the container's seccomp profile)"
            if any(w in err.lower() for w in ("namespace", "uid map", "permission",
                                               "operation not")) else "")
    return f"bwrap cannot create a sandbox here: {err}{hint}"


@dataclass
class SandboxSpec:
    """What the sandbox contains. Paths are bound at the same path inside as outside."""
    workdir: Path                 # read-write; the kernel's working directory
    runtime_dir: Path             # read-write; the connection file and the ipc sockets
    ro_paths: list[Path] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)    # the whole environment inside
    rw_paths: list[Path] = field(default_factory=list)

    def __post_init__(self):
        # Absolute and without symlinks: jupyter_client passes the connection file's realpath.
        self.workdir = Path(self.workdir).resolve()
        self.runtime_dir = Path(self.runtime_dir).resolve()
        self.ro_paths = [Path(os.path.abspath(p)) for p in self.ro_paths]
        self.rw_paths = [Path(p).resolve() for p in self.rw_paths]
        self.env = {str(k): str(v) for k, v in self.env.items()}


def default_ro_paths() -> list[Path]:
    """System directories, Python, the virtualenv, the course's packages and <repo>/data."""
    from .withheld import package_dir
    pkgs = [package_dir(name) for name in PACKAGES]
    paths = [Path(d) for d in SYSTEM_DIRS if os.path.lexists(d)]
    paths += [Path(sys.base_prefix).resolve(), Path(sys.prefix).absolute(), *pkgs]
    data = package_parent() / "data"
    if data.is_dir() and any(p.parent == data.parent for p in pkgs):
        paths.append(data)
    return list(dict.fromkeys(paths))


def default_env(home: Path) -> dict[str, str]:
    """The kernel's whole environment. CORES_ENV is counted here: the sandbox has no /sys."""
    from .cores import CORES_ENV, physical_cores
    home = Path(home)
    venv_bin = str(Path(sys.prefix).absolute() / "bin")
    jupyter = home / ".local" / "share" / "jupyter"
    env = {CORES_ENV: str(len(physical_cores())),
           "PATH": os.pathsep.join(dict.fromkeys([venv_bin, "/usr/bin", "/bin"])),
           "HOME": str(home), "PYTHONPATH": str(package_parent()), "PYTHONUNBUFFERED": "1",
           "LANG": "C.UTF-8", "MPLCONFIGDIR": str(home / ".config" / "matplotlib"),
           "MPLBACKEND": KERNEL_MPLBACKEND, "IPYTHONDIR": str(home / ".ipython"),
           "JUPYTER_CONFIG_DIR": str(home / ".jupyter"), "JUPYTER_DATA_DIR": str(jupyter),
           "JUPYTER_RUNTIME_DIR": str(jupyter / "runtime"),
           "XDG_CACHE_HOME": str(home / ".cache")}
    return env | {k: os.environ[k] for k in PASSTHROUGH_ENV if k in os.environ}


@functools.lru_cache(maxsize=1)
def _namespace_args() -> tuple[str, ...]:
    # every namespace, the user one required (not "try"); no TIOCSTI into the grader's tty
    args = ["--unshare-all", "--unshare-user", "--cap-drop", "ALL", "--die-with-parent",
            "--new-session", "--hostname", "sandbox"]
    exe = bwrap_path()
    try:                          # bwrap >= 0.8: no nested user namespaces inside the sandbox
        usage = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=10,
                               env={"PATH": "/usr/bin:/bin"}).stdout if exe else ""
    except (OSError, subprocess.SubprocessError):
        usage = ""
    if "--disable-userns" in usage:
        args.insert(2, "--disable-userns")
    return tuple(args)


def gpu_devices() -> list[str]:
    """NVIDIA's device nodes where this machine has them (none elsewhere): bound into the
    sandbox, so that a kernel graded on a GPU machine runs the labs' kernels on the GPU."""
    nodes = sorted(glob.glob("/dev/nvidia[0-9]*"))
    nodes += [p for p in ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
              if os.path.exists(p)]
    return nodes + (["/dev/nvidia-caps"] if os.path.isdir("/dev/nvidia-caps") else [])


def _under(path: Path, parent: Path) -> bool:
    return path == parent or parent in path.parents


def bwrap_argv(spec: SandboxSpec, cmd: list[str], seccomp_fd: int | None = None) -> list[str]:
    """The command that runs `cmd` inside `spec`; `seccomp_fd` holds syscall_filter.program()."""
    if (exe := bwrap_path()) is None:
        raise RuntimeError(sandbox_unavailable_reason() or "bwrap is not installed")
    argv = [exe, *_namespace_args(), "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    for node in gpu_devices():
        argv += ["--dev-bind", node, node]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    bound: list[Path] = []
    for p in spec.ro_paths:
        if any(_under(p, b) for b in bound):
            continue
        if p.is_symlink() and p.parent == Path("/"):
            argv += ["--symlink", os.readlink(p), str(p)]     # /bin -> usr/bin, like the host
        elif p.exists():
            argv += ["--ro-bind", str(p), str(p)]
            bound.append(p)
    for f in MASKED_FILES:
        if any(_under(Path(f), b) for b in bound) and os.path.isfile(f):
            argv += ["--ro-bind", "/dev/null", f]
    rw = [spec.workdir, spec.runtime_dir, *spec.rw_paths]
    for p in rw:                           # after the read-only binds: writable wherever they are
        argv += ["--bind", str(p), str(p)]
    home = spec.env.get("HOME")
    if home and os.path.isabs(home) and not any(_under(Path(home), b) for b in bound + rw):
        argv += ["--dir", home]            # e.g. /tmp/home on the private tmpfs
    # the root (a tmpfs holding the mount points) read-only too
    argv += ["--remount-ro", "/", "--chdir", str(spec.workdir), "--clearenv"]
    argv += [a for k, v in spec.env.items() for a in ("--setenv", k, v)]
    return argv + ["--", *cmd]


def _sandbox_tree(pid: int | None) -> list[psutil.Process]:
    with contextlib.suppress(psutil.Error):
        return psutil.Process(pid).children(recursive=True) if pid else []
    return []


class SandboxKernelManager(AsyncKernelManager):
    """An AsyncKernelManager whose kernel runs inside bwrap, in `sandbox`. Signals go to the
    kernel inside, not to bwrap: bwrap does not forward them, and SIGINT would kill it."""

    sandbox = Instance(SandboxSpec, allow_none=True, help="the sandbox the kernel runs in")
    _active_spec: SandboxSpec | None = None     # `sandbox` with the kernel's own variables
    _filter_fd: int | None = None               # syscall_filter's program, until bwrap reads it

    async def _async_pre_start_kernel(self, **kw):
        if reason := sandbox_unavailable_reason():
            raise RuntimeError(reason)
        if (spec := self.sandbox) is None:
            raise RuntimeError("SandboxKernelManager: no sandbox (a SandboxSpec) to run in")
        # JPY_PARENT_PID=1 (the sandbox's init): also stops ipykernel's "Ctrl-C" banner
        self._active_spec = replace(spec, env={"JPY_PARENT_PID": "1", **spec.env})
        spec.runtime_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.kernel_id = self.kernel_id or kw.pop("kernel_id", None) or os.urandom(8).hex()
        self.transport = "ipc"
        self.cache_ports = False
        if self._connection_file_written and \
                Path(self.connection_file).parent != spec.runtime_dir:
            self.cleanup_connection_file()        # the spec changed since the last start
        if not self._connection_file_written:     # else: a restart keeps ports and file
            tag = self.kernel_id.replace("-", "")[:12]
            self.ip = str(spec.runtime_dir / f"k{tag}")
            self.connection_file = str(spec.runtime_dir / f"kernel-{self.kernel_id}.json")
        if len(self.ip) + 7 > MAX_IPC_PATH:
            raise RuntimeError(f"ipc socket path too long for a Unix socket: {self.ip}-<port>; "
                               f"use a shorter runtime_dir")
        kw["cwd"] = str(spec.workdir)
        # bwrap's own environment too: its init keeps it in /proc/1/environ, kernel-readable
        kw["env"] = dict(self._active_spec.env)
        self._close_filter()
        self._filter_fd = syscall_filter.filter_fd()
        if self._filter_fd is not None:
            kw["pass_fds"] = (self._filter_fd,)
        try:
            return await super()._async_pre_start_kernel(**kw)
        except BaseException:
            self._close_filter()
            raise

    pre_start_kernel = _async_pre_start_kernel

    def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
        cmd = super().format_kernel_cmd(extra_arguments)
        assert self._active_spec is not None
        return bwrap_argv(self._active_spec, cmd, seccomp_fd=self._filter_fd)

    async def _async_launch_kernel(self, kernel_cmd: list[str], **kw) -> None:
        try:
            await super()._async_launch_kernel(kernel_cmd, **kw)
        finally:
            self._close_filter()                  # bwrap has its own copy (or failed)

    def _close_filter(self) -> None:
        if self._filter_fd is not None:
            os.close(self._filter_fd)
            self._filter_fd = None

    def _bwrap_pid(self) -> int | None:
        proc = getattr(self.provisioner, "process", None)
        return proc.pid if proc is not None and proc.poll() is None else None

    def kernel_process(self) -> psutil.Process | None:
        """The kernel inside the sandbox: the oldest child of bwrap's init (orphans come later)."""
        pid = self._bwrap_pid()
        with contextlib.suppress(psutil.Error):
            inits = psutil.Process(pid).children() if pid is not None else []
            kids = [kid for init in inits for kid in init.children()]
            return min(kids, key=lambda p: (p.create_time(), p.pid)) if kids else None
        return None

    async def _async_signal_kernel(self, signum: int) -> None:
        if not self.has_kernel:
            raise RuntimeError("Cannot signal kernel. No kernel is running!")
        if (proc := self.kernel_process()) is None:
            if signum in (signal.SIGKILL, signal.SIGTERM):
                await self.provisioner.send_signal(signum)   # ends bwrap and the sandbox
            else:
                self.log.warning("sandboxed kernel process not found; signal %s not sent", signum)
            return
        # the kernel's process group, less bwrap's init (its group leader, --new-session)
        try:
            pgid = os.getpgid(proc.pid)
            group = [p for p in [proc, *proc.children(recursive=True)]
                     if os.getpgid(p.pid) == pgid]
        except (OSError, psutil.Error):
            group = [proc]
        for p in group:
            with contextlib.suppress(psutil.Error):
                p.send_signal(signum)

    signal_kernel = _async_signal_kernel

    async def _async_kill_kernel(self, restart: bool = False) -> None:
        tree = _sandbox_tree(self._bwrap_pid())
        await super()._async_kill_kernel(restart=restart)
        _kill_all(tree)

    _kill_kernel = _async_kill_kernel

    async def _async_shutdown_kernel(self, now: bool = False, restart: bool = False) -> None:
        tree = _sandbox_tree(self._bwrap_pid())
        try:
            await super()._async_shutdown_kernel(now=now, restart=restart)
        finally:
            _kill_all(tree)

    shutdown_kernel = _async_shutdown_kernel


def _kill_all(procs: list[psutil.Process], wait: float = 2.0) -> None:
    """SIGKILL what is left of a sandbox's process tree (normally nothing)."""
    alive = []
    for p in procs:
        with contextlib.suppress(psutil.Error):
            if _running(p):
                p.kill()
                alive.append(p)
    deadline = time.monotonic() + wait
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if _running(p)]


def _running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
