"""Lab 04's Triton kernels: the launchers (probes), the torch specs and the checks: each of CASES
on fenced inputs; on a GPU `check_gemv_speed` times the GEMVs against the course's kernels.
silu_mul, rmsnorm, matvec and w8a16_gemv are guided: the student writes a kernel of a given
signature and the launcher here picks the grid. w4a16_gemv is the student's design: they write
the kernel(s) AND the launcher `w4a16_gemv(x, qweight, scales, zeros, group_size, out)`, which
launches through `launch` below; the checks judge what the launches stored in `out`."""
from __future__ import annotations

import functools
import math
from pathlib import Path

import torch
import torch.nn.functional as F

from autograder.checks import assert_close
from autograder.labs import kernelcheck as kc
from autograder.probes import probe
from kernels import dequant_ref
from kernels.dequant_ref import w4a16_matmul_ref, w8a16_matmul_ref
from kernels.intmath import cdiv

# on a GPU, at 4096 x 4096, batch 1, bf16 (the course's reach ~2x more: benchmarks/RESULTS.md)
GPU_SPEED = {"min_fraction_of_copy": 0.10, "min_ratio_to_reference": 0.25}
F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16


def silu_mul_spec(g, u):
    return (F.silu(g.float()) * u.float()).to(g.dtype)


def rmsnorm_spec(x, w, eps=1e-5):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


def matvec_spec(W, x):
    return W.float() @ x.float()


w8a16_gemv_spec = w8a16_matmul_ref
w4a16_gemv_spec = w4a16_matmul_ref
SPECS = {"silu_mul": silu_mul_spec, "rmsnorm": rmsnorm_spec, "matvec": matvec_spec,
         "w8a16_gemv": w8a16_gemv_spec, "w4a16_gemv": w4a16_gemv_spec}


def _validate(what: str, ins: list, c: dict) -> None:
    """ValueError unless the inputs are what `what`'s kernel reads."""
    for name in ("block", "block_n", "block_k", "group_size"):
        if name in c and (not isinstance(c[name], int) or c[name] < 1 or c[name] & (c[name] - 1)):
            raise ValueError(f"{name} must be a power of two (tl.arange needs one), got "
                             f"{c[name]!r}")
    x, shapes = ins[0], [tuple(t.shape) for t in ins]
    if not x.is_floating_point():
        raise ValueError(f"the first tensor must be floating-point, got {x.dtype}")
    if what == "silu_mul" and (shapes[0] != shapes[1] or x.dtype != ins[1].dtype or
                               not x.is_contiguous() or not ins[1].is_contiguous()):
        raise ValueError(f"g and u must be contiguous with one shape and dtype, got {shapes}")
    if what == "rmsnorm" and (x.dim() != 2 or x.stride(1) != 1 or shapes[1] != x.shape[1:]):
        raise ValueError(f"x must be [rows, C] with unit stride along C and w [C], got {shapes} "
                         f"(x's strides {x.stride()})")
    if what == "matvec" and (x.dim() != 2 or ins[1].dim() != 1 or x.shape[1] != len(ins[1])
                             or not ins[1].is_contiguous()):
        raise ValueError(f"expected W [N, K] and a contiguous x [K], got {shapes}")
    if what.endswith("_gemv"):            # dtypes and shapes: the course's own checks
        w4 = what == "w4a16_gemv"
        if w4:
            dequant_ref.check_w4a16_args(*ins, c["group_size"], None)
        else:
            dequant_ref.check_w8a16_args(*ins, None)
        if x.dim() != 2 or x.stride(1) != 1 or ins[1].stride(1) != 1 or \
                (w4 and ins[2].stride() != ins[3].stride()):
            raise ValueError(f"x [M, K] and qweight [N, K{' // 2' if w4 else ''}] need unit stride "
                             f"along K{' and scales, zeros one set of strides' if w4 else ''}")


def _output(what: str, ins: list) -> tuple[tuple, torch.dtype]:
    if what == "matvec":
        return (ins[0].shape[0],), F32
    if what.endswith("_gemv"):
        return (ins[0].shape[0], ins[1].shape[0]), ins[0].dtype
    return tuple(ins[0].shape), ins[0].dtype


