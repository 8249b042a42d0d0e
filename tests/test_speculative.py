"""Speculative sampling: exactness (statistical and greedy), cache roll-back, drafters, formulas.

Notation as in minillm/speculative.py: q = the target's distribution, p = the draft's."""
import pytest
import torch

import minillm
import minillm.bench.speculative as bench_spec
import minillm.speculative as spec
from minillm.config import ModelConfig
from minillm.decode import PackedDecoder, onednn_available
from minillm.generate import generate_cached
from minillm.kvcache import KVCache
from minillm.model import Transformer
from minillm.sampling import SamplingParams
from minillm.speculative import (
    ModelDrafter,
    PromptLookupDrafter,
    SpecStats,
    expected_speedup,
    expected_tokens_per_step,
    prompt_lookup,
    residual_distribution,
    speculative_generate,
    verify,
    verify_greedy,
)

pytestmark = pytest.mark.usefixtures("one_thread")

# chi-square critical value for 4 degrees of freedom at p = 0.001
CHI2_4DF_P001 = 18.47


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def first_token_counts(q, p, n, seed=0, k=2):
    """Emit the first token of a speculative step n times (draft tokens drawn from p)."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.zeros(q.shape[-1])
    for _ in range(n):
        draft = [int(torch.multinomial(p[i], 1, generator=g)) for i in range(k)]
        accepted, nxt = verify(q, p, draft, g)
        counts[draft[0] if accepted > 0 else nxt] += 1
    return counts


Q = torch.tensor([[0.40, 0.30, 0.15, 0.10, 0.05]] * 3)          # target
P = torch.tensor([[0.05, 0.10, 0.15, 0.30, 0.40], [0.2] * 5])    # draft


def test_verify_reproduces_the_target_distribution():
    counts = first_token_counts(Q, P, 6000)
    assert chi_square(counts, Q[0]) < CHI2_4DF_P001, counts


@pytest.mark.parametrize("wrong", [
    lambda q, p: q,                                               # resample from q itself
    lambda q, p: (p - q).clamp(min=0) / (p - q).clamp(min=0).sum(-1, keepdim=True),  # p - q
])
def test_a_wrong_residual_is_caught(monkeypatch, wrong):
    """Resampling from q itself, or from normalize(max(0, p - q)) (the order swapped), skews the
    output; the same test must reject both, else it proves nothing."""
    monkeypatch.setattr(spec, "residual_distribution", wrong)
    counts = first_token_counts(Q, P, 6000)
    assert chi_square(counts, Q[0]) > 5 * CHI2_4DF_P001


def test_residual_formula():
    q, p = torch.tensor([0.5, 0.3, 0.2]), torch.tensor([0.2, 0.5, 0.3])
    torch.testing.assert_close(residual_distribution(q, p), torch.tensor([1.0, 0.0, 0.0]))
    torch.testing.assert_close(residual_distribution(q, q), q)
    batch = residual_distribution(Q[:2], P)                      # rows are independent
    torch.testing.assert_close(batch[1], residual_distribution(Q[1], P[1]))
    torch.testing.assert_close(batch.sum(-1), torch.ones(2))


def test_verify_deterministic_cases():
    g = torch.Generator().manual_seed(0)
    onehot = torch.eye(5)
    # the draft proposes what the target is sure of: all accepted, bonus from q[k]
    assert verify(onehot[[1, 2, 3]], onehot[[1, 2]], [1, 2], g) == (2, 3)
    # the target gives the 2nd draft token probability 0: rejected there, resampled from q
    assert verify(onehot[[1, 4, 3]], onehot[[1, 2]], [1, 2], g) == (1, 4)
    assert verify_greedy([1, 4, 3], [1, 2]) == (1, 4)
    assert verify_greedy([1, 2, 3], [1, 2]) == (2, 3)
    assert verify_greedy([7], []) == (0, 7)


def test_accepted_count_follows_the_acceptance_probabilities():
    """P(n >= i) = prod_{j<i} beta_j with beta_j = sum_x min(q_j(x), p_j(x))."""
    g = torch.Generator().manual_seed(1)
    beta = torch.minimum(Q[:2], P).sum(-1)                           # 0.45, 0.80
    n_trials, ns = 4000, torch.zeros(3)
    for _ in range(n_trials):
        draft = [int(torch.multinomial(P[i], 1, generator=g)) for i in range(2)]
        ns[verify(Q, P, draft, g)[0]] += 1
    expect = torch.tensor([1 - beta[0], beta[0] * (1 - beta[1]), beta[0] * beta[1]])
    assert chi_square(ns, expect) < 13.8                         # 2 dof, p = 0.001


def tiny(seed, layers=1):
    torch.manual_seed(seed)
    return Transformer(ModelConfig(vocab_size=5, dim=16, n_layers=layers, n_heads=2,
                                   hidden_dim=32, max_seq_len=16)).eval()


# make test only (16 s on a 2-core AVX2 CPU): make check tests one step's distribution
@pytest.mark.slow
@torch.no_grad()
def test_two_token_sequences_follow_the_target_distribution():
    """End to end with real (tiny, vocab 5) models: the distribution over the 25 possible
    two-token continuations equals the target's, computed exactly by enumeration."""
    target, draft = tiny(1), tiny(2)
    for w in target.parameters():            # sharpen the target so it differs from the draft
        w.mul_(3.0)
    prompt = [1, 3]
    first = torch.softmax(target(torch.tensor([prompt]))[0, -1], -1)
    exact = torch.zeros(25)
    for a in range(5):
        second = torch.softmax(target(torch.tensor([prompt + [a]]))[0, -1], -1)
        exact[a * 5:(a + 1) * 5] = first[a] * second
    g = torch.Generator().manual_seed(0)
    counts = torch.zeros(25)
    params = SamplingParams(temperature=1.0, max_new_tokens=2)
    drafter, scorer = ModelDrafter(draft), spec.default_scorer(target)
    for _ in range(3000):
        out, _ = speculative_generate(target, drafter, prompt, 3, params, g, scorer=scorer)
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
    assert expected_speedup(0.5, 2, 0.1, verify_cost=1.5) == pytest.approx(1.75 / 1.7)
    with pytest.raises(ValueError):
        expected_tokens_per_step(1.5, 2)
    with pytest.raises(ValueError):
        expected_speedup(0.5, 2, 0.1, verify_cost=0)


