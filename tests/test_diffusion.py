"""Masked diffusion (lab 09): the forward process, the 1/t-weighted bound, the sampler's schedule
and confidence order, and the MQAR task of minillm.recall."""
import math

import pytest
import torch

from minillm import diffusion, recall
from minillm.bench.timing import WorkCounter
from minillm.config import ModelConfig
from minillm.kvcache import KVCache
from minillm.model import Transformer


def small_dlm(seed=0, vocab=41):
    torch.manual_seed(seed)
    m = Transformer(ModelConfig(vocab_size=vocab, dim=32, n_layers=2, n_heads=2, hidden_dim=48,
                                max_seq_len=64, causal=False)).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.5)
    return m


def test_bidirectional_means_a_later_token_changes_an_earlier_output():
    m = small_dlm()
    ids = torch.randint(0, 40, (1, 10))
    ids2 = ids.clone()
    ids2[0, 9] = (ids[0, 9] + 1) % 40
    with torch.no_grad():
        assert not torch.allclose(m(ids)[0, 0], m(ids2)[0, 0])
        with pytest.raises(ValueError, match="no KV cache"):
            m(ids, cache=KVCache.for_model(m, max_len=10))


def test_mask_rates_are_stratified_and_corruption_follows_them():
    g = torch.Generator().manual_seed(0)
    t = diffusion.mask_rates(8, g)
    assert t.min() > 0 and t.max() <= 1
    assert sorted(int(x * 8) for x in t) == list(range(8))        # one rate in each eighth
    x = torch.randint(0, 40, (4, 5000), generator=g)
    xt, masked = diffusion.corrupt(x, torch.tensor([0.0, 0.25, 0.5, 1.0]), 40, g)
    assert (xt[masked] == 40).all() and (xt[~masked] == x[~masked]).all()
    shares = masked.float().mean(1)
    assert shares[0] == 0 and shares[3] == 1 and abs(shares[1] - 0.25) < 0.03


def test_the_loss_weights_masked_tokens_by_one_over_t():
    logits = torch.zeros(2, 3, 5)                      # uniform: CE = ln 5 everywhere
    x = torch.zeros(2, 3, dtype=torch.long)
    masked = torch.tensor([[True, False, False], [True, True, True]])
    t = torch.tensor([0.5, 1.0])
    want = (math.log(5) / 0.5 + 3 * math.log(5)) / 6
    assert diffusion.diffusion_loss(logits, x, masked, t).item() == pytest.approx(want)


def test_the_bound_is_above_the_uniform_guess_for_a_random_model_and_finite():
    m = small_dlm()
    data = torch.randint(0, 40, (300,))
    loss, n = diffusion.nll_bound(m, data, 32, rates_per_window=2)
    assert n == 288 and math.isfinite(loss) and loss > 0
    with pytest.raises(ValueError, match="tokens of data"):
        diffusion.nll_bound(m, data[:10], 32)


def test_schedule_splits_evenly_first_passes_take_the_rest():
    assert diffusion.unmask_schedule(10, 3) == [4, 3, 3]
    assert diffusion.unmask_schedule(8, 8) == [1] * 8 and diffusion.unmask_schedule(5, 1) == [5]
    for bad in (0, 11):
        with pytest.raises(ValueError, match="steps"):
            diffusion.unmask_schedule(10, bad)


def test_sampler_runs_steps_passes_and_keeps_the_most_confident_first():
    m = small_dlm()
    prompt = [3, 7, 1]
    with WorkCounter(m) as work:
        new, passes = diffusion.sample(m, prompt, 9, 3)
    assert passes == 3 == work.calls and len(new) == 9 and 40 not in new
    mask = 40
    with torch.no_grad():
        lg = m(torch.tensor([prompt + [mask] * 9]))[0, 3:].float()
    lg[:, mask] = -math.inf
    assert diffusion.sample(m, prompt, 9, 1)[0] == lg.argmax(-1).tolist()
    first = int(lg.softmax(-1).max(-1).values.argmax())
    assert diffusion.sample(m, prompt, 9, 9)[0][first] == int(lg[first].argmax())
    # the random order is a different sampler, and temperature sampling is seeded
    assert diffusion.sample(m, prompt, 9, 9, order="random", seed=1)[1] == 9
    a = diffusion.sample(m, prompt, 9, 3, temperature=1.0, seed=5)
    assert a == diffusion.sample(m, prompt, 9, 3, temperature=1.0, seed=5)
    with pytest.raises(ValueError, match="order"):
        diffusion.sample(m, prompt, 9, 3, order="left")
    with pytest.raises(ValueError, match="context"):
        diffusion.sample(m, prompt, 62, 3)


@torch.no_grad()
def greedy_sampler(model, prompt, n_new, steps, least_sure=False):
    """Lab 09's diffusion_sample as its solution writes it (least_sure: a wrong one)."""
    mask = model.config.vocab_size - 1
    x = torch.tensor([list(prompt) + [mask] * n_new])
    for s in range(steps):
        k = n_new // steps + (1 if s < n_new % steps else 0)
        logits = model(x)[0].float()
        logits[:, mask] = -math.inf
        still = (x[0] == mask).nonzero().flatten()
        conf, proposal = logits[still].softmax(-1).max(-1)
        keep = conf.topk(k, largest=not least_sure).indices
        x[0, still[keep]] = proposal[keep]
    return x[0, len(prompt):].tolist()


