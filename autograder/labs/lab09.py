"""Lab 09's probes: the student's code run where it lives, on what it needs built there.

    from autograder.labs import lab09
    lab09.steps_from(la_step, q, k, v, (S0, z0), decay)   # -> y [B, h, T, H], (S, z), kept
    lab09.call_with_config(decode_state_bytes, config, 1000, 2)   # the config sent as its fields
    lab09.counted_sample(diffusion_sample, "diffusion", prompt, 12, 4)   # -> {"tokens", "calls"}
    lab09.counted_sample(diffusion_sample, 905, prompt, 10, 3)   # on tiny_diffusion_model(905)

The tests compare these with minillm.linear_attention, minillm.roofline and minillm.diffusion,
run in the tester on the same inputs (`tiny_diffusion_model(seed)` builds the same model on
both sides).
"""
from __future__ import annotations

import dataclasses

import torch

from autograder.checks import WorkCounter
from autograder.probes import fresh_model, probe
from minillm.config import ModelConfig
from minillm.model import Transformer


@probe
def steps_from(la_step, q, k, v, state, decay):
    """`la_step` over the T tokens of q, k, v [B, h, T, H], starting from `state` (S, z): the
    stacked y [B, h, T, H], the final state, and whether the state passed in is unchanged."""
    given, now, ys = [t.clone() for t in state], state, []
    for t in range(q.shape[-2]):
        y, now = la_step(q[:, :, t], k[:, :, t], v[:, :, t], now, decay)
        ys.append(y)
    kept = all(torch.equal(a, b) for a, b in zip(state, given))
    return torch.stack(ys, dim=2), tuple(now), kept


@probe
def _on_config(fn, fields: dict, *args):
    return fn(ModelConfig(**fields), *args)


def call_with_config(fn, config: ModelConfig, *args):
    """`fn(config, *args)`; the ModelConfig crosses as its fields and is rebuilt in the kernel."""
    return _on_config(fn, dataclasses.asdict(config), *args)


def tiny_diffusion_model(seed: int) -> Transformer:
    """A small random bidirectional model (61 ids, the last one [MASK]): the same from the same
    seed, in the tester and in the kernel; the global RNG is left as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Transformer(ModelConfig(vocab_size=61, dim=32, n_layers=2, n_heads=2,
                                        hidden_dim=48, max_seq_len=64, causal=False)).eval()
        with torch.no_grad():
            for p in model.parameters():
                p.normal_(0, 0.5)
    return model


@probe
def counted_sample(diffusion_sample, model, prompt, n_new: int, steps: int) -> dict:
    """`diffusion_sample(m, prompt, n_new, steps)` on a fresh m (a shipped checkpoint's name, or
    the seed of `tiny_diffusion_model`), its forward passes counted: {"tokens", "calls"}."""
    m = fresh_model(model) if isinstance(model, str) else tiny_diffusion_model(model)
    with WorkCounter(m) as work:
        tokens = diffusion_sample(m, prompt, n_new, steps)
    return {"tokens": tokens, "calls": work.calls}


__all__ = ["steps_from", "call_with_config", "tiny_diffusion_model", "counted_sample"]
