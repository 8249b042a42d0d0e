"""The nbgrader pipeline on every lab: release, then autograde three submissions per lab.

    (a) the source notebook itself            -> full points on every autograded cell, no cell
                                                 fails, and the graded part runs in < 180 s
    (b) the untouched student version         -> zero on every autograded cell, no crash
    (c) labs/NN_topic/wrong_submission.json   -> the listed cells lose points

Each runs its notebook up to the last cell it checks (the last autograded code cell, the last
listed cell): the student's own code cells after it are not run, since they cannot change a
verdict, and the lab's slowest measurements are not run once more. The whole notebook runs top
to bottom, in under 180 s, in JupyterLab (tests/test_browser.py), and its measurements beside a
busy core in tests/test_lab_measurements.py.

All of it happens in one temporary course (a copy of nbgrader_config.py and labs/), so the
repository's build/ is never touched. (b) fails fast. A tiny dummy lab, built here, runs through
the same steps and through the command line (`grade` with crashing / hanging submissions,
`selfgrade`, feedback, CSV).
"""
from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from autograder import tester_plan as plan
from autograder.course import Course

REPO = Path(__file__).resolve().parent.parent
LABS = Course(REPO).labs()
DUMMY = "99_dummy"
MAX_SECONDS = 180           # a lab runs top to bottom in under 3 minutes on 2 CPU cores (the whole
                            # notebook: tests/test_browser.py; its graded part here)
pytestmark = pytest.mark.slow


# --- the dummy lab ----------------------------------------------------------------------------
def _meta(grade_id, grade=False, solution=False, locked=False, points=None):
    m = {"schema_version": 3, "grade": grade, "solution": solution, "locked": locked,
         "grade_id": grade_id}
    if points is not None:
        m["points"] = points
    return {"nbgrader": m}


def write_dummy_lab(folder: Path) -> None:
    """99_dummy: one function to write, whose reference (minillm.sampling.apply_temperature) is
    withheld from the kernel, a visible + hidden test, an asset file read by the notebook, and
    its wrong_submission.json."""
    nb = new_notebook()
    nb.metadata["autograder"] = {"withheld": {"minillm.sampling:apply_temperature": "scale"}}
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nb.cells = [
        new_markdown_cell("# Dummy lab\nDivide logits by a temperature.",
                          metadata=_meta("99_intro", locked=True)),
        new_code_cell("import torch\nimport minillm.sampling\n"
                      "from autograder import assert_close\n"
                      "ASSET = open('asset.txt').read().strip()",
                      metadata=_meta("99_setup", locked=True)),
        new_code_cell("def scale(logits, t):\n    ### BEGIN SOLUTION\n    return logits / t\n"
                      "    ### END SOLUTION", metadata=_meta("99_scale", solution=True)),
        new_code_cell("x = torch.randn(5)\nassert_close(scale(x, 2.0), x / 2, name='scale(x, 2)')\n"
                      "### BEGIN HIDDEN TESTS\ng = torch.Generator().manual_seed(1)\n"
                      "y = torch.randn(3, 7, generator=g)\n"
                      "ref = minillm.sampling.apply_temperature(y, 0.7)\n"
                      "out = scale(y, 0.7)\n"
                      "assert_close(out, ref, name='scale(y, 0.7)')\n"
                      "### END HIDDEN TESTS",
                      metadata=_meta("99_scale_test", grade=True, locked=True, points=2)),
        new_code_cell("assert ASSET == 'hello', ASSET\nassert scale(torch.ones(1), 1.0).item() == 1.0",
                      metadata=_meta("99_asset_test", grade=True, locked=True, points=1)),
    ]
    folder.mkdir(parents=True)
    nbformat.write(nb, str(folder / f"{folder.name}.ipynb"))
    (folder / "asset.txt").write_text("hello\n")
    (folder / "wrong_submission.json").write_text(json.dumps({
        "description": "multiplies by the temperature instead of dividing",
        "replacements": [{"grade_id": "99_scale", "old": "logits / t", "new": "logits * t"}],
        "expect_lost": ["99_scale_test"]}))


