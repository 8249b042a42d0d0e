"""Lab 00: probes run the student's `generate` on a fresh shipped model; the speed check times it
after a LONG and a SHORT prompt, paired with the exact count of `counted_generate`."""
from __future__ import annotations

import torch

from autograder.labs import args_after, context_ids, counted_generate
from autograder.labs.speedcheck import SpeedCheck, one_torch_thread
from autograder.probes import fresh_model, probe, working_model
from autograder.timing import time_ratio

SHORT, LONG, NEW_TOKENS = 16, 256, 2     # prompt tokens of the fast and slow run; new tokens
# required time(LONG) / time(SHORT): a loop that feeds only the last tokens measures about 1x
THRESHOLD = 2.0
WARMUP, REPEATS = 1, 5


@probe
def generate_tokens(generate, prompt_ids, max_new_tokens, *args, **kwargs):
    return generate(fresh_model(), prompt_ids, max_new_tokens, *args, **kwargs)


@probe
def timed_generate(generate, prompt_len: int, new_tokens: int, seed: int) -> None:
    model = working_model()
    with torch.no_grad(), one_torch_thread():
        generate(model, context_ids(model.config.vocab_size, prompt_len, seed)[0].tolist(),
                 new_tokens, temperature=0)


def step_growth_ratio(generate_fn, *, short: int, long: int, new_tokens: int,
                      warmup: int = WARMUP, repeats: int = REPEATS):
    """.ratio = median(time after a `long`-token prompt) / median(after `short`), interleaved."""
    return time_ratio(lambda: timed_generate(generate_fn, long, new_tokens, 1),
                      lambda: timed_generate(generate_fn, short, new_tokens, 2),
                      warmup=warmup, repeats=repeats)


def reference_generate(model, prompt_ids, max_new_tokens, temperature=1.0, top_k=0, top_p=1.0,
                       generator=None, stop_ids=()):
    from minillm.generate import generate_naive
    from minillm.sampling import SamplingParams
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p,
                            max_new_tokens=max_new_tokens, stop_ids=tuple(stop_ids))
    return generate_naive(model, [list(prompt_ids)], params, generator)[0]


def windowed_generate(model, prompt_ids, max_new_tokens, temperature=1.0, top_k=0, top_p=1.0,
                      generator=None, stop_ids=(), window: int = 8):
    """The counter-example: feeds the model only the last `window` tokens."""
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
         "long as after a {short}-token prompt (median {baseline_ms:.3g} ms vs {candidate_ms:.3g} "
         "ms over {runs} interleaved runs); a loop that runs the whole sequence through the model "
         "at every step takes at least {at_least:g}x as long. Does your generate feed the model "
         "the whole prefix each step?")
check_step_growth = SPEED_CHECK.check
__all__ = ["generate_tokens", "counted_generate", "args_after", "timed_generate", "check_step_growth"]
