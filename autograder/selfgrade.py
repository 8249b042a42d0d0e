"""`python -m autograder selfgrade NOTEBOOK`: grade your own notebook as `grade` would, hidden
tests included, in a temporary course (autograder/README.md, "Students and self-learners").
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from .course import Course
from .grade import resolve_mem_bytes

STUDENT = "selfgrader"


def guess_lab(course: Course, notebook: Path) -> str:
    labs = course.labs()
    for name in (notebook.stem, notebook.parent.name):
        if name in labs:
            return name
    for lab in labs:                                   # "00_sampling-Copy1.ipynb" and the like
        if notebook.stem.startswith(lab):
            return lab
    raise ValueError(f"cannot tell which lab {notebook} is (labs: {labs}); pass --lab")


def selfgrade(notebook: str | Path, *, lab: str | None = None, root: str | Path | None = None,
              cell_timeout: int | None = None, notebook_timeout: int | None = None,
              mem_gb: float | None = None, keep: bool = False, answers: bool = False,
              log=print):
    """Autograde `notebook` in a temporary course; returns (GradeRecord, full_marks: bool)."""
    notebook = Path(notebook).resolve()
    if not notebook.is_file():
        raise FileNotFoundError(f"no notebook {notebook}")
    repo = Course(root) if root else Course.find(notebook.parent)
    lab = repo.check_lab(lab) if lab else guess_lab(repo, notebook)
    tmp = Path(tempfile.mkdtemp(prefix=f"selfgrade_{lab}_"))
    try:
        shutil.copy2(repo.root / "nbgrader_config.py", tmp / "nbgrader_config.py")
        shutil.copytree(repo.source(lab), tmp / "labs" / lab,
                        ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
        course = Course(tmp)
        log(f"self-grading {notebook} as lab {lab} (temporary course {tmp}) ...")
        course.release([lab])
        sources = sorted(course.source(lab).glob("*.ipynb"))
        name = notebook.name if (course.source(lab) / notebook.name).is_file() or \
            len(sources) != 1 else sources[0].name
        dest = course.submitted(STUDENT, lab)
        dest.mkdir(parents=True)
        shutil.copy2(notebook, dest / name)
        rec = course.autograde(STUDENT, lab, cell_timeout=cell_timeout,
                               notebook_timeout=notebook_timeout,
                               mem_bytes=resolve_mem_bytes(mem_gb, log))
        full = report(rec, log)
        if answers:
            show_answers(notebook, course.source(lab) / name, log)
        if keep:
            log(f"kept the temporary course: {tmp} (autograded notebook in "
                f"{course.autograded(STUDENT, lab)})")
        return rec, full
    finally:
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)


def report(rec, log=print) -> bool:
    width = max([len(c.grade_id) for c in rec.cells] + [8])
    auto_got = auto_max = 0.0
    full = rec.status == "ok" and bool(rec.cells)
    for c in rec.cells:
        if not c.autograded:
            got = "-" if c.score is None else f"{c.score:g}"
            log(f"  {c.grade_id.ljust(width)}  {got:>4} / {c.max_score:<4g} graded by hand")
            continue
        score = c.score or 0.0
        auto_got += score
        auto_max += c.max_score
        ok = c.score is not None and score >= c.max_score
        full &= ok
        verdict = "ok" if ok else ("not graded (cell missing?)" if c.score is None else "FAILED")
        log(f"  {c.grade_id.ljust(width)}  {score:>4g} / {c.max_score:<4g} {verdict}")
        if not ok:
            for err in c.errors or ["(no error message: the cell printed nothing)"]:
                for line in err.splitlines()[:12]:
                    log(f"      {line}")
    status = "" if rec.status == "ok" else f" [{rec.status}; see {rec.log}]"
    secs = f"{rec.exec_seconds:.0f}" if rec.exec_seconds is not None else f"{rec.seconds:.0f}"
    log(f"autograded: {auto_got:g} / {auto_max:g} in {secs} s{status}"
        + (" -- full marks" if full else ""))
    return full


STUB = "YOUR ANSWER HERE"
SOLUTION_LINES = ("### BEGIN SOLUTION", "### END SOLUTION")


def written_answers(notebook: str | Path, source: str | Path) -> list[dict]:
    """Per written answer cell: grade id, points, the student's text (None if blank) and the
    model answer with its rubric."""
    import nbformat
    mine = {c.metadata.get("nbgrader", {}).get("grade_id"): c.source
            for c in nbformat.read(str(notebook), as_version=4).cells}
    out = []
    for c in nbformat.read(str(source), as_version=4).cells:
        meta = c.metadata.get("nbgrader", {})
        if c.cell_type != "markdown" or not (meta.get("grade") and meta.get("solution")):
            continue
        text = (mine.get(meta["grade_id"]) or "").strip()
        model = "\n".join(line for line in c.source.strip().splitlines()
                          if line.strip() not in SOLUTION_LINES).strip()
        out.append({"grade_id": meta["grade_id"], "points": meta.get("points", 0),
                    "answer": None if not text or text == STUB else text, "model": model})
    return out


def show_answers(notebook: Path, source: Path, log=print) -> int:
    """Print the model answer and rubric of each written answer written; returns how many."""
    shown = 0
    log("")
    log("Written answers: the model answer and the grader's rubric, beside your own")
    for a in written_answers(notebook, source):
        head = f"== {a['grade_id']} ({a['points']:g} points)"
        if a["answer"] is None:
            log(f"{head}: not shown -- write your own answer first (the cell is blank or "
                f"still says {STUB})")
            continue
        shown += 1
        log(f"{head} ==")
        log("  your answer:")
        log("\n".join("    " + line for line in a["answer"].splitlines()))
        log("  model answer and rubric:")
        log("\n".join("    " + line for line in a["model"].splitlines()))
    return shown

