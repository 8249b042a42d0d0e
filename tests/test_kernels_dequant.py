"""Fused dequantize-matmul kernels (kernels/dequant_matmul.py) against their torch references
(kernels/dequant_ref.py) and against an explicit float32 matmul built here from the raw codes.

Without a GPU the kernels run in Triton's CPU interpreter, so shapes are small but deliberately
awkward: N and K not multiples of the blocks, odd M, several groups, partial group steps.
"""
import os

import torch

if not torch.cuda.is_available():  # must precede the @triton.jit definitions (kernels/ does too)
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

pytest.importorskip("triton")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from kernels import dequant_matmul as dm  # noqa: E402
from kernels import (  # noqa: E402
    pack_int4,
    quantize_w4,
    quantize_w8,
    unpack_int4,
    w4a16_matmul,
    w4a16_matmul_ref,
    w8a16_matmul,
    w8a16_matmul_ref,
)

DEV = "cuda" if torch.cuda.is_available() else "cpu"
# max |y - oracle| allowed, relative to max |oracle|: output rounding (1 ulp) dominates
TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


# ---- an oracle that shares no code with the kernels or the references ---------------------------
def make_w8(N, K, gen):
    codes = torch.randint(-128, 128, (N, K), generator=gen, dtype=torch.int16).to(torch.int8)
    scales = torch.rand(N, generator=gen) * 0.02 + 0.001
    return codes, scales


