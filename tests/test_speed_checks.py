"""Every lab's speed check gives the same verdict every time, also under a competing load.

autograder/labs/labNN.py defines SPEED_CHECK, a SpeedCheck record: its reference (a correct
candidate on the library) must pass and its counter-example (the usual mistake) must fail, RUNS
times each, LOADED_RUNS of them while a busy loop occupies one of the CPU cores; one different
verdict fails the test. Where the lab's references are withheld, as in the grading kernel
(autograder/withheld.py), the reference must fail: a submission that delegates to the library
earns nothing.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cpu_load import competing_cpu_load

from autograder.labs import lab_modules, speed_checks

REPO = Path(__file__).resolve().parent.parent
RUNS = 10
LOADED_RUNS = 4
CHECKS = speed_checks()
pytestmark = pytest.mark.slow


def verdicts(check) -> list[tuple[str, bool]]:
    out = []
    for i in range(RUNS):
        loaded = i >= RUNS - LOADED_RUNS
        with competing_cpu_load() if loaded else contextlib.nullcontext():
            out.append(("loaded" if loaded else "quiet", check()))
    return out


def test_the_competing_load_really_competes():
    psutil = pytest.importorskip("psutil")
    with competing_cpu_load() as proc:
        spinner, deadline = psutil.Process(proc.pid), time.monotonic() + 10
        while spinner.cpu_times().user <= 0.1 and time.monotonic() < deadline:
            time.sleep(0.1)             # a loaded machine may give it the core only now and then
        assert spinner.cpu_times().user > 0.1
    assert proc.poll() is not None              # killed


@pytest.mark.parametrize("lab", sorted(CHECKS))
def test_speed_check_passes_on_the_reference_every_time(lab):
    check = CHECKS[lab]
    results = verdicts(lambda: check.passes(check.reference))
    assert all(v is True for _, v in results), f"{lab}: verdicts {results}"


@pytest.mark.parametrize("lab", sorted(CHECKS))
def test_speed_check_fails_on_the_counter_example_every_time(lab):
    check = CHECKS[lab]
    results = verdicts(lambda: check.passes(check.counter_example))
    assert all(v is False for _, v in results), f"{lab}: verdicts {results}"


# lab 01's reference is `torch.stack(xs) @ w` itself: the course has no function to withhold;
# lab 04's is QuantLinear, which the lab's own cells need in the kernel (autograder/README.md,
# "Not guaranteed")
@pytest.mark.parametrize("lab", sorted(set(CHECKS) - {"lab01", "lab04"}))
def test_delegating_to_the_reference_fails_where_it_is_withheld(lab, tmp_path):
    """In a process that imports the course as the grading kernel does, the lab's references
    withheld, the library reference handed in as the candidate fails its lab's check."""
    import nbformat

    from autograder.tester_plan import withheld_of
    from autograder.withheld import build
    from benchmarks.speed_checks import lab_notebook
    nb = nbformat.read(str(lab_notebook(lab)), as_version=4)
    course, _ = build(withheld_of(nb), lab, tmp_path / "course")
    code = (f"from autograder.labs import speed_checks\n"
            f"check = speed_checks()[{lab!r}]\n"
            f"print('passes:', check.passes(check.reference))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=600, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": f"{course}{os.pathsep}{REPO}"})
    assert out.returncode == 0 and "passes: False" in out.stdout, out.stderr[-3000:]


def test_lab04_a_layer_that_remembers_its_answer_fails():
    """A trick thought of while writing lab 04's check: answer the first (checked) call
    correctly, then return the same tensor on every timed call, which costs nothing. Each timed
    call now gets a fresh input and every output is checked afterwards."""
    import torch.nn as nn
    import torch.nn.functional as F

    from kernels.formats import dequantize, group_quantize_int4

    class Remembers(nn.Module):
        def __init__(self, linear, group_size):
            super().__init__()
            self.w = dequantize(*group_quantize_int4(linear.weight.detach(), group_size),
                                group_size)
            self.answer = None

        def forward(self, x):
            if self.answer is None:
                self.answer = F.linear(x, self.w)
            return self.answer

    check = CHECKS["lab04"]
    with pytest.raises(AssertionError, match="output is off"):
        check.check(Remembers)


