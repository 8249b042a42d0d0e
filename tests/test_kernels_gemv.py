"""The batch-1 GEMV kernels of kernels/gemv.py (split-K, the M = 1 path of w8a16_matmul and
w4a16_matmul, GraphDecoder's triton_gemv), against the torch references. Without a GPU they run
in Triton's interpreter, with the portable conversion; on a GPU (make gpu-check) the same
tests run the byte-permute conversion."""
import itertools

import pytest
import torch

from kernels import dequant_matmul as dm
from kernels import (
    gemv,
    quantize_w4,
    quantize_w8,
    w4a16_matmul,
    w4a16_matmul_ref,
    w8a16_matmul,
    w8a16_matmul_ref,
)

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def rel_err(got, want):
    return ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()


@pytest.mark.parametrize("N,K", [(24, 256),                          # make check: one shape
                                 pytest.param(40, 512, marks=pytest.mark.slow),
                                 pytest.param(16, 1024, marks=pytest.mark.slow)])
def test_every_split_and_tile_matches_the_reference(N, K):
    g = torch.Generator().manual_seed(N + K)
    w = torch.randn(N, K, generator=g)
    x = torch.randn(1, K, generator=g).bfloat16().to(DEV)
    bias = torch.randn(N, generator=g).bfloat16().to(DEV)
    q8, s8 = (t.to(DEV) for t in quantize_w8(w))
    q4, s4, z4 = (t.to(DEV) for t in quantize_w4(w, 64))
    wb = w.bfloat16().to(DEV)
    for split, bn, bk, b in itertools.product((1, 2, 4), (8, 16), (128, 256), (None, bias)):
        y = torch.empty(N, dtype=torch.bfloat16, device=DEV)
        pf = bn == 16            # the prefetching loop on half of the tiles
        gemv.gemv_launch_w8(x[0], q8, s8, b, y, block_n=bn, block_k=bk, split_k=split,
                            prefetch=pf)
        assert rel_err(y, w8a16_matmul_ref(x, q8, s8, b)[0]) < 1e-2, ("w8", split, bn, bk)
        gemv.gemv_launch_w4(x[0], q4, s4, z4, 64, b, y, block_n=bn, block_k=bk, split_k=split,
                            prefetch=pf)
        assert rel_err(y, w4a16_matmul_ref(x, q4, s4, z4, 64, b)[0]) < 1e-2, ("w4", split, bn)
        gemv.gemv_launch_float(x[0], wb, b, y, block_n=bn, block_k=bk, split_k=split,
                               prefetch=pf)
        want = (x.float() @ wb.float().T)[0] + (0 if b is None else b.float())
        assert rel_err(y, want) < 1e-2, ("float", split, bn, bk)
    # the last program of each row block put its counter back to zero: the next call works
    assert int(gemv._WORK[(x.device.type, x.device.index)][1].abs().sum()) == 0


def test_split_k_over_a_ragged_k_and_a_strided_x():
    """K not a multiple of the block or of the split, x a column of a bigger tensor."""
    g = torch.Generator().manual_seed(1)
    N, K = 20, 200
    w = torch.randn(N, K, generator=g)
    big = torch.randn(K, 3, generator=g).bfloat16().to(DEV)
    x1 = big[:, 1]
    q8, s8 = (t.to(DEV) for t in quantize_w8(w))
    y = torch.empty(N, dtype=torch.bfloat16, device=DEV)
    for split, pf in itertools.product((1, 3, 4), (False, True)):
        gemv.gemv_launch_w8(x1, q8, s8, None, y, block_n=8, block_k=64, split_k=split,
                            prefetch=pf)
        assert rel_err(y, w8a16_matmul_ref(x1[None], q8, s8)[0]) < 1e-2, (split, pf)


def test_the_m1_path_of_the_fused_kernels_is_the_gemv():
    """pick_config sends M = 1 to the GEMV kernels (split-K for the int4 kernel at N >= 8192),
    and the public functions give the reference's result through it."""
    assert dm.pick_config("w8", 1, 4096, 4096).gemv
    assert dm.pick_config("w4", 1, 8192, 8192, 128).split_k == 4
    assert not dm.pick_config("w8", 2, 4096, 4096).gemv
    with pytest.raises(ValueError, match="gemv config is for M = 1"):
        dm._check_config(dm.Config(True, 16, 16, 16, gemv=True), "w8", None)
    g = torch.Generator().manual_seed(2)
    w = torch.randn(48, 256, generator=g)
    x = torch.randn(1, 256, generator=g).bfloat16().to(DEV)
    q8, s8 = (t.to(DEV) for t in quantize_w8(w))
    q4, s4, z4 = (t.to(DEV) for t in quantize_w4(w, 128))
    assert rel_err(w8a16_matmul(x, q8, s8), w8a16_matmul_ref(x, q8, s8)) < 1e-2
    assert rel_err(w4a16_matmul(x, q4, s4, z4, 128), w4a16_matmul_ref(x, q4, s4, z4, 128)) < 1e-2


def test_gemv_float_is_one_operator_for_torch_compile():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(1, 256, generator=g).bfloat16().to(DEV)
    w = torch.randn(40, 256, generator=g).bfloat16().to(DEV)
    want = x.float() @ w.float().T
    assert rel_err(gemv.gemv_float(x, w), want) < 1e-2
    assert rel_err(torch.compile(lambda x, w: gemv.gemv_float(x, w) * 2)(x, w), 2 * want) < 1e-2
    with pytest.raises(ValueError, match=r"x \[1, K\] and w \[N, K\]"):
        gemv.gemv_float(x[0], w)