def dummy_course(root: Path) -> Course:
    """A course in `root` holding only the dummy lab, released."""
    root.mkdir(parents=True, exist_ok=True)
    shutil.copy2(REPO / "nbgrader_config.py", root / "nbgrader_config.py")
    write_dummy_lab(root / "labs" / DUMMY)
    course = Course(root)
    assert course.release() == [DUMMY]
    return course


# --- submissions --------------------------------------------------------------------------------
def wrong_spec(lab_dir: Path) -> dict:
    """labs/NN/wrong_submission.json: description, replacements, expect_lost."""
    spec_path = lab_dir / "wrong_submission.json"
    assert spec_path.is_file(), f"{spec_path} is missing: every lab describes a wrong submission"
    spec = json.loads(spec_path.read_text())
    assert spec.get("replacements") and spec.get("expect_lost"), f"{spec_path} is incomplete"
    return spec


def wrong_notebook(lab_dir: Path) -> nbformat.NotebookNode:
    """The source notebook with labs/NN/wrong_submission.json's replacements applied."""
    spec_path = lab_dir / "wrong_submission.json"
    spec = wrong_spec(lab_dir)
    nb = nbformat.read(str(lab_dir / f"{lab_dir.name}.ipynb"), as_version=4)
    cells = {c.metadata.get("nbgrader", {}).get("grade_id"): c for c in nb.cells}
    for rep in spec["replacements"]:
        cell = cells.get(rep["grade_id"])
        assert cell is not None, f"{spec_path}: no cell with grade_id {rep['grade_id']!r}"
        assert rep["old"] in cell.source, \
            f"{spec_path}: {rep['old']!r} not found in cell {rep['grade_id']!r}"
        cell.source = cell.source.replace(rep["old"], rep["new"])
    return nb


def without_the_tail(nb: nbformat.NotebookNode, up_to: list, why: str) -> nbformat.NotebookNode:
    """The notebook as graded up to the last cell of `up_to` (grade ids): nothing a notebook runs
    later can change those cells' verdicts, so the student's own code cells after it
    (measurements, plots) become a comment and a lab's slowest part is not run once more. The
    nbgrader cells after it stay (the grader restores locked ones anyway) and run as they
    would."""
    ids = [c.metadata.get("nbgrader", {}).get("grade_id") for c in nb.cells]
    last = max(ids.index(g) for g in up_to)
    for cell in nb.cells[last + 1:]:
        if cell.cell_type == "code" and not cell.metadata.get("nbgrader"):
            cell.source = f"# not run in tests/test_pipeline.py's {why}"
    return nb


def autograded_code_cells(nb: nbformat.NotebookNode) -> list:
    return [c.metadata["nbgrader"]["grade_id"] for c in nb.cells
            if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("grade")]


class Pipeline:
    """The shared temporary course; autogrades each (student, lab) once, on first request."""

    def __init__(self, root: Path):
        self.course = Course(root)
        self.records = {}
        self.released = set()

    def release(self, lab: str) -> Path:
        """`nbgrader generate_assignment` for `lab`, once: each xdist worker builds its own course
        and releases only the labs whose tests it runs. Returns the release folder."""
        if lab not in self.released:
            assert self.course.release([lab]) == [lab]
            self.released.add(lab)
        return self.course.release_dir(lab)

    def submit(self, student: str, lab: str, nb: nbformat.NotebookNode) -> None:
        dest = self.course.submitted(student, lab)
        dest.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, str(dest / f"{lab}.ipynb"))

    def graded(self, student: str, lab: str):
        self.release(lab)
        if (student, lab) not in self.records:
            src = self.course.source(lab)
            if student == "source":
                nb = nbformat.read(str(src / f"{lab}.ipynb"), as_version=4)
                nb = without_the_tail(nb, autograded_code_cells(nb),
                                      "(a): after the last autograded cell")
            elif student == "release":
                nb = nbformat.read(str(self.course.release_dir(lab) / f"{lab}.ipynb"),
                                   as_version=4)
                nb = without_the_tail(nb, autograded_code_cells(nb),
                                      "(b): after the last autograded cell")
            elif student == "wrong":
                nb = without_the_tail(wrong_notebook(src), wrong_spec(src)["expect_lost"],
                                      "(c): after the last listed cell")
            else:
                raise ValueError(student)
            self.submit(student, lab, nb)
            self.records[(student, lab)] = self.course.autograde(student, lab,
                                                                 compile_cache=True)
        return self.records[(student, lab)]


