"""Weight quantization schemes, QuantLinear, LLM.int8() and AWQ (lab 04's library)."""
import warnings

import pytest
import torch
import torch.nn as nn

import minillm
from kernels import cpu_weight_only
from minillm import quant
from minillm.config import ModelConfig
from minillm.model import Transformer
from minillm.quant import (
    Int8MixedLinear,
    QuantLinear,
    absmax_quantize,
    awq_search,
    dequantize,
    format_table,
    group_quantize,
    group_quantize_int4,
    linear_inputs,
    model_bytes,
    pack_int4,
    quantize_model,
    unpack_int4,
    zeropoint_quantize,
)


def rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_absmax_error_is_at_most_half_a_step():
    w = rand(16, 64)
    q, s = absmax_quantize(w, 8, per_channel=True)
    assert q.dtype == torch.int8 and s.shape == (16, 1)
    assert ((q.float() * s - w).abs() <= s / 2 + 1e-7).all()
    assert (q.abs().amax(dim=1) == 127).all()                 # the largest weight hits 127


def test_per_channel_beats_per_tensor_when_rows_differ():
    w = rand(8, 64) * torch.logspace(-3, 0, 8)[:, None]      # rows of very different scale
    # relative error of the smallest row: per tensor, its weights all round to zero
    def err(q, s):
        return ((q.float() * s - w)[0].norm() / w[0].norm()).item()
    assert err(*absmax_quantize(w, 8, False)) > 0.5 > 0.01 > err(*absmax_quantize(w, 8, True))


def test_zero_point_uses_all_codes_for_one_sided_weights():
    w = rand(4, 256).abs() + 0.5                               # all positive
    q, s, z = zeropoint_quantize(w, 8)
    assert q.dtype == torch.uint8 and int(q.max()) == 255
    sym_q, sym_s = absmax_quantize(w, 8)
    assert (dequantize(q, s, z) - w).abs().max() < (sym_q.float() * sym_s - w).abs().max()


