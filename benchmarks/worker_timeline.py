"""How `make test`'s workers spent the run: read the file MINILLM_TEST_TIMELINE wrote.

    rm -f /tmp/t.jsonl; MINILLM_TEST_TIMELINE=/tmp/t.jsonl make test
    .venv/bin/python benchmarks/worker_timeline.py /tmp/t.jsonl [--min-span 20]

For each worker: when its first test phase started and its last ended (seconds from the run's
first phase), the seconds spent inside test phases (setup, call, teardown), and its stretches
of consecutive phases from one test module that lasted at least --min-span seconds. A worker
that ends long before the other shows a tail; busy much below last-first shows gaps between
tests (the collection, xdist's scheduling).
"""
from __future__ import annotations

import argparse
import collections
import json


def summarize(path: str, min_span: float = 20.0) -> list[str]:
    rows = [json.loads(line) for line in open(path) if line.strip()]
    if not rows:
        raise SystemExit(f"{path}: no test phase recorded")
    t0 = min(r["start"] for r in rows)
    by_worker = collections.defaultdict(list)
    for r in rows:
        by_worker[r["worker"]].append(r)
    out = []
    for worker, rs in sorted(by_worker.items()):
        rs.sort(key=lambda r: r["start"])
        busy = sum(r["end"] - r["start"] for r in rs)
        out.append(f"{worker}: first {rs[0]['start'] - t0:.0f} s, last {rs[-1]['end'] - t0:.0f} s, "
                   f"inside tests {busy:.0f} s, {len(rs)} phases")
        spans: list[list] = []
        for r in rs:
            module = r["test"].split("::")[0].rsplit("/", 1)[-1]
            if spans and spans[-1][0] == module:
                spans[-1][2] = r["end"]
            else:
                spans.append([module, r["start"], r["end"]])
        for module, a, b in spans:
            if b - a >= min_span:
                out.append(f"  {module:32s} {a - t0:6.0f} -> {b - t0:6.0f} s ({b - a:.0f} s)")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path")
    ap.add_argument("--min-span", type=float, default=20.0)
    a = ap.parse_args()
    print("\n".join(summarize(a.path, a.min_span)))


if __name__ == "__main__":
    main()
