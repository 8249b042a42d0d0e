"""What writing the decoder layer once (minillm/decode/step.py) cost the fast decoders: their
decode steps against the copies of the layer they replaced, from the commit before the change
(0c4b8f8), interleaved in one process: benchmarks/RESULTS.md, "The decoder layer written once".

    .venv/bin/python benchmarks/shared_layer_cost.py packed 1     # PackedDecoder, batch 1
    .venv/bin/python benchmarks/shared_layer_cost.py packed 4
    .venv/bin/python benchmarks/shared_layer_cost.py compiled 1   # CompiledDecoder (compiles)

The old modules are read with `git show 0c4b8f8:<path>` and run inside today's `minillm`
package, so both sides share the model, the cache and the torch build. One torch thread; the
shipped target, a 32-token prompt, 64 greedy steps per run, 2 warm-up runs each, then 15 rounds
alternating the order; medians. Prints each side's time per step, their ratio and whether the
greedy tokens agree.
"""
from __future__ import annotations

import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

import torch

import minillm
from minillm.decode import CompiledDecoder, PackedDecoder
from minillm.kvcache import KVCache

BEFORE = "0c4b8f8"
REPO = Path(__file__).resolve().parents[1]
STEPS, ROUNDS = 64, 15


def old_module(name: str, path: str, subs=()) -> types.ModuleType:
    """minillm/<path> as it was at BEFORE, loaded as minillm.<name>."""
    src = subprocess.run(["git", "-C", str(REPO), "show", f"{BEFORE}:{path}"],
                         capture_output=True, text=True, check=True).stdout
    for a, b in subs:
        src = src.replace(a, b)
    mod = types.ModuleType(f"minillm.{name}")
    mod.__package__, mod.__file__ = "minillm", path
    sys.modules[mod.__name__] = mod
    exec(compile(src, path, "exec"), mod.__dict__)
    return mod


def main(argv: list[str]) -> int:
    which = argv[0] if argv else "packed"
    batch = int(argv[1]) if len(argv) > 1 else 1
    if which not in ("packed", "compiled") or (which == "compiled" and batch != 1):
        raise SystemExit("usage: shared_layer_cost.py packed B | compiled 1")
    torch.set_num_threads(1)
    fast = old_module("_before_fast", "minillm/fast_decode.py")
    model = minillm.load("target")
    if which == "packed":
        decoders = {"before": fast.PackedDecoder(model), "now": PackedDecoder(model)}
    else:
        comp = old_module("_before_compiled", "minillm/compiled_decode.py",
                          [("from .fast_decode import", "from ._before_fast import")])
        decoders = {"before": comp.CompiledDecoder(model), "now": CompiledDecoder(model)}
    prompt = torch.randint(0, model.config.vocab_size, (batch, 32),
                           generator=torch.Generator().manual_seed(0))

    def run(dec):
        cache = KVCache.for_model(model, batch, 32 + STEPS + 1)
        nxt = model(prompt, cache=cache, last_only=True)[:, -1].argmax(-1)
        out, t0 = [], time.perf_counter()
        for _ in range(STEPS):
            nxt = dec.step(nxt, cache).argmax(-1)
            out.append(nxt)
        return time.perf_counter() - t0, torch.stack(out).tolist()

    for dec in decoders.values():
        run(dec), run(dec)
    times, tokens = {k: [] for k in decoders}, {}
    for r in range(ROUNDS):
        order = list(decoders.items())
        for name, dec in order if r % 2 == 0 else order[::-1]:
            seconds, tokens[name] = run(dec)
            times[name].append(seconds)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{which} batch {batch}: before {med['before'] / STEPS * 1e3:.3f} ms/step, now "
          f"{med['now'] / STEPS * 1e3:.3f} ms/step, now/before {med['now'] / med['before']:.3f}, "
          f"same tokens: {tokens['before'] == tokens['now']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
