"""Lab 07's sentences that state a figure agree with what the cells print, or with the place
they cite (benchmarks/RESULTS.md, "Paged attention kernels (lab 07, NVIDIA H100)").

Each test runs the notebook's own cells (the solutions' code) in this process and reads the
figures from their output, or recomputes them with the course's code, then finds them in the
sentences that quote them: Q1's fragmentation figures (the replay is a simulation: exact), Q3's
block counts, Q4's and Q5's bytes, the split-count task's grading terms, and every H100 figure
quoted from RESULTS.md in the notebook and slides/07_paged_attention.md. None is a timing on
this machine, so all are checked exactly (fast, unmarked).
"""
from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
LAB = REPO / "labs" / "07_paged_attention" / "07_paged_attention.ipynb"
RESULTS = (REPO / "benchmarks" / "RESULTS.md").read_text()
SLIDES = (REPO / "slides" / "07_paged_attention.md").read_text()
SECTION = RESULTS[RESULTS.index("## Paged attention kernels (lab 07, NVIDIA H100)"):]
SECTION = SECTION[:SECTION.index("\n## ", 10)]


def _cell(gid: str) -> str:
    found = ["".join(c["source"]) for c in json.loads(LAB.read_text())["cells"]
             if c["metadata"].get("nbgrader", {}).get("grade_id") == gid]
    assert len(found) == 1, f"{len(found)} cells with grade_id {gid}"
    return found[0]


def _flat(text: str) -> str:
    return " ".join(text.split())


def _n(x: int) -> str:
    """A number as the text writes it: thousands apart by a space (2 176)."""
    return f"{x:_}".replace("_", " ")


