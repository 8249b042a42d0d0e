"""Exact filtered distributions on hand-made logits, and sampling frequencies that match them."""

import pytest
import torch

from minillm.sampling import (
    SamplingParams,
    filter_logits,
    probabilities,
    sample,
    top_k_filter,
    top_p_filter,
)

PROBS = torch.tensor([0.05, 0.4, 0.1, 0.3, 0.15])       # sorted: 1 (.4), 3 (.3), 4 (.15), 2, 0
LOGITS = PROBS.log()


def test_temperature_scales_logits_exactly():
    for t in (0.5, 1.0, 2.0):
        expected = torch.softmax(LOGITS / t, -1)
        assert torch.allclose(probabilities(LOGITS, temperature=t), expected, atol=1e-7)


def test_temperature_zero_is_argmax():
    assert probabilities(LOGITS, temperature=0).tolist() == [0, 1, 0, 0, 0]
    assert sample(LOGITS, temperature=0).item() == 1


def test_top_k_keeps_k_largest():
    kept = torch.isfinite(top_k_filter(LOGITS, 2))
    assert kept.tolist() == [False, True, False, True, False]
    p = probabilities(LOGITS, top_k=2)
    assert torch.allclose(p, torch.tensor([0, 0.4 / 0.7, 0, 0.3 / 0.7, 0]), atol=1e-6)


def test_top_k_zero_or_large_is_identity():
    assert torch.equal(top_k_filter(LOGITS, 0), LOGITS)
    assert torch.equal(top_k_filter(LOGITS, 99), LOGITS)


@pytest.mark.parametrize("p, kept", [
    (0.4, [1]),            # the top token alone reaches 0.4
    (0.41, [1, 3]),        # 0.4 < 0.41: token 3 crosses the line and is kept
    (0.7, [1, 3]),         # exactly reached by 0.4 + 0.3 (float: 0.70000005 >= 0.7)
    (0.71, [1, 3, 4]),
    (0.85, [1, 3, 4]),
    (0.86, [1, 3, 4, 2]),
    (1.0, [0, 1, 2, 3, 4]),
    (0.01, [1]),           # the most probable token is always kept
])
def test_top_p_keeps_the_token_that_crosses_p(p, kept):
    mask = torch.isfinite(top_p_filter(LOGITS, p))
    assert sorted(torch.nonzero(mask).flatten().tolist()) == sorted(kept)
    dist = probabilities(LOGITS, top_p=p)
    expected = torch.zeros(5)
    expected[kept] = PROBS[kept] / PROBS[kept].sum()
    assert torch.allclose(dist, expected, atol=1e-6)


def test_filters_compose_in_order_temperature_topk_topp():
    t, k, p = 2.0, 3, 0.6
    base = torch.softmax(LOGITS / t, -1)
    top3 = base.topk(3).indices
    renorm = torch.zeros(5)
    renorm[top3] = base[top3] / base[top3].sum()
    order = renorm.argsort(descending=True)
    cum, keep = 0.0, []
    for i in order.tolist():
        if cum >= p:
            break
        keep.append(i)
        cum += renorm[i].item()
    expected = torch.zeros(5)
    expected[keep] = renorm[keep] / renorm[keep].sum()
    assert torch.allclose(probabilities(LOGITS, t, k, p), expected, atol=1e-6)


def test_batched_rows_are_filtered_independently():
    logits = torch.stack([LOGITS, LOGITS.flip(0)])
    out = torch.isfinite(filter_logits(logits, top_k=1))
    assert out.tolist() == [[False, True, False, False, False], [False, False, False, True, False]]


def _chi_square(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    n = counts.sum().item()
    support = probs > 0
    exp = probs[support] * n
    return float(((counts[support] - exp) ** 2 / exp).sum()), int(support.sum()) - 1


@pytest.mark.parametrize("t, k, p", [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.5, 3, 1.0), (1.0, 0, 0.75),
                                     (1.3, 4, 0.9)])
def test_sampling_frequencies_match_filtered_distribution(t, k, p):
    gen = torch.Generator().manual_seed(1234)
    n = 40_000
    ids = sample(LOGITS.expand(n, 5), t, k, p, generator=gen)
    counts = torch.bincount(ids, minlength=5).float()
    probs = probabilities(LOGITS, t, k, p)
    assert counts[probs == 0].sum() == 0, "sampled a token the filters removed"
    stat, dof = _chi_square(counts, probs)
    # 99.9% quantile of chi-square for dof <= 4 is < 18.5: a wrong temperature or renormalisation
    # moves the statistic into the hundreds at n = 40k.
    assert stat < 18.5, (stat, dof, counts / n, probs)


def test_sampling_is_reproducible_with_a_seeded_generator():
    a = sample(LOGITS.expand(100, 5), generator=torch.Generator().manual_seed(7))
    b = sample(LOGITS.expand(100, 5), generator=torch.Generator().manual_seed(7))
    assert torch.equal(a, b)


@pytest.mark.parametrize("kwargs, match", [
    (dict(temperature=-0.1), "temperature"),
    (dict(temperature=float("nan")), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(top_k=-1), "top_k"),
    (dict(top_k=2.5), "top_k"),
    (dict(max_new_tokens=-1), "max_new_tokens"),
])
def test_bad_sampling_params_raise_clear_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_bad_params_rejected_by_sample_too():
    with pytest.raises(ValueError, match="top_p"):
        sample(LOGITS, top_p=0)
    with pytest.raises(ValueError, match="temperature"):
        sample(LOGITS, temperature=-1)
