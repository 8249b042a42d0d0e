"""One request's state while a server works on it.

A `Sequence` is the unit every serving component talks about: the scheduler moves it between
queues, the block manager gives it a block table, the model runner feeds its uncached tokens
through the model, the sampler appends to it, and the metrics read its timestamps.

    token_ids = prompt (prompt_len tokens) + generated tokens
    num_cached_tokens = how many of token_ids already have keys/values in the KV cache

Before a step the cache holds token_ids[:num_cached_tokens]; the step computes the rest
(the whole prompt for a prefill, the one newest token for a decode), and afterwards every
token is cached. A preempted sequence loses its cache (num_cached_tokens = 0) but keeps its
tokens: when it is admitted again, its "prompt" is everything it had, and it goes on where it
stopped (preemption by recompute).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

import torch

from ..sampling import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"        # queued (new, or preempted): holds no KV blocks
    RUNNING = "running"        # holds KV blocks, takes part in every step
    FINISHED = "finished"      # done; its blocks are freed


@dataclass(eq=False)           # identity equality: two sequences with the same tokens differ
class Sequence:
    seq_id: int
    token_ids: list[int]
    prompt_len: int
    params: SamplingParams = field(default_factory=SamplingParams)
    arrival_time: float = 0.0             # when the request reached the server (seconds)
    request_id: int | None = None          # the request it serves (parallel samples share one)
    generator: torch.Generator | None = None   # per-request RNG: seeded outputs do not depend
                                               # on which other requests share the batch
    status: SequenceStatus = SequenceStatus.WAITING
    num_cached_tokens: int = 0
    num_preemptions: int = 0
    finish_reason: str | None = None       # "stop" (a stop id) or "length" (max_new_tokens)
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finish_time: float | None = None
    token_times: list[float] = field(default_factory=list)   # when each output token appeared

    def __post_init__(self):
        self.token_ids = [int(t) for t in self.token_ids]
        if not self.token_ids:
            raise ValueError(f"sequence {self.seq_id}: the prompt is empty, need at least one "
                             "token")
        if not 0 < self.prompt_len <= len(self.token_ids):
            raise ValueError(f"sequence {self.seq_id}: prompt_len {self.prompt_len} must be in "
                             f"1..{len(self.token_ids)}")
        if self.request_id is None:
            self.request_id = self.seq_id

    # ---- views ----------------------------------------------------------------------------
    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.prompt_len:]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.prompt_len

    @property
    def last_token(self) -> int:
        return self.token_ids[-1]

    @property
    def num_uncached_tokens(self) -> int:
        """Tokens the next step must run through the model."""
        return len(self.token_ids) - self.num_cached_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    # ---- changes --------------------------------------------------------------------------
    def append_token(self, token: int, now: float | None = None) -> None:
        """Add a sampled token; records its time and whether the sequence is now done."""
        self.token_ids.append(int(token))
        if now is not None:
            if self.first_token_time is None:
                self.first_token_time = now
            self.token_times.append(now)
        p = self.params
        if int(token) in p.stop_ids:
            self.finish_reason = "stop"
        elif self.num_output_tokens >= p.max_new_tokens:
            self.finish_reason = "length"

    @property
    def wants_to_stop(self) -> bool:
        return self.finish_reason is not None

    def __repr__(self) -> str:
        return (f"Sequence(id={self.seq_id}, {self.status.value}, prompt={self.prompt_len}, "
                f"out={self.num_output_tokens}, cached={self.num_cached_tokens})")


def check_request(prompt, params: SamplingParams, vocab_size: int, max_seq_len: int) -> list[int]:
    """The prompt as a list of ints, or a ValueError that names what is wrong with the request
    (both servers accept requests through this one check)."""
    prompt = [int(t) for t in (prompt.tolist() if torch.is_tensor(prompt) else prompt)]
    if not prompt:
        raise ValueError("the prompt is empty: need at least one token id")
    if min(prompt) < 0 or max(prompt) >= vocab_size:
        raise ValueError(f"token ids must be in [0, {vocab_size}), got "
                         f"{min(prompt)}..{max(prompt)}")
    if params.max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1 to serve a request, got "
                         f"{params.max_new_tokens}")
    if len(prompt) + params.max_new_tokens > max_seq_len:
        raise ValueError(f"prompt ({len(prompt)} tokens) + max_new_tokens "
                         f"({params.max_new_tokens}) exceeds the model's context of "
                         f"{max_seq_len} tokens")
    return prompt
