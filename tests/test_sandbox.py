"""The bubblewrap sandbox the grader runs student kernels in (autograder/sandbox.py).

Each notebook below runs through nbclient with its kernel in the sandbox (SandboxKernelManager,
ipc transport). The probe notebook runs once per module; each test asserts one property on
what its cells printed, and each assertion would fail for a kernel started without the sandbox.
"""
from __future__ import annotations

import json
import os
import platform
import socket
import sys
import threading
import time
import uuid
from pathlib import Path

import nbformat
import psutil
import pytest
from jupyter_core.utils import run_sync
from nbclient import NotebookClient
from nbclient.exceptions import DeadKernelError
from nbformat.v4 import new_code_cell, new_notebook

from autograder.cores import torch_threads
from autograder.sandbox import (
    SandboxKernelManager,
    SandboxSpec,
    bwrap_argv,
    default_env,
    default_ro_paths,
    sandbox_unavailable_reason,
)

REPO = Path(__file__).resolve().parent.parent
_REASON = sandbox_unavailable_reason()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.xdist_group("sandbox"),
    pytest.mark.skipif(_REASON is not None, reason=f"no bubblewrap sandbox: {_REASON}"),
]

SECRET = "GRADER_SECRET"
SECRET_VALUE = "s3cr3t-" + uuid.uuid4().hex


def _spec(base: Path) -> SandboxSpec:
    work, runtime = base / "work", base / "rt"
    work.mkdir(parents=True, exist_ok=True)
    return SandboxSpec(work, runtime, default_ro_paths(), default_env(Path("/tmp/home")))


def _notebook(sources: list[str]) -> nbformat.NotebookNode:
    nb = new_notebook(cells=[new_code_cell(s) for s in sources])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    return nb


def _stdout(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.get("output_type") == "stream")


def _errors(cell) -> list[str]:
    return [o["ename"] for o in cell.outputs if o.get("output_type") == "error"]


def _marked(marker: str) -> list[psutil.Process]:
    """Live (non-zombie) host processes with `marker` in their command line."""
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        if marker in (p.info["cmdline"] or []) and p.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(p)
    return found


# --- the probe notebook ------------------------------------------------------------------------
PROBE = r'''
import json, os, socket, subprocess, sys
def probe(name, fn):
    try:
        value = fn()
    except BaseException as e:
        value = f"raised {type(e).__name__}"
    print(json.dumps({name: value}))
def write(path):
    with open(path, "w") as f:
        f.write("x")
    return "written"
def environs():
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                found[pid] = f.read().decode(errors="replace")
        except OSError as e:
            found[pid] = f"unreadable {type(e).__name__}"
    return found
def connect(port):
    with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
        return "connected"
def widen():
    os.sched_setaffinity(0, range(os.cpu_count()))
    return "widened"
def other_abi():
    """getpid through x86_64's x32 ABI (its number + 0x40000000): errno's name, or the pid."""
    import ctypes, errno, platform
    if platform.machine() != "x86_64":
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    r = libc.syscall(0x40000000 | 39)
    return errno.errorcode.get(ctypes.get_errno(), "?") if r == -1 else r
'''

DAEMONS = r'''
import os, signal, subprocess, sys
LOOP = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n" \
       "signal.signal(signal.SIGHUP, signal.SIG_IGN)\nwhile True: time.sleep(0.2)"
subprocess.Popen([sys.executable, "-c", LOOP, "{marker}-session"], start_new_session=True)
if os.fork() == 0:                      # double fork: the grandchild is re-parented to PID 1
    os.setsid()
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, "-c", LOOP, "{marker}-double"])
    os._exit(0)
os.wait()
'''


