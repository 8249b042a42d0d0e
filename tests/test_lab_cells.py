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
from fairness_more import FIXED_BLOCKS, POW2_CHUNK_SEARCH, SEARCH_PLAN, SHORTEST_PROMPT_FIRST

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow          # ~15 s: each test runs lab 02's setup and test cells


def cells(lab: str) -> dict[str, str]:
    nb = json.loads((REPO / "labs" / lab / f"{lab}.ipynb").read_text())
    return {c["metadata"]["nbgrader"]["grade_id"]: "".join(c["source"]) for c in nb["cells"]
            if "grade_id" in c["metadata"].get("nbgrader", {})}


def namespace(lab: str, *setup: str, extra: str = ""):
    """A fixture's body: `setup`'s cells of `lab` (then `extra`) run in a fresh namespace,
    yielding (cells, namespace); the lab's setup sets one torch thread, restored afterwards."""
    threads = torch.get_num_threads()
    src, ns = cells(lab), {}
    for gid in setup:
        exec(compile(src[gid], gid, "exec"), ns)
    if extra:
        exec(extra, ns)
    yield src, ns
    torch.set_num_threads(threads)


def grade(ns: dict, src: dict, answer: str, test: str, code: str | None = None) -> None:
    """A design task as graded: the answer cell (the solution, or `code` in its place), then its
    whole test cell, visible and hidden parts."""
    exec(compile(src[answer] if code is None else code, answer, "exec"), ns)
    exec(compile(src[test], test, "exec"), ns)


@pytest.fixture
def lab02():
    """Lab 02's setup and cache cells run in a fresh namespace (the setup sets one torch thread:
    restored after the test)."""
    yield from namespace("02_kv_cache", "02_setup", "02_cache")


# the classic slip: the loop stops on a stop token only, so after the n-th token it still runs a
# decode step whose logits nobody samples (same tokens, one forward pass too many)
ONE_PASS_TOO_MANY = ("        if nxt in stop_ids or step == max_new_tokens - 1:\n            break",
                     "        if nxt in stop_ids:\n            break")


def test_lab02_generate_test_passes_the_solution(lab02):
    src, ns = lab02
    grade(ns, src, "02_generate_cached", "02_generate_test")


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
    with pytest.raises(AssertionError, match="not copies"):
        grade(ns, src, "02_cache", "02_cache_test", src["02_cache"].replace(old, new))


# --- lab 01: the serving choice, graded by its outcome -------------------------------------------
# Two different designs that land right get the cell's points (the search of the solution, and
# algebra on the napkin's formulas); choices that ignore a limit or a lever lose them.
CLOSED_FORM = '''
def choose_serving(scenario):
    m, gpu, gpus, S = scenario["model"], scenario["gpu"], scenario["gpus"], scenario["S"]
    params, best = num_params(**m), None
    for G in [d for d in range(1, gpus + 1) if not (gpus % d or m["N"] % d or m["K"] % d)]:
        for p in scenario["precisions"]:
            kv = kv_cache_bytes_per_seq(S, m["K"], m["H"], m["L"], p)
            link = 2 * m["L"] * 2 * (G - 1) / G * m["D"] * 2 / scenario["link_bandwidth"]
            per_seq = kv / G / gpu["bandwidth"] + link                # seconds per sequence
            fixed = params * p / G / gpu["bandwidth"] + (2 * m["L"] * scenario["allreduce_latency_s"]
                                                        if G > 1 else 0.0)
            B = min(math.floor((scenario["slo_s"] - fixed) / per_seq),
                    math.floor((gpu["memory"] - params * p / G) / (kv / G)))
            if B >= 1:
                tok_s = gpus // G * B / (fixed + per_seq * B)
                if best is None or tok_s > best[0]:
                    best = (tok_s, {"G": G, "B": B, "bytes_per_param": p})
    return best[1]
'''
ONLY_COPIES = '''
_solution = choose_serving
def choose_serving(scenario):
    return _solution(dict(scenario, gpus=1)) | {}   # the best one GPU can do, copied gpus times
'''
FILL_MEMORY = '''
def choose_serving(scenario):                        # the biggest batch the split holds; SLO ignored
    G = max(d for d in range(1, scenario["gpus"] + 1) if not (scenario["gpus"] % d or
            scenario["model"]["N"] % d or scenario["model"]["K"] % d))
    p = min(scenario["precisions"])
    gpu = dict(scenario["gpu"], memory=scenario["gpu"]["memory"] * G)
    return {"G": G, "B": max_batch_that_fits(scenario["S"], scenario["model"], gpu, p),
            "bytes_per_param": p}
'''
ONE_AT_A_TIME = '''
def choose_serving(scenario):                        # latency first: one sequence per copy
    return {"G": 1 if scenario["gpus"] == 1 else 2 if scenario["model"]["K"] % 2 == 0 else 1,
            "B": 1, "bytes_per_param": min(scenario["precisions"])}
'''
BF16_ALWAYS = '''
_solution = choose_serving
def choose_serving(scenario):                        # the right search, but never below bf16
    return _solution(dict(scenario, precisions=[max(scenario["precisions"])]))
'''


