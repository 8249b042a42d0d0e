"""Lab 07 speed check: a paged decode step in torch gathers each sequence's cache with a few
indexing operations, not one Python step per token.

The lab's claim: reading K/V through a block table is one gather (`slot = table[pos // B] * B +
pos % B` for all positions, then index the pool with all slots at once); the indirection itself
is cheap. The usual way to lose this is a Python loop over token positions: two small tensor
operations per token and layer, tens of thousands per decode step. Two checks, on one batch of
four ragged sequences (CASE: 2100-3072 tokens, 8 query / 2 KV heads of 32, blocks of 16):

* exact (`count_torch_calls`, visible in the notebook): the number of torch function calls the
  student's `paged_decode_torch` makes for the batch must be smaller than the number of context
  tokens it attends to. A loop over blocks is fine (a block holds 16 tokens); a loop over tokens
  needs at least two calls per token and cannot pass;
* timed (`check_paged_decode_speed`, hidden): median time of `per_sequence_decode` (the lab's
  solution, defined here: per sequence, all slots gathered at once) over the median time of the
  student's function, measured interleaved on one torch thread, must reach THRESHOLD. The output
  must match `kernels.paged_attention_ref.paged_attention_decode_ref` first (a fast wrong answer
  earns nothing).

Measured on the shared 2-core development machine (other sessions' jobs running throughout),
20 runs of `paged_decode_speed` on each candidate in turn, 8 of them with a busy loop spinning
on one core: the lab's solution against itself 0.41x to 2.06x (median 1.02x); the kernels'
padded reference 0.22x to 0.80x (median 0.50x); the per-token loop 0.028x to 0.070x (median
0.046x). THRESHOLD = 0.15 is 2.7x under the worst run of the lab's solution and 2.1x over the
best per-token run. Each check takes ~0.3 s (the per-token loop: ~1 s).

    from autograder.labs import lab07
    lab07.count_torch_calls(paged_decode_torch)           # (calls, context tokens)
    lab07.check_paged_decode_speed(paged_decode_torch)    # AssertionError below THRESHOLD

`SPEED_CHECKS[grade_id]()` runs the timed check on the lab's solution (expected True);
`SLOW_CHECKS[grade_id]()` on the per-token loop (expected False).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from autograder.checks import assert_close, private_copy
from autograder.labs import passes
from autograder.timing import time_ratio
from kernels.intmath import cdiv
from kernels.paged_attention_ref import paged_attention_decode_ref

# A copy made now: the notebook's graded cell disables the course's reference (its code object)
# while the student's code runs, and the check still needs the expected output.
_reference = private_copy(paged_attention_decode_ref)

GRADE_ID = "07_speed_test"
# (context lengths, query heads N, KV heads K, head dim H, block size): ragged, GQA groups of 4
CASE = ([3000, 2100, 2700, 3072], 8, 2, 32, 16)
THRESHOLD = 0.15    # required time(per_sequence_decode) / time(student)
WARMUP, REPEATS = 1, 7

# captured at import (the grader imports autograder before student code runs)
_get_threads, _set_threads = torch.get_num_threads, torch.set_num_threads
_Generator, _randn, _randperm = torch.Generator, torch.randn, torch.randperm
_no_grad = torch.no_grad


def make_case(seed: int = 0, case=CASE):
    """A NaN-poisoned pool of blocks holding len(lens) sequences in shuffled blocks.
    Returns (q, k_cache, v_cache, block_tables, context_lens) in float32."""
    lens, N, K, H, block = case
    g = _Generator().manual_seed(seed)
    need = [cdiv(L, block) for L in lens]
    num_blocks = sum(need) + 4
    k_cache = _randn(num_blocks, block, K, H, generator=g)
    v_cache = _randn(num_blocks, block, K, H, generator=g)
    perm = _randperm(num_blocks, generator=g).tolist()
    width = max(need)
    tables = torch.full((len(lens), width), -1, dtype=torch.int32)
    used = torch.zeros(num_blocks, block, dtype=torch.bool)
    start = 0
    for b, L in enumerate(lens):
        ids = perm[start:start + need[b]]
        start += need[b]
        tables[b, :need[b]] = torch.tensor(ids, dtype=torch.int32)
        pos = torch.arange(L)
        used[torch.tensor(ids)[pos // block], pos % block] = True
    k_cache[~used] = float("nan")            # slots no sequence owns: must never be read
    v_cache[~used] = float("nan")
    q = _randn(len(lens), N, H, generator=g)
    return q, k_cache, v_cache, tables, torch.tensor(lens, dtype=torch.int32)


class _CallCounter(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls += 1
        return func(*args, **(kwargs or {}))


def count_torch_calls(fn, seed: int = 0) -> tuple[int, int]:
    """(torch function calls made by fn on the CASE batch, context tokens it attends to)."""
    q, kc, vc, tables, lens = make_case(seed)
    with _no_grad(), _CallCounter() as counter:
        fn(q, kc, vc, tables, lens)
    return counter.calls, sum(CASE[0])


def paged_decode_speed(fn, *, seed: int = 0, warmup: int = WARMUP, repeats: int = REPEATS):
    """time(per_sequence_decode) / time(fn) on the CASE batch, interleaved, one torch thread:
    the RatioResult (.ratio > 1: fn is faster). Checks fn's output against the reference first."""
    reference, baseline = _reference, _per_sequence_decode
    q, kc, vc, tables, lens = make_case(seed)
    threads = _get_threads()
    _set_threads(1)
    try:
        with _no_grad():
            want = reference(q, kc, vc, tables, lens)
            got = fn(q, kc, vc, tables, lens)
            if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(want.shape):
                raise AssertionError(f"paged decode returned {type(got).__name__} "
                                     f"{tuple(getattr(got, 'shape', ()))}, expected a tensor "
                                     f"{tuple(want.shape)}")
            assert_close(got, want, atol=1e-4, rtol=1e-4,
                         name="paged decode output on the timing batch vs the reference")
            return time_ratio(lambda: baseline(q, kc, vc, tables, lens),
                              lambda: fn(q, kc, vc, tables, lens), warmup=warmup,
                              repeats=repeats)
    finally:
        _set_threads(threads)