def _launch(what: str, kernel, ins: list, out: torch.Tensor, c: dict) -> None:
    x = ins[0]
    if what == "silu_mul" and x.numel():
        kc.launch(kernel, (cdiv(x.numel(), c["block"]),), *ins, out, x.numel(), BLOCK=c["block"])
    elif what == "rmsnorm" and x.numel():
        kc.launch(kernel, (x.shape[0],), *ins, out, x.shape[1], x.stride(0), out.stride(0),
                  c["eps"], BLOCK=c["block"])
    elif what == "matvec" and x.numel():
        kc.launch(kernel, (cdiv(x.shape[0], c["block_n"]),), *ins, out, *x.shape, *x.stride(),
                  BLOCK_N=c["block_n"], BLOCK_K=c["block_k"])
    elif what == "w8a16_gemv" and x.shape[0] and ins[1].shape[0]:
        (M, K), N = x.shape, ins[1].shape[0]
        kc.launch(kernel, (cdiv(N, c["block_n"]), M), *ins, out, N, K, x.stride(0),
                  ins[1].stride(0), out.stride(0), BLOCK_N=c["block_n"], BLOCK_K=c["block_k"])


def _run(what: str, kernel, ins: list, **c):
    _validate(what, ins, c)
    ins, home = kc.placed(*ins)
    shape, dtype = _output(what, ins)
    out = torch.empty(shape, dtype=dtype, device=ins[0].device)
    _launch(what, kernel, ins, out, c)
    return out.to(home)


@probe
def silu_mul(kernel, g, u, block: int = 64):
    """out = silu(g) * u: `kernel[(cdiv(n, block),)](g, u, out, n, BLOCK=block)`."""
    return _run("silu_mul", kernel, [g, u], block=block)


@probe
def rmsnorm(kernel, x, w, eps: float = 1e-5, block: int = 32):
    """RMSNorm of x [R, C] by rows: `kernel[(R,)](x, w, out, C, x.stride(0), out.stride(0), eps,
    BLOCK=block)`."""
    return _run("rmsnorm", kernel, [x, w], eps=eps, block=block)


@probe
def matvec(kernel, W, x, block_n: int = 16, block_k: int = 32):
    """y [N] fp32 = W [N, K] @ x [K]: `kernel[(cdiv(N, block_n),)](W, x, y, N, K, *W.stride(),
    BLOCK_N=block_n, BLOCK_K=block_k)`."""
    return _run("matvec", kernel, [W, x], block_n=block_n, block_k=block_k)


@probe
def w8a16_gemv(kernel, x, qweight, scales, block_n: int = 16, block_k: int = 32):
    """y = x @ (qweight * scales[:, None]).T: `kernel[(cdiv(N, block_n), M)](x, qweight, scales,
    y, N, K, x.stride(0), qweight.stride(0), y.stride(0), BLOCK_N=, BLOCK_K=)`."""
    return _run("w8a16_gemv", kernel, [x, qweight, scales], block_n=block_n, block_k=block_k)


_COURSE = Path(kc.__file__).resolve().parents[2] / "kernels"


def launch(kernel, grid: tuple, *args, **meta) -> None:
    """Launch your @triton.jit `kernel` on `grid`: `kernel[grid](*args, **meta)`. Your w4a16
    launcher launches its kernels through this, so the checks can see what each launch stores
    in `out` (the course's own kernels are refused)."""
    fn = getattr(kernel, "fn", None)
    if Path(getattr(getattr(fn, "__code__", None), "co_filename", "")).resolve().is_relative_to(
            _COURSE):
        raise AssertionError(f"{getattr(fn, '__name__', kernel)} is one of the course's kernels "
                             f"(kernels/): launch your own")
    kc.launch(kernel, grid, *args, **meta)


