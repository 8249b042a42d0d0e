"""Replay a trace through a server and compare static with continuous batching (lab 06).

    minillm bench batching --json

`replay` feeds a trace's requests to a server (LLMEngine or StaticBatchServer) as their arrival
times come, calling step() in between. Time is the wall clock, except that while the server has
nothing to do it jumps straight to the next arrival instead of sleeping (`SkipClock`): the
measured figures are those of a server that was idle then, and a bench run takes only the time
the model actually computes.

Both servers get the same trace, the same batch limit and the same model, in one process, one
after the other; `speedup` is continuous throughput / static throughput.
"""
from __future__ import annotations

import time

import torch

from ..serving.engine import LLMEngine
from ..serving.metrics import summarize
from ..serving.static_batching import StaticBatchServer
from ..serving.trace import make_trace, trace_summary


class SkipClock:
    """`timer` since start (the wall clock, `time.perf_counter`, by default), plus every idle gap
    skipped with advance_to(). With `time.process_time` it counts only the CPU seconds this
    process computes: on one torch thread, a neighbour that takes the core for a while then adds
    nothing to any step, and two servers replayed one after the other are timed alike even if
    the machine's load changed in between (lab 06)."""

    def __init__(self, timer=time.perf_counter):
        self.timer = timer
        self.t0, self.skipped = timer(), 0.0

    def __call__(self) -> float:
        return self.timer() - self.t0 + self.skipped

    def advance_to(self, t: float) -> None:
        now = self()
        if t > now:
            self.skipped += t - now

    def tick(self) -> None:
        """Called after every server step; the wall clock moves by itself."""


class StepClock:
    """A deterministic clock (for tests): each server step takes exactly `step_s` seconds and
    idle gaps are skipped, so which requests overlap depends on the trace alone, never on how
    fast or how loaded the machine is."""

    def __init__(self, step_s: float = 0.05):
        if not step_s > 0:
            raise ValueError(f"step_s must be > 0, got {step_s}")
        self.t, self.step_s = 0.0, float(step_s)

    def __call__(self) -> float:
        return self.t

    def advance_to(self, t: float) -> None:
        self.t = max(self.t, t)

    def tick(self) -> None:
        self.t += self.step_s


def replay(server, trace, clock: SkipClock | StepClock, max_steps: int | None = None) -> int:
    """Serve every request of `trace` (sorted by arrival) on `server`; returns the step count."""
    pending = sorted(trace, key=lambda r: r.arrival_time)
    i, steps = 0, 0
    while i < len(pending) or server.has_unfinished():
        if not server.has_unfinished() and i < len(pending):
            clock.advance_to(pending[i].arrival_time)            # idle: skip to the next arrival
        now = clock()
        while i < len(pending) and pending[i].arrival_time <= now:
            r = pending[i]
            server.add_request(list(r.prompt_ids), r.params(), arrival_time=r.arrival_time)
            i += 1
        server.step()
        clock.tick()
        steps += 1
        if max_steps is not None and steps >= max_steps:
            raise RuntimeError(f"the server did not finish the trace in {max_steps} steps")
    return steps


def serve(kind: str, model, trace, max_batch: int, **engine_kw):
    clock = SkipClock()
    if kind == "static":
        server = StaticBatchServer(model, max_batch=max_batch, clock=clock)
    else:
        server = LLMEngine(model, max_num_seqs=max_batch, clock=clock, **engine_kw)
    replay(server, trace, clock)
    return server


# The default workload: 128 requests arriving at 200/s (all queued within ~0.7 s: the servers
# are saturated, so throughput measures the server, not the arrival rate), short log-normal
# prompts and heavy-tailed answers (median 8 tokens, sigma 1.3: a 1-in-10 answer is 5x the
# median), a batch limit of 32 for both servers.
TRACE = dict(prompt_median=12, prompt_sigma=1.0, prompt_max=96,
             output_median=8, output_sigma=1.3, output_max=96)


def bench_batching(model, *, num_requests: int = 128, rate: float = 200.0, seed: int = 0,
                   max_batch: int = 32, block_size: int = 16, threads: int | None = 1,
                   trace_kw: dict | None = None) -> dict:
    """Static vs continuous batching on one seeded trace; a dict of figures.

    trace_kw overrides entries of TRACE (see trace.make_trace)."""
    old_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        trace = make_trace(num_requests, rate, seed, vocab_size=model.config.vocab_size,
                           max_seq_len=model.config.max_seq_len, **{**TRACE, **(trace_kw or {})})
        warm = LLMEngine(model, max_num_seqs=2, block_size=block_size)   # warm-up, untimed
        warm.generate([list(trace[0].prompt_ids)], trace[0].params())
        static = serve("static", model, trace, max_batch)
        cont = serve("continuous", model, trace, max_batch, block_size=block_size)
    finally:
        torch.set_num_threads(old_threads)
    s, c = summarize(static.all_sequences()), summarize(cont.all_sequences())
    leaked = cont.bm.num_used_blocks
    same = [a.output_ids for a in static.all_sequences()] == \
           [b.output_ids for b in cont.all_sequences()]
    return {
        "requests": len(trace), "completed": c["completed"],
        "static_completed": s["completed"],
        "static_tok_s": s["throughput_tok_s"], "continuous_tok_s": c["throughput_tok_s"],
        "speedup": c["throughput_tok_s"] / s["throughput_tok_s"],
        "static_ttft_p50_s": s["ttft_p50_s"], "continuous_ttft_p50_s": c["ttft_p50_s"],
        "static_ttft_p99_s": s["ttft_p99_s"], "continuous_ttft_p99_s": c["ttft_p99_s"],
        "static_tpot_p50_s": s["tpot_p50_s"], "continuous_tpot_p50_s": c["tpot_p50_s"],
        "static_e2e_p50_s": s["e2e_p50_s"], "continuous_e2e_p50_s": c["e2e_p50_s"],
        "static_makespan_s": s["makespan_s"], "continuous_makespan_s": c["makespan_s"],
        "static_steps": len(static.steps), "continuous_steps": len(cont.steps),
        "static_token_slots": static.token_slots, "static_useful_tokens": static.useful_tokens,
        "continuous_tokens_run": cont.runner.tokens_run,
        "output_tokens": c["output_tokens"], "same_outputs": same,
        "preemptions": cont.scheduler.num_preemptions, "leaked_blocks": leaked,
        "max_batch": max_batch, "rate": rate, "seed": seed, "threads": threads,
        "trace": trace_summary(trace),
    }
