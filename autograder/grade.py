"""Batch grading, `python -m autograder grade DIR` (DIR/<student>/<lab>/<lab>.ipynb), and
`report` (autograder/README.md, "Instructors").
"""
from __future__ import annotations

import queue
import shutil
import threading
import time
from pathlib import Path

from . import jobs as _jobs
from .compile_cache import warm as warm_compile_cache
from .cores import CoreSlots, share_of_cores
from .course import STUDENT_RE, Course
from .processes import default_mem_bytes, memory_limit_works
from .records import GradeRecord


def find_submissions(course: Course, subdir: Path, log=print) -> list[tuple[str, str, Path]]:
    """(student, lab, folder) for every DIR/<student>/<lab>/ holding a notebook."""
    labs = set(course.labs())
    found = []
    if not subdir.is_dir():
        raise FileNotFoundError(f"no submissions directory {subdir}")
    def folders(parent: Path):
        for p in sorted(p for p in parent.iterdir() if p.is_dir() and not p.name.startswith(".")):
            if p.is_symlink():
                log(f"skipping {p}: a symbolic link (submissions are read as plain folders)")
            else:
                yield p
    for sdir in folders(subdir):
        if not STUDENT_RE.match(sdir.name):
            log(f"skipping {sdir}: student ids may only use letters, digits and _ . @ -")
            continue
        for ldir in folders(sdir):
            if ldir.name not in labs:
                log(f"skipping {ldir}: {ldir.name!r} is not a lab of this course {sorted(labs)}")
                continue
            if not any(ldir.glob("*.ipynb")):
                log(f"skipping {ldir}: no notebook in it")
                continue
            found.append((sdir.name, ldir.name, ldir))
    return found


def _fix_notebook_name(course: Course, lab: str, dest: Path, log=print) -> None:
    """A lone notebook with another name ("00_sampling (1).ipynb") is graded as <lab>.ipynb."""
    expected = {p.name for p in course.source(lab).glob("*.ipynb")}
    present = {p.name for p in dest.glob("*.ipynb")}
    if len(expected) == 1 and len(present) == 1 and expected != present:
        (old,), (new,) = present, expected
        (dest / old).rename(dest / new)
        log(f"{dest.parent.name}/{lab}: grading {old} as {new}")


def resolve_mem_bytes(mem_gb: float | None, log=print) -> int | None:
    """The kernel memory bound in bytes, None for none (0, or torch cannot start under it)."""
    if mem_gb is not None and mem_gb <= 0:
        return None
    mem = int(mem_gb * (1 << 30)) if mem_gb else default_mem_bytes()
    if not memory_limit_works(mem):
        log(f"warning: torch does not start under a {mem / (1 << 30):.1f} GiB data limit on this "
            "machine; grading without a memory bound")
        return None
    return mem


