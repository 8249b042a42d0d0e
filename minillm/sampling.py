"""Turning logits into the next token: greedy, temperature, top-k, top-p.

All filters work on logits [..., V] and return logits with the removed tokens set to -inf, so
they compose (temperature -> top-k -> top-p, the order Hugging Face uses) and `softmax` of the
result is the exact distribution that `sample` draws from.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class SamplingParams:
    temperature: float = 1.0    # 0 means greedy (argmax)
    top_k: int = 0              # 0 means no top-k filter
    top_p: float = 1.0          # 1 means no nucleus filter
    max_new_tokens: int = 64
    stop_ids: tuple[int, ...] = field(default_factory=tuple)   # generation ends after one of these
    seed: int | None = None

    def __post_init__(self):
        check_params(self.temperature, self.top_k, self.top_p)
        if int(self.max_new_tokens) < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {self.max_new_tokens}")
        self.stop_ids = tuple(int(i) for i in self.stop_ids)


def check_params(temperature: float, top_k: int, top_p: float) -> None:
    if not temperature >= 0:          # also catches NaN
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    if int(top_k) != top_k or top_k < 0:
        raise ValueError(f"top_k must be an integer >= 0 (0 = off), got {top_k}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")


def apply_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """logits / T: T < 1 sharpens the distribution, T > 1 flattens it (T = 0 is greedy)."""
    if temperature <= 0:
        raise ValueError("temperature 0 is greedy decoding: use argmax, not a division by zero")
    return logits / temperature


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k largest logits (and any tied with the k-th), set the rest to -inf."""
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Nucleus sampling: keep the most probable tokens until their total probability reaches p.

    The token whose probability makes the running total cross p is kept; every token after it
    (in order of decreasing probability) is removed. The most probable token is always kept.
    """
    if p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = torch.softmax(sorted_logits.float(), dim=-1)
    mass_before = torch.cumsum(probs, dim=-1) - probs      # probability of strictly better tokens
    remove_sorted = mass_before >= p
    remove_sorted[..., 0] = False
    remove = remove_sorted.scatter(-1, order, remove_sorted)
    return logits.masked_fill(remove, float("-inf"))


def filter_logits(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0,
                  top_p: float = 1.0) -> torch.Tensor:
    """temperature -> top-k -> top-p; softmax of the result is the sampling distribution."""
    check_params(temperature, top_k, top_p)
    logits = apply_temperature(logits.float(), temperature)
    return top_p_filter(top_k_filter(logits, top_k), top_p)


def probabilities(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0,
                  top_p: float = 1.0) -> torch.Tensor:
    """The exact distribution `sample` draws from (one-hot on the argmax when temperature = 0)."""
    if temperature == 0:
        check_params(temperature, top_k, top_p)
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    return torch.softmax(filter_logits(logits, temperature, top_k, top_p), dim=-1)


def sample(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
           generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw one token id per row of logits [..., V] -> ids [...]."""
    if temperature == 0:
        check_params(temperature, top_k, top_p)
        return logits.argmax(-1)
    probs = probabilities(logits, temperature, top_k, top_p)
    flat = probs.reshape(-1, probs.shape[-1])
    ids = torch.multinomial(flat, 1, generator=generator)
    return ids.reshape(probs.shape[:-1])
