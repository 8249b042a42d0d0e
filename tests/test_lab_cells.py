"""A lab's test cells against one plausible mistake at a time, run in this process.

The notebook pipeline (tests/test_pipeline.py) grades one wrong submission per lab through
nbgrader; here a single test cell meets a single mistake, so each mistake is shown to cost the
points of the cell that should catch it (visible and hidden part together, as when graded).
In one process a probe (autograder/probes.py) is an ordinary call: the cell's checks on what
the probe returns are the ones graded in the tester.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow          # ~15 s: each test runs lab 02's setup and test cells


def cells(lab: str) -> dict[str, str]:
    nb = json.loads((REPO / "labs" / lab / f"{lab}.ipynb").read_text())
    return {c["metadata"]["nbgrader"]["grade_id"]: "".join(c["source"]) for c in nb["cells"]
            if "grade_id" in c["metadata"].get("nbgrader", {})}


@pytest.fixture
def lab02(monkeypatch):
    """Lab 02's setup and cache cells run in a fresh namespace (the setup sets one torch thread:
    restored after the test)."""
    threads = torch.get_num_threads()
    src = cells("02_kv_cache")
    ns: dict = {}
    exec(compile(src["02_setup"], "02_setup", "exec"), ns)
    exec(compile(src["02_cache"], "02_cache", "exec"), ns)
    yield src, ns
    torch.set_num_threads(threads)


# the classic slip: the loop stops on a stop token only, so after the n-th token it still runs a
# decode step whose logits nobody samples (same tokens, one forward pass too many)
ONE_PASS_TOO_MANY = ("        if nxt in stop_ids or step == max_new_tokens - 1:\n            break",
                     "        if nxt in stop_ids:\n            break")


def test_lab02_generate_test_passes_the_solution(lab02):
    src, ns = lab02
    exec(compile(src["02_generate_cached"], "02_generate_cached", "exec"), ns)
    exec(compile(src["02_generate_test"], "02_generate_test", "exec"), ns)


def test_lab02_generate_test_catches_one_forward_pass_too_many(lab02):
    src, ns = lab02
    old, new = ONE_PASS_TOO_MANY
    assert old in src["02_generate_cached"], "the solution's stop condition changed: update this test"
    exec(compile(src["02_generate_cached"].replace(old, new), "02_generate_cached", "exec"), ns)
    with pytest.raises(AssertionError) as e:
        exec(compile(src["02_generate_test"], "02_generate_test", "exec"), ns)
    msg = str(e.value)
    assert "6 forward calls" in msg and "expected 5 calls" in msg, msg


# a cache that returns copies of its buffers: the right values, but not the views the lab asks for
# (lab02.cache_trace compares the memory of what update returns with the cache's own tensors)
RETURNS_COPIES = ("        return (self.k[layer_idx][:, :, :end], self.v[layer_idx][:, :, :end],",
                  "        return (self.k[layer_idx][:, :, :end].clone(), "
                  "self.v[layer_idx][:, :, :end].clone(),")


def test_lab02_cache_test_passes_the_solution(lab02):
    src, ns = lab02
    exec(compile(src["02_cache_test"], "02_cache_test", "exec"), ns)


def test_lab02_cache_test_catches_copies_instead_of_views(lab02):
    src, ns = lab02
    old, new = RETURNS_COPIES
    assert old in src["02_cache"], "the solution's update changed: update this test"
    exec(compile(src["02_cache"].replace(old, new), "02_cache", "exec"), ns)
    with pytest.raises(AssertionError, match="not copies"):
        exec(compile(src["02_cache_test"], "02_cache_test", "exec"), ns)


# --- lab 05: the draft length is the student's decision (05_choose_k), graded by its outcome -----
# Two different correct rules: the solution (fit a line to the measured v, take the k whose
# formula speed-up is highest, 0 if none beats 1) and a hill climb that interpolates v between the
# measured k (extrapolating from the last two) and stops at the first k that gains nothing (it
# can stop at a local optimum: it still lands within the margin). The poor designs: constant k,
# and "the longest measured draft".
CLIMB = '''def choose_k(alpha, c, verify_cost):
    ks = sorted(verify_cost)

    def v(k):
        if k in verify_cost:
            return verify_cost[k]
        below, above = [j for j in ks if j < k], [j for j in ks if j > k]
        lo, hi = (below[-1], above[0]) if below and above else (ks[-2], ks[-1]) if below else (ks[0], ks[1])
        return verify_cost[lo] + (verify_cost[hi] - verify_cost[lo]) * (k - lo) / (hi - lo)
    k, best = 0, 1.0
    while k < lab05.K_MAX:
        nxt = expected_speedup(alpha, k + 1, c, v(k + 1))
        if nxt < best:
            break
        k, best = k + 1, nxt
    return k
'''
POOR_RULES = {"k = 3 always": "def choose_k(alpha, c, verify_cost):\n    return 3\n",
              "k = 4 always": "def choose_k(alpha, c, verify_cost):\n    return 4\n",
              "the longest measured draft": "def choose_k(alpha, c, verify_cost):\n"
                                            "    return max(verify_cost)\n"}


@pytest.fixture
def lab05_formulas():
    """What 05_choose_k_test needs in one namespace: numpy, torch, lab05 and the solution's
    formulas (no models: the test hands plain numbers to choose_k)."""
    import numpy as np

    from autograder.labs import lab05
    src = cells("05_speculative")
    ns: dict = {"np": np, "torch": torch, "lab05": lab05}
    exec(compile(src["05_formula"], "05_formula", "exec"), ns)
    return src, ns


@pytest.mark.parametrize("rule", ["solution", "hill climb"])
def test_lab05_choose_k_gives_two_different_rules_full_marks(lab05_formulas, rule, capsys):
    src, ns = lab05_formulas
    exec(compile(src["05_choose_k"] if rule == "solution" else CLIMB, "05_choose_k", "exec"), ns)
    exec(compile(src["05_choose_k_test"], "05_choose_k_test", "exec"), ns)   # visible + hidden
    printed = capsys.readouterr().out
    assert "choose_k: visible checks passed" in printed
    assert printed.count("(at least 95% required)") == 3 + 5 + 16, printed


def test_lab05_the_two_rules_differ(lab05_formulas):
    """The hill climb is not the solution in disguise: on one machine it picks another k."""
    src, ns = lab05_formulas
    picks = []
    for code in (src["05_choose_k"], CLIMB):
        exec(compile(code, "05_choose_k", "exec"), ns)
        picks.append(ns["choose_k"](0.69, 0.21, {k: round(1.32 + 0.18 * k, 2) for k in (1, 2, 3, 4, 6)}))
    assert picks == [2, 0], picks


@pytest.mark.parametrize("rule", sorted(POOR_RULES))
def test_lab05_choose_k_test_fails_a_poor_rule(lab05_formulas, rule):
    src, ns = lab05_formulas
    exec(compile(POOR_RULES[rule], "05_choose_k", "exec"), ns)
    with pytest.raises(AssertionError, match=r"under 95% of k = \d+'s"):
        exec(compile(src["05_choose_k_test"], "05_choose_k_test", "exec"), ns)


def test_lab05_choose_k_test_fails_a_rule_that_only_the_hidden_part_catches(lab05_formulas):
    """A rule tuned to the three visible machines (a table of their answers, k = 3 elsewhere)
    passes the visible part and loses the points in the hidden one."""
    src, ns = lab05_formulas
    exec(compile("def choose_k(alpha, c, verify_cost):\n"
                 "    return {0.83: 5, 0.8: 8, 0.3: 0}.get(alpha, 3)\n", "05_choose_k", "exec"), ns)
    visible, hidden = src["05_choose_k_test"].split("### BEGIN HIDDEN TESTS")
    exec(compile(visible, "05_choose_k_test (visible)", "exec"), ns)
    with pytest.raises(AssertionError, match="under 95%"):
        exec(compile(src["05_choose_k_test"], "05_choose_k_test", "exec"), ns)
