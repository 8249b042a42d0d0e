"""`minillm bench tp` run several times in a row: the spread of its crossover figures, which one
run cannot show (the crossover sits where the split's and the whole step's times are within a
few per cent of each other, so a little noise moves it a lot).

    PYTHONPATH=. python -m benchmarks.tp_repeats --runs 3 --save benchmarks/tp_recorded.json \
        > benchmarks/tp_repeats.json

--save keeps the first run's whole report (RESULTS.md's tables: benchmarks/tp_tables.py).
"""
from __future__ import annotations

import argparse
import json

from minillm.bench.tp import bench_tp

KEYS = ("measured_dim", "predicted_dim", "predicted_dim_own_memory", "predicted_dim_as_seen",
        "in_step_alpha_s", "measured_over_predicted", "within_2x")


def summary(r: dict) -> dict:
    c = r["worlds"]["2"]["crossover"]
    return {"alpha_s": r["all_reduce"]["fit"]["alpha_s"],
            "all_reduce_worst_ratio": r["all_reduce"]["worst_ratio"],
            **{k: c[k] for k in KEYS}}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--save", default=None, help="write the first run's whole report here")
    a = p.parse_args(argv)
    if a.runs < 1:
        raise SystemExit("--runs must be >= 1")
    out = []
    for i in range(a.runs):
        r = bench_tp()
        if i == 0 and a.save:
            with open(a.save, "w") as f:
                json.dump(r, f)
        out.append(summary(r))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
