"""Decode on the bandwidth scale: bytes counted from the model, the read measurement, the
compiled batch-1 step (minillm.bench.bandwidth, minillm.decode.compiled, bench decode's fields)."""
import pytest
import torch

from minillm.bench.bandwidth import (
    bandwidth_report,
    decode_limit,
    read_bandwidth,
    reader,
    step_bytes,
)
from minillm.bench.decode import bench_decode
from minillm.config import ModelConfig
from minillm.decode import PackedDecoder, generate_packed
from minillm.decode.compiled import CompiledDecoder
from minillm.generate import generate_naive
from minillm.kvcache import KVCache
from minillm.model import Transformer
from minillm.sampling import SamplingParams


def tiny(**kw):
    torch.manual_seed(0)
    cfg = dict(vocab_size=61, dim=32, n_layers=2, n_heads=4, hidden_dim=48, max_seq_len=64)
    cfg.update(kw)
    return Transformer(ModelConfig(**cfg)).eval()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_step_bytes_counts_every_weight_once_plus_the_cache(dtype):
    m = tiny(n_kv_heads=2).to(dtype)
    c, size = m.config, torch.tensor([], dtype=dtype).element_size()
    r = step_bytes(PackedDecoder(m), context_len=10, batch=3)
    # every parameter is read once per step except the embedding table (tied to the LM head,
    # which is read whole), of which each sequence reads one row
    params = sum(p.numel() for p in m.parameters()) * size
    assert r["weight_bytes"] == params
    assert r["embedding_bytes"] == 3 * c.dim * size
    assert r["kv_bytes"] == 3 * c.n_layers * 2 * 2 * c.head_dim * 11 * size
    assert r["bytes_per_step"] == r["weight_bytes"] + r["embedding_bytes"] + r["kv_bytes"]
    with pytest.raises(ValueError, match="context_len"):
        step_bytes(PackedDecoder(m), -1)


def test_bandwidth_report_is_tokens_over_the_read_time():
    r = bandwidth_report(1e6, 100, 0.01, {"a": 5000.0, "b": 2500.0})
    assert r["limit_tok_s"] == pytest.approx(10_000)
    assert r["read_gb_s"] == pytest.approx(10.0)
    assert r["a_bandwidth_fraction"] == pytest.approx(0.5)
    assert r["b_bandwidth_fraction"] == pytest.approx(0.25)
    assert decode_limit(1e6, 1e10, batch=2) == pytest.approx(20_000)


def test_read_measurements_are_positive_and_refuse_nonsense():
    assert 1e8 < read_bandwidth(1 << 20, repeats=3) < 1e13
    reader(1 << 16, 2)()
    with pytest.raises(ValueError, match="4096"):
        read_bandwidth(100)
    with pytest.raises(ValueError, match="passes"):
        reader(1 << 16, 0)


@pytest.mark.parametrize("kw", [dict(), dict(n_kv_heads=2), dict(n_kv_heads=1)])
def test_fused_step_gives_the_naive_loops_tokens_and_logits(kw):
    m = tiny(**kw)
    prompt = torch.randint(0, 61, (1, 6), generator=torch.Generator().manual_seed(6))
    dec = CompiledDecoder(m)
    expect = generate_naive(m, prompt, SamplingParams(temperature=0, max_new_tokens=24))
    assert generate_packed(m, prompt, 24, dec) == expect
    cache = KVCache.for_model(m, 1, 8)
    with torch.no_grad():
        m(prompt, cache=cache)
        logits = dec.step(prompt[0, -1:], cache)
        ref = m(torch.cat([prompt, prompt[:, -1:]], 1))[:, -1]
    torch.testing.assert_close(logits, ref, atol=1e-5, rtol=1e-5)
    assert cache.seq_len == 7


def test_fused_step_refuses_what_it_does_not_do():
    m = tiny()
    dec = CompiledDecoder(m)
    cache = KVCache.for_model(m, 2, 8)
    with pytest.raises(ValueError, match="shape"):
        dec.step(torch.tensor([1, 2]), cache)
    full = KVCache.for_model(m, 1, 3)
    with torch.no_grad():
        m(torch.tensor([[1, 2, 3]]), cache=full)
    with pytest.raises(ValueError, match="full"):
        dec.step(torch.tensor([1]), full)
    m.layers[1].self_attn.window = 4
    with pytest.raises(ValueError, match="layer 1"):
        CompiledDecoder(m)
    with pytest.raises(ValueError, match="bias"):
        CompiledDecoder(tiny(qkv_bias=True))


def test_bench_decode_reports_the_bandwidth_scale():
    m = tiny(n_kv_heads=2)
    r = bench_decode(m, prompt_len=4, new_tokens=11, repeats=1, naive=True)
    limit = r["limit_tok_s"]
    # 10 decode steps at cache lengths 4..13: the mean step reads the cache at 8.5 (+ 1 new)
    assert r["bytes_per_token"] == step_bytes(PackedDecoder(m), 8.5)["bytes_per_step"]
    assert r["read_gb_s"] == pytest.approx(limit * r["bytes_per_token"] / 1e9)
    for name in ("cached", "fused"):
        assert r[f"{name}_bandwidth_fraction"] == pytest.approx(r[f"{name}_step_tok_s"] / limit)
        assert r[f"{name}_tok_s"] > 0            # whole generations, prefill included
    assert r["bandwidth_fraction"] == max(r["cached_bandwidth_fraction"],
                                          r["fused_bandwidth_fraction"])
    assert r["naive_matches_cached"] and r["naive_matches_fused"]
    assert r["fused_matches_cached"]
    batched = bench_decode(m, prompt_len=4, new_tokens=6, batch=2, repeats=1, naive=False)
    assert "fused_tok_s" not in batched            # the fused step is batch 1 only
    assert batched["bandwidth_fraction"] == batched["cached_bandwidth_fraction"]


def test_step_bytes_counts_the_cache_with_the_function_it_is_given():
    """Lab 02 hands step_bytes the student's kv_bytes_per_token(config, bytes_per_value) (the
    course's is withheld there): the cache's bytes follow it, the weights' do not."""
    m = tiny(n_kv_heads=2)
    dec = PackedDecoder(m)
    ref = step_bytes(dec, context_len=10, batch=3)
    seen = []

    def mine(cfg, bytes_per_value):
        seen.append((cfg, bytes_per_value))
        return 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * bytes_per_value

    assert step_bytes(dec, 10, 3, kv_per_token=mine) == ref
    assert seen == [(m.config, 4)]
    twice = step_bytes(dec, 10, 3, kv_per_token=lambda cfg, b: 2 * mine(cfg, b))
    assert twice["kv_bytes"] == 2 * ref["kv_bytes"] and twice["weight_bytes"] == ref["weight_bytes"]
