"""Running a class (autograder/collect.py, autograder/deadlines.py): submissions arrive through
nbgrader's exchange or an LMS zip, with no layout done by hand, are graded, and late work loses
what nbgrader_config.py's PerDayPenalty says (10 % per started day, at most 50 %)."""
import csv
import io
import os
import subprocess
import sys
import zipfile
from datetime import datetime, timedelta, timezone
from pathlib import Path

import nbformat
import pytest
from test_pipeline import DUMMY, dummy_course

from autograder import collect, deadlines
from autograder.grade import grade_submissions

pytestmark = pytest.mark.slow          # grades notebooks in the sandbox

RIGHT, WRONG = "return logits / t", "return logits * t"
FULL = 3.0                              # 99_scale_test 2 + 99_asset_test 1; wrong keeps the 1


def answered(released: Path, answer: str) -> str:
    """The released notebook with the student's `scale` written in."""
    nb = nbformat.read(str(released), as_version=4)
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == "99_scale":
            cell.source = f"def scale(logits, t):\n    {answer}\n"
    return nbformat.writes(nb)


def grade_all(course) -> tuple[dict, list[str]]:
    log: list[str] = []
    grade_submissions(course, course.build / "submitted", workers=2, cell_timeout=20,
                      notebook_timeout=90, mem_gb=2, feedback=False, log=log.append)
    rows = csv.DictReader(io.StringIO((course.build / "grades.csv").read_text()))
    return {r["student_id"]: r for r in rows}, log


def ago(**kw) -> str:
    return f"{datetime.now(timezone.utc) - timedelta(**kw):%Y-%m-%d %H:%M:%S} UTC"