def _run(ns: dict, *gids: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for gid in gids:
            exec(compile(_cell(gid), gid, "exec"), ns)
    return out.getvalue()


def test_q1_quotes_the_replay():
    from minillm.serving import fragmentation
    ns = {"fragmentation": fragmentation, "np": np}
    out = _run(ns, "07_waste", "07_sim")
    q1 = _flat(_cell("07_q1"))
    got = {m[0]: m[1:] for m in re.findall(
        r"(\w+): all done after (\d+) steps,\s+([\d.]+) requests running on average; tokens fill "
        r"([\d.]+) % of the held memory \(napkin ([\d.]+) %\)", out)}
    (steps_c, run_c, fill_c, nap_c), (steps_p, run_p, fill_p, nap_p) = got["contiguous"], got["paged"]
    assert f"contiguous layout tokens filled {fill_c} % of the held memory (napkin {nap_c} %), " \
           f"with pages {fill_p} % (napkin {nap_p} %)" in q1
    assert f"ran {run_p} requests at a time on average against {run_c}" in q1
    assert f"finished the trace in {steps_p} steps instead of {steps_c}" in q1
    prompt, answer, longest = re.search(r"prompt median (\d+) \(max \d+\), answer median (\d+) "
                                        r"\(max (\d+)\)", out).groups()
    assert f"median prompt of {prompt} and a median answer of {answer} tokens" in q1
    # SERVER_MAX_NEW = 64: answers capped at 64, replayed by the course's server
    reqs = ns["requests"]
    capped = [(a, p, min(o, 64)) for a, p, o in reqs]
    h = fragmentation.replay(capped, paged=False, capacity=2048, block_size=16, max_new=64,
                             waste=ns["contiguous_waste"])
    napkin = fragmentation.napkin_fill(capped, False, 16, 64)
    assert f"the fill rises to about {100 * napkin:.0f} % (the napkin; the course's replay " \
           f"measures {100 * fragmentation.held_fill(h):.0f} %, with about " \
           f"{np.mean([r['running'] for r in h]):.0f} requests running and the trace done in " \
           f"{len(h)} steps)" in q1
    cut = sum(o > 64 for _, _, o in reqs)
    assert f"the {cut} requests of this trace that want more than 64 tokens (up to {longest})" in q1
    assert f"({cut} of the 64 requests here)" in q1


def test_q3_quotes_the_block_counts():
    import random

    from autograder.labs import lab07
    from minillm.serving import BlockManager, Sequence
    ns = {"BlockPool": lab07.BlockPool, "BlockManager": BlockManager, "Sequence": Sequence,
          "random": random, "lab07": lab07}
    out = _run(ns, "07_allocator", "07_cow", "07_share", "07_share_test")
    q3 = _flat(_cell("07_q3"))
    without, with_ = re.search(r"(\d+) blocks without sharing, (\d+) with", out).groups()
    assert f"= {with_} blocks against {_n(int(without))}" in q3
    used, copies, alone = re.search(r"(\d+) blocks with fork \((\d+) copy-on-write copies\), "
                                    r"(\d+) without", out).groups()
    used, copies, alone = int(used), int(copies), int(alone)
    assert f"{alone} without sharing, and 31 + 8 x 13 = {used} with fork, with {copies} " \
           f"copy-on-write copies" in q3
    assert f"{alone - used} blocks saved, {100 * (alone - used) / alone:.0f} %, " \
           f"{alone / used:.1f}x less memory" in q3
    used2, _ = ns["fork_blocks"](500, 2000, 8, 16)
    alone2 = 8 * -(-2500 // 16)
    assert f"{_n(used2)} against {_n(alone2)} blocks, {100 * (alone2 - used2) / alone2:.0f} %" in q3


def test_q4_and_q5_bytes_follow_from_the_gpu_cell():
    import torch

    from minillm import roofline
    ns = {"roofline": roofline, "torch": torch, "kernels": None, "tri": None}
    out = _run(ns, "07_gpu") if not torch.cuda.is_available() else ""
    kv = 2 * 32 * 4096 * 8 * 128 * 2
    h100 = roofline.get_hardware("h100")
    if out:
        assert f"{kv / 1e6:.0f} MB of K/V" in out and \
            f"{kv / h100.mem_bandwidth_bytes_per_s * 1e6:.0f} us (the floor)" in out
    q4 = _flat(_cell("07_q4"))
    assert f"about {2 * kv / 1e9:.2f} GB extra per layer on top of {kv / 1e6:.0f} MB" in q4
    assert f"tripling the {kv / h100.mem_bandwidth_bytes_per_s * 1e6:.0f} us floor" in q4
    q5 = _flat(_cell("07_q5"))
    scratch = 33 * 32 * 129 * 4
    assert f"= {scratch / 1e6:.1f} MB written and read" in q5
    assert f"the {2 * 32768 * 8 * 128 * 2 / 1e6:.0f} MB of K/V of a 32k context" in q5
    assert f"the {2 * 512 * 8 * 128 * 2 / 1e6:.0f} MB of K/V of a 512-token one" in q5
    assert "256 programs for the batch" in q5 and 32 * 8 == 256
    assert f"124 of the 132 SMs ({100 * 124 / 132:.0f} %)" in q5


def test_the_h100_figures_quoted_are_results_md():
    """Every H100 figure the notebook and slides quote, against the RESULTS.md section."""
    sec = _flat(SECTION)
    for fig in ("186.4 µs | 2883 | **95%** | **0.97×**", "180.7 µs | 2975 | 98% | 1.00×",
                "unsplit 664.9 µs", "with 33 splits", "132 SMs) 60.4 µs", "**11.0× faster**"):
        assert fig in sec, fig
    q4, q5, q2 = (_flat(_cell(g)) for g in ("07_q4", "07_q5", "07_q2"))
    assert "186 us paged against 181 us SDPA, 0.97x, 95 % of copy bandwidth" in q4
    assert "665 us unsplit against 60 us with 33 splits, 11x" in q5
    assert "95 % of copy bandwidth on an H100 (benchmarks/RESULTS.md)" in q2
    slides = _flat(SLIDES)
    assert "95 % of copy, 0.97× SDPA, split 11×" in slides
    # the split sweep the cost model quotes and was fitted to
    from autograder.labs import lab07, lab07_triton
    counts = re.search(r"Split counts at 32k tokens: (.*?) µs: past", sec).group(1)
    sweep = {int(n): float(t) for n, t in re.findall(r"(\d+) → ([\d.]+)", counts)}
    assert sweep == {s: us for s, us in lab07.H100_SWEEP_US.items() if s != 1}, sweep
    assert lab07.H100_SWEEP_US[1] == 664.9
    assert lab07_triton.SPEED_SPLITS == 33 and "course's split count (33)" in \
        _flat(_cell("07_md_split_kernel"))


def test_the_split_task_states_its_grading():
    from autograder.labs import lab07
    md = _flat(_cell("07_md_num_splits"))
    tol = lab07.SPLIT_TOLERANCE
    assert f"within {tol['relative']:.0%} (or {tol['absolute_us']:g} µs) of the model's best over " \
           f"$S$ = 1..{lab07.MAX_SPLITS}".replace("%", " %") in md
    b, k, L = (sorted({s[i] for s in lab07.SPLIT_SHAPES}) for i in range(3))
    assert f"shapes from {b[0]} to {b[-1]} sequences, {k[0]} to {k[-1]} KV heads and contexts of " \
           f"{_n(L[0])} to {_n(L[-1])} tokens" in md
    assert lab07.SPLIT_GPU["n_sm"] == 132 and "an H100's 132 SMs" in md
    assert "`choose_num_splits(...)`, graded on the lab's cost model" in _flat(SLIDES)


def test_the_kernel_sections_numbers():
    """Section 6's arithmetic: 8 programs on 132 SMs (94 % idle), N/K = 4 FLOPs per byte against
    lab 01's ~295, e^88.7 the float32 limit, TF32 rounding of a score of 200 by about 0.1, and
    the GPU thresholds the text states are lab07_triton.KERNEL_SPEED."""
    import math

    import torch

    from autograder.labs import lab07_triton
    from minillm import roofline
    flash, kernel = _flat(_cell("07_md_flash")), _flat(_cell("07_md_decode_kernel"))
    assert f"{100 * (132 - 8) / 132:.0f} % of the chip would idle" in flash
    assert f"({32 // 8} for 32 query and 8 KV heads)" in flash
    h100 = roofline.get_hardware("h100")
    assert f"roofline's ~{h100.flops_per_s / h100.mem_bandwidth_bytes_per_s:.0f} (lab 01)" in flash
    assert f"above $x = {math.log(torch.finfo(torch.float32).max):.1f}$" in kernel
    assert "$3.4\\cdot 10^{38} = e^{88.7}$" in kernel and \
        f"{torch.finfo(torch.float32).max:.1e}".startswith("3.4e+38")
    assert "a score of 200 would be off by about 0.1" in kernel and round(200 * 2.0 ** -11, 1) == 0.1
    speed = lab07_triton.KERNEL_SPEED
    for gid in ("07_md_decode_kernel", "07_md_split_kernel"):
        assert f"{speed['min_fraction_of_copy']:.0%}".replace("%", " %") in _flat(_cell(gid))
        assert f"{speed['min_ratio_to_reference']:g}×" in _flat(_cell(gid))
    assert f"at least {speed['min_fraction_of_copy']:.0%} of a device copy and " \
           f"{speed['min_ratio_to_reference']:g}× its speed".replace("%", " %") in _flat(SLIDES)


@pytest.mark.slow
def test_the_kernel_checks_take_under_five_seconds_on_a_busy_machine(tmp_path):
    """'In the interpreter they take a few seconds (under five, on a busy 2-core machine)': the
    graded checks of the notebook's two kernels, each timed beside a competing load."""
    import os
    import sys
    import time
    os.environ.setdefault("TRITON_INTERPRET", "1")
    sys.path.insert(0, str(REPO / "tests"))
    from cpu_load import competing_cpu_load
    from test_student_kernels_paged import load_kernels, solution_source

    from autograder.labs import lab07_triton as tri
    assert "under five, on a busy 2-core machine" in _flat(_cell("07_md_decode_kernel"))
    sol = load_kernels(tmp_path, solution_source(), "lab07_claims_kernels")
    with competing_cpu_load():
        for check, kernel in ((tri.check_decode_kernel, sol.paged_decode_kernel),
                              (tri.check_split_kernel, sol.paged_split_kernel)):
            t0 = time.perf_counter()
            check(kernel, speed=None)
            assert time.perf_counter() - t0 < 5.0, check


def test_the_texts_arithmetic_and_citations():
    """The sentences that compute or cite and that no cell prints: a reservation's waste, the
    vLLM paper's fill, the speed check's bound and measured ranges, the tile walk's masks, and
    the block, byte and program counts of Q2, Q3 and Q5."""
    import math

    from autograder.labs import lab07, lab07_triton
    frag = _flat(_cell("07_md_frag"))
    assert "a request that may write 256 tokens and stops after 20 wastes 236" in frag and \
        256 - 20 == 236
    paper = "20.4–38.2 %"                   # Kwon et al. 2023, section 1: "only 20.4% - 38.2%"
    assert f"only {paper} of the KV memory of the serving systems of the time held actual tokens " \
           "(Kwon et al., SOSP 2023, arXiv:2309.06180, section 1 and Fig. 2)" in frag
    assert f"only {paper} of KV memory held tokens" in _flat(SLIDES)
    sim = _cell("07_sim")
    assert "STEP_S = 0.02 " in sim and "one step = 20 ms" in _flat(_cell("07_md_sim"))
    assert "BLOCK = 16 " in sim
    # the speed check: its bound, and the ranges autograder/README.md records
    speed = _flat(_cell("07_md_speed"))
    assert lab07.THRESHOLD == 0.25 and "up to $1/0.25 = 4\\times$ as long" in speed
    readme = (REPO / "autograder" / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| `07_speed_test` |"))
    assert "| 0.25 | 0.73-1.41 | 0.05-0.06 | 0.73-0.87 |" in row, row
    assert "the notebook's solution measured 0.73–0.87: `autograder/README.md`, \"Speed checks: " \
           "measured ranges\"" in speed and "fails it (0.05–0.06 there)" in speed
    # the tile walk's printed explanation: 21 tokens in blocks of 4, tiles of 16, 7 table columns
    walk = _cell("07_tile_walk")
    table = [7, 2, 5, 11, 0, 9, -1]
    assert f"walk_table = torch.tensor({table}, dtype=torch.int32)" in walk
    last = (21 - 1) // 4
    assert table[last] == 9 and (last + 1) * 4 - 1 == 23 and table[6] == -1 and len(table) == 7
    assert "positions 21..31 are past the length. 21..23 are the empty tail of the last block (9)" in walk
    assert "24..27 would read column 6 (-1), 28..31 column 7, past the table's 7 columns" in walk
    assert 24 // 4 == 27 // 4 == 6 and 28 // 4 == 31 // 4 == 7 and 2 * 16 - 1 == 31
    q2 = _flat(_cell("07_q2"))
    assert "at most B - 1 = 15 slots per sequence with vLLM's 16 (about 7.5 on average" in q2 and \
        (16 - 1) / 2 == 7.5
    assert f"needs 4096 entries instead of {4096 // 16}" in q2 and "grow 16 times" in q2
    assert f"a single row of H = 128 bf16 values, {128 * 2} bytes" in q2
    q3 = _flat(_cell("07_q3"))
    assert "(31 full blocks + 4 tokens)" in q3 and divmod(500, 16) == (31, 4)
    assert f"ceil(700 / 16) = {math.ceil(700 / 16)} blocks: 8 x 44 = {8 * 44} without sharing" in q3
    assert f"(n - 1) x 31 = {7 * 31} full prompt blocks" in q3
    q5 = _flat(_cell("07_q5"))
    assert "256 programs for the batch, about two per SM on an H100's 132 SMs" in q5 and \
        round(256 / 132) == 2
    # what the text says the hidden tests and the GPU timing use
    kernel = _flat(_cell("07_md_decode_kernel"))
    assert "the hidden tests use scores of 110 to 220" in kernel
    assert "scores of 110 to 220" in (REPO / "autograder" / "labs" / "lab07_triton.py").read_text()
    import torch
    assert lab07_triton.SPEED["decode"] == ([4096] * 16, 32, 8, 128, 16, torch.bfloat16)
    assert "time your kernel on 16 sequences of 4096 tokens (32 query and 8 KV heads of 128, bf16)" \
        in kernel
