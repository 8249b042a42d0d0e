"""Multi-query associative recall (MQAR): the synthetic task that exposes a fixed-size state (lab 09).

A sequence lists N key-value pairs, then asks for the keys again in a random order:

    k3 v3  k7 v7  k1 v1 ...  |  k7 ?  k1 ?  k3 ? ...       (the answer after each query is its value)

Attention solves it for any N: the query's key matches the earlier copy of itself and reads the
token after it (an induction head, two layers). A linear-attention layer must fold all N pairs
into its H x H state per head before the queries arrive; about H pairs fit without interference,
so its accuracy falls as N grows past the state's size (Zoology, Arora et al. 2023; BASED studies
the trade-off between state size and recall). The lab trains one small model of each kind here.

`mqar_batch` makes the data; `recall_model` builds a small `Transformer` of either mixer;
`train_recall` trains one (plain Adam, written out); `recall_accuracy` scores it per N.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .config import ModelConfig
from .linear_attention import state_bytes
from .model import Transformer

N_KEYS = 64          # key ids 1..64; value ids 65..128; 0 is unused
VOCAB = 2 * N_KEYS + 1


def mqar_batch(batch: int, n_pairs: int, gen: torch.Generator):
    """(ids [B, 4N - 1], targets [B, 4N - 1] with -100 where nothing is asked).

    Every sequence draws N distinct keys and N values (repeats allowed), lists the pairs, then
    the keys again in a random order each followed by its value; the loss and the accuracy count
    only the value after each queried key."""
    if not 1 <= n_pairs <= N_KEYS:
        raise ValueError(f"n_pairs must be in 1..{N_KEYS}, got {n_pairs}")
    keys = torch.rand(batch, N_KEYS, generator=gen).argsort(-1)[:, :n_pairs] + 1
    values = torch.randint(N_KEYS + 1, VOCAB, (batch, n_pairs), generator=gen)
    order = torch.rand(batch, n_pairs, generator=gen).argsort(-1)
    q_keys, q_values = keys.gather(1, order), values.gather(1, order)
    pairs = torch.stack([keys, values], -1).flatten(1)
    queries = torch.stack([q_keys, q_values], -1).flatten(1)
    seq = torch.cat([pairs, queries], 1)                              # [B, 4N]
    ids, nxt = seq[:, :-1], seq[:, 1:]
    targets = torch.full_like(nxt, -100)
    answer = torch.arange(2 * n_pairs, 4 * n_pairs - 1, 2)           # a query key's position
    targets[:, answer] = nxt[:, answer]
    return ids, targets


class ShiftEmbedding(torch.nn.Embedding):
    """Token embedding plus a second embedding of the previous token: a width-2 short convolution
    (H3's shift SSM, the short convolutions of Mamba and BASED). It hands each value the key
    before it, so one mixing layer can match query keys to stored pairs."""

    def __init__(self, vocab: int, dim: int):
        super().__init__(vocab, dim)
        self.previous = torch.nn.Embedding(vocab, dim)
        torch.nn.init.normal_(self.weight, std=0.02)
        torch.nn.init.normal_(self.previous.weight, std=0.02)

    def forward(self, ids):
        prev = F.pad(self.previous(ids[:, :-1]), (0, 0, 1, 0))
        return super().forward(ids) + prev


def recall_model(mixer: str, dim: int = 64, n_layers: int = 2, n_heads: int = 1,
                 seed: int = 0) -> Transformer:
    """A small model for MQAR: every layer `mixer` ("attention" or "linear"). Linear layers get
    decay 1 (plain linear attention: nothing fades, the state only fills up)."""
    if mixer not in ("attention", "linear"):
        raise ValueError(f"mixer must be 'attention' or 'linear', got {mixer!r}")
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=VOCAB, dim=dim, n_layers=n_layers, n_heads=n_heads,
                      hidden_dim=2 * dim, max_seq_len=4 * N_KEYS, mixers=(mixer,) * n_layers)
    model = Transformer(cfg)
    model.embed_tokens = ShiftEmbedding(VOCAB, dim)
    model.lm_head.weight = model.embed_tokens.weight
    for layer in model.layers:
        if mixer == "linear":
            layer.self_attn.decay.fill_(1.0)
    return model


def state_numbers(model) -> int:
    """Numbers the model carries per sequence at the first query: linear layers' S and z; an
    attention layer's keys and values grow with the sequence, so this counts linear models only."""
    c = model.config
    if c.attention_layers:
        raise ValueError("an attention layer's state grows with the sequence (its KV cache)")
    return c.n_layers * state_bytes(c.n_heads, c.head_dim, bytes_per_value=1)


def train_recall(model, steps: int = 400, n_pairs=(2, 4, 8, 16, 32), batch: int = 32,
                 lr: float = 1e-2, seed: int = 0, progress=None) -> list[float]:
    """Adam on mixed-N MQAR batches (one N per step, cycling); returns the loss per step. The
    defaults are lab 09's (its notebook, its benchmark and its slide train with them)."""
    gen = torch.Generator().manual_seed(seed)
    params = [p for p in model.parameters() if p.requires_grad]
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    b1, b2, eps = 0.9, 0.99, 1e-8
    losses = []
    model.train()
    it = range(steps) if progress is None else progress(range(steps))
    for step in it:
        ids, targets = mqar_batch(batch, n_pairs[step % len(n_pairs)], gen)
        loss = F.cross_entropy(model(ids).flatten(0, 1), targets.flatten(), ignore_index=-100)
        for p in params:
            p.grad = None
        loss.backward()
        rate = lr * min(1.0, (step + 1) / 50) * 0.5 * (1 + math.cos(math.pi * step / steps))
        with torch.no_grad():
            for p, mi, vi in zip(params, m, v):
                mi.mul_(b1).add_(p.grad, alpha=1 - b1)
                vi.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                mhat = mi / (1 - b1 ** (step + 1))
                vhat = vi / (1 - b2 ** (step + 1))
                p.sub_(rate * mhat / (vhat.sqrt() + eps))
        losses.append(loss.item())
    model.eval()
    return losses


@torch.no_grad()
def recall_accuracy(model, n_pairs: int, n_seqs: int = 256, seed: int = 1) -> float:
    """Share of queried values the model predicts exactly (argmax) on fresh sequences."""
    ids, targets = mqar_batch(n_seqs, n_pairs, torch.Generator().manual_seed(seed))
    pred = model(ids).argmax(-1)
    asked = targets != -100
    return float((pred[asked] == targets[asked]).float().mean())
