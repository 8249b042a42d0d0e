"""Lab 09: probes run the student's code in their kernel on what it needs built there; the
chunk-size design task's check (`check_chunk_rule`), graded on minillm/bench/chunk_model.py's cost
model of the chunked form."""
from __future__ import annotations

import dataclasses

import torch

from autograder import labs
from autograder.probes import fresh_model, probe
from minillm.bench.chunk_model import (  # noqa: F401 (the notebook's lab09.chunk_time_us, ...)
    CPU_CORE,
    DEV_SWEEP_US,
    FAST_ARITHMETIC,
    best_chunk_us,
    chunk_time_us,
    chunk_times_us,
)
from minillm.model import Transformer


@probe
def steps_from(la_step, q, k, v, state, decay):
    """`la_step` over the T tokens: the stacked y, the final state, whether `state` is intact."""
    given, now, ys = [t.clone() for t in state], state, []
    for t in range(q.shape[-2]):
        y, now = la_step(q[:, :, t], k[:, :, t], v[:, :, t], now, decay)
        ys.append(y)
    kept = all(torch.equal(a, b) for a, b in zip(state, given))
    return torch.stack(ys, dim=2), tuple(now), kept


def call_with_config(fn, config, *args):
    """`fn(config, *args)`; the ModelConfig crosses as its fields."""
    return labs.with_config(fn, dataclasses.asdict(config), *args)


def tiny_diffusion_model(seed: int) -> Transformer:
    """A small bidirectional model (61 ids, the last [MASK]); the global RNG is left as it was."""
    with torch.random.fork_rng(devices=[]):
        return labs.random_model(seed, dict(vocab_size=61, dim=32, n_layers=2, n_heads=2,
                                            hidden_dim=48, max_seq_len=64, causal=False), 0.5)


@probe
def counted_sample(diffusion_sample, model, prompt, n_new: int, steps: int) -> dict:
    """`diffusion_sample` on a fresh checkpoint or tiny_diffusion_model(seed), counted."""
    m = fresh_model(model) if isinstance(model, str) else tiny_diffusion_model(model)
    tokens, work = labs.counted(m, diffusion_sample, prompt, n_new, steps)
    return {"tokens": tokens, "calls": work["calls"]}


# ---- the chunk-size design task, graded on the cost model of minillm/bench/chunk_model.py ----
# graded: the model's time at the rule's chunk within 20 % of the model's best over C = 1..T, on
# every (machine, T, batch, heads, head_dim) of CHUNK_CASES
CHUNK_TOLERANCE = 0.20
MACHINES = {"cpu_core": CPU_CORE, "fast_arithmetic": FAST_ARITHMETIC}
CHUNK_CASES = tuple((m, T, B, N, H) for m in MACHINES for T in (256, 1024, 4096, 16384)
                    for B in (1, 8) for N in (1, 4, 16) for H in (16, 64, 128))
CHUNK_CASES_VISIBLE = (("cpu_core", 1024, 1, 6, 64), ("cpu_core", 4096, 8, 16, 128),
                       ("cpu_core", 16384, 1, 1, 16), ("fast_arithmetic", 4096, 1, 6, 64))


@probe
def chunk_choices(choose, cases) -> list:
    """The student's choose_chunk on each (machine's constants, T, batch, n_heads, head_dim)."""
    return [choose(T, B, N, H, dict(machine)) for machine, T, B, N, H in cases]


def check_chunk_rule(choose, cases=CHUNK_CASES, *, quiet: bool = False) -> list[dict]:
    """AssertionError unless the model's time at the rule's chunk is within CHUNK_TOLERANCE of the
    model's best on every case; prints one line per case unless quiet. Returns the rows."""
    picks = chunk_choices(choose, [(MACHINES[m], T, B, N, H) for m, T, B, N, H in cases])
    rows, bad = [], []
    for (m, T, B, N, H), c in zip(cases, picks):
        c = labs.whole_number(c, 1, T, f"choose_chunk({T}, {B}, {N}, {H}, <{m}>)", "T")
        times = chunk_times_us(T, B, N, H, MACHINES[m])
        got, best = float(times[c - 1]), float(times.min())
        ok = got <= best * (1 + CHUNK_TOLERANCE)
        rows.append({"case": (m, T, B, N, H), "chunk": c, "us": got, "best_us": best,
                     "best_chunk": int(times.argmin()) + 1, "ok": ok})
        if not quiet:
            print(f"  {m:>15}, T = {T:>5}, batch {B}, {N:>2} heads of {H:>3}: chunk {c:>5} -> "
                  f"{got / 1e3:8.2f} ms, best {best / 1e3:8.2f} ms ({got / best:.2f}x)"
                  f"{'' if ok else '  TOO SLOW'}")
        if not ok:
            bad.append(rows[-1])
    if bad:
        worst = max(bad, key=lambda r: r["us"] / r["best_us"])
        m, T, B, N, H = worst["case"]
        raise AssertionError(
            f"{len(bad)} of {len(rows)} cases: the model's time at your chunk is more than "
            f"{CHUNK_TOLERANCE:.0%} above its best; worst: {m}, T = {T}, batch {B}, {N} heads of "
            f"{H}: chunk {worst['chunk']}, {worst['us'] / 1e3:.2f} ms against "
            f"{worst['best_us'] / 1e3:.2f} ms. Short chunks pay the fixed cost of a chunk many "
            f"times; long ones pay the C x C work inside each")
    return rows


__all__ = ["steps_from", "call_with_config", "tiny_diffusion_model", "counted_sample",
           "chunk_time_us", "chunk_times_us", "best_chunk_us", "chunk_choices",
           "check_chunk_rule", "CPU_CORE", "FAST_ARITHMETIC", "MACHINES", "CHUNK_CASES",
           "CHUNK_CASES_VISIBLE", "CHUNK_TOLERANCE", "DEV_SWEEP_US"]