def _design_run(launcher, ins: list, group_size: int):
    """`launcher(*ins, group_size, out)` into a NaN-fenced output that starts as NaN, recorded:
    (the whole buffer, what the launches did: kernelcheck.Record.summary)."""
    shape, dtype = _output("w4a16_gemv", ins)
    out, buffer = kc.nan_padded(torch.full(shape, math.nan, dtype=dtype, device=ins[0].device))
    (N, K) = ins[1].shape[0], ins[0].shape[1]
    with kc.recording(buffer, ins, big=N * K) as rec:
        launcher(*ins, group_size, out)
    return buffer, rec.summary(out)


def _judge(name: str, summary: dict) -> None:
    """AssertionError unless `out`'s values are what the launches through `launch` stored."""
    if summary["foreign"]:
        raise AssertionError(f"{name}: a launch was given {summary['foreign'][0]}, a float tensor "
                             f"as large as the weight that is none of the inputs: a dequantized "
                             f"copy of W, written to memory, which w4a16 exists to avoid")
    if not summary["launches"]:
        raise AssertionError(f"{name}: no kernel was launched through tri.launch: y must be "
                             f"computed and stored by your Triton kernel (launch it with "
                             f"tri.launch(kernel, grid, *args, **meta))")
    if summary["late"]:
        raise AssertionError(f"{name}: {summary['late']} values of the output buffer changed after "
                             f"the last launch: your kernel must store y in `out` (torch may only "
                             f"prepare it before, e.g. out.zero_() for tl.atomic_add)")
    if summary["unstored"]:
        raise AssertionError(f"{name}: {summary['unstored']} outputs hold values that no launch "
                             f"through tri.launch stored (computed in torch? launched with "
                             f"kernel[grid] directly?)")


@probe
def _fenced_call(launcher, x, qweight, scales, zeros, group_size: int) -> dict:
    ins, home = kc.placed(x, qweight, scales, zeros)
    buffer, summary = _design_run(launcher, ins, group_size)
    return {"buffer": buffer.to(home), "shape": list(_output("w4a16_gemv", ins)[0]), **summary}


def run_w4a16_gemv(launcher, x, qweight, scales, zeros, group_size: int) -> torch.Tensor:
    """y = your `launcher(x, qweight, scales, zeros, group_size, out)`'s output, run into a
    NaN-fenced `out`: AssertionError if anything outside `out` changed or if `out`'s values are
    not what your launches through tri.launch stored (as graded)."""
    _validate("w4a16_gemv", [x, qweight, scales, zeros], {"group_size": group_size})
    r = _fenced_call(launcher, x, qweight, scales, zeros, group_size)
    name = f"w4a16_gemv {list(x.shape)} x {list(qweight.shape)} codes, G={group_size}"
    _judge(name, r)
    return kc.unfenced(r["buffer"], r["shape"], name)


def _cases(keys: str, rows: list) -> list[dict]:
    return [dict(zip(keys.split(), row)) for row in rows]


# sizes off the tiles, groups inside a tile and tiles inside a group; rows `stride` apart
_GEMV = _cases("M N K group_size block_n block_k dtype", [
    (1, 40, 96, 32, 16, 64, F32), (3, 40, 96, 32, 16, 32, F32), (2, 17, 128, 64, 8, 32, F32),
    (1, 24, 160, 16, 16, 64, BF16), (4, 9, 64, 64, 16, 128, F16)])
CASES = {
    "silu_mul": _cases("n block dtype", [(1, 16, F32), (100, 32, F32), (256, 64, F32),
                                         (1000, 128, BF16), (37, 64, F16)]),
    "rmsnorm": _cases("rows cols stride block dtype eps", [
        (1, 8, 15, 8, F32, 1e-5), (3, 100, 107, 32, F32, 1e-5), (2, 64, 71, 16, F32, 1e-5),
        (4, 200, 207, 64, BF16, 1e-5), (2, 33, 40, 128, F32, 1e-5)]),
    "matvec": _cases("N K block_n block_k transposed", [
        (1, 1, 16, 16, False), (40, 96, 16, 32, False), (33, 70, 8, 64, False),
        (64, 128, 16, 32, True), (17, 300, 32, 128, False)]),
    "w8a16_gemv": [{k: v for k, v in c.items() if k != "group_size"} for c in _GEMV],
    # the student's design picks its tiles: sizes off any power of two, several group sizes
    "w4a16_gemv": [{k: v for k, v in c.items() if not k.startswith("block")} for c in _GEMV] +
    _cases("M N K group_size dtype", [(1, 33, 384, 128, F32), (2, 5, 32, 16, BF16)]),
}
SEEDS = {what: 4201 + i for i, what in enumerate(CASES)}


