"""Autoregressive generation loops.

`generate_naive` is the lecture's first loop: to produce each new token, run the *whole* sequence
so far through the model again and sample from the last position. Step t processes t tokens, so T
new tokens cost O(T^2) token-passes and, with attention's own O(T) per token, O(T^3) FLOPs.

`generate_cached` (lab 02) keeps a KV cache: one prefill pass over the prompt, then one token per
decode step -- O(T) token-passes. Both loops take the same arguments and, with the same seed,
return the same tokens.
"""
from __future__ import annotations

from typing import Iterator

import torch

from .kvcache import KVCache
from .sampling import SamplingParams, sample


def as_prompt_batch(prompt, device="cpu") -> torch.Tensor:
    """list[int] | [T] | [B, T] tensor -> [B, T] long tensor, with clear errors for bad input."""
    ids = torch.as_tensor(prompt, dtype=torch.long, device=device)
    if ids.dim() == 1:
        ids = ids[None]
    if ids.dim() != 2 or ids.shape[1] == 0:
        raise ValueError(f"prompt must be a non-empty list of token ids or a [B, T] tensor, "
                         f"got shape {tuple(ids.shape)}")
    return ids


def check_fits(model, prompt_len: int, max_new_tokens: int) -> None:
    ctx = model.config.max_seq_len
    if prompt_len > ctx:
        raise ValueError(f"prompt has {prompt_len} tokens but the model's context is {ctx}")
    if prompt_len + max_new_tokens > ctx:
        raise ValueError(f"prompt ({prompt_len} tokens) + max_new_tokens ({max_new_tokens}) "
                         f"exceeds the model's context of {ctx} tokens; ask for at most "
                         f"{ctx - prompt_len} new tokens")


def check_vocab(model, ids: torch.Tensor) -> None:
    V = model.config.vocab_size
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= V):
        raise ValueError(f"token ids must be in [0, {V}), got min {int(ids.min())}, "
                         f"max {int(ids.max())}")


@torch.no_grad()
def stream_naive(model, prompt, params: SamplingParams | None = None,
                 generator: torch.Generator | None = None) -> Iterator[torch.Tensor]:
    """Yield the next token ids [B] one step at a time, re-running the full prefix each step."""
    params = params or SamplingParams()
    device = next(model.parameters()).device
    ids = as_prompt_batch(prompt, device)
    check_vocab(model, ids)
    check_fits(model, ids.shape[1], params.max_new_tokens)
    if generator is None and params.seed is not None:
        generator = torch.Generator(device=device).manual_seed(params.seed)
    done = torch.zeros(ids.shape[0], dtype=torch.bool, device=device)
    stop = torch.tensor(params.stop_ids, dtype=torch.long, device=device)
    for _ in range(params.max_new_tokens):
        logits = model(ids, last_only=True)[:, -1]            # the whole prefix, every step
        nxt = sample(logits, params.temperature, params.top_k, params.top_p, generator)
        yield nxt
        done |= torch.isin(nxt, stop)
        if bool(done.all()):
            return
        ids = torch.cat([ids, nxt[:, None]], dim=1)


@torch.no_grad()
def stream_cached(model, prompt, params: SamplingParams | None = None,
                  generator: torch.Generator | None = None, cache=None
                  ) -> Iterator[torch.Tensor]:
    """Yield the next token ids [B] one step at a time: prefill the prompt into a KV cache once,
    then feed only the newest token each step.

    cache: a fresh cache to fill (default: a `KVCache` sized prompt + max_new_tokens).
    """
    params = params or SamplingParams()
    device = next(model.parameters()).device
    ids = as_prompt_batch(prompt, device)
    check_vocab(model, ids)
    check_fits(model, ids.shape[1], params.max_new_tokens)
    if params.max_new_tokens <= 0:
        return
    if cache is None:
        cache = KVCache.for_model(model, ids.shape[0], ids.shape[1] + params.max_new_tokens)
    if generator is None and params.seed is not None:
        generator = torch.Generator(device=device).manual_seed(params.seed)
    done = torch.zeros(ids.shape[0], dtype=torch.bool, device=device)
    stop = torch.tensor(params.stop_ids, dtype=torch.long, device=device)
    logits = model(ids, cache=cache, last_only=True)[:, -1]           # prefill
    for step in range(params.max_new_tokens):
        nxt = sample(logits, params.temperature, params.top_k, params.top_p, generator)
        yield nxt
        done |= torch.isin(nxt, stop)
        if step == params.max_new_tokens - 1 or bool(done.all()):
            return
        logits = model(nxt[:, None], cache=cache)[:, -1]               # decode one token


def _collect(stream, n: int, stop_ids) -> list[list[int]]:
    out: list[list[int]] = [[] for _ in range(n)]
    finished = [False] * n
    for nxt in stream:
        for b, t in enumerate(nxt.tolist()):
            if not finished[b]:
                out[b].append(t)
                finished[b] = t in stop_ids
    return out


def generate_cached(model, prompt, params: SamplingParams | None = None,
                    generator: torch.Generator | None = None, cache=None) -> list[list[int]]:
    """Like `generate_naive`, with a KV cache: new token ids for each prompt row."""
    params = params or SamplingParams()
    n = as_prompt_batch(prompt).shape[0]
    return _collect(stream_cached(model, prompt, params, generator, cache), n, params.stop_ids)


def generate_naive(model, prompt, params: SamplingParams | None = None,
                   generator: torch.Generator | None = None) -> list[list[int]]:
    """New token ids for each prompt row; a row ends after its first stop token (kept)."""
    params = params or SamplingParams()
    n = as_prompt_batch(prompt).shape[0]
    return _collect(stream_naive(model, prompt, params, generator), n, params.stop_ids)
