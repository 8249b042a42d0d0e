"""Lab 07's checks of the student's Triton kernels (autograder/labs/lab07_triton.py:
`check_decode_kernel`, `check_split_kernel`, the launchers and the speed path).

(a) the notebook's own solution kernels, taken from the source notebook's solution cells (so
    the two stay in sync), pass both checks;
(b) a second correct kernel pair, written here independently of the notebook (one block of the
    table per step instead of tiles of positions, one query head at a time, no tl.dot, exp2 with
    log2(e) folded into the scale, a finite starting max), passes too: the checks grade the
    result, not the notebook's way of getting it;
(c) the classic mistakes fail, each with a message that names it: no mask on the ragged tail,
    no running max, the wrong GQA head mapping, an unmasked store, 0 / 0 in an empty split, lse
    in the wrong log base; so do a plain Python function (not a Triton kernel), kernels whose
    bodies call torch or the course's kernels wrongly, and the course's own kernel handed in
    (its signature differs): each judged by what it does, not by how it is written; Python
    attached to a kernel object never runs;
(d) the GPU speed path runs on the CPU with dry_run and returns a well-formed report;
(e) as graded, the checks launch the student's kernels in the student's kernel only (the tester
    sends seeds and case sizes, and reads back the fenced buffers), and the allocator's probe
    replays operations there on a fresh pool, returning plain states.

Without a GPU everything runs in Triton's interpreter on the checks' tiny cases (about a second
per check).
"""
from __future__ import annotations

import importlib.util
import json
import re
import warnings
from pathlib import Path

import pytest
import test_student_kernels
import torch

pytest.importorskip("triton")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import kernels  # noqa: E402,F401  (sets TRITON_INTERPRET without a GPU, before any kernel below)
from autograder.labs import lab07_triton  # noqa: E402
from kernels import paged_attention as pa  # noqa: E402
from kernels.paged_attention import _attend  # noqa: E402  (a course kernel, for the attack below)
from kernels.paged_attention_ref import paged_attention_decode_ref, slot_mapping_ref  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
DEV = "cuda" if torch.cuda.is_available() else "cpu"     # where the kernels run
NOTEBOOK = REPO / "labs" / "07_paged_attention" / "07_paged_attention.ipynb"
KERNEL_CELLS = ("07_decode_kernel", "07_split_kernel")
served = test_student_kernels.served        # the fixture: a tester's side of a socket to a kernel


# --- the notebook's solution kernels, loaded from its cells ---------------------------------------
def solution_source() -> str:
    cells = {c["metadata"].get("nbgrader", {}).get("grade_id"): "".join(c["source"])
             for c in json.loads(NOTEBOOK.read_text())["cells"] if c["cell_type"] == "code"}
    missing = [g for g in KERNEL_CELLS if g not in cells]
    assert not missing, f"{NOTEBOOK.name} has no cell {missing}"
    return "\n\n".join(cells[g] for g in KERNEL_CELLS)


def load_kernels(tmp_path: Path, source: str, name: str):
    """The kernels of `source` as a module. (Triton reads a kernel's source with inspect, so the
    code goes to a real file, as a notebook cell goes to IPython's cache.)"""
    path = tmp_path / f"{name}.py"
    path.write_text("import triton\nimport triton.language as tl\n\n\n" + source + "\n")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def mutant(tmp_path: Path, name: str, *replacements: tuple[str, str]):
    """The notebook's kernels with each (old, new) replaced (old must occur)."""
    source = solution_source()
    for old, new in replacements:
        assert old in source, f"{name}: {old!r} is not in the notebook's kernels any more"
        source = source.replace(old, new)
    return load_kernels(tmp_path, source, name)


@pytest.fixture(scope="module")
def solution(tmp_path_factory):
    return load_kernels(tmp_path_factory.mktemp("solution"), solution_source(), "nb_solution")


# --- (a) the notebook's kernels ---------------------------------------------------------------------
def test_the_notebooks_decode_kernel_passes(solution):
    assert lab07_triton.check_decode_kernel(solution.paged_decode_kernel, speed=None) == \
        {"cases": len(lab07_triton.DECODE_CASES), "speed": None}


