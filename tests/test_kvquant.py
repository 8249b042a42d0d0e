"""The int8 KV cache (minillm.kvquant): format, exactness against the fp cache, bytes, cost."""
import pytest
import torch

import minillm
from minillm.attention import to_gqa, to_sliding
from minillm.config import ModelConfig
from minillm.generate import generate_cached
from minillm.kvcache import KVCache
from minillm.kvquant import Int8KVCache, dequantize_kv, quantize_kv, with_kv_cache
from minillm.model import Transformer
from minillm.sampling import SamplingParams


def rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_quantize_kv_is_per_vector_absmax_within_half_a_step():
    # tokens of very different sizes (above ~8e-3, where an fp16 scale would turn subnormal)
    x = rand(2, 3, 5, 16) * torch.logspace(-1.5, 2, 5)[None, None, :, None]
    q, s = quantize_kv(x)
    assert q.dtype == torch.int8 and s.dtype == torch.float16 and s.shape == (2, 3, 5, 1)
    assert (q.abs().amax(-1) == 127).all()               # every vector uses the full range
    err = (dequantize_kv(q, s) - x).abs()
    assert (err <= s.float() / 2 + 1e-6).all()
    rel = err.amax(-1) / x.abs().amax(-1)
    assert rel.max() < 0.5 / 127 * 1.01                    # small tokens keep their resolution


def test_quantize_kv_zero_vector_and_bad_dtype():
    q, s = quantize_kv(torch.zeros(1, 1, 2, 8))
    assert (q == 0).all() and torch.isfinite(s).all() and (s > 0).all()
    assert (dequantize_kv(q, s) == 0).all()
    with pytest.raises(ValueError, match="floating-point"):
        quantize_kv(torch.ones(2, 4, dtype=torch.int32))


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return Transformer(ModelConfig(vocab_size=64, dim=64, n_layers=3, n_heads=4, hidden_dim=96,
                                   max_seq_len=48)).eval()


def _decode_logits(model, cache, ids, prefill):
    with torch.no_grad():
        out = [model(ids[:, :prefill], cache=cache)]
        for t in range(prefill, ids.shape[1]):
            out.append(model(ids[:, t:t + 1], cache=cache))
    return torch.cat(out, dim=1)


@pytest.mark.parametrize("convert", ["mha", "gqa", "sliding"])
def test_int8_cache_logits_close_to_fp_cache(tiny, convert):
    model = {"mha": tiny, "gqa": to_gqa(tiny, 2), "sliding": to_sliding(tiny, 8, 3)}[convert]
    ids = torch.randint(0, 64, (2, 40), generator=torch.Generator().manual_seed(1))
    fp = _decode_logits(model, KVCache.for_model(model, 2, 40), ids, 5)
    q8 = _decode_logits(model, Int8KVCache.for_model(model, 2, 40), ids, 5)
    with torch.no_grad():
        full = model(ids)
    torch.testing.assert_close(fp, full, atol=1e-4, rtol=1e-4)      # the fp cache is exact
    err = (q8 - fp).abs().max()
    assert 0 < err < 0.02 * fp.abs().max()                           # int8 is close, not exact


def test_int8_cache_ring_buffers_hold_codes_and_scales(tiny):
    model = to_sliding(tiny, 8, 3)                    # layers 0, 1 local (window 8), 2 global
    cache = Int8KVCache.for_model(model, 1, 30)
    assert [k.shape[2] for k in cache.k] == [8, 8, 30]
    assert [k.shape[2] for k in cache.scales.k] == [8, 8, 30]
    assert cache.k[0].dtype == torch.int8 and cache.scales.k[0].dtype == torch.float16
    _decode_logits(model, cache, torch.randint(0, 64, (1, 30)), 3)
    assert cache.seq_len == cache.scales.seq_len == 30
    assert sorted(cache.slot_pos[0].tolist()) == list(range(22, 30))


def test_bytes_halved_vs_fp16_and_quartered_vs_fp32(tiny):
    H = tiny.config.head_dim                              # 16: one fp16 scale per 16 codes
    q8 = Int8KVCache.for_model(tiny, 2, 40)
    fp16 = KVCache.for_model(tiny, 2, 40, dtype=torch.float16)
    fp32 = KVCache.for_model(tiny, 2, 40, dtype=torch.float32)
    assert q8.nbytes * 2 * H == fp16.nbytes * (H + 2)     # (H codes + 2 scale bytes) / 2H
    assert q8.nbytes * 4 * H == fp32.nbytes * (H + 2)
    assert q8.bytes_per_token() == 3 * 4 * 2 * (H + 2)    # L * heads * (k, v) * (H + 2)
    m = minillm.load("target")                            # H = 64: 66 / 128 of fp16
    ratio = Int8KVCache.for_model(m, 1, 512).nbytes / KVCache.for_model(
        m, 1, 512, dtype=torch.float16).nbytes
    assert ratio == pytest.approx(66 / 128)


def test_generation_truncate_and_reset(tiny):
    prompt = torch.randint(0, 64, (1, 6), generator=torch.Generator().manual_seed(2))
    params = SamplingParams(temperature=0.0, max_new_tokens=12)
    cache = Int8KVCache.for_model(tiny, 1, 18)
    new = generate_cached(tiny, prompt, params, cache=cache)[0]
    assert len(new) == 12 and cache.seq_len == cache.scales.seq_len == 17
    cache.truncate(6)                                      # speculative roll-back
    assert cache.seq_len == cache.scales.seq_len == 6
    cache.reset()
    assert cache.seq_len == cache.scales.seq_len == 0
    with pytest.raises(ValueError, match="floating point"):
        Int8KVCache(cache.specs, 1, 8, dtype=torch.int8)


def test_with_kv_cache_wraps_any_cache(tiny):
    ids = torch.randint(0, 64, (3, 20), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(with_kv_cache(tiny, KVCache)(ids), tiny(ids), atol=1e-5,
                                   rtol=1e-5)
        assert not torch.equal(with_kv_cache(tiny)(ids), tiny(ids))
    assert with_kv_cache(tiny).config is tiny.config


def test_shipped_model_int8_kv_perplexity_cost(one_thread):
    """On 1024 held-out tokens the int8 cache costs well under 0.1 % of perplexity."""
    from minillm.evaluate import perplexity
    m, tok = minillm.load("target").float(), minillm.load_tokenizer("target")
    base = perplexity(m, tok, "val", max_tokens=1024)["ppl"]
    q8 = perplexity(with_kv_cache(m), tok, "val", max_tokens=1024)["ppl"]
    assert q8 != base and abs(q8 / base - 1) < 1e-3


def test_cli_eval_ppl_kv_int8(capsys):
    import json

    from minillm.cli import main
    def run(*extra):
        with pytest.raises(SystemExit) as e:
            main(["eval", "ppl", "--model", "draft", "--max-tokens", "600", "--json", *extra])
        assert e.value.code == 0
        return json.loads(capsys.readouterr().out)

    base, q = run(), run("--kv-int8", "--quant", "int8")
    assert base["kv_int8"] is False and q["kv_int8"] is True and q["quant"] == "int8"
    assert q["tokens"] == base["tokens"] == 599
    assert q["ppl"] != base["ppl"] and abs(q["ppl"] / base["ppl"] - 1) < 0.01
    assert q["model_bytes"] < base["model_bytes"]          # the weights, as before
