"""Masked diffusion language models: write many tokens per forward pass (lab 09).

An autoregressive model writes one token per forward pass. A masked-diffusion model (D3PM's
absorbing state; MDLM, LLaDA) instead starts from a sequence of [MASK] tokens and unmasks several
per pass, so n tokens cost `steps` passes, as few as 1 and at most n.

Training (forward process): pick a mask rate t ~ U(0, 1) per sequence, replace each token by
[MASK] with probability t, and train a *bidirectional* transformer to predict the originals at
the masked positions. Weighting each sequence's loss by 1/t makes it an upper bound on the
negative log-likelihood (the ELBO of the continuous-time absorbing process):

    -log p(x) <= E_t [ (1/t) * sum_{i masked} -log p_theta(x_i | x_t) ]

so exp(bound / L) is an upper bound on perplexity, comparable to an autoregressive model's.

Sampling (reverse process): the prompt stays, the n new positions start masked; each step runs
the model once on the whole sequence, proposes a token for every masked position, and keeps the
k most confident of them (LLaDA's low-confidence remasking), k = n / steps. Fewer steps, more
tokens per pass, lower quality: that trade-off is the lab's measurement.

The model is `minillm.model.Transformer` with `causal=False` and one extra vocabulary entry, the
mask token (the last id). It has no KV cache: every pass changes tokens everywhere.

`sample_with` is `sample` around a greedy sampler of one's own (lab 09's `diffusion_sample`): it
adds the temperature and the blocks and leaves the unmasking to that sampler.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

SHORT_SHARE = 0.25    # share of training batches cut to a random shorter length (32..L)


def mask_id(model) -> int:
    """The [MASK] token: the last id of a diffusion model's vocabulary."""
    if model.config.causal:
        raise ValueError("not a masked-diffusion model (config.causal is True)")
    return model.config.vocab_size - 1


def mask_rates(batch: int, gen: torch.Generator | None = None, t_min: float = 1e-3):
    """One mask rate per sequence, stratified over (0, 1] so a batch covers every rate."""
    u = torch.rand((), generator=gen)
    t = (u + torch.arange(batch) / batch) % 1.0
    return t.clamp(min=t_min)


def corrupt(x: torch.Tensor, t: torch.Tensor, mask: int, gen: torch.Generator | None = None):
    """Replace each token of x [B, L] by `mask` with probability t[b]: (x_t, masked [B, L])."""
    masked = torch.rand(x.shape, generator=gen) < t[:, None]
    return torch.where(masked, torch.full_like(x, mask), x), masked


def diffusion_loss(logits: torch.Tensor, x: torch.Tensor, masked: torch.Tensor,
                   t: torch.Tensor) -> torch.Tensor:
    """The 1/t-weighted cross-entropy on masked positions, per token: an NLL bound's estimate.
    logits [B, L, V], targets x [B, L], masked [B, L], rates t [B]."""
    ce = F.cross_entropy(logits.float().flatten(0, 1), x.flatten(), reduction="none")
    ce = (ce.view_as(x) * masked) / t.to(ce.device)[:, None]
    return ce.sum() / x.numel()


