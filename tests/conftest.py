"""Fixtures shared by several test modules."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# Under pytest-xdist each worker gets its share of the cores, and so do the processes it starts
# (notebook kernels, sandboxes, JupyterLab, the CLI):
# * torch's intra-op threads: two workers each running torch with one thread per core
#   oversubscribe the machine, and the threads then wait on each other;
# * Inductor's compile workers: beside a busy neighbour, a pool of compile processes costs more
#   than it saves.
# benchmarks/RESULTS.md, "Each test worker's share of the cores", has both: lab 09's recall training took 2.7x as long on two
# threads as on one beside a second process, and a cold compile of the draft's fused step 1.2x
# as long with Inductor's default pool as with one compile process.
# Set before torch is imported; a value already in the environment wins.
# The share is `grade --jobs N`'s (autograder.cores imports no torch).
from autograder.cores import share_of_cores  # noqa: E402

_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 0)
os.environ.update(share_of_cores(_WORKERS))

import torch  # noqa: E402

if _WORKERS > 1:
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

# Triton kernels run in the CPU interpreter when there is no GPU. Triton reads this variable when
# a kernel is *defined*, and some libraries (transformers via torch) import triton early, so it
# has to be set before any test module is imported -- here.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def one_thread():
    """Models this tiny run faster on one thread than paying for intra-op thread sync."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def across(tmp_path, monkeypatch):
    """As graded: the test's calls cross a real socket to a "kernel" served from a thread here
    (autograder/kernel_side.py), with plain values both ways (autograder/plain.py); probes
    (autograder/probes.py) run on the kernel's side. `connect(namespace)` serves `namespace` as
    the student's notebook and returns what a test in the tester sees of it: each function or
    class a StudentFunction, each other value fetched by value. Records the threads that ran the
    student's calls (`threads`: never the test's own)."""
    import socket
    import threading

    from autograder import kernel_side, probes
    from autograder.tester import Kernel
    path = str(tmp_path / "tester.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    threads: list = []

    def connect(namespace: dict) -> dict:
        def watched(fn):
            def run(*a, **kw):
                threads.append(threading.current_thread())
                return fn(*a, **kw)
            return run
        served = {k: watched(v) if callable(v) else v for k, v in namespace.items()}
        threading.Thread(target=kernel_side.serve, args=(path, served), daemon=True).start()
        conn, _ = listener.accept()
        kernel = Kernel(conn)
        monkeypatch.setattr(probes, "_CONNECTION", kernel)
        return {name: kernel.lookup(name) for name in namespace}
    yield connect, threads
    if probes._CONNECTION is not None:
        probes._CONNECTION.done()
    listener.close()


@pytest.fixture(scope="session")
def built_decks(tmp_path_factory) -> Path:
    """Every slide deck built once per test run with the command `make slides` runs. Under
    pytest-xdist the workers share one build (in the run's temporary folder, under a file lock):
    the slide tests and the browser's slide tests usually run on different workers."""
    from filelock import FileLock
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent                  # pytest-N/, which this run's workers share
    out = base / "slides_html"
    with FileLock(str(base / "slides_html.lock")):
        if not (out / ".built").is_file():
            r = subprocess.run([sys.executable, "-m", "slides.build", "--out", str(out)],
                               cwd=REPO, capture_output=True, text=True, timeout=600)
            assert r.returncode == 0, \
                f"python -m slides.build failed:\n{r.stdout}\n{r.stderr}"
            (out / ".built").write_text(r.stdout)
    return out


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """`--dist loadgroup` sends the tests of one `xdist_group` to one worker, so a module's
    expensive fixture (a graded batch, a released course, a browser) is built once, not once per
    worker. pytest-xdist marks the group by appending `@group` to `item._nodeid`; pytest 9 keeps
    the node id in `item._id`, so that suffix is lost and the groups are scattered. Do it here."""
    if not getattr(config.option, "loadgroup", False):
        return
    for item in items:
        names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                        for m in item.iter_markers("xdist_group")})
        if not names or "@" in item.nodeid or not hasattr(item, "_id"):
            continue
        from _pytest.nodeid import NodeId
        item._id = NodeId.parse(f"{item.nodeid}@{'_'.join(names)}")


# MINILLM_TEST_TIMELINE=<file>: one JSON line per test phase (worker, test, phase, start, end),
# to see how `make test`'s two workers share the run (where one waits, which group ends last);
# benchmarks/worker_timeline.py reads it.
_TIMELINE = os.environ.get("MINILLM_TEST_TIMELINE")


def pytest_runtest_logreport(report):
    """Written by the process that reports the run (under xdist, the controller, which hears of
    every worker's tests)."""
    if _TIMELINE and not os.environ.get("PYTEST_XDIST_WORKER"):
        import json
        node = getattr(report, "node", None)             # the xdist worker that ran it
        with open(_TIMELINE, "a") as f:
            f.write(json.dumps({"worker": node.gateway.id if node is not None else "main",
                                "test": report.nodeid, "phase": report.when,
                                "start": report.start, "end": report.stop}) + "\n")