def test_alpha_counts_only_judged_drafts():
    """Two steps of k = 4: [accept 1, reject] and [accept all 4]: 5 accepted of 6 judged (the 2
    drafts after the rejection were never judged), 7 tokens in 2 passes."""
    s = SpecStats(steps=2, proposed=8, accepted=5, rejected=1, accepted_per_step=[1, 4],
                  proposed_per_step=[4, 4])
    assert s.alpha == pytest.approx(5 / 6)
    assert s.tokens_per_step == pytest.approx(3.5)
    assert s.predicted_tokens_per_step() == pytest.approx(expected_tokens_per_step(5 / 6, 4))
    lookup = SpecStats(steps=2, proposed=3, accepted=2, rejected=1, accepted_per_step=[0, 2],
                       proposed_per_step=[0, 3])        # a step that found nothing to propose
    assert lookup.predicted_tokens_per_step() == pytest.approx(
        (1 + expected_tokens_per_step(2 / 3, 3)) / 2)
    assert SpecStats().alpha == 0.0 and SpecStats().tokens_per_step == 0.0


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
    assert stats.accepted + stats.steps >= 60 and stats.rejected <= stats.steps
    out2, _ = speculative_generate(target, PromptLookupDrafter(target.config.vocab_size), prompt,
                                   k, params)
    assert out2 == expect


class CheckedDrafter(ModelDrafter):
    """A ModelDrafter whose every greedy proposal is compared with the draft model's greedy
    continuation of the same context computed from scratch: a cache that keeps a rejected
    position, or misses one, proposes something else."""

    def propose(self, context, k, params, generator=None):
        tokens, p = super().propose(context, k, params, generator)
        fresh = generate_cached(self.model, context, SamplingParams(temperature=0,
                                                                    max_new_tokens=k))[0]
        torch.testing.assert_close(torch.tensor(tokens), torch.tensor(fresh), atol=0, rtol=0)
        self.checked = getattr(self, "checked", 0) + 1
        return tokens, p


def test_draft_cache_rolls_back_exactly(shipped):
    target, draft, tok = shipped
    drafter = CheckedDrafter(draft)
    prompt = tok.encode("ROMEO.\n")
    out, stats = speculative_generate(target, drafter, prompt, 3,
                                      SamplingParams(temperature=0, max_new_tokens=40))
    assert stats.steps - 1 <= drafter.checked <= stats.steps     # (the last step may not draft)
    assert stats.rejected > 0 and max(stats.accepted_per_step) == 3   # both kinds of step


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
    assert prompt_lookup([1, 2, 3, 9, 1, 2, 4, 5, 1, 2], 3, ngram=2) == [4, 5, 1]
    assert prompt_lookup([7, 8, 9], 3) == []
    assert prompt_lookup([5, 6, 7, 5, 6], 4) == [7, 5, 6]          # shorter n-gram, cut at end
    assert prompt_lookup([1, 2, 3, 4, 9, 3, 4], 2, ngram=3) == [9, 3]
    assert PromptLookupDrafter(100, ngram=2).lookup([1, 2, 3, 9, 1, 2, 4, 5, 1, 2], 3) == [4, 5, 1]
    with pytest.raises(ValueError, match="ngram"):
        prompt_lookup([1, 2], 2, ngram=0)


