"""Lab 01: `evaluated` reads the student's SymPy expressions in their kernel at the test's shapes;
the speed check times B requests served by one matmul against B matrix-vector products."""
from __future__ import annotations

import functools
import math
import random

import sympy
import torch

from autograder.labs.speedcheck import SpeedCheck, assert_tensor_close, one_torch_thread
from autograder.probes import probe
from autograder.timing import time_ratio

BATCH = 64          # requests served by one step
DIM = 2048          # D = F: a 16 MB fp32 weight, far larger than the L2 cache of any CPU core
# time(one at a time) / time(batched), loaded 2-core AVX-512 EPYC: one matmul 1.98-3.15, a loop
# over the requests 0.83-1.00 (about 9x vs 1x on older cores)
THRESHOLD = 1.5
WARMUP, REPEATS = 1, 5


def values_at(exprs, points: list[dict], what: str = "the expression") -> list[list[float]]:
    """[[each of `exprs` at the point] for each point ({symbol name: number})], as floats."""
    exprs = [sympy.sympify(e) for e in (exprs if isinstance(exprs, (tuple, list)) else [exprs])]
    rows = []
    for point in points:
        rows.append(row := [])
        for i, e in enumerate(exprs):
            which = what if len(exprs) == 1 else f"item {i + 1} of {what}"
            v = e.subs({s: point[s.name] for s in e.free_symbols if s.name in point})
            if v.free_symbols:
                raise ValueError(f"{which}, {e}, still has {sorted(map(str, v.free_symbols))} "
                                 f"once {point} is put in: use only {sorted(point)}")
            try:
                row.append(float(v))
            except TypeError:
                raise ValueError(f"{which}, {e}, is {v} at {point}: not a real number") from None
    return rows


@probe
def evaluated(fn, points: list[dict]) -> dict:
    """`fn()`'s SymPy expressions read in the kernel: {"text", "values": values_at(...)}."""
    out = fn()
    what = f"what {getattr(fn, '__name__', 'your function')}() returned"
    items = out if isinstance(out, (tuple, list)) else [out]
    return {"text": [str(e) for e in items], "values": values_at(out, points, what)}