@pytest.mark.parametrize("group", [32, 64, 128])
def test_int4_groups_round_trip_within_half_a_step(group):
    w = rand(6, 256, seed=group)
    codes, s, z = group_quantize_int4(w, group)
    assert codes.shape == (6, 256) and s.shape == (6, 256 // group) and int(codes.max()) <= 15
    err = (dequantize(codes, s, z, group) - w).abs().reshape(6, -1, group)
    assert (err <= s[..., None] / 2 + 1e-6).all()


def test_pack_int4_layout_and_round_trip():
    codes = torch.tensor([[1, 2, 15, 0]], dtype=torch.uint8)
    assert pack_int4(codes).tolist() == [[0x21, 0x0F]]         # low nibble = even column
    c = torch.randint(0, 16, (5, 64), dtype=torch.uint8)
    assert torch.equal(unpack_int4(pack_int4(c)), c)
    with pytest.raises(ValueError, match="even"):
        pack_int4(c[:, :3])
    with pytest.raises(ValueError, match="0..15"):
        pack_int4(c + 16)


# [out, in] of every product the shipped target runs: q/k/v/o, gate/up/down, and the packed
# decoders' q+k+v and gate+up
SHIPPED_SHAPES = [(384, 384), (1024, 384), (384, 1024), (1152, 384), (2048, 384)]


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("shape", SHIPPED_SHAPES)
def test_quant_linear_runs_torchs_cpu_kernel_within_the_bf16_bound(bits, shape):
    N, K = shape
    lin = nn.Linear(K, N, bias=True)
    q = QuantLinear.from_linear(lin, bits, group_size=64)
    x = rand(3, 5, K)
    w = q.dequantized_weight()
    with warnings.catch_warnings():
        warnings.simplefilter("error")              # no fallback on these shapes
        got = q(x)
    ref = x @ w.T + lin.bias
    bound = cpu_weight_only.BF16_ERROR * (x.abs() @ w.abs().T + lin.bias.abs())
    assert got.dtype == x.dtype and bool(((got - ref).abs() <= bound).all()), \
        float(((got - ref).abs() / bound).max())
    assert (got - ref).abs().max() > 0               # bf16 activations: the kernel ran
    rel = (w - lin.weight).norm() / lin.weight.norm()
    assert rel < (0.01 if bits == 8 else 0.15)
    assert q.qweight.dtype == (torch.int8 if bits == 8 else torch.uint8)
    assert q.qweight.numel() == N * K // (1 if bits == 8 else 2)


def test_quant_linear_int4_repacks_when_its_codes_change():
    q = QuantLinear.from_linear(nn.Linear(128, 32, bias=False), 4, group_size=64)
    x = rand(2, 128)
    before = q(x)
    q.qweight.copy_(pack_int4(torch.randint(0, 16, (32, 128), dtype=torch.uint8)))
    after = q(x)
    bound = cpu_weight_only.BF16_ERROR * (x.abs() @ q.dequantized_weight().abs().T)
    assert not torch.allclose(before, after)
    assert bool(((after - x @ q.dequantized_weight().T).abs() <= bound).all())


def test_quant_linear_falls_back_exactly_where_the_int4_kernel_cannot_run():
    lin = nn.Linear(128, 40, bias=True)                 # 40 outputs: not a multiple of 16
    q = QuantLinear.from_linear(lin, 4, group_size=32)
    x = rand(3, 5, 128)
    quant._SAID.clear()
    with pytest.warns(UserWarning, match="multiple of 16"):
        got = q(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")                  # said once
        q(x)
    torch.testing.assert_close(got, x @ q.dequantized_weight().T + lin.bias, atol=1e-4,
                               rtol=1e-4)


def test_quant_linear_builds_and_reads_its_codes_with_the_given_formats(tiny):
    """formats=: the functions that quantize, pack and unpack QuantLinear's codes (lab 04 passes
    its student's; its grading kernel withholds the course's), in every layer quantize_model
    makes and QuantLinear.cat merges. A layout with the nibbles swapped proves it: other
    bytes, the same layer."""
    calls = []

    def swapped_pack(codes):
        c = codes.to(torch.uint8)
        return (c[:, 0::2] << 4) | c[:, 1::2]

    def swapped_unpack(packed):
        return torch.stack([packed >> 4, packed & 0x0F], dim=-1).reshape(packed.shape[0], -1)

    def logged(name, fn):
        return lambda *args: calls.append(name) or fn(*args)

    swapped = quant.Formats(logged("absmax", absmax_quantize),
                            logged("groups", group_quantize_int4), swapped_pack, swapped_unpack,
                            logged("dequantize", dequantize))
    lin, x = nn.Linear(128, 32, bias=False), rand(3, 128)
    ours, theirs = (QuantLinear.from_linear(lin, 4, 64, formats=f) for f in (None, swapped))
    assert not torch.equal(ours.qweight, theirs.qweight)
    assert torch.equal(swapped_unpack(theirs.qweight), unpack_int4(ours.qweight))
    torch.testing.assert_close(theirs(x), ours(x))          # torch's kernel got the same codes
    torch.testing.assert_close(theirs.dequantized_weight(), ours.dequantized_weight())
    merged = QuantLinear.cat([theirs, theirs])
    assert merged.formats is swapped
    torch.testing.assert_close(merged(x), torch.cat([ours(x), ours(x)], dim=-1))
    assert calls == ["groups", "dequantize"]
    for scheme in ("int8", "int4-g64"):
        q = quantize_model(tiny, scheme, formats=swapped)
        layers = [m for m in q.modules() if isinstance(m, QuantLinear)]
        assert layers and all(m.formats is swapped for m in layers)
    assert calls.count("absmax") == calls.count("groups") - 1 == len(layers)


def test_quant_linear_errors():
    with pytest.raises(ValueError, match="8 or 4 bits"):
        QuantLinear(64, 8, bits=3)
    with pytest.raises(ValueError, match="group size"):
        QuantLinear(100, 8, bits=4, group_size=64)
    with pytest.raises(ValueError, match="NaN"):
        absmax_quantize(torch.tensor([[1.0, float("nan")]]))


def test_llm_int8_keeps_outlier_features_exact():
    torch.manual_seed(0)
    lin = nn.Linear(64, 16, bias=False)
    x = rand(10, 64) * 0.5
    x[:, 7] = 40.0                                   # one huge feature, as in large LLMs
    mixed = Int8MixedLinear(lin, threshold=6.0)
    y, ref = mixed(x), lin(x)
    assert mixed.outlier_counts[7] == 1 and mixed.outlier_counts.sum() == 1
    # without the decomposition the 40.0 sets every row's int8 scale and the rest is crushed
    no_split = Int8MixedLinear(lin, threshold=1e9)
    assert (y - ref).abs().max() < (no_split(x) - ref).abs().max() / 5


def test_awq_search_never_worse_than_rtn():
    lin = nn.Linear(128, 64, bias=False)
    x = rand(200, 128) * torch.logspace(-1, 1, 128)            # some channels see large inputs
    s, alpha, errors = awq_search(lin, x, group_size=64, grid=10)
    assert errors[0] >= min(errors) and alpha > 0 and errors[int(alpha * 10)] == min(errors)


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return Transformer(ModelConfig(vocab_size=64, dim=64, n_layers=2, n_heads=4, hidden_dim=128,
                                   max_seq_len=32)).eval()


@pytest.mark.parametrize("scheme", ["int8", "int8-tensor", "int8-zp", "int4-g32", "int4-awq",
                                    "llm.int8"])
def test_quantize_model_stays_close_and_does_not_mutate(tiny, scheme):
    before = {k: v.clone() for k, v in tiny.state_dict().items()}
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    q = quantize_model(tiny, scheme, calib_ids=ids)
    with torch.no_grad():
        a, b = tiny(ids), q(ids)
    assert (a - b).abs().max() < 0.1 * a.abs().max()
    assert all(torch.equal(before[k], v) for k, v in tiny.state_dict().items())
    assert isinstance(q.lm_head, nn.Linear)                        # lm_head kept in float
    assert not any(isinstance(m, nn.Linear) for n, m in q.named_modules() if "layers" in n)


def test_model_bytes_shrink_as_expected(tiny):
    base = model_bytes(tiny)
    assert base == 2 * sum(p.numel() for p in tiny.parameters())
    lin = sum(m.weight.numel() for n, m in tiny.named_modules()
              if isinstance(m, nn.Linear) and n != "lm_head")
    w8 = model_bytes(quantize_model(tiny, "int8"))
    assert base - w8 == pytest.approx(lin * 1, rel=0.05)           # 2 -> 1 byte per weight
    w4 = model_bytes(quantize_model(tiny, "int4-g64"))
    assert base - w4 == pytest.approx(lin * 1.5 - lin / 64 * 4, rel=0.02)


def test_unknown_scheme_and_missing_calibration(tiny):
    with pytest.raises(ValueError, match="unknown quantization scheme"):
        quantize_model(tiny, "int5")
    with pytest.raises(ValueError, match="calibration"):
        quantize_model(tiny, "int4-awq")


def test_format_table_reads_torch():
    rows = {r["format"]: r for r in format_table()}
    assert rows["bf16"]["max"] == pytest.approx(3.39e38, rel=0.01)
    assert rows["fp8 e4m3"]["max"] == 448.0 and rows["int4"]["bytes"] == 0.5


def test_awq_error_is_the_direct_output_error_and_inputs_are_checked():
    lin = nn.Linear(64, 24, bias=False)
    x = rand(50, 64, seed=3) * torch.logspace(-1, 1, 64)
    s, alpha, errors = awq_search(lin, x, group_size=32, grid=4)
    for i, err in enumerate(errors):                 # the Gram-matrix shortcut changes nothing
        a = (x.abs().mean(0) ** (i / 4))
        a = a / (a.max() * a.min()).sqrt()
        wq = dequantize(*group_quantize_int4(lin.weight.detach() * a, 32), 32) / a
        direct = ((x @ wq.T - x @ lin.weight.detach().T) ** 2).mean().item()
        assert err == pytest.approx(direct, rel=1e-4)
    with pytest.raises(ValueError, match="calibration inputs"):
        awq_search(lin, rand(10, 32), group_size=32)
    with pytest.raises(ValueError, match="grid"):
        awq_search(lin, x, group_size=32, grid=0)


@pytest.mark.parametrize("bits", [1, 2, 3, 4, 8])
def test_group_quantize_any_bits(bits):
    w = rand(5, 128, seed=bits)
    codes, s, z = group_quantize(w, 32, bits)
    assert int(codes.max()) <= 2 ** bits - 1 and s.shape == (5, 4)
    err = (dequantize(codes, s, z, 32) - w).abs().reshape(5, 4, 32)
    assert (err <= s[..., None] / 2 + 1e-6).all()
    if bits == 4:
        assert all(torch.equal(a, b) for a, b in zip((codes, s, z), group_quantize_int4(w, 32)))
    with pytest.raises(ValueError, match="1..8"):
        zeropoint_quantize(w, bits=9)


@pytest.mark.slow
def test_shipped_model_int8_and_awq_on_held_out_text(one_thread):
    """On the shipped target: int8 costs < 0.5% perplexity; AWQ beats plain int4 RTN with the same
    groups of 64.

    Which yardstick: the perplexity gap between int4 variants of this model is below the noise
    of any affordable held-out subset (on 2048-token chunks RTN and AWQ trade places), and AWQ's
    perplexity win shows on the full split only (`minillm eval ppl --quant int4-g64` 45.63 vs
    `--quant int4-awq` 45.56, fp 45.55, 79,111 tokens). The KL divergence from the float model
    has no first-order noise term, so it ranks them with far less noise: on 4096 held-out tokens
    AWQ's is 4 % lower, and AWQ lowers the held-out output error of 38 of the 42 layers."""
    import torch.nn.functional as F

    from minillm.data import load_text, load_tokens
    from minillm.evaluate import perplexity
    m, tok = minillm.load("target").float(), minillm.load_tokenizer("target")
    calib = torch.tensor(tok.encode(load_text("train")[:20000]))[:4 * 256].reshape(4, 256)
    assert perplexity(quantize_model(m, "int8"), tok, "val", max_tokens=4096)["ppl"] < \
        perplexity(m, tok, "val", max_tokens=4096)["ppl"] * 1.005
    rtn, awq = quantize_model(m, "int4-g64"), quantize_model(m, "int4-awq", calib_ids=calib)
    val = load_tokens(tok, "val")[:4096].reshape(8, 512)
    with torch.no_grad():
        ref = m(val).log_softmax(-1)
        kl = {name: F.kl_div(q(val).log_softmax(-1), ref, log_target=True,
                             reduction="sum").item() / val.numel()
              for name, q in (("rtn", rtn), ("awq", awq))}
    assert kl["awq"] < kl["rtn"], kl          # measured: 0.00222 vs 0.00231 nats per token
    names = [n for n, mod in awq.named_modules() if isinstance(mod, QuantLinear)]
    xs = linear_inputs(m, val[:1], names)
    better = sum(((awq.get_submodule(n)(xs[n]) - m.get_submodule(n)(xs[n])).norm()
                  < (rtn.get_submodule(n)(xs[n]) - m.get_submodule(n)(xs[n])).norm()).item()
                 for n in names)
    assert better >= 0.75 * len(names), f"AWQ lowers the error of {better} of {len(names)} layers"