def check_paged_decode_speed(fn, *, at_least: float = THRESHOLD, **kw) -> float:
    """AssertionError unless fn is at least `at_least` times as fast as the lab's solution
    (i.e. at most 1 / at_least times slower); returns the ratio."""
    r = paged_decode_speed(fn, **kw)
    if not r.ratio >= at_least:
        raise AssertionError(
            f"your paged decode took {r.candidate_s * 1e3:.3g} ms for {len(CASE[0])} sequences "
            f"of {min(CASE[0])}-{max(CASE[0])} tokens, {1 / r.ratio:.1f}x the "
            f"{r.baseline_s * 1e3:.3g} ms of a per-sequence gather (median of {len(r.baseline_times)} interleaved runs); "
            f"it must be within {1 / at_least:g}x. Gather each sequence's K/V with one indexing "
            f"operation on all its slots, not a Python loop over positions.")
    return r.ratio


# --- the lab's solution style and a deliberately slow candidate ---------------------------------
def per_sequence_decode(q, k_cache, v_cache, block_tables, context_lens, scale=None):
    """The lab's solution: per sequence, all slots at once, then a GQA attention."""
    B, N, H = q.shape
    K, block = k_cache.shape[2], k_cache.shape[1]
    scale = H ** -0.5 if scale is None else scale
    k_flat, v_flat = k_cache.flatten(0, 1), v_cache.flatten(0, 1)
    out = torch.empty_like(q)
    for b in range(B):
        pos = torch.arange(int(context_lens[b]))
        slots = block_tables[b].long()[pos // block] * block + pos % block
        k = k_flat[slots].transpose(0, 1).float()                      # [K, L, H]
        v = v_flat[slots].transpose(0, 1).float()
        qg = q[b].float().reshape(K, N // K, H)                         # [K, G, H]
        p = torch.softmax(qg @ k.transpose(1, 2) * scale, dim=-1)       # [K, G, L]
        out[b] = (p @ v).reshape(N, H).to(q.dtype)
    return out


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


_per_sequence_decode = per_sequence_decode     # the baseline, bound at import



SPEED_CHECKS = {  # expected True
    GRADE_ID: lambda: passes(check_paged_decode_speed, per_sequence_decode)}
COUNTER_EXAMPLES = {  # expected False
    GRADE_ID: lambda: passes(check_paged_decode_speed, per_token_decode)}
SLOW_CHECKS = COUNTER_EXAMPLES   # same dict under the other name the test suite looks for