def make_requests(batch: int = BATCH, dim: int = DIM, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(dim, dim, generator=g) / math.sqrt(dim)
    return list(torch.randn(batch, dim, generator=g).unbind(0)), w


@functools.cache
def _kept(batch: int, dim: int, seed: int):
    xs, w = make_requests(2 * batch, dim, seed)
    return torch.stack(xs), w


def one_at_a_time(xs, w):
    """The baseline (and the counter-example): one matrix-vector product per request."""
    return torch.stack([x @ w for x in xs])


@probe
def timed_serve(serve_fn, batch: int, dim: int, seed: int, start: int):
    x, w = _kept(batch, dim, seed)
    with torch.no_grad(), one_torch_thread():
        return serve_fn(list(x[start:start + batch].clone().unbind(0)), w)


def batching_ratio(serve_fn, *, batch: int, dim: int, warmup: int = WARMUP,
                   repeats: int = REPEATS, seed: int = 0):
    """.ratio = median(one_at_a_time) / median(serve_fn), interleaved; every output checked."""
    x, w = _kept(batch, dim, seed)
    xs = list(x[:batch].unbind(0))
    outs = []

    def candidate():
        start = len(outs) % batch
        outs.append((start, timed_serve(serve_fn, batch, dim, seed, start)))

    with torch.no_grad():
        r = time_ratio(lambda: one_at_a_time(xs, w), candidate, warmup=warmup, repeats=repeats)
        want = x @ w
    for start, got in outs:
        assert_tensor_close(got, want[start:start + batch], 1e-3,
                            f"serve_batched({batch} requests of {dim}, W {dim}x{dim})")
    return r


def reference_serve_batched(xs, w):
    return torch.stack(list(xs)) @ w


SPEED_CHECK = SpeedCheck(
    grade_id="01_batching_speed_test", threshold=THRESHOLD, measure=batching_ratio,
    reference=reference_serve_batched, counter_example=one_at_a_time,
    workload=dict(batch=BATCH, dim=DIM), solution=("serve_batched", "01_serve_batched"),
    hint="serving {batch} requests with serve_batched was only {ratio:.2f}x faster than one "
         "matrix-vector product per request (median {candidate_ms:.3g} ms vs {baseline_ms:.3g} ms "
         "over {runs} interleaved runs); one matmul over the stacked requests reads W once and "
         "reaches at least {at_least:g}x. Does serve_batched still loop over the requests?")
check_batching_speedup = SPEED_CHECK.check


# --- the serving choice (part 6): graded by its outcome under the course's napkin -----------------
SERVING_WITHIN = 0.97      # full marks: valid, and at least this share of the best throughput
SERVING_MODELS = {          # the lecture's notation, like LLAMA_2_13B in the notebook
    "llama-2-7b": dict(D=4096, F=11008, N=32, K=32, H=128, L=32, V=32000),
    "llama-2-13b": dict(D=5120, F=13824, N=40, K=40, H=128, L=40, V=32000),
    "mistral-7b": dict(D=4096, F=14336, N=32, K=8, H=128, L=32, V=32000),
    "llama-2-70b": dict(D=8192, F=28672, N=64, K=8, H=128, L=80, V=32000),
    "llama-2-13b-gqa": dict(D=5120, F=13824, N=40, K=8, H=128, L=40, V=32000),
}
SERVING_GPUS = {"h100": dict(flops=989e12, bandwidth=3.35e12, memory=80e9),
                "a100": dict(flops=312e12, bandwidth=2.039e12, memory=80e9),
                "a100-40gb": dict(flops=312e12, bandwidth=1.555e12, memory=40e9),
                "h200": dict(flops=989e12, bandwidth=4.8e12, memory=141e9)}


def _cfg_hw(scenario: dict):
    from minillm import roofline
    from minillm.config import ModelConfig
    m, g = scenario["model"], scenario["gpu"]
    cfg = ModelConfig(vocab_size=m["V"], dim=m["D"], n_layers=m["L"], n_heads=m["N"],
                      n_kv_heads=m["K"], head_dim=m["H"], hidden_dim=m["F"],
                      tie_embeddings=False)
    return cfg, roofline.Hardware("scenario", g["flops"], g["bandwidth"], g["memory"])


def best_serving(scenario: dict) -> dict | None:
    """The course's best configuration for a scenario (minillm.roofline.best_serving_config)."""
    from minillm import roofline
    cfg, hw = _cfg_hw(scenario)
    return roofline.best_serving_config(
        cfg, hw, scenario["S"], scenario["gpus"], scenario["slo_s"], scenario["precisions"],
        scenario["link_bandwidth"], scenario["allreduce_latency_s"])


def serving_scenario(seed: int) -> dict:
    """A scenario of the serving choice, drawn from `seed`: a model and a GPU of the tables above,
    1-8 GPUs, a context, the precisions allowed, a link, and a latency SLO between 1.3 and 12
    times the fastest one-sequence step any configuration allows (so one always exists)."""
    from minillm import roofline
    rng = random.Random(seed)
    while True:
        sc = dict(model=dict(SERVING_MODELS[rng.choice(sorted(SERVING_MODELS))]),
                  gpu=dict(SERVING_GPUS[rng.choice(sorted(SERVING_GPUS))]),
                  gpus=rng.choice([1, 2, 4, 8]), S=rng.choice([512, 1000, 2048, 4096, 8192, 16384]),
                  precisions=rng.choice([[2], [2, 1], [1, 2]]),
                  link_bandwidth=rng.choice([450e9, 300e9, 60e9]),
                  allreduce_latency_s=rng.choice([0.0, 5e-6, 1e-5]))
        cfg, hw = _cfg_hw(sc)
        steps = [roofline.serving_outcome(cfg, hw, sc["S"], sc["gpus"], g, 1, p,
                                          sc["link_bandwidth"], sc["allreduce_latency_s"])
                 for g in range(1, sc["gpus"] + 1)
                 if not (sc["gpus"] % g or cfg.n_heads % g or cfg.n_kv_heads % g)
                 for p in sc["precisions"]]
        fastest = min((r["latency_s"] for r in steps if r["fits"]), default=None)
        if fastest is not None:
            sc["slo_s"] = round(fastest * rng.uniform(1.3, 12.0), 6)
            return sc


def serving_outcome(scenario: dict, choice) -> dict:
    """What `choice` ({"G", "B", "bytes_per_param"}) gives in `scenario`, by the course's napkin:
    {"valid", "why", "latency_s", "memory_per_gpu_bytes", "throughput_tok_s", "copies",
    "best_tok_s", "share"} (share = throughput / the best any valid configuration reaches)."""
    from minillm import roofline
    best = best_serving(scenario)
    row = {"choice": choice, "best_tok_s": best["throughput_tok_s"], "valid": False, "share": 0.0}
    if not isinstance(choice, dict) or not {"G", "B", "bytes_per_param"} <= set(choice):
        return row | {"why": f"return a dict with G, B and bytes_per_param, got {choice!r}"}
    G, B, bpp = choice["G"], choice["B"], choice["bytes_per_param"]
    m, gpus = scenario["model"], scenario["gpus"]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in (G, B)):
        return row | {"why": f"G and B must be positive integers, got G = {G!r}, B = {B!r}"}
    if gpus % G or m["N"] % G or m["K"] % G:
        return row | {"why": f"G = {G} must divide the {gpus} GPUs, N = {m['N']} and K = {m['K']}"}
    if bpp not in scenario["precisions"]:
        return row | {"why": f"bytes_per_param {bpp!r} is not one of {scenario['precisions']}"}
    cfg, hw = _cfg_hw(scenario)
    r = roofline.serving_outcome(cfg, hw, scenario["S"], gpus, G, B, bpp,
                                 scenario["link_bandwidth"], scenario["allreduce_latency_s"])
    row |= {k: r[k] for k in ("latency_s", "memory_per_gpu_bytes", "throughput_tok_s", "copies")}
    if not r["fits"]:
        return row | {"why": f"{r['memory_per_gpu_bytes'] / 1e9:.1f} GB per GPU does not fit in "
                             f"{hw.memory_bytes / 1e9:.0f} GB"}
    if r["latency_s"] > scenario["slo_s"] * (1 + 1e-9):
        return row | {"why": f"a step takes {r['latency_s'] * 1e3:.2f} ms, over the SLO of "
                             f"{scenario['slo_s'] * 1e3:.2f} ms"}
    return row | {"valid": True, "why": "", "share": r["throughput_tok_s"] / best["throughput_tok_s"]}


def describe_serving(scenario: dict, row: dict) -> str:
    c = row["choice"]
    head = (f"{scenario['gpus']} GPUs, S = {scenario['S']}, SLO {scenario['slo_s'] * 1e3:.2f} ms, "
            f"bytes/param in {scenario['precisions']}: ")
    if "latency_s" not in row:
        return head + row["why"]
    return head + (f"G = {c['G']}, B = {c['B']}, {c['bytes_per_param']} byte(s): "
                   f"{row['copies']} copies, step {row['latency_s'] * 1e3:.2f} ms, "
                   f"{row['memory_per_gpu_bytes'] / 1e9:.1f} GB per GPU, "
                   f"{row['throughput_tok_s']:,.0f} tokens/s = {row['share']:.1%} of the best the "
                   f"napkin allows ({row['best_tok_s']:,.0f})" + (f"; {row['why']}" if row["why"] else ""))


__all__ = ["values_at", "evaluated", "make_requests", "timed_serve", "check_batching_speedup",
           "THRESHOLD", "SERVING_WITHIN", "serving_scenario", "serving_outcome", "describe_serving"]