def authoring_problems(source_nb) -> list[str]:
    """A test cell must not bind a name a later cell reads: it would exist only in the tester."""
    problems, tests = [], {}
    for c in source_nb.cells:
        m = c.metadata.get("nbgrader", {})
        if c.cell_type != "code":
            continue
        if m.get("locked") and m.get("grade"):
            for n in plan.bound_names(c.source):
                tests[n] = m.get("grade_id", "?")
            continue
        for n in sorted((plan.free_names(c.source) or set()) & set(tests)):
            problems.append(f"{m.get('grade_id') or 'a free cell'} reads {n}, which the test "
                            f"{tests[n]} binds: bind it in a cell that is not a test")
        for n in plan.bound_names(c.source):
            tests.pop(n, None)
    return problems


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    root = tmp_path_factory.mktemp("course")
    shutil.copy2(REPO / "nbgrader_config.py", root / "nbgrader_config.py")
    for lab in LABS:
        shutil.copytree(REPO / "labs" / lab, root / "labs" / lab,
                        ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
    write_dummy_lab(root / "labs" / DUMMY)
    p = Pipeline(root)
    assert p.course.labs() == LABS + [DUMMY]
    p.release(DUMMY)            # the command-line tests below grade it; the labs on first use
    return p


ALL = LABS + [DUMMY]


def per_lab(labs):
    """Parameters with one xdist group per lab: `make test` runs on two workers
    (`-n 2 --dist loadgroup`), and each lab's release, (a), (b) and (c) stay on one worker
    (each worker builds its own temporary course)."""
    return [pytest.param(lab, marks=pytest.mark.xdist_group(f"pipeline_{lab}")) for lab in labs]


def describe(rec) -> str:
    return f"{rec.student}/{rec.lab}: {rec.status}, log {rec.log}\n" + "\n".join(
        f"  {c.grade_id}: {c.score} / {c.max_score} {c.errors}" for c in rec.cells)


# --- the source notebooks as committed ----------------------------------------------------------
@pytest.mark.parametrize("lab", LABS)
def test_source_is_committed_without_outputs(lab):
    nb = nbformat.read(str(REPO / "labs" / lab / f"{lab}.ipynb"), as_version=4)
    dirty = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"
             and (c.get("outputs") or c.get("execution_count") is not None)]
    assert not dirty, f"{lab}: code cells {dirty} have outputs or an execution_count"
    raw = json.loads((REPO / "labs" / lab / f"{lab}.ipynb").read_text())["cells"]
    ids = [c.get("id") for c in raw]
    twice = sorted({i for i in ids if ids.count(i) > 1})
    assert not twice, f"{lab}: cell ids {twice} appear twice (a copied cell keeps its id)"


@pytest.mark.parametrize("lab", LABS)
def test_tests_bind_nothing_later_cells_read(lab):
    """Tests run in the tester: a name a test binds does not exist in the kernel."""
    nb = nbformat.read(str(REPO / "labs" / lab / f"{lab}.ipynb"), as_version=4)
    assert authoring_problems(nb) == []
    assert plan.tester_plan(nb)["names"], f"{lab}: the tests read nothing of the student's"


