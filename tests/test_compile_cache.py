"""The grader's warm compile cache (autograder/compile_cache.py): warmed once by the grader, a
fresh copy in each graded kernel, never written back.

A small lab whose warm-up compiles one function with torch.compile is graded in a temporary
course, two submissions in one batch. Each submission's own cell reads the cache it was given,
compiles the same function (a hit: nothing to compile), then overwrites every file of its copy.
Both must see the grader's bytes: what the first one wrote never reaches the second, nor the
grader's copy in build/.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook
from test_pipeline import _meta  # noqa: E402  (the nbgrader cell metadata the dummy lab uses)

from autograder import compile_cache, processes
from autograder.cores import torch_threads
from autograder.course import Course
from autograder.grade import grade_submissions
from autograder.jobs import unpack_files
from autograder.sandbox import sandbox_unavailable_reason

REPO = Path(__file__).resolve().parent.parent
LAB = "96_cache"
COMPILE = ("import torch\n"
           "torch.set_num_threads(1)\n"      # like lab 05's bench: the count is in the key
           "from torch._dynamo.utils import counters\n"
           "f = torch.compile(lambda x: (x.sin() * 2).sum())\n"
           "f(torch.randn(8))\n")
# compiled in a process of its own, as lab 05's bench cell does (Dynamo in the kernel would
# patch torch and leave threads in the kernel)
STUDENT_CELL = "CHILD = " + repr(COMPILE + 'print(counters["inductor"]["fxgraph_cache_hit"])') + r'''
import hashlib, json, os, subprocess, sys
from pathlib import Path
d = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
files = sorted(p for p in Path(d).rglob("*") if p.is_file()) if d else []
seen = {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}
run = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True)
hits = int(run.stdout.split()[-1]) if run.returncode == 0 else run.stderr[-500:]
for p in files:                           # poison this kernel's copy
    p.write_bytes(b"import os; os.system('echo POISONED')\n")
import torch
print("REPORT " + json.dumps({"dir": d, "files": seen, "hits": hits,
                              "threads": torch.get_num_threads(),
                              "master_visible": os.path.exists(MASTER)}))
'''
# a warm-up that only writes a cache entry: enough to test when the grader warms again
WRITE_ENTRY = ("import os, pathlib\n"
               "pathlib.Path(os.environ['TORCHINDUCTOR_CACHE_DIR'], 'entry').write_text('x')\n")
pytestmark = pytest.mark.xdist_group("compile_cache")


def warmups():
    """The test lab's warm-up (compile_cache.WARMUPS points here)."""
    return [["-c", COMPILE]]


@pytest.fixture
def course(tmp_path, monkeypatch):
    root = tmp_path / "course"
    root.mkdir()
    shutil.copy2(REPO / "nbgrader_config.py", root / "nbgrader_config.py")
    nb = new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nb.cells = [
        new_code_cell("def double(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n"
                      "    ### END SOLUTION", metadata=_meta("96_double", solution=True)),
        new_code_cell("assert double(2) == 4", metadata=_meta("96_double_test", grade=True,
                                                              locked=True, points=1)),
    ]
    (root / "labs" / LAB).mkdir(parents=True)
    nbformat.write(nb, str(root / "labs" / LAB / f"{LAB}.ipynb"))
    c = Course(root)
    assert c.release() == [LAB]
    monkeypatch.setitem(compile_cache.WARMUPS, LAB, f"{__name__}:warmups")
    return c


def master(course: Course) -> Path:
    return course.build / "compile_cache" / LAB / "inductor"


def digests(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and not p.is_symlink()}


def submit(course: Course, incoming: Path, student: str) -> None:
    nb = nbformat.read(str(course.release_dir(LAB) / f"{LAB}.ipynb"), as_version=4)
    nb.cells[0].source = ("def double(x):\n    return 2 * x\n\n"
                          f"MASTER = {str(master(course))!r}\n" + STUDENT_CELL)
    (incoming / student / LAB).mkdir(parents=True)
    nbformat.write(nb, str(incoming / student / LAB / f"{LAB}.ipynb"))


def report(course: Course, student: str) -> dict:
    nb = nbformat.read(str(course.autograded(student, LAB) / f"{LAB}.ipynb"), as_version=4)
    text = "".join(o.get("text", "") for o in nb.cells[0].get("outputs", []))
    line = next((x for x in text.splitlines() if x.startswith("REPORT ")), None)
    assert line, f"{student}'s cell printed no report: {nb.cells[0].get('outputs')}"
    return json.loads(line[len("REPORT "):])