@pytest.fixture
def lab01_serving():
    import matplotlib
    matplotlib.use("Agg")
    yield from namespace("01_roofline", "01_setup", "01_shapes", "01_params_kv", "01_napkin",
                         "01_max_batch", "01_tensor_parallel", "01_serving_scenario")


# --- lab 03: the design task, graded on what a design achieves ------------------------------------
@pytest.fixture(scope="module")
def lab03():
    """Lab 03's setup in a fresh namespace (one torch thread: restored afterwards)."""
    yield from namespace("03_shrinking_kv", "03_setup")


# ---- design tasks graded by outcome: two different correct designs earn the points, a poor one
# loses them (the whole test cell, visible and hidden parts, as graded)

@pytest.fixture(scope="module")
def lab00_recipe():
    """Lab 00's setup and filters (the recipes are built from them), in a fresh namespace."""
    yield from namespace("00_sampling", "00_setup", "00_apply_temperature", "00_top_k_filter",
                         "00_top_p_filter")


# the solution cools to 0.8 and cuts with top-p 0.9; a second design keeps the 40 best tokens at
# temperature 0.8 (top-k and temperature, no nucleus). The student's own min-p rule
# (fairness_lab00.MIN_P_RECIPE) is graded through nbgrader in the fairness batch. Over 20 sets of
# 16 prompts (seeds 100-119): solution NLL 2.25-2.69, distinct-2 0.896-0.945; top-k 40 at 0.8
# 2.32-2.73, 0.896-0.944; min-p 0.1 1.98-2.38, 0.876-0.928 (thresholds: NLL <= 3.0, distinct-2 >= 0.85)
TOP_K_COOL = """
def my_recipe(logits, ids):
    return top_k_filter(apply_temperature(logits, 0.8), 40)
"""
# greedy loops (distinct-2 0.58-0.77 over the 20 sets); temperature 2 (NLL 8.5-9.1; plain sampling:
# 3.56-4.01) writes what the target finds unlikely
POOR_RECIPES = {
    "greedy": ("def my_recipe(logits, ids):\n    return top_k_filter(logits, 1)\n", "repeat themselves"),
    "temperature_2": ("def my_recipe(logits, ids):\n    return apply_temperature(logits, 2.0)\n",
                      "unlikely"),
}


@pytest.mark.parametrize("design", ["solution", "top_k_cool"])
def test_lab00_recipe_test_passes_two_different_designs(lab00_recipe, design):
    src, ns = lab00_recipe
    code = src["00_recipe"] if design == "solution" else TOP_K_COOL
    grade(ns, src, "00_recipe", "00_recipe_test", code)


