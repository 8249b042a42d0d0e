"""Speculative sampling: exactness (statistical and greedy), cache roll-back, drafters."""
import pytest
import torch

import minillm
import minillm.speculative as spec
from minillm.config import ModelConfig
from minillm.generate import generate_cached
from minillm.model import Transformer
from minillm.sampling import SamplingParams
from minillm.speculative import (ModelDrafter, PromptLookupDrafter, expected_speedup,
                                 expected_tokens_per_step, residual_distribution,
                                 speculative_generate, verify)

# chi-square critical value for 4 degrees of freedom at p = 0.001
CHI2_4DF_P001 = 18.47


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def first_token_counts(p, q, n, seed=0, k=2):
    """Emit the first token of a speculative step n times (draft tokens drawn from q)."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.zeros(p.shape[-1])
    for _ in range(n):
        draft = [int(torch.multinomial(q[i], 1, generator=g)) for i in range(k)]
        accepted, nxt = verify(p, q, draft, g)
        counts[draft[0] if accepted > 0 else nxt] += 1
    return counts


P = torch.tensor([[0.40, 0.30, 0.15, 0.10, 0.05]] * 3)
Q = torch.tensor([[0.05, 0.10, 0.15, 0.30, 0.40], [0.2] * 5])


def test_verify_reproduces_the_target_distribution():
    counts = first_token_counts(P, Q, 6000)
    assert chi_square(counts, P[0]) < CHI2_4DF_P001, counts


def test_a_wrong_residual_is_caught(monkeypatch):
    """Resampling from p itself (instead of max(0, p - q)) over-weights what the draft liked;
    the same test must reject it, else it proves nothing."""
    monkeypatch.setattr(spec, "residual_distribution", lambda p, q: p)
    counts = first_token_counts(P, Q, 6000)
    assert chi_square(counts, P[0]) > 5 * CHI2_4DF_P001


def test_residual_formula():
    p, q = torch.tensor([0.5, 0.3, 0.2]), torch.tensor([0.2, 0.5, 0.3])
    torch.testing.assert_close(residual_distribution(p, q), torch.tensor([1.0, 0.0, 0.0]))
    torch.testing.assert_close(residual_distribution(p, p), p)


def tiny(seed, layers=1):
    torch.manual_seed(seed)
    return Transformer(ModelConfig(vocab_size=5, dim=16, n_layers=layers, n_heads=2,
                                   hidden_dim=32, max_seq_len=16)).eval()


@torch.no_grad()
def test_two_token_sequences_follow_the_target_distribution():
    """End to end with real (tiny, vocab 5) models: the distribution over the 25 possible
    two-token continuations equals the target's, computed exactly by enumeration."""
    target, draft = tiny(1), tiny(2)
    for p in target.parameters():            # sharpen the target so it differs from the draft
        p.mul_(3.0)
    prompt = [1, 3]
    first = torch.softmax(target(torch.tensor([prompt]))[0, -1], -1)
    exact = torch.zeros(25)
    for a in range(5):
        second = torch.softmax(target(torch.tensor([prompt + [a]]))[0, -1], -1)
        exact[a * 5:(a + 1) * 5] = first[a] * second
    g = torch.Generator().manual_seed(0)
    counts = torch.zeros(25)
    params = SamplingParams(temperature=1.0, max_new_tokens=2)
    for _ in range(3000):
        out, _ = speculative_generate(target, ModelDrafter(draft), prompt, 3, params, g)
        counts[out[0] * 5 + out[1]] += 1
    keep = exact * 3000 >= 5                         # chi-square needs expected counts >= 5
    c, e = counts[keep], exact[keep]
    if (~keep).any():                                # pool the rare outcomes into one cell
        c = torch.cat([c, counts[~keep].sum()[None]])
        e = torch.cat([e, exact[~keep].sum()[None]])
    dof = len(c) - 1
    critical = dof + 4.5 * (2 * dof) ** 0.5            # ~ p < 0.001 for these dof
    assert chi_square(c, e) < critical


def test_expected_tokens_formula():
    assert expected_tokens_per_step(0.0, 4) == 1.0
    assert expected_tokens_per_step(1.0, 4) == 5.0
    assert expected_tokens_per_step(0.5, 2) == pytest.approx(1.75)
    assert expected_speedup(0.8, 4, 0.0) == pytest.approx(expected_tokens_per_step(0.8, 4))
    with pytest.raises(ValueError):
        expected_tokens_per_step(1.5, 2)


@pytest.fixture(scope="module")
def shipped():
    return minillm.load("target"), minillm.load("draft"), minillm.load_tokenizer("target")


@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_is_token_identical_to_the_target(shipped, k):
    target, draft, tok = shipped
    prompt = tok.encode("HAMLET.\nTo be, or not to be, that is the question:\n")
    params = SamplingParams(temperature=0, max_new_tokens=60)
    expect = generate_cached(target, prompt, params)[0]
    out, stats = speculative_generate(target, ModelDrafter(draft), prompt, k, params)
    assert out == expect
    assert 0 < stats.alpha < 1 and stats.steps < 60            # it did skip target steps
    out2, _ = speculative_generate(target, PromptLookupDrafter(target.config.vocab_size), prompt,
                                   k, params)
    assert out2 == expect


def test_stop_tokens_and_budget(shipped):
    target, draft, tok = shipped
    prompt = tok.encode("ROMEO.\n")
    free = generate_cached(target, prompt, SamplingParams(temperature=0, max_new_tokens=30))[0]
    stop = free[10]
    p = SamplingParams(temperature=0, max_new_tokens=30, stop_ids=(stop,))
    out, _ = speculative_generate(target, ModelDrafter(draft), prompt, 4, p)
    assert out == free[:free.index(stop) + 1]
    out, _ = speculative_generate(target, ModelDrafter(draft), prompt, 4,
                                  SamplingParams(temperature=0, max_new_tokens=7))
    assert out == free[:7]


def test_prompt_lookup_finds_the_latest_match():
    d = PromptLookupDrafter(100, ngram=2)
    assert d.lookup([1, 2, 3, 9, 1, 2, 4, 5, 1, 2], 3) == [4, 5, 1]
    assert d.lookup([7, 8, 9], 3) == []


def test_bad_arguments(shipped):
    target, draft, _ = shipped
    with pytest.raises(ValueError, match="k"):
        speculative_generate(target, ModelDrafter(draft), [1, 2], 0)
    with pytest.raises(ValueError, match="one sequence"):
        speculative_generate(target, ModelDrafter(draft), [[1, 2], [3, 4]], 2)
