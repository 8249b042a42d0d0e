"""Fairness: correct submissions written in the styles real students use each earn exactly the
full automatic points, with status ok, graded in one batch as an instructor grades a class
(`grade_submissions(..., workers=2)`, sandboxed where this machine has bubblewrap).

A grader that zeroes an honest student is as wrong as one that can be cheated: torch.optim,
torch.compile, thread pools, NumPy, classes, caches, the student's own seeding, warnings
filters, extra cells, plots and floods of prints are the student's business. Each lab's styles
are in tests/fairness_lab00.py and tests/fairness_more.py. Each notebook runs up to its last autograded cell (the lab's
own measurements after it cannot change a verdict, and are graded elsewhere).
`FAIRNESS_ONLY=name,name` grades only those submissions.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import fairness_lab00
import fairness_more
import nbformat
import pytest
from test_pipeline import autograded_code_cells, without_the_tail

from autograder.course import Course
from autograder.grade import grade_submissions
from autograder.sandbox import sandbox_unavailable_reason

REPO = Path(__file__).resolve().parent.parent
SUBMISSIONS = fairness_lab00.SUBMISSIONS + fairness_more.SUBMISSIONS
_ONLY = [x for x in os.environ.get("FAIRNESS_ONLY", "").split(",") if x]
SELECTED = [s for s in SUBMISSIONS if not _ONLY or s.name in _ONLY]
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("fairness")]


def test_the_suite_covers_enough_styles_and_labs():
    assert len(SUBMISSIONS) >= 12 and len({s.lab for s in SUBMISSIONS}) >= 4
    assert len({s.name for s in SUBMISSIONS}) == len(SUBMISSIONS)


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    root = tmp_path_factory.mktemp("fair") / "course"
    root.mkdir()
    shutil.copy2(REPO / "nbgrader_config.py", root / "nbgrader_config.py")
    labs = sorted({s.lab for s in SELECTED})
    for lab in labs:
        shutil.copytree(REPO / "labs" / lab, root / "labs" / lab)
    course = Course(root)
    course.release(labs)
    subs = root / "incoming"
    for s in SELECTED:
        source = nbformat.read(str(course.source(s.lab) / f"{s.lab}.ipynb"), as_version=4)
        released = nbformat.read(str(course.release_dir(s.lab) / f"{s.lab}.ipynb"),
                                 as_version=4)
        nb = s.notebook(source, released)
        nb = without_the_tail(nb, autograded_code_cells(nb), "fairness suite")
        (subs / s.name / s.lab).mkdir(parents=True)
        nbformat.write(nb, str(subs / s.name / s.lab / f"{s.lab}.ipynb"))
    log: list[str] = []
    records = grade_submissions(course, subs, workers=2, feedback=False, log=log.append,
                                sandbox=sandbox_unavailable_reason() is None)
    return {r.student: r for r in records}, log


@pytest.mark.parametrize("student", [s.name for s in SELECTED])
def test_an_honest_style_earns_full_marks(graded, student):
    records, log = graded
    honest = next(s for s in SUBMISSIONS if s.name == student)
    rec = records[student]
    lost = [(c.grade_id, c.score, c.max_score, c.errors) for c in rec.cells
            if c.autograded and c.score != c.max_score]
    print(f"\n{student} ({honest.lab}): {honest.style}: {rec.status}, {rec.score:g}")
    assert rec.status == "ok" and not lost, (rec.status, lost, log[-5:])
