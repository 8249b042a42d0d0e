"""Lab 00's probes and speed check.

Probes (autograder/probes.py) run the student's `generate` on a fresh copy of the shipped model
where it lives and return plain values:

    from autograder.labs import lab00
    lab00.generate_tokens(generate, prompt, 9, temperature=0)      # -> what generate returned
    lab00.counted_generate(generate, prompt, 9)    # -> {"tokens", "calls", "through"}

The speed check times the *consequence* of the naive loop's work, as a ratio of medians measured
interleaved:

    time(generate 2 tokens after a LONG-token prompt) / time(same after a SHORT-token prompt)

Both runs are the student's own `generate`; the long one pushes 513 / 33 = 15.5x the tokens of
the short one, diluted by the fixed cost of reading every weight once per forward pass. Why 2.0:
the reference stays well above it on a loaded 2-core machine and a loop that feeds the model
only the last few tokens measures about 1x (ranges: autograder/README.md). The timed claim is
paired with an exact one graded in the same notebook: the naive loop pushes sum_{t<n} (P + t)
tokens through the model in n forward calls (`counted_generate`).
"""
from __future__ import annotations

import torch

from autograder.checks import WorkCounter
from autograder.labs.speedcheck import SpeedCheck, one_torch_thread
from autograder.probes import fresh_model, probe, working_model
from autograder.timing import time_ratio

SHORT = 16          # prompt tokens of the fast run
LONG = 256          # prompt tokens of the slow run
NEW_TOKENS = 2      # generated tokens per run: one prefill-sized step and one generation step
THRESHOLD = 2.0     # required time(LONG) / time(SHORT)
WARMUP, REPEATS = 1, 5


@probe
def generate_tokens(generate, prompt_ids, max_new_tokens, *args, **kwargs):
    """What `generate(model, prompt_ids, max_new_tokens, *args, **kwargs)` returns on a fresh
    copy of the shipped model."""
    return generate(fresh_model(), prompt_ids, max_new_tokens, *args, **kwargs)


@probe
def counted_generate(generate, prompt_ids, max_new_tokens, *args, **kwargs) -> dict:
    """`generate` on a fresh copy of the shipped model, its forward passes counted: {"tokens":
    what it returned, "calls": forward calls, "through": token positions run through them}."""
    model = fresh_model()
    with WorkCounter(model) as work:
        tokens = generate(model, prompt_ids, max_new_tokens, *args, **kwargs)
    return {"tokens": tokens, "calls": work.calls, "through": work.tokens}


def _prompt(n: int, vocab_size: int, seed: int) -> list[int]:
    return torch.randint(1, vocab_size, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@probe
def timed_generate(generate, prompt_len: int, new_tokens: int, seed: int) -> None:
    """One timed run: `generate` after a `prompt_len`-token prompt, greedy, on the kept model."""
    model = working_model()
    with torch.no_grad(), one_torch_thread():
        generate(model, _prompt(prompt_len, model.config.vocab_size, seed), new_tokens,
                 temperature=0)


def step_growth_ratio(generate_fn, *, short: int, long: int, new_tokens: int,
                      warmup: int = WARMUP, repeats: int = REPEATS):
    """Time `generate_fn` after a `long`-token and a `short`-token prompt, interleaved:
    .ratio = median(long) / median(short)."""
    # time_ratio: ratio = median(baseline) / median(candidate) -> the slow run is the baseline
    return time_ratio(lambda: timed_generate(generate_fn, long, new_tokens, 1),
                      lambda: timed_generate(generate_fn, short, new_tokens, 2),
                      warmup=warmup, repeats=repeats)


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
    ids = list(prompt_ids)
    new: list[int] = []
    for _ in range(max_new_tokens):
        nxt = int(model(torch.tensor([ids[-window:]]), last_only=True)[0, -1].argmax())
        new.append(nxt)
        if nxt in stop_ids:
            break
        ids.append(nxt)
    return new


SPEED_CHECK = SpeedCheck(
    grade_id="00_speed_test", threshold=THRESHOLD, measure=step_growth_ratio,
    reference=reference_generate, counter_example=windowed_generate,
    workload=dict(short=SHORT, long=LONG, new_tokens=NEW_TOKENS),
    solution=("generate", "00_sample_next", "00_generate", "00_apply_temperature",
              "00_top_k_filter", "00_top_p_filter"),
    hint="generating {new_tokens} tokens after a {long}-token prompt took only {ratio:.2f}x as "
         "long as after a {short}-token prompt (median {baseline_ms:.3g} ms vs "
         "{candidate_ms:.3g} ms over {runs} interleaved runs); a loop that runs the whole "
         "sequence through the model at every step takes at least {at_least:g}x as long. Does "
         "your generate feed the model the whole prefix each step?")
check_step_growth = SPEED_CHECK.check
__all__ = ["generate_tokens", "counted_generate", "timed_generate", "check_step_growth"]
