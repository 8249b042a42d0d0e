"""Lab 07 (Triton kernels: lab07_triton.py): `BlockPool` and `pool_run`; the speed check times the
student's torch paged decode against the course's reference; the split-count design task's GPU
model (`split_decode_us`) and its check (`check_split_rule`)."""
from __future__ import annotations

import functools
from collections import deque
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from autograder.labs import args_after, whole_number
from autograder.labs.speedcheck import SpeedCheck, assert_tensor_close, one_torch_thread
from autograder.probes import probe
from autograder.timing import time_ratio
from kernels.intmath import cdiv
from kernels.paged_attention_ref import paged_attention_decode_ref
from kernels.split_model import (  # noqa: F401 (the notebook's lab07.split_decode_us, ...)
    H100_SWEEP_US,
    MAX_SPLITS,
    SPLIT_GPU,
    best_split_us,
    split_decode_us,
)

# (context lengths, query heads N, KV heads K, head dim H, block size): ragged, GQA groups of 4
CASE = ([3000, 2100, 2700, 3072], 8, 2, 32, 16)
# time(reference) / time(student), loaded, in the tester: the reference 0.73-1.41, the solution
# (a per-sequence gather) 0.73-0.87, a per-token loop 0.05-0.06
THRESHOLD = 0.25
WARMUP, REPEATS = 1, 7


@dataclass
class BlockPool:
    num_blocks: int
    block_size: int
    free: deque = None                              # free block ids, oldest-freed first
    ref_count: list = None                          # ref_count[b]: tables holding block b
    tables: dict = field(default_factory=dict)      # seq_id -> [block ids]
    lengths: dict = field(default_factory=dict)     # seq_id -> tokens held

    def __post_init__(self):
        if self.free is None:
            self.free = deque(range(self.num_blocks))
        if self.ref_count is None:
            self.ref_count = [0] * self.num_blocks

    def used_blocks(self):
        return self.num_blocks - len(self.free)


@probe
def pool_run(fns: dict, ops, num_blocks: int, block_size: int) -> list[dict]:
    """Replay ops (kind, *args) on a fresh BlockPool with fns[kind]: the pool after each."""
    pool, steps = BlockPool(num_blocks, block_size), []
    for kind, *args in ops:
        try:
            res = fns[kind](pool, *args)
            res = None if kind == "free" else [tuple(c) for c in res] if kind == "append" \
                else list(res)
        except NotImplementedError:
            raise
        except RuntimeError:
            res = "RuntimeError"
        steps.append({"result": res, "free": list(pool.free), "ref_count": list(pool.ref_count),
                      "tables": {k: list(v) for k, v in pool.tables.items()},
                      "lengths": dict(pool.lengths)})
    return steps