@pytest.mark.skipif(not onednn_available(), reason="this torch build has no oneDNN linear ops")
def test_onednn_scorer_matches_the_model():
    torch.manual_seed(3)
    m = Transformer(ModelConfig(vocab_size=61, dim=32, n_layers=2, n_heads=4, n_kv_heads=2,
                                hidden_dim=48, max_seq_len=32, qkv_bias=True)).eval()
    ids = torch.randint(0, 61, (2, 15), generator=torch.Generator().manual_seed(7))
    dec, cache = PackedDecoder(m, "onednn"), KVCache.for_model(m, 2, 15)
    with torch.no_grad():
        m(ids[:, :6], cache=cache)
        got = torch.cat([dec.step(ids[:, 6:11], cache), dec.step(ids[:, 11:], cache)], 1)
        ref = m(ids)[:, 6:]
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


def test_bad_arguments(shipped):
    target, draft, _ = shipped
    with pytest.raises(ValueError, match="k"):
        speculative_generate(target, ModelDrafter(draft), [1, 2], 0)
    with pytest.raises(ValueError, match="one sequence"):
        speculative_generate(target, ModelDrafter(draft), [[1, 2], [3, 4]], 2)
    with pytest.raises(ValueError, match="layout"):
        PackedDecoder(target, layout="sideways")


@pytest.mark.parametrize("cpu_time", [False, True])
def test_bench_reports_measured_and_predicted_figures(cpu_time):
    target, draft = tiny(1, layers=2), tiny(2)
    r = bench_spec.bench_speculative(target, draft, [1, 2, 3], ks=(1, 2), new_tokens=8, repeats=1,
                               lookup_prompt=[1, 2, 1, 2, 1, 2], lookup_k=3, lookup_new_tokens=6,
                               cpu_time=cpu_time, sample_k=2)
    assert r["exact_greedy"] is True and r["k"] in (1, 2) and r["c"] > 0
    assert r["clock"] == ("cpu" if cpu_time else "wall") and r["draft_engine"] == "packed"
    kinds = [(row["drafter"], row["k"], row.get("temperature", 0)) for row in r["runs"]]
    assert kinds == [("draft-model", 1, 0), ("draft-model", 2, 0), ("draft-model", 2, 0.8),
                     ("prompt-lookup", 3, 0)]
    assert r["sampled_speedup"] == r["runs"][2]["speedup"] > 0
    assert r["sampled_alpha"] == r["runs"][2]["alpha"] and r["sample_temperature"] == 0.8
    assert "exact_greedy" not in r["runs"][2]          # sampled: exact in distribution only
    with pytest.raises(ValueError, match="sample_k"):
        bench_spec.bench_speculative(target, draft, [1, 2, 3], ks=(1,), sample_k=0)
    for row in r["runs"]:
        assert 0 <= row["alpha"] <= 1 and 1 <= row["tokens_per_step"] <= row["k"] + 1
        assert row["speedup"] > 0 and row["verify_cost"] > 0
        assert row["target_calls"] <= 1 + (8 if row["drafter"] == "draft-model" else 6)
    row = r["runs"][1]
    assert row["predicted_speedup"] == pytest.approx(
        expected_speedup(row["alpha"], 2, r["c"], row["verify_cost"]))
    # the bandwidth scale of the plain target step (minillm.bench.bandwidth), reused
    from minillm.bench.bandwidth import step_bytes
    assert r["target_bytes_per_token"] == step_bytes(PackedDecoder(target), 3 + 4)["bytes_per_step"]
    assert r["limit_tok_s"] * r["target_bytes_per_token"] == pytest.approx(r["read_gb_s"] * 1e9)
    assert r["target_step_bandwidth_fraction"] == pytest.approx(
        1e3 / r["target_step_ms"] / r["limit_tok_s"])
    assert r["speculative_vs_limit"] == pytest.approx(
        r["speedup"] * r["target_tok_s"] / r["limit_tok_s"])