@pytest.fixture(scope="module")
def probe_run(tmp_path_factory):
    """Runs the probe notebook once; returns {probe name: value} plus what the host saw."""
    base = tmp_path_factory.mktemp("sbx")
    spec = _spec(base)
    (spec.workdir / "given.txt").write_text("hello from workdir")
    outside = base / "outside"
    outside.mkdir()
    (outside / "marker.txt").write_text("outside")
    host_tmp = Path("/tmp") / f"sbx-probe-{uuid.uuid4().hex}"
    marker = f"sbx-daemon-{uuid.uuid4().hex}"

    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    port = server.getsockname()[1]
    accepted = []
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            accepted.append(conn)
            conn.close()
    threading.Thread(target=serve, daemon=True).start()

    checks = {
        "given": f"lambda: open({str(spec.workdir / 'given.txt')!r}).read()",
        "imports": "lambda: __import__('torch') and __import__('minillm') and "
                   "__import__('autograder') and 'ok'",
        "labs": f"lambda: os.path.exists({str(REPO / 'labs')!r})",
        "build": f"lambda: os.path.exists({str(REPO / 'build')!r})",
        "nbgrader_config": f"lambda: os.path.exists({str(REPO / 'nbgrader_config.py')!r})",
        "repo_listing": f"lambda: sorted(os.listdir({str(REPO)!r}))",
        "marker": f"lambda: open({str(outside / 'marker.txt')!r}).read()",
        "connect": f"lambda: connect({port})",
        "proc_pids": "lambda: sorted(p for p in os.listdir('/proc') if p.isdigit())",
        "pid1_cmdline": "lambda: open('/proc/1/cmdline', 'rb').read().decode(errors='replace')",
        "secret_env": f"lambda: os.environ.get({SECRET!r})",
        "env_keys": "lambda: sorted(os.environ)",
        "environs": "environs",
        "write_repo": f"lambda: write({str(REPO / ('sbx-write-' + uuid.uuid4().hex))!r})",
        "write_pkg": f"lambda: write({str(REPO / 'minillm' / 'sbx-write.txt')!r})",
        "write_tmp": f"lambda: write({str(host_tmp)!r})",
        "write_work": f"lambda: write({str(spec.workdir / 'out.txt')!r})",
        "affinity": "lambda: sorted(os.sched_getaffinity(0))",
        "widen": "widen",
        "other_abi": "other_abi",
        "getpid": "os.getpid",
        "threads": "lambda: (__import__('autograder.cores').cores.restore_torch_threads(), "
                   "__import__('torch').get_num_threads())",
    }
    sources = [PROBE] + [f"probe({k!r}, {v})" for k, v in checks.items()]
    sources += [DAEMONS.replace("{marker}", marker), "import time; time.sleep(0.5)"]
    nb = _notebook(sources)

    def daemons() -> list[psutil.Process]:
        return _marked(f"{marker}-session") + _marked(f"{marker}-double")

    seen_during = {}

    def on_cell_executed(cell, cell_index, **_):
        if cell_index == len(sources) - 1:     # the kernel is still running: daemons visible?
            seen_during["daemons"] = [p.info["cmdline"][-1] for p in daemons()]

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(SECRET, SECRET_VALUE)
        class InSpec(SandboxKernelManager):     # the client's own: it shuts the kernel down
            def __init__(self, **kw):
                super().__init__(sandbox=spec, **kw)
        client = NotebookClient(nb, kernel_name="python3", timeout=60,
                                kernel_manager_class=InSpec, on_cell_executed=on_cell_executed)
        client.execute()
        deadline = time.monotonic() + 5       # the kernel has been shut down: daemons gone?
        while daemons() and time.monotonic() < deadline:
            time.sleep(0.1)
        left = daemons()
        for p in left:                          # never leave them running on the host
            p.kill()
    stop.set()
    server.close()

    results = {}
    for cell in nb.cells[1:len(checks) + 1]:
        assert not _errors(cell), cell.outputs
        results.update(json.loads(_stdout(cell)))
    results.update(
        daemons_during=seen_during.get("daemons"), daemons_after=[p.pid for p in left],
        accepted=len(accepted), host_tmp_exists=host_tmp.exists(), spec=spec,
        host_pid1_cmdline=Path("/proc/1/cmdline").read_bytes().decode(errors="replace"),
        daemon_cell_errors=_errors(nb.cells[-2]))
    host_tmp.unlink(missing_ok=True)
    return results


