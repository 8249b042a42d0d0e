"""Written answers, graded by hand, end to end through nbgrader's own gradebook API (issue 21).

A small lab with one autograded test and two written answers (markdown grade + solution cells,
the shape every lab's questions have) is released and graded in a temporary course:

  1. `grade` scores the tests and leaves the written answers "to grade by hand" (a blank answer
     scores 0 at once: nothing to read), in the table and in the CSV;
  2. a grader scores them and comments, as formgrader does, through `nbgrader.api.Gradebook`;
  3. `report` rewrites the CSV (automatic and written points apart, the totals add up) and the
     feedback;
  4. grading the batch again keeps the grader's scores and comments;
  5. the feedback shows each written answer's score and the grader's comment, never the model
     answer or the rubric.
"""
from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from autograder.course import Course
from autograder.grade import format_table, grade_submissions, report

REPO = Path(__file__).resolve().parent.parent
LAB = "98_written"
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("manual_grading")]
MODEL = "The cache stores K and V of every past token"
# A submission that attacks the grader's browser: formgrader renders answers and outputs.
XSS_ANSWER = "K and V <script>window.pwned_by_answer = 1</script><img src=x onerror=pwned_img()>"
XSS_CODE = ("def double(x):\n    return x + x\n"
            "from IPython.display import HTML, Javascript, display\n"
            "display(HTML('<script>window.pwned_by_output = 1</script><b>bold</b>'))\n"
            "display(Javascript('window.pwned_by_js = 1'))")
RUBRIC = "- 1 point: names K and V"


def _meta(grade_id, grade=False, solution=False, locked=False, points=None):
    m = {"schema_version": 3, "grade": grade, "solution": solution, "locked": locked,
         "grade_id": grade_id, "task": False}
    if points is not None:
        m["points"] = points
    return {"nbgrader": m}


def answer(text: str) -> str:
    return f"### BEGIN SOLUTION\n**Model answer.** {text}\n\n**Rubric (2 points).**\n{RUBRIC}\n" \
           "- 1 point: says why\n### END SOLUTION"


def write_lab(folder: Path) -> None:
    nb = new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nb.cells = [
        new_markdown_cell("# Written answers", metadata=_meta("98_intro", locked=True)),
        new_code_cell("def double(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n"
                      "    ### END SOLUTION", metadata=_meta("98_double", solution=True)),
        new_code_cell("assert double(3) == 6", metadata=_meta("98_double_test", grade=True,
                                                              locked=True, points=1)),
        new_markdown_cell("**Q1. The cache.** What does a KV cache store?",
                          metadata=_meta("98_md_q1", locked=True)),
        new_markdown_cell(answer(MODEL), metadata=_meta("98_q1", grade=True, solution=True,
                                                       points=2)),
        new_markdown_cell("**Q2. Memory.** Why does it grow with the batch?",
                          metadata=_meta("98_md_q2", locked=True)),
        new_markdown_cell(answer("Each sequence has its own past."),
                          metadata=_meta("98_q2", grade=True, solution=True, points=2)),
    ]
    folder.mkdir(parents=True)
    nbformat.write(nb, str(folder / f"{LAB}.ipynb"))


def submission(course: Course, answers: dict[str, str]) -> nbformat.NotebookNode:
    """The released notebook with the function written and `answers` (grade id -> text)."""
    nb = nbformat.read(str(course.release_dir(LAB) / f"{LAB}.ipynb"), as_version=4)
    for c in nb.cells:
        gid = c.metadata.get("nbgrader", {}).get("grade_id")
        if gid == "98_double":
            c.source = answers.get(gid, "def double(x):\n    return x + x")
        elif gid in answers:
            c.source = answers[gid]
    return nb


