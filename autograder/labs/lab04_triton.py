"""Lab 04's Triton kernels, written by the student: the launchers the notebook gives, the torch
specs beside them, and the checks the hidden tests run.

Five kernels, each launched here (trusted code) so that the grid, the strides and the block
sizes are the check's choice, never the student's:

    silu_mul(kernel, g, u)                      elementwise, masked tail      out = silu(g) * u
    rmsnorm(kernel, x, w, eps)                  one program per row, rows longer than a block
    matvec(kernel, W, x)                        a tile of outputs per program, a loop over K
    w8a16_gemv(kernel, x, qweight, scales)      int8 codes, a scale per output row
    w4a16_gemv(kernel, x, qweight, scales, zeros, G)   packed int4, scale + zero per group

`check_<name>(kernel)` first requires a @triton.jit kernel written in the notebook that uses
only Triton (autograder/labs/kernelcheck.py), computes the expected outputs with the torch
spec, then runs the kernel with the course's kernel modules disabled on inputs fenced by NaN
(an unmasked load past the end reads NaN, an unmasked store past the end is caught), at sizes
that are not multiples of the blocks, several block sizes (groups that start inside a tile and
tiles inside a group), one and several rows. On a GPU `check_gemv_speed` also times the two
dequant kernels against the course's (`kernels.w8a16_matmul` / `w4a16_matmul`) at 4096 x 4096,
batch 1, bf16; without one it runs as a dry run only where a test asks for it.

    from autograder.labs import lab04_triton as tri
    tri.check_matvec(matvec_kernel)        # AssertionError naming what is wrong
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from autograder.checks import assert_close, assert_close_shown
from autograder.labs import kernelcheck as kc
from autograder.remote import kernel_side
from kernels.dequant_ref import w4a16_matmul_ref, w8a16_matmul_ref
from kernels.formats import group_quantize_int4, pack_int4
from kernels.intmath import cdiv as _cdiv

try:
    import triton
except ImportError:                                       # pragma: no cover
    triton = None

__all__ = ["silu_mul", "rmsnorm", "matvec", "w8a16_gemv", "w4a16_gemv", "silu_mul_spec",
           "rmsnorm_spec", "matvec_spec", "w8a16_gemv_spec", "w4a16_gemv_spec", "check_silu_mul",
           "check_rmsnorm", "check_matvec", "check_w8a16_gemv", "check_w4a16_gemv",
           "check_gemv_speed", "GPU_SPEED"]

# on a GPU: the student's kernel must reach these, at 4096 x 4096, batch 1, bf16 activations
# (the course's kernels reach about 2x more of the copy bandwidth: benchmarks/RESULTS.md)
GPU_SPEED = {"min_fraction_of_copy": 0.10, "min_ratio_to_reference": 0.25}
_randn, _Generator = torch.randn, torch.Generator


def _pow2(name: str, v: int) -> None:
    if not isinstance(v, int) or v < 1 or v & (v - 1):
        raise ValueError(f"{name} must be a power of two (tl.arange needs one), got {v!r}")


def _float(name: str, t) -> None:
    if not isinstance(t, torch.Tensor) or not t.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got "
                         f"{getattr(t, 'dtype', type(t).__name__)}")


# --- the launchers (what the notebook calls) ----------------------------------------------------
def silu_mul(kernel, g: torch.Tensor, u: torch.Tensor, block: int = 64) -> torch.Tensor:
    """out = silu(g) * u, elementwise, with `kernel[(cdiv(n, block),)](g, u, out, n,
    BLOCK=block)`; g and u contiguous, same shape and dtype; out has their dtype."""
    _float("g", g), _float("u", u), _pow2("block", block)
    if g.shape != u.shape or g.dtype != u.dtype or not (g.is_contiguous() and u.is_contiguous()):
        raise ValueError(f"g and u must be contiguous with one shape and dtype, got "
                         f"{tuple(g.shape)} {g.dtype} and {tuple(u.shape)} {u.dtype}")
    out = torch.empty_like(g)
    return _silu_mul_into(kernel, g, u, out, block)


def _silu_mul_into(kernel, g, u, out, block):
    n = g.numel()
    if n:
        kc.launch(kernel, (_cdiv(n, block),), g, u, out, n, BLOCK=block)
    return out


def rmsnorm(kernel, x: torch.Tensor, w: torch.Tensor, eps: float = 1e-5,
            block: int = 32) -> torch.Tensor:
    """out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w, one program per row:
    `kernel[(R,)](x, w, out, C, x.stride(0), out.stride(0), eps, BLOCK=block)`;
    x [R, C] with unit stride along C, w [C]."""
    _float("x", x), _float("w", w), _pow2("block", block)
    if x.dim() != 2 or x.stride(1) != 1 or tuple(w.shape) != (x.shape[1],):
        raise ValueError(f"x must be [rows, C] with unit stride along C and w [C], got x "
                         f"{tuple(x.shape)} strides {x.stride()} and w {tuple(w.shape)}")
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    return _rmsnorm_into(kernel, x, w, out, eps, block)


def _rmsnorm_into(kernel, x, w, out, eps, block):
    if x.shape[0] and x.shape[1]:
        kc.launch(kernel, (x.shape[0],), x, w, out, x.shape[1], x.stride(0), out.stride(0), eps,
                  BLOCK=block)
    return out


def matvec(kernel, W: torch.Tensor, x: torch.Tensor, block_n: int = 16,
           block_k: int = 32) -> torch.Tensor:
    """y = W @ x for W [N, K] (any strides) and x [K] (contiguous), y [N] float32:
    `kernel[(cdiv(N, block_n),)](W, x, y, N, K, W.stride(0), W.stride(1), BLOCK_N=block_n,
    BLOCK_K=block_k)`."""
    _float("W", W), _float("x", x), _pow2("block_n", block_n), _pow2("block_k", block_k)
    if W.dim() != 2 or x.dim() != 1 or W.shape[1] != x.shape[0] or not x.is_contiguous():
        raise ValueError(f"expected W [N, K] and a contiguous x [K], got {tuple(W.shape)} and "
                         f"{tuple(x.shape)}")
    y = torch.empty(W.shape[0], dtype=torch.float32, device=W.device)
    return _matvec_into(kernel, W, x, y, block_n, block_k)


def _matvec_into(kernel, W, x, y, block_n, block_k):
    N, K = W.shape
    if N and K:
        kc.launch(kernel, (_cdiv(N, block_n),), W, x, y, N, K, W.stride(0), W.stride(1),
                  BLOCK_N=block_n, BLOCK_K=block_k)
    return y


def _gemv_args(x, qweight, n_cols_per_byte):
    _float("x", x)
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(f"x must be [M, K] with unit stride along K, got {tuple(x.shape)} "
                         f"strides {x.stride()}")
    if qweight.dim() != 2 or qweight.stride(1) != 1 or \
            qweight.shape[1] * n_cols_per_byte != x.shape[1]:
        raise ValueError(f"qweight must be [N, K{' // 2' if n_cols_per_byte == 2 else ''}] with "
                         f"unit stride along K, got {tuple(qweight.shape)} for x "
                         f"{tuple(x.shape)}")
    return x.shape[0], qweight.shape[0], x.shape[1]


def w8a16_gemv(kernel, x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
               block_n: int = 16, block_k: int = 32) -> torch.Tensor:
    """y = x @ (qweight * scales[:, None]).T, y [M, N] in x's dtype: one program per block of
    outputs and row of x, `kernel[(cdiv(N, block_n), M)](x, qweight, scales, y, N, K,
    x.stride(0), qweight.stride(0), y.stride(0), BLOCK_N=block_n, BLOCK_K=block_k)`."""
    if not isinstance(qweight, torch.Tensor) or qweight.dtype != torch.int8:
        raise ValueError(f"qweight must be int8, got {getattr(qweight, 'dtype', qweight)}")
    M, N, K = _gemv_args(x, qweight, 1)
    _pow2("block_n", block_n), _pow2("block_k", block_k)
    if tuple(scales.shape) != (N,):
        raise ValueError(f"scales must be [N] = [{N}], got {tuple(scales.shape)}")
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    return _w8_into(kernel, x, qweight, scales, y, block_n, block_k)


def _w8_into(kernel, x, qweight, scales, y, block_n, block_k):
    M, K = x.shape
    N = qweight.shape[0]
    if M and N:
        kc.launch(kernel, (_cdiv(N, block_n), M), x, qweight, scales, y, N, K, x.stride(0),
                  qweight.stride(0), y.stride(0), BLOCK_N=block_n, BLOCK_K=block_k)
    return y


def w4a16_gemv(kernel, x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
               zeros: torch.Tensor, group_size: int, block_n: int = 16,
               block_k: int = 32) -> torch.Tensor:
    """y = x @ W.T, W[n, k] = (q[n, k] - zeros[n, k // G]) * scales[n, k // G], q the packed
    nibbles (byte j of a row: low nibble k = 2j, high nibble k = 2j + 1); y [M, N] in x's
    dtype: `kernel[(cdiv(N, block_n), M)](x, qweight, scales, zeros, y, N, K, x.stride(0),
    qweight.stride(0), scales.stride(0), y.stride(0), GROUP=group_size, BLOCK_N=block_n,
    BLOCK_K=block_k)` (scales and zeros share their strides)."""
    if not isinstance(qweight, torch.Tensor) or qweight.dtype != torch.uint8:
        raise ValueError(f"qweight must be uint8 packed nibbles, got "
                         f"{getattr(qweight, 'dtype', qweight)}")
    M, N, K = _gemv_args(x, qweight, 2)
    _pow2("block_n", block_n), _pow2("block_k", block_k), _pow2("group_size", group_size)
    if K % group_size:
        raise ValueError(f"K = {K} must be a multiple of group_size = {group_size}")
    for name, t in (("scales", scales), ("zeros", zeros)):
        if tuple(t.shape) != (N, K // group_size):
            raise ValueError(f"{name} must be [N, K // G] = [{N}, {K // group_size}], got "
                             f"{tuple(t.shape)}")
    if scales.stride() != zeros.stride():
        raise ValueError(f"scales and zeros must share strides, got {scales.stride()} and "
                         f"{zeros.stride()}")
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    return _w4_into(kernel, x, qweight, scales, zeros, group_size, y, block_n, block_k)


def _w4_into(kernel, x, qweight, scales, zeros, group_size, y, block_n, block_k):
    M, K = x.shape
    N = qweight.shape[0]
    if M and N:
        kc.launch(kernel, (_cdiv(N, block_n), M), x, qweight, scales, zeros, y, N, K,
                  x.stride(0), qweight.stride(0), scales.stride(0), y.stride(0),
                  GROUP=group_size, BLOCK_N=block_n, BLOCK_K=block_k)
    return y


# --- the torch specs (same arguments, minus the kernel) -----------------------------------------
def silu_mul_spec(g, u):
    return (F.silu(g.float()) * u.float()).to(g.dtype)


def rmsnorm_spec(x, w, eps=1e-5):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


def matvec_spec(W, x):
    return W.float() @ x.float()


# the dequant GEMVs' specs are the course's torch references (float32 product, x's dtype)
w8a16_gemv_spec = w8a16_matmul_ref
w4a16_gemv_spec = w4a16_matmul_ref


# --- the checks -----------------------------------------------------------------------------------
def _fenced_out(shape, dtype):
    return kc.nan_padded(torch.zeros(shape, dtype=dtype))


def _compare(got, want, buf, name, what, tol):
    kc.assert_padding_untouched(buf, got, f"{name} ({what})")
    if bool(torch.isnan(got).any()):
        raise AssertionError(f"{name} ({what}): NaN in the output. The inputs are fenced by NaN, "
                             f"so a load past the end of a tensor without a mask reads NaN "
                             f"(the Triton interpreter does not fault on it; a GPU might, or "
                             f"read garbage)")
    assert_close_shown(got.float(), want.float(), atol=tol, rtol=tol, name=f"{name} ({what})")


def _tol(dtype):
    return 1e-4 if dtype == torch.float32 else 2e-2


def check_silu_mul(kernel, name: str = "silu_mul_kernel") -> None:
    kc.assert_triton_kernel(kernel, name)
    gen = _Generator().manual_seed(4201)
    for n, block, dtype in [(1, 16, torch.float32), (100, 32, torch.float32),
                            (256, 64, torch.float32), (1000, 128, torch.bfloat16),
                            (37, 64, torch.float16)]:
        g, u = (_randn(n, generator=gen) * 4).to(dtype), _randn(n, generator=gen).to(dtype)
        want = silu_mul_spec(g, u)
        (gv, _), (uv, _) = kc.nan_padded(g), kc.nan_padded(u)
        out, buf = _fenced_out((n,), dtype)
        with kc.course_kernels_disabled():
            _silu_mul_into(kernel, gv, uv, out, block)
        _compare(out, want, buf, name, f"n={n}, BLOCK={block}, {dtype}", _tol(dtype))


def check_rmsnorm(kernel, name: str = "rmsnorm_kernel") -> None:
    kc.assert_triton_kernel(kernel, name)
    gen = _Generator().manual_seed(4202)
    for R, C, block, dtype in [(1, 8, 8, torch.float32), (3, 100, 32, torch.float32),
                               (2, 64, 16, torch.float32), (4, 200, 64, torch.bfloat16),
                               (2, 33, 128, torch.float32)]:
        wide = _randn(R, C + 7, generator=gen) * 3
        wide[:, C:] = math.nan
        x = wide.to(dtype)[:, :C]                         # rows with a stride wider than C
        w = (1 + _randn(C, generator=gen)).to(dtype)
        want = rmsnorm_spec(x, w, 1e-5)
        wv, _ = kc.nan_padded(w)
        out, buf = _fenced_out((R, C), dtype)
        with kc.course_kernels_disabled():
            _rmsnorm_into(kernel, x, wv, out, 1e-5, block)
        _compare(out, want, buf, name, f"{R} rows of {C}, row stride {x.stride(0)}, "
                 f"BLOCK={block}, {dtype}", _tol(dtype))


def check_matvec(kernel, name: str = "matvec_kernel") -> None:
    kc.assert_triton_kernel(kernel, name)
    gen = _Generator().manual_seed(4203)
    for N, K, bn, bk, transposed in [(1, 1, 16, 16, False), (40, 96, 16, 32, False),
                                     (33, 70, 8, 64, False), (64, 128, 16, 32, True),
                                     (17, 300, 32, 128, False)]:
        W = _randn(K, N, generator=gen).T if transposed else _randn(N, K, generator=gen)
        x = _randn(K, generator=gen)
        want = matvec_spec(W, x)
        if not transposed:
            W, _ = kc.nan_padded(W)
        xv, _ = kc.nan_padded(x)
        out, buf = _fenced_out((N,), torch.float32)
        with kc.course_kernels_disabled():
            _matvec_into(kernel, W, xv, out, bn, bk)
        _compare(out, want, buf, name, f"W {N}x{K} strides {W.stride()}, BLOCK_N={bn}, "
                 f"BLOCK_K={bk}", 1e-4)


def _gemv_cases():
    # (M, N, K, G, block_n, block_k, dtype): N and K off the tiles, groups inside a tile
    # (G < BLOCK_K) and tiles inside a group (G > BLOCK_K), one row and several
    return [(1, 40, 96, 32, 16, 64, torch.float32), (3, 40, 96, 32, 16, 32, torch.float32),
            (2, 17, 128, 64, 8, 32, torch.float32), (1, 24, 160, 16, 16, 64, torch.bfloat16),
            (4, 9, 64, 64, 16, 128, torch.float16)]


def _gemv_x(M, K, dtype, gen):
    wide = _randn(M, K + 6, generator=gen)
    wide[:, K:] = math.nan
    return wide.to(dtype)[:, :K]                          # row stride K + 6, NaN past K


def check_w8a16_gemv(kernel, name: str = "w8a16_gemv_kernel") -> None:
    kc.assert_triton_kernel(kernel, name)
    gen = _Generator().manual_seed(4204)
    for M, N, K, _, bn, bk, dtype in _gemv_cases():
        q = torch.randint(-127, 128, (N, K), generator=gen, dtype=torch.int8)
        s = torch.rand(N, generator=gen) / 64 + 1e-3
        x = _gemv_x(M, K, dtype, gen)
        want = w8a16_gemv_spec(x, q, s)
        qv, _ = kc.nan_padded(q)
        sv, _ = kc.nan_padded(s)
        out, buf = _fenced_out((M, N), dtype)
        with kc.course_kernels_disabled():
            _w8_into(kernel, x, qv, sv, out, bn, bk)
        _compare(out, want, buf, name, f"M={M}, N={N}, K={K}, BLOCK_N={bn}, BLOCK_K={bk}, "
                 f"{dtype}", _tol(dtype))


def check_w4a16_gemv(kernel, name: str = "w4a16_gemv_kernel") -> None:
    kc.assert_triton_kernel(kernel, name)
    gen = _Generator().manual_seed(4205)
    for M, N, K, G, bn, bk, dtype in _gemv_cases():
        codes, s, z = group_quantize_int4(_randn(N, K, generator=gen), G)
        q = pack_int4(codes)
        x = _gemv_x(M, K, dtype, gen)
        want = w4a16_gemv_spec(x, q, s, z, G)
        qv, _ = kc.nan_padded(q)
        sz = kc.nan_padded(torch.stack([s, z]))[0]         # scales and zeros share strides
        out, buf = _fenced_out((M, N), dtype)
        with kc.course_kernels_disabled():
            _w4_into(kernel, x, qv, sz[0], sz[1], G, out, bn, bk)
        _compare(out, want, buf, name, f"M={M}, N={N}, K={K}, G={G}, BLOCK_N={bn}, "
                 f"BLOCK_K={bk}, {dtype}", _tol(dtype))


@kernel_side            # times the student's kernel where it lives (autograder/remote.py)
def check_gemv_speed(fmt: str, kernel, *, dry_run: bool = False, N: int = 4096, K: int = 4096,
                     group_size: int = 128, **kw) -> dict:
    """On a GPU: the student's "w8a16" or "w4a16" kernel at M = 1, bf16 activations, timed
    against the course's (`kernels.w8a16_matmul` / `w4a16_matmul`) and a device copy;
    AssertionError below GPU_SPEED. dry_run=True runs the same path on the CPU (pass small N,
    K) and asserts nothing. Returns kernelcheck.kernel_speed's report."""
    import kernels
    if fmt not in ("w8a16", "w4a16"):
        raise ValueError(f"fmt must be 'w8a16' or 'w4a16', got {fmt!r}")
    kc.assert_triton_kernel(kernel, f"{fmt}_gemv_kernel")
    dev = "cpu" if dry_run else "cuda"
    gen = _Generator().manual_seed(4206)
    w = _randn(N, K, generator=gen) / K ** 0.5
    x = _randn(1, K, generator=gen).to(torch.bfloat16).to(dev)
    bn, bk = (16, 256) if not dry_run else (16, 64)
    if fmt == "w8a16":
        q, s = (t.to(dev) for t in kernels.quantize_w8(w))
        student = lambda: w8a16_gemv(kernel, x, q, s, bn, bk)              # noqa: E731
        course = lambda: kernels.w8a16_matmul(x, q, s)                      # noqa: E731
        weight_bytes = q.nbytes + s.nbytes
    else:
        q, s, z = (t.to(dev) for t in kernels.quantize_w4(w, group_size))
        student = lambda: w4a16_gemv(kernel, x, q, s, z, group_size, bn, bk)  # noqa: E731
        course = lambda: kernels.w4a16_matmul(x, q, s, z, group_size)          # noqa: E731
        weight_bytes = q.nbytes + s.nbytes + z.nbytes
    assert_close(student().float(), course().float(), atol=2e-2, rtol=2e-2,
                 name=f"{fmt} kernel vs the course's, {N}x{K}")
    moved = weight_bytes + x.nbytes + 2 * N                  # codes, scales, x in, y out
    return kc.check_kernel_speed(student, course, moved, what=f"your {fmt} kernel",
                                 dry_run=dry_run, **GPU_SPEED, **kw)