def test_workdir_and_course_packages_are_visible(probe_run):
    assert probe_run["given"] == "hello from workdir"
    assert probe_run["imports"] == "ok"
    assert probe_run["write_work"] == "written"
    assert (probe_run["spec"].workdir / "out.txt").read_text() == "x"


def test_repository_and_host_files_are_hidden(probe_run):
    assert (REPO / "labs").is_dir() and (REPO / "nbgrader_config.py").is_file()
    assert probe_run["labs"] is False
    assert probe_run["build"] is False
    assert probe_run["nbgrader_config"] is False
    assert probe_run["marker"] == "raised FileNotFoundError"
    # the repository directory holds only the bound package directories (+ the venv, data)
    assert set(probe_run["repo_listing"]) <= {"minillm", "kernels", "autograder", "data",
                                              ".venv"}, probe_run["repo_listing"]


def test_no_network(probe_run):
    assert probe_run["connect"].startswith("raised "), probe_run["connect"]
    assert probe_run["accepted"] == 0


def test_own_pid_namespace(probe_run):
    pids = probe_run["proc_pids"]
    assert str(os.getpid()) not in pids
    assert "1" in pids and len(pids) < 10, pids
    assert probe_run["pid1_cmdline"] != probe_run["host_pid1_cmdline"]


def test_the_kernel_cannot_leave_its_cpus(probe_run):
    """The seccomp filter (autograder/syscall_filter.py): sched_setaffinity and system calls
    through another ABI are refused; reading the affinity and other calls still work."""
    assert probe_run["affinity"] == sorted(os.sched_getaffinity(0))
    assert probe_run["widen"] == "raised PermissionError"
    if platform.machine() == "x86_64":      # aarch64's 32-bit ABI needs 32-bit code to call
        assert probe_run["other_abi"] == "EPERM", probe_run["other_abi"]
    assert probe_run["getpid"] > 1
    # when torch loads, a CPU probe pins the process to each CPU in turn: refused, torch starts
    # on one thread; the graded kernel's setup gives it back its share
    want = torch_threads()
    assert probe_run["threads"] == [want, want], probe_run["threads"]


def test_grader_environment_does_not_leak(probe_run):
    assert probe_run["secret_env"] is None
    assert SECRET not in probe_run["env_keys"]
    environs = probe_run["environs"]
    assert environs, "no /proc/<pid>/environ inside"
    readable = [pid for pid, env in environs.items() if not env.startswith("unreadable ")]
    assert "1" in readable                      # bwrap's init: started with the clean env
    for pid, env in environs.items():
        assert SECRET not in env and SECRET_VALUE not in env, f"/proc/{pid}/environ leaks"


def test_writes_outside_workdir_do_not_reach_the_host(probe_run):
    if REPO.resolve().is_relative_to("/tmp"):
        # a checkout under /tmp sits in the sandbox's private /tmp: the write lands there (the
        # host check below proves it goes no further)
        assert probe_run["write_repo"] == "written" or \
            probe_run["write_repo"].startswith("raised "), probe_run["write_repo"]
    else:
        assert probe_run["write_repo"].startswith("raised "), probe_run["write_repo"]
    assert probe_run["write_pkg"] == "raised OSError"          # read-only bind (EROFS)
    assert not (REPO / "minillm" / "sbx-write.txt").exists()
    assert not any(p.name.startswith("sbx-write-") for p in REPO.iterdir())
    assert probe_run["write_tmp"] == "written"                 # the sandbox's private /tmp ...
    assert not probe_run["host_tmp_exists"]                    # ... is not the host's


def test_daemons_die_with_the_kernel(probe_run):
    assert probe_run["daemon_cell_errors"] == []
    assert probe_run["daemons_during"] is not None and len(probe_run["daemons_during"]) == 2, \
        probe_run["daemons_during"]
    assert probe_run["daemons_after"] == []


