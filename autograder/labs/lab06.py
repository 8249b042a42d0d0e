"""Lab 06 speed check: selective batching runs several prompts without paying for padding.

The lab's claim: a static batch pads every prompt to the longest and pushes the whole
[B, max(P)] rectangle through the model; selective batching concatenates the prompts into one
row of sum(P) tokens -- the dense layers see only real tokens, attention runs per prompt. The
timed claim is paired with a deterministic one graded exactly in the same notebook:
`ag.WorkCounter` sees sum(P) tokens in one forward call for the student's `selective_prefill`
against B * max(P) for the padded batch (`06_speed_test`, visible part). Time is graded only as
a ratio of medians measured interleaved in one process, on one torch thread:

    time(padded: minillm.serving.static_batching.padded_prefill_logits(model, PROMPTS))
        / time(selective_prefill(model, PROMPTS))

for prompts of LENGTHS tokens (one long prompt among short ones: the usual heavy tail), after
checking that the student's logits equal the padded batch's (a fast but wrong answer earns
nothing). Token counts: padded 5 x 96 = 480, selective 120 (4.0x fewer).

Measured on the shared 2-core development machine with the shipped target model, one thread,
under other sessions' load (load average 4-6 on 2 cores): the reference
(`minillm.serving.model_runner.selective_prefill_logits`) measured 3.1x to 3.7x over 11 direct
runs (and 2.8x to 3.1x inside the notebook, graded by nbconvert); padding inside the
"selective" function (the counter-example, which calls the padded path) measured 0.89x to 1.06x
over 6 runs. THRESHOLD = 1.8 is 1.6x under the worst reference run and 1.7x over the best
counter-example; tests/test_speed_checks.py (10 runs each, 4 under a competing busy loop) gave
the expected verdict every time. The whole check (one correctness pass, then WARMUP + REPEATS
interleaved rounds) takes ~2 s at that load, ~3.5 s with a busy loop on one core.

    from autograder.labs import lab06
    lab06.check_selective_speedup(selective_prefill, model)   # AssertionError below THRESHOLD

`SPEED_CHECKS[grade_id]()` runs the check on the reference and returns True/False, and
`COUNTER_EXAMPLES[grade_id]()` (alias `SLOW_CHECKS`) on the padded path (expected False);
tests/test_speed_checks.py runs both many times, also under a competing load.
"""
from __future__ import annotations

import torch

from autograder.checks import assert_close
from autograder.labs import passes, shipped_model
from autograder.timing import time_ratio

LENGTHS = (4, 96, 6, 9, 5)
THRESHOLD = 1.8     # required time(padded) / time(selective); the reference measures ~2.8-3.7
WARMUP, REPEATS = 1, 5
SEED = 6

GRADE_ID = "06_speed_test"

# captured at import (the grader imports autograder before student code runs)
_no_grad = torch.no_grad
_get_threads, _set_threads = torch.get_num_threads, torch.set_num_threads
_Generator, _randint = torch.Generator, torch.randint
_is_tensor = torch.is_tensor


def prompts(vocab_size: int, lengths=LENGTHS, seed: int = SEED) -> list[list[int]]:
    g = _Generator().manual_seed(seed)
    return [_randint(1, vocab_size, (n,), generator=g).tolist() for n in lengths]


def _padded():
    from minillm.serving.static_batching import padded_prefill_logits
    return padded_prefill_logits


def selective_speedup(selective_fn, model, *, lengths=LENGTHS, warmup: int = WARMUP,
                      repeats: int = REPEATS):
    """RatioResult of time(padded prefill) / time(selective_fn(model, prompts)), interleaved,
    on one torch thread (restored afterwards), after checking the logits agree."""
    padded = _padded()
    token_lists = prompts(model.config.vocab_size, lengths)
    threads = _get_threads()
    _set_threads(1)
    try:
        with _no_grad():
            want = padded(model, token_lists)
            got = selective_fn(model, [list(t) for t in token_lists])
            if not _is_tensor(got) or tuple(got.shape) != tuple(want.shape):
                raise AssertionError(f"selective_prefill must return logits of shape "
                                     f"{tuple(want.shape)} (one row per prompt)")
            assert_close(got, want, atol=1e-3, rtol=1e-3,
                         name=f"next-token logits of prompts of {list(lengths)} tokens, "
                              f"selective vs padded batch")
            return time_ratio(lambda: padded(model, token_lists),
                              lambda: selective_fn(model, token_lists),
                              warmup=warmup, repeats=repeats)
    finally:
        _set_threads(threads)


def check_selective_speedup(selective_fn, model, *, at_least: float = THRESHOLD, **kw) -> float:
    """AssertionError unless selective_fn is at least `at_least` times faster than the padded
    batch on prompts of LENGTHS tokens; returns the measured ratio."""
    r = selective_speedup(selective_fn, model, **kw)
    lengths = list(kw.get("lengths", LENGTHS))
    if not r.ratio >= at_least:
        raise AssertionError(
            f"on prompts of {lengths} tokens, your selective prefill was only {r.ratio:.2f}x "
            f"faster than the padded [{len(lengths)}, {max(lengths)}] batch (median "
            f"{r.candidate_s * 1e3:.3g} ms vs {r.baseline_s * 1e3:.3g} ms over "
            f"{len(r.baseline_times)} interleaved runs); it should push {sum(lengths)} tokens "
            f"through the model instead of {len(lengths) * max(lengths)} and reach at least "
            f"{at_least:g}x. Do you pad somewhere, or run the model once per prompt?")
    return r.ratio


# --- the reference and a deliberately slow candidate --------------------------------------------


def _reference(model, token_lists):
    from minillm.serving.model_runner import selective_prefill_logits
    return selective_prefill_logits(model, token_lists)


def _pads_anyway(model, token_lists):
    return _padded()(model, token_lists)


SPEED_CHECKS = {  # expected True
    GRADE_ID: lambda: passes(check_selective_speedup, _reference, shipped_model())}
COUNTER_EXAMPLES = {  # padding: expected False
    GRADE_ID: lambda: passes(check_selective_speedup, _pads_anyway, shipped_model())}
SLOW_CHECKS = COUNTER_EXAMPLES   # same dict under the other name the test suite looks for
