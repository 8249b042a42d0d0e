"""Linear attention (lab 09): three forms agree, the hybrid decodes with a fixed state, the counts
match what a cache holds, and hybrid configs survive a checkpoint round trip."""
from dataclasses import replace

import pytest
import torch

from minillm import linear_attention as la
from minillm import roofline
from minillm.bench.decode_memory import decode_step_times, filled_cache
from minillm.config import PRESETS, SHIPPED_SHAPES, ModelConfig
from minillm.generate import generate_cached, generate_naive
from minillm.kvcache import KVCache
from minillm.model import Transformer
from minillm.sampling import SamplingParams
from minillm.weights import load_checkpoint, save_checkpoint


def qkv(B, h, T, H, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return [2 * torch.randn(B, h, T, H, generator=g, dtype=dtype) for _ in range(3)]


@pytest.mark.parametrize("B,h,T,H,chunk", [(1, 1, 1, 4, 1), (2, 3, 37, 8, 8), (1, 4, 64, 16, 64),
                                           (3, 2, 50, 4, 7), (1, 6, 130, 8, 64)])
def test_three_forms_are_one_layer(B, h, T, H, chunk):
    q, k, v = qkv(B, h, T, H, seed=T)
    g = la.head_decays(h)
    y_par = la.parallel(q, k, v, g)
    y_rec, (S, z) = la.recurrent(q, k, v, g)
    y_chk, (S2, z2) = la.chunked(q, k, v, g, chunk)
    torch.testing.assert_close(y_rec, y_par, atol=1e-10, rtol=1e-9)
    torch.testing.assert_close(y_chk, y_par, atol=1e-10, rtol=1e-9)
    torch.testing.assert_close(S2, S, atol=1e-8, rtol=1e-9)
    torch.testing.assert_close(z2, z, atol=1e-8, rtol=1e-9)


def test_chunked_continues_from_a_state_and_decay_one_is_plain_linear_attention():
    q, k, v = qkv(2, 3, 40, 8, seed=1)
    g = torch.tensor([0.9, 0.99, 1.0], dtype=torch.float64)
    y, _ = la.chunked(q, k, v, g, 16)
    y1, s1 = la.chunked(q[:, :, :23], k[:, :, :23], v[:, :, :23], g, 16)
    y2, _ = la.chunked(q[:, :, 23:], k[:, :, 23:], v[:, :, 23:], g, 16, state=s1)
    torch.testing.assert_close(torch.cat([y1, y2], 2), y, atol=1e-10, rtol=1e-9)
    # decay 1: y_t = sum_j phi(q).phi(k_j) v_j / sum_j phi(q).phi(k_j), by hand for one token
    phi = la.feature_map
    w = phi(q[0, 2, 9]) @ phi(k[0, 2, :10]).T
    torch.testing.assert_close(y[0, 2, 9], (w[:, None] * v[0, 2, :10]).sum(0) / (w.sum() + la.EPS))


def test_the_normaliser_matters():
    """Without the denominator the output's scale grows with the tokens seen (the lab's classic slip)."""
    q, k, v = qkv(1, 1, 200, 8, seed=2)
    y = la.parallel(q, k, v, torch.tensor([1.0], dtype=torch.float64))
    assert y.abs().max() <= v.abs().max() + 1e-9      # a weighted mean of values


def test_bad_decay_and_chunk_are_named():
    q, k, v = qkv(1, 2, 4, 4)
    with pytest.raises(ValueError, match="decay must be in"):
        la.parallel(q, k, v, torch.tensor([0.5, 1.5]))
    with pytest.raises(ValueError, match="one per head"):
        la.chunked(q, k, v, torch.tensor([0.5, 0.5, 0.5]))
    with pytest.raises(ValueError, match="chunk"):
        la.chunked(q, k, v, 0.9, 0)
    with pytest.raises(ValueError, match="form"):
        la.flops_per_token(2, 4, "quadratic")


def small_hybrid(seed=0, mixers=("linear", "attention", "linear")):
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=50, dim=32, n_layers=len(mixers), n_heads=2, hidden_dim=48,
                      max_seq_len=64, mixers=mixers)
    m = Transformer(cfg).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.3)
    return m


def test_hybrid_decode_with_a_cache_equals_the_full_forward():
    m = small_hybrid()
    ids = torch.randint(0, 50, (2, 30), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = m(ids)
        cache = KVCache.for_model(m, batch_size=2, max_len=30)
        parts = [m(ids[:, :11], cache=cache)] + [m(ids[:, t:t + 1], cache=cache)
                                                 for t in range(11, 30)]
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-4, rtol=1e-4)
    assert set(cache.state) == {0, 2} and cache.k[0] is None and cache.k[1] is not None
    p = SamplingParams(max_new_tokens=12, temperature=0.0)
    assert generate_cached(m, ids[:1, :5], p) == generate_naive(m, ids[:1, :5], p)


