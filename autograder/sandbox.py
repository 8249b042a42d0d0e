"""Run the Jupyter kernel that executes a student notebook inside a bubblewrap (bwrap) sandbox.

The trusted executor (nbclient, in the grader's process) stays outside; only the kernel, and so
every line of student code and every process it starts, runs inside. The two talk over ZeroMQ's
`ipc` transport: Unix sockets in `SandboxSpec.runtime_dir`, a directory bound into the sandbox,
because the sandbox has a network namespace of its own (loopback only, nothing shared with the
host) and so cannot reach the grader over tcp.

    spec = SandboxSpec(workdir=submission_dir, runtime_dir=tmp / "rt",
                       ro_paths=default_ro_paths(), env=default_env(Path("/tmp/home")))
    km = SandboxKernelManager(kernel_name="python3", sandbox=spec)
    NotebookClient(nb, km=km, timeout=60, interrupt_on_timeout=True).execute()
    # or NotebookClient(nb, kernel_manager_class=SandboxKernelManager.with_sandbox(spec), ...)

What the sandbox guarantees (bwrap_argv builds it):

* file system: a fresh root holding only read-only binds of `SandboxSpec.ro_paths` (system
  directories, the Python install, the virtualenv, the course's package directories: see
  default_ro_paths), read-write binds of `workdir`, `runtime_dir` and `rw_paths` (each at its
  own path; the grader's job puts the kernel's copy of the compile cache there), a private /proc, a minimal /dev and a private tmpfs on /tmp. Nothing else of the host exists
  inside: not the repository's other directories (labs/, build/, nbgrader_config.py, the
  gradebook), not /root or /home, not other students' directories. Writes outside workdir,
  runtime_dir, rw_paths and the private /tmp fail (read-only or no such directory); what is written to
  /tmp is gone when the sandbox ends. The sandbox's root (bwrap's tmpfs that holds the mount
  points, e.g. the directory standing for the repository) is read-only too. /etc/shadow and
  /etc/gshadow are masked;
* environment: exactly `SandboxSpec.env` (SandboxKernelManager adds JPY_PARENT_PID=1). The
  environment is cleared (--clearenv), and bwrap itself is started with that environment too:
  bwrap's init (PID 1 in the sandbox) keeps the environment bwrap was started with in
  /proc/1/environ, readable by the kernel, whatever --clearenv does;
* namespaces: new user, PID, network, IPC, UTS (hostname "sandbox") and cgroup namespaces. The
  kernel sees only the sandbox's processes (the grader's pids do not exist in its /proc), has
  no network interface but loopback, and (bwrap >= 0.8) cannot create further user
  namespaces; all capabilities are dropped; it runs in a session of its own (no TIOCSTI into the grader's tty);
* lifetime: when the kernel process exits (shutdown, os._exit, a crash), bwrap's init, PID 1
  of the sandbox's PID namespace, exits with it, and the Linux kernel then kills every process
  left in the namespace: daemons, double forks, setsid'd children, processes ignoring SIGTERM
  or SIGHUP. Killing the outer bwrap process (what jupyter_client's kill does) kills the
  sandbox the same way (--die-with-parent). SandboxKernelManager also kills whatever it still
  finds of the sandbox's process tree after a shutdown.

What it does not guarantee:

* no resource limits: memory, CPU time, processes, disk space in workdir and in the tmpfs /tmp
  (which is memory) are bounded only by what the caller sets around it (rlimits inherited by
  bwrap, the CPUs it is pinned to, cgroups). The sandbox only makes the kernel's processes easy
  to kill, and keeps them on the CPUs they started on (below);
* the sandbox's user is the grader's user (mapped to the same uid), so the read-only binds are
  readable to the extent that user can read them: keep secrets out of ro_paths, and run the
  grader as an unprivileged user;
* system calls: a seccomp filter (autograder/syscall_filter.py; x86_64 and aarch64 only)
  refuses only sched_setaffinity (so a kernel stays on the CPUs `grade --jobs N` pinned it to:
  autograder/cores.py) and calls through another ABI; the rest of the host kernel's
  system-call surface is reachable (a kernel exploit escapes any namespace sandbox). When torch
  loads, a CPU probe pins the process to each CPU in turn; refused, it leaves torch on one
  thread, so the graded kernel's setup (autograder/execute.py) sets torch's thread count again
  (`cores.restore_torch_threads`), and processes the kernel starts set their own (lab 05's
  bench: `--threads 1`);
* no GPU: /dev holds only null, zero, full, random, urandom, tty, pts and shm; CUDA device
  nodes (/dev/nvidia*) and /sys are not bound;
* --die-with-parent ties the sandbox to the *thread* that started bwrap (PR_SET_PDEATHSIG): start
  kernels from a thread that outlives them (nbclient's own loop threads do).

Interrupts: jupyter_client interrupts a kernel with SIGINT to the process group of the process
it started, here the outer bwrap, which neither forwards nor survives it (the sandbox dies, and
the kernel with it). SandboxKernelManager signals the kernel's process inside instead.

This module imports only the standard library, psutil, traitlets and jupyter_client (not torch;
autograder/__init__.py loads the test-cell helpers, and torch with them, only when one is used).
"""
from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
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

