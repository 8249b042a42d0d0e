"""A student's plots survive grading (issue 18): the kernel draws with Jupyter's inline backend.

A small lab is released in a temporary course and a submission that calls `plt.plot(...);
plt.show()` is graded, in the sandbox (where this machine has it) and without it, with
MPLBACKEND=Agg in the grader's environment (which used to reach the unsandboxed kernel and drop
every figure). The plot must be an image/png output of the autograded notebook (what formgrader
shows), an <img> in the student's feedback HTML, and in the notebook `selfgrade --keep` keeps.
"""
from __future__ import annotations

import base64
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook
from test_pipeline import _meta  # noqa: E402  (the nbgrader cell metadata the dummy lab uses)

from autograder.course import Course
from autograder.grade import grade_submissions
from autograder.sandbox import sandbox_unavailable_reason

REPO = Path(__file__).resolve().parent.parent
LAB = "97_plots"
PLOT = "import matplotlib.pyplot as plt\nplt.plot([0, 1, 2], [0, 1, 4])\nplt.show()"
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("graded_plots")]


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    root = tmp_path_factory.mktemp("plots_course")
    shutil.copy2(REPO / "nbgrader_config.py", root / "nbgrader_config.py")
    nb = new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nb.cells = [
        new_code_cell("def square(x):\n    ### BEGIN SOLUTION\n    return x * x\n"
                      "    ### END SOLUTION", metadata=_meta("97_square", solution=True)),
        new_code_cell("assert square(3) == 9", metadata=_meta("97_square_test", grade=True,
                                                              locked=True, points=1)),
    ]
    (root / "labs" / LAB).mkdir(parents=True)
    nbformat.write(nb, str(root / "labs" / LAB / f"{LAB}.ipynb"))
    course = Course(root)
    assert course.release() == [LAB]
    return course


def submit(course: Course, folder: Path) -> Path:
    """The released notebook with `square` written and a plot drawn in its cell."""
    nb = nbformat.read(str(course.release_dir(LAB) / f"{LAB}.ipynb"), as_version=4)
    nb.cells[0].source = "def square(x):\n    return x * x\n\n" + PLOT
    folder.mkdir(parents=True)
    path = folder / f"{LAB}.ipynb"
    nbformat.write(nb, str(path))
    return path


def assert_plotted(autograded: Path) -> None:
    nb = nbformat.read(str(autograded), as_version=4)
    outputs = nb.cells[0].get("outputs", [])
    pngs = [o["data"]["image/png"] for o in outputs if "image/png" in o.get("data", {})]
    assert len(pngs) == 1, f"no plot in the autograded notebook: {outputs}"
    assert base64.b64decode(pngs[0]).startswith(b"\x89PNG\r\n\x1a\n")


@pytest.mark.parametrize("sandbox", [True, False], ids=["sandbox", "no_sandbox"])
def test_plots_reach_the_autograded_notebook_and_the_feedback(course, tmp_path, monkeypatch,
                                                              sandbox):
    if sandbox and sandbox_unavailable_reason():
        pytest.skip(f"no sandbox on this machine: {sandbox_unavailable_reason()}")
    monkeypatch.setenv("MPLBACKEND", "Agg")         # the grader's own setting stays outside
    student = "boxed" if sandbox else "unboxed"
    submit(course, tmp_path / "incoming" / student / LAB)
    (rec,) = grade_submissions(course, tmp_path / "incoming", sandbox=sandbox,
                               log=lambda _msg: None)
    assert rec.status == "ok" and rec.score == 1.0
    assert_plotted(course.autograded(student, LAB) / f"{LAB}.ipynb")
    html = (course.feedback(student, LAB) / f"{LAB}.html").read_text()
    assert re.search(r'<img [^>]*src="data:image/png;base64,iVBORw0KGgo', html), \
        "no plot in the feedback HTML"


def test_selfgrade_keep_keeps_the_plot(course, tmp_path):
    """Without bubblewrap (a student's laptop) selfgrade runs the kernel in a plain child
    process: the path whose figures Agg used to drop."""
    notebook = submit(course, tmp_path / "mine")
    r = subprocess.run([sys.executable, "-m", "autograder", "selfgrade", str(notebook),
                        "--root", str(course.root), "--lab", LAB, "--keep"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=600,
                       env={**os.environ, "AUTOGRADER_BWRAP": "/nonexistent/bwrap",
                            "MPLBACKEND": "Agg"})
    assert r.returncode == 0, r.stdout + r.stderr
    m = re.search(r"kept the temporary course: (\S+) \(autograded notebook in (\S+)\)", r.stdout)
    assert m, r.stdout
    try:
        assert_plotted(Path(m.group(2)) / f"{LAB}.ipynb")
    finally:
        shutil.rmtree(m.group(1), ignore_errors=True)
