"""What a quantized weight costs and what it becomes: minillm.quant's stored_bits_per_weight,
linear_bits_per_weight, fake_quantize and fake_quantize_model, on values computed by hand,
against the bytes QuantLinear really stores, and against the copies they replaced (lab 04's
helper cell and the lab 04 slides)."""
import pytest
import torch
import torch.nn as nn

from minillm.config import ModelConfig
from minillm.model import Transformer
from minillm.quant import (
    QuantLinear,
    dequantize,
    fake_quantize,
    fake_quantize_model,
    group_quantize,
    linear_bits_per_weight,
    model_bytes,
    quantize_model,
    stored_bits_per_weight,
    zeropoint_quantize,
)


def small_model(seed=0, **kw):
    torch.manual_seed(seed)
    cfg = dict(vocab_size=97, dim=64, n_layers=2, n_heads=2, hidden_dim=128, max_seq_len=32,
               tie_embeddings=False)
    return Transformer(ModelConfig(**{**cfg, **kw}))


# ---- stored_bits_per_weight --------------------------------------------------------------------
@pytest.mark.parametrize("args, kwargs, want", [
    ((8, 4096), {}, 8 + 1 / 256),                                  # per row of 4096, 16-bit scale
    ((4, 64), {"zero_point": True}, 4.5),                          # 4 + 32 / 64
    ((4, 128), {"zero_point": True}, 4.25),
    ((4, 128), {"scale_bits": 32, "zero_point": True}, 4.5),       # kernels/: fp32 scale and zero
    ((8, 1), {}, 24.0),                                            # a scale per weight
    ((3, 64), {"zero_point": True}, 3.5),
    ((8, 4096), {"scale_bits": 32}, 8.0078125),
])
def test_stored_bits_per_weight_by_hand(args, kwargs, want):
    assert stored_bits_per_weight(*args, **kwargs) == want


def test_stored_bits_per_weight_refuses_empty_groups():
    with pytest.raises(ValueError):
        stored_bits_per_weight(4, 0)


@pytest.mark.parametrize("K, N, G", [(64, 8, 32), (128, 3, 64), (256, 40, 128), (96, 5, 16)])
def test_stored_bits_match_the_bytes_quantlinear_stores(K, N, G):
    w8, w4 = QuantLinear(K, N, bits=8), QuantLinear(K, N, bits=4, group_size=G)
    assert 8 * model_bytes(w8) / (N * K) == stored_bits_per_weight(8, K)
    assert 8 * model_bytes(w4) / (N * K) == stored_bits_per_weight(4, G, zero_point=True)


