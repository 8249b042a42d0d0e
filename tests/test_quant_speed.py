"""Quantized decode: the compiled step over int8 / int4 weights (minillm.decode.compiled), what
it reads (minillm.bench.bandwidth.step_bytes) and `bench quant` (minillm.bench.quant, the CLI)."""
import pytest
import torch

from kernels import cpu_weight_only
from minillm.bench.bandwidth import step_bytes
from minillm.bench.quant import FORMATS, bench_quant, first_divergence, model_formats
from minillm.bench.timing import cpu_time_interleaved, ratio
from minillm.config import ModelConfig
from minillm.decode import PackedDecoder, generate_packed
from minillm.decode.compiled import (
    INDUCTOR_OPTIONS,
    CompiledDecoder,
    Int8Rows,
    gemv,
    inductor_vectorizes_int8,
    step_matrix,
)
from minillm.kvcache import KVCache
from minillm.model import Transformer
from minillm.quant import QuantLinear, quantize_model


def tiny():
    # every product fits torch's int4 CPU kernel: N a multiple of 16, K a multiple of 64
    torch.manual_seed(0)
    return Transformer(ModelConfig(vocab_size=96, dim=64, n_layers=2, n_heads=4, n_kv_heads=2,
                                   hidden_dim=128, max_seq_len=64)).eval()


@pytest.mark.parametrize("scheme", [pytest.param("int8", marks=pytest.mark.slow),  # 23 s compile
                                    "int4-g64"])
def test_compiled_step_on_quantized_weights_matches_the_quantized_model(scheme):
    m = quantize_model(tiny().to(torch.bfloat16), scheme)
    dec = CompiledDecoder(m)
    kind = Int8Rows if scheme == "int8" else cpu_weight_only.W4Packed
    assert all(isinstance(w[k], kind) for w in dec.layers for k in ("qkv", "o", "gu", "down"))
    prompt = torch.randint(0, 96, (1, 6), generator=torch.Generator().manual_seed(1))
    cache = KVCache.for_model(m, 1, 8)
    with torch.no_grad():
        m(prompt, cache=cache)
        got = dec.step(prompt[0, -1:], cache)
        ref = m(torch.cat([prompt, prompt[:, -1:]], 1))[:, -1].float()
    # both read the same codes; activations differ only by bf16 rounding (the model runs bf16)
    assert (got - ref).abs().max() <= 0.05 * ref.abs().max(), (got - ref).abs().max()
    assert got.argmax() == ref.argmax()
    assert len(generate_packed(m, prompt, 12, dec)[0]) == 12


def test_step_bytes_counts_codes_scales_and_zeros():
    m = tiny().to(torch.bfloat16)
    c = m.config
    for scheme, per_weight, per_row_group in (("int8", 1, None), ("int4-g64", 0.5, 64)):
        q = quantize_model(m, scheme)
        linears = [mod for mod in q.modules() if isinstance(mod, QuantLinear)]
        weights = sum(mod.in_features * mod.out_features for mod in linears)
        floats = 2 * (c.vocab_size * c.dim + (2 * c.n_layers + 1) * c.dim)   # lm_head, norms
        if per_row_group is None:     # int8: one scale per output row, fp32 or bf16 by path
            extra = (4 if inductor_vectorizes_int8() else 2) * sum(mod.out_features
                                                                   for mod in linears)
        else:                                         # int4: bf16 scale and zero per group
            extra = 2 * 2 * weights // per_row_group
        r = step_bytes(CompiledDecoder(q), context_len=0)
        assert r["weight_bytes"] == weights * per_weight + extra + floats, scheme
        # the eager packed decoder holds QuantLinear modules: their buffers (fp32 scales/zeros)
        assert step_bytes(PackedDecoder(q, layout="out_in"), 0)["weight_bytes"] > 0


def test_compiled_and_packed_decoders_refuse_what_they_cannot_run():
    m = tiny()
    awq = quantize_model(m, "int4-awq", calib_ids=torch.randint(0, 96, (2, 16)))
    with pytest.raises(ValueError, match="AWQ"):
        PackedDecoder(awq, layout="out_in")
    with pytest.raises(ValueError, match="out_in"):
        PackedDecoder(quantize_model(m, "int8"))
    with pytest.raises(ValueError, match="QuantLinear"):
        QuantLinear.cat([QuantLinear(64, 16, 8), QuantLinear(64, 16, 4)])
    with pytest.raises(ValueError, match="int4 CPU kernel"):
        CompiledDecoder(_with_rows(quantize_model(m, "int4-g64"), 40))


