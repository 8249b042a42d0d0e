"""Lab 06: probes run the student's code on the shipped model (or a random one); the speed check
times their selective prefill against the padded batch (480 token slots vs 120); the policy
check replays the student's scheduling policy on seeded traces (simulated clock) against FCFS."""
from __future__ import annotations

import functools
from types import SimpleNamespace

import torch

from autograder.labs import counted, random_model, shipped_model
from autograder.labs.speedcheck import SpeedCheck, assert_tensor_close, one_torch_thread
from autograder.probes import fresh_model, probe, working_model
from autograder.timing import time_ratio
from minillm.serving.model_runner import selective_prefill_logits
from minillm.serving.policy import fcfs_policy, policy_metrics, serve_with_policy
from minillm.serving.static_batching import padded_prefill_logits
from minillm.serving.trace import make_trace

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

# The scheduling-policy task: 96 requests at 30 per second, long-tailed prompts (median 32, up to
# 448 tokens), 8 seats, steps of 10 ms + 0.2 ms per token. A policy passes if, over the traces
# together, it cuts FCFS's mean TTFT or its p99 inter-token latency by POLICY_MARGIN, keeps
# POLICY_MIN_THROUGHPUT of FCFS's throughput and, on every trace, keeps its slowest request
# within POLICY_MAX_E2E x FCFS's slowest (no starvation).
POLICY_MAX_SEQS = 8
POLICY_WORKLOAD = dict(num_requests=96, rate=30.0, prompt_median=32, prompt_sigma=1.2,
                       prompt_max=448, output_median=16, output_sigma=0.8, output_max=64)
POLICY_MARGIN, POLICY_MIN_THROUGHPUT, POLICY_MAX_E2E = 0.15, 0.9, 3.0


def policy_trace(seed: int, arrivals=None, lengths=None) -> list[list]:
    """The lab's policy workload for `seed`: [arrival s, prompt tokens, output tokens] each
    (drawn with `arrivals` and `lengths`: make_trace's defaults, or the student's own)."""
    return [[r.arrival_time, len(r.prompt_ids), r.max_new_tokens]
            for r in make_trace(seed=seed, arrivals=arrivals, lengths=lengths, **POLICY_WORKLOAD)]


@probe
def policy_plans(policy, trace, max_seqs: int = POLICY_MAX_SEQS) -> list:
    """The plans `policy` makes, step by step, replaying `trace` (pairs [id, tokens] each)."""
    plans = []

    def recording(now, waiting, running, seats):
        plan = policy(now, waiting, running, seats)
        try:
            plans.append([[int(k), int(v)] for k, v in dict(plan).items()])
        except (TypeError, ValueError) as e:
            raise ValueError(f"a plan maps request ids to token counts, got {plan!r}") from e
        return plan

    serve_with_policy(trace, recording, max_seqs)
    return plans


def replayed(plans, trace, max_seqs: int = POLICY_MAX_SEQS):
    """The run those plans make, replayed and checked by the course's simulator."""
    it = iter(plans)

    def recorded(now, waiting, running, seats):
        step = next(it, None)
        if step is None:
            raise ValueError("the policy's run ended before every request finished")
        return {k: v for k, v in step}

    run = serve_with_policy(trace, recorded, max_seqs)
    if next(it, None) is not None:
        raise ValueError("the policy made more plans than its run has steps")
    return run


def policy_outcome(policy, seeds) -> dict:
    """The student's policy against FCFS on the traces of `seeds`: ratios over the traces
    together (ttft: mean TTFT, itl: p99 inter-token latency, throughput) and per trace (e2e:
    the slowest request), with each trace's figures."""
    sums = {k: [0.0, 0.0] for k in ("ttft_mean", "itl_p99", "throughput")}
    e2e, per_trace = [], []
    for seed in seeds:
        trace = policy_trace(seed)
        mine = policy_metrics(replayed(policy_plans(policy, trace), trace))
        base = policy_metrics(serve_with_policy(trace, fcfs_policy, POLICY_MAX_SEQS))
        assert mine["complete"] and mine["requests"] == len(trace), \
            f"trace {seed}: {len(trace) - mine['requests']} requests never finished"
        for k in sums:
            sums[k][0] += mine[k]
            sums[k][1] += base[k]
        e2e.append(mine["e2e_max"] / base["e2e_max"])
        per_trace.append({"seed": seed, "yours": mine, "fcfs": base})
    return {"ttft": sums["ttft_mean"][0] / sums["ttft_mean"][1],
            "itl": sums["itl_p99"][0] / sums["itl_p99"][1],
            "throughput": sums["throughput"][0] / sums["throughput"][1],
            "e2e": max(e2e), "traces": per_trace}


def check_policy(policy, seeds) -> dict:
    """Print the thresholds and the student's ratios, then assert the outcome rule."""
    out = policy_outcome(policy, seeds)
    need = 1 - POLICY_MARGIN
    print(f"on {len(seeds)} traces, yours / FCFS: mean TTFT {out['ttft']:.2f}, p99 inter-token "
          f"latency {out['itl']:.2f} (one of them must be <= {need:.2f}); throughput "
          f"{out['throughput']:.2f} (>= {POLICY_MIN_THROUGHPUT:.2f}); slowest request, worst trace "
          f"{out['e2e']:.2f} (<= {POLICY_MAX_E2E:.2f})")
    assert min(out["ttft"], out["itl"]) <= need, (
        f"your policy cut neither the mean TTFT ({out['ttft']:.2f} of FCFS's) nor the p99 "
        f"inter-token latency ({out['itl']:.2f}) by {POLICY_MARGIN:.0%}: which delay does it "
        f"shorten, and for whom?")
    assert out["throughput"] >= POLICY_MIN_THROUGHPUT, (
        f"throughput {out['throughput']:.2f} of FCFS's: your policy leaves seats or steps idle")
    assert out["e2e"] <= POLICY_MAX_E2E, (
        f"a request took {out['e2e']:.2f}x as long as FCFS's slowest: does your policy starve "
        f"some requests (long prompts)?")
    return out


__all__ = ["latencies_of", "selective_run", "timed_selective", "random_model", "prompts",
           "check_selective_speedup", "policy_trace", "policy_plans", "replayed",
           "policy_outcome", "check_policy"]
