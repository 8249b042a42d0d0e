"""Lab 00 speed check: a naive generation step costs more after a long prompt than a short one.

The timed claim is paired with a deterministic one graded in the same notebook: the naive loop
pushes sum_{t<n} (P + t) tokens through the model in n forward calls (`ag.WorkCounter`). Here we
only check the *consequence* in time, as a ratio of medians measured interleaved in one process:

    time(generate 2 tokens after a LONG-token prompt) / time(same after a SHORT-token prompt)

The long run processes 513 / 33 = 15.5x the tokens of the short one. On the 2-core CI machine the
reference (``minillm.generate.generate_naive``) measured 3.6-7.5 over 20 runs, 8 of them with a
busy loop on one core (a fixed per-call cost — reading every weight once per forward pass —
dilutes the 15.5x); the threshold, 2.0, is well under that. A loop that does not re-run the prefix (say, one that feeds the
model only the last few tokens) measures about 1x and fails.

    from autograder.labs import lab00
    lab00.check_step_growth(generate, model)      # AssertionError below THRESHOLD; returns ratio

`SPEED_CHECKS[grade_id]()` runs the same check on the reference and returns True/False, and
`COUNTER_EXAMPLES[grade_id]()` on a deliberately wrong candidate (expected False); the test suite
runs them many times, also under a competing CPU load, to prove the verdict is stable.
"""
from __future__ import annotations

import torch

from autograder.labs import passes, shipped_model
from autograder.timing import time_ratio

SHORT = 16          # prompt tokens of the fast run
LONG = 256          # prompt tokens of the slow run
NEW_TOKENS = 2      # generated tokens per run: one prefill-sized step and one generation step
THRESHOLD = 2.0     # required time(LONG) / time(SHORT); the reference measures 3.6-7.5 on 2 cores
WARMUP, REPEATS = 1, 5    # ~1.5 s on a quiet 2-core machine, ~5 s under a competing load

GRADE_ID = "00_speed_test"

# captured at import (the grader imports autograder before student code runs)
_no_grad = torch.no_grad
_get_threads, _set_threads = torch.get_num_threads, torch.set_num_threads
_Generator, _randint = torch.Generator, torch.randint


def _prompt(n: int, vocab_size: int, seed: int) -> list[int]:
    return _randint(1, vocab_size, (n,), generator=_Generator().manual_seed(seed)).tolist()


def step_growth_ratio(generate_fn, model, *, short: int = SHORT, long: int = LONG,
                      new_tokens: int = NEW_TOKENS, warmup: int = WARMUP,
                      repeats: int = REPEATS):
    """Time `generate_fn(model, prompt, new_tokens, temperature=0)` after a `long`-token and a
    `short`-token prompt, interleaved; returns the `RatioResult` with
    .ratio = median(long) / median(short).

    Runs on one torch thread (restored afterwards): a parallel region whose other thread is
    preempted by a busy neighbour would add noise, and the ratio does not need parallelism.
    """
    vocab = model.config.vocab_size
    p_long, p_short = _prompt(long, vocab, 1), _prompt(short, vocab, 2)

    def run_long():
        with _no_grad():
            generate_fn(model, list(p_long), new_tokens, temperature=0)

    def run_short():
        with _no_grad():
            generate_fn(model, list(p_short), new_tokens, temperature=0)

    threads = _get_threads()
    _set_threads(1)
    try:
        # time_ratio: ratio = median(baseline) / median(candidate) -> baseline is the slow run
        return time_ratio(run_long, run_short, warmup=warmup, repeats=repeats)
    finally:
        _set_threads(threads)


def check_step_growth(generate_fn, model, *, at_least: float = THRESHOLD, **kw) -> float:
    """AssertionError unless a naive step after a LONG-token prompt takes at least `at_least`
    times as long as one after a SHORT-token prompt; returns the measured ratio."""
    r = step_growth_ratio(generate_fn, model, **kw)
    if not r.ratio >= at_least:
        raise AssertionError(
            f"generating {NEW_TOKENS} tokens after a {kw.get('long', LONG)}-token prompt took "
            f"only {r.ratio:.2f}x as long as after a {kw.get('short', SHORT)}-token prompt "
            f"(median {r.baseline_s * 1e3:.3g} ms vs {r.candidate_s * 1e3:.3g} ms over "
            f"{len(r.baseline_times)} interleaved runs); a loop that runs the whole sequence "
            f"through the model at every step takes at least {at_least:g}x as long. Does your "
            f"generate feed the model the whole prefix each step?")
    return r.ratio


# --- the reference and a deliberately wrong candidate, in the notebook's signature -------------
def reference_generate(model, prompt_ids, max_new_tokens, temperature=1.0, top_k=0, top_p=1.0,
                       generator=None, stop_ids=()):
    """minillm.generate.generate_naive with the lab's `generate` signature."""
    from minillm.generate import generate_naive
    from minillm.sampling import SamplingParams
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p,
                            max_new_tokens=max_new_tokens, stop_ids=tuple(stop_ids))
    return generate_naive(model, [list(prompt_ids)], params, generator)[0]


def windowed_generate(model, prompt_ids, max_new_tokens, temperature=1.0, top_k=0, top_p=1.0,
                      generator=None, stop_ids=(), window: int = 8):
    """WRONG on purpose: feeds the model only the last `window` tokens, so its cost does not grow
    with the prefix (and its output is not the model's). The speed check must reject it (it
    measured 0.6-1.0)."""
    from minillm.sampling import sample
    ids = list(prompt_ids)
    new: list[int] = []
    for _ in range(max_new_tokens):
        x = torch.tensor([ids[-window:]])
        nxt = int(sample(model(x, last_only=True)[0, -1], temperature, top_k, top_p, generator))
        new.append(nxt)
        if nxt in stop_ids:
            break
        ids.append(nxt)
    return new




SPEED_CHECKS = {  # expected True
    GRADE_ID: lambda: passes(check_step_growth, reference_generate, shipped_model())}
COUNTER_EXAMPLES = {  # expected False
    GRADE_ID: lambda: passes(check_step_growth, windowed_generate, shipped_model())}
SLOW_CHECKS = COUNTER_EXAMPLES   # same dict under the other name the test suite may look for