def instructor(course, *args: str) -> str:
    """`python -m autograder ARGS --root COURSE`, what the Makefile's targets run."""
    r = subprocess.run([sys.executable, "-m", "autograder", *args, "--root", str(course.root)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_two_students_through_the_exchange_to_the_csv_with_a_deadline(tmp_path):
    """README, "Running a class", on a hub: release, deadline, extend, collect, grade."""
    course, exchange = dummy_course(tmp_path / "course"), tmp_path / "exchange"
    instructor(course, "release", DUMMY, "--exchange", str(exchange))

    def student(name: str, *args: str):
        home = tmp_path / "home" / name                   # each student a home of their own
        home.mkdir(parents=True, exist_ok=True)
        r = subprocess.run([sys.executable, "-m", "nbgrader", *args, f"--Exchange.root={exchange}",
                            "--CourseDirectory.course_id=minillm"], cwd=home, text=True,
                           capture_output=True, env={**os.environ, "HOME": str(home)})
        assert r.returncode == 0, r.stdout + r.stderr
        return home / DUMMY / f"{DUMMY}.ipynb"

    for name, answers in (("alice", [RIGHT]), ("bob", [WRONG, RIGHT])):
        mine = student(name, "fetch_assignment", DUMMY)
        released = mine.read_text()
        for answer in answers:                            # bob hands in twice: the last counts
            mine.write_text(answered(mine, answer))
            student(name, "submit", DUMMY, f"--student={name}")
            mine.write_text(released)
    instructor(course, "deadline", DUMMY, ago(hours=30))    # everyone is 2 started days late
    instructor(course, "extend", DUMMY, "alice", "--days", "3")       # ... except alice
    out = instructor(course, "collect", DUMMY, "--exchange", str(exchange))
    assert f"{DUMMY}: 2 submission(s)" in out and "(alice, bob)" in out, out
    assert (course.submitted("bob", DUMMY) / "timestamp.txt").is_file()
    instructor(course, "grade", str(course.build / "submitted"), "--jobs", "2", "--no-feedback",
               "--cell-timeout", "20", "--notebook-timeout", "90", "--mem-gb", "2")
    rows = {r["student_id"]: r for r in
            csv.DictReader(io.StringIO((course.build / "grades.csv").read_text()))}
    alice, bob = rows["alice"], rows["bob"]
    assert float(alice["raw_score"]) == FULL and float(alice["score"]) == FULL, alice
    assert float(alice["late_submission_penalty"]) == 0 and alice["seconds_late"] == "0", alice
    assert float(bob["raw_score"]) == FULL, f"bob's second (right) hand-in must count: {bob}"
    assert 30 * 3600 - 600 < int(bob["seconds_late"]) < 31 * 3600, bob
    assert float(bob["late_submission_penalty"]) == pytest.approx(0.2 * FULL), bob
    assert float(bob["score"]) == pytest.approx(0.8 * FULL), bob


def canvas_zip(path: Path, released: Path, due: datetime) -> None:
    """A Canvas-style download: two students (one late, re-uploaded; one with an older hand-in
    too), a stray file, a notebook that is no student's; each entry dated when it was handed
    in."""
    earlier, before, after = ((due + timedelta(hours=h)).timetuple()[:6] for h in (-3, -1, 50))
    with zipfile.ZipFile(path, "w") as z:
        for name, when, text in (
                (f"carolsmith_12345_678901_{DUMMY}.ipynb", before, answered(released, RIGHT)),
                (f"carolsmith_12345_600000_{DUMMY}.ipynb", earlier, answered(released, WRONG)),
                (f"danjones_LATE_23456_789012_{DUMMY}-1.ipynb", after, answered(released, WRONG)),
                ("README.txt", before, "downloaded from the LMS"),
                ("notes.ipynb", before, answered(released, RIGHT))):
            z.writestr(zipfile.ZipInfo(name, date_time=when), text)


def test_an_lms_zip_to_the_csv_with_its_dates_and_nothing_dropped_in_silence(tmp_path):
    course = dummy_course(tmp_path / "course")
    due = datetime(2026, 11, 20, 17, 0, tzinfo=timezone.utc)
    deadlines.set_due(course, DUMMY, "2026-11-20 17:00 UTC")
    canvas_zip(tmp_path / "submissions.zip", course.release_dir(DUMMY) / f"{DUMMY}.ipynb", due)
    log: list[str] = []
    found = collect.collect_zip(course, DUMMY, tmp_path / "submissions.zip", zip_dates=True,
                                log=log.append)
    assert found == [("carolsmith", DUMMY), ("danjones", DUMMY)], log
    reported = "\n".join(log)
    assert "not collected: README.txt" in reported and "not collected: notes.ipynb" in reported
    assert "carolsmith: 2 files; collected the newest in the zip, carolsmith_12345_678901_" \
        in reported, reported

    rows, _ = grade_all(course)
    carol, dan = rows["carolsmith"], rows["danjones"]
    assert float(carol["score"]) == FULL and carol["seconds_late"] == "0", carol
    assert dan["seconds_late"] == str(50 * 3600), dan                   # 3 started days
    assert float(dan["raw_score"]) == 1.0 and float(dan["late_submission_penalty"]) == \
        pytest.approx(0.3), dan


def test_bad_input_is_refused_by_name(tmp_path):
    course = dummy_course(tmp_path / "course")
    with pytest.raises(ValueError, match="cannot read the date"):
        deadlines.set_due(course, DUMMY, "next friday-ish")
    with pytest.raises(ValueError, match="student ids"):
        deadlines.extend(course, DUMMY, "../eve", days=1)
    with pytest.raises(ValueError, match="negative"):
        deadlines.extend(course, DUMMY, "eve", days=-1)
    (tmp_path / "x.zip").write_text("not a zip")
    with pytest.raises(ValueError, match="not a zip file"):
        collect.collect_zip(course, DUMMY, tmp_path / "x.zip")
    with pytest.raises(ValueError, match="student_id"):
        collect.collect_zip(course, DUMMY, _empty_zip(tmp_path), pattern=r".*/(?P<who>\w+)")
    with pytest.raises(FileNotFoundError, match="release to it first"):
        collect.collect_exchange(course, [DUMMY], tmp_path / "nowhere")
    r = subprocess.run([sys.executable, "-m", "autograder", "collect", "--root", str(course.root)],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "--exchange DIR or --zip FILE" in r.stderr, r.stderr


def _empty_zip(tmp_path: Path) -> Path:
    path = tmp_path / "empty.zip"
    zipfile.ZipFile(path, "w").close()
    return path


def test_the_makefile_targets_run_those_commands():
    """The README's `make` lines are the commands the tests above run."""
    def dry(*args: str) -> str:
        r = subprocess.run(["make", "-n", *args], capture_output=True, text=True,
                           cwd=Path(__file__).resolve().parents[1])
        assert r.returncode == 0, r.stderr
        return " ".join(r.stdout.replace("\\\n", " ").split())
    assert "-m autograder release 00_sampling --exchange \"/x\"" in \
        dry("release", "EXCHANGE=/x", "LABS=00_sampling")
    assert "-m autograder collect --exchange \"/x\"" in dry("collect", "EXCHANGE=/x")
    assert "-m autograder collect 00_sampling --zip \"s.zip\" --zip-dates" in \
        dry("collect", "ZIP=s.zip", "LAB=00_sampling", "ZIP_DATES=1")
    assert "-m autograder deadline 00_sampling \"2026-12-04 17:00 UTC\"" in \
        dry("deadline", "LAB=00_sampling", "DUE=2026-12-04 17:00 UTC")
    assert "-m autograder extend 00_sampling alice --days 2 --hours 0" in \
        dry("extend", "LAB=00_sampling", "STUDENT=alice", "DAYS=2")
    assert "-m autograder grade \"build/submitted\"" in dry("grade")