def test_bench_without_the_formulas_and_prompt_lookup_of_ones_own():
    """What lab 05's kernel runs, where the formulas and prompt_lookup are the student's: the
    bench reports its measurements only, and prompt lookup is timed on its own with a lookup
    function handed in."""
    import statistics
    target, draft = tiny(1, layers=2), tiny(2)
    kw = dict(ks=(1, 2), new_tokens=8, repeats=1, sample_temperature=None)
    bare = bench_spec.bench_speculative(target, draft, [1, 2, 3], predict=False, **kw)
    full = bench_spec.bench_speculative(target, draft, [1, 2, 3], **kw)
    for row, ref in zip(bare["runs"], full["runs"]):
        assert "predicted_tokens_per_step" not in row and "predicted_speedup" not in row
        assert row["drafts_per_step"] == ref["drafts_per_step"] and row["alpha"] == ref["alpha"]
        assert statistics.mean(expected_tokens_per_step(row["alpha"], n)
                               for n in row["drafts_per_step"]) == \
            pytest.approx(ref["predicted_tokens_per_step"])
    calls = []

    def mine(context, k, ngram):
        calls.append(ngram)
        return tuple(prompt_lookup(context, k, ngram))          # any sequence of ids will do

    lk = bench_spec.bench_prompt_lookup(target, [1, 2, 1, 2, 1, 2], k=3, new_tokens=6, repeats=1,
                                  lookup=mine, ngram=2)
    assert calls and set(calls) == {2} and "predicted_tokens_per_step" not in lk
    assert lk["drafter"] == "prompt-lookup" and lk["k"] == 3 and lk["new_tokens"] == 6
    assert lk["exact_greedy"] is True and lk["speedup"] > 0 and lk["verify_cost"] > 0
    assert lk["target_calls"] == 1 + len(lk["drafts_per_step"]) and lk["clock"] == "wall"
    none = bench_spec.bench_prompt_lookup(target, [1, 2, 1, 2], k=3, new_tokens=5, repeats=1,
                                    cpu_time=True, lookup=lambda context, k, ngram: [])
    assert none["alpha"] == 0 and none["tokens_per_step"] == 1 and none["exact_greedy"]
    assert set(none["drafts_per_step"]) == {0} and none["clock"] == "cpu"


def test_cli_bench_speculative_json(capsys):
    import json

    from minillm.cli import main
    with pytest.raises(SystemExit) as done:
        main(["bench", "speculative", "--json", "--k", "2", "--new-tokens", "8", "--repeats", "1",
              "--threads", "1", "--cpu-time", "--draft-engine", "packed"])
    assert done.value.code == 0
    r = json.loads(capsys.readouterr().out)
    for key in ("k", "alpha", "tokens_per_step", "speedup", "exact_greedy", "c", "runs"):
        assert key in r, key
    assert r["k"] == 2 and r["exact_greedy"] is True and r["clock"] == "cpu"
    assert r["draft"] == "draft-distilled" and r["sample_temperature"] == 0.8   # the defaults
    assert [row["drafter"] for row in r["runs"]] == ["draft-model"] * 2 + ["prompt-lookup"]
    with pytest.raises(SystemExit) as done:       # lab 05's run: no lookup, no formulas
        main(["bench", "speculative", "--json", "--k", "2", "--new-tokens", "8", "--repeats", "1",
              "--threads", "1", "--draft-engine", "packed", "--temperature", "0",
              "--no-lookup", "--no-predict"])
    assert done.value.code == 0
    runs = json.loads(capsys.readouterr().out)["runs"]
    assert [row["drafter"] for row in runs] == ["draft-model"]
    assert "predicted_speedup" not in runs[0] and runs[0]["drafts_per_step"]


def test_sample_packed_is_the_plain_sampler(shipped):
    target, _, tok = shipped
    prompt = tok.encode("ROMEO.\n")
    plain = PackedDecoder(target)
    greedy_like = SamplingParams(temperature=0.8, top_k=1, max_new_tokens=12, seed=3)
    from minillm.decode import generate_packed
    assert bench_spec.sample_packed(target, prompt, plain, greedy_like) == \
        generate_packed(target, torch.tensor([prompt]), 12, plain)[0]
    params = SamplingParams(temperature=0.8, max_new_tokens=12, seed=3)
    assert bench_spec.sample_packed(target, prompt, plain, params) == \
        bench_spec.sample_packed(target, prompt, plain, params)          # seeded


@pytest.mark.slow                       # compiles an int8 step (23 s on a 2-core AVX2 CPU)
def test_compiled_int8_draft_keeps_greedy_exact(shipped):
    target, draft, tok = shipped
    drafter = ModelDrafter(draft, engine="compiled-int8")
    assert drafter.engine == "compiled-int8"
    prompt = tok.encode("HAMLET.\nTo be, or not")
    params = SamplingParams(temperature=0, max_new_tokens=24)
    out, stats = speculative_generate(target, drafter, prompt, 3, params)
    assert out == generate_cached(target, prompt, params)[0]
    assert stats.accepted > 0          # an int8 copy of the draft still agrees with the target
    with pytest.raises(ValueError, match="engine"):
        ModelDrafter(draft, engine="turbo")
