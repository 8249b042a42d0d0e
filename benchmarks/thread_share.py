"""Why each test worker gets its share of the cores (tests/conftest.py): two measurements.

    .venv/bin/python benchmarks/thread_share.py [--steps 60] [--repeats 3] [--json]

1. Oversubscribed threads. `make test` runs two pytest workers on two cores; a worker (or a
   kernel it starts) running torch on one thread per core competes with the other. This times
   `--steps` training steps of lab 09's linear-attention recall model (`minillm.recall`; small
   matrices, many ops, as in most of the labs' cells) on 1 and on 2 torch threads, alone and
   beside a second process running 64 x 64 matrix products on 2 threads (the other worker).
2. Inductor's compile workers. A cold compile of the draft's fused decode step
   (`minillm.decode.compiled.CompiledDecoder`, 6 greedy tokens) with Inductor's default pool of
   compile processes and with `TORCHINDUCTOR_COMPILE_THREADS=1`, each in a fresh process with an
   empty cache directory of its own, on one torch thread, alone and beside the same neighbour.

Each configuration runs in a fresh process, `--repeats` times, alternating; the median wall time
is printed, and the ratios the conftest's comment quotes.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

RECALL = """
import sys, time, torch
from minillm import recall
torch.set_num_threads({threads})
m = recall.recall_model("linear", dim=64, n_layers=1, n_heads=1, seed=0)
t = time.perf_counter(); recall.train_recall(m, steps={steps}); print(time.perf_counter() - t)
"""
NEIGHBOUR = """
import time, torch
torch.set_num_threads(2)
a = torch.randn(64, 64)
while True:
    for _ in range(1000):
        a @ a
"""
COMPILE = """
import time, torch
import minillm
from minillm.decode.compiled import CompiledDecoder
from minillm.decode import generate_packed
torch.set_num_threads(1)
m = minillm.load("draft")
prompt = torch.randint(1, m.config.vocab_size, (1, 4), generator=torch.Generator().manual_seed(0))
t = time.perf_counter(); generate_packed(m, prompt, 6, CompiledDecoder(m))
print(time.perf_counter() - t)
"""


def _seconds(code: str, env: dict | None = None) -> float:
    """Run `code` in a fresh process (environment `env`, default ours); the number it prints."""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=env, timeout=900)
    if r.returncode:
        raise RuntimeError(r.stderr[-2000:])
    return float(r.stdout.strip().splitlines()[-1])


class neighbour:
    """With busy=True, a second process running small matrix products on 2 threads."""

    def __init__(self, busy: bool):
        self.busy = busy

    def __enter__(self):
        self.proc = subprocess.Popen([sys.executable, "-c", NEIGHBOUR]) if self.busy else None
        if self.proc:
            time.sleep(2)                   # torch imported, the products running

    def __exit__(self, *exc):
        if self.proc:
            self.proc.kill()
            self.proc.wait()


def recall_time(steps: int, threads: int, busy: bool) -> float:
    with neighbour(busy):
        return _seconds(RECALL.format(threads=threads, steps=steps))


def compile_time(compile_threads: str | None, busy: bool) -> float:
    """A cold compile in a process of its own; compile_threads None = Inductor's default."""
    with tempfile.TemporaryDirectory() as cache, neighbour(busy):
        env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_COMPILE_THREADS"}
        env.update(TORCHINDUCTOR_CACHE_DIR=cache, OMP_NUM_THREADS="1")
        if compile_threads:
            env["TORCHINDUCTOR_COMPILE_THREADS"] = compile_threads
        return _seconds(COMPILE, env)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    recall_cfg = [(threads, busy) for busy in (False, True) for threads in (1, 2)]
    recall = {cfg: [] for cfg in recall_cfg}
    compile_cfg = [(pool, busy) for busy in (False, True) for pool in (None, "1")]
    compiles = {cfg: [] for cfg in compile_cfg}
    for _ in range(args.repeats):
        for threads, busy in recall_cfg:
            recall[(threads, busy)].append(recall_time(args.steps, threads, busy))
        for pool, busy in compile_cfg:
            compiles[(pool, busy)].append(compile_time(pool, busy))

    med = {f"{t} thread(s), {'beside the neighbour' if b else 'alone'}": statistics.median(v)
           for (t, b), v in recall.items()}
    cmed = {f"{'default pool' if p is None else 'COMPILE_THREADS=1'}, "
            f"{'beside the neighbour' if b else 'alone'}": statistics.median(v)
            for (p, b), v in compiles.items()}
    out = {"recall_steps": args.steps, "repeats": args.repeats, "recall_s": med,
           "two_threads_beside_neighbour_vs_one": med["2 thread(s), beside the neighbour"]
           / med["1 thread(s), beside the neighbour"],
           "compile_s": cmed,
           "compile_pool_vs_one": {w: cmed[f"default pool, {w}"] / cmed[f"COMPILE_THREADS=1, {w}"]
                                   for w in ("alone", "beside the neighbour")}}
    if args.json:
        print(json.dumps(out, indent=1))
        return
    print(f"{args.steps} recall training steps (median of {args.repeats}, wall seconds):")
    for k, v in med.items():
        print(f"  {k:>32}: {v:6.2f} s")
    print(f"  beside the neighbour, 2 threads take {out['two_threads_beside_neighbour_vs_one']:.1f}x "
          f"the time of 1")
    print(f"cold compile of the draft's fused step (median of {args.repeats}):")
    for k, v in cmed.items():
        print(f"  {k:>40}: {v:6.1f} s")
    for w, ratio in out["compile_pool_vs_one"].items():
        print(f"  {w}, the default pool takes {ratio:.2f}x the time of one compile process")


if __name__ == "__main__":
    main()
