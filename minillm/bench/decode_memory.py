"""Decode memory and time per token against context length, measured (lab 09).

A decode step reads every weight once and every sequence's decode state once. A transformer's
state is its KV cache, S * K*H * L * 2 values that grow with the context S; a hybrid's
linear-attention layers carry a fixed H x H (+ H) state per head instead, so only its few
attention layers grow. `roofline.kv_cache_bytes_per_seq` is the napkin; this module measures it:

    cache = filled_cache(model, context=4096)          # what a 4096-token prefill would leave
    cache.nbytes                                       # the bytes it holds
    times = decode_step_times({"target": target, "hybrid": hybrid}, [256, 1024, 4096])

`filled_cache` writes random keys, values and states rather than prefilling real text: the bytes a
step reads and the work it does depend on the context length, not on the values, and a prefill
of 8192 tokens would cost minutes on a laptop CPU (and run past the models' trained context,
which does not matter for timing). Times are medians of interleaved rounds of CPU time (`minillm.bench.timing`).
"""
from __future__ import annotations

import torch

from ..kvcache import KVCache, layer_specs
from .timing import cpu_time_interleaved, median


def filled_cache(model, context: int, room: int = 0, seed: int = 0) -> KVCache:
    """A batch-1 cache holding `context` positions (plus `room` free slots for decode steps)."""
    if context < 1:
        raise ValueError(f"context must be at least 1 token, got {context}")
    p = next(model.parameters())
    gen = torch.Generator().manual_seed(seed)
    cache = KVCache(layer_specs(model), 1, context + room, p.dtype, p.device)
    for k, v in zip(cache.k, cache.v):
        if k is not None:
            k[:, :, :context] = torch.randn(k[:, :, :context].shape, generator=gen)
            v[:, :, :context] = torch.randn(v[:, :, :context].shape, generator=gen)
    for i, layer in enumerate(model.layers):
        if layer.self_attn.kv_spec() is None and hasattr(layer.self_attn, "decay"):
            h, H = layer.self_attn.n_heads, layer.self_attn.head_dim
            S = torch.randn(1, h, H, H, generator=gen).to(p)
            z = (torch.rand(1, h, H, generator=gen) * context + 1).to(p)   # positive, like sums
            cache.state[i] = (S, z)                                        # of phi(k) > 0
    cache.seq_len = context
    return cache


def decode_step_times(models: dict, contexts, repeats: int = 7, warmup: int = 2,
                      timer=cpu_time_interleaved) -> dict:
    """{name: [median seconds of one batch-1 decode step at each context]}. Every (model, context)
    pair runs once per round, all in the same interleaved rounds, so a slow patch of the machine
    slows every pair alike rather than one context's. The default timer counts this process's CPU
    seconds (run torch on one thread): a neighbour that takes the core for a few milliseconds
    would otherwise land in some steps and not others. The cache is put back after every step, so
    every timed step reads the same `context` positions."""
    contexts = list(contexts)
    runs = {}
    for name, model in models.items():
        tok = torch.zeros(1, 1, dtype=torch.long, device=next(model.parameters()).device)
        for context in contexts:
            cache = filled_cache(model, context, room=1)
            saved = dict(cache.state)

            def step(model=model, cache=cache, saved=saved, tok=tok, context=context):
                cache.seq_len = context
                cache.state.update(saved)
                with torch.no_grad():
                    model(tok, cache=cache)
            runs[(name, context)] = step
    times = timer(runs, warmup=warmup, repeats=repeats)
    return {name: [median(times[(name, c)]) for c in contexts] for name in models}
