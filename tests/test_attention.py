"""Lab 03's library: GQA, MLA, CLA and sliding-window attention as drop-in layers."""
import types

import pytest
import torch

import minillm
from minillm.attention import (
    CrossLayerAttention,
    KVProducerAttention,
    MLAAttention,
    cache_bytes_vs_length,
    mean_pool_kv_heads,
    mla_weights_from_mha,
    rope_last_permutation,
    survey,
    to_cla,
    to_gqa,
    to_mla,
    to_sliding,
)
from minillm.attention import mla as mla_mod
from minillm.config import ModelConfig
from minillm.evaluate import perplexity
from minillm.generate import generate_cached, generate_naive
from minillm.kvcache import KVCache, KVSpec, kv_bytes_per_token, layer_specs
from minillm.model import Attention, Transformer
from minillm.sampling import SamplingParams

V, D, L, N, H = 61, 64, 4, 4, 16


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


def tiny(seed=0, **kw):
    """A small random model with larger-than-default weights, so greedy choices are clear-cut."""
    torch.manual_seed(seed)
    cfg = dict(vocab_size=V, dim=D, n_layers=L, n_heads=N, hidden_dim=96, max_seq_len=128)
    cfg.update(kw)
    m = Transformer(ModelConfig(**cfg)).eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.15)
    return m


@pytest.fixture(scope="module")
def model():
    return tiny()


VARIANTS = {
    "gqa2": lambda m: to_gqa(m, 2),
    "mqa": lambda m: to_gqa(m, 1),
    "mla": lambda m: to_mla(m, 32, 4),
    "mla_absorb": lambda m: to_mla(m, 32, 4, absorb=True),
    "mla_svd_key": lambda m: to_mla(m, 24, 8, rope_key="svd"),
    "cla2": lambda m: to_cla(m, 2),
    "cla3_mean": lambda m: to_cla(m, 3, init="mean"),
    "gqa_cla": lambda m: to_cla(to_gqa(m, 2), 2),
    "sliding": lambda m: to_sliding(m, 8, global_every=2),
    "sliding_mla_absorb": lambda m: to_mla(to_sliding(m, 8, global_every=2), 32, 4, absorb=True),
    "sliding_cla": lambda m: to_cla(to_sliding(m, 8, global_every=4), 3),
}


@pytest.fixture(scope="module")
def variants(model):
    return {name: build(model) for name, build in VARIANTS.items()}


# ---- every variant runs with the same cache and generation loops ---------------------------

@pytest.mark.parametrize("name", VARIANTS)
@torch.no_grad()
def test_logits_with_cache_equal_full_forward(variants, name):
    m = variants[name]
    ids = torch.randint(0, V, (2, 40), generator=torch.Generator().manual_seed(1))
    full = m(ids)
    cache = KVCache.for_model(m, 2, 40)
    got = [m(ids[:, :7], cache=cache)] + [m(ids[:, t:t + 1], cache=cache) for t in range(7, 40)]
    torch.testing.assert_close(torch.cat(got, 1), full, atol=2e-5, rtol=1e-5)
    cache = KVCache.for_model(m, 2, 40)            # chunked prefill (chunks longer than a window)
    got = [m(ids[:, a:b], cache=cache) for a, b in ((0, 11), (11, 30), (30, 40))]
    torch.testing.assert_close(torch.cat(got, 1), full, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("name", VARIANTS)
def test_cached_greedy_equals_naive(variants, name):
    m = variants[name]
    p = SamplingParams(temperature=0.0, max_new_tokens=30)
    prompts = torch.tensor([[1, 2, 3, 4, 5], [9, 8, 7, 6, 5]])
    out = generate_cached(m, prompts, p)
    assert out == generate_naive(m, prompts, p)
    assert all(len(row) == 30 for row in out)


@pytest.mark.parametrize("name", VARIANTS)
def test_conversion_does_not_mutate_input(name):
    m = tiny(seed=3)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    cfg = m.config.to_dict()
    new = VARIANTS[name](m)
    assert new is not m
    assert m.config.to_dict() == cfg
    assert all(type(layer.self_attn) is Attention and layer.self_attn.window is None
               for layer in m.layers)
    after = m.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)
    new_params = {id(p) for p in new.parameters()}
    assert not new_params & {id(p) for p in m.parameters()}


