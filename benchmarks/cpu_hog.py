"""What `grade --jobs N`'s pinning (autograder/cores.py) protects a student from: a neighbour
that spins on every CPU it can reach.

    .venv/bin/python benchmarks/cpu_hog.py [--steps 60] [--repeats 3] [--json]

A "student's cell" (`--steps` training steps of lab 09's recall model on one torch thread, as the
labs' cells run under `grade --jobs 2` on two cores) runs in a fresh process pinned to the first
half of this machine's CPUs, in three settings:

* alone;
* beside a hog that is not pinned: 2 busy processes per CPU, free to run anywhere (a
  submission before the pinning, or one that widens its affinity where the sandbox's seccomp
  filter does not stop it);
* beside the same hog pinned to the other half of the CPUs (what `grade --jobs 2` now does to
  each job, and what the sandbox keeps it to).

Settings alternate, `--repeats` times; the median wall time of each is printed, with its ratio to
the time alone. Needs at least 2 CPUs.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CELL = """
import time, torch
from minillm import recall
torch.set_num_threads(1)
m = recall.recall_model("linear", dim=64, n_layers=1, n_heads=1, seed=0)
t = time.perf_counter(); recall.train_recall(m, steps={steps}); print(time.perf_counter() - t)
"""
SPIN = "while True:\n    pass\n"


def _cell(steps: int, cpus: list[int]) -> float:
    out = subprocess.run([sys.executable, "-c", CELL.format(steps=steps)], check=True,
                         capture_output=True, text=True,
                         preexec_fn=lambda: os.sched_setaffinity(0, cpus))
    return float(out.stdout.strip().splitlines()[-1])


def _hog(cpus: list[int] | None, n: int) -> list[subprocess.Popen]:
    pre = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    return [subprocess.Popen([sys.executable, "-c", SPIN], preexec_fn=pre) for _ in range(n)]


def measure(steps: int, repeats: int) -> dict:
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        raise SystemExit("needs at least 2 CPUs")
    mine, others = allowed[:len(allowed) // 2], allowed[len(allowed) // 2:]
    settings = {"alone": None, "hog_unpinned": "all", "hog_pinned_elsewhere": others}
    times: dict[str, list[float]] = {k: [] for k in settings}
    _cell(steps, mine)                                  # warm-up (imports, page cache)
    for _ in range(repeats):
        for name, where in settings.items():
            hog = [] if where is None else _hog(None if where == "all" else where,
                                                2 * len(allowed))
            try:
                time.sleep(0.3 if hog else 0)          # the hog is running before the cell
                times[name].append(_cell(steps, mine))
            finally:
                for p in hog:
                    p.kill()
                    p.wait()
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"cpus": len(allowed), "cell_cpus": mine, "steps": steps, "repeats": repeats,
            "median_s": med, "times_s": times,
            "slowdown": {k: med[k] / med["alone"] for k in med}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    r = measure(a.steps, a.repeats)
    if a.json:
        print(json.dumps(r, indent=1))
        return
    print(f"{r['steps']} recall training steps on CPU(s) {r['cell_cpus']} of {r['cpus']}, "
          f"median of {r['repeats']}:")
    for k, v in r["median_s"].items():
        print(f"  {k:22s} {v:6.2f} s   {r['slowdown'][k]:5.2f}x the time alone")


if __name__ == "__main__":
    main()