def test_the_notebooks_split_kernel_passes(solution):
    assert lab07_triton.check_split_kernel(solution.paged_split_kernel, speed=None) == \
        {"cases": len(lab07_triton.SPLIT_CASES), "speed": None}


def test_speed_auto_is_skipped_without_a_gpu(solution):
    if torch.cuda.is_available():
        pytest.skip("on a GPU, speed='auto' times the kernel (test_gpu_speed_checks_pass)")
    assert lab07_triton.check_decode_kernel(solution.paged_decode_kernel)["speed"] is None
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        lab07_triton.check_decode_kernel(solution.paged_decode_kernel, speed="gpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_speed_checks_pass(solution, record_property):
    """On a GPU: every case compiled, and both kernels above KERNEL_SPEED's thresholds (the
    reports go to make gpu-check's summary)."""
    for what, check, kernel in (
            ("decode", lab07_triton.check_decode_kernel, solution.paged_decode_kernel),
            ("split", lab07_triton.check_split_kernel, solution.paged_split_kernel)):
        report = check(kernel, speed="gpu")["speed"]
        record_property(f"speed lab 07 {what} kernel",
                        json.dumps({**report, **lab07_triton.KERNEL_SPEED}, default=str))
        assert report["fraction_of_copy"] >= lab07_triton.KERNEL_SPEED["min_fraction_of_copy"]
        assert report["ratio_to_reference"] >= lab07_triton.KERNEL_SPEED["min_ratio_to_reference"]


# --- (b) a second kernel pair, written independently ------------------------------------------------
@triton.jit
def decode_by_blocks(q_ptr, k_ptr, v_ptr, table_ptr, lens_ptr, out_ptr,
                     scale, K, max_blocks, block_size, G, H,
                     BLOCK_T: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_H: tl.constexpr):
    seq = tl.program_id(0)
    kv = tl.program_id(1)
    n_ctx = tl.load(lens_ptr + seq)
    dims = tl.arange(0, BLOCK_H)
    lanes = tl.arange(0, BLOCK_T)
    dim_ok = dims < H
    for g in range(0, G):                                   # one query head at a time
        head = seq * G * K + kv * G + g
        qv = tl.load(q_ptr + head * H + dims, mask=dim_ok, other=0.0).to(tl.float32)
        qv = qv * (scale * 1.4426950408889634)              # scores in log2 units: exp2
        top = tl.full((1,), -1.0e30, tl.float32)
        total = tl.zeros((1,), tl.float32)
        acc = tl.zeros((BLOCK_H,), tl.float32)
        for j in range(0, tl.cdiv(n_ctx, block_size)):     # block by block through the table
            block_id = tl.load(table_ptr + seq * max_blocks + j).to(tl.int64)
            for r0 in range(0, block_size, BLOCK_T):        # rows of the block, BLOCK_T at once
                r = r0 + lanes
                ok = (r < block_size) & (j * block_size + r < n_ctx)
                rows = ((block_id * block_size + r) * K + kv) * H
                both = ok[:, None] & dim_ok[None, :]
                kt = tl.load(k_ptr + rows[:, None] + dims[None, :], mask=both,
                             other=0.0).to(tl.float32)
                x = tl.where(ok, tl.sum(kt * qv[None, :], axis=1), -1.0e30)
                new_top = tl.maximum(top, tl.max(x, axis=0))
                w = tl.where(ok, tl.exp2(x - new_top), 0.0)
                shrink = tl.exp2(top - new_top)
                vt = tl.load(v_ptr + rows[:, None] + dims[None, :], mask=both,
                             other=0.0).to(tl.float32)
                total = total * shrink + tl.sum(w, axis=0)
                acc = acc * shrink + tl.sum(w[:, None] * vt, axis=0)
                top = new_top
        tl.store(out_ptr + head * H + dims, (acc / total).to(out_ptr.dtype.element_ty),
                 mask=dim_ok)


@triton.jit
def split_by_blocks(q_ptr, k_ptr, v_ptr, table_ptr, lens_ptr, part_ptr, lse_ptr,
                    scale, K, max_blocks, block_size, G, H, tokens_per_split, S,
                    BLOCK_T: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_H: tl.constexpr):
    seq = tl.program_id(0)
    kv = tl.program_id(1)
    piece = tl.program_id(2)
    lo = piece * tokens_per_split                           # a whole number of blocks
    hi = tl.minimum(lo + tokens_per_split, tl.load(lens_ptr + seq))
    dims = tl.arange(0, BLOCK_H)
    lanes = tl.arange(0, BLOCK_T)
    dim_ok = dims < H
    one = tl.arange(0, 1)
    for g in range(0, G):
        head = seq * G * K + kv * G + g
        qv = tl.load(q_ptr + head * H + dims, mask=dim_ok, other=0.0).to(tl.float32)
        qv = qv * (scale * 1.4426950408889634)
        top = tl.full((1,), -1.0e30, tl.float32)
        total = tl.zeros((1,), tl.float32)
        acc = tl.zeros((BLOCK_H,), tl.float32)
        for j in range(lo // block_size, tl.cdiv(hi, block_size)):
            block_id = tl.load(table_ptr + seq * max_blocks + j).to(tl.int64)
            for r0 in range(0, block_size, BLOCK_T):
                r = r0 + lanes
                ok = (r < block_size) & (j * block_size + r < hi)
                rows = ((block_id * block_size + r) * K + kv) * H
                both = ok[:, None] & dim_ok[None, :]
                kt = tl.load(k_ptr + rows[:, None] + dims[None, :], mask=both,
                             other=0.0).to(tl.float32)
                x = tl.where(ok, tl.sum(kt * qv[None, :], axis=1), -1.0e30)
                new_top = tl.maximum(top, tl.max(x, axis=0))
                w = tl.where(ok, tl.exp2(x - new_top), 0.0)
                shrink = tl.exp2(top - new_top)
                vt = tl.load(v_ptr + rows[:, None] + dims[None, :], mask=both,
                             other=0.0).to(tl.float32)
                total = total * shrink + tl.sum(w, axis=0)
                acc = acc * shrink + tl.sum(w[:, None] * vt, axis=0)
                top = new_top
        seen = total > 0.0
        denom = tl.where(seen, total, 1.0)
        out = tl.where(seen, acc / denom, 0.0)
        log_sum = tl.where(seen, (top + tl.log2(denom)) * 0.6931471805599453, float("-inf"))
        idx = head * S + piece
        tl.store(part_ptr + idx * H + dims, out, mask=dim_ok)
        tl.store(lse_ptr + idx + one, log_sum)


def test_an_independently_written_kernel_pair_passes():
    lab07_triton.check_decode_kernel(decode_by_blocks, speed=None)
    lab07_triton.check_split_kernel(split_by_blocks, speed=None)


def test_nan_in_discarded_lanes_passes_without_a_word_on_stderr(tmp_path):
    """A correct kernel that also masks the padding rows' scores to -inf computes inf - inf =
    NaN in lanes it never stores. NumPy (the interpreter) would warn on stderr, which nbgrader
    counts as a failed cell; the launchers keep it quiet and the check judges the output."""
    variant = mutant(tmp_path, "padding_rows", (
        "        s = tl.where(t_ok[None, :], s, float(\"-inf\"))\n        m_new",
        "        s = tl.where(t_ok[None, :] & (offs_g < G)[:, None], s, float(\"-inf\"))\n"
        "        m_new"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lab07_triton.check_decode_kernel(variant.paged_decode_kernel, speed=None)
        with pytest.raises(AssertionError, match="running max"):
            lab07_triton.check_decode_kernel(mutant(tmp_path, "nomax_quiet", NO_RUNNING_MAX)
                                      .paged_decode_kernel, speed=None)
    assert not [w for w in caught if issubclass(w.category, RuntimeWarning)], \
        [str(w.message) for w in caught]


# --- (c) the classic mistakes -----------------------------------------------------------------------
NO_RUNNING_MAX = ("        m_new = tl.maximum(m, tl.max(s, axis=1))\n",
                  "        m_new = tl.zeros((BLOCK_G,), tl.float32)\n")
NO_TAIL_MASK = [("blk = tl.load(table_ptr + b * max_blocks + pos // block_size, mask=t_ok, other=0)",
                 "blk = tl.load(table_ptr + b * max_blocks + pos // block_size)"),
                ("k = tl.load(k_ptr + kv_off, mask=kv_mask, other=0.0)", "k = tl.load(k_ptr + kv_off)"),
                ("v = tl.load(v_ptr + kv_off, mask=kv_mask, other=0.0)", "v = tl.load(v_ptr + kv_off)")]


@pytest.mark.parametrize("which", ["decode", "split"])
def test_no_mask_on_the_ragged_tail_fails(tmp_path, which):
    bad = mutant(tmp_path, f"nomask_{which}", *NO_TAIL_MASK)
    with pytest.raises(AssertionError, match="NaN.*mask"):
        if which == "decode":
            lab07_triton.check_decode_kernel(bad.paged_decode_kernel, speed=None)
        else:
            lab07_triton.check_split_kernel(bad.paged_split_kernel, speed=None)


@pytest.mark.parametrize("which", ["decode", "split"])
def test_softmax_without_the_running_max_fails(tmp_path, which):
    """Exact on ordinary scores; NaN once they pass 88.7 (the wrong submission's mistake)."""
    bad = mutant(tmp_path, f"nomax_{which}", NO_RUNNING_MAX)
    kernel = bad.paged_decode_kernel if which == "decode" else bad.paged_split_kernel
    q, kc, vc, tables, lens = lab07_triton.kernel_case([13, 6, 1], 4, 2, 16, 4, seed=11, device=DEV)
    if which == "decode":             # the visible test's case passes...
        got = lab07_triton.launch_decode(kernel, q, kc, vc, tables, lens)
        assert torch.allclose(got, paged_attention_decode_ref(q, kc, vc, tables, lens),
                              atol=1e-4)
    with pytest.raises(AssertionError, match="running max"):     # ...the hidden one does not
        (lab07_triton.check_decode_kernel if which == "decode" else lab07_triton.check_split_kernel)(
            kernel, speed=None)


def test_the_wrong_gqa_head_mapping_fails(tmp_path):
    """Query head n reading KV head n % K (interleaved) instead of n // G."""
    bad = mutant(tmp_path, "gqa", ("    heads = kvh * G + offs_g                                  "
                                   "# the query heads of this KV head",
                                   "    heads = offs_g * K + kvh"))
    with pytest.raises(AssertionError, match=r"differ from the reference.*KV head n // G"):
        lab07_triton.check_decode_kernel(bad.paged_decode_kernel, speed=None)


def test_a_store_without_a_mask_fails(tmp_path):
    bad = mutant(tmp_path, "store", ("out.to(out_ptr.dtype.element_ty), mask=q_mask)",
                                     "out.to(out_ptr.dtype.element_ty))"))
    with pytest.raises(AssertionError, match="wrote outside its output tensor"):
        lab07_triton.check_decode_kernel(bad.paged_decode_kernel, speed=None)


def test_forgetting_the_rescale_fails(tmp_path):
    bad = mutant(tmp_path, "rescale", ("acc = acc * alpha[:, None] + tl.dot(p, v",
                                       "acc = acc + tl.dot(p, v"))
    with pytest.raises(AssertionError, match="rescaled by exp"):
        lab07_triton.check_split_kernel(bad.paged_split_kernel, speed=None)


def test_an_empty_split_dividing_by_zero_fails(tmp_path):
    bad = mutant(tmp_path, "empty", ("part = acc / safe_l[:, None]", "part = acc / l[:, None]"))
    with pytest.raises(AssertionError, match="empty split"):
        lab07_triton.check_split_kernel(bad.paged_split_kernel, speed=None)


def test_lse_in_log2_fails(tmp_path):
    bad = mutant(tmp_path, "log2", ("m + tl.log(safe_l)", "m + tl.log2(safe_l)"))
    with pytest.raises(AssertionError, match="lse values differ"):
        lab07_triton.check_split_kernel(bad.paged_split_kernel, speed=None)


def torch_decode(q_ptr, k_ptr, v_ptr, table_ptr, lens_ptr, out_ptr, scale, K, max_blocks,
                 block_size, G, H, BLOCK_T=16, BLOCK_G=16, BLOCK_H=16):
    """A plain Python function in the kernel's signature doing the work in torch."""
    out_ptr.copy_(paged_attention_decode_ref(q_ptr, k_ptr, v_ptr, table_ptr, lens_ptr, scale))


@triton.jit
def calls_torch(q_ptr, k_ptr, v_ptr, table_ptr, lens_ptr, out_ptr, scale, K, max_blocks,
                block_size, G, H, BLOCK_T: tl.constexpr, BLOCK_G: tl.constexpr,
                BLOCK_H: tl.constexpr):
    torch.ops.aten.copy_(out_ptr, q_ptr)


@triton.jit
def calls_the_course(q_ptr, k_ptr, v_ptr, table_ptr, lens_ptr, out_ptr, scale, K, max_blocks,
                     block_size, G, H, BLOCK_T: tl.constexpr, BLOCK_G: tl.constexpr,
                     BLOCK_H: tl.constexpr):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    q = tl.zeros((BLOCK_G, BLOCK_H), tl.float32)
    acc, m, l = _attend(q, k_ptr, v_ptr, table_ptr, b, kvh, 0, tl.load(lens_ptr + b), H,
                        block_size, max_blocks, 1, 0, 0, 0, 0, 0, 0, 0, 0, BLOCK_G, BLOCK_T,
                        BLOCK_H, tl.float32, True)


@pytest.mark.parametrize("kernel,message", [
    (torch_decode, "expected a @triton.jit kernel, got function"),
    (calls_torch, "Expected a value of type 'Tensor'|multiple values for argument"),
    (calls_the_course, "NaN or inf in the output|multiple values for argument"),
    (pa._decode_kernel, "missing .* required positional arguments"),
])
def test_a_kernel_that_is_not_the_students_triton_fails(kernel, message):
    with pytest.raises(Exception, match=message):
        lab07_triton.check_decode_kernel(kernel, speed=None)
    with pytest.raises(Exception, match=message):
        lab07_triton.check_split_kernel(kernel, speed=None)


@triton.jit
def idle_kernel(q_ptr, k_ptr, v_ptr, table_ptr, lens_ptr, out_ptr, scale, K, max_blocks,
                block_size, G, H, BLOCK_T: tl.constexpr, BLOCK_G: tl.constexpr,
                BLOCK_H: tl.constexpr):
    tl.program_id(0)                                     # passes the source check, does nothing


def torch_decode_into(q, kc, vc, tables, lens, out, scale, K, max_blocks, block_size, G, H,
                      **meta):
    """The decode in torch, in the kernel's argument order, writing into out."""
    B, N, D = q.shape
    for b in range(B):
        pos = torch.arange(int(lens[b]), device=q.device)
        slots = tables[b, pos // block_size].long() * block_size + pos % block_size
        k = kc.reshape(-1, K, D)[slots].float()
        v = vc.reshape(-1, K, D)[slots].float()
        s = torch.einsum("kgd,lkd->kgl", q[b].float().view(K, G, D), k) * scale
        out[b] = torch.einsum("kgl,lkd->kgd", s.softmax(-1), v).reshape(N, D).to(out.dtype)


def test_python_attached_to_the_kernel_object_never_runs():
    """Triton's public pre-run hooks run Python at each launch, and an instance attribute can
    replace `run`: with either, a do-nothing kernel plus torch once passed. The launchers run a
    kernel rebuilt from the Python function, so the do-nothing kernel is judged as one."""
    q, kc, vc, tables, lens = lab07_triton.kernel_case([13, 6], 4, 2, 16, 4, seed=3, device=DEV)
    want = paged_attention_decode_ref(q, kc, vc, tables, lens)
    out = torch.empty_like(q)
    torch_decode_into(q, kc, vc, tables, lens, out, 0.25, 2, tables.shape[1], 4, 2, 16)
    assert torch.allclose(out, want, atol=1e-5)                  # the hook would be right

    hooked = triton.jit(idle_kernel.fn)
    hooked.add_pre_run_hook(torch_decode_into)
    out = lab07_triton.launch_decode(hooked, q, kc, vc, tables, lens, out=torch.full_like(q, 7.0))
    assert bool((out == 7.0).all()), "the hook ran"
    with pytest.raises(AssertionError, match="NaN or inf in the output"):
        lab07_triton.check_decode_kernel(hooked, speed=None)

    replaced = triton.jit(idle_kernel.fn)
    replaced.run = lambda *args, grid, warmup, **kw: torch_decode_into(*args, **kw)
    with pytest.raises(AssertionError, match="NaN or inf in the output"):
        lab07_triton.check_decode_kernel(replaced, speed=None)


def test_the_released_stub_scores_zero(tmp_path):
    """What nbgrader releases: the bodies replaced by `raise NotImplementedError()`."""
    stub_source, n = re.subn(r"    ### BEGIN SOLUTION\n.*?### END SOLUTION",
                             "    # YOUR CODE HERE\n    raise NotImplementedError()",
                             solution_source(), flags=re.S)
    assert n == 2
    stub = load_kernels(tmp_path, stub_source, "stub")
    with pytest.raises(Exception, match="NotImplementedError"):
        lab07_triton.check_decode_kernel(stub.paged_decode_kernel, speed=None)
    with pytest.raises(Exception, match="NotImplementedError"):
        lab07_triton.check_split_kernel(stub.paged_split_kernel, speed=None)


# --- (d) the speed path, dry --------------------------------------------------------------------
@pytest.mark.skipif(torch.cuda.is_available(), reason="a dry run is for machines without a GPU")
def test_the_speed_path_runs_dry_on_the_cpu(solution):
    keys = {"student_s", "reference_s", "student_GBps", "copy_GBps", "fraction_of_copy",
            "ratio_to_reference", "dry_run"}
    decode = lab07_triton.check_decode_kernel(solution.paged_decode_kernel, speed="dry_run")
    split = lab07_triton.check_split_kernel(solution.paged_split_kernel, speed="dry_run")
    for report in (decode["speed"], split["speed"]):
        assert keys <= set(report) and report["dry_run"] is True
        assert all(report[k] > 0 for k in keys - {"dry_run"}), report
    assert split["speed"]["num_splits"] == 2
    # the timed call is checked first: a wrong kernel gets no figures
    with pytest.raises(AssertionError, match="timing case"):
        lab07_triton.kernel_speed("decode", decode_by_blocks_wrong_heads, dry_run=True)


@triton.jit
def decode_by_blocks_wrong_heads(q_ptr, k_ptr, v_ptr, table_ptr, lens_ptr, out_ptr,
                                 scale, K, max_blocks, block_size, G, H,
                                 BLOCK_T: tl.constexpr, BLOCK_G: tl.constexpr,
                                 BLOCK_H: tl.constexpr):
    # decode_by_blocks with every head of the program's group set to the group's first
    decode_by_blocks(q_ptr, k_ptr, v_ptr, table_ptr, lens_ptr, out_ptr, scale, K, max_blocks,
                     block_size, 1, H, BLOCK_T, BLOCK_G, BLOCK_H)


# --- the launchers' helpers ---------------------------------------------------------------------
def test_tile_walk_follows_the_slot_formula():
    table = torch.tensor([7, 2, 5, 11, 0, 9, -1], dtype=torch.int32)
    tiles = lab07_triton.tile_walk(table, 21, 4, 16)
    assert [t["positions"][0] for t in tiles] == [0, 16]
    slots = [s for t in tiles for s, ok in zip(t["slot"], t["mask"]) if ok]
    assert slots == slot_mapping_ref(table, torch.arange(21), 4).tolist()
    assert sum(not ok for t in tiles for ok in t["mask"]) == 32 - 21


def test_the_launchers_refuse_bad_arguments(solution):
    q, kc, vc, tables, lens = lab07_triton.kernel_case([5], 4, 2, 16, 4)
    with pytest.raises(ValueError, match="block_t must be a power of two"):
        lab07_triton.launch_decode(solution.paged_decode_kernel, q, kc, vc, tables, lens, block_t=24)
    with pytest.raises(ValueError, match="share one float dtype"):
        lab07_triton.launch_decode(solution.paged_decode_kernel, q.half(), kc, vc, tables, lens)
    with pytest.raises(ValueError, match="block_tables must be int32"):
        lab07_triton.launch_decode(solution.paged_decode_kernel, q, kc, vc, tables.long(), lens)
    with pytest.raises(ValueError, match="num_splits must be a positive int"):
        lab07_triton.launch_split(solution.paged_split_kernel, q, kc, vc, tables, lens, 0)


# --- (e) with the tests in the tester ------------------------------------------------------------
def test_the_checks_launch_the_students_kernels_in_its_kernel_only(served, solution, tmp_path):
    """Lab 07 in the tester (the `served` fixture of test_student_kernels.py): the checks and the
    launchers get the student's kernels as StudentFunctions, every launch runs on the student's
    side on the fenced cases built there, and the fences still catch a missing mask."""
    serve, launches = served
    bad = mutant(tmp_path, "across_store", ("out.to(out_ptr.dtype.element_ty), mask=q_mask)",
                                            "out.to(out_ptr.dtype.element_ty))"))
    tail = mutant(tmp_path, "across_tail", *NO_TAIL_MASK)
    thread, handle = serve({"paged_decode_kernel": solution.paged_decode_kernel,
                            "paged_split_kernel": solution.paged_split_kernel,
                            "bad_store": bad.paged_decode_kernel,
                            "no_tail_mask": tail.paged_split_kernel})
    assert lab07_triton.check_decode_kernel(handle["paged_decode_kernel"], speed=None)["cases"] \
        == len(lab07_triton.DECODE_CASES)
    assert lab07_triton.check_split_kernel(handle["paged_split_kernel"], speed=None)["cases"] \
        == len(lab07_triton.SPLIT_CASES)
    q, kc, vc, tables, lens = lab07_triton.kernel_case([13, 6, 1], 4, 2, 16, 4, seed=11)
    got = lab07_triton.launch_decode(handle["paged_decode_kernel"], q, kc, vc, tables, lens)
    assert torch.allclose(got, paged_attention_decode_ref(q, kc, vc, tables, lens), atol=1e-4)
    with pytest.raises(AssertionError, match="wrote outside its output tensor"):
        lab07_triton.check_decode_kernel(handle["bad_store"], speed=None)
    with pytest.raises(AssertionError, match="NaN.*mask"):
        lab07_triton.check_split_kernel(handle["no_tail_mask"], speed=None)
    assert launches and all(t is thread for t in launches), "a launch ran in the tester"


def _allocator():
    """The notebook's allocator cells, run with lab07's BlockPool."""
    cells = {c["metadata"].get("nbgrader", {}).get("grade_id"): "".join(c["source"])
             for c in json.loads(NOTEBOOK.read_text())["cells"] if c["cell_type"] == "code"}
    from autograder.labs import lab07
    namespace = {"BlockPool": lab07.BlockPool}
    exec(cells["07_allocator"] + "\n" + cells["07_cow"], namespace)
    return {k: namespace[k] for k in ("allocate", "free_seq", "fork", "append_slot")}


def test_the_allocator_probe_replays_on_a_fresh_pool_in_the_kernel(served):
    """lab07.pool_run builds the pool where the student's functions live and returns each
    operation's result and the pool's state as plain values; a table shared by mistake between
    parent and child shows in the states."""
    from autograder.labs import lab07
    serve, _ = served
    fns = _allocator()

    def shares_the_list(pool, parent_id, child_id):            # fork without copying the table
        fns["fork"](pool, parent_id, child_id)
        pool.tables[child_id] = pool.tables[parent_id]
        return pool.tables[child_id]
    _, h = serve({**fns, "shares_the_list": shares_the_list})
    ops = [("allocate", 0, 6), ("fork", 0, 1), ("append", 0), ("allocate", 2, 40), ("free", 0)]
    steps = lab07.pool_run({"allocate": h["allocate"], "fork": h["fork"],
                            "append": h["append_slot"], "free": h["free_seq"]}, ops, 8, 4)
    assert [s["result"] for s in steps] == [[0, 1], [0, 1], [(1, 2)], "RuntimeError", None]
    assert steps[2]["tables"] == {0: [0, 2], 1: [0, 1]} and steps[2]["ref_count"][:3] == [2, 1, 1]
    assert steps[4]["free"] == [3, 4, 5, 6, 7, 2] and steps[4]["lengths"] == {1: 6}
    wrong = lab07.pool_run({"allocate": h["allocate"], "fork": h["shares_the_list"],
                            "append": h["append_slot"]}, ops[:3], 8, 4)
    assert wrong[2]["tables"][1] == [0, 2], "the shared list shows in the child's table"


# ---- the split-count design task (07_num_splits_test): graded by the model's time, not a shape --
def _split_test_cell() -> str:
    nb = json.loads((REPO / "labs" / "07_paged_attention" / "07_paged_attention.ipynb").read_text())
    (cell,) = ["".join(c["source"]) for c in nb["cells"]
               if c["metadata"].get("nbgrader", {}).get("grade_id") == "07_num_splits_test"]
    return cell      # visible and hidden parts together, as graded


def fill_the_sms(batch, n_kv_heads, context_len, block_size, n_sm):
    """'Fill the SMs': about two programs per SM, no split under 256 tokens (the notebook's)."""
    return max(1, min(-(-2 * n_sm // max(1, batch * n_kv_heads)), context_len // 256, 256))


def minimise_a_model(batch, n_kv_heads, context_len, block_size, n_sm):
    """'Minimise the estimated time': a search over S on a model of the student's own (a
    roofline with a knee at four programs per SM and the merge's bytes and launch)."""
    import numpy as np
    blocks = -(-context_len // block_size)
    def est(s):
        per = -(-blocks // s)
        s = -(-blocks // per)
        programs = batch * n_kv_heads * s
        kv = programs * per * block_size * 512                   # bf16 K and V, H = 128
        bw = 3.0e6 * min(1.0, programs / (4 * n_sm))
        merge = 0.0 if s == 1 else 6.0 + batch * n_kv_heads * 4 * s * 129 * 8 / 3.0e6
        return kv / bw + merge
    return int(np.argmin([est(s) for s in range(1, 257)]) + 1)


@pytest.mark.parametrize("rule", [fill_the_sms, minimise_a_model])
def test_two_different_split_rules_both_pass_the_graded_cell(rule):
    from autograder.labs import lab07
    picks = {rule(b, k, L, bs, 132) for b, k, L, bs in lab07.SPLIT_SHAPES}
    assert len(picks) > 3                                     # a rule, not a constant
    exec(compile(_split_test_cell(), "07_num_splits_test", "exec"),
         {"lab07": lab07, "choose_num_splits": rule})


def test_the_two_rules_choose_differently():
    from autograder.labs import lab07
    differ = [s for s in lab07.SPLIT_SHAPES if fill_the_sms(*s, 132) != minimise_a_model(*s, 132)]
    assert len(differ) >= 10, differ


@pytest.mark.parametrize("splits", [1, 8, 64])
def test_a_constant_split_count_fails_the_graded_cell(splits):
    from autograder.labs import lab07
    with pytest.raises(AssertionError, match="shapes: the model's time at your split count"):
        exec(compile(_split_test_cell(), "07_num_splits_test", "exec"),
             {"lab07": lab07, "choose_num_splits": lambda *a: splits})


def test_the_split_model_is_the_sweep_it_quotes():
    """The model's constants reproduce RESULTS.md's H100 sweep within 17 % at every split count,
    and its best split count there is the sweep's (64)."""
    from autograder.labs import lab07
    for s, us in lab07.H100_SWEEP_US.items():
        assert abs(lab07.split_decode_us(1, 8, 32768, s) / us - 1) < 0.17, (s, us)
    best = min(range(1, 257), key=lambda s: lab07.split_decode_us(1, 8, 32768, s))
    assert best == min(lab07.H100_SWEEP_US, key=lab07.H100_SWEEP_US.get) == 64
