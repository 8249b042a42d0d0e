"""The KV cache, the cached generation loop and the packed decode step (lab 02's library)."""
import pytest
import torch

from minillm.config import ModelConfig
from minillm.decode import PackedDecoder, generate_packed
from minillm.generate import generate_cached, generate_naive
from minillm.kvcache import KVCache, KVSpec, kv_bytes_per_token, layer_specs
from minillm.model import Transformer
from minillm.sampling import SamplingParams


def tiny(**kw):
    torch.manual_seed(0)
    cfg = dict(vocab_size=61, dim=32, n_layers=2, n_heads=4, hidden_dim=48, max_seq_len=64)
    cfg.update(kw)
    return Transformer(ModelConfig(**cfg)).eval()


@pytest.fixture(scope="module")
def model():
    return tiny(n_kv_heads=2)


@torch.no_grad()
def test_logits_equal_full_forward_at_every_step(model):
    ids = torch.randint(0, 61, (2, 20), generator=torch.Generator().manual_seed(1))
    full = model(ids)
    cache = KVCache.for_model(model, 2, 20)
    got = [model(ids[:, :7], cache=cache)]                        # prefill 7
    for t in range(7, 20):                                          # then one token at a time
        got.append(model(ids[:, t:t + 1], cache=cache))
    torch.testing.assert_close(torch.cat(got, 1), full, atol=1e-5, rtol=1e-5)
    assert cache.seq_len == 20