def grade_submissions(course: Course, subdir: str | Path, *, cell_timeout: int | None = None,
                      notebook_timeout: int | None = None, mem_gb: float | None = None,
                      feedback: bool = True, workers: int = 1,
                      scheduler: str | None = None, sandbox: bool = True,
                      feedback_hidden_tests: bool = False, compile_cache: bool = True,
                      similarity: bool = False, similarity_archive: Path | None = None,
                      log=print) -> list[GradeRecord]:
    """Grade every DIR/<student>/<lab>/ submission; RuntimeError if `sandbox` and none here."""
    from .sandbox import sandbox_unavailable_reason
    if sandbox and (why := sandbox_unavailable_reason()) and scheduler is None:
        raise RuntimeError(f"no sandbox for student code on this machine: {why}. Install "
                           "bubblewrap (Debian/Ubuntu: apt-get install bubblewrap), or pass "
                           "--no-sandbox to grade without it (not safe: see autograder/README.md)")
    if not sandbox:
        log("WARNING: grading without the sandbox: student code runs as you, can read the "
            "gradebook and the hidden tests, and can leave processes behind")
    subdir = Path(subdir).resolve()
    if not (subs := find_submissions(course, subdir, log)):
        log(f"no submissions found in {subdir} (expected {subdir}/<student>/<lab>/<lab>.ipynb)")
        return []
    labs = sorted({lab for _, lab, _ in subs})
    if released := course.release(labs, missing_only=True):
        log(f"released (was missing): {', '.join(released)}")
    mem = resolve_mem_bytes(mem_gb, log)
    same_place = subdir == (course.build / "submitted").resolve()
    for student, lab, folder in subs:
        if not same_place:
            dest = course.submitted(student, lab)
            if dest.exists():
                shutil.rmtree(dest)
            shutil.copytree(folder, dest, symlinks=True,
                            ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
            _fix_notebook_name(course, lab, dest, log)
    course.register_students(sorted({s for s, _, _ in subs}))

    t0 = time.monotonic()
    jobs = [_jobs.build_job(course, student, lab, cell_timeout=cell_timeout,
                            notebook_timeout=notebook_timeout, mem_bytes=mem, sandbox=sandbox)
            for student, lab, _ in subs]
    running = min(workers, len(jobs))
    threads = {} if scheduler else share_of_cores(running)
    if compile_cache:
        caches = {lab: warm_compile_cache(course, lab, log, threads) for lab in labs}
        for job in jobs:
            if caches[job["lab"]] and not job.get("rejected"):
                job["compile_cache"] = caches[job["lab"]]
    for job in jobs:
        job["limits"]["thread_env"] = threads
    execute, where = _jobs.execute_job, f"on the Dask cluster at {scheduler}"
    if not scheduler:
        where = f"{running} at a time on this machine"
        if "OMP_NUM_THREADS" in threads:
            where += f", {threads['OMP_NUM_THREADS']} torch thread(s) each"
        if running > 1:
            slots = CoreSlots(running)
            execute = _jobs.execute_on_own_cores(slots)
            where += (", each on CPUs of its own: " if slots.disjoint else
                      ", more jobs than cores, so some share CPUs: ") + slots.describe()
    log(f"executing {len(jobs)} submission(s), {where} ...")
    # each result is recorded (`nbgrader autograde`, one at a time) while the others still run
    results: queue.SimpleQueue = queue.SimpleQueue()
    recorded: dict[int, GradeRecord] = {}
    recorder = threading.Thread(target=_record_all, args=(course, jobs, results, recorded, log),
                                name="record", daemon=True)
    recorder.start()
    from .distribute import run_jobs
    try:
        run_jobs(execute, jobs, workers=workers, scheduler=scheduler, log=log,
                 on_result=lambda i, result: results.put((i, result)))
        log(f"executed in {time.monotonic() - t0:.0f} s; recording the last grades ...")
    finally:
        results.put(None)
        recorder.join()
    records = [recorded[i] for i in range(len(jobs))]
    if similarity:                      # before the CSV, which shows the matches
        from .similarity import compare
        compare(course, labs, similarity_archive, log)
    _publish(course, labs if feedback else [], feedback_hidden_tests, log, strict=False)
    log(f"batch: {len(records)} submission(s) in {time.monotonic() - t0:.0f} s")
    log("")
    log(format_table(records, course))
    return records


def _publish(course: Course, labs: list[str], hidden_tests: bool, log, strict: bool) -> None:
    """build/grades.csv and the feedback of `labs` (a failed step: an error if `strict`)."""
    log(f"grades: {course.export_csv()}")
    for lab in labs:
        r = course.generate_feedback(lab, hidden_tests=hidden_tests)
        if r.returncode != 0 and strict:
            raise RuntimeError(f"generate_feedback {lab} failed, see {r.log}")
        if r.returncode != 0:
            log(f"warning: generate_feedback {lab} failed, see {r.log}")
    if labs:
        log(f"feedback: {course.build / 'feedback'}/<student>/<lab>/<lab>.html ({', '.join(labs)})")


def _record_all(course: Course, jobs: list[dict], results: queue.SimpleQueue, records: dict,
                log) -> None:
    """Record each (i, result) from `results` until None; a failure zeroes that submission."""
    while (item := results.get()) is not None:
        i, result = item
        job = jobs[i]
        try:
            rec = _jobs.record(course, job, result)
        except Exception as e:                  # the batch goes on whatever happens
            log(f"    grader error: {e!r}")
            try:
                course.zero_submission(job["student"], job["lab"])
                cells = course.scores(job["student"], job["lab"])
            except Exception:
                cells = []
            rec = GradeRecord(student=job["student"], lab=job["lab"],
                              status=f"grader error: {e!r}"[:60], seconds=0.0,
                              exec_seconds=None, cells=cells)
        records[i] = rec
        log(f"[{len(records)}/{len(jobs)}] {rec.student} / {rec.lab}: {rec.status}: "
            f"{rec.score:g} / {rec.max_score:g}")


def format_table(records: list[GradeRecord], course: Course | None = None) -> str:
    """One row per submission: auto and written points, answers to grade, closest match."""
    from .similarity import load
    matches = load(course) if course is not None else {}
    rows = [("student", "lab", "auto", "written", "max", "to grade", "status", "seconds",
             "similarity")]
    waiting = 0
    for r in records:
        auto = [c for c in r.cells if c.autograded]
        written = [c for c in r.cells if not c.autograded]
        todo = sum(c.score is None for c in written)
        waiting += todo
        match = matches.get(r.lab, {}).get(r.student)
        rows.append((r.student, r.lab,
                     f"{sum(c.score or 0 for c in auto):g}/{sum(c.max_score for c in auto):g}",
                     f"{sum(c.score or 0 for c in written):g}/"
                     f"{sum(c.max_score for c in written):g}",
                     f"{r.max_score:g}", str(todo) if todo else "", r.status, f"{r.seconds:.0f}",
                     f"{match['score']:.2f} {match['with']}" if match and match["with"] else ""))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    if waiting:
        lines.append(f"{waiting} written answer(s) need manual grading: `make formgrade` "
                     "(nbgrader's formgrader), then `make report` (autograder/README.md, "
                     "'Grading written answers')")
    return "\n".join(lines)


def report(course: Course, labs: list[str] | None = None, *, hidden_tests: bool = False,
           log=print) -> None:
    """build/grades.csv, the feedback and the table again from the gradebook as it is now."""
    graded = sorted({p.parent.name for p in course.build.glob("autograded/*/*/*.ipynb")})
    labs = [course.check_lab(lab) for lab in labs] if labs else graded
    _publish(course, labs, hidden_tests, log, strict=True)
    records = []
    for d in sorted(course.build.glob("autograded/*/*")):
        if d.is_dir() and d.name in labs:
            records.append(GradeRecord(student=d.parent.name, lab=d.name, status="graded",
                                       seconds=0.0, exec_seconds=None,
                                       cells=course.scores(d.parent.name, d.name)))
    log("")
    log(format_table(records, course))