PACKAGES = ("minillm", "kernels", "autograder")   # the course's packages the kernel imports
SYSTEM_DIRS = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
MASKED_FILES = ("/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-")
# Copied from the grader's environment into the sandbox when set (threading, triton's CPU mode).
PASSTHROUGH_ENV = ("TRITON_INTERPRET", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                   "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
                   "TORCHINDUCTOR_COMPILE_THREADS", "TZ")
MAX_IPC_PATH = 100            # sockaddr_un.sun_path is 108 bytes; jupyter appends "-<port>"


# --- availability -----------------------------------------------------------------------------
def bwrap_path() -> str | None:
    """The bwrap executable, or None when bubblewrap is not installed. AUTOGRADER_BWRAP names
    another one (the tests set it to a missing path to see `grade` refuse to run)."""
    override = os.environ.get("AUTOGRADER_BWRAP")
    if override is not None:
        return override if os.access(override, os.X_OK) else None
    return shutil.which("bwrap") or next(
        (p for p in ("/usr/bin/bwrap", "/usr/local/bin/bwrap") if os.access(p, os.X_OK)), None)


def _symlink_or_bind(path: str) -> list[str]:
    p = Path(path)
    if p.is_symlink():
        return ["--symlink", os.readlink(p), str(p)]
    if p.is_dir():
        return ["--ro-bind", str(p), str(p)]
    return []


@functools.lru_cache(maxsize=1)
def sandbox_unavailable_reason() -> str | None:
    """None when bwrap can build the sandbox here (probed once: `bwrap <the same namespaces>
    true`), else one line saying why not."""
    exe = bwrap_path()
    if exe is None:
        return "bubblewrap (bwrap) is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
    argv = [exe, *_namespace_args()]
    for d in ("/usr", "/bin", "/lib", "/lib64"):
        argv += _symlink_or_bind(d)
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
    hint = ""
    if any(w in err.lower() for w in ("namespace", "uid map", "permission", "operation not")):
        hint = (" (user namespaces refused: check sysctl kernel.unprivileged_userns_clone, "
                "kernel.apparmor_restrict_unprivileged_userns, or the container's seccomp "
                "profile)")
    return f"bwrap cannot create a sandbox here: {err}{hint}"


# --- the sandbox's contents ---------------------------------------------------------------------
@dataclass
class SandboxSpec:
    """What the sandbox contains. Paths are bound at the same path inside as outside."""
    workdir: Path                 # read-write; the kernel's working directory
    runtime_dir: Path             # read-write; the connection file and the ipc sockets
    ro_paths: list[Path] = field(default_factory=list)   # extra read-only binds
    env: dict[str, str] = field(default_factory=dict)    # the whole environment inside
    rw_paths: list[Path] = field(default_factory=list)   # extra read-write binds

    def __post_init__(self):
        # Absolute and without symlinks: jupyter_client passes the connection file's realpath.
        self.workdir = Path(self.workdir).resolve()
        self.runtime_dir = Path(self.runtime_dir).resolve()
        self.ro_paths = [Path(os.path.abspath(p)) for p in self.ro_paths]
        self.rw_paths = [Path(p).resolve() for p in self.rw_paths]
        self.env = {str(k): str(v) for k, v in self.env.items()}

    @classmethod
    def default(cls, workdir: Path, runtime_dir: Path,
                home: Path = Path("/tmp/home")) -> SandboxSpec:
        """A spec with default_ro_paths() and default_env(home) (home on the private /tmp)."""
        return cls(workdir=workdir, runtime_dir=runtime_dir, ro_paths=default_ro_paths(),
                   env=default_env(home))


