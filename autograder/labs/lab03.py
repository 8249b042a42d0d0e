"""Lab 03 speed check: MLA's absorbed decode step beats expanding the latent cache every step.

The claim: a multi-head latent attention (MLA) layer caches one latent c (C values) and one shared
rope key (R values) per token. The *naive* decode step up-projects every cached latent into N
per-head keys and values each step, S * C * N * (2H - R) multiply-adds for S cached positions;
the *absorbed* step folds W_uk into the query and W_uv after the attention, so it only reads
the latents: about S * N * (2C + R) multiply-adds. Both give the same output.

The timed claim is paired with deterministic ones graded exactly in the same notebook: the
outputs of naive and absorbed agree (`03_mla_absorbed_test`) and the multiply-add counts of the
two steps (`03_mla_macs_test`). Time is graded only as a ratio of medians measured interleaved in
one process, on one torch thread:

    time(naive expansion, S cached positions) / time(student's absorbed step)

at the shipped model's attention shape (N = 6 heads, H = 64, R = 32), latent C = 224, one
sequence with S = 4096 cached positions (a long context; the counted work differs 45x). On the
shared 2-core development machine (one thread, medians of 7 interleaved runs, ~0.2-0.5 s per
check), 20 runs each, the last 8 with a busy loop on the other core, measured

    reference_absorbed (the notebook's solution)         7.7x - 12.7x   (median 8.6x)
    library_absorbed (MLAAttention._attend_absorbed)     2.8x -  5.4x   (it concatenates latent
                                                                         and rope key every step
                                                                         and calls SDPA)
    naive_expand passed off as "absorbed"                0.98x - 1.01x

and, earlier, with a training job busy on one core as well: reference 3.7x - 58x (a 2 ms step is
sometimes preempted), library 2.1x - 4.4x, naive 0.92x - 1.07x. A correct absorbed step written
like the library's must pass, so THRESHOLD = 1.5: 2.5x under the worst reference run, 1.4x under
the worst library-style run, 1.4x over the worst naive run. A "half-absorbed" step (keys in
latent space, values still expanded: 2/3 of the naive work) measures 1.4x - 1.9x and may pass;
the exact multiply-add counts of `03_mla_macs_test` are the deterministic half of the claim.
tests/test_speed_checks.py re-checks the verdicts (SPEED_CHECKS / SLOW_CHECKS).

Those ranges were wall-clock medians. Under a busy loop plus another test worker on the 2 cores,
CI once saw naive_expand pass as "absorbed" (a wall-clock ratio of at least 1.5 between two
identical steps), so `time_ratio` now times CPU work in process CPU time, which a neighbour
cannot inflate. Re-measured that way on 2026-11-22, 10 runs each (the last 4 with a busy loop on
the other core; `lab03.absorbed_ratio(lab03.<name>).ratio`): reference_absorbed 10.1x - 14.8x,
library_absorbed 3.1x - 7.2x, naive_expand 0.87x - 1.06x.

    from autograder.labs import lab03
    lab03.check_absorbed_speedup(mla_attend_absorbed)   # AssertionError below THRESHOLD; ratio
"""
from __future__ import annotations

import math

import torch

from autograder.checks import assert_close
from autograder.labs import passes
from autograder.timing import time_ratio

N_HEADS, HEAD_DIM, ROPE_DIM, DIM = 6, 64, 32, 384     # the shipped target's attention shape
LATENT = 224        # C: C + R = 256 values per token per layer, the cache of GQA with K = 2
SEQ = 4096          # cached positions S
BATCH = 1
THRESHOLD = 1.5     # required time(naive) / time(absorbed); the reference measures 3.7-12.7
WARMUP, REPEATS = 2, 7

GRADE_ID = "03_mla_speed_test"

# captured at import (the grader imports autograder before student code runs)
_get_threads, _set_threads = torch.get_num_threads, torch.set_num_threads
_Generator, _randn, _cat, _einsum = torch.Generator, torch.randn, torch.cat, torch.einsum
_softmax, _matmul = torch.softmax, torch.matmul
_no_grad, _is_tensor = torch.no_grad, torch.is_tensor
_manual_seed = torch.manual_seed
_sqrt = math.sqrt


def make_inputs(seq: int = SEQ, latent: int = LATENT, batch: int = BATCH, seed: int = 0):
    """A random MLAAttention layer (the shipped model's N, H, D; rope dim R) and one decode
    step's inputs: q_nope [B, N, H-R], q_rope [B, N, R], c [B, S, C], k_rope [B, S, R]."""
    from minillm.attention.mla import MLAAttention
    from minillm.config import ModelConfig
    _manual_seed(seed)
    cfg = ModelConfig(dim=DIM, n_heads=N_HEADS, head_dim=HEAD_DIM)
    attn = MLAAttention(cfg, 0, latent_dim=latent, rope_dim=ROPE_DIM).eval()
    g = _Generator().manual_seed(seed + 1)
    q_nope = _randn(batch, N_HEADS, HEAD_DIM - ROPE_DIM, generator=g)
    q_rope = _randn(batch, N_HEADS, ROPE_DIM, generator=g)
    c = _randn(batch, seq, latent, generator=g)
    k_rope = _randn(batch, seq, ROPE_DIM, generator=g)
    return attn, q_nope, q_rope, c, k_rope