# --- interrupts and dead kernels -------------------------------------------------------------
def test_cell_timeout_interrupts_the_kernel_inside(tmp_path):
    """nbclient's timeout + interrupt_on_timeout: the looping cell gets KeyboardInterrupt and
    the *same* kernel runs the next cells (a SIGINT to bwrap itself kills the sandbox). The
    interrupt reaches the kernel's process group, as for an unsandboxed kernel: os.system
    ignores SIGINT in the kernel while the shell's `sleep` gets it."""
    nb = _notebook(["x = 41", "while True:\n    pass",
                    "import os, time\nt = time.time()\nstatus = os.system('sleep 60')\n"
                    "print(time.time() - t < 30, os.WIFSIGNALED(status) or status != 0)",
                    "print('alive', x + 1)"])
    km = SandboxKernelManager(kernel_name="python3", sandbox=_spec(tmp_path))
    client = NotebookClient(nb, km=km, timeout=3, interrupt_on_timeout=True, allow_errors=True)
    t0 = time.monotonic()
    try:
        client.execute()
        bwrap_pid = km.provisioner.process.pid
        assert km.kernel_process() is not None
    finally:
        run_sync(km.shutdown_kernel)(now=True)
    assert time.monotonic() - t0 < 30
    assert _errors(nb.cells[1]) == ["KeyboardInterrupt"], nb.cells[1].outputs
    assert _stdout(nb.cells[2]) == "True True\n", nb.cells[2].outputs
    assert _stdout(nb.cells[3]) == "alive 42\n", nb.cells[3].outputs
    assert not psutil.pid_exists(bwrap_pid) or \
        psutil.Process(bwrap_pid).status() == psutil.STATUS_ZOMBIE


def test_kernel_exit_is_a_dead_kernel(tmp_path):
    """os._exit in a cell: nbclient raises DeadKernelError at once (the sandbox ends with its
    kernel, so bwrap exits); the kernel ran in the spec's workdir. A manager without a spec
    refuses to start."""
    nb = _notebook(["import os; open('cwd.txt', 'w').write(os.getcwd())",
                    "os._exit(1)", "print('unreachable')"])
    spec = _spec(tmp_path)
    client = NotebookClient(nb, SandboxKernelManager(kernel_name="python3", sandbox=spec),
                            timeout=60)
    t0 = time.monotonic()
    with pytest.raises(DeadKernelError):
        client.execute()
    assert time.monotonic() - t0 < 20
    assert _stdout(nb.cells[2]) == ""
    assert (spec.workdir / "cwd.txt").read_text() == str(spec.workdir)
    with pytest.raises(RuntimeError, match="no sandbox"):
        NotebookClient(_notebook(["1"]), SandboxKernelManager(kernel_name="python3"),
                       timeout=60).execute()


# --- the command itself ----------------------------------------------------------------------
def test_bwrap_argv(tmp_path, monkeypatch):
    monkeypatch.setenv(SECRET, SECRET_VALUE)
    spec = SandboxSpec(workdir=tmp_path / "w", runtime_dir=tmp_path / "r",
                       ro_paths=default_ro_paths(), env=default_env(Path("/tmp/home")))
    argv = bwrap_argv(spec, ["python", "-V"])
    assert argv[-3:] == ["--", "python", "-V"]
    for flag in ("--unshare-all", "--unshare-user", "--die-with-parent", "--new-session",
                 "--clearenv"):
        assert flag in argv
    binds = [argv[i + 1] for i, a in enumerate(argv) if a in ("--ro-bind", "--bind")]
    repo = str(REPO)
    assert repo not in binds
    assert not any(b.startswith(repo + "/labs") or b.startswith(repo + "/build") for b in binds)
    assert {str(REPO / p) for p in ("minillm", "kernels", "autograder")} <= set(binds)
    assert str(Path(sys.base_prefix).resolve()) in binds and "/root" not in binds
    # read-write binds come after the tmpfs on /tmp (tmp_path is under /tmp here)
    tmpfs = argv.index("--tmpfs")
    assert argv.index(str(spec.workdir)) > tmpfs and argv.index(str(spec.runtime_dir)) > tmpfs
    setenv = {argv[i + 1]: argv[i + 2] for i, a in enumerate(argv) if a == "--setenv"}
    assert setenv == spec.env and SECRET not in setenv
    assert setenv["PATH"].split(":")[0] == str(Path(sys.prefix).absolute() / "bin")