@pytest.mark.parametrize("lab", LABS)
def test_source_follows_the_grading_conventions(lab):
    nb = nbformat.read(str(REPO / "labs" / lab / f"{lab}.ipynb"), as_version=4)
    prefix = lab[:3]
    ids = []
    for c in nb.cells:
        m = c.metadata.get("nbgrader")
        if not m:
            continue
        assert m.get("schema_version") == 3, f"{lab}: cell {m.get('grade_id')} schema"
        ids.append(m["grade_id"])
        assert m["grade_id"].startswith(prefix), f"{lab}: grade_id {m['grade_id']!r}"
        if m.get("grade"):
            assert m.get("points", 0) > 0, f"{lab}: graded cell {m['grade_id']} has no points"
    assert len(ids) == len(set(ids)), f"{lab}: duplicate grade_ids"
    assert any(c.metadata.get("nbgrader", {}).get("grade") for c in nb.cells), \
        f"{lab}: no graded cell"


# --- release ------------------------------------------------------------------------------------
@pytest.mark.parametrize("lab", per_lab(ALL))
def test_release_strips_solutions_and_keeps_assets(pipeline, lab):
    rel = pipeline.release(lab)
    text = (rel / f"{lab}.ipynb").read_text()
    for marker in ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS"):
        assert marker not in text, f"{lab}: {marker} left in the student version"
    assert not (rel / "wrong_submission.json").exists(), "instructor file released"
    src = pipeline.course.source(lab)
    assets = {p.relative_to(src) for p in src.rglob("*") if p.is_file()
              and p.suffix != ".ipynb" and p.name != "wrong_submission.json"
              and ".ipynb_checkpoints" not in p.parts and "__pycache__" not in p.parts}
    missing = [str(a) for a in assets if not (rel / a).is_file()]
    assert not missing, f"{lab}: assets not released: {missing}"


