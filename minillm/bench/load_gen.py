"""An open-loop load generator: Poisson arrivals over real HTTP against an OpenAI-style server.

Closed-loop clients (send, wait for the answer, send the next) slow down when the server does,
so they never see it overloaded. Real users do not wait for each other: requests arrive at
random times whatever the server is doing. This generator draws arrival times from a Poisson
process (exponential gaps, mean 1 / rate), starts every request at its time, streams each answer
and records, per request, when its first token and every later chunk arrived:

    TTFT  first chunk - arrival          TPOT  (last chunk - first chunk) / (tokens - 1)
    ITL   every gap between two chunks   (the stalls a user actually sees)

Prompts are token-id windows of the validation text (`/v1/completions` takes token ids), so
their lengths are exact. With `long_prompt_len`, every `long_every`-th request is a long prompt
with few output tokens: the workload where one prefill stalls every running stream unless the
server chunks it. Statistics are then reported for the short ("running") requests alone.
"""
from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field

from ..serving.metrics import percentile


@dataclass
class Workload:
    rate: float = 4.0                 # requests per second (Poisson)
    num_requests: int = 16
    prompt_len: int = 16
    max_tokens: int = 32
    long_prompt_len: int | None = None   # every long_every-th request gets this many tokens
    long_every: int = 4
    long_max_tokens: int = 1
    seed: int = 0
    timeout_s: float = 120.0          # the whole run; unfinished requests count as errors

    def __post_init__(self):
        if not self.rate > 0 or self.num_requests < 1 or self.prompt_len < 1 \
                or self.max_tokens < 1 or self.long_every < 1 or not self.timeout_s > 0:
            raise ValueError(f"need rate > 0 and num_requests, prompt_len, max_tokens, "
                             f"long_every >= 1, timeout_s > 0: got {self}")
        if self.long_prompt_len is not None and self.long_prompt_len < 1:
            raise ValueError(f"long_prompt_len must be >= 1, got {self.long_prompt_len}")


@dataclass
class Record:
    arrival: float                    # seconds since the start of the run
    long: bool = False
    first: float | None = None
    chunks: list[float] = field(default_factory=list)
    tokens: int = 0
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.first is not None and self.tokens > 0


def schedule(w: Workload, token_ids: list[int]) -> list[tuple[float, list[int], int, bool]]:
    """(arrival time, prompt ids, max_tokens, is_long) of every request, seeded."""
    rng = random.Random(w.seed)
    longest = max(w.prompt_len, w.long_prompt_len or 0)
    if len(token_ids) < longest + 1:
        raise ValueError(f"need at least {longest + 1} tokens of text for the prompts, got "
                         f"{len(token_ids)}")
    t, out = 0.0, []
    for i in range(w.num_requests):
        t += rng.expovariate(w.rate)
        is_long = w.long_prompt_len is not None and i % w.long_every == w.long_every - 1
        n = w.long_prompt_len if is_long else w.prompt_len
        start = rng.randrange(0, len(token_ids) - n)
        out.append((t, token_ids[start:start + n], w.long_max_tokens if is_long
                    else w.max_tokens, is_long))
    return out


async def _one(client, url, model, ids, max_tokens, rec: Record, t0: float) -> None:
    body = {"model": model, "prompt": ids, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    try:
        async with client.stream("POST", url + "/v1/completions", json=body) as r:
            if r.status_code != 200:
                rec.error = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                return
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                now = time.perf_counter() - t0
                if chunk.get("usage"):
                    rec.tokens = chunk["usage"]["completion_tokens"]
                if chunk["choices"]:
                    rec.chunks.append(now)
                    if rec.first is None:
                        rec.first = now
    except Exception as e:            # noqa: BLE001 - every failure is counted, none hidden
        rec.error = f"{type(e).__name__}: {e}"


async def run_load(url: str, model: str, w: Workload, token_ids: list[int]) -> list[Record]:
    """Send the workload open-loop; one Record per request, in arrival order."""
    import httpx
    plan = schedule(w, token_ids)
    records = [Record(t, long=is_long) for t, _ids, _m, is_long in plan]
    limits = httpx.Limits(max_connections=w.num_requests, max_keepalive_connections=16)
    async with httpx.AsyncClient(timeout=httpx.Timeout(w.timeout_s), limits=limits,
                                 trust_env=False) as client:          # loopback: no proxies
        t0 = time.perf_counter()

        async def launch(i):
            t, ids, max_tokens, _ = plan[i]
            await asyncio.sleep(max(0.0, t - (time.perf_counter() - t0)))
            await _one(client, url, model, ids, max_tokens, records[i], t0)

        tasks = [asyncio.create_task(launch(i)) for i in range(len(plan))]
        _done, pending = await asyncio.wait(tasks, timeout=w.timeout_s)
        for task in pending:
            task.cancel()
        for i, task in enumerate(tasks):
            if task in pending and records[i].error is None:
                records[i].error = f"unfinished after {w.timeout_s} s"
    return records


def summarize_load(records: list[Record], w: Workload, percentile=percentile) -> dict:
    """Throughput and latency percentiles of a run (latencies of the short requests only when
    the workload mixes in long prompts). `percentile(values, p)`: default `metrics.percentile`
    (lab 06's explorer passes the student's)."""
    ok = [r for r in records if r.ok]
    out = {"rate": w.rate, "requests": len(records), "completed": len(ok),
           "errors": len(records) - len(ok),
           "error_examples": sorted({r.error for r in records if r.error})[:3]}
    if not ok:
        return out
    span = max(r.chunks[-1] for r in ok) - min(r.arrival for r in records)
    tokens = sum(r.tokens for r in ok)
    out.update(duration_s=span, output_tokens=tokens, throughput_tok_s=tokens / span,
               throughput_req_s=len(ok) / span)
    short = [r for r in ok if not r.long]
    ttft = [r.first - r.arrival for r in short]
    tpot = [(r.chunks[-1] - r.first) / (r.tokens - 1) for r in short if r.tokens > 1]
    itl = [b - a for r in short for a, b in zip(r.chunks, r.chunks[1:])]
    for name, xs in (("ttft", ttft), ("tpot", tpot), ("itl", itl)):
        if xs:
            out[f"{name}_p50_s"] = percentile(xs, 50)
            out[f"{name}_p99_s"] = percentile(xs, 99)
            out[f"{name}_max_s"] = max(xs)
    return out


def load_test(url: str, model: str, w: Workload, token_ids: list[int],
              percentile=percentile) -> dict:
    """Run a workload against a server at `url` and summarize it (blocking; from a notebook,
    call it in a thread or with `await run_load(...)`); `percentile` as in `summarize_load`."""
    return summarize_load(asyncio.run(run_load(url, model, w, token_ids)), w, percentile)
