"""Scheduling policies on a simulated clock: who runs, and how many of its tokens, in each step.

`LLMEngine` admits first come, first served, whole prompts, while seats are free (scheduler.py).
That is one policy among many. This module replays a trace under ANY policy, in pure Python,
with a step cost model instead of a model: a step that runs `n` tokens takes `a + b * n`
seconds (a memory-bound floor plus a compute part; lab 06 fits a and b on its own server), so a
run is exact, deterministic and takes milliseconds on any machine.

A policy is a function called before every step,

    plan = policy(now, waiting, running, max_seqs)     # -> {request id: tokens to run}

`waiting`: the requests that have arrived and hold no seat yet, `running`: those holding one
(their KV cache is allocated), oldest admission first; both are lists of `RequestView`
(`id`, `arrival_time`, `prompt_len`, `prefilled`, `generated`). A server does not know how long
an answer will be, so the view does not say. The plan gives each chosen request its tokens:

* a request whose prompt is not all prefilled runs a chunk of it: 1 .. prompt_len - prefilled
  tokens (a whole prompt at once, or a piece: chunked prefill); the step that runs its last
  prompt token also samples its first output token;
* a request whose prompt is done runs exactly 1 token (a decode step), or is left out of the
  step (it keeps its seat and waits);
* a waiting request in the plan takes a seat and keeps it until it finishes; at most
  `max_seqs` seats are taken at a time.

Anything else (an unknown id, 0 or too many tokens, a decode of 2, too many seats, an empty
plan while requests wait) raises `ValueError`: a policy cannot break a request's tokens, it can
only make them late. `serve_with_policy` records every token's time; `policy_metrics` reduces
them to the figures users feel: TTFT, the gaps between a request's tokens (inter-token latency),
end-to-end latency and throughput.

`fcfs_policy` is the engine's own (the baseline); `shortest_prompt_first` and
`decode_first_chunked` are two other designs lab 06's grading is tested with.
"""
from __future__ import annotations

from dataclasses import dataclass, field

STEP_COST = (0.010, 0.0002)      # seconds: a + b * tokens (the order of lab 06's fit on a CPU)


@dataclass(frozen=True)
class RequestView:
    id: int
    arrival_time: float
    prompt_len: int
    prefilled: int               # prompt tokens already run
    generated: int               # output tokens already produced


@dataclass
class _Req:
    id: int
    arrival_time: float
    prompt_len: int
    output_len: int
    prefilled: int = 0
    generated: int = 0
    token_times: list[float] = field(default_factory=list)

    def view(self) -> RequestView:
        return RequestView(self.id, self.arrival_time, self.prompt_len, self.prefilled,
                           self.generated)


@dataclass
class PolicyRun:
    """Every request's arrival and token times, and each step's (start, tokens)."""
    arrival: dict[int, float]
    token_times: dict[int, list[float]]
    output_lens: dict[int, int]
    steps: list[tuple[float, int]]


def _requests(trace) -> list[_Req]:
    out = []
    for r in trace:
        if isinstance(r, (tuple, list)):
            i, (t, p, o) = len(out), r
        else:
            i, t, p, o = r.request_id, r.arrival_time, len(r.prompt_ids), r.max_new_tokens
        if int(p) < 1 or int(o) < 1:
            raise ValueError(f"request {i}: prompt and output lengths must be >= 1")
        out.append(_Req(int(i), float(t), int(p), int(o)))
    return sorted(out, key=lambda q: (q.arrival_time, q.id))


