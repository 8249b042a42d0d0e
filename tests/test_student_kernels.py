"""Lab 04's Triton kernels as the hidden tests grade them (autograder/labs/lab04_triton.py).

* the notebook's own solution kernels pass every check;
* a second set, written independently and differently (a reduction kept 2-D until the end, a
  one-pass RMSNorm...), passes too: the checks grade what a kernel computes, not how the course
  wrote it;
* the w4a16 GEMV is the student's design (kernel AND launcher): the notebook's (one group per
  step, the scale applied once per group) and a second one (split over K, several groups per
  tile, partial sums in a scratch buffer reduced by a second kernel) both get full marks; an
  `out.zero_()` before the launch is fine;
* the classic mistakes fail with a message that names them: a store or load without a mask on
  the tail, the nibbles swapped, the scale or the zero point forgotten, and in the w4a16
  launcher: y computed in torch, a weight dequantized in torch, a kernel launched around
  tri.launch, y copied into `out` after the kernel;
* a kernel is judged by what it writes: what its body looks like is not graded (in the CPU
  interpreter a body is Python), anything but a Triton kernel is refused (`kernel[grid]` needs
  one), and the course's kernels handed in fail on their own signatures;
* as graded, the checks and the launchers run the student's kernel in the student's kernel only:
  the tester sends seeds and sizes (or plain tensors) and reads back the fenced buffers;
* the GPU speed check runs its whole path as a dry run on the CPU;
* the tracer kernels behind the primer's picture (kernels/tiles.py) say which program did what.
"""
from __future__ import annotations

import importlib.util
import json
import re
import socket
import sys
import threading
from pathlib import Path

import pytest
import torch
import triton

import kernels  # noqa: F401  (sets TRITON_INTERPRET without a GPU before any kernel is defined)
from autograder.labs import kernelcheck as kc
from autograder.labs import lab04_triton as tri
from kernels.tiles import program_map, tile_walk

REPO = Path(__file__).resolve().parent.parent
NOTEBOOK = REPO / "labs" / "04_quantization" / "04_quantization.ipynb"
KERNEL_CELLS = {"04_tri_silu": "silu_mul", "04_tri_rmsnorm": "rmsnorm", "04_tri_matvec": "matvec",
                "04_gemv_w8": "w8a16_gemv", "04_gemv_w4": "w4a16_gemv"}
HEADER = ("import torch\nimport triton\nimport triton.language as tl\nimport kernels\n"
          "from autograder.labs import lab04_triton as tri\n\n\n")


def graded(module, what: str):
    """What the test cell hands the check: the kernel, or for w4a16 the student's launcher."""
    return getattr(module, what if what == "w4a16_gemv" else f"{what}_kernel")


