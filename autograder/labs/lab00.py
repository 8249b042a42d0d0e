"""Lab 00 speed check: a naive generation step costs more after a long prompt than a short one.

The timed claim is paired with a deterministic one graded in the same notebook: the naive loop
pushes sum_{t<n} (P + t) tokens through the model in n forward calls (`ag.WorkCounter`). Here the
check times the *consequence*, as a ratio of medians measured interleaved in one process:

    time(generate 2 tokens after a LONG-token prompt) / time(same after a SHORT-token prompt)

Both runs are the student's own `generate`; the long one pushes 513 / 33 = 15.5x the tokens of
the short one, diluted by the fixed cost of reading every weight once per forward pass. Why 2.0:
the reference stays well above it on a loaded 2-core machine and a loop that feeds the model
only the last few tokens measures about 1x (ranges: autograder/README.md).

    from autograder.labs import lab00
    lab00.check_step_growth(generate, model)      # AssertionError below the threshold; ratio
"""
from __future__ import annotations

import torch

from autograder.labs import shipped_model
from autograder.labs.speedcheck import SpeedCheck
from autograder.timing import time_ratio

SHORT = 16          # prompt tokens of the fast run
LONG = 256          # prompt tokens of the slow run
NEW_TOKENS = 2      # generated tokens per run: one prefill-sized step and one generation step
THRESHOLD = 2.0     # required time(LONG) / time(SHORT)
WARMUP, REPEATS = 1, 5

# captured at import (the grader imports autograder before student code runs)
_no_grad = torch.no_grad
_Generator, _randint = torch.Generator, torch.randint


def _prompt(n: int, vocab_size: int, seed: int) -> list[int]:
    return _randint(1, vocab_size, (n,), generator=_Generator().manual_seed(seed)).tolist()


def step_growth_ratio(generate_fn, guard, model, *, short: int, long: int, new_tokens: int,
                      warmup: int = WARMUP, repeats: int = REPEATS):
    """Time `generate_fn(model, prompt, new_tokens, temperature=0)` after a `long`-token and a
    `short`-token prompt, interleaved: .ratio = median(long) / median(short)."""
    vocab = model.config.vocab_size
    p_long, p_short = _prompt(long, vocab, 1), _prompt(short, vocab, 2)

    def run_long():
        with _no_grad(), guard:
            generate_fn(model, list(p_long), new_tokens, temperature=0)

    def run_short():
        with _no_grad(), guard:
            generate_fn(model, list(p_short), new_tokens, temperature=0)

    # time_ratio: ratio = median(baseline) / median(candidate) -> the slow run is the baseline
    return time_ratio(run_long, run_short, warmup=warmup, repeats=repeats)


# --- a correct candidate on the library, and the usual mistake, in the notebook's signature -----
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
    with the prefix (and its output is not the model's)."""
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


SPEED_CHECK = SpeedCheck(
    grade_id="00_speed_test", threshold=THRESHOLD, measure=step_growth_ratio,
    reference=reference_generate, counter_example=windowed_generate,
    workload=dict(short=SHORT, long=LONG, new_tokens=NEW_TOKENS),
    disabled=("minillm.generate.generate_naive", "minillm.generate.stream_naive"),
    fixture=lambda: (shipped_model(),),
    hint="generating {new_tokens} tokens after a {long}-token prompt took only {ratio:.2f}x as "
         "long as after a {short}-token prompt (median {baseline_ms:.3g} ms vs "
         "{candidate_ms:.3g} ms over {runs} interleaved runs); a loop that runs the whole "
         "sequence through the model at every step takes at least {at_least:g}x as long. Does "
         "your generate feed the model the whole prefix each step?")
check_step_growth = SPEED_CHECK.check
