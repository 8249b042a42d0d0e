"""One command at a time on a course's build/ (Course.lock, issue 18).

`python -m autograder release`, `grade` and `report` hold build/.autograder.lock for their whole
run. A second command waits for the holder and names it (pid and command line), then gives up
with an error after AUTOGRADER_LOCK_WAIT seconds; a killed holder leaves no lock behind.
"""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from autograder.course import LOCK_FILE, Course

REPO = Path(__file__).resolve().parent.parent
HOLD = ("import sys\nfrom autograder.course import Course\n"
        "with Course(sys.argv[1]).lock(sys.argv[2]):\n"
        "    print('held', flush=True)\n"
        "    sys.stdin.readline()\n")


@pytest.fixture
def course(tmp_path) -> Course:
    shutil.copy2(REPO / "nbgrader_config.py", tmp_path / "nbgrader_config.py")
    (tmp_path / "labs").mkdir()
    return Course(tmp_path)


@pytest.fixture
def holder(course):
    """Another process holding the lock as `grade incoming --jobs 4`; a line on its stdin (or
    the end of the test) lets it go."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(course.root),
                             "grade incoming --jobs 4"], cwd=REPO, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=30)


def cli(course: Course, *args: str, wait: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autograder", *args, "--root", str(course.root)],
                          cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "AUTOGRADER_LOCK_WAIT": wait})


@pytest.mark.parametrize("command", [["release"], ["grade", "incoming"]])
def test_a_second_command_names_the_holder_and_gives_up(course, holder, command):
    r = cli(course, *command, wait="0.5")
    assert r.returncode == 2, r.stdout + r.stderr
    who = f"another autograder command (pid {holder.pid}, `grade incoming --jobs 4`, since "
    assert f"{who}" in r.stderr and "waiting for it to finish (up to 0.5 s" in r.stderr
    assert f"error: {who}" in r.stderr and f"holds {course.build} (waited 0.5 s)" in r.stderr
    assert f"`{shlex.join([*command, '--root', str(course.root)])}` did not run" in r.stderr
    assert not (course.build / "release").exists() and not (course.build / "grades.csv").exists()


def test_no_wait_refuses_at_once(course, holder):
    with pytest.raises(RuntimeError, match=rf"pid {holder.pid}, `grade incoming --jobs 4`.*"
                                           r"`release` did not run"):
        with course.lock("release", wait=0, log=pytest.fail):
            pass


def test_a_second_command_waits_for_the_holder(course, holder):
    said = []

    def log(msg):                   # told it waits: now the holder finishes
        said.append(msg)
        if len(said) == 1:
            holder.stdin.write("done\n")
            holder.stdin.flush()

    with course.lock("release 98_x", wait=60, log=log):
        assert holder.wait(timeout=30) == 0
        assert '"command": "release 98_x"' in (course.build / LOCK_FILE).read_text()
    assert said[0].startswith(f"another autograder command (pid {holder.pid}, ")
    assert said[0].endswith("waiting for it to finish (up to 60 s, AUTOGRADER_LOCK_WAIT) ...")
    assert said[1] == f"{course.build} is free: running `release 98_x`"
    assert (course.build / LOCK_FILE).read_text() == ""             # no stale holder


def test_a_killed_holder_leaves_no_lock(course, holder):
    holder.kill()
    holder.wait(timeout=30)
    r = cli(course, "release", wait="0")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "no labs in" in r.stdout and "another autograder command" not in r.stderr


def test_the_wait_must_be_seconds(course, monkeypatch):
    monkeypatch.setenv("AUTOGRADER_LOCK_WAIT", "soon")
    with pytest.raises(ValueError, match=r"AUTOGRADER_LOCK_WAIT must be a number of seconds "
                                         r"\(0: do not wait\), not 'soon'"):
        with course.lock("report"):
            pass