def test_a_gpu_machines_device_nodes_are_bound_into_the_sandbox(tmp_path, monkeypatch):
    from autograder import sandbox
    spec = SandboxSpec(tmp_path / "w", tmp_path / "r", default_ro_paths(),
                       default_env(Path("/tmp/home")))
    monkeypatch.setattr(sandbox, "gpu_devices", lambda: [])
    assert "--dev-bind" not in bwrap_argv(spec, ["true"])
    monkeypatch.setattr(sandbox, "gpu_devices", lambda: ["/dev/nvidia0", "/dev/nvidiactl"])
    argv = bwrap_argv(spec, ["true"])
    binds = [argv[i:i + 3] for i, a in enumerate(argv) if a == "--dev-bind"]
    assert binds == [["--dev-bind", "/dev/nvidia0", "/dev/nvidia0"],
                     ["--dev-bind", "/dev/nvidiactl", "/dev/nvidiactl"]]
    assert argv.index("--dev-bind") > argv.index("--dev")     # over the sandbox's own /dev
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert default_env(tmp_path)["CUDA_VISIBLE_DEVICES"] == "0"


def test_the_filter_program_for_each_architecture(monkeypatch):
    """The BPF program as bwrap reads it: the native ABI checked first, the refused calls by
    their numbers, EPERM last (x86_64: 203 and the x32 bit; aarch64: 122)."""
    import struct

    from autograder import syscall_filter
    for machine, arch, nr, n in [("x86_64", 0xC000003E, 203, 7), ("aarch64", 0xC00000B7, 122, 6)]:
        prog = syscall_filter.program(machine)
        code = [struct.unpack("=HBBI", prog[i:i + 8]) for i in range(0, len(prog), 8)]
        assert len(code) == n, code
        assert code[0] == (0x20, 0, 0, 4) and code[1] == (0x15, 0, n - 3, arch)
        assert code[-1] == (0x06, 0, 0, 0x00050001) and code[-2] == (0x06, 0, 0, 0x7FFF0000)
        assert (0x15, 1, 0, nr) == code[-3]
        assert ((0x35, 2, 0, 0x40000000) in code) == (machine == "x86_64")
    with pytest.raises(RuntimeError, match="no seccomp filter for the riscv64"):
        syscall_filter.program("riscv64")
    fd = syscall_filter.filter_fd()                 # this machine's, ready for bwrap to read
    try:
        assert os.read(fd, 4096) == syscall_filter.program()
    finally:
        os.close(fd)
    # elsewhere the sandbox runs without it (and says so in autograder/sandbox.py's doc)
    monkeypatch.setattr(syscall_filter.platform, "machine", lambda: "riscv64")
    assert syscall_filter.filter_fd() is None


def test_thread_settings_reach_the_kernel_and_nothing_else(monkeypatch):
    """The grader's share of the cores (torch's threads, Inductor's compile workers) is the
    kernel's too; its other variables are not."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("TORCHINDUCTOR_COMPILE_THREADS", "1")
    monkeypatch.setenv(SECRET, SECRET_VALUE)
    env = default_env(Path("/tmp/home"))
    assert env["OMP_NUM_THREADS"] == env["TORCHINDUCTOR_COMPILE_THREADS"] == "1"
    assert SECRET not in env and SECRET_VALUE not in env.values()