def _package_dirs() -> list[Path]:
    dirs = []
    for name in PACKAGES:
        spec = importlib.util.find_spec(name)       # locates, does not import
        if spec is None or not spec.submodule_search_locations:
            continue
        dirs += [Path(p).resolve() for p in spec.submodule_search_locations]
    return dirs


def default_ro_paths() -> list[Path]:
    """Read-only binds a kernel needs to import the course and its dependencies: the system
    directories that exist (merged-/usr links such as /bin -> usr/bin become the same links
    inside), the Python installation (sys.base_prefix), the virtualenv (sys.prefix), the course's
    package directories, and the corpus directory minillm.data reads (<repo>/data). Never the
    repository root or its other directories (labs/, build/, ...)."""
    paths = [Path(d) for d in SYSTEM_DIRS if os.path.lexists(d)]
    paths += [Path(sys.base_prefix).resolve(), Path(sys.prefix).absolute()]
    pkgs = _package_dirs()
    paths += pkgs
    data = package_parent() / "data"
    if data.is_dir() and any(p.parent == data.parent for p in pkgs):
        paths.append(data)
    return list(dict.fromkeys(paths))


def default_env(home: Path) -> dict[str, str]:
    """The whole environment of the kernel: PATH (the virtualenv's bin first), HOME and the
    Jupyter/IPython/matplotlib/cache directories under it, MPLBACKEND = Jupyter's inline backend
    (figures become image/png outputs), PYTHONPATH = the directory holding the course's packages
    (inside the sandbox it holds only the bound package directories), PYTHONUNBUFFERED, LANG,
    CORES_ENV (the physical cores of this process's CPUs, counted here: the sandbox has no /sys,
    and cores.restore_torch_threads needs it), and the PASSTHROUGH_ENV variables the grader has
    set. Nothing else of the grader's environment."""
    from .cores import CORES_ENV, physical_cores
    home = Path(home)
    venv_bin = str(Path(sys.prefix).absolute() / "bin")
    env = {
        CORES_ENV: str(len(physical_cores())),
        "PATH": os.pathsep.join(dict.fromkeys([venv_bin, "/usr/bin", "/bin"])),
        "HOME": str(home),
        "PYTHONPATH": str(package_parent()),
        "PYTHONUNBUFFERED": "1",
        "LANG": "C.UTF-8",
        "MPLCONFIGDIR": str(home / ".config" / "matplotlib"),
        "MPLBACKEND": KERNEL_MPLBACKEND,
        "IPYTHONDIR": str(home / ".ipython"),
        "JUPYTER_CONFIG_DIR": str(home / ".jupyter"),
        "JUPYTER_DATA_DIR": str(home / ".local" / "share" / "jupyter"),
        "JUPYTER_RUNTIME_DIR": str(home / ".local" / "share" / "jupyter" / "runtime"),
        "XDG_CACHE_HOME": str(home / ".cache"),
    }
    for name in PASSTHROUGH_ENV:
        if name in os.environ:
            env[name] = os.environ[name]
    return env


# --- the bwrap command --------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def _namespace_args() -> tuple[str, ...]:
    args = ["--unshare-all",     # user(-try), ipc, pid, net, uts, cgroup(-try)
            "--unshare-user",    # ... and the user namespace is required, not "try"
            "--cap-drop", "ALL",
            "--die-with-parent",
            "--new-session",
            "--hostname", "sandbox"]
    exe = bwrap_path()
    try:                          # bwrap >= 0.8: no nested user namespaces inside the sandbox
        usage = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=10,
                               env={"PATH": "/usr/bin:/bin"}).stdout if exe else ""
    except (OSError, subprocess.SubprocessError):
        usage = ""
    if "--disable-userns" in usage:
        args.insert(2, "--disable-userns")
    return tuple(args)


