"""Held-out perplexity: exp(mean next-token cross-entropy) on the validation split.

The split is cut into consecutive non-overlapping windows of the model's context; every token
after the first of its window is predicted once.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .data import load_tokens


@torch.no_grad()
def perplexity(model, tokenizer, split: str = "val", max_tokens: int | None = None,
               seq_len: int | None = None, batch_size: int = 8) -> dict:
    if max_tokens is not None and max_tokens < 2:
        raise ValueError(f"max_tokens must be >= 2, got {max_tokens}")
    data = load_tokens(tokenizer, split, max_tokens)
    seq_len = seq_len or model.config.max_seq_len
    device = next(model.parameters()).device
    windows = [data[i:i + seq_len + 1] for i in range(0, len(data) - 1, seq_len)]
    total, count = 0.0, 0
    for i in range(0, len(windows), batch_size):
        group = windows[i:i + batch_size]
        # full windows batch together; the last, shorter one runs on its own
        same = [w for w in group if len(w) == seq_len + 1]
        rest = [w for w in group if len(w) != seq_len + 1]
        for batch in ([torch.stack(same)] if same else []) + [w[None] for w in rest]:
            batch = batch.to(device)
            logits = model(batch[:, :-1]).float()
            total += F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten(),
                                     reduction="sum").item()
            count += batch[:, 1:].numel()
    loss = total / count
    return {"split": split, "tokens": count, "loss": loss, "ppl": math.exp(loss)}


@torch.no_grad()
def continuation_perplexity(model, prompt_ids, new_ids) -> float:
    """exp(mean cross-entropy) of `new_ids` following `prompt_ids` under a causal `model`: the
    judge of generated text (lab 09 scores the diffusion model's writing with the target)."""
    prompt_ids, new_ids = list(prompt_ids), list(new_ids)
    if not prompt_ids or not new_ids:
        raise ValueError("need a non-empty prompt and at least one new token to judge")
    device = next(model.parameters()).device
    ids = torch.tensor([prompt_ids + new_ids], device=device)
    logp = model(ids)[0, len(prompt_ids) - 1:-1].float().log_softmax(-1)
    target = torch.tensor(new_ids, device=device)[:, None]
    return math.exp(-logp.gather(1, target).mean().item())
