"""Lab 01: `evaluated` reads the student's SymPy expressions in their kernel at the test's shapes;
the speed check times B requests served by one matmul against B matrix-vector products."""
from __future__ import annotations

import functools
import math

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
__all__ = ["values_at", "evaluated", "make_requests", "timed_serve", "check_batching_speedup",
           "THRESHOLD"]