@pytest.fixture
def served(tmp_path, monkeypatch):
    """As graded: `serve(namespace)` serves `namespace` as the student's notebook from a thread
    (autograder/kernel_side.py) over a real socket and returns the tester's view of each name (a
    Triton kernel is a StudentFunction there); probes run on the serving side. `launches`: the
    threads that launched a kernel (kernelcheck.launch)."""
    from autograder import kernel_side, probes
    from autograder.tester import Kernel
    path = str(tmp_path / "tester.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    launches, real = [], kc.launch

    def recorded(*args, **kwargs):
        launches.append(threading.current_thread())
        return real(*args, **kwargs)
    monkeypatch.setattr(kc, "launch", recorded)

    def serve(namespace: dict):
        thread = threading.Thread(target=kernel_side.serve, args=(path, namespace), daemon=True)
        thread.start()
        conn, _ = listener.accept()
        kernel = Kernel(conn)
        monkeypatch.setattr(probes, "_CONNECTION", kernel)
        return thread, {name: kernel.lookup(name) for name in namespace}
    yield serve, launches
    if probes._CONNECTION is not None:
        probes._CONNECTION.done()
    listener.close()


def _import(path: Path, name: str):
    """Import a file as a module: Triton reads a kernel's source from its file."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def _solution_source() -> str:
    cells = {c["metadata"].get("nbgrader", {}).get("grade_id"): "".join(c["source"])
             for c in json.loads(NOTEBOOK.read_text())["cells"]}
    return HEADER + "\n\n\n".join(cells[g] for g in KERNEL_CELLS) + "\n"


@pytest.fixture(scope="module")
def module_from(tmp_path_factory):
    folder = tmp_path_factory.mktemp("kernels")
    made = {}

    def make(source: str, name: str):
        if name not in made:
            path = folder / f"{name}.py"
            path.write_text(source)
            made[name] = _import(path, f"student_kernels_{name}")
        return made[name]
    return make


@pytest.fixture(scope="module")
def solution(module_from):
    return module_from(_solution_source(), "solution")


@pytest.mark.parametrize("what", list(KERNEL_CELLS.values()))
def test_the_notebook_solution_passes(solution, what):
    getattr(tri, f"check_{what}")(graded(solution, what))


OTHER = HEADER + r'''
@triton.jit
def silu_mul_kernel(g_ptr, u_ptr, out_ptr, n, BLOCK: tl.constexpr):
    i = BLOCK * tl.program_id(0) + tl.arange(0, BLOCK)
    live = i < n
    g = tl.load(g_ptr + i, mask=live, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + i, mask=live, other=0.0).to(tl.float32)
    tl.store(out_ptr + i, (g / (1.0 + tl.exp(-g)) * u).to(out_ptr.dtype.element_ty), mask=live)


@triton.jit
def rmsnorm_kernel(x_ptr, w_ptr, out_ptr, C, stride_x, stride_out, eps, BLOCK: tl.constexpr):
    r = tl.program_id(0)
    total = 0.0
    for start in range(0, C, BLOCK):                       # scalar running total
        c = start + tl.arange(0, BLOCK)
        v = tl.load(x_ptr + r * stride_x + c, mask=c < C, other=0.0).to(tl.float32)
        total += tl.sum(v * v, axis=0)
    scale = tl.rsqrt(total / C + eps)
    for start in range(0, C, BLOCK):
        c = start + tl.arange(0, BLOCK)
        v = tl.load(x_ptr + r * stride_x + c, mask=c < C, other=0.0).to(tl.float32)
        g = tl.load(w_ptr + c, mask=c < C, other=0.0).to(tl.float32)
        tl.store(out_ptr + r * stride_out + c, (v * scale * g).to(out_ptr.dtype.element_ty),
                 mask=c < C)


@triton.jit
def matvec_kernel(w_ptr, x_ptr, y_ptr, N, K, stride_wn, stride_wk,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)   # reduced once, after the loop
    for t in range(0, tl.cdiv(K, BLOCK_K)):
        k = t * BLOCK_K + tl.arange(0, BLOCK_K)
        tile = tl.load(w_ptr + n[:, None] * stride_wn + k[None, :] * stride_wk,
                       mask=(n[:, None] < N) & (k[None, :] < K), other=0.0)
        xv = tl.load(x_ptr + k, mask=k < K, other=0.0)
        acc += tile.to(tl.float32) * xv.to(tl.float32)[None, :]
    tl.store(y_ptr + n, tl.sum(acc, axis=1), mask=n < N)


@triton.jit
def w8a16_gemv_kernel(x_ptr, q_ptr, s_ptr, y_ptr, N, K, stride_xm, stride_qn, stride_ym,
                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    row = tl.program_id(1)
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    scale = tl.load(s_ptr + n, mask=n < N, other=0.0).to(tl.float32)
    out = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        q = tl.load(q_ptr + n[:, None] * stride_qn + k[None, :],
                    mask=(n[:, None] < N) & (k[None, :] < K), other=0)
        xv = tl.load(x_ptr + row * stride_xm + k, mask=k < K, other=0.0).to(tl.float32)
        out += tl.sum(q.to(tl.float32) * scale[:, None] * xv[None, :], axis=1)
    tl.store(y_ptr + row * stride_ym + n, out.to(y_ptr.dtype.element_ty), mask=n < N)


@triton.jit
def w4_split_kernel(x_ptr, q_ptr, s_ptr, z_ptr, part_ptr, M, N, K, stride_xm, stride_qn,
                    stride_sn, BYTES_PER_SPLIT, GROUP: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_B: tl.constexpr):
    # program (pid_n, m, split): a partial sum over the split's bytes, BLOCK_B bytes (2 * BLOCK_B
    # codes, several groups) per step, scale and zero per code; even and odd k apart
    row = tl.program_id(1)
    split = tl.program_id(2)
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    j_end = tl.minimum((split + 1) * BYTES_PER_SPLIT, K // 2)
    out = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for j0 in range(split * BYTES_PER_SPLIT, j_end, BLOCK_B):
        j = j0 + tl.arange(0, BLOCK_B)
        j_ok = j < j_end
        ok = n_ok[:, None] & j_ok[None, :]
        b = tl.load(q_ptr + n[:, None] * stride_qn + j[None, :], mask=ok, other=0).to(tl.int32)
        for half in tl.static_range(2):
            k = 2 * j + half
            code = (b >> (4 * half)) & 15
            idx = n[:, None] * stride_sn + (k // GROUP)[None, :]
            s = tl.load(s_ptr + idx, mask=ok, other=0.0).to(tl.float32)
            z = tl.load(z_ptr + idx, mask=ok, other=0.0).to(tl.float32)
            xv = tl.load(x_ptr + row * stride_xm + k, mask=j_ok, other=0.0).to(tl.float32)
            out += tl.sum((code.to(tl.float32) - z) * s * xv[None, :], axis=1)
    tl.store(part_ptr + (split * M + row) * N + n, out, mask=n_ok)


@triton.jit
def w4_reduce_kernel(part_ptr, y_ptr, MN, N, stride_ym, SPLITS: tl.constexpr,
                     BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = i < MN
    total = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in tl.static_range(SPLITS):
        total += tl.load(part_ptr + s * MN + i, mask=ok, other=0.0)
    tl.store(y_ptr + (i // N) * stride_ym + i % N, total.to(y_ptr.dtype.element_ty), mask=ok)


def w4a16_gemv(x, qweight, scales, zeros, group_size, out):
    (M, K), N = x.shape, qweight.shape[0]
    splits, block_n, block_b = (8, 64, 64) if x.is_cuda else (2, 32, 32)
    per_split = triton.cdiv(triton.cdiv(K // 2, splits), block_b) * block_b
    part = torch.empty(splits, M, N, dtype=torch.float32, device=x.device)
    tri.launch(w4_split_kernel, (triton.cdiv(N, block_n), M, splits), x, qweight, scales, zeros,
               part, M, N, K, x.stride(0), qweight.stride(0), scales.stride(0), per_split,
               GROUP=group_size, BLOCK_N=block_n, BLOCK_B=block_b)
    tri.launch(w4_reduce_kernel, (triton.cdiv(M * N, 128),), part, out, M * N, N, out.stride(0),
               SPLITS=splits, BLOCK=128)
'''


@pytest.mark.parametrize("what", list(KERNEL_CELLS.values()))
def test_a_differently_written_kernel_passes(module_from, what):
    other = module_from(OTHER, "other")
    getattr(tri, f"check_{what}")(graded(other, what))


# (kernel, old, new, words the failure must contain): each a classic mistake in the solution
MISTAKES = {
    "store without a mask": ("silu_mul", "out.to(out_ptr.dtype.element_ty), mask=mask)",
                             "out.to(out_ptr.dtype.element_ty))", "wrote outside"),
    "x loaded without the K mask": ("matvec", "x = tl.load(x_ptr + ks, mask=k_ok, other=0.0)",
                                    "x = tl.load(x_ptr + ks)", "NaN in the output"),
    "mean over the block, not the row": ("rmsnorm", "tl.sum(sq, axis=0) / C", "tl.sum(sq, axis=0) / BLOCK",
                                         "differ"),
    "scale forgotten": ("w8a16_gemv", "(acc * s).to(", "(acc).to(", "differ"),
    "the course's kernel called": ("w8a16_gemv", "acc += tl.sum(q *",
                                   "kernels.w8a16_matmul(x, q, s)\n        acc += tl.sum(q *", "Error"),
    "w4a16 store without a mask": ("w4a16_gemv", "acc.to(y_ptr.dtype.element_ty), mask=row_ok)",
                                   "acc.to(y_ptr.dtype.element_ty))", "wrote outside"),
    "nibbles swapped": ("w4a16_gemv", "lo, hi = byte & 0xF, byte >> 4", "lo, hi = byte >> 4, byte & 0xF",
                        "differ"),
    "zero point forgotten": ("w4a16_gemv", "- z[:, None]", "- 0.0 * z[:, None]", "differ"),
    "a grid for one row of x": ("w4a16_gemv", "grid = (triton.cdiv(N, block_n), M)",
                                "grid = (triton.cdiv(N, block_n), 1)", "never stored those outputs"),
}
# the w4a16 launcher's mistakes: the solution's module with w4a16_gemv redefined after it
_DEQUANT = """
    codes = torch.stack([qweight & 15, qweight >> 4], -1).flatten(1).float()
    w = (codes - zeros.repeat_interleave(group_size, 1)) * scales.repeat_interleave(group_size, 1)
"""
LAUNCHER_MISTAKES = {
    "y computed in torch": (_DEQUANT + "    out.copy_(x.float() @ w.T)\n",
                            "no kernel was launched through tri.launch"),
    "weight dequantized in torch": (_DEQUANT + """
    for m in range(x.shape[0]):
        tri.launch(matvec_kernel, (triton.cdiv(w.shape[0], 16),), w, x[m], out[m], *w.shape,
                   *w.stride(), BLOCK_N=16, BLOCK_K=32)
""", "a dequantized copy of W"),
    "launched around tri.launch": ("""
    w4a16_gemv_kernel[(triton.cdiv(qweight.shape[0], 16), x.shape[0])](
        x, qweight, scales, zeros, out, qweight.shape[0], x.shape[1], x.stride(0),
        qweight.stride(0), scales.stride(0), out.stride(0), GROUP=group_size, BLOCK_N=16)
""", "no kernel was launched through tri.launch"),
    "y copied into out after the kernel": ("""
    y = torch.empty_like(out)
    tri.launch(w4a16_gemv_kernel, (triton.cdiv(qweight.shape[0], 16), x.shape[0]), x, qweight,
               scales, zeros, y, qweight.shape[0], x.shape[1], x.stride(0), qweight.stride(0),
               scales.stride(0), y.stride(0), GROUP=group_size, BLOCK_N=16)
    out.copy_(y)
""", "changed after the last launch"),
    "the course's kernel launched": ("""
    from kernels.dequant_matmul import _w4a16_fma_kernel
    tri.launch(_w4a16_fma_kernel, (1,), x, qweight, scales, zeros, out)
""", "one of the course's kernels"),
}
# what a kernel's body looks like is not graded: these compute the right values and pass (the
# first two would not compile on a GPU, where the check then fails on its results); nor is
# torch preparing `out` before the launch
NOT_GRADED = {
    "torch inside the kernel": ("w4a16_gemv", "acc += s * tl.sum(part",
                                "torch.zeros(1)\n        acc += s * tl.sum(part"),
    "the interpreter's handle": ("matvec", "acc += tl.sum(w *", "w.handle\n        acc += tl.sum(w *"),
    "a course helper": ("w4a16_gemv", "lo, hi = byte & 0xF, byte >> 4",
                        "lo, hi = _uint_to_f32(byte & 0xF), _uint_to_f32(byte >> 4)"),
    "out zeroed before the launch": ("w4a16_gemv", "    grid = (triton.cdiv(N, block_n), M)",
                                     "    out.zero_()\n    grid = (triton.cdiv(N, block_n), M)"),
}


def _variant(module_from, name: str, old: str, new: str):
    src = _solution_source().replace(
        "import kernels\n", "import kernels\nfrom kernels.dequant_matmul import _uint_to_f32\n")
    assert src.count(old) >= 1, old
    return module_from(src.replace(old, new), re.sub(r"\W", "_", name))


@pytest.mark.parametrize("mistake", list(MISTAKES))
def test_classic_mistakes_fail_and_say_why(module_from, mistake):
    what, old, new, words = MISTAKES[mistake]
    bad = _variant(module_from, mistake, old, new)
    with pytest.raises(Exception, match=re.escape(words)):
        getattr(tri, f"check_{what}")(graded(bad, what))


@pytest.mark.parametrize("mistake", list(LAUNCHER_MISTAKES))
def test_a_w4a16_launcher_that_does_not_store_y_by_its_kernel_fails(module_from, mistake):
    body, words = LAUNCHER_MISTAKES[mistake]
    src = _solution_source() + "\n\ndef w4a16_gemv(x, qweight, scales, zeros, group_size, out):" + body
    bad = module_from(src, re.sub(r"\W", "_", mistake))
    with pytest.raises(AssertionError, match=re.escape(words)):
        tri.check_w4a16_gemv(bad.w4a16_gemv)


@pytest.mark.parametrize("variant", list(NOT_GRADED))
def test_how_a_kernel_is_written_is_not_graded(module_from, variant):
    what, old, new = NOT_GRADED[variant]
    getattr(tri, f"check_{what}")(graded(_variant(module_from, variant, old, new), what))


def test_only_a_triton_kernel_launches_and_the_courses_fail_on_their_signatures(solution):
    import kernels.dequant_matmul as dm
    import kernels.gemv as gv

    def plain(x_ptr, q_ptr, s_ptr, y_ptr, N, K, sxm, sqn, sym, BLOCK_N, BLOCK_K):
        raise AssertionError("never launched")
    for not_a_kernel in (plain, solution.matvec_kernel.fn):
        with pytest.raises(AssertionError, match="expected a @triton.jit kernel, got function"):
            tri.check_w8a16_gemv(not_a_kernel)
    for course in (dm._w8a16_fma_kernel, gv._gemv_w8_kernel, triton.jit(gv._gemv_w8_kernel.fn)):
        with pytest.raises(TypeError, match="missing 9 required positional arguments"):
            tri.check_w8a16_gemv(course)


def test_what_runs_is_the_kernels_own_function(module_from):
    """The code that runs is the @triton.jit function's: swapped for another kernel's, it fails;
    Python attached to the kernel object (a pre-run hook, a replaced `run`) never runs."""
    swapped = module_from(_solution_source(), "swapped")
    swapped.matvec_kernel.fn.__code__ = module_from(OTHER, "other").silu_mul_kernel.fn.__code__
    with pytest.raises(Exception):                  # silu's code, launched as a matvec: fails
        tri.check_matvec(swapped.matvec_kernel)
    hooked = module_from(_solution_source(), "hooked")

    def hook(*args, **kwargs):
        raise AssertionError("the hook ran")
    hooked.silu_mul_kernel.add_pre_run_hook(hook)
    hooked.silu_mul_kernel.run = hook
    tri.check_silu_mul(hooked.silu_mul_kernel)


@pytest.mark.parametrize("fmt", ["w8a16", "w4a16"])
def test_the_gpu_speed_check_runs_as_a_dry_run(solution, fmt):
    r = tri.check_gemv_speed(fmt, graded(solution, f"{fmt}_gemv"), dry_run=True, N=32,
                             K=128, group_size=32, warmup=1, repeats=2)
    assert r["dry_run"] is True
    assert r["student_s"] > 0 and r["reference_s"] > 0 and r["copy_GBps"] > 0
    assert r["fraction_of_copy"] == pytest.approx(r["student_GBps"] / r["copy_GBps"])
    assert r["ratio_to_reference"] == pytest.approx(r["reference_s"] / r["student_s"])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("fmt", ["w8a16", "w4a16"])
def test_gpu_speed_checks_pass(solution, fmt, record_property):
    """On a GPU: the notebook's GEMV kernels above GPU_SPEED's thresholds, at the check's own
    4096 x 4096 (the reports go to make gpu-check's summary)."""
    r = tri.check_gemv_speed(fmt, graded(solution, f"{fmt}_gemv"))
    record_property(f"speed lab 04 {fmt} kernel", json.dumps({**r, **tri.GPU_SPEED}, default=str))
    assert r["dry_run"] is False
    assert r["fraction_of_copy"] >= tri.GPU_SPEED["min_fraction_of_copy"]
    assert r["ratio_to_reference"] >= tri.GPU_SPEED["min_ratio_to_reference"]


def test_the_speed_check_fails_below_its_thresholds():
    # as on a GPU (not a dry run): 2x slower than the course, 5% of copy
    report = {"student_s": 2.0, "reference_s": 1.0, "student_GBps": 5.0, "copy_GBps": 100.0,
              "fraction_of_copy": 0.05, "ratio_to_reference": 0.5, "dry_run": False}
    with pytest.raises(AssertionError, match="5% of a device copy"):
        kc.require_speed(report, "w8a16", min_fraction_of_copy=0.1, min_ratio_to_reference=0.25)
    assert kc.require_speed(report, "w8a16", min_fraction_of_copy=0.04,
                            min_ratio_to_reference=0.25) is report
    assert kc.require_speed({**report, "dry_run": True}, "w8a16", min_fraction_of_copy=0.1,
                            min_ratio_to_reference=0.25)["dry_run"]


def test_the_tracer_kernels_show_programs_masks_and_steps():
    owner = program_map(100, 32)
    assert owner.tolist() == [i // 32 for i in range(100)]
    prog, step = tile_walk(40, 96, 16, 32)
    n, k = torch.meshgrid(torch.arange(40), torch.arange(96), indexing="ij")
    assert torch.equal(prog, (n // 16).int()) and torch.equal(step, (k // 32).int())
    with pytest.raises(ValueError, match="power of two"):
        tile_walk(4, 4, 3, 4)


def test_launchers_refuse_bad_arguments(solution):
    with pytest.raises(ValueError, match="power of two"):
        tri.silu_mul(solution.silu_mul_kernel, torch.ones(4), torch.ones(4), block=24)
    with pytest.raises(ValueError, match="multiple of group_size"):
        tri.run_w4a16_gemv(solution.w4a16_gemv, torch.ones(1, 48),
                           torch.zeros(4, 24, dtype=torch.uint8), torch.ones(4, 1),
                           torch.ones(4, 1), 32)
    with pytest.raises(ValueError, match="int8"):
        tri.w8a16_gemv(solution.w8a16_gemv_kernel, torch.ones(1, 8), torch.ones(4, 8), torch.ones(4))


def test_the_checks_launch_the_students_kernel_in_its_kernel_only(served, solution, module_from):
    """Lab 04 in the tester: the checks and the launchers get the student's kernels as
    StudentFunctions; every launch runs on the student's side, on inputs built there (strided
    rows, a transposed matrix, NaN fences), and the fences still catch a load or a store without
    a mask; a launcher's ValueError crosses as one. The w4a16 launcher is the student's: it runs
    there too, and what its launches stored is judged there and read back as plain figures."""
    serve, launches = served
    bad_store = _variant(module_from, "across_store", *MISTAKES["store without a mask"][1:3])
    bad_load = _variant(module_from, "across_load", *MISTAKES["x loaded without the K mask"][1:3])
    in_torch = module_from(_solution_source() + "\n\ndef w4a16_gemv(x, qweight, scales, zeros, "
                           "group_size, out):" + LAUNCHER_MISTAKES["y computed in torch"][0],
                           "across_torch")
    names = {w: graded(solution, w) for w in KERNEL_CELLS.values()}
    thread, handle = serve({**names, "bad_store": bad_store.silu_mul_kernel,
                            "bad_load": bad_load.matvec_kernel, "in_torch": in_torch.w4a16_gemv})
    assert all(type(h).__name__ == "StudentFunction" for h in handle.values())
    for what in KERNEL_CELLS.values():
        getattr(tri, f"check_{what}")(handle[what])
    with pytest.raises(AssertionError, match="no kernel was launched through tri.launch"):
        tri.check_w4a16_gemv(handle["in_torch"])
    ins = tri.case_inputs("w4a16_gemv", tri.CASES["w4a16_gemv"][0], seed=3)
    assert torch.allclose(tri.run_w4a16_gemv(handle["w4a16_gemv"], *ins, 32),
                          tri.w4a16_gemv_spec(*ins, 32), atol=1e-4)
    W, x = torch.randn(40, 96), torch.randn(96)
    assert torch.allclose(tri.matvec(handle["matvec"], W, x, block_n=16, block_k=64),
                          W @ x, atol=1e-4)
    with pytest.raises(AssertionError, match="wrote outside"):
        tri.check_silu_mul(handle["bad_store"])
    with pytest.raises(AssertionError, match="NaN in the output"):
        tri.check_matvec(handle["bad_load"])
    with pytest.raises(ValueError, match="power of two"):
        tri.silu_mul(handle["silu_mul"], torch.ones(4), torch.ones(4), block=24)
    assert launches and all(t is thread for t in launches), "a launch ran in the tester"