def serve_with_policy(trace, policy, max_seqs: int = 8, step_cost=STEP_COST,
                      max_steps: int = 100_000) -> PolicyRun:
    """Replay `trace` (TraceRequests, or (arrival, prompt_len, output_len) tuples) under
    `policy` on the simulated clock. ValueError on an invalid plan or past max_steps."""
    a, b = (float(x) for x in step_cost)
    pending = _requests(trace)
    ids = [q.id for q in pending]
    if len(set(ids)) != len(ids):
        raise ValueError("request ids must be unique")
    waiting: list[_Req] = []
    running: list[_Req] = []
    done: list[_Req] = []
    now, i, steps = 0.0, 0, []
    while i < len(pending) or waiting or running:
        if not waiting and not running:
            now = max(now, pending[i].arrival_time)          # idle: jump to the next arrival
        while i < len(pending) and pending[i].arrival_time <= now:
            waiting.append(pending[i])
            i += 1
        if len(steps) >= max_steps:
            raise ValueError(f"{max_steps} steps and {len(waiting) + len(running)} requests "
                             f"still unfinished: does the policy starve some?")
        plan = policy(now, [q.view() for q in waiting], [q.view() for q in running],
                      max_seqs)
        try:
            plan = {int(k): int(v) for k, v in dict(plan).items()}
        except (TypeError, ValueError) as e:
            raise ValueError(f"a plan maps request ids to token counts, got {plan!r}") from e
        if not plan:
            raise ValueError(f"at t = {now:.3f} s the plan is empty while "
                             f"{len(waiting) + len(running)} requests wait: nothing would ever run")
        by_id = {q.id: q for q in waiting + running}
        admitted = [q for q in waiting if q.id in plan]
        if len(running) + len(admitted) > max_seqs:
            raise ValueError(f"the plan seats {len(running) + len(admitted)} requests, "
                             f"max_seqs is {max_seqs}")
        for rid, n in plan.items():
            q = by_id.get(rid)
            if q is None:
                raise ValueError(f"request {rid} is not waiting or running at t = {now:.3f} s")
            left = q.prompt_len - q.prefilled
            if left > 0 and not 1 <= n <= left:
                raise ValueError(f"request {rid} has {left} prompt tokens left: a chunk is "
                                 f"1..{left} tokens, the plan gives {n}")
            if left == 0 and n != 1:
                raise ValueError(f"request {rid} is decoding: 1 token a step, the plan gives {n}")
        running += admitted
        waiting = [q for q in waiting if q.id not in plan]
        tokens = sum(plan.values())
        steps.append((now, tokens))
        now += a + b * tokens
        for q in running:
            n = plan.get(q.id)
            if n is None:
                continue
            if q.prefilled < q.prompt_len:
                q.prefilled += n
                if q.prefilled < q.prompt_len:
                    continue                                  # mid-prefill: samples nothing
            q.generated += 1
            q.token_times.append(now)
        done += [q for q in running if q.generated == q.output_len]
        running = [q for q in running if q.generated < q.output_len]
    return PolicyRun({q.id: q.arrival_time for q in done}, {q.id: q.token_times for q in done},
                     {q.id: q.output_len for q in done}, steps)


def _percentile(xs, p):
    xs = sorted(xs)
    r = (len(xs) - 1) * p / 100
    lo = int(r)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (r - lo)


def policy_metrics(run: PolicyRun) -> dict:
    """TTFT mean / p50 / p99, inter-token latency (every gap between two tokens of a request)
    p50 / p99, end-to-end latency max, throughput (output tokens per second, first arrival to
    last token), all in seconds; and whether every request got exactly its tokens."""
    ttft = [run.token_times[i][0] - run.arrival[i] for i in run.arrival]
    gaps = [t1 - t0 for ts in run.token_times.values() for t0, t1 in zip(ts, ts[1:])] or [0.0]
    e2e = [run.token_times[i][-1] - run.arrival[i] for i in run.arrival]
    span = max(ts[-1] for ts in run.token_times.values()) - min(run.arrival.values())
    out_tokens = sum(len(ts) for ts in run.token_times.values())
    return {"requests": len(run.arrival), "steps": len(run.steps),
            "complete": all(len(run.token_times[i]) == run.output_lens[i] for i in run.arrival),
            "ttft_mean": sum(ttft) / len(ttft), "ttft_p50": _percentile(ttft, 50),
            "ttft_p99": _percentile(ttft, 99), "itl_p50": _percentile(gaps, 50),
            "itl_p99": _percentile(gaps, 99), "e2e_max": max(e2e),
            "throughput": out_tokens / span}


def fcfs_policy(now, waiting, running, max_seqs):
    """The engine's: every running request runs (its whole prompt, or one decode token), then
    waiting requests are admitted first come, first served, whole prompts, while seats are free."""
    plan = {q.id: q.prompt_len - q.prefilled or 1 for q in running}
    for q in waiting[:max_seqs - len(running)]:
        plan[q.id] = q.prompt_len
    return plan


def shortest_prompt_first(now, waiting, running, max_seqs):
    """Like FCFS, but free seats go to the shortest waiting prompts (ties: the oldest)."""
    plan = {q.id: q.prompt_len - q.prefilled or 1 for q in running}
    for q in sorted(waiting, key=lambda q: (q.prompt_len, q.arrival_time))[:max_seqs - len(running)]:
        plan[q.id] = q.prompt_len
    return plan


def decode_first_chunked(now, waiting, running, max_seqs, budget: int = 64):
    """A token budget per step: every decode first (1 token each), then prompts, oldest first,
    a chunk at a time with what is left of the budget (always at least one token)."""
    plan = {q.id: 1 for q in running if q.prefilled == q.prompt_len}
    left = max(budget - len(plan), 1)
    for q in running + waiting[:max_seqs - len(running)]:
        if q.prefilled < q.prompt_len and left > 0:
            plan[q.id] = min(q.prompt_len - q.prefilled, left)
            left -= plan[q.id]
    return plan or {waiting[0].id: 1}
