"""One nbgrader course on disk (nbgrader_config.py and labs/) and the nbgrader steps run on it,
each a child process in the root with `--CourseDirectory.root` (else nbgrader silently uses
./gradebook.db). `Course.lock`: one command at a time on build/ (autograder/README.md).
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import time
from pathlib import Path

from .processes import RunResult, package_parent, run_logged, subprocess_env
from .records import CellScore, GradeRecord

LAB_RE = re.compile(r"^\d\d_[A-Za-z0-9_]+$")
STUDENT_RE = re.compile(r"^[A-Za-z0-9_.@-]+$")
LOCK_FILE = ".autograder.lock"      # in build/: the command that holds it
LOCK_WAIT_ENV = "AUTOGRADER_LOCK_WAIT"
LOCK_WAIT_S = 600.0                 # a release of every lab, or a small grading batch
LOCK_POLL_S = 0.2


class Course:
    def __init__(self, root: str | Path):
        self.root = Path(root).resolve()
        if not (self.root / "nbgrader_config.py").is_file():
            raise FileNotFoundError(f"{self.root} has no nbgrader_config.py: not a course root")

    @classmethod
    def find(cls, start: str | Path | None = None) -> "Course":
        """`start` (or the working directory) or a parent, else the autograder package's."""
        here = Path(start or os.getcwd()).resolve()
        for d in [here, *here.parents, package_parent()]:
            if (d / "nbgrader_config.py").is_file() and (d / "labs").is_dir():
                return cls(d)
        raise FileNotFoundError("no course root (a directory with nbgrader_config.py and labs/) "
                                f"at or above {here}; pass --root")

    @property
    def build(self) -> Path:
        return self.root / "build"

    @property
    def db_url(self) -> str:
        return "sqlite:///" + str(self.build / "gradebook.db")

    def source(self, lab: str) -> Path:
        return self.root / "labs" / lab

    def release_dir(self, lab: str) -> Path:
        return self.build / "release" / lab

    def submitted(self, student: str, lab: str) -> Path:
        return self.build / "submitted" / student / lab

    def autograded(self, student: str, lab: str) -> Path:
        return self.build / "autograded" / student / lab

    def feedback(self, student: str, lab: str) -> Path:
        return self.build / "feedback" / student / lab

    def labs(self) -> list[str]:
        d = self.root / "labs"
        if not d.is_dir():
            return []
        return sorted(p.name for p in d.iterdir()
                      if p.is_dir() and LAB_RE.match(p.name) and (p / f"{p.name}.ipynb").is_file())

    def check_lab(self, lab: str) -> str:
        lab = lab.strip("/").split("/")[-1]
        if lab not in self.labs():
            raise ValueError(f"unknown lab {lab!r}; labs in {self.root / 'labs'}: {self.labs()}")
        return lab

    @contextlib.contextmanager
    def lock(self, command: str, *, wait: float | None = None, log=None):
        """Hold build/.autograder.lock (a `flock`) while `command` runs, waiting up to `wait` s
        for another holder (named), then RuntimeError. Not re-entrant."""
        wait = lock_wait_seconds() if wait is None else float(wait)
        log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.build.mkdir(parents=True, exist_ok=True)
        path = self.build / LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if not _try_flock(fd):
                deadline = time.monotonic() + wait
                if wait > 0:
                    log(f"{_lock_holder(path)} holds {self.build}; waiting for it to finish "
                        f"(up to {wait:g} s, {LOCK_WAIT_ENV}) ...")
                while not _try_flock(fd):
                    if time.monotonic() >= deadline:
                        raise RuntimeError(
                            f"{_lock_holder(path)} holds {self.build}"
                            + (f" (waited {wait:g} s)" if wait > 0 else "")
                            + f"; `{command}` did not run. Let that command finish (or stop "
                            f"it), then run this again; {LOCK_WAIT_ENV}=SECONDS sets how long "
                            "to wait")
                    time.sleep(LOCK_POLL_S)
                log(f"{self.build} is free: running `{command}`")
            os.ftruncate(fd, 0)
            os.write(fd, json.dumps({"pid": os.getpid(), "command": command,
                                     "since": time.strftime("%Y-%m-%d %H:%M:%S")}).encode())
            yield
        finally:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)     # while still held: a reader never sees a stale holder
            os.close(fd)                # releases the lock

    def nbgrader(self, *args: str, log: Path | None = None, timeout: float | None = None,
                 env_extra: dict | None = None) -> RunResult:
        cmd = [sys.executable, "-m", "nbgrader", *args, f"--CourseDirectory.root={self.root}"]
        self.build.mkdir(parents=True, exist_ok=True)
        return run_logged(cmd, cwd=self.root, log=log, timeout=timeout,
                          env=subprocess_env(env_extra))

    def gradebook(self):
        os.environ["PATH"] = subprocess_env()["PATH"]   # Gradebook runs `alembic` from PATH
        from nbgrader.api import Gradebook
        self.build.mkdir(parents=True, exist_ok=True)
        return Gradebook(self.db_url, "minillm")

    def release(self, labs: list[str] | None = None, *, missing_only: bool = False) -> list[str]:
        """`nbgrader generate_assignment --force` for each lab; `missing_only`: unreleased ones."""
        labs = [self.check_lab(x) for x in labs] if labs else self.labs()
        if missing_only and (self.build / "gradebook.db").is_file():
            with self.gradebook() as gb:
                registered = {a.name for a in gb.assignments}
            labs = [x for x in labs if x not in registered or
                    not (self.release_dir(x) / f"{x}.ipynb").is_file()]
        (self.build / "release").mkdir(parents=True, exist_ok=True)
        for lab in labs:
            self.step("generate_assignment", lab, "--force",
                      log=self.build / "logs" / f"release_{lab}.log",
                      makes=self.release_dir(lab) / f"{lab}.ipynb")
        return labs

    def step(self, command: str, lab: str, *args: str, log: Path | None = None,
             makes: Path | None = None) -> None:
        """`nbgrader COMMAND LAB ARGS`; RuntimeError with the log's tail unless it succeeds (and
        writes `makes`)."""
        log = log or self.build / "logs" / f"{command}_{lab}.log"
        r = self.nbgrader(command, lab, *args, log=log, timeout=600)
        if r.returncode != 0 or (makes is not None and not makes.is_file()):
            raise RuntimeError(f"nbgrader {command} {lab} failed (exit {r.returncode}); log "
                               f"{r.log}:\n{_tail(r.output)}")

    def register_students(self, students: list[str]) -> None:
        with self.gradebook() as gb:
            for s in students:
                gb.update_or_create_student(s)

    def autograde(self, student: str, lab: str, *, cell_timeout: int | None = None,
                  notebook_timeout: int | None = None, mem_bytes: int | None = None,
                  wall_timeout: float | None = None, sandbox: bool | None = None,
                  compile_cache: bool = False) -> GradeRecord:
        """Build, execute and record the job of one submission in build/submitted (`sandbox`
        None: if this machine has one; `compile_cache`: warm the lab's and give a copy)."""
        from . import jobs
        from .sandbox import sandbox_unavailable_reason
        if sandbox is None:
            sandbox = sandbox_unavailable_reason() is None
        job = jobs.build_job(self, student, lab, cell_timeout=cell_timeout,
                             notebook_timeout=notebook_timeout, mem_bytes=mem_bytes,
                             sandbox=sandbox)
        if compile_cache and not job.get("rejected"):
            from .compile_cache import warm
            job["compile_cache"] = warm(self, lab)
        if wall_timeout:
            job["limits"]["wall_timeout"] = wall_timeout
        return jobs.record(self, job, jobs.execute_job(job))

    def configured(self, name: str, default: int) -> int:
        """`c.<name> = N` in nbgrader_config.py (Execute.timeout, GuardedExecute.notebook_timeout)."""
        text = (self.root / "nbgrader_config.py").read_text()
        m = re.search(rf"\b{re.escape(name)}\s*=\s*(\d+)", text)
        return int(m.group(1)) if m else default

    def zero_submission(self, student: str, lab: str) -> None:
        """Every autograded test of this submission scores zero (stale scores too)."""
        with self.gradebook() as gb:
            gb.update_or_create_student(student)
            sub = gb.update_or_create_submission(lab, student)
            for nb in sub.notebooks:
                for grade in nb.grades:
                    if grade.cell.cell_type == "code":      # a test (no lab grades code by hand)
                        grade.auto_score = 0.0
                        grade.needs_manual_grade = False
            gb.db.commit()

    def scores(self, student: str, lab: str) -> list[CellScore]:
        """Per graded cell: score (None = manual), max, autograded or not, and its errors."""
        from nbgrader.api import MissingEntry
        out: list[CellScore] = []
        with self.gradebook() as gb:
            try:
                sub = gb.find_submission(lab, student)
            except MissingEntry:
                return out
            for nb in sub.notebooks:
                errors = _cell_errors(self.autograded(student, lab) / f"{nb.name}.ipynb")
                for grade in nb.grades:
                    auto = grade.cell.cell_type == "code"
                    score = grade.manual_score if grade.manual_score is not None \
                        else grade.auto_score
                    out.append(CellScore(grade_id=grade.name, notebook=nb.name,
                                         score=None if score is None else float(score),
                                         max_score=float(grade.max_score), autograded=auto,
                                         errors=errors.get(grade.name, [])))
        order = {gid: i for i, gid in enumerate(self.grade_ids_in_order(lab))}
        out.sort(key=lambda c: (c.notebook, order.get(c.grade_id, 10 ** 6), c.grade_id))
        return out

    def grade_ids_in_order(self, lab: str) -> list[str]:
        import nbformat
        ids = []
        for path in sorted(self.source(lab).glob("*.ipynb")):
            nb = nbformat.read(str(path), as_version=4)
            ids += [c.metadata.get("nbgrader", {}).get("grade_id") for c in nb.cells]
        return [x for x in ids if x]

    def export_csv(self) -> Path:
        path = self.build / "grades.csv"
        r = self.nbgrader("export", f"--to={path}", log=self.build / "logs" / "export.log",
                          timeout=600)
        if r.returncode != 0:
            raise RuntimeError(f"nbgrader export failed; log {r.log}:\n{_tail(r.output)}")
        return path

    def generate_feedback(self, lab: str, hidden_tests: bool = False) -> RunResult:
        hidden = {"AUTOGRADER_FEEDBACK_HIDDEN": "1"} if hidden_tests else None
        return self.nbgrader("generate_feedback", lab, "--force", timeout=600, env_extra=hidden,
                             log=self.build / "logs" / f"feedback_{lab}.log")


