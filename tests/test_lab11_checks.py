"""Lab 11's checks (autograder/labs/lab11.py) tell a correct split from the usual mistakes.

Each candidate `shard_block` runs in 2 (or 4) real gloo ranks forked from this process, as the
probes run it in a student's kernel: the notebook's solution and a second design (tests/
fairness_more.py: weight slices, attention written out, `dist.all_reduce` called directly) pass
every check; a module that keeps the whole block and never communicates, one that all-reduces
three times, one that keeps views of the whole weights, one that keeps the block itself, and one
that never refuses a bad world size each fail exactly the check that names its mistake."""
from __future__ import annotations

import copy

import fairness_more
import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from lab_notebook import LabNotebook

from autograder.labs import lab11

NB = LabNotebook("11_sharding")
CHECKS = ("output", "collectives", "bytes")
BAD_WORLD = dict(dim=96, n_heads=6, n_kv_heads=6, hidden_dim=128, head_dim=16)


def _define(source: str) -> dict:
    ns = {"torch": torch, "dist": dist, "nn": nn, "copy": copy}
    exec(compile(source, "shard_block", "exec"), ns)
    return ns


SOLUTION = _define(NB.by_id("11_shard_block"))["shard_block"]
SECOND = _define(fairness_more.SHARDED_MODULE)["shard_block"]


class Unsplit(nn.Module):
    """The whole block on every rank: right outputs, no all-reduce, every weight."""

    def __init__(self, block):
        super().__init__()
        self.block = copy.deepcopy(block)

    def forward(self, x, cos, sin, positions=None, cache=None):
        return self.block(x, cos, sin, positions, cache)


def unsplit(block, rank, world, group=None):
    if block.self_attn.n_heads % world:
        raise ValueError("heads")
    return Unsplit(block)


def three_all_reduces(block, rank, world, group=None):
    """The solution, plus an all-reduce that 'syncs' the input first (then divides it back)."""
    part = SOLUTION(block, rank, world)
    inner = part.forward

    def forward(x, cos, sin, positions=None, cache=None):
        x = x.clone()
        dist.all_reduce(x)
        return inner(x / world, cos, sin, positions, cache)
    part.forward = forward
    return part


def views(block, rank, world, group=None):
    """The solution's module with each projection's weight swapped for a view of the whole one."""
    part = SOLUTION(block, rank, world)
    a, m, fa, fm = part.self_attn, part.mlp, block.self_attn, block.mlp
    q, H = a.n_heads, a.head_dim
    kv = a.k_proj.weight.shape[0]
    start = [i for i in range(0, fa.k_proj.weight.shape[0] - kv + 1, H)
             if torch.equal(fa.k_proj.weight[i:i + kv], a.k_proj.weight)][0]
    f = m.up_proj.weight.shape[0]
    with torch.no_grad():
        a.q_proj.weight = nn.Parameter(fa.q_proj.weight[rank * q * H:(rank + 1) * q * H])
        a.k_proj.weight = nn.Parameter(fa.k_proj.weight[start:start + kv])
        a.v_proj.weight = nn.Parameter(fa.v_proj.weight[start:start + kv])
        a.o_proj.weight = nn.Parameter(fa.o_proj.weight[:, rank * q * H:(rank + 1) * q * H])
        m.gate_proj.weight = nn.Parameter(fm.gate_proj.weight[rank * f:(rank + 1) * f])
        m.up_proj.weight = nn.Parameter(fm.up_proj.weight[rank * f:(rank + 1) * f])
        m.down_proj.weight = nn.Parameter(fm.down_proj.weight[:, rank * f:(rank + 1) * f])
    return part


def keeps_the_block(block, rank, world, group=None):
    part = SOLUTION(block, rank, world)
    part.whole = [block]                  # "for reference": a list, still kept alive
    return part


def numpy_copy(block, rank, world, group=None):
    part = SOLUTION(block, rank, world)
    part.spare = block.mlp.up_proj.weight.detach().numpy().copy()   # a whole weight, in NumPy
    return part


def never_refuses(block, rank, world, group=None):
    try:
        return SOLUTION(block, rank, world)
    except ValueError:
        return nn.Identity()


def _failed_checks(shard_block, case="gqa", seed=3) -> set:
    """The checks of lab11.check_block that one run of shard_block fails."""
    ranks = lab11.block_run(shard_block, case, seed)
    failed = set()
    for what in CHECKS:
        try:
            lab11.check_block(shard_block, case, seed, what=(what,), ranks=ranks)
        except AssertionError as e:
            failed.add(what)
            assert str(e), "a failure names its problem"
    return failed


@pytest.mark.parametrize("design", [SOLUTION, SECOND], ids=["solution", "weight_slices"])
@pytest.mark.parametrize("case", sorted(lab11.BLOCK_CASES))
def test_both_designs_pass_every_check(design, case):
    assert _failed_checks(design, case, seed=11) == set()


@pytest.mark.parametrize("design", [SOLUTION, SECOND], ids=["solution", "weight_slices"])
def test_both_designs_refuse_a_bad_world_and_give_the_whole_models_tokens(design):
    assert all(s.startswith("ValueError") for s in lab11.refusal(design, BAD_WORLD, 4))
    prompt = [5, 77, 301, 12, 9]
    import minillm
    want = lab11.greedy(minillm.load("target"), prompt, 6)
    assert lab11.split_tokens(design, prompt, 6) == [want, want]


@pytest.mark.parametrize("mistake, fails", [
    (unsplit, {"collectives", "bytes"}),
    (three_all_reduces, {"collectives"}),
    (views, {"bytes"}),
    (keeps_the_block, {"bytes"}),
    (numpy_copy, {"bytes"}),
], ids=["unsplit", "three_all_reduces", "views", "keeps_the_block", "numpy_copy"])
def test_each_mistake_fails_the_check_that_names_it(mistake, fails):
    assert _failed_checks(mistake) == fails


def test_a_split_that_never_refuses_fails_the_refusal():
    said = lab11.refusal(never_refuses, BAD_WORLD, 4)
    assert said == [None] * 4