# ---- GQA -------------------------------------------------------------------------------------

def test_mean_pool_kv_heads_by_hand():
    w = torch.arange(4 * 2 * 3, dtype=torch.float32).view(8, 3)     # 4 heads of dim 2, D = 3
    pooled = mean_pool_kv_heads(w, 4, 2, 2)
    torch.testing.assert_close(pooled, torch.stack([(w[0] + w[2]) / 2, (w[1] + w[3]) / 2,
                                                    (w[4] + w[6]) / 2, (w[5] + w[7]) / 2]))
    bias = torch.arange(8, dtype=torch.float32)
    torch.testing.assert_close(mean_pool_kv_heads(bias, 4, 1, 2),
                               torch.tensor([3.0, 4.0]))
    assert torch.equal(mean_pool_kv_heads(w, 4, 4, 2), w)


@torch.no_grad()
def test_gqa_with_k_equal_n_is_identity(model):
    ids = torch.randint(0, V, (2, 30), generator=torch.Generator().manual_seed(2))
    same = to_gqa(model, N)
    assert torch.equal(same(ids), model(ids))
    assert same.config.n_kv_heads == N


@torch.no_grad()
def test_gqa_groups_consecutive_heads():
    """If the KV heads of each group are already equal, pooling is exact: same logits."""
    m = tiny(seed=4, qkv_bias=True)
    for layer in m.layers:
        a = layer.self_attn
        for proj in (a.k_proj.weight, a.v_proj.weight, a.k_proj.bias, a.v_proj.bias):
            proj.normal_(0.0, 0.3)
            heads = proj.view(N, H, *proj.shape[1:])
            heads[1], heads[3] = heads[0], heads[2]          # groups {0, 1} and {2, 3}
    ids = torch.randint(0, V, (1, 25), generator=torch.Generator().manual_seed(5))
    g = to_gqa(m, 2)
    assert g.config.n_kv_heads == 2 and g.layers[0].self_attn.k_proj.bias.shape == (2 * H,)
    torch.testing.assert_close(g(ids), m(ids), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(to_gqa(m, 1)(ids), m(ids), atol=1e-3)   # {0..3} are not equal


def test_gqa_kv_spec_and_cache_bytes(model):
    g = to_gqa(model, 2)
    assert layer_specs(g) == [KVSpec(2, H, H)] * L
    cache = KVCache.for_model(g, batch_size=3, max_len=50)
    assert cache.nbytes == L * 2 * 3 * 2 * 50 * H * 4      # layers * (k, v) * B * K * S * H * fp32
    assert kv_bytes_per_token(layer_specs(g)) == g.config.kv_bytes_per_token()


# ---- MLA -------------------------------------------------------------------------------------

def test_mla_modules_and_spec():
    cfg = ModelConfig(vocab_size=V, dim=D, n_layers=1, n_heads=N, hidden_dim=96)
    a = MLAAttention(cfg, 0, latent_dim=24, rope_dim=6)
    shapes = {n: tuple(p.shape) for n, p in a.named_parameters()}
    assert shapes == {"q_proj.weight": (N * H, D), "kv_down.weight": (24, D),
                      "k_up.weight": (N * (H - 6), 24), "v_up.weight": (N * H, 24),
                      "k_rope_proj.weight": (6, D), "o_proj.weight": (D, N * H)}
    assert a.kv_spec() == KVSpec(1, 24, 6)
    assert a.kv_spec().elems_per_token() == 30


def test_mla_cache_bytes(variants):
    m = variants["mla"]                                            # C = 32, R = 4
    cache = KVCache.for_model(m, batch_size=2, max_len=40)
    assert cache.nbytes == L * 2 * 40 * (32 + 4) * 4
    # DeepSeek-V2's numbers: 128 heads of 128 dims, C = 512, R = 64 -> 576 vs 32768 per layer
    assert KVSpec(1, 512, 64).elems_per_token() == 576
    assert KVSpec(128, 128, 128).elems_per_token() == 32768


@torch.no_grad()
def test_mla_naive_equals_absorbed(variants):
    naive, absorbed = variants["mla"], variants["mla_absorb"]
    ids = torch.randint(0, V, (2, 33), generator=torch.Generator().manual_seed(6))
    torch.testing.assert_close(absorbed(ids), naive(ids), atol=2e-5, rtol=1e-5)
    pos = torch.arange(5, 38).repeat(2, 1)                          # per-sequence positions
    torch.testing.assert_close(absorbed(ids, positions=pos), naive(ids, positions=pos),
                               atol=2e-5, rtol=1e-5)
    # a cache filled by one path serves the other: it holds the same latents
    c1, c2 = KVCache.for_model(naive, 2, 33), KVCache.for_model(naive, 2, 33)
    outs = [[naive(ids[:, :9], cache=c1)], [absorbed(ids[:, :9], cache=c2)]]
    for layer in absorbed.layers:
        layer.self_attn.absorb = False
    try:
        for t in range(9, 33):
            outs[0].append(naive(ids[:, t:t + 1], cache=c1))
            outs[1].append(absorbed(ids[:, t:t + 1], cache=c2))
            for layer in absorbed.layers:                            # alternate the paths
                layer.self_attn.absorb = not layer.self_attn.absorb
    finally:
        for layer in absorbed.layers:
            layer.self_attn.absorb = True
    torch.testing.assert_close(torch.cat(outs[1], 1), torch.cat(outs[0], 1), atol=2e-5,
                               rtol=1e-5)


@torch.no_grad()
def test_mla_decode_step_takes_a_given_function(model, variants):
    """to_mla(..., decode_step=f): f computes every decode step (lab 03 passes the student's
    step; its grading kernel withholds attend_naive), a prefill takes the model's own path,
    and attend_naive computes what that path does."""
    calls = []

    def step(attn, q_nope, q_rope, c, k_rope):          # attend_naive in lab 03's signature
        calls.append(c.shape[1])
        S = c.shape[1]
        return attn.attend_naive(q_nope[:, :, None], q_rope[:, :, None], c[:, None],
                                 k_rope[:, None], torch.tensor([S - 1]), torch.arange(S))[:, :, 0]

    naive, stepped = variants["mla"], to_mla(model, 32, 4, decode_step=step)
    ids = torch.randint(0, V, (2, 12), generator=torch.Generator().manual_seed(9))
    torch.testing.assert_close(stepped(ids), naive(ids))
    assert calls == []                                  # a prefill is not a decode step
    caches = [KVCache.for_model(m, 2, 12) for m in (naive, stepped)]
    outs = [[m(ids[:, :5], cache=c)] for m, c in zip((naive, stepped), caches)]
    for t in range(5, 12):
        for m, c, out in zip((naive, stepped), caches, outs):
            out.append(m(ids[:, t:t + 1], cache=c))
    torch.testing.assert_close(torch.cat(outs[1], 1), torch.cat(outs[0], 1), atol=2e-5,
                               rtol=1e-5)
    assert calls == [S for S in range(6, 13) for _ in range(L)]
    wrong = to_mla(model, 32, 4, decode_step=lambda *args: 0 * step(*args))
    cache = KVCache.for_model(wrong, 2, 12)
    wrong(ids[:, :5], cache=cache)
    assert (wrong(ids[:, 5:6], cache=cache) - outs[0][1]).abs().max() > 1e-2


@torch.no_grad()
def test_wrong_absorbed_path_is_caught(variants, monkeypatch):
    """Forgetting that the latent-space scores must still be scaled by 1/sqrt(H) is caught."""
    naive, absorbed = variants["mla"], variants["mla_absorb"]
    ids = torch.randint(0, V, (1, 20), generator=torch.Generator().manual_seed(7))
    right = absorbed(ids)
    monkeypatch.setattr(mla_mod, "math", types.SimpleNamespace(sqrt=lambda x: 1.0))
    wrong = absorbed(ids)
    assert not torch.allclose(wrong, naive(ids), atol=1e-3)
    torch.testing.assert_close(right, naive(ids), atol=2e-5, rtol=1e-5)


def test_rope_last_permutation():
    assert rope_last_permutation(8, 4).tolist() == [2, 3, 6, 7, 0, 1, 4, 5]
    p = rope_last_permutation(16, 6)
    assert sorted(p.tolist()) == list(range(16))


@torch.no_grad()
def test_mla_svd_reconstruction(model):
    a = model.layers[1].self_attn
    perm = rope_last_permutation(H, 4)
    wk = a.k_proj.weight.view(N, H, D)[:, perm]
    stacked = torch.cat([wk[:, :H - 4].reshape(-1, D), a.v_proj.weight]).double()
    S = torch.linalg.svdvals(stacked)
    for C in (D, 40, 12):
        w = mla_weights_from_mha(a.q_proj.weight, a.k_proj.weight, a.v_proj.weight, N, H, C, 4)
        rec = torch.cat([w["k_up"], w["v_up"]]) @ w["kv_down"]
        err = (rec - stacked).pow(2).sum()
        # Eckart-Young: the error is exactly the discarded singular values' energy
        torch.testing.assert_close(err, S[C:].pow(2).sum(), atol=1e-8, rtol=1e-6)
        if C == D:
            torch.testing.assert_close(rec, stacked, atol=1e-10, rtol=0)
    q = mla_weights_from_mha(a.q_proj.weight, a.k_proj.weight, a.v_proj.weight, N, H, D, 4)
    torch.testing.assert_close(q["q_proj"].float().view(N, H, D),
                               a.q_proj.weight.view(N, H, D)[:, perm])


def _mha_convertible_exactly(seed, R):
    """An MHA model MLA can represent exactly: rank-1 (complex) rope keys across heads and no
    weight on the RoPE pairs MLA leaves unrotated."""
    m = tiny(seed=seed)
    r2, half = R // 2, H // 2
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in m.layers:
            a = layer.self_attn
            wq, wk = a.q_proj.weight.view(N, H, D), a.k_proj.weight.view(N, H, D)
            for i in range(r2, half):                        # pairs MLA will not rotate: unused
                for w in (wq, wk):
                    w[:, i] = 0
                    w[:, half + i] = 0
            for i in range(r2):                              # K_h = alpha_h * s per kept pair
                s = torch.complex(torch.randn(D, generator=g), torch.randn(D, generator=g)) * 0.15
                alpha = torch.complex(torch.randn(N, 1, generator=g),
                                      torch.randn(N, 1, generator=g))
                k = alpha * s
                wk[:, i], wk[:, half + i] = k.real, k.imag
    return m


@torch.no_grad()
def test_mla_full_rank_conversion_is_exact_when_the_model_allows_it():
    R = 12                                                 # leaves one unrotated pair
    m = _mha_convertible_exactly(8, R)
    ids = torch.randint(0, V, (2, 30), generator=torch.Generator().manual_seed(9))
    ref = m(ids)
    exact = to_mla(m, D, R, rope_key="svd")
    torch.testing.assert_close(exact(ids), ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(to_mla(m, D, R, absorb=True, rope_key="svd")(ids), ref,
                               atol=1e-4, rtol=1e-4)
    # the mean rope key cannot represent per-head phases; a low rank latent loses information
    assert (to_mla(m, D, R, rope_key="mean")(ids) - ref).abs().max() > 1e-2
    assert (to_mla(m, 8, R, rope_key="svd")(ids) - ref).abs().max() > 1e-2


# ---- CLA -------------------------------------------------------------------------------------

def test_cla_consumers_store_nothing(model, variants):
    c = variants["cla2"]
    kinds = [type(layer.self_attn) for layer in c.layers]
    assert kinds == [KVProducerAttention, CrossLayerAttention] * 2
    assert layer_specs(c) == [KVSpec(N, H, H), None, KVSpec(N, H, H), None]
    consumer = c.layers[1].self_attn
    assert not hasattr(consumer, "k_proj") and not hasattr(consumer, "v_proj")
    assert consumer.shared is c.layers[0].self_attn.shared
    assert consumer.shared is not c.layers[3].self_attn.shared
    cache = KVCache.for_model(c, 1, 64)
    assert cache.k[1] is None and cache.v[3] is None
    assert cache.nbytes * 2 == KVCache.for_model(model, 1, 64).nbytes
    assert c.num_params() == model.num_params() - 2 * 2 * D * N * H
    with pytest.raises(ValueError, match="no KV storage"):
        cache.update(1, torch.zeros(1, N, 1, H), torch.zeros(1, N, 1, H), torch.tensor([0]))


@torch.no_grad()
def test_cla_share_one_is_identity_and_copies_keep_sharing(model):
    ids = torch.randint(0, V, (2, 21), generator=torch.Generator().manual_seed(10))
    assert torch.equal(to_cla(model, 1)(ids), model(ids))
    c = to_cla(model, 2)
    import copy
    c2 = copy.deepcopy(c)
    assert c2.layers[1].self_attn.shared is c2.layers[0].self_attn.shared
    assert c2.layers[1].self_attn.shared is not c.layers[1].self_attn.shared
    torch.testing.assert_close(c2(ids), c(ids))


@torch.no_grad()
def test_cla_consumer_reads_the_producer(model):
    """A consumer's output changes when (only) its producer's key projection changes."""
    c = to_cla(model, 2)
    ids = torch.randint(0, V, (1, 15), generator=torch.Generator().manual_seed(11))
    captured = {}
    c.layers[1].self_attn.register_forward_hook(lambda mod, inp, out: captured.update(a=out))
    c(ids)
    before = captured["a"].clone()
    c.layers[0].self_attn.k_proj.weight.mul_(2.0)
    c(ids)
    assert not torch.allclose(before, captured["a"], atol=1e-4)


def test_cla_mean_init(model):
    c = to_cla(model, 2, init="mean")
    want = (model.layers[2].self_attn.k_proj.weight + model.layers[3].self_attn.k_proj.weight) / 2
    torch.testing.assert_close(c.layers[2].self_attn.k_proj.weight, want)
    torch.testing.assert_close(c.layers[3].self_attn.q_proj.weight,
                               model.layers[3].self_attn.q_proj.weight)


# ---- sliding window ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def long_model():
    return tiny(seed=12, max_seq_len=96)


def test_sliding_ring_buffer_generation_equals_naive(long_model):
    s = to_sliding(long_model, 16, global_every=2)
    assert [layer.self_attn.window for layer in s.layers] == [16, None, 16, None]
    p = SamplingParams(temperature=0.0, max_new_tokens=76)
    prompt = [[3, 1, 4, 1]]
    cache = KVCache.for_model(s, 1, 80)
    out = generate_cached(s, prompt, p, cache=cache)
    assert len(out[0]) == 76 and cache.seq_len == 79
    assert out == generate_naive(s, prompt, p)
    assert cache.k[0].shape[2] == 16 and cache.k[1].shape[2] == 80
    # the ring holds exactly the last 16 positions the model has cached
    assert sorted(cache.slot_pos[0].tolist()) == list(range(79 - 16, 79))


@torch.no_grad()
def test_sliding_window_only_matters_beyond_the_window(long_model):
    s = to_sliding(long_model, 16, global_every=2)
    ids = torch.randint(0, V, (1, 60), generator=torch.Generator().manual_seed(13))
    a, b = s(ids), long_model(ids)
    torch.testing.assert_close(a[:, :16], b[:, :16])
    assert not torch.allclose(a[:, 16:], b[:, 16:], atol=1e-3)


def test_sliding_cache_bytes(long_model):
    s = to_sliding(long_model, 16, global_every=4)                   # 3 local + 1 global
    per_tok = 2 * N * H * 2                                          # bf16 k and v per layer
    lengths = [1, 8, 16, 17, 50, 96]
    got = cache_bytes_vs_length(s, lengths)
    assert got == [(3 * min(n, 16) + n) * per_tok for n in lengths]
    for n, b in zip(lengths, got):
        assert KVCache.for_model(s, 1, n, dtype=torch.bfloat16).nbytes == b
    local = [KVCache.for_model(s, 1, n).k[0].numel() for n in (32, 64, 96)]
    assert local[0] == local[1] == local[2] == N * 16 * H            # flat in max_len
    full = [KVCache.for_model(s, 1, n).k[3].numel() for n in (32, 64)]
    assert full[1] == 2 * full[0]
    assert cache_bytes_vs_length(long_model, [10]) == [4 * 10 * per_tok]
    mixed = to_mla(s, 32, 4)                                         # MLA keeps the windows
    assert cache_bytes_vs_length(mixed, [50]) == [(3 * 16 + 50) * 36 * 2]


# ---- bad input -----------------------------------------------------------------------------

def test_clear_errors(model):
    g2 = to_gqa(model, 2)
    cases = [
        (lambda: to_gqa(model, 3), "not divisible"),
        (lambda: to_gqa(model, 0), "positive integer"),
        (lambda: to_gqa(g2, 4), "cannot pool"),
        (lambda: to_gqa(to_cla(model, 2), 2), "standard Attention"),
        (lambda: mean_pool_kv_heads(torch.zeros(8, 3), 4, 3, 2), "must divide"),
        (lambda: mean_pool_kv_heads(torch.zeros(7, 3), 4, 2, 2), "rows"),
        (lambda: to_mla(model, 32, 5), "even"),
        (lambda: to_mla(model, 32, H), "rope_dim"),
        (lambda: to_mla(model, 0, 4), "latent_dim"),
        (lambda: to_mla(model, D + 1, 4), "larger than the model dim"),
        (lambda: to_mla(g2, 32, 4), "n_kv_heads"),
        (lambda: to_mla(tiny(qkv_bias=True), 32, 4), "bias"),
        (lambda: to_mla(model, 32, 4, rope_key="best"), "rope_key"),
        (lambda: to_cla(model, 0), "share"),
        (lambda: to_cla(model, 2, init="random"), "init"),
        (lambda: to_cla(to_sliding(model, 8, global_every=2), 2), "different windows"),
        (lambda: to_sliding(model, 0), "window"),
        (lambda: to_sliding(model, 8, global_every=0), "global_every"),
        (lambda: to_sliding(to_cla(model, 2), 8), "before to_cla"),
        (lambda: cache_bytes_vs_length(model, [-1]), "lengths"),
        (lambda: survey(model, None, max_tokens=1), "max_tokens"),
        (lambda: survey(model, None, max_tokens=64, variants=["GQA K=5"]), "unknown variant"),
    ]
    for fn, match in cases:
        with pytest.raises(ValueError, match=match):
            fn()


# ---- the shipped model -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def shipped():
    return minillm.load("target"), minillm.load_tokenizer("target")


@torch.no_grad()
def test_shipped_gqa_identity_and_mla_init(shipped):
    m, tok = shipped
    ids = torch.tensor([tok.encode("ROMEO:\nBut soft, what light through yonder window")])
    ref = m(ids)
    assert torch.equal(to_gqa(m, 6)(ids), ref)
    full = to_mla(m, 384, 32, rope_key="svd")
    torch.testing.assert_close(to_mla(m, 384, 32, absorb=True, rope_key="svd")(ids), full(ids),
                               atol=1e-4, rtol=1e-4)
    # the svd rope key keeps more of the model than the mean one (next-token agreement)
    agree = {key: (to_mla(m, 384, 32, rope_key=key)(ids).argmax(-1) == ref.argmax(-1))
             .float().mean().item() for key in ("mean", "svd")}
    assert agree["svd"] >= agree["mean"] and agree["svd"] > 0.5


def test_survey_rows(shipped):
    m, tok = shipped
    names = ["MHA", "GQA K=3", "MLA C=96 R=32", "CLA share=2", "SWA w=64, 1 global in 6"]
    rows = survey(m, tok, max_tokens=129, variants=names)
    assert [r["name"] for r in rows] == names
    per_layer = 2 * 6 * 64 * 2
    want = [6 * per_layer, 3 * per_layer, 6 * (96 + 32) * 2, 3 * per_layer,
            per_layer * (5 * 64 / 512 + 1)]
    assert [r["kv_bytes_per_token"] for r in rows] == pytest.approx(want)
    assert {"name", "family", "kv_bytes_per_token", "ppl", "loss", "params"} <= set(rows[0])
    assert rows[0]["ppl"] == pytest.approx(perplexity(m, tok, "val", max_tokens=129)["ppl"])
    assert rows[0]["params"] == m.num_params() and rows[3]["params"] < m.num_params()
    assert all(r["ppl"] > 1 for r in rows)
