"""Measure every lab's speed check: `python -m autograder.labs [--runs N] [--loaded K] [LAB ...]`.

For each lab (or the ones named, e.g. lab03), runs the check's measure N times on its reference
and N times on its counter-example (unguarded, on one torch thread, as the graded cell does),
the last K runs of each with a busy loop spinning on one core, and prints the ratios' range and
median next to the threshold. The ranges in autograder/README.md come from this command.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import time

from autograder.labs import speed_checks


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
            ratios.append(check.ratio(candidate, *check.fixture(), guarded=False).ratio)
    return ratios


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m autograder.labs", description=__doc__.split("\n")[0])
    ap.add_argument("labs", nargs="*", help="labNN names (default: every lab with a speed check)")
    ap.add_argument("--runs", type=int, default=10, help="runs per candidate (default 10)")
    ap.add_argument("--loaded", type=int, default=4,
                    help="of which the last K run beside a busy loop (default 4)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    checks = speed_checks()
    unknown = [lab for lab in args.labs if lab not in checks]
    if unknown:
        ap.error(f"no speed check for {unknown}; known: {sorted(checks)}")
    rows = {}
    for lab in args.labs or sorted(checks):
        check = checks[lab]
        row = {"grade_id": check.grade_id, "threshold": check.threshold}
        for which in ("reference", "counter_example"):
            r = measure(check, getattr(check, which), args.runs, args.loaded)
            row[which] = {"min": min(r), "median": statistics.median(r), "max": max(r)}
        rows[lab] = row
        if not args.json:
            ref, bad = row["reference"], row["counter_example"]
            print(f"{lab} {check.grade_id:24s} threshold {check.threshold:<4g} reference "
                  f"{ref['min']:.2f}-{ref['max']:.2f} (median {ref['median']:.2f})  "
                  f"counter-example {bad['min']:.2f}-{bad['max']:.2f} "
                  f"(median {bad['median']:.2f})", flush=True)
    if args.json:
        print(json.dumps({"runs": args.runs, "loaded": args.loaded, "checks": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
