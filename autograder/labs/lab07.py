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
* timed (`check_paged_decode_speed`, hidden): median time of the course's torch reference,
  `kernels.paged_attention_ref.paged_attention_decode_ref` (it pads every sequence to the
  longest context, gathers them all with one index_select and checks its inputs; the serving
  engine's torch backend calls it too), over the median time of the student's function,
  measured interleaved on one torch thread, must reach THRESHOLD. The output must match that
  reference first (a fast wrong answer earns nothing); the reference (hence the serving
  engine's torch decode) and the Triton kernels are disabled while the student's function
  runs.

Why THRESHOLD sits where it does: a per-sequence gather (the notebook's solution) or a loop over
blocks is about as fast as the reference, a per-token loop some fifteen times slower; the
threshold sits at about the geometric middle, with a margin of three or more on both sides on a
loaded 2-core machine (ranges: autograder/README.md).

    from autograder.labs import lab07
    lab07.count_torch_calls(paged_decode_torch)           # (calls, context tokens)
    lab07.check_paged_decode_speed(paged_decode_torch)    # AssertionError below THRESHOLD

The student's Triton kernels (07_decode_kernel, 07_split_kernel) are launched and checked by
autograder/labs/lab07_triton.py.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from autograder.checks import assert_close
from autograder.labs.speedcheck import SpeedCheck
from autograder.remote import kernel_side, resident
from autograder.timing import time_ratio
from kernels.intmath import cdiv
from kernels.paged_attention_ref import paged_attention_decode_ref

# (context lengths, query heads N, KV heads K, head dim H, block size): ragged, GQA groups of 4
CASE = ([3000, 2100, 2700, 3072], 8, 2, 32, 16)
THRESHOLD = 0.25    # required time(paged_attention_decode_ref) / time(student)
# every function that computes the paged decode for a caller, the private core the two torch
# references share included: all off while the student's decode runs (speed check and the
# notebook's hidden correctness test)
DECODE_REFERENCES = ("kernels.paged_attention_ref.paged_attention_decode_ref",
                     "kernels.paged_attention_ref.paged_attention_decode_split_ref",
                     "kernels.paged_attention_ref._partial_attention",
                     "kernels.paged_attention.paged_attention_decode",
                     "kernels.paged_attention.paged_attention_decode_split")
WARMUP, REPEATS = 1, 7

# captured at import (the grader imports autograder before student code runs)
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


@kernel_side      # counted where the student's function runs (autograder/remote.py)
def count_torch_calls(fn, seed: int = 0) -> tuple[int, int]:
    """(torch function calls made by fn on the CASE batch, context tokens it attends to)."""
    q, kc, vc, tables, lens = make_case(seed)
    with _no_grad(), _CallCounter() as counter:
        fn(q, kc, vc, tables, lens)
    return counter.calls, sum(CASE[0])


def paged_decode_speed(fn, guard, *, seed: int = 0, warmup: int = WARMUP,
                       repeats: int = REPEATS):
    """time(paged_attention_decode_ref) / time(fn) on the CASE batch, interleaved: the
    RatioResult (.ratio > 1: fn is faster). Checks fn's output against the reference first."""
    q, kc, vc, tables, lens = make_case(seed)
    sent = resident([q, kc, vc, tables, lens])   # (in the tester: copied to the kernel once)
    with _no_grad():
        want = paged_attention_decode_ref(q, kc, vc, tables, lens)
        with guard:
            got = fn(*sent)
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(want.shape):
            raise AssertionError(f"paged decode returned {type(got).__name__} "
                                 f"{tuple(getattr(got, 'shape', ()))}, expected a tensor "
                                 f"{tuple(want.shape)}")
        assert_close(got, want, atol=1e-4, rtol=1e-4,
                     name="paged decode output on the timing batch vs the reference")

        def candidate():
            with guard:
                fn(*sent)

        return time_ratio(lambda: paged_attention_decode_ref(q, kc, vc, tables, lens),
                          candidate, warmup=warmup, repeats=repeats)


# --- the usual mistake ---------------------------------------------------------------------------
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
    disabled=DECODE_REFERENCES,
    solution=("paged_decode_torch", "07_slot_mapping", "07_paged_attention"),
    hint="your paged decode took {candidate_ms:.3g} ms for 4 sequences of 2100-3072 tokens, "
         "{ratio:.2f}x the speed of the course's torch reference ({baseline_ms:.3g} ms, "
         "median of {runs} interleaved runs); it must reach {at_least:g}x. Gather each "
         "sequence's K/V with one indexing operation on all its slots, not a Python loop over "
         "positions.")
check_paged_decode_speed = SPEED_CHECK.check
