"""Batch grading time, one submission at a time against `--jobs 2`, on the same submissions.

    python benchmarks/grade_batch.py [--labs 00_sampling 07_paged_attention] [--json]
    python benchmarks/grade_batch.py --labs 05_speculative --compile-cache [--json]

Builds a temporary course holding the given labs (default: 00_sampling, 01_roofline,
07_paged_attention), submits three notebooks per lab as the pipeline test does (the source, the
released student version, the lab's wrong submission), grades the batch with `workers=1` and then
`workers=2` (each in the sandbox when this machine has one), and prints the wall time of each
batch, their ratio and whether the two batches recorded the same grades. Each batch is a whole
`grade` run: job building, execution, recording with nbgrader, the CSV (no feedback).

`--compile-cache` compares instead, at `--jobs 1`: the batch with an empty compile cache in each
kernel (`grade --no-compile-cache`), the grader's warm-up alone (autograder/compile_cache.py),
then the batch with a copy of the warm cache in each kernel.

Its figures feed benchmarks/RESULTS.md, "Batch grading: one submission at a time against
`--jobs 2` (CPU)" and its "Lab 05 with and without the grader's warm compile cache".
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from test_pipeline import wrong_notebook  # noqa: E402

from autograder.compile_cache import warm as warm_compile_cache  # noqa: E402
from autograder.course import Course  # noqa: E402
from autograder.grade import grade_submissions  # noqa: E402
from autograder.sandbox import sandbox_unavailable_reason  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--labs", nargs="+", default=["00_sampling", "01_roofline",
                                                  "07_paged_attention"])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--compile-cache", action="store_true",
                    help="compare kernels without and with the grader's warm compile cache")
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="grade_batch_"))
    try:
        root = tmp / "course"
        root.mkdir()
        shutil.copy2(REPO / "nbgrader_config.py", root / "nbgrader_config.py")
        for lab in args.labs:
            shutil.copytree(REPO / "labs" / lab, root / "labs" / lab)
        course = Course(root)
        course.release(args.labs)
        subs = tmp / "subs"
        for lab in args.labs:
            src = course.source(lab)
            for student, nb in [
                    ("source", nbformat.read(str(src / f"{lab}.ipynb"), as_version=4)),
                    ("release", nbformat.read(str(course.release_dir(lab) / f"{lab}.ipynb"),
                                              as_version=4)),
                    ("wrong", wrong_notebook(src))]:
                (subs / student / lab).mkdir(parents=True, exist_ok=True)
                nbformat.write(nb, str(subs / student / lab / f"{lab}.ipynb"))
        sandbox = sandbox_unavailable_reason() is None
        out = {"labs": args.labs, "submissions": 3 * len(args.labs), "sandbox": sandbox}
        grades = {}
        runs = [("cold", 1, False), ("warm", 1, True)] if args.compile_cache else \
            [("jobs1", 1, True), ("jobs2", 2, True)]
        for name, workers, cache in runs:
            if cache and "warmup_s" not in out:     # the grader's warm-up, timed on its own
                t0 = time.monotonic()
                for lab in args.labs:
                    warm_compile_cache(course, lab, log=lambda *a: None)
                out["warmup_s"] = round(time.monotonic() - t0, 1)
            t0 = time.monotonic()
            records = grade_submissions(course, subs, feedback=False, workers=workers,
                                        sandbox=sandbox, compile_cache=cache,
                                        log=lambda *a: None)
            out[f"{name}_s"] = round(time.monotonic() - t0, 1)
            grades[name] = [(r.student, r.lab, r.status, [(c.grade_id, c.score)
                                                            for c in r.cells])
                            for r in records]
        first, second = (name for name, _, _ in runs)
        out["speedup"] = round(out[f"{first}_s"] / out[f"{second}_s"], 2)
        out["same_grades"] = grades[first] == grades[second]
        out["statuses"] = sorted({g[2] for g in grades[first]})
        if args.json:
            print(json.dumps(out))
        else:
            for k, v in out.items():
                print(f"{k:>12}: {v}")
        return 0 if out["same_grades"] else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