def _with_rows(q, rows):
    """q with its first layer's q_proj cut to `rows` outputs (not a multiple of 16)."""
    lin = q.layers[0].self_attn.q_proj
    cut = QuantLinear(lin.in_features, rows, 4, 64)
    for name in ("qweight", "scales", "zeros"):
        getattr(cut, name).copy_(getattr(lin, name)[:rows])
    q.layers[0].self_attn.q_proj = cut
    return q


@pytest.mark.slow
def test_the_int8_product_the_step_picks_is_the_faster_one_here():
    """`gemv` multiplies int8 rows with Inductor's loop where it vectorises (AVX-512) and with
    torch's int8 kernel elsewhere (on an AVX2 CPU the loop ran about 4x slower). Both, compiled as
    the step compiles them, on a 1024 x 2048 matrix, interleaved, medians of CPU time: the one
    step_matrix picks must not be the slow one."""
    torch.manual_seed(0)
    codes = torch.randint(-127, 128, (1024, 2048), dtype=torch.int8)
    scales = torch.rand(1024) + 0.5
    x = torch.randn(2048)
    rows = {"loop": Int8Rows.of(codes, scales, False), "kernel": Int8Rows.of(codes, scales, True)}
    f = torch.compile(lambda x, w: gemv(x, w), options=INDUCTOR_OPTIONS)
    with torch.no_grad():
        want = (codes.float() * x).sum(-1) * scales
        for name, w in rows.items():
            got = f(x, w)
            assert (got - want).abs().max() <= 0.02 * want.abs().max(), name
        times = cpu_time_interleaved({name: lambda w=w: [f(x, w) for _ in range(10)]
                                      for name, w in rows.items()}, warmup=1, repeats=9)
    q = QuantLinear.from_linear(torch.nn.Linear(2048, 1024, bias=False), 8)
    picked = "kernel" if step_matrix(q).torch_kernel else "loop"
    assert picked == ("loop" if inductor_vectorizes_int8() else "kernel")
    other = "loop" if picked == "kernel" else "kernel"
    assert ratio(times[other], times[picked]) >= 1 / 1.5, (picked, times)    # not 1.5x slower


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2


@pytest.mark.slow
def test_bench_quant_reports_every_format():
    # the report, on the packed steps: on a cold Inductor cache compiling four formats takes
    # most of a minute. What compiled=True changes is the decoder: each format's compiled step, and the
    # bytes step_bytes counts from it, are checked above (fp32 and bf16: test_bandwidth.py)
    m = tiny()
    r = bench_quant(m, list(range(1, 9)), new_tokens=6, repeats=1, compiled=False)
    assert r["step"] == "packed"
    assert set(r["model_bytes"]) == set(FORMATS) == set(r["bytes_per_token"])
    b = r["model_bytes"]
    assert b["fp32"] == 2 * b["bf16"] > b["bf16"] > b["int8"] > b["int4"]
    per = r["bytes_per_token"]
    assert per["fp32"] > per["bf16"] > per["int8"] > per["int4"]
    for n in FORMATS:
        assert r[f"{n}_tok_s"] > 0
        assert r["bandwidth_fraction"][n] == pytest.approx(r[f"{n}_tok_s"] / r["limit_tok_s"][n])
        assert r["limit_tok_s"][n] == pytest.approx(r["read_gb_s"] * 1e9 / per[n])
    for n in FORMATS[1:]:
        assert r[f"{n}_vs_fp32"] == pytest.approx(r[f"{n}_tok_s"] / r["fp32_tok_s"])
        t = r["tokens_match"][n]
        assert t["matches_fp32"] == (t["first_divergence"] is None)
        assert 0 <= t["top1_agreement"] <= 1
    assert r["goals"]["int8_vs_fp32"] == {"at_least": 1.5, "met": r["int8_vs_fp32"] >= 1.5}
    formats = model_formats(m)
    assert next(m.parameters()).dtype == torch.float32          # left unchanged
    assert formats["int4"].layers[0].mlp.up_proj.bits == 4
    with pytest.raises(ValueError, match="new_tokens"):
        bench_quant(m, [1, 2], new_tokens=1)
    with pytest.raises(ValueError, match="context"):
        bench_quant(m, [1] * 60, new_tokens=10)