@torch.no_grad()
def nll_bound(model, data: torch.Tensor, seq_len: int, rates_per_window: int = 8,
              max_tokens: int | None = None, seed: int = 0, batch_size: int = 8
              ) -> tuple[float, int]:
    """Held-out NLL bound (nats / token) on consecutive windows of `data`, averaging the 1/t-
    weighted loss over `rates_per_window` stratified mask rates per window (seeded)."""
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    n_windows = len(data) // seq_len
    if max_tokens is not None:
        n_windows = min(n_windows, max(1, max_tokens // seq_len))
    if n_windows == 0:
        raise ValueError(f"need at least {seq_len} tokens of data, got {len(data)}")
    device = next(model.parameters()).device
    total = 0.0
    windows = data[:n_windows * seq_len].view(n_windows, seq_len)
    for i in range(0, n_windows, batch_size):
        x = windows[i:i + batch_size]
        for _ in range(rates_per_window):
            t = mask_rates(len(x), gen)
            xt, masked = corrupt(x, t, mask_id(model), gen)
            logits = model(xt.to(device))
            total += diffusion_loss(logits, x.to(device), masked.to(device), t).item() * x.numel()
    return total / (rates_per_window * n_windows * seq_len), n_windows * seq_len


def unmask_schedule(n: int, steps: int) -> list[int]:
    """How many tokens each of `steps` passes unmasks: n split as evenly as possible."""
    if not 1 <= steps <= n:
        raise ValueError(f"steps must be between 1 and the {n} new tokens, got {steps}")
    return [n // steps + (1 if s < n % steps else 0) for s in range(steps)]


def block_schedule(n: int, steps: int, block: int | None) -> list[tuple[int, int, int]]:
    """(start, end, tokens) of each pass: the new tokens in blocks of `block` positions written
    left to right (None: one block), the passes split over the blocks as evenly as possible and
    each block's tokens over its passes by `unmask_schedule`."""
    if not 1 <= steps <= n:
        raise ValueError(f"steps must be between 1 and the {n} new tokens, got {steps}")
    block = n if block is None else block
    if block < 1:
        raise ValueError(f"block must be a positive number of tokens, got {block}")
    edges = list(range(0, n, block)) + [n]
    if steps < len(edges) - 1:
        raise ValueError(f"{len(edges) - 1} blocks of {block} tokens need at least "
                         f"{len(edges) - 1} passes, got steps={steps}")
    out = []
    for (a, b), passes in zip(zip(edges, edges[1:]), unmask_schedule(steps, len(edges) - 1)):
        out += [(a, b, k) for k in unmask_schedule(b - a, min(passes, b - a))]
    return out


@torch.no_grad()
def sample(model, prompt, n_new: int, steps: int, temperature: float = 0.0,
           order: str = "confidence", seed: int = 0, block: int | None = None
           ) -> tuple[list[int], int]:
    """Write n_new tokens after `prompt` in `steps` forward passes. Returns (new ids, passes).

    order "confidence": each pass keeps the masked positions whose proposed token has the highest
    probability; "random": a random subset (the plain reverse process, for comparison).
    temperature 0 proposes the argmax, otherwise a sample at that temperature.
    block: write the new tokens in blocks of this many positions, left to right, each block
    finished before the next starts (LLaDA's semi-autoregressive sampling); None: one block.
    """
    if order not in ("confidence", "random"):
        raise ValueError(f"order must be 'confidence' or 'random', got {order!r}")
    prompt = list(prompt)
    if len(prompt) + n_new > model.config.max_seq_len:
        raise ValueError(f"prompt ({len(prompt)}) + n_new ({n_new}) exceeds the model's context "
                         f"of {model.config.max_seq_len}")
    mask = mask_id(model)
    gen = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    x = torch.tensor(prompt + [mask] * n_new, device=device)[None]
    passes = 0
    for a, b, k in block_schedule(n_new, steps, block):
        logits = model(x)[0].float()
        passes += 1
        logits[:, mask] = -math.inf                     # never propose [MASK] itself
        span = x[0, len(prompt) + a:len(prompt) + b]
        still = (span == mask).nonzero().flatten() + len(prompt) + a
        probs = logits[still].softmax(-1)
        if temperature > 0:
            proposal = torch.multinomial((logits[still] / temperature).softmax(-1).cpu(), 1,
                                         generator=gen).flatten().to(device)
        else:
            proposal = probs.argmax(-1)
        if order == "confidence":
            score = probs.gather(1, proposal[:, None]).flatten()
        else:
            score = torch.rand(len(still), generator=gen).to(device)
        keep = score.topk(k).indices
        x[0, still[keep]] = proposal[keep]
    return x[0, len(prompt):].tolist(), passes


class _BlockView(torch.nn.Module):
    """What `sample_with` hands the sampler for one block: the model over the sequence written so
    far, with the `later` masks of the blocks after this one appended (the model sees the whole
    sequence, as in `sample`). At a temperature each still-masked position's proposal is drawn
    as `sample` draws it and shown as the argmax of a row holding one other finite logit, 1 to 9
    below it by the rank of the proposal's untempered probability p among the positions (equal p,
    equal rank): a greedy sampler proposes it and orders the positions exactly as p does."""

    def __init__(self, model, later: int, temperature: float, gen: torch.Generator):
        super().__init__()
        self.model, self.config = model, model.config
        self.later, self.temperature, self.gen, self.calls = later, temperature, gen, 0

    def forward(self, x):
        self.calls += 1
        mask = mask_id(self.model)
        full = torch.cat([x, x.new_full((x.shape[0], self.later), mask)], 1)
        logits = self.model(full)[:, :x.shape[1]].float()
        if self.temperature == 0:
            return logits
        if x.shape[0] != 1:
            raise ValueError(f"sample_with writes one sequence, got a batch of {x.shape[0]}")
        out = logits[0].clone()
        out[:, mask] = -math.inf                        # never propose [MASK] itself
        still = (x[0] == mask).nonzero().flatten()
        probs = out[still].softmax(-1)
        proposal = torch.multinomial((out[still] / self.temperature).softmax(-1).cpu(), 1,
                                     generator=self.gen).flatten().to(x.device)
        p = probs.gather(1, proposal[:, None]).flatten()
        values, rank = torch.unique(p, sorted=True, return_inverse=True)   # dense, ascending
        rows = torch.full_like(probs, -math.inf)
        at = torch.arange(len(still), device=x.device)
        rows[at, proposal] = 0.0
        rows[at, (proposal == 0).long()] = -1.0 - 8.0 * rank / len(values)   # higher p: surer
        out[still] = rows
        return out[None]


@torch.no_grad()
def sample_with(sampler, model, prompt, n_new: int, steps: int, temperature: float = 0.0,
                seed: int = 0, block: int | None = None) -> tuple[list[int], int]:
    """`sample` (order "confidence") around a greedy sampler of one's own, `sampler(model,
    prompt, n_new, steps) -> n_new new ids`: confidence-ordered unmasking from the argmax of
    `model`'s logits (lab 09's `diffusion_sample`). Returns (new ids, passes).

    block: each block of new tokens is one call of `sampler`, with the passes `sample` gives it,
    on a view of `model` that appends the later blocks' masks. temperature > 0: in each pass the
    view draws every still-masked position's token as `sample` does (seeded) and hands it to the
    sampler as the argmax, with a confidence that orders the positions as the drawn tokens'
    untempered probabilities do: the sampler keeps the proposals `sample` keeps."""
    prompt = list(prompt)
    if len(prompt) + n_new > model.config.max_seq_len:
        raise ValueError(f"prompt ({len(prompt)}) + n_new ({n_new}) exceeds the model's context "
                         f"of {model.config.max_seq_len}")
    if model.config.vocab_size < 3:
        raise ValueError("sample_with needs a vocabulary of at least 3 ids")
    gen = torch.Generator().manual_seed(seed)
    passes: dict[tuple[int, int], int] = {}
    for a, b, _ in block_schedule(n_new, steps, block):
        passes[(a, b)] = passes.get((a, b), 0) + 1
    out, calls = [], 0
    for (a, b), n in passes.items():
        view = _BlockView(model, n_new - b, temperature, gen)
        new = [int(t) for t in sampler(view, prompt + out, b - a, n)]
        if len(new) != b - a:
            raise ValueError(f"the sampler returned {len(new)} ids for a block of {b - a}")
        out += new
        calls += view.calls
    return out, calls
