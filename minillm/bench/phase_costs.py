"""Prefill and decode, measured: the cost of a forward pass against the prompt length, the context
and the batch, fitted with the shape the physics gives it, and the totals it predicts (lab 02).

    from minillm.bench import phase_costs as pc
    from minillm.kvcache import KVCache
    make_cache = lambda batch, max_len: KVCache.for_model(model, batch, max_len)
    ttft = pc.time_prefill(model, make_cache, [1, 32, 128, 256, 512])          # {P: [s, ...]}
    both = pc.time_phases(model, make_cache, [1, 32, 128, 256, 512], [8, 256, 511])
    prefill = pc.fit_prefill(pc.minima(both["prefill"]),                         # a + b P + c pairs
                             pc.flops_per_pair(model.config) / pc.flops_per_token(model.config))
    decode = pc.fit_decode(pc.minima(both["decode"]))                            # c0 + c1 (C + 1)
    naive_s, cached_s = pc.predicted_totals(prefill, decode, prompt_len=32, new_tokens=480)

**CPU time, not the wall clock.** Every timing here is `time.process_time` by default: the CPU
seconds this process spent. A neighbour that takes the core for a while (another program, a busy
loop, a second notebook) adds its whole time slice to a wall-clock measurement and nothing to the
CPU time. It is the right clock for CPU work on one torch thread; it is wrong for GPU work (the
device's time is not CPU time) and with several threads (their seconds add up). It cannot undo a
neighbour that slows the core itself by sharing its caches and memory: a decode step, mostly
memory traffic, then costs up to ~1.5x more CPU time, while a compute-bound prefill moves by a few
per cent. Hence `time_phases`: both phases in the same interleaved rounds, so that each round's
figures see the same machine, and `minima`: the fastest repeat of each.

**Fits with no negative cost.** A forward pass over P new tokens costs a fixed part (reading every
weight once, dispatching a hundred small operations), a part per token (2 FLOPs per weight) and a
part per attended (query, key) pair (P(P+1)/2 of them in a causal prefill). `fit_prefill` fits
exactly that, `a + b P + c P(P+1)/2` (with c = b times the FLOP ratio of a pair to a token, or
free), and `fit_decode` a decode step at context C, `c0 + c1 (C + 1)` (one query over C + 1
keys), by least squares on relative errors with every coefficient >= 0 (`nonneg_lstsq`): a
straight line through noisy points can come out with a negative intercept ("TTFT = -3.9 ms + 545
us per prompt token"), which no machine has.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from statistics import median as _median
from time import process_time
from typing import Callable, Iterable, Mapping

import numpy as np
import torch

from .. import roofline
from .timing import cpu_time_interleaved

__all__ = ["prefill_fns", "decode_fns", "time_prefill", "time_decode", "time_phases",
           "cpu_roofline", "step_times", "medians", "minima", "spread", "nonneg_lstsq",
           "PrefillFit", "DecodeFit", "flops_per_token", "flops_per_pair",
           "fit_prefill", "fit_decode", "predicted_totals"]


# ---- measuring -------------------------------------------------------------------------------
def _prompts(model, shapes, seed):
    g = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    return {key: torch.randint(1, model.config.vocab_size, shape, generator=g).to(device)
            for key, shape in shapes.items()}


def prefill_fns(model, make_cache: Callable, lengths: Iterable[int], seed: int = 0) -> dict:
    """{P: a function that runs one prefill}: a fresh cache `make_cache(1, P)`, then one forward
    pass over a random P-token prompt with `last_only=True` -- the time to first token."""
    lengths = [int(P) for P in lengths]
    if not lengths or min(lengths) < 1:
        raise ValueError(f"prompt lengths must be >= 1, got {lengths}")
    if max(lengths) > model.config.max_seq_len:
        raise ValueError(f"a {max(lengths)}-token prompt does not fit the model's context of "
                         f"{model.config.max_seq_len}")
    prompts = _prompts(model, {P: (1, P) for P in lengths}, seed)

    def prefill(P):
        cache = make_cache(1, P)
        with torch.no_grad():
            model(prompts[P], cache=cache, last_only=True)

    return {P: (lambda P=P: prefill(P)) for P in lengths}


def decode_fns(model, make_cache: Callable, points: Iterable[tuple[int, int]], steps: int = 1,
               seed: int = 0) -> dict:
    """{(B, C): a function that runs `steps` decode steps of B sequences at context C}: a cache
    `make_cache(B, C + 1)` whose `seq_len` is set to C before each step (as if C positions were
    held: their values do not change the time), then one forward pass of B new tokens. Several
    steps in a row run as in a real loop, the weights still warm in the CPU's caches from the
    step before; divide the time by `steps`."""
    points = [(int(B), int(C)) for B, C in points]
    if not points or min(B for B, _ in points) < 1 or min(C for _, C in points) < 0:
        raise ValueError(f"need points (batch >= 1, context >= 0), got {points}")
    if max(C for _, C in points) + 1 > model.config.max_seq_len:
        raise ValueError(f"context {max(C for _, C in points)} + 1 does not fit the model's "
                         f"{model.config.max_seq_len} positions")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    caches = {pt: make_cache(pt[0], pt[1] + 1) for pt in points}
    ids = _prompts(model, {pt: (pt[0], 1) for pt in points}, seed)

    def run(pt):
        cache = caches[pt]
        with torch.no_grad():
            for _ in range(steps):
                cache.seq_len = pt[1]
                model(ids[pt], cache=cache)

    return {pt: (lambda pt=pt: run(pt)) for pt in points}


def time_prefill(model, make_cache: Callable, lengths: Iterable[int], *, warmup: int = 1,
                 repeats: int = 5, seed: int = 0, timer=cpu_time_interleaved
                 ) -> dict[int, list[float]]:
    """Seconds of one prefill (`prefill_fns`) per prompt length, interleaved over the lengths
    (`warmup` untimed rounds, `repeats` timed ones; CPU time unless `timer` says otherwise).
    Returns {P: [seconds of each timed round]}."""
    return timer(prefill_fns(model, make_cache, lengths, seed), warmup=warmup, repeats=repeats)


def time_decode(model, make_cache: Callable, points: Iterable[tuple[int, int]], *,
                steps: int = 1, warmup: int = 1, repeats: int = 5, seed: int = 0,
                timer=cpu_time_interleaved) -> dict[tuple[int, int], list[float]]:
    """Seconds per decode step (`decode_fns`: `steps` in a row per call, the time divided by
    `steps`) per (batch B, context C), interleaved over the points.
    Returns {(B, C): [seconds per step of each timed round]}."""
    fns = decode_fns(model, make_cache, points, steps, seed)
    try:
        times = timer(fns, warmup=warmup, repeats=repeats)
    finally:
        fns.clear()                    # the caches: B = 64 at 257 positions is 300 MB of fp32
    return {pt: [t / steps for t in ts] for pt, ts in times.items()}


def time_phases(model, make_cache: Callable, lengths: Iterable[int], contexts: Iterable[int], *,
                steps: int = 16, extra: Mapping[str, Callable] | None = None, warmup: int = 1,
                repeats: int = 5, seed: int = 0, timer=cpu_time_interleaved) -> dict:
    """Both phases in the same interleaved rounds: a prefill at each length, `steps` decode
    steps in a row (B = 1) at each context, and the functions in `extra` (e.g. whole
    generations to check a prediction against), so that every figure of a round sees the same
    machine: a neighbour that slows the memory system for a while slows all of them alike.
    Returns {"prefill": {P: [s]}, "decode": {C: [s per step]}, "extra": {name: [s]}}."""
    pre = prefill_fns(model, make_cache, lengths, seed)
    dec = decode_fns(model, make_cache, [(1, C) for C in contexts], steps, seed + 1)
    fns = {**{("prefill", P): f for P, f in pre.items()},
           **{("decode", C): f for (_, C), f in dec.items()},
           **{("extra", name): f for name, f in (extra or {}).items()}}
    try:
        times = timer(fns, warmup=warmup, repeats=repeats)
    finally:
        fns.clear()
        dec.clear()
    out: dict = {"prefill": {}, "decode": {}, "extra": {}}
    for (kind, key), ts in times.items():
        out[kind][key] = [t / steps for t in ts] if kind == "decode" else list(ts)
    return out


def cpu_roofline(dim: int = 2048, batches: Iterable[int] = (1, 4, 16, 64, 256, 512), *,
                 warmup: int = 1, repeats: int = 5, seed: int = 0, timer=cpu_time_interleaved
                 ) -> dict:
    """The two roofs this core reaches at least (`roofline.empirical_roofline`): one fp32 matmul
    X W, W of dim x dim, at each batch size, interleaved, the fastest repeat in CPU time (what
    the core reached; a neighbour sharing its caches only slows a repeat down, see `minima`:
    with medians, a busy neighbour once pulled the peak under what the model's own prefill
    reached). Returns its dict (peak_flops_per_s, bandwidth_bytes_per_s, ridge_intensity) plus
    `batches`, `intensity` and `flops_per_s` of every point. Batches up to 512 reach the
    matmul's peak on one core, so a model's prefill (smaller matmuls, attention, a hundred small
    ops) stays under it."""
    batches = [int(b) for b in batches]
    g = torch.Generator().manual_seed(seed)
    W = torch.randn(dim, dim, generator=g) / dim ** 0.5
    X = {b: torch.randn(b, dim, generator=g) for b in batches}
    times = timer({b: (lambda x=X[b]: x @ W) for b in batches}, warmup=warmup, repeats=repeats)
    intensity, achieved = [], []
    for b in batches:
        flops, nbytes = roofline.matmul_counts(b, dim, dim, 4)
        intensity.append(flops / nbytes)
        achieved.append(flops / min(times[b]))
    return {**roofline.empirical_roofline(intensity, achieved), "batches": batches,
            "intensity": intensity, "flops_per_s": achieved}


def step_times(model, run: Callable[[], object], on_step: Callable[[], object] | None = None,
               clock: Callable[[], float] = process_time):
    """Run `run()` and return (seconds of each forward pass of `model` while it ran, its result):
    a forward hook reads `clock` (CPU time by default) at the end of every pass, so entry i is
    the time from the end of pass i - 1 (or the start) to the end of pass i -- the pass itself
    plus the sampling and bookkeeping before it. `on_step` (e.g. a progress bar's update) runs
    in the hook after the clock is read."""
    stamps: list[float] = []

    def hook(module, inputs, output):
        stamps.append(clock())
        if on_step is not None:
            on_step()

    handle = model.register_forward_hook(hook)
    try:
        t0 = clock()
        out = run()
    finally:
        handle.remove()
    return np.diff([t0] + stamps), out


def medians(times: Mapping) -> dict:
    """{key: median of its list of timings}."""
    return {k: float(_median(v)) for k, v in times.items()}


def minima(times: Mapping) -> dict:
    """{key: the smallest of its timings}. In CPU time a neighbour can only add to a run (by
    sharing the core's caches and memory), never take away, so the fastest of a few interleaved
    repeats is the closest to what the work itself costs; under a bursty load it is also the
    figure most likely to come from the same (quiet) moment for every key."""
    return {k: float(min(v)) for k, v in times.items()}


def spread(times: Mapping) -> float:
    """The largest (max - min) / median over the keys' timings: how much the repeats of one
    measurement disagreed (0.05 = 5 %)."""
    return max((max(v) - min(v)) / _median(v) for v in times.values())


# ---- fitting ---------------------------------------------------------------------------------
def nonneg_lstsq(columns: Iterable, y, weights=None) -> np.ndarray:
    """Least squares `sum_i w_i (sum_j x_ij beta_j - y_i)^2` over beta >= 0, exactly: the best
    unconstrained fit on every subset of the columns (the others held at 0) that comes out
    non-negative (a handful of columns; 2^k subsets)."""
    A = np.column_stack([np.asarray(c, dtype=float) for c in columns])
    y = np.asarray(y, dtype=float)
    if A.shape[0] != y.shape[0] or A.shape[1] > 8:
        raise ValueError(f"need one value per row and at most 8 columns, got {A.shape}, "
                         f"{y.shape}")
    w = np.ones_like(y) if weights is None else np.sqrt(np.asarray(weights, dtype=float))
    Aw, yw = A * w[:, None], y * w
    best, best_err = np.zeros(A.shape[1]), float(np.sum(yw ** 2))
    for keep in itertools.product((False, True), repeat=A.shape[1]):
        idx = [j for j, k in enumerate(keep) if k]
        if not idx:
            continue
        sol = np.linalg.lstsq(Aw[:, idx], yw, rcond=None)[0]
        if np.any(sol < 0):
            continue
        beta = np.zeros(A.shape[1])
        beta[idx] = sol
        err = float(np.sum((Aw @ beta - yw) ** 2))
        if err < best_err - 1e-15 * max(1.0, best_err):
            best, best_err = beta, err
    return best


@dataclass(frozen=True)
class PrefillFit:
    """TTFT(P) = fixed + per_token * P + per_pair * P (P + 1) / 2, in seconds."""
    fixed: float            # a: one pass, whatever its length (weights read, ops dispatched)
    per_token: float        # b: each prompt token (2 FLOPs per weight)
    per_pair: float         # c: each (query, key) pair attention scores in a causal prefill

    def __call__(self, P):
        P = np.asarray(P, dtype=float)
        return self.fixed + self.per_token * P + self.per_pair * P * (P + 1) / 2


@dataclass(frozen=True)
class DecodeFit:
    """step(C) = fixed + per_key * (C + 1): one new token attending over C cached keys and its
    own, in seconds."""
    fixed: float            # c0: the whole pass for one token
    per_key: float          # c1: reading one more cached key and value, in every layer

    def __call__(self, C):
        return self.fixed + self.per_key * (np.asarray(C, dtype=float) + 1)


def _points(seconds: Mapping, what: str, least: int):
    xs = np.array(sorted(seconds), dtype=float)
    ys = np.array([seconds[k] for k in sorted(seconds)], dtype=float)
    if len(xs) < least or np.any(ys <= 0) or not np.all(np.isfinite(ys)):
        raise ValueError(f"{what}: need at least {least} lengths with positive times, got "
                         f"{dict(seconds)}")
    return xs, ys


def flops_per_token(cfg) -> int:
    """FLOPs one token costs in the weight matrices of every layer: 2 per weight,
    2 L (2 D N H + 2 D K H + 3 D F) (the output head, once per pass, is part of the fixed cost)."""
    c = cfg
    return 2 * c.n_layers * (2 * c.dim * c.n_heads * c.head_dim
                             + 2 * c.dim * c.n_kv_heads * c.head_dim + 3 * c.dim * c.hidden_dim)


def flops_per_pair(cfg) -> int:
    """FLOPs of one (query, key) pair of attention, every head of every layer: a score and a
    weighted sum of H values, 4 L N H."""
    return 4 * cfg.n_layers * cfg.n_heads * cfg.head_dim


def fit_prefill(seconds: Mapping[int, float], pair_vs_token: float | None = None) -> PrefillFit:
    """Fit `PrefillFit` to {prompt length: seconds} with every coefficient >= 0, each point
    weighted by its relative error (a 1-token pass counts as much as a 512-token one).

    With `pair_vs_token` (FLOPs of an attended pair / FLOPs of a token,
    `flops_per_pair(cfg) / flops_per_token(cfg)`) the prefill is taken to run all its FLOPs at
    one rate, TTFT = a + b (P + pair_vs_token P (P + 1) / 2): two coefficients, from 2 lengths on.
    Without it the pair cost c is fitted freely (3 lengths at least); on one CPU core the two
    agree, but the free fit trades b against c from run to run."""
    if pair_vs_token is None:
        P, t = _points(seconds, "fit_prefill", 3)
        a, b, c = nonneg_lstsq([np.ones_like(P), P, P * (P + 1) / 2], t, weights=1 / t ** 2)
        return PrefillFit(float(a), float(b), float(c))
    if not (pair_vs_token >= 0 and np.isfinite(pair_vs_token)):
        raise ValueError(f"pair_vs_token must be a finite number >= 0, got {pair_vs_token}")
    P, t = _points(seconds, "fit_prefill", 2)
    a, b = nonneg_lstsq([np.ones_like(P), P + pair_vs_token * P * (P + 1) / 2], t,
                        weights=1 / t ** 2)
    return PrefillFit(float(a), float(b), float(b) * float(pair_vs_token))


def fit_decode(seconds: Mapping[int, float]) -> DecodeFit:
    """Fit `DecodeFit` to {context: seconds of one decode step} (at least 2 contexts), both
    coefficients >= 0, relative errors."""
    C, t = _points(seconds, "fit_decode", 2)
    c0, c1 = nonneg_lstsq([np.ones_like(C), C + 1], t, weights=1 / t ** 2)
    return DecodeFit(float(c0), float(c1))


def predicted_totals(prefill: Callable, decode: Callable, prompt_len: int, new_tokens: int
                     ) -> tuple[float, float]:
    """(naive, cached) seconds for `new_tokens` tokens after a `prompt_len`-token prompt: naive
    step t is a prefill of P + t tokens; the cached loop is one prefill of P, then step t
    (t = 1 .. n - 1) decodes one token at context P + t - 1."""
    P, n = int(prompt_len), int(new_tokens)
    if P < 1 or n < 1:
        raise ValueError(f"need prompt_len >= 1 and new_tokens >= 1, got {P}, {n}")
    t = np.arange(n)
    naive = float(np.sum(prefill(P + t)))
    cached = float(prefill(P)) + float(np.sum(decode(P + t[1:] - 1)))
    return naive, cached