def rows(path: Path) -> dict[str, dict]:
    with open(path, newline="") as fh:
        return {r["student_id"]: r for r in csv.DictReader(fh)}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    root = tmp_path_factory.mktemp("written_course")
    shutil.copy2(REPO / "nbgrader_config.py", root / "nbgrader_config.py")
    write_lab(root / "labs" / LAB)
    course = Course(root)
    assert course.release() == [LAB]
    released = (course.release_dir(LAB) / f"{LAB}.ipynb").read_text()
    assert MODEL not in released and RUBRIC not in released and "YOUR ANSWER HERE" in released
    subs = root / "incoming"
    for student, answers in (("alice", {"98_q1": "Keys and values of past tokens.",
                                        "98_q2": "One cache per sequence."}),
                             ("bob", {"98_q1": "The weights."}),            # Q2 left blank
                             ("mallory", {"98_q1": XSS_ANSWER, "98_double": XSS_CODE})):
        d = subs / student / LAB
        d.mkdir(parents=True)
        nbformat.write(submission(course, answers), str(d / f"{LAB}.ipynb"))
    log: list[str] = []
    records = grade_submissions(course, subs, log=log.append)
    return course, subs, {r.student: r for r in records}, log


def test_grading_leaves_written_answers_to_a_grader(graded):
    course, _subs, recs, log = graded
    for r in recs.values():
        assert r.status == "ok"
        assert [c.score for c in r.cells if c.autograded] == [1.0]
    alice = {c.grade_id: c.score for c in recs["alice"].cells if not c.autograded}
    bob = {c.grade_id: c.score for c in recs["bob"].cells if not c.autograded}
    assert alice == {"98_q1": None, "98_q2": None}                # to grade by hand
    assert bob == {"98_q1": None, "98_q2": 0.0}                   # a blank answer: 0 at once
    table = format_table(list(recs.values()))
    assert "to grade" in table and "4 written answer(s) need manual grading" in table
    assert table in "\n".join(log)
    r = rows(course.build / "grades.csv")
    assert r["alice"]["to_grade_by_hand"] == "2" and r["bob"]["to_grade_by_hand"] == "1"
    assert float(r["alice"]["auto_score"]) == 1.0 and float(r["alice"]["auto_max_score"]) == 1.0
    assert float(r["alice"]["written_max_score"]) == 4.0
    assert float(r["alice"]["score"]) == 1.0 and float(r["alice"]["max_score"]) == 5.0


def grade_by_hand(course: Course, student: str, scores: dict[str, tuple[float, str]]) -> None:
    """What a grader does in formgrader, through the same gradebook API formgrader uses."""
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{course.build / 'gradebook.db'}", "minillm") as gb:
        for gid, (score, comment) in scores.items():
            gb.find_grade(gid, LAB, LAB, student).manual_score = score
            gb.find_comment(gid, LAB, LAB, student).manual_comment = comment
        gb.db.commit()


def test_manual_scores_count_survive_a_regrade_and_reach_the_feedback(graded):
    course, subs, _recs, _log = graded
    grade_by_hand(course, "alice", {"98_q1": (2.0, "Right: keys and values."),
                                    "98_q2": (1.0, "Say *why* it grows: B copies of S x K x H.")})
    grade_by_hand(course, "bob", {"98_q1": (0.0, "No: the weights are not cached.")})
    grade_by_hand(course, "mallory", {"98_q1": (1.0, "K and V, yes.")})
    out: list[str] = []
    report(course, log=out.append)                          # `python -m autograder report`
    assert "need manual grading" not in "\n".join(out) and "3/4" in "\n".join(out)
    assert "Right: keys and values." in \
        (course.build / "feedback" / "alice" / LAB / f"{LAB}.html").read_text()
    r = rows(course.build / "grades.csv")
    assert r["alice"]["to_grade_by_hand"] == "0" and r["bob"]["to_grade_by_hand"] == "0"
    assert float(r["alice"]["written_score"]) == 3.0 and float(r["alice"]["score"]) == 4.0
    assert float(r["bob"]["written_score"]) == 0.0 and float(r["bob"]["score"]) == 1.0

    log: list[str] = []
    again = {x.student: x for x in grade_submissions(course, subs, log=log.append)}
    written = {c.grade_id: c.score for c in again["alice"].cells if not c.autograded}
    assert written == {"98_q1": 2.0, "98_q2": 1.0}, "a regrade lost the grader's scores"
    assert "need manual grading" not in "\n".join(log)
    assert float(rows(course.build / "grades.csv")["alice"]["score"]) == 4.0

    html = (course.build / "feedback" / "alice" / LAB / f"{LAB}.html").read_text()
    assert "Say <em>why</em> it grows" in html and "Right: keys and values." in html
    assert "Keys and values of past tokens." in html                  # the student's answer
    assert MODEL not in html and "Rubric" not in html
    bob_html = (course.build / "feedback" / "bob" / LAB / f"{LAB}.html").read_text()
    assert "No: the weights are not cached." in bob_html


