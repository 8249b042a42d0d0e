"""Copying detected, never scored (autograder/similarity.py): lab 00 answered by four students.
alice writes the notebook's own solutions, bob copies alice and renames her variables, carol
writes her own answers another way, dave pastes the course's reference from his install."""
from __future__ import annotations

import csv
import inspect
import re
import shutil
from pathlib import Path

import nbformat
import pytest

import minillm.sampling
from autograder.course import Course
from autograder.grade import format_table
from autograder.records import CellScore, GradeRecord
from autograder.similarity import compare

REPO = Path(__file__).resolve().parent.parent
LAB = "00_sampling"
pytestmark = pytest.mark.xdist_group("pipeline_00_sampling")

CAROL = {
    "00_apply_temperature": '''
def apply_temperature(logits, temperature):
    if not temperature > 0:
        raise ValueError("need a positive temperature")
    scaled = logits.clone()
    scaled.mul_(1.0 / temperature)
    return scaled
''',
    "00_top_k_filter": '''
def top_k_filter(logits, k):
    V = logits.size(-1)
    if k == 0 or k >= V:
        return logits
    values, _ = logits.sort(dim=-1, descending=True)
    cutoff = values.narrow(-1, k - 1, 1)
    out = logits.clone()
    out[logits < cutoff] = float("-inf")
    return out
''',
}


def solutions(nb) -> dict[str, str]:
    """grade id -> the solution cell's code without nbgrader's markers."""
    out = {}
    for c in nb.cells:
        m = c.metadata.get("nbgrader", {})
        if c.cell_type == "code" and m.get("solution"):
            out[m["grade_id"]] = "\n".join(line for line in c.source.splitlines()
                                           if "### BEGIN SOLUTION" not in line and
                                           "### END SOLUTION" not in line)
    return out


def renamed(code: str) -> str:
    for old, new in [("sorted_logits", "sl"), ("order", "idx"), ("probs", "pr"),
                     ("before", "cum_prev"), ("remove_sorted", "drop_s"), ("remove", "drop"),
                     ("kth", "threshold"), ("flat", "two_d"), ("new", "generated")]:
        code = re.sub(rf"\b{old}\b", new, code)
    return code


DAVE = {"00_apply_temperature": inspect.getsource(minillm.sampling)}     # the whole module


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    root = tmp_path_factory.mktemp("similar") / "course"
    root.mkdir()
    shutil.copy2(REPO / "nbgrader_config.py", root / "nbgrader_config.py")
    shutil.copytree(REPO / "labs" / LAB, root / "labs" / LAB)
    c = Course(root)
    c.release([LAB])
    source = solutions(nbformat.read(str(c.source(LAB) / f"{LAB}.ipynb"), as_version=4))
    answers = {"alice": source, "bob": {g: renamed(s) for g, s in source.items()},
               "carol": CAROL, "dave": DAVE}
    for student, cells in answers.items():
        nb = nbformat.read(str(c.release_dir(LAB) / f"{LAB}.ipynb"), as_version=4)
        for cell in nb.cells:
            gid = cell.metadata.get("nbgrader", {}).get("grade_id")
            if gid in cells:
                cell.source = cells[gid]
        dest = c.submitted(student, LAB)
        dest.mkdir(parents=True)
        nbformat.write(nb, str(dest / f"{LAB}.ipynb"))
    c.register_students(sorted(answers))
    return c


def test_copies_are_flagged_with_whom_and_own_work_is_not(course, tmp_path):
    archive = tmp_path / "2025"
    archive.mkdir()
    (archive / "old_student.py").write_text(CAROL["00_top_k_filter"])
    found = compare(course, [LAB], archive=archive, log=lambda *a: None)[LAB]
    assert set(found) == {"alice", "bob", "carol", "dave"}, found
    assert found["bob"]["with"] == "alice" and found["bob"]["score"] > 0.8, found
    assert found["alice"]["with"] == "bob", found
    assert found["dave"]["with"] == "course:minillm.sampling" and found["dave"]["score"] > 0.5, found
    assert found["carol"]["with"] == "archive:old_student.py" and found["carol"]["score"] > 0.4
    assert found["carol"]["score"] < found["bob"]["score"]
    report = (course.build / "similarity" / f"{LAB}.html").read_text()
    assert "alice" in report and "bob" in report


def test_the_csv_and_the_table_show_the_match_and_no_score_changes(course):
    compare(course, [LAB], log=lambda *a: None)
    rows = {r["student_id"]: r for r in csv.DictReader(open(course.export_csv()))}
    assert rows["bob"]["similar_to"] == "alice" and float(rows["bob"]["similarity"]) > 0.8
    assert all(float(r["score"]) == 0 for r in rows.values())
    rec = GradeRecord(student="bob", lab=LAB, status="ok", seconds=1.0, exec_seconds=1.0,
                      cells=[CellScore("00_top_k_test", LAB, 2.0, 2.0, True)])
    table = format_table([rec], course)
    assert table.splitlines()[0].split()[-1] == "similarity"
    assert re.search(r"ok\s+1\s+\d\.\d\d alice$", table.splitlines()[2]), table