# ---- linear_bits_per_weight --------------------------------------------------------------------
class TwoLayers(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(64, 4, bias=False)       # 256 weights, rows of 64
        self.b = nn.Linear(32, 8, bias=False)       # 256 weights, rows of 32
        self.lm_head = nn.Linear(32, 1000, bias=False)


def test_linear_bits_per_weight_by_hand():
    m = TwoLayers()
    assert linear_bits_per_weight(m, 4, 32, zero_point=True) == 5.0        # 4 + 32 / 32
    assert linear_bits_per_weight(m, 8) == (8 + 16 / 64 + 8 + 16 / 32) / 2   # per row: 8.375
    assert linear_bits_per_weight(m, 8, skip=()) != 8.375                   # lm_head counts now


@pytest.mark.parametrize("scheme, bits, G", [("int8", 8, None), ("int4-g32", 4, 32),
                                             ("int4-g64", 4, 64)])
def test_linear_bits_per_weight_is_what_quantize_model_stores_in_its_linears(scheme, bits, G):
    model = small_model()
    q = quantize_model(model, scheme)
    layers = [m for m in q.modules() if isinstance(m, QuantLinear)]
    stored = sum(model_bytes(m) for m in layers)
    weights = sum(m.in_features * m.out_features for m in layers)
    assert linear_bits_per_weight(model, bits, G, zero_point=bits == 4) == \
        pytest.approx(8 * stored / weights, rel=1e-12)


def test_linear_bits_per_weight_equals_the_copies_it_replaced():
    model = small_model(n_layers=3, hidden_dim=192)
    names = [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and n != "lm_head"]
    shapes = [model.get_submodule(n).weight.shape for n in names]

    def notebook(bits, G=None, zero_point=True, scale_bits=16):        # lab 04's `linear_bits`
        total = stored = 0
        for N, K in shapes:
            total += N * K
            stored += N * K * (bits + scale_bits * (2 if zero_point else 1)
                               / (K if G is None else G))
        return stored / total

    def slides(b, G=None, zp=True):                                    # quant_pareto's `bits`
        return sum(N * K * (b + 16 * (1 + zp) / (K if G is None else G))
                   for N, K in shapes) / sum(N * K for N, K in shapes)

    for bits, G, zp in [(8, None, False), (8, None, True), (4, None, True), (4, 32, True),
                        (4, 64, True), (3, 64, True), (2, 64, True)]:
        got = linear_bits_per_weight(model, bits, G, zero_point=zp)
        assert got == notebook(bits, G, zp) == slides(bits, G, zp), (bits, G, zp)


# ---- fake_quantize -----------------------------------------------------------------------------
def test_fake_quantize_by_hand():
    # 2 bits, groups of 4: [0, 0.7, 2.9, 3] has s = 1, z = 0 -> 0, 1, 3, 3;
    # [-1, 0.4, 1.2, 2] has s = 1, z = 1 -> codes 0, 1, 2, 3 -> -1, 0, 1, 2
    w = torch.tensor([[0.0, 0.7, 2.9, 3.0, -1.0, 0.4, 1.2, 2.0]])
    assert fake_quantize(w, 2, 4).tolist() == [[0.0, 1.0, 3.0, 3.0, -1.0, 0.0, 1.0, 2.0]]
    # 8 bits per row: s = 2.5 / 255, z = 51, codes 0, 51, 82, 255
    got = fake_quantize(torch.tensor([[-0.5, 0.0, 0.3, 2.0]]), 8)
    torch.testing.assert_close(got, torch.tensor([[-51.0, 0.0, 31.0, 204.0]]) * (2.5 / 255))
    assert got[0, 1].item() == 0.0                                   # zero stays exact


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("G", [None, 16, 64])
def test_fake_quantize_equals_the_copies_it_replaced(bits, G):
    w = torch.randn(24, 128, generator=torch.Generator().manual_seed(bits)) * 0.1
    N, K = w.shape
    g = K if G is None else G
    q, s, z = zeropoint_quantize(w.reshape(N, K // g, g), bits)           # lab 04's `groups`
    notebook = dequantize(q, s, z).reshape(N, K)
    slides = dequantize(*group_quantize(w, g, bits), g)                   # the slides' `lowbit`
    assert torch.equal(fake_quantize(w, bits, G), notebook)
    assert torch.equal(fake_quantize(w, bits, G), slides)
    step = s.reshape(N, -1).repeat_interleave(g, dim=1)                   # s of each weight
    assert ((fake_quantize(w, bits, G) - w).abs() <= step / 2 + 1e-7).all()


def test_fake_quantize_model_replaces_every_linear_but_lm_head():
    model = small_model()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    fake = fake_quantize_model(model, lambda w: fake_quantize(w, 3, 32))
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]), f"the original model changed: {n}"
    for n, m in model.named_modules():
        if isinstance(m, nn.Linear):
            got = fake.get_submodule(n).weight
            want = m.weight if n == "lm_head" else fake_quantize(m.weight.detach(), 3, 32)
            assert torch.equal(got, want), n
    x = torch.randint(0, 97, (1, 8))
    with torch.no_grad():
        assert not torch.equal(fake(x), model(x))
