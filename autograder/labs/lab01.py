"""Lab 01's probes and speed check.

The student's counting functions return SymPy expressions, which stay in their kernel: the probe
`evaluated` reads them there, at the shapes the test chooses, and returns numbers, which the
test compares with the course's expressions evaluated by the same `values_at` in the tester:

    from autograder.labs import lab01
    got = lab01.evaluated(matmul_flops_and_bytes, [dict(B=2, D=3, F=5), ...])
    got["values"]  # [[flops, bytes] at each shape]; got["text"]: the expressions, as text
    lab01.values_at(roofline.matmul_flops_and_bytes(), [dict(B=2, D=3, F=5), ...])

Agreeing at several random shapes, to 1e-12, is agreeing as formulas (two different rational
functions of B, D, F meet only on a thin set).

The speed check: serving B requests with ONE matmul beats B matrix-vector products. A matmul
X (B x D) @ W (D x F) reads the weight W once for all B rows, so its arithmetic intensity grows
like B, while B separate requests (x_i @ W) each read all of W for 2*D*F FLOPs (intensity ~ 1/2
in fp32): memory-bound, however many there are. The FLOP and byte counts of the measured shapes
are graded exactly in the same notebook (`01_measured_counts_test`). Time is graded as a ratio
of medians measured interleaved, on one torch thread:

    time(B requests one at a time, in the tester) / time(serve_batched in the kernel: `timed_serve`)

Both sides do the same 2*B*D*F FLOPs, with B = 64 and D = F = 2048 (a 16 MB fp32 weight, far
larger than a core's L2 cache). Each timed call serves another window of the kept requests and
every output is checked afterwards, so remembering an answer does not pay. Why 1.5: graded in
the tester on a loaded 2-core AVX-512 EPYC, the one matmul measured 1.98-3.15 and a function
that still loops over the requests 0.83-1.00 (about 9x vs 1x on older cores; ranges:
autograder/README.md).
"""
from __future__ import annotations

import math

import sympy
import torch

from autograder.checks import assert_close
from autograder.labs.speedcheck import SpeedCheck, one_torch_thread
from autograder.probes import probe
from autograder.timing import time_ratio

BATCH = 64          # requests served by one step
DIM = 2048          # D = F: a 16 MB fp32 weight, far larger than the L2 cache of any CPU core
THRESHOLD = 1.5     # required time(one at a time) / time(batched)
WARMUP, REPEATS = 1, 5


# --- SymPy expressions, read where they live --------------------------------------------------
def values_at(exprs, points: list[dict], what: str = "the expression") -> list[list[float]]:
    """Each of `exprs` (a SymPy expression or number, or a tuple of them) at each point
    ({symbol name: number}, symbols matched by name): a list of floats per point. ValueError if
    a symbol is left or a value is not a real number."""
    exprs = [sympy.sympify(e) for e in (exprs if isinstance(exprs, (tuple, list)) else [exprs])]
    rows = []
    for point in points:
        row = []
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
        rows.append(row)
    return rows


@probe
def evaluated(fn, points: list[dict]) -> dict:
    """What `fn()` returns (SymPy expressions), read in the kernel: {"text": each as text,
    "values": `values_at(what it returned, points)`}."""
    out = fn()
    what = f"what {getattr(fn, '__name__', 'your function')}() returned"
    items = out if isinstance(out, (tuple, list)) else [out]
    return {"text": [str(e) for e in items], "values": values_at(out, points, what)}


# --- the speed check ------------------------------------------------------------------------
def make_requests(batch: int = BATCH, dim: int = DIM, seed: int = 0):
    """`batch` request vectors x_i (dim,) and a weight W (dim x dim), fp32, seeded."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(dim, dim, generator=g) / math.sqrt(dim)
    return list(torch.randn(batch, dim, generator=g).unbind(0)), w


_KEPT: dict = {}


def _kept(batch: int, dim: int, seed: int):
    """(X: 2 * batch requests stacked, W), built once per process: the timed calls' inputs."""
    if (batch, dim, seed) not in _KEPT:
        xs, w = make_requests(2 * batch, dim, seed)
        _KEPT[batch, dim, seed] = torch.stack(xs), w
    return _KEPT[batch, dim, seed]


def one_at_a_time(xs, w):
    """The baseline: each request is its own matrix-vector product, reading all of W again."""
    return torch.stack([x @ w for x in xs])


@probe
def timed_serve(serve_fn, batch: int, dim: int, seed: int, start: int):
    """One timed run: `serve_fn(requests start .. start + batch - 1, W)` on the kept inputs;
    returns its output."""
    x, w = _kept(batch, dim, seed)
    with torch.no_grad(), one_torch_thread():
        return serve_fn(list(x[start:start + batch].clone().unbind(0)), w)


def batching_ratio(serve_fn, *, batch: int, dim: int, warmup: int = WARMUP,
                   repeats: int = REPEATS, seed: int = 0):
    """Time `one_at_a_time` against `serve_fn` (each call on the next window of requests),
    interleaved, then check every output: .ratio = median(one at a time) / median(serve_fn)."""
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
        if not torch.is_tensor(got):
            raise AssertionError(f"serve_batched must return a tensor, got {type(got).__name__}")
        assert_close(got, want[start:start + batch], atol=1e-3, rtol=1e-3,
                     name=f"serve_batched({batch} requests of {dim}, W {dim}x{dim})")
    return r


# --- a correct candidate and the usual mistake, in the notebook's signature ---------------------
def reference_serve_batched(xs, w):
    """Stack the requests into X (B x D) and do one matmul: W is read once for all of them."""
    return torch.stack(list(xs)) @ w


def looping_serve_batched(xs, w):
    """SLOW on purpose: right answer, but still one matrix-vector product per request."""
    return torch.stack([x @ w for x in xs])


SPEED_CHECK = SpeedCheck(
    grade_id="01_batching_speed_test", threshold=THRESHOLD, measure=batching_ratio,
    reference=reference_serve_batched, counter_example=looping_serve_batched,
    workload=dict(batch=BATCH, dim=DIM), solution=("serve_batched", "01_serve_batched"),
    hint="serving {batch} requests with serve_batched was only {ratio:.2f}x faster than one "
         "matrix-vector product per request (median {candidate_ms:.3g} ms vs {baseline_ms:.3g} "
         "ms over {runs} interleaved runs); one matmul over the stacked requests reads W once "
         "and reaches at least {at_least:g}x. Does serve_batched still loop over the requests?")
check_batching_speedup = SPEED_CHECK.check
__all__ = ["values_at", "evaluated", "make_requests", "timed_serve", "check_batching_speedup",
           "THRESHOLD"]
