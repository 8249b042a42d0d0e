"""Lab 09: probes run the student's code in their kernel on what it needs built there."""
from __future__ import annotations

import dataclasses

import torch

from autograder import labs
from autograder.probes import fresh_model, probe
from minillm.model import Transformer


@probe
def steps_from(la_step, q, k, v, state, decay):
    """`la_step` over the T tokens: the stacked y, the final state, whether `state` is intact."""
    given, now, ys = [t.clone() for t in state], state, []
    for t in range(q.shape[-2]):
        y, now = la_step(q[:, :, t], k[:, :, t], v[:, :, t], now, decay)
        ys.append(y)
    kept = all(torch.equal(a, b) for a, b in zip(state, given))
    return torch.stack(ys, dim=2), tuple(now), kept


def call_with_config(fn, config, *args):
    """`fn(config, *args)`; the ModelConfig crosses as its fields."""
    return labs.with_config(fn, dataclasses.asdict(config), *args)


def tiny_diffusion_model(seed: int) -> Transformer:
    """A small bidirectional model (61 ids, the last [MASK]); the global RNG is left as it was."""
    with torch.random.fork_rng(devices=[]):
        return labs.random_model(seed, dict(vocab_size=61, dim=32, n_layers=2, n_heads=2,
                                            hidden_dim=48, max_seq_len=64, causal=False), 0.5)


@probe
def counted_sample(diffusion_sample, model, prompt, n_new: int, steps: int) -> dict:
    """`diffusion_sample` on a fresh checkpoint or tiny_diffusion_model(seed), counted."""
    m = fresh_model(model) if isinstance(model, str) else tiny_diffusion_model(model)
    tokens, work = labs.counted(m, diffusion_sample, prompt, n_new, steps)
    return {"tokens": tokens, "calls": work["calls"]}


__all__ = ["steps_from", "call_with_config", "tiny_diffusion_model", "counted_sample"]