@pytest.mark.parametrize("design", sorted(POOR_RECIPES))
def test_lab00_recipe_test_fails_a_poor_design(lab00_recipe, design):
    src, ns = lab00_recipe
    code, why = POOR_RECIPES[design]
    with pytest.raises(AssertionError, match=why):
        grade(ns, src, "00_recipe", "00_recipe_test", code)


@pytest.fixture(scope="module")
def lab02_growing():
    yield from namespace("02_kv_cache", "02_setup")


# the second design, unlike the solution's doubling, is fairness_more.FIXED_BLOCKS: blocks of 64
# positions that never move, the cache attending over them itself (also graded through nbgrader
# in the fairness batch)
_DOUBLING_START = "shape = (batch_size, n_kv_heads, 16, head_dim)"
POOR_CACHES = {
    # the simplest growth: torch.cat at every step of every layer copies the whole history
    "cat_per_token": ("""
class GrowingKVCache:
    def __init__(self, n_layers, batch_size, n_kv_heads, head_dim, dtype=torch.float32, device="cpu"):
        self.k, self.v, self.seq_len = [None] * n_layers, [None] * n_layers, 0

    def update(self, layer_idx, k, v, positions):
        if self.k[layer_idx] is not None:
            k = torch.cat([self.k[layer_idx], k], dim=2)
            v = torch.cat([self.v[layer_idx], v], dim=2)
        self.k[layer_idx], self.v[layer_idx] = k, v
        return k, v, torch.arange(k.shape[2])

    def advance(self, positions):
        self.seq_len += positions.shape[-1]

    @classmethod
    def for_model(cls, model, batch_size):
        c = model.config
        return cls(c.n_layers, batch_size, c.n_kv_heads, c.head_dim)
""", "copied"),
    # no copy on arrival: keep the model's k and v tensors in a list, and concatenate them for
    # attention at every step (the model's own tensors count as the cache's once it keeps them)
    "list_then_cat": ("""
class GrowingKVCache:
    def __init__(self, n_layers, batch_size, n_kv_heads, head_dim, dtype=torch.float32, device="cpu"):
        self.ks, self.vs, self.seq_len = [[] for _ in range(n_layers)], [[] for _ in range(n_layers)], 0

    def update(self, layer_idx, k, v, positions):
        self.ks[layer_idx].append(k)
        self.vs[layer_idx].append(v)
        k_all, v_all = torch.cat(self.ks[layer_idx], dim=2), torch.cat(self.vs[layer_idx], dim=2)
        return k_all, v_all, torch.arange(k_all.shape[2])

    def advance(self, positions):
        self.seq_len += positions.shape[-1]

    @classmethod
    def for_model(cls, model, batch_size):
        c = model.config
        return cls(c.n_layers, batch_size, c.n_kv_heads, c.head_dim)
""", "copied"),
    # the solution's doubling, started at the model's whole context: nothing to copy, but 512
    # positions held for a few
    "whole_context": (_DOUBLING_START, "storage alive"),
}


@pytest.mark.parametrize("design", ["solution", "fixed_blocks"])
def test_lab02_growing_test_passes_two_different_designs(lab02_growing, design):
    src, ns = lab02_growing
    code = src["02_growing_cache"] if design == "solution" else FIXED_BLOCKS
    grade(ns, src, "02_growing_cache", "02_growing_test", code)


@pytest.mark.parametrize("design", sorted(POOR_CACHES))
def test_lab02_growing_test_fails_a_poor_design(lab02_growing, design):
    src, ns = lab02_growing
    code, why = POOR_CACHES[design]
    if code == _DOUBLING_START:
        assert code in src["02_growing_cache"], "the solution's start changed: update this test"
        code = src["02_growing_cache"].replace(code, code.replace("16", "512"))
    with pytest.raises(AssertionError, match=why):
        grade(ns, src, "02_growing_cache", "02_growing_test", code)


@pytest.fixture(scope="module")
def lab06_policy():
    yield from namespace("06_continuous_batching", "06_setup")


