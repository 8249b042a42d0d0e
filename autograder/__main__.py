"""python -m autograder release [LAB ...] | collect | deadline | extend | grade DIR | report [LAB ...]
| selfgrade NOTEBOOK (see README.md)."""
from __future__ import annotations

import argparse
import functools
import shlex
import sys
from pathlib import Path


def _limits(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cell-timeout", type=int, default=None,
                   help="seconds per cell (default: nbgrader_config.py's Execute.timeout)")
    p.add_argument("--notebook-timeout", type=int, default=None,
                   help="seconds per notebook (default: GuardedExecute.notebook_timeout)")
    p.add_argument("--mem-gb", type=float, default=None,
                   help="kernel memory bound in GiB (default: half the RAM within [2, 8]; "
                        "0 = none)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m autograder", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    root = argparse.ArgumentParser(add_help=False)
    root.add_argument("--root", help="course root (default: the directory with "
                                     "nbgrader_config.py and labs/ at or above the working one)")
    add = functools.partial(sub.add_parser, parents=[root])

    p = add("release", help="student versions of the labs -> build/release/<lab>/")
    p.add_argument("labs", nargs="*", help="lab folder names (default: every lab in labs/)")
    p.add_argument("--missing", action="store_true",
                   help="only labs not released yet (never overwrites a student's work)")
    p.add_argument("--exchange", type=Path, metavar="DIR",
                   help="also publish them to this nbgrader exchange (release_assignment)")

    p = add("collect", help="submissions from an nbgrader exchange or an LMS zip -> "
                                       "build/submitted/<student>/<lab>/")
    p.add_argument("labs", nargs="*", help="labs (default with --exchange: every lab; with "
                                           "--zip: exactly one)")
    p.add_argument("--exchange", type=Path, metavar="DIR", help="the exchange released to")
    p.add_argument("--zip", type=Path, metavar="FILE", help="an LMS download of one lab")
    p.add_argument("--pattern", help="the zip's file names, a regular expression with "
                                     "(?P<student_id>) and (?P<file_id>) (default: Canvas's)")
    p.add_argument("--zip-dates", action="store_true",
                   help="each submission's time is its file's date in the zip (lateness)")

    p = add("deadline", help="a lab's due date (late work is penalised)")
    p.add_argument("lab")
    p.add_argument("due", help="e.g. '2026-12-04 17:00 UTC'")

    p = add("extend", help="more time for one student on one lab")
    p.add_argument("lab")
    p.add_argument("student")
    p.add_argument("--days", type=float, default=0)
    p.add_argument("--hours", type=float, default=0)

    p = add("grade", help="autograde DIR/<student>/<lab>/<lab>.ipynb into the gradebook,"
                                     " build/grades.csv and build/feedback/")
    p.add_argument("submissions", help="directory of submissions: DIR/<student>/<lab>/<nb>.ipynb")
    p.add_argument("--no-feedback", action="store_true", help="skip the feedback HTML")
    p.add_argument("--jobs", type=int, default=1, metavar="N",
                   help="execute N submissions at once on this machine (default 1)")
    p.add_argument("--scheduler", metavar="tcp://HOST:PORT",
                   help="execute the submissions on the workers of this Dask cluster")
    p.add_argument("--no-sandbox", action="store_true",
                   help="run student code without the sandbox (unsafe; prints a warning)")
    p.add_argument("--feedback-with-hidden-tests", action="store_true",
                   help="show the hidden tests in the feedback (default: never)")
    p.add_argument("--similarity", action="store_true",
                   help="compare the answers with each other's, the course's source and "
                        "--similarity-archive (copydetect): build/similarity/, a column of the "
                        "table and the CSV; scores are never changed")
    p.add_argument("--similarity-archive", type=Path, metavar="DIR",
                   help="earlier terms' submissions to compare with (notebooks or .py files)")
    p.add_argument("--no-compile-cache", action="store_true",
                   help="give each kernel an empty compile cache instead of a copy of the one "
                        "the grader warms (autograder/compile_cache.py)")
    _limits(p)

    p = add("report", help="after grading written answers by hand: build/grades.csv "
                                      "and the feedback HTML again, from the gradebook")
    p.add_argument("labs", nargs="*", help="labs to write feedback for (default: every lab "
                                           "with a submission)")
    p.add_argument("--feedback-with-hidden-tests", action="store_true",
                   help="show the hidden tests in the feedback (default: never)")

    p = add("selfgrade", help="grade your own notebook (hidden tests included)")
    p.add_argument("notebook")
    p.add_argument("--lab", help="lab folder name (default: from the notebook's name or folder)")
    p.add_argument("--keep", action="store_true", help="keep the temporary course to inspect it")
    p.add_argument("--answers", action="store_true",
                   help="then show the model answer and rubric of each written answer you "
                        "have written (never of a blank one)")
    _limits(p)

    args = ap.parse_args(argv)
    try:
        if args.cmd == "selfgrade":                 # a temporary course of its own: no lock
            from .selfgrade import selfgrade
            return 0 if selfgrade(args.notebook, lab=args.lab, root=args.root,
                                  cell_timeout=args.cell_timeout,
                                  notebook_timeout=args.notebook_timeout, mem_gb=args.mem_gb,
                                  keep=args.keep, answers=args.answers)[1] else 1
        from .course import Course
        course = Course(args.root) if args.root else Course.find()
        # release, grade and report rewrite build/: one at a time (Course.lock)
        with course.lock(shlex.join(sys.argv[1:] if argv is None else argv)):
            return _run(args, course)
    except (FileNotFoundError, ValueError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _run(args, course) -> int:
    if args.cmd == "release":
        if args.exchange:
            from .collect import release
            done = release(course, args.labs or None, args.exchange)
            print(f"released {', '.join(done)} -> {course.build / 'release'} and the exchange "
                  f"{args.exchange}")
            return 0
        done = course.release(args.labs or None, missing_only=args.missing)
        if done:
            print(f"released {', '.join(done)} -> {course.build / 'release'}")
        elif args.missing:
            print(f"all labs already released in {course.build / 'release'}")
        else:
            print(f"no labs in {course.root / 'labs'}")
        return 0
    if args.cmd == "collect":
        from . import collect
        if bool(args.exchange) == bool(args.zip):
            raise ValueError("give --exchange DIR or --zip FILE (one of them)")
        if args.exchange:
            found = collect.collect_exchange(course, args.labs or None, args.exchange)
        elif len(args.labs) != 1:
            raise ValueError(f"--zip holds one lab's submissions: name it, got {args.labs}")
        else:
            found = collect.collect_zip(course, args.labs[0], args.zip, zip_dates=args.zip_dates,
                                        pattern=args.pattern or collect.CANVAS)
        print(f"next: python -m autograder grade {course.build / 'submitted'}")
        return 0 if found else 1
    if args.cmd in ("deadline", "extend"):
        from . import deadlines
        if args.cmd == "deadline":
            due = deadlines.set_due(course, args.lab, args.due)
            print(f"{args.lab} is due {due:%Y-%m-%d %H:%M} UTC; late work loses the share that "
                  "nbgrader_config.py's PerDayPenalty sets")
        else:
            deadlines.extend(course, args.lab, args.student, days=args.days, hours=args.hours)
            print(f"{args.student} has {args.days:g} day(s) {args.hours:g} hour(s) more for "
                  f"{args.lab}")
        return 0
    if args.cmd == "grade":
        from .grade import grade_submissions
        return 0 if grade_submissions(
            course, args.submissions, cell_timeout=args.cell_timeout,
            notebook_timeout=args.notebook_timeout, mem_gb=args.mem_gb,
            feedback=not args.no_feedback, workers=args.jobs, scheduler=args.scheduler,
            sandbox=not args.no_sandbox, feedback_hidden_tests=args.feedback_with_hidden_tests,
            compile_cache=not args.no_compile_cache, similarity=args.similarity,
            similarity_archive=args.similarity_archive) else 1
    if args.cmd == "report":
        from .grade import report
        report(course, args.labs or None, hidden_tests=args.feedback_with_hidden_tests)
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