# --- (a), (b), (c) ------------------------------------------------------------------------------
@pytest.mark.parametrize("lab", per_lab(ALL))
def test_a_source_gets_full_points_in_time(pipeline, lab):
    rec = pipeline.graded("source", lab)
    print(f"\n(a) {lab}: {rec.status}, notebook ran {rec.exec_seconds} s, "
          f"autograde {rec.seconds:.1f} s")
    assert rec.status == "ok", describe(rec)
    auto = [c for c in rec.cells if c.autograded]
    assert auto, describe(rec)
    lost = [c for c in auto if c.score != c.max_score]
    assert not lost, describe(rec)
    # every written answer of the source is a response: it waits for a grader, none is lost
    src = nbformat.read(str(pipeline.course.source(lab) / f"{lab}.ipynb"), as_version=4)
    written = [c.metadata["nbgrader"]["grade_id"] for c in src.cells
               if c.cell_type == "markdown" and c.metadata.get("nbgrader", {}).get("grade")]
    waiting = [c.grade_id for c in rec.cells if not c.autograded and c.score is None]
    assert sorted(waiting) == sorted(written), describe(rec)
    assert rec.exec_seconds is not None and rec.exec_seconds < MAX_SECONDS, \
        f"{lab} ran {rec.exec_seconds} s, the budget is {MAX_SECONDS} s"
    # graded, the source runs top to bottom as it does in JupyterLab: no cell fails
    graded = nbformat.read(str(pipeline.course.build / "autograded" / "source" / lab /
                               f"{lab}.ipynb"), as_version=4)
    failed = [(c.metadata.get("nbgrader", {}).get("grade_id", i), o.get("ename"), o.get("evalue"))
              for i, c in enumerate(graded.cells) if c.cell_type == "code"
              for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not failed, failed


@pytest.mark.parametrize("lab", per_lab(ALL))
def test_b_release_gets_zero_and_fails_fast(pipeline, lab):
    rec = pipeline.graded("release", lab)
    print(f"\n(b) {lab}: {rec.status}, notebook ran {rec.exec_seconds} s, "
          f"autograde {rec.seconds:.1f} s")
    assert rec.status == "ok", describe(rec)          # graded, not crashed or timed out
    auto = [c for c in rec.cells if c.autograded]
    assert auto and all(c.score == 0 for c in auto), describe(rec)
    # untouched written answers ("YOUR ANSWER HERE") score 0 at once: nothing to read
    assert all(c.score == 0 for c in rec.cells if not c.autograded), describe(rec)
    assert rec.exec_seconds < MAX_SECONDS, describe(rec)


@pytest.mark.parametrize("lab", per_lab(ALL))
def test_c_wrong_submission_loses_the_hidden_points(pipeline, lab):
    spec_path = pipeline.course.source(lab) / "wrong_submission.json"
    assert spec_path.is_file(), f"{spec_path.relative_to(pipeline.course.root)} is missing: " \
        "every lab describes a plausible wrong submission (see tests/test_pipeline.py)"
    spec = json.loads(spec_path.read_text())
    rec = pipeline.graded("wrong", lab)
    print(f"\n(c) {lab}: {rec.status}, notebook ran {rec.exec_seconds} s, "
          f"autograde {rec.seconds:.1f} s ({spec['description']})")
    assert rec.status == "ok", describe(rec)
    scores = {c.grade_id: c for c in rec.cells}
    for gid in spec["expect_lost"]:
        assert gid in scores, f"{lab}: expect_lost names {gid!r}, not a graded cell"
        c = scores[gid]
        assert c.score is not None and c.score < c.max_score, \
            f"{lab}: wrong submission kept the points of {gid}\n" + describe(rec)


# --- the command line on the dummy lab ----------------------------------------------------------
def _run(*args, cwd=REPO, timeout=900, env=None):
    return subprocess.run([sys.executable, "-m", "autograder", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def sandbox_flag() -> list[str]:
    """[] where the sandbox works (CI: test_the_sandbox_works_where_ci_runs), else
    ["--no-sandbox"], so a developer without bubblewrap can still run the pipeline."""
    from autograder.sandbox import sandbox_unavailable_reason
    return [] if sandbox_unavailable_reason() is None else ["--no-sandbox"]


@pytest.mark.xdist_group(f"pipeline_{DUMMY}")
def test_grade_command_survives_crashes_hangs_and_memory_hogs(pipeline, tmp_path):
    course = pipeline.course
    subs = tmp_path / "subs"
    src = nbformat.read(str(course.source(DUMMY) / f"{DUMMY}.ipynb"), as_version=4)
    solution = "def scale(logits, t):\n    return logits / t\n"
    bodies = {
        "good": solution,
        "crash": solution + "import os\nos._exit(1)",
        "hang": solution + "import time\nwhile True:\n    try:\n        time.sleep(1)\n"
                           "    except KeyboardInterrupt:\n        pass",
        "hog": "x = bytearray(2 << 30)\n" + solution,
    }
    for student, body in bodies.items():
        nb = nbformat.from_dict(json.loads(json.dumps(src)))
        nb.cells[2].source = body
        (subs / student / DUMMY).mkdir(parents=True)
        nbformat.write(nb, str(subs / student / DUMMY / f"{DUMMY}.ipynb"))
    jobs_tmp = tmp_path / "jobs_tmp"        # this run's jobs, apart from other workers' jobs
    jobs_tmp.mkdir()
    r = _run("grade", str(subs), "--root", str(course.root),
             "--cell-timeout", "6", "--notebook-timeout", "40", "--mem-gb", "1", *sandbox_flag(),
             env={"TMPDIR": str(jobs_tmp)})
    assert r.returncode == 0, r.stdout + r.stderr
    print(r.stdout)
    rows = {row["student_id"]: row for row in csv.DictReader(open(course.build / "grades.csv"))
            if row["assignment"] == DUMMY}
    assert float(rows["good"]["score"]) == 3.0
    assert float(rows["crash"]["score"]) == 0.0            # scale defined, then the kernel died
    assert float(rows["hang"]["score"]) == 0.0
    assert float(rows["hog"]["score"]) == 0.0              # MemoryError before `scale`
    table = r.stdout[r.stdout.index("student  lab"):]
    assert "kernel died" in table and "kernel unresponsive" in table
    assert (course.feedback("good", DUMMY) / f"{DUMMY}.html").is_file()
    assert (course.feedback("hog", DUMMY) / f"{DUMMY}.html").is_file()
    secrets = hidden_test_lines(course, DUMMY)
    assert secrets, "the dummy lab has hidden tests"
    for student in bodies:
        html = (course.feedback(student, DUMMY) / f"{DUMMY}.html").read_text()
        leaked = [line for line in secrets + ["BEGIN HIDDEN TESTS"] if line in html]
        assert not leaked, f"{student}'s feedback shows hidden tests: {leaked}"
        assert "hidden tests: not shown" in html
    assert_no_process_left_in(course.root, jobs_tmp)


def assert_no_process_left_in(root: Path, jobs_tmp: Path) -> None:
    """No job, sandbox or kernel (or anything else) still runs: nothing with its working
    directory in the course, and no process of a grading job made under `jobs_tmp` (the run's
    own temporary folder: other xdist workers grade at the same time in theirs)."""
    psutil = pytest.importorskip("psutil")
    left = []
    for proc in psutil.process_iter(["pid", "cwd", "cmdline", "status"]):
        if proc.info.get("status") == psutil.STATUS_ZOMBIE:
            continue
        cwd = proc.info.get("cwd") or ""
        cmd = " ".join(proc.info.get("cmdline") or [])
        if cwd.startswith((str(root), str(jobs_tmp))) or str(jobs_tmp) in cmd:
            left.append((proc.info["pid"], cwd, cmd[:200]))
    assert not left, f"processes left running after grading: {left}"


def test_the_sandbox_works_where_ci_runs():
    """CI (and any machine with bubblewrap) grades in the sandbox; without it the grade command
    refuses to run unless told --no-sandbox (tested below)."""
    from autograder.sandbox import sandbox_unavailable_reason
    why = sandbox_unavailable_reason()
    if os.environ.get("CI"):
        assert why is None, f"CI must grade in the sandbox (.ci/run installs bubblewrap): {why}"
    elif why is not None:
        pytest.skip(f"no sandbox on this machine: {why}")


def hidden_test_lines(course: Course, lab: str) -> list[str]:
    from autograder.feedback import secret_lines
    return secret_lines(nbformat.read(str(course.source(lab) / f"{lab}.ipynb"), as_version=4))


@pytest.mark.xdist_group(f"pipeline_{DUMMY}")
def test_grade_refuses_to_run_without_the_sandbox_unless_told(pipeline, tmp_path):
    course = pipeline.course
    subs = tmp_path / "subs"
    (subs / "nosandbox" / DUMMY).mkdir(parents=True)
    shutil.copy2(course.source(DUMMY) / f"{DUMMY}.ipynb", subs / "nosandbox" / DUMMY)
    missing = {"AUTOGRADER_BWRAP": str(tmp_path / "no-bwrap-here")}
    r = _run("grade", str(subs), "--root", str(course.root), "--no-feedback", env=missing)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "no sandbox" in r.stderr and "bubblewrap" in r.stderr and "--no-sandbox" in r.stderr
    assert "nosandbox" not in r.stdout                   # nothing was graded
    r = _run("grade", str(subs), "--root", str(course.root), "--no-feedback",
             "--no-sandbox", env=missing)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "WARNING: grading without the sandbox" in r.stdout
    assert "nosandbox  99_dummy  3" in r.stdout, r.stdout     # graded: full marks


@pytest.mark.xdist_group(f"pipeline_{DUMMY}")
def test_a_submission_killed_on_the_wall_clock_scores_zero(pipeline, tmp_path, monkeypatch):
    course = pipeline.course
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))    # this test's jobs go here
    nb = nbformat.read(str(course.source(DUMMY) / f"{DUMMY}.ipynb"), as_version=4)
    nb.cells[2].source = "import time\ntime.sleep(600)"
    pipeline.submit("sleeper", DUMMY, nb)
    rec = course.autograde("sleeper", DUMMY, wall_timeout=15)
    assert rec.status.startswith("killed"), describe(rec)
    assert [c.score for c in rec.cells if c.autograded] == [0, 0], describe(rec)
    assert_no_process_left_in(course.root, tmp_path)


@pytest.mark.xdist_group(f"pipeline_{DUMMY}")
def test_selfgrade_command_reports_each_cell_and_fails_without_full_marks(pipeline, tmp_path):
    course = pipeline.course
    nb = wrong_notebook(course.source(DUMMY))
    path = tmp_path / f"{DUMMY}.ipynb"
    nbformat.write(nb, str(path))
    before = sorted(p.name for p in course.build.iterdir())
    r = _run("selfgrade", str(path), "--root", str(course.root), "--mem-gb", "0")
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "99_scale_test" in out and "0 / 2" in out and "FAILED" in out
    assert "scale(x, 2)" in out and "elements differ" in out      # the assertion message
    assert "99_asset_test" in out and "1 / 1" in out
    assert sorted(p.name for p in course.build.iterdir()) == before   # build/ untouched


def test_selfgrade_full_marks_verdict():
    from autograder.records import CellScore, GradeRecord
    from autograder.selfgrade import report
    cells = [CellScore("t1", "nb", 2.0, 2.0, True), CellScore("q1", "nb", None, 1.0, False)]
    lines = []
    assert report(GradeRecord("me", "lab", "ok", 1.0, 1.0, cells), lines.append)
    assert "full marks" in lines[-1]
    cells[0].score = 1.0
    assert not report(GradeRecord("me", "lab", "ok", 1.0, 1.0, cells), lines.append)
    cells[0].score = 2.0
    assert not report(GradeRecord("me", "lab", "kernel died", 1.0, 1.0, cells), lines.append)


@pytest.mark.xdist_group(f"pipeline_{DUMMY}")
def test_a_submission_made_of_symbolic_links_is_never_followed(pipeline, tmp_path):
    """A notebook that is a link to the instructor's source (solutions and all), or a lab folder
    that is a link to labs/NN, would be graded as the instructor's work: the first is rejected
    (zero), the second skipped, and neither reaches a kernel."""
    course = pipeline.course
    source = course.source(DUMMY) / f"{DUMMY}.ipynb"
    subs = tmp_path / "subs"
    (subs / "linknb" / DUMMY).mkdir(parents=True)
    (subs / "linknb" / DUMMY / f"{DUMMY}.ipynb").symlink_to(source)
    (subs / "linkdir").mkdir(parents=True)
    (subs / "linkdir" / DUMMY).symlink_to(course.source(DUMMY), target_is_directory=True)
    r = _run("grade", str(subs), "--root", str(course.root), "--no-feedback",
             *sandbox_flag())
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"skipping {subs / 'linkdir' / DUMMY}: a symbolic link" in r.stdout, r.stdout
    rows = {row["student_id"]: row for row in csv.DictReader(open(course.build / "grades.csv"))
            if row["assignment"] == DUMMY}
    assert float(rows["linknb"]["score"]) == 0.0, r.stdout
    assert "rejected: 99_dummy.ipynb is a symbolic link" in r.stdout, r.stdout
    assert "linkdir" not in rows or float(rows["linkdir"]["score"]) == 0.0