def make_w4(N, K, G, gen):
    codes = torch.randint(0, 16, (N, K), generator=gen, dtype=torch.uint8)
    scales = torch.rand(N, K // G, generator=gen) * 0.1 + 0.01
    zeros = torch.rand(N, K // G, generator=gen) * 15  # any float; symmetric int4 would be 8
    return codes, scales, zeros


def oracle_w8(x, codes, scales, bias):
    W = codes.double() * scales.double()[:, None]
    y = x.double() @ W.T
    return y if bias is None else y + bias.double()


def oracle_w4(x, codes, scales, zeros, G, bias):
    s = scales.double().repeat_interleave(G, dim=1)   # [N, K]: scale of column k is s[:, k // G]
    z = zeros.double().repeat_interleave(G, dim=1)
    W = (codes.double() - z) * s
    y = x.double() @ W.T
    return y if bias is None else y + bias.double()


def pack_by_hand(codes):
    """The format spelt out: byte j of a row = code 2j in the low nibble, code 2j+1 in the high."""
    out = torch.zeros(codes.shape[0], codes.shape[1] // 2, dtype=torch.uint8)
    for j in range(codes.shape[1] // 2):
        out[:, j] = codes[:, 2 * j] + 16 * codes[:, 2 * j + 1]
    return out


def assert_close(y, want, dtype, what=""):
    assert y.dtype == dtype, f"{what}: output dtype {y.dtype}, expected {dtype}"
    assert y.shape == want.shape, f"{what}: shape {tuple(y.shape)} != {tuple(want.shape)}"
    assert torch.isfinite(y).all(), f"{what}: non-finite output"
    y, want = y.double().cpu(), want.double().cpu()
    err = (y - want).abs().max().item() / max(want.abs().max().item(), 1e-6)
    assert err <= TOL[dtype], f"{what}: relative error {err:.2e} > {TOL[dtype]:.0e}"


def inputs(shape, dtype, gen):
    return torch.randn(*shape, generator=gen).to(dtype)


def to_dev(*ts):
    return [None if t is None else t.to(DEV) for t in ts]


# ---- w4a16 -------------------------------------------------------------------------------------
W4_CASES = [  # (x shape, N, K, G, dtype, bias): FMA path for M <= 4, dot path above
    ((1, 256), 100, 256, 32, torch.float32, True),
    ((3, 384), 257, 384, 128, torch.bfloat16, False),   # 3 groups, step of 2 -> partial step
    ((17, 512), 100, 512, 64, torch.float16, True),     # dot path, 64-row M tile
    ((2, 192), 33, 192, 64, torch.bfloat16, True),      # 3 groups of 64, step of 4
    ((8, 256), 257, 256, 32, torch.bfloat16, False),    # dot path, 16-row M tile, 8 valid
    ((5, 128), 64, 128, 16, torch.float32, True),       # G = 16: FMA path, two M tiles
    ((2, 3, 320), 70, 320, 32, torch.float16, True),    # leading batch dims, 10 groups
    ((320,), 70, 320, 64, torch.float32, False),        # 1-D x
]


@pytest.mark.parametrize("shape,N,K,G,dtype,has_bias", W4_CASES)
def test_w4a16_matches_oracle_and_reference(shape, N, K, G, dtype, has_bias):
    gen = torch.Generator().manual_seed(hash((shape, N, K, G)) % 2**31)
    codes, scales, zeros = make_w4(N, K, G, gen)
    x = inputs(shape, dtype, gen)
    bias = torch.randn(N, generator=gen).to(dtype) if has_bias else None
    want = oracle_w4(x, codes, scales, zeros, G, bias).reshape(*shape[:-1], N)
    qweight = pack_int4(codes)
    x, qweight, scales, zeros, bias = to_dev(x, qweight, scales, zeros, bias)
    y = w4a16_matmul(x, qweight, scales, zeros, G, bias)
    y_ref = w4a16_matmul_ref(x, qweight, scales, zeros, G, bias)
    assert_close(y_ref, want, dtype, "reference vs oracle")
    assert_close(y, want, dtype, "triton vs oracle")
    assert_close(y, y_ref.double(), dtype, "triton vs reference")


@pytest.mark.parametrize("M", [1, 17])
@pytest.mark.parametrize("use_dot", [False, True])
def test_w4a16_both_paths_any_m(M, use_dot):
    """Force each inner loop (FMA / tl.dot) on a batch it would not be picked for."""
    N, K, G = 50, 192, 32
    gen = torch.Generator().manual_seed(M + 2 * use_dot)
    codes, scales, zeros = make_w4(N, K, G, gen)
    x = inputs((M, K), torch.float32, gen)
    want = oracle_w4(x, codes, scales, zeros, G, None)
    cfg = dm.Config(True, 16, 16, G) if use_dot else dm.Config(False, 4, 16, 128)
    x, qweight, scales, zeros = to_dev(x, pack_int4(codes), scales, zeros)
    out = torch.empty(M, N, device=DEV)
    dm._launch_w4(x, qweight, scales, zeros, G, None, out, cfg)
    assert_close(out, want, torch.float32, f"use_dot={use_dot}")


def test_w4a16_swapped_nibbles_are_caught():
    """The comparison is sharp enough to see a plausible bug: high/low nibble swapped."""
    N, K, G = 40, 128, 32
    gen = torch.Generator().manual_seed(7)
    codes, scales, zeros = make_w4(N, K, G, gen)
    x = inputs((2, K), torch.bfloat16, gen)
    want = oracle_w4(x, codes, scales, zeros, G, None)
    good = pack_int4(codes)
    swapped = (good >> 4) | ((good & 0x0F) << 4)
    x, good, swapped, scales, zeros = to_dev(x, good, swapped, scales, zeros)
    assert_close(w4a16_matmul(x, good, scales, zeros, G), want, torch.bfloat16, "correct")
    with pytest.raises(AssertionError, match="relative error"):
        assert_close(w4a16_matmul(x, swapped, scales, zeros, G), want, torch.bfloat16, "bug")


# ---- w8a16 -------------------------------------------------------------------------------------
W8_CASES = [  # (x shape, N, K, dtype, bias)
    ((1, 200), 100, 200, torch.float32, True),    # K not a multiple of BLOCK_K = 128
    ((3, 96), 257, 96, torch.bfloat16, False),
    ((17, 130), 100, 130, torch.float16, True),   # dot path, K not a multiple of 64
    ((8, 64), 33, 64, torch.bfloat16, True),
    ((2, 2, 72), 20, 72, torch.float16, False),
    ((72,), 20, 72, torch.bfloat16, True),
]


@pytest.mark.parametrize("shape,N,K,dtype,has_bias", W8_CASES)
def test_w8a16_matches_oracle_and_reference(shape, N, K, dtype, has_bias):
    gen = torch.Generator().manual_seed(hash((shape, N, K)) % 2**31)
    codes, scales = make_w8(N, K, gen)
    x = inputs(shape, dtype, gen)
    bias = torch.randn(N, generator=gen).to(dtype) if has_bias else None
    want = oracle_w8(x, codes, scales, bias).reshape(*shape[:-1], N)
    x, codes, scales, bias = to_dev(x, codes, scales, bias)
    y = w8a16_matmul(x, codes, scales, bias)
    y_ref = w8a16_matmul_ref(x, codes, scales, bias)
    assert_close(y_ref, want, dtype, "reference vs oracle")
    assert_close(y, want, dtype, "triton vs oracle")
    assert_close(y, y_ref.double(), dtype, "triton vs reference")


@pytest.mark.parametrize("M,use_dot", [(1, True), (17, False)])
def test_w8a16_both_paths_any_m(M, use_dot):
    N, K = 45, 100
    gen = torch.Generator().manual_seed(M)
    codes, scales = make_w8(N, K, gen)
    x = inputs((M, K), torch.float32, gen)
    want = oracle_w8(x, codes, scales, None)
    cfg = dm.Config(True, 16, 16, 32) if use_dot else dm.Config(False, 4, 16, 64)
    x, codes, scales = to_dev(x, codes, scales)
    out = torch.empty(M, N, device=DEV)
    dm._launch_w8(x, codes, scales, None, out, cfg)
    assert_close(out, want, torch.float32, f"use_dot={use_dot}")


# ---- boundaries: nothing outside the tensors is read or written -------------------------------
def poisoned_view(shape, fill, dtype, data, pad=5):
    """`data` placed in a corner of a bigger tensor (`pad` more along each axis) whose other
    elements are `fill`: a strided view whose out-of-bounds neighbours poison any output they
    leak into."""
    big = torch.full([s + pad for s in shape], fill, dtype=dtype, device=DEV)
    view = big[tuple(slice(0, s) for s in shape)]
    view.copy_(data)
    return view


@pytest.mark.parametrize("M,pad", [(3, 5), (17, 5), (8, 6), (17, 6)])
def test_w4a16_reads_only_inside_its_tensors(M, pad):
    """Every input a view inside a poisoned buffer. pad 5: rows of an odd number of bytes,
    which the dot kernel cannot read as half-words (the FMA path takes them); pad 6: the dot
    kernel itself (M = 8 on 16-row tiles, M = 17 on 64-row tiles)."""
    N, K, G = 37, 192, 64
    gen = torch.Generator().manual_seed(11)
    codes, scales, zeros = make_w4(N, K, G, gen)
    x = inputs((M, K), torch.float16, gen)
    bias = torch.randn(N, generator=gen)
    want = oracle_w4(x, codes, scales, zeros, G, bias)
    nan = float("nan")
    xv = poisoned_view((M, K), nan, torch.float16, x)
    qv = poisoned_view((N, K // 2), 0xFF, torch.uint8, pack_int4(codes), pad)
    assert dm.halfwords_ok(qv) == (pad % 2 == 0)
    sv = poisoned_view((N, K // G), nan, torch.float32, scales)
    zv = poisoned_view((N, K // G), 1e30, torch.float32, zeros)
    bv = poisoned_view((N,), nan, torch.float32, bias)
    assert not xv.is_contiguous() and not qv.is_contiguous()
    assert_close(w4a16_matmul(xv, qv, sv, zv, G, bv), want, torch.float16, "poisoned w4")


@pytest.mark.parametrize("M", [3, 17])
def test_w8a16_reads_only_inside_its_tensors(M):
    N, K = 37, 150
    gen = torch.Generator().manual_seed(12)
    codes, scales = make_w8(N, K, gen)
    x = inputs((M, K), torch.bfloat16, gen)
    want = oracle_w8(x, codes, scales, None)
    xv = poisoned_view((M, K), float("nan"), torch.bfloat16, x)
    qv = poisoned_view((N, K), 127, torch.int8, codes)
    sv = poisoned_view((N,), float("nan"), torch.float32, scales)
    assert_close(w8a16_matmul(xv, qv, sv), want, torch.bfloat16, "poisoned w8")


@pytest.mark.parametrize("kind,M", [("w4", 3), ("w4", 17), ("w8", 3), ("w8", 17)])
def test_kernels_write_only_inside_the_output(kind, M):
    N, K, G = 37, 128, 32
    gen = torch.Generator().manual_seed(13)
    x = inputs((M, K), torch.float32, gen).to(DEV)
    sentinel = 12345.0
    big = torch.full((M + 5, N + 5), sentinel, device=DEV)
    out = big[:M, :N]
    if kind == "w4":
        codes, scales, zeros = make_w4(N, K, G, gen)
        q, s, z = to_dev(pack_int4(codes), scales, zeros)
        dm._launch_w4(x, q, s, z, G, None, out)
        want = oracle_w4(x.cpu(), codes, scales, zeros, G, None)
    else:
        codes, scales = make_w8(N, K, gen)
        q, s = to_dev(codes, scales)
        dm._launch_w8(x, q, s, None, out)
        want = oracle_w8(x.cpu(), codes, scales, None)
    assert_close(out, want, torch.float32, kind)
    outside = torch.ones_like(big, dtype=torch.bool)
    outside[:M, :N] = False
    assert (big[outside] == sentinel).all(), "the kernel wrote outside its output"


# ---- packing and the quantizers ----------------------------------------------------------------
def test_pack_int4_layout():
    codes = torch.tensor([[1, 2, 15, 0], [0, 15, 3, 4]], dtype=torch.uint8)
    assert pack_int4(codes).tolist() == [[0x21, 0x0F], [0xF0, 0x43]]
    assert torch.equal(pack_int4(codes), pack_by_hand(codes))


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(1, 24), st.data())
def test_pack_unpack_round_trip(n, half_k, data):
    vals = data.draw(st.lists(st.integers(0, 15), min_size=2 * n * half_k,
                              max_size=2 * n * half_k))
    codes = torch.tensor(vals, dtype=torch.uint8).reshape(n, 2 * half_k)
    packed = pack_int4(codes)
    assert packed.dtype == torch.uint8 and packed.shape == (n, half_k)
    assert torch.equal(packed, pack_by_hand(codes))
    assert torch.equal(unpack_int4(packed), codes)
    assert torch.equal(pack_int4(unpack_int4(packed)), packed)


def test_quantizers_round_trip_within_half_a_step():
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(24, 128, generator=gen)
    w[0] = 0.0
    q8, s8 = quantize_w8(w)
    assert q8.dtype == torch.int8 and s8.shape == (24,)
    assert ((q8.float() * s8[:, None] - w).abs() <= s8[:, None] / 2 + 1e-6).all()
    q4, s4, z4 = quantize_w4(w, 32)
    assert q4.shape == (24, 64) and s4.shape == z4.shape == (24, 4)
    deq = (unpack_int4(q4).float() - z4.repeat_interleave(32, 1)) * s4.repeat_interleave(32, 1)
    assert ((deq - w).abs() <= s4.repeat_interleave(32, 1) / 2 + 1e-6).all()
    assert (deq[0] == 0).all(), "an all-zero row must dequantize to exact zeros"


# ---- bad input ---------------------------------------------------------------------------------
def _w4_args(**over):
    a = dict(x=torch.randn(2, 64), qweight=torch.zeros(8, 32, dtype=torch.uint8),
             scales=torch.ones(8, 2), zeros=torch.full((8, 2), 8.0), group_size=32, bias=None)
    a.update(over)
    return a


def _w8_args(**over):
    a = dict(x=torch.randn(2, 64), qweight=torch.zeros(8, 64, dtype=torch.int8),
             scales=torch.ones(8), bias=None)
    a.update(over)
    return a


W4_BAD = [
    (dict(qweight=torch.zeros(8, 32, dtype=torch.int8)), "uint8"),
    (dict(qweight=torch.zeros(8, 32, 1, dtype=torch.uint8)), "2-D"),
    (dict(x=torch.randn(2, 63)), "even"),
    (dict(x=torch.randn(2, 62)), "K = 64"),
    (dict(x=torch.randint(0, 3, (2, 64))), "float16, bfloat16 or float32"),
    (dict(group_size=48), "power of two"),
    (dict(group_size=8), "power of two >= 16"),
    (dict(group_size=True), "must be an int"),
    (dict(group_size=128), "not a multiple of group_size"),
    (dict(scales=torch.ones(8, 3)), "scales must have shape"),
    (dict(zeros=torch.full((8, 2), 8, dtype=torch.int32)), "zeros must be a floating-point"),
    (dict(bias=torch.zeros(7)), "bias must have shape"),
    (dict(scales=torch.ones(8, 2, device="meta")), "scales is on meta"),
    (dict(qweight=torch.zeros(8, 0, dtype=torch.uint8), x=torch.randn(2, 0)), "K = 0"),
]
W8_BAD = [
    (dict(qweight=torch.zeros(8, 64, dtype=torch.uint8)), "int8"),
    (dict(qweight=torch.zeros(8, 64)), "int8"),
    (dict(x=torch.randn(2, 65)), "K = 64"),
    (dict(x=torch.randn(2, 64, dtype=torch.float64)), "float16, bfloat16 or float32"),
    (dict(scales=torch.ones(8, 1)), "scales must have shape"),
    (dict(scales=torch.ones(8, dtype=torch.int32)), "scales must be a floating-point"),
    (dict(bias=torch.zeros(9)), "bias must have shape"),
    (dict(x=[[1.0] * 64]), "x must be a tensor"),
]


@pytest.mark.parametrize("fn", [w4a16_matmul, w4a16_matmul_ref], ids=["triton", "ref"])
@pytest.mark.parametrize("over,match", W4_BAD)
def test_w4a16_rejects_bad_input(fn, over, match):
    with pytest.raises(ValueError, match=match):
        fn(**_w4_args(**over))


@pytest.mark.parametrize("fn", [w8a16_matmul, w8a16_matmul_ref], ids=["triton", "ref"])
@pytest.mark.parametrize("over,match", W8_BAD)
def test_w8a16_rejects_bad_input(fn, over, match):
    with pytest.raises(ValueError, match=match):
        fn(**_w8_args(**over))


@pytest.mark.parametrize("call,match", [
    (lambda: pack_int4(torch.zeros(2, 3, dtype=torch.uint8)), "K must be even"),
    (lambda: pack_int4(torch.full((2, 4), 16)), r"0\.\.15"),
    (lambda: pack_int4(torch.zeros(2, 4)), "integer tensor"),
    (lambda: unpack_int4(torch.zeros(2, 4, dtype=torch.int8)), "uint8"),
    (lambda: quantize_w4(torch.randn(4, 96), 64), "not a multiple"),
    (lambda: quantize_w4(torch.randn(4, 65), 32), "even"),
    (lambda: quantize_w8(torch.randn(4)), "2-D"),
    (lambda: dm.pick_config("w2", 1, 8, 8), "kind"),
    (lambda: dm._check_config(dm.Config(True, 16, 16, 64), "w4", 32), "one group at a time"),
    (lambda: dm._check_config(dm.Config(False, 4, 16, 48), "w8", None), "power of two"),
])
def test_helpers_reject_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_empty_batch_and_interpreter_setup():
    y = w4a16_matmul(**_w4_args(x=torch.randn(0, 64).to(DEV), qweight=torch.zeros(
        8, 32, dtype=torch.uint8, device=DEV), scales=torch.ones(8, 2, device=DEV),
        zeros=torch.full((8, 2), 8.0, device=DEV)))
    assert y.shape == (0, 8)
    if not torch.cuda.is_available():
        assert dm.INTERPRET, "kernels/ must switch Triton to its interpreter without CUDA"