@pytest.mark.slow
def test_each_kernel_gets_a_fresh_copy_of_the_warm_cache(course, tmp_path):
    """In the sandbox where this machine has one (CI does), else in plain child processes (the
    job process passes the cache's variable to the kernel through its own environment)."""
    sandbox = sandbox_unavailable_reason() is None
    for student in ("first", "second"):
        submit(course, tmp_path / "incoming", student)
    log: list[str] = []
    recs = grade_submissions(course, tmp_path / "incoming", sandbox=sandbox, feedback=False,
                             log=log.append)
    assert [(r.student, r.status, r.score) for r in recs] == \
        [("first", "ok", 1.0), ("second", "ok", 1.0)], log
    assert any(f"{LAB}: compile cache warmed" in x for x in log), log
    grader = digests(master(course))
    assert grader, "the warm-up left nothing in the grader's cache"
    threads = torch_threads()
    for student in ("first", "second"):
        r = report(course, student)
        assert r["files"] == grader, f"{student} did not get the grader's cache as it is"
        assert isinstance(r["hits"], int) and r["hits"] >= 1, \
            f"{student}'s compile missed the warm cache: {r['hits']}"
        assert not r["dir"].startswith(str(course.root)), r["dir"]
        assert r["threads"] == threads, f"the kernel runs torch on {r['threads']} thread(s)"
        if sandbox:
            assert not r["master_visible"], "the sandbox sees the grader's cache"
    assert digests(master(course)) == grader, "a kernel wrote into the grader's cache"


def test_a_second_batch_reuses_the_cache_until_its_fingerprint_changes(course, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "warmups", lambda: [["-c", WRITE_ENTRY]])
    log: list[str] = []
    first = compile_cache.warm(course, LAB, log.append)
    assert first and len(log) == 1 and "warmed" in log[0], log
    stamp = master(course).parent / compile_cache.FINGERPRINT_FILE
    assert json.loads(stamp.read_text())["commands"] == [["-c", WRITE_ENTRY]]
    assert list(first) == ["entry"], first
    before = stamp.stat().st_mtime_ns
    assert compile_cache.warm(course, LAB, log.append) == first
    assert stamp.stat().st_mtime_ns == before, "warmed again for nothing"
    assert len(log) == 2 and "using the warm compile cache" in log[1], log
    (master(course) / "stale").write_text("from an older torch")
    real = compile_cache.fingerprint
    monkeypatch.setattr(compile_cache, "fingerprint",
                        lambda cmds, env: {**real(cmds, env), "torch": "x"})
    again = compile_cache.warm(course, LAB, log.append)
    assert len(log) == 3 and "warmed" in log[2], log
    assert again and "stale" not in again, "the old cache was kept"


def test_fingerprint_follows_the_course_packages_and_the_thread_env(monkeypatch, tmp_path):
    cmds, env = warmups(), {"PATH": "/bin"}
    fp = compile_cache.fingerprint
    assert fp(cmds, env) == fp(cmds, {"PATH": "/usr/bin"})     # not every variable counts
    assert fp(cmds, env) != fp([["-c", "pass"]], env)
    assert fp(cmds, env) != fp(cmds, {**env, "OMP_NUM_THREADS": "1"})
    fake = tmp_path / "root"
    for pkg in compile_cache.PACKAGES:
        (fake / pkg).mkdir(parents=True)
        (fake / pkg / "m.py").write_text("x = 1\n")
    monkeypatch.setattr(processes, "package_parent", lambda: fake)
    one = fp(cmds, env)
    (fake / "minillm" / "m.py").write_text("x = 2\n")
    assert fp(cmds, env)["packages_sha256"] != one["packages_sha256"]


def test_a_failing_warm_up_grades_without_the_cache(course, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "warmups", lambda: [["-c", "raise SystemExit(3)"]])
    log: list[str] = []
    assert compile_cache.warm(course, LAB, log.append) == {}
    assert any("warm-up failed (exit 3" in x for x in log), log
    assert not (master(course).parent / compile_cache.FINGERPRINT_FILE).exists()


def test_install_writes_the_files_and_refuses_paths_outside(tmp_path):
    files = {"ab/graph.py": "eA==", "top": ""}
    unpack_files(files, tmp_path / "home")
    cache = tmp_path / "home"
    assert (cache / "ab" / "graph.py").read_bytes() == b"x" and (cache / "top").read_bytes() == b""
    with pytest.raises(ValueError, match="outside"):
        unpack_files({"../../escape": "eA=="}, tmp_path / "home")
    assert not (tmp_path / "escape").exists()


def test_lab05_warms_what_its_bench_cell_runs():
    from autograder.labs import lab05
    assert compile_cache.commands("05_speculative") == [lab05.bench_command()]
    assert compile_cache.commands("00_sampling") == []
    nb = nbformat.read(str(REPO / "labs" / "05_speculative" / "05_speculative.ipynb"),
                       as_version=4)
    bench = [c.source for c in nb.cells if "subprocess.run(cmd" in c.source]
    assert len(bench) == 1 and "cmd = [sys.executable, *lab05.bench_command()]" in bench[0]


@pytest.mark.parametrize("flags, expected", [
    ([], {"compile_cache": True}),
    (["--no-compile-cache"], {"compile_cache": False})])
def test_grade_uses_the_cache_unless_told_not_to(course, monkeypatch, tmp_path, flags, expected):
    """The warm compile cache (above) is on by default, off with its flag."""
    import autograder.__main__ as cli
    import autograder.grade
    seen = {}
    monkeypatch.setattr(autograder.grade, "grade_submissions",
                        lambda course, subdir, **kw: seen.update(kw) or [])
    cli.main(["grade", str(tmp_path), "--root", str(course.root), *flags])
    assert {k: seen[k] for k in expected} == expected