@pytest.mark.parametrize("design", ["solution", "closed form"])
def test_lab01_serving_choice_two_designs_get_the_points(lab01_serving, design):
    src, ns = lab01_serving
    code = src["01_choose_serving"] if design == "solution" else CLOSED_FORM
    exec(compile(code, design, "exec"), ns)
    exec(compile(src["01_choose_serving_test"], "01_choose_serving_test", "exec"), ns)


@pytest.mark.parametrize("design,why", [
    ("only copies", "of the best throughput"), ("fill the memory", "over the SLO"),
    ("one at a time", "of the best throughput"), ("bf16 always", "of the best throughput")])
def test_lab01_serving_choice_poor_designs_lose_the_points(lab01_serving, design, why):
    src, ns = lab01_serving
    exec(compile(src["01_choose_serving"], "01_choose_serving", "exec"), ns)
    code = {"only copies": ONLY_COPIES, "fill the memory": FILL_MEMORY,
            "one at a time": ONE_AT_A_TIME, "bf16 always": BF16_ALWAYS}[design]
    exec(compile(code, design, "exec"), ns)
    with pytest.raises(AssertionError) as e:
        exec(compile(src["01_choose_serving_test"], "01_choose_serving_test", "exec"), ns)
    assert why in str(e.value), str(e.value)


def test_lab01_serving_choice_hidden_scenarios_need_the_split_and_the_search(lab01_serving):
    """The visible setting alone is not the grade: a choice tuned to it (G = 4, B = 145, int8)
    fails the fresh scenarios."""
    src, ns = lab01_serving
    exec(compile("def choose_serving(scenario):\n    return {'G': 4, 'B': 145, 'bytes_per_param': 1}\n",
                 "constant", "exec"), ns)
    visible, hidden = src["01_choose_serving_test"].split("### BEGIN HIDDEN TESTS")
    exec(compile(visible, "visible", "exec"), ns)
    with pytest.raises(AssertionError):
        exec(compile(hidden, "hidden", "exec"), ns)


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
    grade(ns, src, "03_design", "03_design_test", code)     # visible and hidden
    printed = capsys.readouterr().out
    assert printed.count("full marks at most") == 4 and "visible check passed" in printed, printed


@pytest.mark.parametrize("poor", list(POOR))
def test_lab03_a_poor_design_loses_the_design_points(lab03, poor):
    src, ns = lab03
    code, why = POOR[poor]
    with pytest.raises(AssertionError, match=why.replace(".", r"\.")):
        grade(ns, src, "03_design", "03_design_test", code)


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
    grade(ns, src, "05_choose_k", "05_choose_k_test",                   # visible + hidden
          src["05_choose_k"] if rule == "solution" else CLIMB)
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
    with pytest.raises(AssertionError, match=r"under 95% of k = \d+'s"):
        grade(ns, src, "05_choose_k", "05_choose_k_test", POOR_RULES[rule])


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


# a second design, unlike the solution's decode-first token budget: whole prompts, but a free
# seat goes to the shortest waiting prompt (it cuts the mean TTFT, not the inter-token latency;
# fairness_more.SHORTEST_PROMPT_FIRST, also graded through nbgrader in the fairness batch)
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
    grade(ns, src, "06_policy", "06_policy_test", code)


@pytest.mark.parametrize("design", sorted(POOR_POLICIES))
def test_lab06_policy_test_fails_a_poor_design(lab06_policy, design):
    src, ns = lab06_policy
    code, why = POOR_POLICIES[design]
    with pytest.raises((AssertionError, ValueError), match=why):
        grade(ns, src, "06_policy", "06_policy_test", code)


@pytest.fixture(scope="module")
def lab08_plan():
    """Lab 08's setup, the course's scores (`ref`) and layer losses (`drop_loss`), as the
    notebook computes them before the plan's test."""
    yield from namespace("08_pruning_distillation", "08_setup", "08_calib", "08_prune",
                         extra="ref = pruning.importance(target, CALIB)\n"
                               "drop_loss = pruning.layer_drop_loss(target, CALIB[:2])")