def naive_expand(attn, q_nope, q_rope, c, k_rope):
    """The baseline: up-project every cached latent to N keys and values, then plain MHA."""
    B, S, C = c.shape
    N, H, R = attn.n_heads, attn.head_dim, attn.rope_dim
    k_nope = _matmul(c, attn.k_up.weight.t()).view(B, S, N, H - R)
    v = _matmul(c, attn.v_up.weight.t()).view(B, S, N, H)
    k = _cat([k_nope, k_rope[:, :, None].expand(B, S, N, R)], dim=-1)
    q = _cat([q_nope, q_rope], dim=-1)
    p = _softmax(_einsum("bnh,bsnh->bns", q, k) / _sqrt(H), dim=-1)
    return _einsum("bns,bsnh->bnh", p, v)


def reference_absorbed(attn, q_nope, q_rope, c, k_rope):
    """The notebook's solution: attend in latent space, nothing up-projected per position."""
    B, S, C = c.shape
    N, H, R = attn.n_heads, attn.head_dim, attn.rope_dim
    q_lat = _einsum("bnd,ndc->bnc", q_nope, attn.k_up.weight.view(N, H - R, C))
    scores = (_matmul(q_lat, c.transpose(1, 2)) + _matmul(q_rope, k_rope.transpose(1, 2)))
    p = _softmax(scores / _sqrt(H), dim=-1)
    return _einsum("bnc,nhc->bnh", _matmul(p, c), attn.v_up.weight.view(N, H, C))


def library_absorbed(attn, q_nope, q_rope, c, k_rope):
    """minillm's MLAAttention._attend_absorbed in the notebook's signature (one decode step)."""
    import torch as _t
    S = c.shape[1]
    out = attn._attend_absorbed(q_nope[:, :, None], q_rope[:, :, None], c[:, None],
                                k_rope[:, None], _t.tensor([S - 1]), _t.arange(S))
    return out[:, :, 0]


def absorbed_ratio(absorbed_fn, *, seq: int = SEQ, latent: int = LATENT, warmup: int = WARMUP,
                   repeats: int = REPEATS, seed: int = 0):
    """Check `absorbed_fn(attn, q_nope, q_rope, c, k_rope)` returns the naive step's output, then
    time it against `naive_expand`, interleaved; returns the RatioResult (.ratio =
    median(naive) / median(absorbed)). One torch thread (restored afterwards)."""
    attn, q_nope, q_rope, c, k_rope = make_inputs(seq, latent, seed=seed)
    threads = _get_threads()
    _set_threads(1)
    try:
        with _no_grad():
            want = naive_expand(attn, q_nope, q_rope, c, k_rope)
            got = absorbed_fn(attn, q_nope.clone(), q_rope.clone(), c, k_rope)
            if not _is_tensor(got):
                raise AssertionError(f"mla_attend_absorbed must return a tensor, got "
                                     f"{type(got).__name__}")
            assert_close(got, want, atol=1e-4, rtol=1e-4,
                         name=f"mla_attend_absorbed (S={seq}, C={latent}) vs the naive step")

            def baseline():
                naive_expand(attn, q_nope, q_rope, c, k_rope)

            def candidate():
                absorbed_fn(attn, q_nope, q_rope, c, k_rope)

            return time_ratio(baseline, candidate, warmup=warmup, repeats=repeats)
    finally:
        _set_threads(threads)


def check_absorbed_speedup(absorbed_fn, *, at_least: float = THRESHOLD, **kw) -> float:
    """AssertionError unless `absorbed_fn` is at least `at_least` times faster than expanding
    the latent cache (S = SEQ positions); returns the measured ratio."""
    r = absorbed_ratio(absorbed_fn, **kw)
    if not r.ratio >= at_least:
        raise AssertionError(
            f"with {kw.get('seq', SEQ)} cached positions your absorbed MLA step was only "
            f"{r.ratio:.2f}x faster than up-projecting every cached latent (median "
            f"{r.candidate_s * 1e3:.3g} ms vs {r.baseline_s * 1e3:.3g} ms over "
            f"{len(r.baseline_times)} interleaved runs); a step that only reads the latents "
            f"reaches at least {at_least:g}x. Does mla_attend_absorbed still multiply the "
            f"cached latents by k_up / v_up?")
    return r.ratio



SPEED_CHECKS = {  # expected True
    GRADE_ID: lambda: passes(check_absorbed_speedup, reference_absorbed)}
COUNTER_EXAMPLES = {  # expected False
    GRADE_ID: lambda: passes(check_absorbed_speedup, naive_expand)}
SLOW_CHECKS = COUNTER_EXAMPLES   # same dict under the name tests/test_speed_checks.py reads