@pytest.mark.parametrize("M", [pytest.param(2, marks=pytest.mark.slow), 5,
                               pytest.param(16, marks=pytest.mark.slow)])
def test_split_k_on_the_dot_path(M):
    """M = 2..16 on the tensor-core path with K cut into 1..4 ranges (K ragged against the
    split), bias or not: the reference's result, and the counters are back at zero."""
    g = torch.Generator().manual_seed(M)
    N, K = 40, 448
    w = torch.randn(N, K, generator=g)
    x = torch.randn(M, K, generator=g).bfloat16().to(DEV)
    bias = torch.randn(N, generator=g).bfloat16().to(DEV)
    q8, s8 = (t.to(DEV) for t in quantize_w8(w))
    q4, s4, z4 = (t.to(DEV) for t in quantize_w4(w, 64))
    y = torch.empty(M, N, dtype=torch.bfloat16, device=DEV)
    for split, b in itertools.product((1, 3, 4), (None, bias)):
        dm._launch_w8(x, q8, s8, b, y, dm.Config(True, 16, 16, 64, split_k=split))
        assert rel_err(y, w8a16_matmul_ref(x, q8, s8, b)) < 1e-2, ("w8", split)
        dm._launch_w4(x, q4, s4, z4, 64, b, y, dm.Config(True, 16, 16, 64, split_k=split))
        assert rel_err(y, w4a16_matmul_ref(x, q4, s4, z4, 64, b)) < 1e-2, ("w4", split)
    assert int(gemv._WORK[(x.device.type, x.device.index)][1].abs().sum()) == 0
    with pytest.raises(ValueError, match="at most block_m = 16 rows"):
        dm._launch_w8(torch.zeros(17, K, dtype=torch.bfloat16, device=DEV), q8, s8, None,
                      torch.empty(17, N, dtype=torch.bfloat16, device=DEV),
                      dm.Config(True, 16, 16, 64, split_k=2))
    with pytest.raises(ValueError, match="split_k > 1 is for the gemv and dot paths"):
        dm._check_config(dm.Config(False, 4, 16, 256, split_k=2), "w8", None)
    with pytest.raises(ValueError, match="prefetch is an option of the gemv kernels"):
        dm._check_config(dm.Config(True, 16, 16, 64, prefetch=True), "w4", 64)


def spaced(t: torch.Tensor) -> torch.Tensor:
    """The same values as a view with column stride 2 (every other byte of a buffer)."""
    buf = torch.zeros(t.shape[0], 2 * t.shape[1], dtype=t.dtype, device=t.device)
    buf[:, ::2] = t
    return buf[:, ::2]


def test_codes_that_are_not_whole_words_take_the_general_path():
    """The batch-1 kernels read codes as int32 words; a view they cannot read that way (column
    stride 2, a row start off a word) is refused by the launcher with the reason, and
    w8a16_matmul / w4a16_matmul send it to the M >= 2 kernels instead: same result."""
    g = torch.Generator().manual_seed(3)
    w = torch.randn(16, 132, generator=g)
    q8, s8 = (t.to(DEV) for t in quantize_w8(w))
    assert gemv.words_ok(q8[:, :128]) and not gemv.words_ok(q8[:, 1:129])
    x = torch.randn(1, 128, generator=g).bfloat16().to(DEV)
    y = torch.empty(16, dtype=torch.bfloat16, device=DEV)
    with pytest.raises(ValueError, match="read codes as int32 words"):
        gemv.gemv_launch_w8(x[0], q8[:, 1:129], s8, None, y)
    for view in (q8[:, 1:129], spaced(q8[:, :128])):
        want = w8a16_matmul_ref(x, view.contiguous(), s8)
        assert rel_err(w8a16_matmul(x, view, s8), want) < 1e-2
    q4, s4, z4 = (t.to(DEV) for t in quantize_w4(w[:, :128], 32))
    with pytest.raises(ValueError, match="read codes as int32 words"):
        gemv.gemv_launch_w4(x[0], spaced(q4), s4, z4, 32, None, y)
    assert rel_err(w4a16_matmul(x, spaced(q4), s4, z4, 32),
                   w4a16_matmul_ref(x, q4, s4, z4, 32)) < 1e-2


def test_the_m2_to_16_path_splits_k():
    """pick_config: M = 2..16 cut K (int8: four ways where each part keeps four tiles; int4:
    to about 512 programs, each with four groups or more); small layers (the shipped model's)
    are not split, and M > 16 never."""
    assert dm.pick_config("w8", 2, 4096, 4096).split_k == 4
    assert dm.pick_config("w8", 16, 8192, 8192).split_k == 4
    assert dm.pick_config("w4", 2, 4096, 4096, 128).split_k == 8
    assert dm.pick_config("w4", 16, 8192, 8192, 128).split_k == 4
    assert dm.pick_config("w4", 2, 1536, 384, 64).split_k == 1
    assert dm.pick_config("w4", 17, 4096, 4096, 128).split_k == 1
    assert dm.pick_config("w8", 2, 1536, 1536).split_k == 3
    assert dm.pick_config("w8", 2, 1536, 384).split_k == 1
    assert dm.pick_config("w8", 17, 4096, 4096).split_k == 1