def _under(path: Path, parent: Path) -> bool:
    return path == parent or parent in path.parents


def bwrap_argv(spec: SandboxSpec, cmd: list[str], seccomp_fd: int | None = None) -> list[str]:
    """The command that runs `cmd` inside the sandbox `spec` describes (see the module doc);
    `seccomp_fd`: a descriptor holding syscall_filter.program(), which bwrap installs (the
    caller passes it to bwrap, e.g. with pass_fds). SandboxKernelManager gives one wherever
    syscall_filter has the machine's numbers."""
    exe = bwrap_path()
    if exe is None:
        raise RuntimeError(sandbox_unavailable_reason() or "bwrap is not installed")
    argv = [exe, *_namespace_args(), "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    bound: list[Path] = []
    for p in spec.ro_paths:
        if any(_under(p, b) for b in bound):
            continue                       # already inside an earlier bind
        if p.is_symlink() and p.parent == Path("/"):
            argv += ["--symlink", os.readlink(p), str(p)]     # /bin -> usr/bin, like the host
        elif p.exists():
            argv += ["--ro-bind", str(p), str(p)]
            bound.append(p)
    for f in MASKED_FILES:
        if any(_under(Path(f), b) for b in bound) and os.path.isfile(f):
            argv += ["--ro-bind", "/dev/null", f]
    # after the tmpfs and the read-only binds, so they are visible and writable wherever they are
    for p in (spec.workdir, spec.runtime_dir, *spec.rw_paths):
        argv += ["--bind", str(p), str(p)]
    home = spec.env.get("HOME")
    if home and os.path.isabs(home) and not any(
            _under(Path(home), b) for b in [*bound, spec.workdir, spec.runtime_dir,
                                            *spec.rw_paths]):
        argv += ["--dir", home]            # e.g. /tmp/home on the private tmpfs
    argv += ["--remount-ro", "/"]          # the root (a tmpfs holding the mount points)
    argv += ["--chdir", str(spec.workdir), "--clearenv"]
    for k, v in spec.env.items():
        argv += ["--setenv", k, v]
    return argv + ["--", *cmd]


# --- the kernel manager -------------------------------------------------------------------------
def _sandbox_tree(pid: int | None) -> list[psutil.Process]:
    if not pid:
        return []
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


class SandboxKernelManager(AsyncKernelManager):
    """An AsyncKernelManager whose kernel runs inside bwrap (see the module doc).

    Set `sandbox` (a SandboxSpec) before the kernel starts, as a constructor argument or an
    attribute, or use `SandboxKernelManager.with_sandbox(spec)` as nbclient's
    kernel_manager_class. Without a spec, the kernel gets SandboxSpec.default() with the
    working directory nbclient passes (`cwd`, from resources["metadata"]["path"]) as workdir and
    a temporary runtime directory.

    The connection uses the ipc transport (sockets `<runtime_dir>/k<id>-<port>`); the kernel
    command (the kernel spec's, e.g. `python -m ipykernel_launcher -f <connection file>`) runs as
    `bwrap ... -- <command>`. Signals (interrupt_kernel, signal_kernel) go to the kernel's
    process group inside the sandbox, not to bwrap: bwrap does not forward them, and SIGINT
    would kill bwrap and with it the kernel.
    """

    sandbox = Instance(SandboxSpec, allow_none=True,
                       help="the sandbox the kernel runs in (SandboxSpec)")
    default_sandbox: SandboxSpec | None = None      # set by with_sandbox()

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.transport = "ipc"
        self.cache_ports = False
        self._active_spec: SandboxSpec | None = None
        self._own_runtime_dir: Path | None = None
        self._filter_fd: int | None = None

    @classmethod
    def with_sandbox(cls, spec: SandboxSpec) -> type[SandboxKernelManager]:
        """A subclass whose kernels run in `spec` (for nbclient's `kernel_manager_class`)."""
        return type(cls.__name__, (cls,), {"default_sandbox": spec})

    # start -------------------------------------------------------------------------------------
    def _resolve_spec(self, cwd) -> SandboxSpec:
        spec = self.sandbox or self.default_sandbox
        if spec is not None:
            return spec
        if not cwd:
            raise RuntimeError("SandboxKernelManager: no sandbox spec and no cwd to use as the "
                               "sandbox's workdir")
        if self._own_runtime_dir is None:         # kept across restarts
            self._own_runtime_dir = Path(tempfile.mkdtemp(prefix="sbx-"))
        return SandboxSpec.default(Path(cwd), self._own_runtime_dir)

    async def _async_pre_start_kernel(self, **kw):
        reason = sandbox_unavailable_reason()
        if reason:
            raise RuntimeError(reason)
        spec = self._resolve_spec(kw.get("cwd"))
        # JPY_PARENT_PID=1: the kernel's parent is the sandbox's init (PID 1), which never
        # changes; it also stops ipykernel's "Ctrl-C will not work" banner on the grader's stdout.
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
        kw["cwd"] = str(spec.workdir)             # the host-side cwd of bwrap itself
        kw["env"] = dict(self._active_spec.env)   # bwrap's own environment (see module doc)
        self._close_filter()
        self._filter_fd = syscall_filter.filter_fd()      # read by bwrap --seccomp at start
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

    # the kernel process inside ----------------------------------------------------------------
    def _bwrap_pid(self) -> int | None:
        proc = getattr(self.provisioner, "process", None)
        return proc.pid if proc is not None and proc.poll() is None else None

    def kernel_process(self) -> psutil.Process | None:
        """The kernel's process inside the sandbox (as seen from the host), or None.

        The outer bwrap process forks bwrap's init (PID 1 of the sandbox), which forks the
        kernel command. Orphans started by the kernel are re-parented to that init too, so the
        kernel is the init's oldest child."""
        pid = self._bwrap_pid()
        if pid is None:
            return None
        try:
            outer = psutil.Process(pid)
            kids = []
            for init in outer.children():
                kids += init.children()
            return min(kids, key=lambda p: (p.create_time(), p.pid)) if kids else None
        except psutil.Error:
            return None

    async def _async_signal_kernel(self, signum: int) -> None:
        """Send `signum` to the kernel's process group inside the sandbox (jupyter's own
        managers signal the kernel's process group too)."""
        if not self.has_kernel:
            raise RuntimeError("Cannot signal kernel. No kernel is running!")
        proc = self.kernel_process()
        if proc is None:
            if signum in (signal.SIGKILL, signal.SIGTERM):
                await self.provisioner.send_signal(signum)   # ends bwrap and the sandbox
            else:
                self.log.warning("sandboxed kernel process not found; signal %s not sent",
                                 signum)
            return
        # The kernel shares its process group with bwrap's init (which called setsid for
        # --new-session). Signal the group's members but not the init, as jupyter_client's
        # killpg does for an unsandboxed kernel: the kernel and the children it did not detach.
        try:
            pgid = os.getpgid(proc.pid)
            group = [p for p in [proc, *proc.children(recursive=True)]
                     if os.getpgid(p.pid) == pgid]
        except (OSError, psutil.Error):
            group = [proc]
        for p in group:
            try:
                p.send_signal(signum)
            except psutil.Error:
                pass

    signal_kernel = _async_signal_kernel

    # stop --------------------------------------------------------------------------------------
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

    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        await super()._async_cleanup_resources(restart=restart)
        if not restart and self._own_runtime_dir is not None:
            shutil.rmtree(self._own_runtime_dir, ignore_errors=True)
            self._own_runtime_dir = None

    cleanup_resources = _async_cleanup_resources


def _kill_all(procs: list[psutil.Process], wait: float = 2.0) -> None:
    """SIGKILL what is left of a sandbox's process tree. Normally nothing is: the PID namespace
    dies with its init, whose zombie (re-parented to the host's init) is all that remains."""
    alive = []
    for p in procs:
        try:
            if _running(p):
                p.kill()
                alive.append(p)
        except psutil.Error:
            pass
    deadline = time.monotonic() + wait
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if _running(p)]


def _running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
