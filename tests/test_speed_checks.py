"""Every lab's speed check gives the same verdict every time, also under a competing load.

autograder/labs/labNN.py defines SPEED_CHECK, a SpeedCheck record: its reference (a correct
candidate on the library) must pass and its counter-example (the usual mistake) must fail, RUNS
times each, LOADED_RUNS of them while a busy loop occupies one of the CPU cores; one different
verdict fails the test. The reference must also fail when the check's guard is on: a
submission that delegates to the library earns nothing.
"""
from __future__ import annotations

import contextlib
import importlib
import inspect
import json
import subprocess
import sys
import time

import pytest
from cpu_load import competing_cpu_load

from autograder.labs import lab_modules, speed_checks

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


@pytest.mark.parametrize("lab", sorted(CHECKS))
def test_delegating_to_the_reference_fails_the_guarded_check(lab):
    """The graded cell runs the check guarded: the library reference, and every public function
    of the lab module handed in as the candidate, fail while the references are off."""
    check = CHECKS[lab]
    with pytest.raises(AssertionError, match="is disabled during grading"):
        check.check(check.reference, *check.fixture())
    module = importlib.import_module(f"autograder.labs.{lab}")
    for name, value in vars(module).items():
        if name.startswith("_") or not inspect.isfunction(value) \
                or value.__module__ != module.__name__:
            continue
        try:
            passed = check.passes(value, guarded=True)
        except Exception:                       # not in the candidate's signature
            passed = False
        assert not passed, f"{lab}.{name} passes its lab's graded speed check as a submission"
    assert check.passes(check.reference) is True        # and the guard is lifted afterwards


def test_lab07_delegating_to_the_references_shared_core_fails():
    """An attack found 2026-11-25: lab 07 disabled only the public torch reference, so a decode
    calling the private core it shares with the split reference (`_partial_attention`), or the
    split reference itself, passed the speed check -- and `_partial_attention` also the hidden
    correctness test. Both lists now come from `lab07.DECODE_REFERENCES`."""
    import kernels.paged_attention_ref as ref
    from autograder.labs import lab07

    def via_core(q, kc, vc, tables, lens, scale=None):
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        return ref._partial_attention(q, kc, vc, tables, lens, scale, 0,
                                      int(lens.max()))[0].to(q.dtype)

    def via_split(q, kc, vc, tables, lens, scale=None):
        return ref.paged_attention_decode_split_ref(q, kc, vc, tables, lens, scale, num_splits=1)

    check = CHECKS["lab07"]
    assert set(check.disabled) == set(lab07.DECODE_REFERENCES)
    for attack in (via_core, via_split):
        assert check.passes(attack, guarded=False), "the attack computes the right answer"
        with pytest.raises(AssertionError, match="is disabled during grading"):
            check.check(attack, *check.fixture())


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
        check.check(Remembers, *check.fixture(), guarded=False)


def test_every_lab_with_a_speed_test_has_a_check():
    names = [m.__name__.rsplit(".", 1)[-1] for m in lab_modules()]
    assert names == sorted(names) and all(n[:3] == "lab" for n in names)
    assert sorted(CHECKS) == names              # every lab module registers one SpeedCheck
    for lab, check in CHECKS.items():
        assert check.grade_id.startswith(lab[3:] + "_"), (lab, check.grade_id)
        assert check.disabled, f"{lab}: a speed check must disable the references it times"


def test_the_measuring_command_reports_both_candidates():
    """`python -m autograder.labs` (the source of the ranges in autograder/README.md)."""
    out = subprocess.run([sys.executable, "-m", "autograder.labs", "lab01", "--runs", "2",
                          "--loaded", "1", "--json"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    row = json.loads(out.stdout)["checks"]["lab01"]
    assert row["reference"]["min"] >= row["threshold"] > row["counter_example"]["max"]
    bad = subprocess.run([sys.executable, "-m", "autograder.labs", "lab99"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "no speed check for ['lab99']" in bad.stderr


@pytest.mark.parametrize("lab", [lab for lab, c in sorted(CHECKS.items()) if c.solution])
def test_the_notebooks_own_solution_passes_guarded(lab):
    """The source notebook's answer (SpeedCheck.solution, run from its cells) passes the check
    as a submission does: guarded, and under a competing load too."""
    from autograder.labs.solutions import notebook_solution
    check = CHECKS[lab]
    solution = notebook_solution(check, lab)
    results = verdicts(lambda: check.passes(solution, guarded=True))
    assert all(v is True for _, v in results), f"{lab}: verdicts {results}"


def test_a_missing_solution_cell_is_named():
    from dataclasses import replace

    from autograder.labs.solutions import lab_notebook, notebook_solution
    check = replace(CHECKS["lab07"], solution=("paged_decode_torch", "07_no_such_cell"))
    with pytest.raises(ValueError, match="no code cell with grade id \\['07_no_such_cell'\\]"):
        notebook_solution(check, "lab07")
    with pytest.raises(ValueError, match="names no notebook solution"):
        notebook_solution(replace(check, solution=()), "lab07")
    with pytest.raises(FileNotFoundError, match="no single source notebook for lab99"):
        lab_notebook("lab99")
