"""The decoder itself: shapes, causality, the cache hook, GQA/MQA, config validation."""
import pytest
import torch

from minillm.config import PRESETS, ModelConfig
from minillm.model import Transformer


def tiny(**kw) -> Transformer:
    torch.manual_seed(0)
    cfg = dict(vocab_size=97, dim=48, n_layers=2, n_heads=4, hidden_dim=80, max_seq_len=64)
    cfg.update(kw)
    return Transformer(ModelConfig(**cfg)).eval()


class ConcatCache:
    """The smallest cache that satisfies the hook: keep every key/value ever seen."""

    def __init__(self):
        self.k, self.v, self.pos = {}, {}, {}

    def update(self, layer, k, v, positions):
        if layer in self.k:
            self.k[layer] = torch.cat([self.k[layer], k], dim=2)
            self.v[layer] = torch.cat([self.v[layer], v], dim=2)
            self.pos[layer] = torch.cat([self.pos[layer], positions])
        else:
            self.k[layer], self.v[layer], self.pos[layer] = k, v, positions
        return self.k[layer], self.v[layer], self.pos[layer]


@pytest.mark.parametrize("kv", [4, 2, 1])
def test_logits_shape_for_mha_gqa_mqa(kv):
    m = tiny(n_kv_heads=kv)
    ids = torch.randint(0, 97, (3, 11))
    assert m(ids).shape == (3, 11, 97)
    assert m(ids, last_only=True).shape == (3, 1, 97)


def test_param_count_matches_config_formula():
    for kw in [{}, dict(n_kv_heads=1), dict(tie_embeddings=False), dict(qkv_bias=True)]:
        m = tiny(**kw)
        assert m.num_params() == m.config.num_params()


def test_causal_future_tokens_do_not_change_the_past():
    m = tiny()
    ids = torch.randint(0, 97, (1, 12))
    other = ids.clone()
    other[0, 8:] = (other[0, 8:] + 1) % 97
    with torch.no_grad():
        a, b = m(ids), m(other)
    assert torch.allclose(a[:, :8], b[:, :8], atol=1e-6)
    assert not torch.allclose(a[:, 8:], b[:, 8:], atol=1e-3)


@pytest.mark.parametrize("kv", [4, 2, 1])
def test_cache_hook_reproduces_full_forward(kv):
    m = tiny(n_kv_heads=kv)
    ids = torch.randint(0, 97, (2, 10))
    with torch.no_grad():
        full = m(ids)
        cache = ConcatCache()
        first = m(ids[:, :6], positions=torch.arange(6), cache=cache)
        steps = [m(ids[:, t:t + 1], positions=torch.tensor([t]), cache=cache) for t in range(6, 10)]
    got = torch.cat([first] + steps, dim=1)
    assert torch.allclose(got, full, atol=1e-5)


def test_explicit_positions_equal_default():
    m = tiny()
    ids = torch.randint(0, 97, (1, 9))
    with torch.no_grad():
        assert torch.allclose(m(ids), m(ids, positions=torch.arange(9)), atol=1e-6)


def test_per_sequence_positions_with_left_padding_shift():
    """Positions [B, T] let two sequences sit at different offsets (RoPE is relative)."""
    m = tiny()
    ids = torch.randint(0, 97, (1, 7))
    with torch.no_grad():
        base = m(ids)
        shifted = m(ids, positions=torch.arange(5, 12)[None])
    assert torch.allclose(base, shifted, atol=1e-4)   # relative positions unchanged


def test_bad_inputs_raise():
    m = tiny()
    with pytest.raises(ValueError, match="shape"):
        m(torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match="empty"):
        m(torch.zeros(1, 0, dtype=torch.long))
    with pytest.raises(ValueError, match="positions"):
        m(torch.zeros(1, 4, dtype=torch.long), positions=torch.arange(3))


@pytest.mark.parametrize("kw, match", [
    (dict(dim=50, n_heads=4), "divisible"),
    (dict(n_heads=4, n_kv_heads=3), "multiple"),
    (dict(n_layers=0), "n_layers"),
    (dict(head_dim=7, dim=28, n_heads=4), "even"),
])
def test_config_validation(kw, match):
    base = dict(vocab_size=10, dim=48, n_layers=1, n_heads=4, hidden_dim=16)
    base.update(kw)
    with pytest.raises(ValueError, match=match):
        ModelConfig(**base)


def test_llama_2_13b_preset_has_13b_params():
    assert 12.8e9 < PRESETS["llama-2-13b"].num_params() < 13.1e9


def test_the_two_cache_protocols_are_declared_and_checked_per_class():
    from minillm.kvcache import KVCache
    from minillm.model import AttentionCache, KVStore, cache_is
    from minillm.serving.attention_backend import PagedKVCache, RaggedPrefill
    from minillm.serving.static_batching import PaddedKVCache
    assert issubclass(KVCache, KVStore) and not issubclass(KVCache, AttentionCache)
    assert issubclass(PagedKVCache, AttentionCache) and not issubclass(PagedKVCache, KVStore)
    assert issubclass(RaggedPrefill, AttentionCache)
    assert issubclass(PaddedKVCache, AttentionCache) and issubclass(PaddedKVCache, KVStore)

    class UpdateOnly:                   # a student's cache without advance: never advanced
        def update(self, layer, k, v, positions):
            return k, v, positions
    assert not cache_is(UpdateOnly(), KVStore) and not cache_is(UpdateOnly(), AttentionCache)
    assert cache_is(RaggedPrefill([1]), AttentionCache)