# the second design, unlike the solution's fixed recipe, is fairness_more.SEARCH_PLAN: for each
# number of heads the most neurons the budget allows, then the candidate whose pruned model has
# the lowest loss on one calibration batch
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
    grade(ns, src, "08_plan", "08_plan_test", None if design == "solution" else SEARCH_PLAN)


@pytest.mark.parametrize("design", sorted(POOR_PLANS))
def test_lab08_plan_test_fails_a_poor_design(lab08_plan, design):
    src, ns = lab08_plan
    code, why = POOR_PLANS[design]
    with pytest.raises(AssertionError, match=why):
        grade(ns, src, "08_plan", "08_plan_test", code)


# ---- lab 09's chunk-length rule (09_chunk_rule_test): graded on the lab's cost model ----------
# The test cell needs only `lab09` (the grading module) and the rule: no setup, no model. The
# second design, unlike the solution's balance formula, is fairness_more.POW2_CHUNK_SEARCH: a
# search over powers of two on an estimate of the student's own (also graded through nbgrader in
# the fairness batch).
def lab09_rule_cells():
    src = cells("09_beyond_attention")
    return src["09_chunk_rule"], src["09_chunk_rule_test"]


def _grade_rule(code: str) -> dict:
    import math

    from autograder.labs import lab09
    rule, test = lab09_rule_cells()
    ns = {"math": math, "lab09": lab09}
    exec(compile(code or rule, "09_chunk_rule", "exec"), ns)
    exec(compile(test, "09_chunk_rule_test", "exec"), ns)
    return ns


POOR_CHUNK_RULES = {
    # the library's constant
    "always_64": "def choose_chunk(T, batch, n_heads, head_dim, machine):\n    return min(64, T)\n",
    # the parallel form: one chunk
    "one_chunk": "def choose_chunk(T, batch, n_heads, head_dim, machine):\n    return T\n",
    # the balance, but for one head of one sequence: it forgets that the C x C work is per head
    # and per sequence while the fixed cost is per chunk
    "forgets_batch_and_heads": '''
def choose_chunk(T, batch, n_heads, head_dim, machine):
    m = machine
    c = math.sqrt(m["per_chunk_us"] / (4 * head_dim / m["flops_per_us"] + m["per_score_us"]))
    return max(1, min(T, round(c)))
''',
}


@pytest.mark.parametrize("design", ["solution", "pow2_search"])
def test_lab09_chunk_rule_test_passes_two_different_designs(design, capsys):
    ns = _grade_rule(None if design == "solution" else POW2_CHUNK_SEARCH)
    assert "choose_chunk: visible checks passed" in capsys.readouterr().out
    from autograder.labs import lab09
    picks = {ns["choose_chunk"](T, B, N, H, lab09.MACHINES[m]) for m, T, B, N, H in lab09.CHUNK_CASES}
    assert len(picks) >= 6                                    # a rule, not a constant


def test_lab09_the_two_chunk_rules_choose_differently():
    from autograder.labs import lab09
    a, b = _grade_rule(None)["choose_chunk"], _grade_rule(POW2_CHUNK_SEARCH)["choose_chunk"]
    differ = [c for c in lab09.CHUNK_CASES
              if a(*c[1:], lab09.MACHINES[c[0]]) != b(*c[1:], lab09.MACHINES[c[0]])]
    assert len(differ) >= 50, len(differ)


@pytest.mark.parametrize("design", sorted(POOR_CHUNK_RULES))
def test_lab09_chunk_rule_test_fails_a_poor_design(design):
    with pytest.raises(AssertionError, match="cases: the model's time at your chunk is more than"):
        _grade_rule(POOR_CHUNK_RULES[design])


def test_lab09_chunk_rule_test_refuses_a_chunk_outside_1_to_T():
    with pytest.raises(AssertionError, match="an int in 1..T"):
        _grade_rule("def choose_chunk(T, batch, n_heads, head_dim, machine):\n    return 2 * T\n")