def test_every_lab_with_a_speed_test_has_a_check():
    names = [m.__name__.rsplit(".", 1)[-1] for m in lab_modules()]
    assert names == sorted(names) and all(n[:3] == "lab" for n in names)
    timed = {f"lab{p.name[:2]}" for p in (REPO / "labs").glob("*/*.ipynb")
             if re.search(r'"grade_id": "\d\d_(\w+_)?speed_test"', p.read_text())}
    assert timed and sorted(CHECKS) == sorted(timed), (sorted(CHECKS), sorted(timed))
    for lab, check in CHECKS.items():
        assert check.grade_id.startswith(lab[3:] + "_"), (lab, check.grade_id)


# the GPU-timed kernel checks and the thresholds their visible part prints (autograder/labs)
KERNEL_SPEED_CELLS = {"04_gemv_w8_test": "tri.GPU_SPEED", "04_gemv_w4_test": "tri.GPU_SPEED",
                      "07_decode_kernel_test": "tri.KERNEL_SPEED",
                      "07_split_kernel_test": "tri.KERNEL_SPEED"}


def test_every_speed_test_shows_its_threshold_before_grading():
    """A student sees the threshold, and their own figure, by running the test cell: the timed
    call is in the visible part (SpeedCheck.check prints both; the kernel checks print the GPU
    thresholds, and on a GPU the student's figures), never only in the hidden part."""
    cells = {}
    for p in (REPO / "labs").glob("*/*.ipynb"):
        for c in json.loads(p.read_text())["cells"]:
            gid = c["metadata"].get("nbgrader", {}).get("grade_id")
            if gid:
                cells[gid] = "".join(c["source"]).split("### BEGIN HIDDEN TESTS")
    for lab, check in CHECKS.items():
        visible = cells[check.grade_id][0]
        called = re.findall(rf"{lab}\.(check_\w+)\(", visible)
        assert called and all(getattr(check, "check") == getattr(module_of(lab), name)
                              for name in called), (check.grade_id, called)
    for gid, thresholds in KERNEL_SPEED_CELLS.items():
        visible, hidden = cells[gid]
        assert f"{thresholds}['min_fraction_of_copy']" in visible, gid
        assert "torch.cuda.is_available()" in visible and "speed" in visible, gid
        assert "speed=None" in hidden or "speed" not in hidden, gid      # timed once, visibly


def module_of(lab: str):
    return next(m for m in lab_modules() if m.__name__.endswith(lab))


def test_the_measuring_command_reports_both_candidates():
    """`python -m benchmarks.speed_checks` (the source of the ranges in autograder/README.md)."""
    out = subprocess.run([sys.executable, "-m", "benchmarks.speed_checks", "lab01", "--runs", "2",
                          "--loaded", "1", "--json"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    row = json.loads(out.stdout)["checks"]["lab01"]
    assert row["reference"]["min"] >= row["threshold"] > row["counter_example"]["max"]
    bad = subprocess.run([sys.executable, "-m", "benchmarks.speed_checks", "lab99"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "no speed check for ['lab99']" in bad.stderr


@pytest.mark.parametrize("lab", [lab for lab, c in sorted(CHECKS.items()) if c.solution])
def test_the_notebooks_own_solution_passes(lab):
    """The source notebook's answer (SpeedCheck.solution, run from its cells) passes the check,
    under a competing load too."""
    from benchmarks.speed_checks import notebook_solution
    check = CHECKS[lab]
    solution = notebook_solution(check, lab)
    results = verdicts(lambda: check.passes(solution))
    assert all(v is True for _, v in results), f"{lab}: verdicts {results}"


def test_a_missing_solution_cell_is_named():
    from dataclasses import replace

    from benchmarks.speed_checks import lab_notebook, notebook_solution
    check = replace(CHECKS["lab07"], solution=("paged_decode_torch", "07_no_such_cell"))
    with pytest.raises(ValueError, match="no code cell with grade id \\['07_no_such_cell'\\]"):
        notebook_solution(check, "lab07")
    with pytest.raises(ValueError, match="names no notebook solution"):
        notebook_solution(replace(check, solution=()), "lab07")
    with pytest.raises(FileNotFoundError, match="no single source notebook for lab99"):
        lab_notebook("lab99")
