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


# ---- design tasks graded by outcome: two different correct designs earn the points, a poor one
# loses them (the whole test cell, visible and hidden parts, as graded)

@pytest.fixture(scope="module")
def lab06_policy():
    threads = torch.get_num_threads()
    src = cells("06_continuous_batching")
    ns: dict = {}
    exec(compile(src["06_setup"], "06_setup", "exec"), ns)
    yield src, ns
    torch.set_num_threads(threads)


# a second design, unlike the solution's decode-first token budget: whole prompts, but a free
# seat goes to the shortest waiting prompt (it cuts the mean TTFT, not the inter-token latency)
SHORTEST_PROMPT_FIRST = '''
def my_policy(now, waiting, running, max_seqs):
    plan = {q.id: q.prompt_len - q.prefilled or 1 for q in running}
    for q in sorted(waiting, key=lambda q: q.prompt_len)[:max_seqs - len(running)]:
        plan[q.id] = q.prompt_len
    return plan
'''
POOR_POLICIES = {
    # one request at a time: short gaps between tokens, but the seats sit idle
    "one_at_a_time": ('''
def my_policy(now, waiting, running, max_seqs):
    if running:
        return {q.id: q.prompt_len - q.prefilled or 1 for q in running}
    return {waiting[0].id: waiting[0].prompt_len}
''', "throughput"),
    # FCFS with a different ordering that helps nobody: the longest prompt first
    "longest_first": ('''
def my_policy(now, waiting, running, max_seqs):
    plan = {q.id: q.prompt_len - q.prefilled or 1 for q in running}
    for q in sorted(waiting, key=lambda q: -q.prompt_len)[:max_seqs - len(running)]:
        plan[q.id] = q.prompt_len
    return plan
''', "cut neither"),
    # a decode of two tokens at once: the simulator refuses the plan
    "two_token_decode": ('''
def my_policy(now, waiting, running, max_seqs):
    plan = {q.id: q.prompt_len - q.prefilled or 2 for q in running}
    for q in waiting[:max_seqs - len(running)]:
        plan[q.id] = q.prompt_len
    return plan
''', "1 token a step"),
}


@pytest.mark.parametrize("design", ["solution", "shortest_prompt_first"])
def test_lab06_policy_test_passes_two_different_designs(lab06_policy, design):
    src, ns = lab06_policy
    code = src["06_policy"] if design == "solution" else SHORTEST_PROMPT_FIRST
    exec(compile(code, "06_policy", "exec"), ns)
    exec(compile(src["06_policy_test"], "06_policy_test", "exec"), ns)


@pytest.mark.parametrize("design", sorted(POOR_POLICIES))
def test_lab06_policy_test_fails_a_poor_design(lab06_policy, design):
    src, ns = lab06_policy
    code, why = POOR_POLICIES[design]
    exec(compile(code, "06_policy", "exec"), ns)
    with pytest.raises((AssertionError, ValueError), match=why):
        exec(compile(src["06_policy_test"], "06_policy_test", "exec"), ns)


@pytest.fixture(scope="module")
def lab08_plan():
    """Lab 08's setup, the course's scores (`ref`) and layer losses (`drop_loss`), as the
    notebook computes them before the plan's test."""
    threads = torch.get_num_threads()
    src = cells("08_pruning_distillation")
    ns: dict = {}
    exec(compile(src["08_setup"], "08_setup", "exec"), ns)
    exec(compile(src["08_calib"], "08_calib", "exec"), ns)
    exec(compile(src["08_prune"], "08_prune", "exec"), ns)
    exec("ref = pruning.importance(target, CALIB)\n"
         "drop_loss = pruning.layer_drop_loss(target, CALIB[:2])", ns)
    yield src, ns
    torch.set_num_threads(threads)


# a second design, unlike the solution's fixed recipe: a search. For each number of heads, the
# most neurons the budget allows; then the candidate whose pruned model (the student's own
# prune_model) has the lowest loss on one calibration batch
SEARCH = '''
def pruning_plan(imp, layer_loss, budget):
    best = None
    for n_heads in range(2, 7):
        for hidden in range(1024, 0, -16):
            if replace(target.config, n_heads=n_heads, n_kv_heads=None,
                       hidden_dim=hidden).num_params() <= budget:
                keep = pruning.choose(imp, n_heads=n_heads, hidden_dim=hidden)
                loss = pruning.lm_loss(prune_model(target, keep), CALIB[:1])
                if best is None or loss < best[0]:
                    best = (loss, keep)
                break
    return best[1]
'''
POOR_PLANS = {
    # the solution's shape, but random heads and neurons instead of the top-scored ones
    "random_parts": ('''
def pruning_plan(imp, layer_loss, budget):
    import random
    rng = random.Random(0)
    for hidden in range(1024, 0, -8):
        if replace(target.config, n_heads=4, n_kv_heads=None, hidden_dim=hidden).num_params() <= budget:
            break
    L = target.config.n_layers
    return pruning.Keep(list(range(L)), [sorted(rng.sample(range(6), 4)) for _ in range(L)],
                        [sorted(rng.sample(range(1024), hidden)) for _ in range(L)], list(range(384)))
''', "nats above"),
    # the right scores, 8 neurons a layer too many: over the budget
    "over_budget": ('''
def pruning_plan(imp, layer_loss, budget):
    for hidden in range(1024, 0, -8):
        if replace(target.config, n_heads=4, n_kv_heads=None, hidden_dim=hidden).num_params() <= budget:
            return pruning.choose(imp, n_heads=4, hidden_dim=hidden + 8)
''', "over the budget"),
}


@pytest.mark.parametrize("design", ["solution", "search"])
def test_lab08_plan_test_passes_two_different_designs(lab08_plan, design):
    src, ns = lab08_plan
    exec(compile(src["08_plan"] if design == "solution" else SEARCH, "08_plan", "exec"), ns)
    exec(compile(src["08_plan_test"], "08_plan_test", "exec"), ns)


@pytest.mark.parametrize("design", sorted(POOR_PLANS))
def test_lab08_plan_test_fails_a_poor_design(lab08_plan, design):
    src, ns = lab08_plan
    code, why = POOR_PLANS[design]
    exec(compile(code, "08_plan", "exec"), ns)
    with pytest.raises(AssertionError, match=why):
        exec(compile(src["08_plan_test"], "08_plan_test", "exec"), ns)