def make_case(seed: int = 0, case=CASE):
    """(q, k_cache, v_cache, block_tables, context_lens): shuffled blocks, NaN in unowned slots."""
    lens, N, K, H, block = case
    g = torch.Generator().manual_seed(seed)
    need = [cdiv(L, block) for L in lens]
    num_blocks = sum(need) + 4
    k_cache = torch.randn(num_blocks, block, K, H, generator=g)
    v_cache = torch.randn(num_blocks, block, K, H, generator=g)
    perm = torch.randperm(num_blocks, generator=g).tolist()
    tables = torch.full((len(lens), max(need)), -1, dtype=torch.int32)
    used = torch.zeros(num_blocks, block, dtype=torch.bool)
    for b, L in enumerate(lens):
        ids = perm[sum(need[:b]):sum(need[:b + 1])]
        tables[b, :need[b]] = torch.tensor(ids, dtype=torch.int32)
        pos = torch.arange(L)
        used[torch.tensor(ids)[pos // block], pos % block] = True
    k_cache[~used] = float("nan")
    v_cache[~used] = float("nan")
    q = torch.randn(len(lens), N, H, generator=g)
    return q, k_cache, v_cache, tables, torch.tensor(lens, dtype=torch.int32)


_kept_case = functools.cache(make_case)


@probe
def decode_output(fn, seed: int = 0):
    with torch.no_grad():
        return fn(*make_case(seed))


@probe
def timed_decode(fn, seed: int = 0) -> None:
    with torch.no_grad(), one_torch_thread():
        fn(*_kept_case(seed))


def paged_decode_speed(fn, *, seed: int = 0, warmup: int = WARMUP, repeats: int = REPEATS):
    """Check fn's output, then .ratio = median(reference) / median(fn) on CASE, interleaved."""
    case = make_case(seed)
    reference = torch.no_grad()(lambda: paged_attention_decode_ref(*case))
    assert_tensor_close(decode_output(fn, seed), reference(), 1e-4,
                        "paged decode output on the timing batch vs the reference")
    return time_ratio(reference, lambda: timed_decode(fn, seed), warmup=warmup, repeats=repeats)


def per_token_decode(q, k_cache, v_cache, block_tables, context_lens, scale=None):
    """The counter-example: the same math, gathering one position at a time in Python."""
    B, N, H = q.shape
    K, block = k_cache.shape[2], k_cache.shape[1]
    out = torch.empty_like(q)
    for b in range(B):
        table = block_tables[b].tolist()
        ks, vs = [], []
        for p in range(int(context_lens[b])):
            slot = table[p // block] * block + p % block
            ks.append(k_cache[slot // block, slot % block])
            vs.append(v_cache[slot // block, slot % block])
        k, v = torch.stack(ks, 1), torch.stack(vs, 1)                  # [K, L, H]
        qg = q[b].reshape(K, N // K, 1, H)
        out[b] = F.scaled_dot_product_attention(qg, k[:, None], v[:, None],
                                                scale=scale).reshape(N, H)
    return out


SPEED_CHECK = SpeedCheck(
    grade_id="07_speed_test", threshold=THRESHOLD, measure=paged_decode_speed,
    reference=paged_attention_decode_ref, counter_example=per_token_decode,
    solution=("paged_decode_torch", "07_slot_mapping", "07_paged_attention"),
    hint="your paged decode took {candidate_ms:.3g} ms for 4 sequences of 2100-3072 tokens, "
         "{ratio:.2f}x the speed of the course's torch reference ({baseline_ms:.3g} ms, median of "
         "{runs} interleaved runs); it must reach {at_least:g}x. Gather each sequence's K/V with "
         "one indexing operation on all its slots, not a Python loop over positions.")
check_paged_decode_speed = SPEED_CHECK.check


# ---- the split-count design task, graded on kernels/split_model.py's cost model of an H100 --
# graded: the model's time at the rule's choice within 20 % (or 5 us) of the model's best over
# 1..MAX_SPLITS splits, on every shape (batch, KV heads, context, block size) of SPLIT_SHAPES
SPLIT_TOLERANCE = {"relative": 0.20, "absolute_us": 5.0}
SPLIT_SHAPES = tuple((b, k, L, 16) for b in (1, 2, 4, 8, 32, 64) for k in (1, 2, 8)
                     for L in (2048, 8192, 32768))
SPLIT_SHAPES_VISIBLE = ((1, 8, 32768, 16), (32, 8, 4096, 16), (4, 2, 8192, 16))


@probe
def split_choices(choose, shapes, n_sm: int) -> list:
    """The student's choose_num_splits on each (batch, n_kv_heads, context_len, block_size)."""
    return [choose(b, k, L, bs, n_sm) for b, k, L, bs in shapes]


def check_split_rule(choose, shapes=SPLIT_SHAPES, *, quiet: bool = False) -> list[dict]:
    """AssertionError unless the rule's choice is within SPLIT_TOLERANCE of the model's best on
    every shape; prints one line per shape unless quiet. Returns the rows."""
    rows, bad = [], []
    for (b, k, L, bs), s in zip(shapes, split_choices(choose, list(shapes), SPLIT_GPU["n_sm"])):
        s = whole_number(s, 1, MAX_SPLITS,
                         f"choose_num_splits({b}, {k}, {L}, {bs}, {SPLIT_GPU['n_sm']})")
        got, best = split_decode_us(b, k, L, s, bs), best_split_us(b, k, L, bs)
        ok = got <= best * (1 + SPLIT_TOLERANCE["relative"]) or \
            got <= best + SPLIT_TOLERANCE["absolute_us"]
        rows.append({"shape": (b, k, L, bs), "splits": s, "us": got, "best_us": best, "ok": ok})
        if not quiet:
            print(f"  batch {b:>2}, {k} KV heads, {L:>5} tokens: {s:>3} splits -> {got:6.1f} us, "
                  f"best {best:6.1f} us ({got / best:.2f}x){'' if ok else '  TOO SLOW'}")
        if not ok:
            bad.append(rows[-1])
    if bad:
        worst = max(bad, key=lambda r: r["us"] / r["best_us"])
        raise AssertionError(
            f"{len(bad)} of {len(rows)} shapes: the model's time at your split count is more than "
            f"{SPLIT_TOLERANCE['relative']:.0%} (and {SPLIT_TOLERANCE['absolute_us']:g} us) above "
            f"its best; worst: batch {worst['shape'][0]}, {worst['shape'][1]} KV heads, "
            f"{worst['shape'][2]} tokens: {worst['splits']} splits, {worst['us']:.1f} us against "
            f"{worst['best_us']:.1f} us. Too few splits leave SMs idle; too many pay the merge "
            f"and a start per wave for little work each")
    return rows


__all__ = ["args_after", "BlockPool", "pool_run", "decode_output", "timed_decode", "make_case",
           "check_paged_decode_speed", "split_decode_us", "best_split_us", "split_choices",
           "check_split_rule", "SPLIT_GPU", "SPLIT_SHAPES", "SPLIT_TOLERANCE", "H100_SWEEP_US"]
