"""A seeded serving workload: Poisson arrivals, heavy-tailed prompt and output lengths.

Real traffic is not a dense [batch, length] block. Requests arrive one at a time, at random:
if users act independently at an average `rate` per second, the gaps between arrivals are
exponential, gap ~ Exp(rate) (mean 1 / rate), and the count in any window is Poisson. Their
lengths are skewed: most prompts and answers are short, a few are very long. A log-normal
distribution models that: length = median * exp(sigma * z), z ~ N(0, 1). With sigma = 1 the
99th percentile is ~10x the median -- and one long answer holds a static batch hostage.

    trace = make_trace(num_requests=64, rate=20.0, seed=0)
    for r in trace: r.arrival_time, r.prompt_ids, r.max_new_tokens

Everything is drawn from one `torch.Generator(seed)`, so a seed names a workload exactly.
Lengths are clipped into [1, max]; if prompt_max + output_max cannot fit the model's context,
`make_trace` refuses (it never truncates a request silently).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..sampling import SamplingParams


@dataclass(frozen=True)
class TraceRequest:
    request_id: int
    arrival_time: float            # seconds since the trace started
    prompt_ids: tuple[int, ...]
    max_new_tokens: int            # the answer length (no stop token: the work is fixed)

    def params(self, temperature: float = 0.0, seed: int | None = None) -> SamplingParams:
        return SamplingParams(temperature=temperature, max_new_tokens=self.max_new_tokens,
                              seed=seed)


def poisson_arrivals(n: int, rate: float, generator: torch.Generator) -> list[float]:
    """Arrival times of n requests at `rate` per second: cumulative Exp(rate) gaps,
    gap = -ln(U) / rate with U ~ Uniform(0, 1]."""
    if not rate > 0 or math.isinf(rate):
        raise ValueError(f"rate must be a positive number of requests per second, got {rate}")
    u = 1.0 - torch.rand(n, generator=generator, dtype=torch.float64)      # (0, 1]
    gaps = -torch.log(u) / rate
    return torch.cumsum(gaps, 0).tolist()


def lognormal_lengths(n: int, median: float, sigma: float, max_len: int,
                      generator: torch.Generator) -> list[int]:
    """n lengths round(median * exp(sigma * z)), z ~ N(0, 1), clipped into [1, max_len]."""
    if median < 1 or sigma < 0 or max_len < 1:
        raise ValueError(f"need median >= 1, sigma >= 0, max_len >= 1; got {median}, {sigma}, "
                         f"{max_len}")
    z = torch.randn(n, generator=generator, dtype=torch.float64)
    lengths = torch.round(median * torch.exp(sigma * z)).clamp(1, max_len)
    return [int(x) for x in lengths.tolist()]


def make_trace(num_requests: int = 64, rate: float = 20.0, seed: int = 0, *,
               prompt_median: float = 24, prompt_sigma: float = 0.8, prompt_max: int = 256,
               output_median: float = 24, output_sigma: float = 1.0, output_max: int = 256,
               vocab_size: int = 4096, max_seq_len: int = 512, arrivals=None,
               lengths=None) -> list[TraceRequest]:
    """A reproducible workload of `num_requests` requests (prompt tokens drawn uniformly from
    1..vocab_size-1: their content does not change the work). `arrivals(n, rate, generator)`
    and `lengths(n, median, sigma, max_len, generator)` draw the arrival times and the lengths
    (default `poisson_arrivals` and `lognormal_lengths`; lab 06 passes the student's)."""
    if num_requests < 1:
        raise ValueError(f"num_requests must be >= 1, got {num_requests}")
    if prompt_max + output_max > max_seq_len:
        raise ValueError(f"prompt_max ({prompt_max}) + output_max ({output_max}) exceeds the "
                         f"model's context of {max_seq_len} tokens: a request could not fit; "
                         f"lower one of them")
    g = torch.Generator().manual_seed(seed)
    arrivals, lengths = arrivals or poisson_arrivals, lengths or lognormal_lengths
    times = arrivals(num_requests, rate, g)
    prompt_lens = lengths(num_requests, prompt_median, prompt_sigma, prompt_max, g)
    output_lens = lengths(num_requests, output_median, output_sigma, output_max, g)
    out = []
    for i in range(num_requests):
        ids = torch.randint(1, vocab_size, (int(prompt_lens[i]),), generator=g).tolist()
        out.append(TraceRequest(i, float(times[i]), tuple(ids), int(output_lens[i])))
    return out


def trace_summary(trace: list[TraceRequest]) -> dict:
    p = [len(r.prompt_ids) for r in trace]
    o = [r.max_new_tokens for r in trace]
    span = trace[-1].arrival_time - trace[0].arrival_time
    return {"requests": len(trace), "prompt_tokens": sum(p), "output_tokens": sum(o),
            "max_prompt": max(p), "max_output": max(o),
            "arrival_span_s": span, "mean_output": sum(o) / len(o)}