def lock_wait_seconds() -> float:
    if not (text := os.environ.get(LOCK_WAIT_ENV, "").strip()):
        return LOCK_WAIT_S
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{LOCK_WAIT_ENV} must be a number of seconds (0: do not wait), "
                         f"not {text!r}") from None
    if not value >= 0:
        raise ValueError(f"{LOCK_WAIT_ENV} must be 0 or more seconds, not {text!r}")
    return value


def _try_flock(fd: int) -> bool:
    import fcntl  # POSIX only, like the rest of the grader
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def _lock_holder(path: Path) -> str:
    """'another autograder command (pid N, `release 00_sampling`, since ...)'."""
    try:
        info = json.loads(path.read_text() or "{}")
        what = [f"pid {int(info['pid'])}", f"`{info['command']}`", f"since {info['since']}"]
    except (OSError, ValueError, KeyError, TypeError):
        what = ["pid unknown"]
    return f"another autograder command ({', '.join(what)})"


def _cell_errors(path: Path) -> dict[str, list[str]]:
    """grade_id -> the error outputs (and stderr) of that cell."""
    import nbformat
    try:
        nb = nbformat.read(str(path), as_version=4)
    except Exception:                   # none (or unreadable)
        return {}
    out: dict[str, list[str]] = {}
    for cell in nb.cells:
        gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if not gid or cell.cell_type != "code":
            continue
        msgs = []
        for o in cell.get("outputs", []):
            if o.get("output_type") == "error":
                evalue = str(o.get("evalue", "")).strip()
                msgs.append(f"{o.get('ename')}: {evalue}" if evalue else str(o.get("ename")))
            elif o.get("output_type") == "stream" and o.get("name") == "stderr":
                text = "".join(o.get("text", "")).strip()
                msgs.append("output on stderr (nbgrader scores it as a failure): "
                            + _tail(text, 300))
        if msgs:
            out[gid] = msgs
    return out


def _tail(text: str, n: int = 2000) -> str:
    return text if len(text) <= n else "..." + text[-n:]