@torch.no_grad()
def test_chunked_prefill_matches(model):
    ids = torch.randint(0, 61, (1, 30), generator=torch.Generator().manual_seed(2))
    cache = KVCache.for_model(model, 1, 30)
    got = torch.cat([model(ids[:, a:b], cache=cache) for a, b in ((0, 10), (10, 25), (25, 30))],
                    1)
    torch.testing.assert_close(got, model(ids), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_cached_generation_equals_naive(model, temperature):
    p = SamplingParams(temperature=temperature, top_k=20, max_new_tokens=25, seed=4)
    prompts = torch.tensor([[1, 2, 3, 4], [9, 8, 7, 6]])
    assert generate_cached(model, prompts, p) == generate_naive(model, prompts, p)


def test_cached_generation_stops_like_naive(model):
    free = generate_naive(model, [5, 6], SamplingParams(temperature=0, max_new_tokens=12))[0]
    stop = free[4]
    p = SamplingParams(temperature=0, max_new_tokens=12, stop_ids=(stop,))
    out = generate_cached(model, [5, 6], p)[0]
    assert out == generate_naive(model, [5, 6], p)[0] == free[:free.index(stop) + 1]


def test_cached_loop_pushes_linear_work(model):
    """O(T) tokens through the model: the prompt once, then one token per step."""
    seen = []
    h = model.register_forward_pre_hook(lambda m, args: seen.append(args[0].shape[1]))
    try:
        generate_cached(model, list(range(1, 11)), SamplingParams(temperature=0,
                                                                  max_new_tokens=16))
    finally:
        h.remove()
    assert seen == [10] + [1] * 15


def test_cache_bytes_follow_the_formula(model):
    c = model.config
    cache = KVCache.for_model(model, batch_size=3, max_len=50)
    per_token = 2 * c.n_layers * c.n_kv_heads * c.head_dim * 4          # fp32
    assert cache.nbytes == 3 * 50 * per_token
    assert cache.bytes_per_token() == per_token
    assert kv_bytes_per_token(layer_specs(model), 2) == c.kv_bytes_per_token(2)


def test_ring_buffer_layers_hold_window_slots_and_decode_correctly():
    m = tiny(n_layers=3)
    for layer in m.layers[:2]:
        layer.self_attn.window = 8            # two local layers, one global
    cache = KVCache.for_model(m, 1, 60)
    assert [tuple(k.shape) for k in cache.k] == [(1, 4, 8, 8), (1, 4, 8, 8), (1, 4, 60, 8)]
    assert KVCache.for_model(m, 1, 30).k[0].shape == cache.k[0].shape     # flat in max_len
    p = SamplingParams(temperature=0, max_new_tokens=40)
    assert generate_cached(m, [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5], p) == \
        generate_naive(m, [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5], p)
    with torch.no_grad():
        m(torch.tensor([[1, 2, 3, 4, 5]]), cache=cache)
    with pytest.raises(ValueError, match="ring buffers"):
        cache.truncate(2)


def test_windowed_attention_differs_from_full():
    """The window really restricts attention (else the ring test above proves nothing)."""
    m = tiny(n_layers=3)
    ids = torch.randint(0, 61, (1, 40), generator=torch.Generator().manual_seed(3))
    full = m(ids)
    m.layers[0].self_attn.window = 8
    assert (m(ids)[:, 20:] - full[:, 20:]).abs().max() > 1e-3


def test_truncate_rolls_back(model):
    ids = torch.randint(0, 61, (1, 12), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        cache = KVCache.for_model(model, 1, 20)
        model(ids, cache=cache)
        cache.truncate(8)
        again = model(ids[:, 8:], cache=cache)
    torch.testing.assert_close(again, model(ids)[:, 8:], atol=1e-5, rtol=1e-5)


def test_clear_errors(model):
    cache = KVCache.for_model(model, 1, 5)
    with pytest.raises(ValueError, match="cache is full"):
        model(torch.zeros(1, 6, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="batch 1"):
        model(torch.zeros(2, 3, dtype=torch.long), cache=KVCache.for_model(model, 1, 5))
    with pytest.raises(ValueError, match="exceeds the model's context"):
        KVCache.for_model(model, 1, 1000)
    c2 = KVCache.for_model(model, 1, 10)
    with pytest.raises(ValueError, match="start at 4"):
        model(torch.zeros(1, 2, dtype=torch.long), positions=torch.tensor([4, 5]), cache=c2)
    with pytest.raises(ValueError, match="truncate"):
        c2.truncate(3)
    with pytest.raises(ValueError, match="batch_size"):
        KVCache([KVSpec(1, 2, 2)], 0, 4)


@pytest.mark.parametrize("kw", [dict(), dict(n_kv_heads=1), dict(qkv_bias=True, o_bias=True,
                                                                  mlp_bias=True)])
def test_packed_decoder_matches_the_model(kw):
    m = tiny(**kw)
    with torch.no_grad():
        for p in m.parameters():            # non-zero biases so a dropped bias shows
            p.add_(0.02 * torch.randn_like(p))
    prompt = torch.randint(0, 61, (2, 6), generator=torch.Generator().manual_seed(6))
    expect = generate_naive(m, prompt, SamplingParams(temperature=0, max_new_tokens=20))
    assert generate_packed(m, prompt, 20) == expect
    cache = KVCache.for_model(m, 2, 8)
    with torch.no_grad():
        m(prompt, cache=cache)
        logits = PackedDecoder(m).step(prompt[:, -1], cache)
        ref = m(torch.cat([prompt, prompt[:, -1:]], 1))[:, -1]
    torch.testing.assert_close(logits, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("layout", ["in_out", "out_in"])
def test_packed_step_scores_several_tokens_at_once(layout):
    m = tiny(n_kv_heads=2, qkv_bias=True)
    ids = torch.randint(0, 61, (2, 15), generator=torch.Generator().manual_seed(7))
    dec, cache = PackedDecoder(m, layout), KVCache.for_model(m, 2, 15)
    with torch.no_grad():
        m(ids[:, :6], cache=cache)
        got = torch.cat([dec.step(ids[:, 6:11], cache), dec.step(ids[:, 11:], cache)], 1)
        ref = m(ids)[:, 6:]
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


def test_packed_decoder_refuses_variants():
    m = tiny()
    m.layers[1].self_attn.window = 4
    with pytest.raises(ValueError, match="layer 1"):
        PackedDecoder(m)