def case_inputs(what: str, c: dict, seed: int, fence: bool = False) -> list[torch.Tensor]:
    """A case's inputs drawn from `seed`; fence=True: on the kernels' device in NaN fences."""
    g = torch.Generator().manual_seed(seed)
    dt = c.get("dtype", F32)

    def put(t):
        return kc.nan_padded(t.to(kc.device()))[0] if fence else t

    def rows(R, C, stride, scale=1.0):             # [R, C], rows `stride` apart, NaN between
        wide = torch.randn(R, stride, generator=g) * scale
        wide[:, C:] = math.nan
        return put(wide.to(dt))[:, :C]

    if what == "silu_mul":
        return [put((torch.randn(c["n"], generator=g) * 4).to(dt)),
                put(torch.randn(c["n"], generator=g).to(dt))]
    if what == "rmsnorm":
        return [rows(c["rows"], c["cols"], c["stride"], 3.0),
                put((1 + torch.randn(c["cols"], generator=g)).to(dt))]
    if what == "matvec":
        N, K = c["N"], c["K"]
        W = put(torch.randn(K, N, generator=g)).T if c["transposed"] else \
            put(torch.randn(N, K, generator=g))
        return [W, put(torch.randn(K, generator=g))]
    N, K = c["N"], c["K"]
    if what == "w8a16_gemv":
        q = torch.randint(-127, 128, (N, K), generator=g, dtype=torch.int8)
        s = torch.rand(N, generator=g) / 64 + 1e-3
        return [rows(c["M"], K, K + 6), put(q), put(s)]
    packed, s, z = _w4_layer(N, K, c["group_size"], g)
    sz = put(torch.stack([s, z]))                 # scales and zeros share their strides
    return [rows(c["M"], K, K + 6), put(packed), sz[0], sz[1]]


