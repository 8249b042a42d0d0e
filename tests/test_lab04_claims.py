"""Lab 04's sentences that state a figure agree with what the cell beside them prints.

Each test runs the notebook's own cells (the solutions' code) in this process and reads the
figure from their output, then finds the same figure in the text that quotes it: the model
answers of Q5 (AWQ on the synthetic layer) and Q6 (the int8 KV cache with its scales), the
explanation of the two differences in "Your kernels on your codes", and section 10.4's stray
store, which a NaN fence catches. None of these figures is a timing: they are exact on any
machine, so they are checked exactly.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import re
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
LAB = REPO / "labs" / "04_quantization" / "04_quantization.ipynb"


def _cells() -> list[dict]:
    return json.loads(LAB.read_text())["cells"]


def _by_id(gid: str) -> str:
    found = ["".join(c["source"]) for c in _cells()
             if c["metadata"].get("nbgrader", {}).get("grade_id") == gid]
    assert len(found) == 1, f"{len(found)} cells with grade_id {gid}"
    return found[0]


def _starting(start: str) -> str:
    found = ["".join(c["source"]) for c in _cells()
             if c["cell_type"] == "code" and "".join(c["source"]).startswith(start)]
    assert len(found) == 1, f"{len(found)} code cells start with {start!r}"
    return found[0]


def _run(ns: dict, source: str, name: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(source, name, "exec"), ns)
    return out.getvalue()


@pytest.fixture(scope="module")
def lab04():
    """The setup and the solution cells the checked cells use, in a fresh namespace (the setup
    sets one torch thread and may set TRITON_INTERPRET: both restored afterwards)."""
    threads, interpret = torch.get_num_threads(), os.environ.get("TRITON_INTERPRET")
    ns: dict = {}
    for gid in ("04_setup", "04_absmax", "04_zeropoint", "04_int4", "04_pack", "04_awq",
                "04_gemv_w8", "04_gemv_w4"):
        _run(ns, _by_id(gid), gid)
    yield ns
    torch.set_num_threads(threads)
    if interpret is None:
        os.environ.pop("TRITON_INTERPRET", None)


def _visible(test_source: str) -> str:
    return test_source.split("### BEGIN HIDDEN TESTS")[0]


def test_q5_quotes_the_awq_gain_the_seeded_test_cell_prints(lab04):
    printed = _run(lab04, _visible(_by_id("04_awq_test")), "04_awq_test")
    m = re.search(r"AWQ \(alpha = ([\d.]+)\) .*: ([\d.]+)x smaller", printed)
    assert m, printed
    alpha, gain = m.groups()
    again = _run(lab04, _visible(_by_id("04_awq_test")), "04_awq_test")
    assert again == printed, "the synthetic layer is not seeded: two runs printed differently"
    answer = _by_id("04_q5")
    assert f"{gain}× less error at $\\alpha = {alpha}$" in answer, (gain, alpha)
    assert float(gain) > 2, "04_md_awq_read says AWQ cut the error more than twofold"


def test_q6_quotes_the_batches_the_kv_cell_prints(lab04):
    cell = _starting("ppl, kl = held_out(with_kv_cache(model, YourInt8KVCache))")
    napkin = cell[cell.index("# bf16 weights;"):]          # the Llama-2-13B part of the cell
    printed = _run(lab04, napkin, "kv napkin")
    fits = dict(re.findall(r"S = 1000, (.+?) cache: .* largest batch that fits (\d+)", printed))
    assert set(fits) == {"bf16", "int8", "int8 + scales"}, printed
    answer = _by_id("04_q6")
    assert f"**{fits['bf16']}** sequences" in answer and f"**{fits['int8']}** fit" in answer
    assert f"({fits['int8 + scales']} if each vector's fp16 scale is counted" in answer
    assert fits["int8 + scales"] == "129"        # head_dim 128: 130/256 of bf16, not 66/128


def test_the_two_differences_are_the_sizes_the_text_explains(lab04):
    printed = _run(lab04, _starting("from kernels import w4a16_matmul, w8a16_matmul"),
                   "kernel compare")
    m = re.search(r"vs the course's ([\d.e+-]+), vs your dequantized weight ([\d.e+-]+)", printed)
    assert m, printed
    course, own = map(float, m.groups())
    text = _by_id("04_md_kernel_compare")
    assert "about 1e-6" in text and "about 1e-4" in text
    assert 1e-7 <= own <= 1e-5, own           # the order of float32 additions
    assert 1e-5 <= course <= 1e-3, course     # 128 + q and the zero point folded out


def test_a_stray_store_lands_in_the_fence(lab04):
    printed = _run(lab04, _starting("@triton.jit\ndef block_sum("), "10.4")
    assert "sum of 0..9, with the mask: 45.0" in printed
    assert "without the mask: nan" in printed
    assert "copy with the mask: 0 fence values overwritten" in printed
    assert "copy without the mask: 6 fence values overwritten" in printed   # lanes 10..15
    assert "kernel died" in _by_id("04_md_tri_interpreter")


@pytest.mark.parametrize("fmt", ["w8", "w4"])
def test_the_kernel_tests_print_their_gpu_threshold(lab04, fmt):
    printed = _run(lab04, _visible(_by_id(f"04_gemv_{fmt}_test")), f"04_gemv_{fmt}_test")
    speed = lab04["tri"].GPU_SPEED
    assert (f"on a GPU: at least {speed['min_fraction_of_copy']:.0%} of a device copy's speed and "
            f"{speed['min_ratio_to_reference']:g}x the course kernel's") in printed, printed


def test_the_w4a16_design_text_states_what_the_checks_do(lab04):
    """Section 11's description of the graded w4a16 cases and thresholds is what
    lab04_triton holds (the thresholds, the shapes, the group sizes, the dtypes)."""
    tri = lab04["tri"]
    text = " ".join(_by_id("04_md_kernel").split())
    speed = tri.GPU_SPEED
    assert f"at least {speed['min_fraction_of_copy']:.0%}".replace("%", " %") in text
    assert speed["min_ratio_to_reference"] == 0.25 and "a quarter of the course's kernel's speed" in text
    cases = tri.CASES["w4a16_gemv"]
    ms, groups = [c["M"] for c in cases], [c["group_size"] for c in cases]
    assert f"$M = {min(ms)}$ to {max(ms)}" in text, (min(ms), max(ms))
    assert f"groups of {min(groups)} to {max(groups)}" in text, (min(groups), max(groups))
    assert all(c["N"] & (c["N"] - 1) for c in cases), "N off every power of two"
    assert {str(c["dtype"]).replace("torch.", "") for c in cases} == {"float32", "bfloat16",
                                                                      "float16"}
    assert "fp32/bf16/fp16 $x$" in text
    assert all(c["K"] % c["group_size"] == 0 for c in cases)   # "K is always a multiple of G"


def test_q1_quotes_the_batch_1_napkin_the_section_1_cell_prints(lab04):
    """Q1's model answer: bf16 and int4 g = 128 weights of Llama-2-13B, their floors and the
    ratio, as the napkin cell of section 1 prints them (deterministic: roofline's presets)."""
    import matplotlib
    matplotlib.use("Agg")
    _run(lab04, _by_id("04_bits"), "04_bits")
    printed = _run(lab04, _starting("# Lab 01's napkin: Llama-2-13B"), "napkin 13B")
    rows = {name: figures for name, *figures in re.findall(
        r"^\s*(.+?):\s+[\d.]+ bits/weight, weights\s+([\d.]+) GB, floor\s+([\d.]+) ms/token = "
        r"([\d.]+)x", printed, re.M)}
    (gb, ms, _), (gb4, ms4, ratio) = rows["bf16"], rows["int4, g = 128"]
    answer = " ".join(_by_id("04_q1").split())
    assert f"bf16 weights are {gb} GB and the floor is {ms} ms per token" in answer, (gb, ms)
    assert f"{gb4} GB, and the floor drops to {ms4} ms" in answer, (gb4, ms4)
    assert f"That is {ratio}×, not 4×" in answer, ratio
