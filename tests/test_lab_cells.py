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


# --- lab 03: the design task, graded on what a design achieves ------------------------------------
@pytest.fixture(scope="module")
def lab03():
    """Lab 03's setup in a fresh namespace (one torch thread: restored afterwards)."""
    threads = torch.get_num_threads()
    src = cells("03_shrinking_kv")
    ns: dict = {}
    exec(compile(src["03_setup"], "03_setup", "exec"), ns)
    yield src, ns
    torch.set_num_threads(threads)


# a second correct design, unlike the solution's (int8 MLA latents): int8 only where the whole MHA
# cache fits, bf16 MLA latents as wide as the budget allows everywhere else
BF16_LATENTS = '''
def design_for_budget(budget):
    if budget >= 4752:
        return [("int8",)]
    return [("mla", int(budget // 12) - 32, "svd")]
'''
# plausible poor designs: the GQA sweep's lesson not learnt; the bytes counted without the scales;
# a rope key that throws away most of the heads' positions
POOR = {
    "the most KV heads that fit, int8": ('''
def design_for_budget(budget):
    return [("gqa", max(k for k in (1, 2, 3, 6) if 6 * k * (2 * 64 + 2 * 2) <= budget)), ("int8",)]
''', "more than 1.05 x the best"),
    "int8 scales forgotten": ('''
def design_for_budget(budget):
    return [("mla", min(384, int(budget // 6) - 32), "svd"), ("int8",)]
''', "the design caches"),
    "the mean rope key": ('''
def design_for_budget(budget):
    return [("int8",)] if budget >= 4752 else [("mla", int(budget // 6) - 36, "mean"), ("int8",)]
''', "more than 1.05 x the best"),
}


@pytest.mark.parametrize("design", ["solution", "bf16 latents"])
def test_lab03_two_different_designs_earn_the_design_points(lab03, design, capsys):
    src, ns = lab03
    code = src["03_design"] if design == "solution" else BF16_LATENTS
    exec(compile(code, "03_design", "exec"), ns)
    exec(compile(src["03_design_test"], "03_design_test", "exec"), ns)     # visible and hidden
    printed = capsys.readouterr().out
    assert printed.count("full marks at most") == 4 and "visible check passed" in printed, printed


@pytest.mark.parametrize("poor", list(POOR))
def test_lab03_a_poor_design_loses_the_design_points(lab03, poor):
    src, ns = lab03
    code, why = POOR[poor]
    exec(compile(code, "03_design", "exec"), ns)
    with pytest.raises(AssertionError, match=why.replace(".", r"\.")):
        exec(compile(src["03_design_test"], "03_design_test", "exec"), ns)