@pytest.mark.parametrize("seed", range(8))
def test_sample_with_a_greedy_sampler_of_ones_own_is_sample(seed):
    """What lab 09 measures with the student's diffusion_sample: temperature and blocks added
    around it give `sample`'s tokens and passes (the tiny models' near-equal probabilities
    included), and a sampler that keeps the least confident gives others."""
    m = small_dlm(seed, vocab=61)
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, 60, (seed % 5,), generator=g).tolist()
    n = 12 + seed
    for steps, temperature, block in [(n, 0.0, None), (4, 0.0, 5), (5, 0.5, None), (n // 2, 0.8, 4),
                                      (7, 1.3, 7), (n, 0.7, 3)]:
        want = diffusion.sample(m, prompt, n, steps, temperature=temperature, block=block,
                                seed=seed)
        got = diffusion.sample_with(greedy_sampler, m, prompt, n, steps, temperature=temperature,
                                    block=block, seed=seed)
        assert got == want, (steps, temperature, block)
    wrong = diffusion.sample_with(lambda *a: greedy_sampler(*a, least_sure=True), m, prompt, n, 3,
                                  temperature=0.5, seed=seed)
    assert wrong != diffusion.sample(m, prompt, n, 3, temperature=0.5, seed=seed)
    with pytest.raises(ValueError, match="returned 3 ids for a block of 4"):
        diffusion.sample_with(lambda *a: [1, 2, 3], m, prompt, 8, 2, block=4)


def test_mask_id_refuses_a_causal_model():
    with pytest.raises(ValueError, match="not a masked-diffusion"):
        diffusion.mask_id(Transformer(ModelConfig(vocab_size=10, dim=8, n_layers=1, n_heads=1,
                                                  hidden_dim=8)))


def test_mqar_batches_ask_each_key_once_and_answer_with_its_value():
    ids, targets = recall.mqar_batch(16, 6, torch.Generator().manual_seed(0))
    assert ids.shape == targets.shape == (16, 23)
    for b in range(16):
        seq = ids[b].tolist() + [None]
        pairs = dict(zip(seq[0:12:2], seq[1:12:2]))
        assert len(pairs) == 6 and all(1 <= k <= recall.N_KEYS < v for k, v in pairs.items())
        asked = (targets[b] != -100).nonzero().flatten().tolist()
        assert sorted(seq[i] for i in asked) == sorted(pairs)       # every key asked once
        assert all(targets[b, i].item() == pairs[seq[i]] for i in asked)
    with pytest.raises(ValueError, match="n_pairs"):
        recall.mqar_batch(2, recall.N_KEYS + 1, torch.Generator())


def test_a_small_attention_model_learns_recall_and_a_linear_state_is_counted():
    m = recall.recall_model("attention", dim=32, n_layers=1, seed=0)
    before = recall.recall_accuracy(m, 4, n_seqs=64)
    losses = recall.train_recall(m, steps=150, n_pairs=(2, 4), lr=1e-2, batch=32)
    assert losses[-1] < losses[0] / 2
    assert recall.recall_accuracy(m, 4, n_seqs=64) > max(0.5, before + 0.3)
    lin = recall.recall_model("linear", dim=32, n_layers=1, n_heads=2)
    assert recall.state_numbers(lin) == 2 * (16 * 16 + 16)
    assert all(float(layer.self_attn.decay.min()) == 1.0 for layer in lin.layers)
    with pytest.raises(ValueError, match="grows"):
        recall.state_numbers(m)


def test_the_cli_generates_with_a_diffusion_checkpoint(tmp_path, capsys):
    import json

    import minillm
    from minillm.cli import main
    from minillm.weights import save_checkpoint
    tok = minillm.load_tokenizer("target")
    torch.manual_seed(0)
    m = Transformer(ModelConfig(vocab_size=tok.vocab_size + 1, dim=32, n_layers=1, n_heads=2,
                                hidden_dim=32, max_seq_len=64, causal=False))
    save_checkpoint(m, tmp_path / "d", tokenizer=tok)
    def run(*args):
        with pytest.raises(SystemExit) as done:
            main(["generate", "ROMEO.", *args])
        return done.value.code

    assert run("--model", str(tmp_path / "d"), "--max-new-tokens", "12", "--steps", "3",
               "--json") == 0
    out = json.loads(capsys.readouterr().out)
    assert out["new_tokens"] == 12
    assert run("--model", str(tmp_path / "d"), "--top-k", "5") == 2
    assert "temperature only" in capsys.readouterr().err
    assert run("--model", "target", "--steps", "3") == 2
    assert "--steps is for a masked-diffusion" in capsys.readouterr().err


def test_continuation_perplexity_is_the_judges_mean_cross_entropy():
    from minillm.evaluate import continuation_perplexity
    torch.manual_seed(0)
    m = Transformer(ModelConfig(vocab_size=30, dim=16, n_layers=1, n_heads=2, hidden_dim=16)).eval()
    prompt, new = [3, 4, 5], [6, 7]
    with torch.no_grad():
        logp = m(torch.tensor([prompt + new]))[0].log_softmax(-1)
    want = math.exp(-(logp[2, 6] + logp[3, 7]).item() / 2)
    assert continuation_perplexity(m, prompt, new) == pytest.approx(want, rel=1e-5)
    with pytest.raises(ValueError, match="non-empty"):
        continuation_perplexity(m, [], new)