def _w4_layer(N: int, K: int, group_size: int, g: torch.Generator):
    """Random int4 codes, packed two per byte, and a scale and zero per group (the course's
    quantizers are withheld from lab 04's kernel, where the probes draw this too)."""
    packed = torch.randint(0, 256, (N, K // 2), generator=g, dtype=torch.uint8)
    scales = torch.rand(N, K // group_size, generator=g) / 4 + 0.05
    zeros = torch.randint(0, 16, (N, K // group_size), generator=g).float()
    return packed, scales, zeros


@probe
def fenced_run(what: str, kernel, case: dict, seed: int):
    """`kernel` as `what` on the case's fenced inputs: the whole fenced output buffer (w4a16:
    `kernel` is the student's launcher; with what its launches did, _design_run)."""
    ins = case_inputs(what, case, seed, fence=True)
    if what == "w4a16_gemv":
        buffer, summary = _design_run(kernel, ins, case["group_size"])
        return {"buffer": buffer.cpu(), **summary}
    shape, dtype = _output(what, ins)
    out, buffer = kc.nan_padded(torch.zeros(shape, dtype=dtype, device=ins[0].device))
    _launch(what, kernel, ins, out, case)
    return buffer.cpu()


def check_case(what: str, kernel, case: dict, seed: int, name: str | None = None) -> None:
    """AssertionError unless the kernel writes the spec's values and nothing around them."""
    sizes = ", ".join(f"{k}={str(v).replace('torch.', '')}" for k, v in case.items())
    name = f"{name or (what if what == 'w4a16_gemv' else what + '_kernel')} ({sizes})"
    ins = case_inputs(what, case, seed)
    extra = {"rmsnorm": ("eps",), "w4a16_gemv": ("group_size",)}.get(what, ())
    want = SPECS[what](*ins, *(case[k] for k in extra))
    got = fenced_run(what, kernel, case, seed)
    if what == "w4a16_gemv":
        _judge(name, got)
        got = got["buffer"]
    got = kc.unfenced(got, want.shape, name)
    if bool(torch.isnan(got).any()):
        raise AssertionError(f"{name}: NaN in the output. The inputs are fenced by NaN, so a "
                             f"load past the end of a tensor without a mask reads NaN (the Triton "
                             f"interpreter does not fault on it; a GPU might, or read garbage)"
                             + (" -- or your launches never stored those outputs (`out` starts as "
                                "NaN): does your grid cover every row and column?"
                                if what == "w4a16_gemv" else ""))
    tol = 1e-4 if case.get("dtype", F32) == F32 else 2e-2
    assert_close(got.float(), want.float(), atol=tol, rtol=tol, name=name)


def check(what: str, kernel, name: str | None = None) -> None:
    for i, case in enumerate(CASES[what]):
        check_case(what, kernel, case, SEEDS[what] + i, name)


check_silu_mul, check_rmsnorm, check_matvec, check_w8a16_gemv, check_w4a16_gemv = (
    functools.partial(check, what) for what in CASES)


def _speed_inputs(fmt: str, N: int, K: int, group_size: int, dev: str):
    """([x, codes, scales(, zeros)] of a random layer, bf16 batch 1; the bytes a product moves)."""
    g = torch.Generator().manual_seed(4206)
    x = torch.randn(1, K, generator=g).to(BF16)
    if fmt == "w8a16":
        weight = (torch.randint(-127, 128, (N, K), generator=g, dtype=torch.int8),
                  torch.rand(N, generator=g) / (64 * K ** 0.5) + 1e-5)
    else:
        packed, s, z = _w4_layer(N, K, group_size, g)
        weight = (packed, s / K ** 0.5, z)
    ins = [t.to(dev) for t in (x, *weight)]
    return ins, sum(t.nbytes for t in ins) + 2 * N


@probe
def timed_gemv(fmt: str, kernel, N: int, K: int, group_size: int, *, dry_run: bool = False,
               warmup: int = 5, repeats: int = 30) -> dict:
    """Their "w8a16" kernel (our launcher) or "w4a16" launcher (theirs: `kernel(x, qweight,
    scales, zeros, group_size, y)`) on _speed_inputs: {"y", "seconds": median per call}."""
    ins, _ = _speed_inputs(fmt, N, K, group_size, "cpu" if dry_run else "cuda")
    c = {"block_n": 16, "block_k": 64 if dry_run else 256, "group_size": group_size}
    y = torch.empty(1, N, dtype=BF16, device=ins[0].device)
    run = functools.partial(kernel, *ins, group_size, y) if fmt == "w4a16" else \
        functools.partial(_launch, f"{fmt}_gemv", kernel, ins, y, c)
    run()
    return {"y": y.cpu(), "seconds": kc.seconds_per_call(run, dry_run=dry_run, warmup=warmup,
                                                         repeats=repeats)}


def check_gemv_speed(fmt: str, kernel, *, dry_run: bool = False, N: int = 4096, K: int = 4096,
                     group_size: int = 128, warmup: int = 5, repeats: int = 30) -> dict:
    """The speed report against the course's kernel; AssertionError below GPU_SPEED."""
    import kernels
    if fmt not in ("w8a16", "w4a16"):
        raise ValueError(f"fmt must be 'w8a16' or 'w4a16', got {fmt!r}")
    ins, moved = _speed_inputs(fmt, N, K, group_size, "cpu" if dry_run else "cuda")
    course = functools.partial(kernels.w8a16_matmul, *ins) if fmt == "w8a16" else \
        functools.partial(kernels.w4a16_matmul, *ins, group_size)
    got = timed_gemv(fmt, kernel, N, K, group_size, dry_run=dry_run, warmup=warmup,
                     repeats=repeats)
    assert_close(got["y"].float(), course().float().cpu(), atol=2e-2, rtol=2e-2,
                 name=f"{fmt} kernel vs the course's, {N}x{K}")
    report = kc.speed_report(got["seconds"], kc.seconds_per_call(
        course, dry_run=dry_run, warmup=warmup, repeats=repeats), moved, dry_run=dry_run)
    return kc.require_speed(report, f"your {fmt} kernel", **GPU_SPEED)