def test_a_hybrid_runs_on_forms_handed_in():
    """Lab 09's kernel runs the hybrid on the student's chunked form and step (use_forms): the
    model computes what it computes with its own, a prefill that continues a state steps, and a
    wrong form shows in the output."""
    m, ref = small_hybrid(), small_hybrid()
    ids = torch.randint(0, 50, (2, 30), generator=torch.Generator().manual_seed(4))
    calls = {"chunked": 0, "step": 0}

    def chunked_form(q, k, v, decay, chunk):              # no state argument, like la_chunked
        calls["chunked"] += 1
        return la.chunked(q, k, v, decay, chunk)

    def step_form(q, k, v, state, decay):
        calls["step"] += 1
        return la.recurrent_step(q, k, v, state, decay)

    assert la.use_forms(m, chunked_form, step_form) is m
    with torch.no_grad():
        torch.testing.assert_close(m(ids), ref(ids))
        assert calls == {"chunked": 2, "step": 0}          # two linear layers
        cache = KVCache.for_model(m, batch_size=2, max_len=30)
        parts = [m(ids[:, :11], cache=cache), m(ids[:, 11:20], cache=cache)] + \
            [m(ids[:, t:t + 1], cache=cache) for t in range(20, 30)]
    torch.testing.assert_close(torch.cat(parts, 1), ref(ids).detach(), atol=1e-4, rtol=1e-4)
    assert calls == {"chunked": 4, "step": 2 * (9 + 10)}     # 9 continued, 10 decoded, x 2
    la.use_forms(m, lambda *a: (torch.zeros_like(a[0]), None), step_form)
    with torch.no_grad():
        assert not torch.allclose(m(ids), ref(ids))
    la.use_forms(m)                                          # the module's own forms again
    with torch.no_grad():
        torch.testing.assert_close(m(ids), ref(ids))
    with pytest.raises(ValueError, match="both forms"):
        la.use_forms(m, chunked_form)


def test_a_recurrent_state_cannot_roll_back_and_reset_clears_it():
    m = small_hybrid()
    cache = KVCache.for_model(m, max_len=20)
    with torch.no_grad():
        m(torch.tensor([[1, 2, 3, 4]]), cache=cache)
    with pytest.raises(ValueError, match="recurrent state"):
        cache.truncate(2)
    cache.truncate(4)                       # a no-op is fine
    kv = 20 * 2 * 16 * 2 * 4                 # 20 slots x 2 heads x 16 x (k, v) x fp32
    assert cache.nbytes == kv + 2 * la.state_bytes(2, 16, 4)       # + two linear layers' state
    cache.reset()
    assert cache.state == {} and cache.seq_len == 0


@pytest.mark.parametrize("name", ["target", "hybrid"])
def test_counts_match_the_bytes_a_cache_holds(name):
    cfg = SHIPPED_SHAPES[name]
    m = Transformer(cfg).eval()
    for S in (1, 100, 1000):
        assert filled_cache(m, S).nbytes == roofline.kv_cache_bytes_per_seq(cfg, S,
                                                                           bytes_per_value=4)
    L_lin = cfg.n_layers - len(cfg.attention_layers)
    assert la.state_bytes(cfg.n_heads, cfg.head_dim, 4) * L_lin == \
        roofline.kv_cache_bytes_per_seq(cfg, 0, bytes_per_value=4)


def test_the_1_in_8_llama_napkin():
    llama = PRESETS["llama-2-13b"]
    hyb = replace(llama, mixers=tuple("attention" if i % 8 == 7 else "linear" for i in range(40)))
    assert roofline.max_batch_that_fits(llama, "h100", 4096) == 16
    assert roofline.max_batch_that_fits(hyb, "h100", 4096) == 115
    assert hyb.kv_bytes_per_token() * 8 == llama.kv_bytes_per_token()


def test_decode_time_is_measured_per_context():
    m = small_hybrid()
    t = decode_step_times({"a": m, "b": small_hybrid(1)}, [8, 32], repeats=2, warmup=1)
    assert set(t) == {"a", "b"} and all(len(v) == 2 and min(v) > 0 for v in t.values())


def test_hybrid_and_bidirectional_configs_round_trip(tmp_path):
    m = small_hybrid()
    save_checkpoint(m, tmp_path / "h")
    back = load_checkpoint(tmp_path / "h")
    assert back.config == m.config
    ids = torch.randint(0, 50, (1, 9))
    with torch.no_grad():
        torch.testing.assert_close(back(ids), m(ids))
    d = ModelConfig(vocab_size=51, dim=32, n_layers=2, n_heads=2, hidden_dim=48, causal=False)
    assert ModelConfig.from_hf(d.to_hf()) == d
    assert d.to_hf()["model_type"] == "minillm"          # transformers refuses it, not loads it wrong
    with pytest.raises(ValueError, match="mixers"):
        ModelConfig(n_layers=2, mixers=("linear",))
    with pytest.raises(ValueError, match="mixers"):
        ModelConfig(n_layers=1, mixers=("mamba",))


def test_softmax_only_fast_paths_refuse_lab09_models():
    from minillm.decode import PackedDecoder
    from minillm.serving.engine import LLMEngine
    from minillm.serving.static_batching import StaticBatchServer
    dlm = Transformer(ModelConfig(vocab_size=51, dim=32, n_layers=1, n_heads=2, hidden_dim=48,
                                  causal=False))
    for m in (small_hybrid(), dlm):
        for build in (PackedDecoder, LLMEngine, StaticBatchServer):
            with pytest.raises(ValueError, match="lab 09"):
                build(m)