def test_the_source_answers_wait_for_a_grader_in_the_pipeline_shape(graded):
    """What tests/test_pipeline.py (a) checks on every lab: a source notebook's written answers
    are responses, so they wait for a grader (none scored 0 by nbgrader)."""
    course, _subs, _recs, _log = graded
    src = nbformat.read(str(course.source(LAB) / f"{LAB}.ipynb"), as_version=4)
    dest = course.submitted("source", LAB)
    dest.mkdir(parents=True)
    nbformat.write(src, str(dest / f"{LAB}.ipynb"))
    rec = course.autograde("source", LAB)
    assert [c.score for c in rec.cells if not c.autograded] == [None, None]
    assert json.dumps([c.grade_id for c in rec.cells]) == \
        json.dumps(["98_double_test", "98_q1", "98_q2"])


def test_selfgrade_answers_shows_model_answers_only_for_written_ones(graded, tmp_path):
    """`selfgrade --answers`: the model answer and rubric of each answer the student wrote,
    nothing for a blank one; the release holds neither."""
    import subprocess
    import sys
    course, subs, _recs, _log = graded
    bob = subs / "bob" / LAB / f"{LAB}.ipynb"
    r = subprocess.run([sys.executable, "-m", "autograder", "selfgrade", str(bob), "--answers",
                        "--root", str(course.root), "--lab", LAB], capture_output=True,
                       text=True, timeout=600)
    out = r.stdout
    assert r.returncode == 0, out + r.stderr                  # the test part has full marks
    assert "98_q1 (2 points) ==" in out and "The weights." in out and MODEL in out
    assert RUBRIC in out and "BEGIN SOLUTION" not in out
    assert "98_q2 (2 points): not shown" in out and "Each sequence has its own past" not in out
    from autograder.selfgrade import written_answers
    released = course.release_dir(LAB) / f"{LAB}.ipynb"
    assert [a["answer"] for a in written_answers(released, course.source(LAB) /
                                                 f"{LAB}.ipynb")] == [None, None]


def test_no_html_or_script_from_a_submission_reaches_a_grader(graded):
    """What formgrader renders (the autograded notebook) and the feedback hold mallory's text
    and outputs, inert: no tag of hers, no HTML or JavaScript output."""
    course, _subs, recs, _log = graded
    assert [c.score for c in recs["mallory"].cells if c.autograded] == [1.0]
    nb = nbformat.read(str(course.autograded("mallory", LAB) / f"{LAB}.ipynb"), as_version=4)
    import json
    text = json.dumps([c.source for c in nb.cells if c.cell_type == "markdown"] +
                      [c.get("outputs", []) for c in nb.cells if c.cell_type == "code"])
    answer = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "98_q1")
    assert answer.source.startswith("K and V &lt;script>")        # still readable, no tag
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    mimes = {m for o in outputs for m in o.get("data", {})}
    assert mimes <= {"text/plain", "image/png", "image/jpeg"}, mimes
    assert "<script>window.pwned" not in text and "<img src=x" not in text
    html = (course.build / "feedback" / "mallory" / LAB / f"{LAB}.html").read_text()
    for bad in ("<script>window.pwned", "<img src=x onerror"):
        assert bad not in html, bad
    assert html.count("window.pwned_by_js = 1") == 1          # in her code, shown as text only
