"""Measure every lab's speed check (autograder/README.md, "Timed claims"):

    .venv/bin/python -m benchmarks.speed_checks [--runs N] [--loaded K] [--tester] [--solution] [LAB ...]

Each candidate of a lab's SpeedCheck (autograder/labs/labNN.py) -- the reference, the
counter-example and, with --solution, the source notebook's own answer -- is measured --runs
times, the last --loaded of them beside a busy core; --tester runs it as graded, the candidate in
a process of its own and the check in a tester. The ranges go to autograder/README.md ("Speed
checks: measured ranges") and, for the earlier designs, benchmarks/RESULTS.md ("Speed-check
ranges under the earlier grading designs"). (Until 2026-11-29 this was
`python -m autograder.labs`.)
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from autograder.labs import speed_checks
from autograder.steady_malloc import steady

LABS = Path(__file__).resolve().parents[1] / "labs"


def lab_notebook(lab: str, labs: Path = LABS) -> Path:
    """labs/NN_topic/NN_topic.ipynb for lab "labNN"."""
    number = lab.removeprefix("lab")
    found = sorted(labs.glob(f"{number}_*/{number}_*.ipynb"))
    found = [p for p in found if p.parent.name == p.stem]
    if len(found) != 1:
        raise FileNotFoundError(f"no single source notebook for {lab} under {labs} "
                                f"(found {[str(p) for p in found]})")
    return found[0]


def notebook_solution(check, lab: str, labs: Path = LABS):
    """`check.solution[0]` from the notebook's first code cell and cells `check.solution[1:]`."""
    if len(check.solution) < 2:
        raise ValueError(f"{check.grade_id}: the SpeedCheck names no notebook solution "
                         f"(solution=(function name, cell grade ids...))")
    name, cell_ids = check.solution[0], set(check.solution[1:])
    path = lab_notebook(lab, labs)
    cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    chosen = [cells[0]] + [c for c in cells[1:] if
                           c["metadata"].get("nbgrader", {}).get("grade_id") in cell_ids]
    missing = cell_ids - {c["metadata"].get("nbgrader", {}).get("grade_id") for c in chosen}
    if missing:
        raise ValueError(f"{path} has no code cell with grade id {sorted(missing)}")
    namespace: dict = {"__name__": f"{lab}_notebook"}
    for cell in chosen:
        source = "".join(line for line in "".join(cell["source"]).splitlines(keepends=True)
                         if not line.lstrip().startswith(("%", "!")))     # IPython magics
        exec(compile(source, str(path), "exec"), namespace)
    if not callable(namespace.get(name)):
        raise ValueError(f"the solution cells {sorted(cell_ids)} of {path} define no function "
                         f"{name!r}")
    return namespace[name]


@contextlib.contextmanager
def busy_core():
    proc = subprocess.Popen([sys.executable, "-c", "while True:\n    pass"])
    try:
        time.sleep(0.2)
        yield
    finally:
        proc.kill()
        proc.wait()


def measure(check, candidate, runs: int, loaded: int) -> list[float]:
    ratios = []
    for i in range(runs):
        with busy_core() if i >= runs - loaded else contextlib.nullcontext():
            ratios.append(check.ratio(candidate).ratio)
    return ratios


# the student's side of --tester
KERNEL = """
import sys, torch
torch.set_num_threads(1)
from autograder.steady_malloc import steady
steady()                        # as a graded kernel does
from autograder.kernel_side import serve
from autograder.labs import speed_checks
from benchmarks.speed_checks import notebook_solution
lab, which = sys.argv[2], sys.argv[3]
check = speed_checks()[lab]
serve(sys.argv[1], {"candidate": notebook_solution(check, lab) if which == "solution"
                    else getattr(check, which)})
"""


def measure_in_tester(lab: str, check, which: str, runs: int, loaded: int) -> list[float]:
    """`measure` with the candidate `which` in a process of its own and the check in a tester."""
    from autograder.tester import Commands, Tester
    folder = tempfile.mkdtemp(prefix="speedcheck_")
    path = os.path.join(folder, "tester.sock")
    tester = Tester(path)
    never, _ = os.pipe()                    # no command ever comes: no abort
    tester.ns.update(check=check, ratios=[])
    for i in range(runs):
        with busy_core() if i >= runs - loaded else contextlib.nullcontext():
            kernel = subprocess.Popen([sys.executable, "-c", KERNEL, path, lab, which])
            try:
                answer = tester.test({"op": "test", "seq": i, "grade_id": which,
                                      "names": ["candidate"], "timeout": 600,
                                      "source": "ratios.append(check.ratio(candidate).ratio)"},
                                     Commands(never))
                if not answer["ok"]:
                    raise RuntimeError(f"{lab} {which} in the tester: {answer['ename']}: "
                                       f"{answer['evalue']}")
                kernel.wait(60)
            finally:
                kernel.kill()
    return list(tester.ns["ratios"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.speed_checks",
                                 description=__doc__.split("\n")[0].rstrip(":"))
    ap.add_argument("labs", nargs="*", help="labNN names (default: every lab with a speed check)")
    ap.add_argument("--runs", type=int, default=10, help="runs per candidate (default 10)")
    ap.add_argument("--loaded", type=int, default=4,
                    help="of which the last K run beside a busy loop (default 4)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--solution", action="store_true",
                    help="also measure the source notebook's solution")
    ap.add_argument("--tester", action="store_true",
                    help="run each candidate in a process of its own, the check in a tester")
    args = ap.parse_args(argv)
    steady()                    # as the grader's kernels and tester do
    checks = speed_checks()
    if unknown := [lab for lab in args.labs if lab not in checks]:
        ap.error(f"no speed check for {unknown}; known: {sorted(checks)}")
    rows = {}
    for lab in args.labs or sorted(checks):
        check = checks[lab]
        row = {"grade_id": check.grade_id, "threshold": check.threshold}
        candidates = {"reference": check.reference, "counter_example": check.counter_example}
        if args.solution and check.solution:
            candidates["solution"] = notebook_solution(check, lab)
        ranges = {}
        for which, fn in candidates.items():
            try:
                r = measure_in_tester(lab, check, which, args.runs, args.loaded) \
                    if args.tester else measure(check, fn, args.runs, args.loaded)
            except RuntimeError as e:
                row[which] = {"error": str(e)}
                ranges[which] = f"cannot run: {e}"
                continue
            row[which] = {"min": min(r), "median": statistics.median(r), "max": max(r)}
            ranges[which] = f"{min(r):.2f}-{max(r):.2f} (median {statistics.median(r):.2f})"
        rows[lab] = row
        if not args.json:
            print(f"{lab} {check.grade_id:24s} threshold {check.threshold:<4g} " + "  ".join(
                f"{which.replace('_', '-')} {text}" for which, text in ranges.items()),
                flush=True)
    if args.json:
        print(json.dumps({"runs": args.runs, "loaded": args.loaded, "tester": args.tester,
                          "checks": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
