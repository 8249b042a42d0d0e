"""minillm.bench.phase_costs: the non-negative fits, the predicted totals, and the timers' shapes."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from minillm.bench import phase_costs as pc
from minillm.config import ModelConfig
from minillm.kvcache import KVCache
from minillm.model import Transformer


def test_nonneg_lstsq_matches_plain_least_squares_when_that_is_non_negative():
    rng = np.random.default_rng(0)
    A = rng.uniform(0, 1, (20, 3))
    beta = np.array([0.5, 2.0, 0.1])
    y = A @ beta + rng.normal(0, 1e-3, 20)
    got = pc.nonneg_lstsq(A.T, y)
    want = np.linalg.lstsq(A, y, rcond=None)[0]
    assert np.all(want > 0) and np.allclose(got, want)


def test_nonneg_lstsq_is_the_best_non_negative_fit():
    rng = np.random.default_rng(1)
    for _ in range(30):
        A = rng.normal(0, 1, (12, 3))
        y = rng.normal(0, 1, 12)
        w = rng.uniform(0.5, 2, 12)
        got = pc.nonneg_lstsq(A.T, y, weights=w)
        assert np.all(got >= 0)
        err = np.sum(w * (A @ got - y) ** 2)
        for _ in range(200):            # no non-negative point nearby does better
            trial = np.clip(got + rng.normal(0, 0.05, 3), 0, None)
            assert np.sum(w * (A @ trial - y) ** 2) >= err - 1e-12


def test_a_straight_line_with_a_negative_intercept_is_clamped_at_zero():
    # convex points: a plain line through them has a negative intercept
    P = np.array([1, 32, 64, 128, 256, 512], float)
    t = 1e-4 * P + 2e-7 * P ** 2
    slope, intercept = np.polyfit(P, t, 1)
    assert intercept < 0
    fit = pc.fit_prefill(dict(zip(P, t)), pair_vs_token=0.0)
    assert fit.fixed >= 0 and fit.per_token > 0 and fit.per_pair == 0


def test_fit_prefill_recovers_the_costs_it_was_made_of():
    a, b, r = 6e-3, 2e-4, 4e-4
    P = np.array([1, 8, 32, 64, 128, 256, 512], float)
    t = a + b * (P + r * P * (P + 1) / 2)
    fit = pc.fit_prefill(dict(zip(P, t)), pair_vs_token=r)
    assert fit.fixed == pytest.approx(a) and fit.per_token == pytest.approx(b)
    assert fit.per_pair == pytest.approx(b * r)
    assert np.allclose(fit(P), t)
    free = pc.fit_prefill(dict(zip(P, t)))             # c fitted freely: the same here
    assert free.per_pair == pytest.approx(b * r, rel=1e-6)
    with pytest.raises(ValueError, match="at least 3"):
        pc.fit_prefill({1: 1e-3, 2: 2e-3})
    with pytest.raises(ValueError, match="pair_vs_token"):
        pc.fit_prefill({1: 1e-3, 2: 2e-3}, pair_vs_token=-1)


def test_fit_decode_and_the_predicted_totals():
    dec = pc.fit_decode({8: 4e-3 + 9 * 1e-6, 511: 4e-3 + 512 * 1e-6})
    assert dec.fixed == pytest.approx(4e-3) and dec.per_key == pytest.approx(1e-6)
    flat = pc.fit_decode({8: 5e-3, 511: 4e-3})           # a falling line: the slope is 0
    assert flat.per_key == 0 and flat.fixed > 0
    pre = pc.PrefillFit(1e-2, 1e-3, 0.0)
    naive, cached = pc.predicted_totals(pre, dec, prompt_len=4, new_tokens=3)
    assert naive == pytest.approx(sum(1e-2 + 1e-3 * (4 + t) for t in range(3)))
    assert cached == pytest.approx(pre(4) + dec(4) + dec(5))
    with pytest.raises(ValueError):
        pc.predicted_totals(pre, dec, 0, 3)


def test_flop_counts_of_the_shipped_shape():
    cfg = ModelConfig(vocab_size=100, dim=384, n_layers=6, n_heads=6, n_kv_heads=6,
                      hidden_dim=1024)
    assert pc.flops_per_token(cfg) == 2 * 6 * (2 * 384 * 384 * 2 + 3 * 384 * 1024)
    assert pc.flops_per_pair(cfg) == 4 * 6 * 384


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return Transformer(ModelConfig(vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2,
                                   hidden_dim=48, max_seq_len=64)).eval()


def test_the_timers_return_one_time_per_round_and_key(tiny):
    def make(batch, max_len):
        return KVCache.for_model(tiny, batch, max_len)
    pre = pc.time_prefill(tiny, make, [1, 8], warmup=0, repeats=2)
    assert sorted(pre) == [1, 8] and all(len(v) == 2 and min(v) >= 0 for v in pre.values())
    dec = pc.time_decode(tiny, make, [(1, 4), (3, 10)], steps=2, warmup=0, repeats=3)
    assert sorted(dec) == [(1, 4), (3, 10)] and all(len(v) == 3 for v in dec.values())
    calls = []
    both = pc.time_phases(tiny, make, [1, 4], [2, 9], steps=3, extra={"x": lambda: calls.append(1)},
                          warmup=1, repeats=2)
    assert sorted(both["prefill"]) == [1, 4] and sorted(both["decode"]) == [2, 9]
    assert len(both["extra"]["x"]) == 2 and len(calls) == 3
    assert pc.spread({"a": [1.0, 1.5, 1.0]}) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="does not fit"):
        pc.time_prefill(tiny, make, [65])
    with pytest.raises(ValueError, match="does not fit"):
        pc.time_decode(tiny, make, [(1, 64)])


def test_step_times_sees_every_forward_pass(tiny):
    seen = []
    steps, out = pc.step_times(tiny, lambda: [tiny(torch.ones(1, 3, dtype=torch.long))
                                              for _ in range(4)] and "done",
                               on_step=lambda: seen.append(1))
    assert out == "done" and len(steps) == 4 and len(seen) == 4 and np.all(steps >= 0)
