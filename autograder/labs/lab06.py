"""Lab 06: probes run the student's code on the shipped model (or a random one); the speed check
times their selective prefill against the padded batch (480 token slots vs 120)."""
from __future__ import annotations

import functools
from types import SimpleNamespace

import torch

from autograder.labs import counted, random_model, shipped_model
from autograder.labs.speedcheck import SpeedCheck, assert_tensor_close, one_torch_thread
from autograder.probes import fresh_model, probe, working_model
from autograder.timing import time_ratio
from minillm.serving.model_runner import selective_prefill_logits
from minillm.serving.static_batching import padded_prefill_logits

LENGTHS = (4, 96, 6, 9, 5)
# time(padded) / time(selective), loaded 2-core, in the tester: the library 2.99-3.24, the
# solution 3.17-3.29, a function that pads anyway 0.99-1.02
THRESHOLD = 1.5
WARMUP, REPEATS = 1, 5
SEED = 6


def prompts(vocab_size: int, lengths=LENGTHS, seed: int = SEED) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, vocab_size, (n,), generator=g).tolist() for n in lengths]


@probe
def latencies_of(latencies, **record) -> object:
    return latencies(SimpleNamespace(**record))


@probe
def selective_run(selective_prefill, token_lists, seed: int | None = None,
                  config: dict | None = None) -> dict:
    """`selective_prefill(model, token_lists)`, counted: {"logits", "calls", "through"}."""
    model = fresh_model() if config is None else random_model(seed, config)
    with torch.no_grad():
        logits, work = counted(model, selective_prefill, token_lists)
    return {"logits": logits, **work}


_kept_prompts = functools.cache(prompts)


@probe
def timed_selective(selective_prefill, lengths, seed: int) -> None:
    model = working_model()
    token_lists = _kept_prompts(model.config.vocab_size, tuple(lengths), seed)
    with torch.no_grad(), one_torch_thread():
        selective_prefill(model, token_lists)


def selective_speedup(selective_fn, *, lengths, warmup: int = WARMUP, repeats: int = REPEATS):
    """Check the logits agree, then .ratio = median(padded) / median(selective), interleaved."""
    model = shipped_model()
    token_lists = prompts(model.config.vocab_size, lengths)
    padded = torch.no_grad()(lambda: padded_prefill_logits(model, token_lists))
    assert_tensor_close(selective_run(selective_fn, token_lists)["logits"], padded(), 1e-3,
                        f"next-token logits of prompts of {list(lengths)} tokens, selective vs "
                        f"padded batch")
    return time_ratio(padded, lambda: timed_selective(selective_fn, lengths, SEED),
                      warmup=warmup, repeats=repeats)


SPEED_CHECK = SpeedCheck(
    grade_id="06_speed_test", threshold=THRESHOLD, measure=selective_speedup,
    reference=selective_prefill_logits, counter_example=padded_prefill_logits,
    workload=dict(lengths=LENGTHS),
    solution=("selective_prefill", "06_ragged_class", "06_selective"),
    hint="on prompts of {lengths} tokens, your selective prefill was only {ratio:.2f}x faster "
         "than the padded batch (median {candidate_ms:.3g} ms vs {baseline_ms:.3g} ms over {runs} "
         "interleaved runs); it should push only the real tokens through the model and reach at "
         "least {at_least:g}x. Do you pad somewhere, or run the model once per prompt?")
check_selective_speedup = SPEED_CHECK.check
__all__ = ["latencies_of", "selective_run", "timed_selective", "random_model", "prompts",
           "check_selective_speedup"]
