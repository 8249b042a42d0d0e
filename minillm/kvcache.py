"""The KV cache: keep every layer's keys and values so each new token is computed once.

In a causal decoder the key and value of position j depend only on tokens 0..j. Appending a token
never changes them, so the naive loop (lab 00) recomputes the same K/V over and over. With a cache,
generation splits into

    prefill:  run the whole prompt once, store K/V of every prompt position     (compute-bound)
    decode:   run ONE new token per step, append its K/V, attend to everything  (memory-bound)

and T new tokens push O(T) tokens through the model instead of O(T^2).

`KVCache` is *static*: it allocates [B, K, max_len, H] per layer up front, writes new entries in
place and hands attention a view of the filled prefix, so a decode step allocates no cache memory
and never copies old entries (gpt-fast's design). Layers whose attention has a sliding window get
a ring buffer of `window` slots instead: their memory does not grow with the sequence (lab 03).
Layers that borrow another layer's K/V (cross-layer attention) report no spec and get no storage.

Memory per token, the lab 02 formula: sum over layers of K * (H_k + H_v) * bytes -- for plain
multi-head attention 2 * L * K * H * bytes, e.g. Llama-2-13B: 2 * 40 * 40 * 128 * 2 B = 800 KiB.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

EMPTY = 2 ** 62      # position stored in a ring slot that holds nothing yet: masked as "future"


@dataclass(frozen=True)
class KVSpec:
    """What one layer caches per token: `heads` rows of a `k_dim` key and a `v_dim` value.

    window: None for a full (global) layer; w for a sliding-window layer that only ever attends
    to the last w positions, so a ring of w slots is enough.
    (MLA stores its latent as the "key" and its shared RoPE key as the "value": heads=1.)
    """
    heads: int
    k_dim: int
    v_dim: int
    window: int | None = None

    def elems_per_token(self) -> int:
        return self.heads * (self.k_dim + self.v_dim)


def layer_specs(model) -> list[KVSpec | None]:
    """The KVSpec of each layer of `model` (None for a layer that stores nothing)."""
    return [layer.self_attn.kv_spec() for layer in model.layers]


def kv_bytes_per_token(specs, bytes_per_elem: int = 2, seq_len: int | None = None) -> float:
    """Cache bytes per token of context for a list of layer specs.

    Full layers cost spec.elems_per_token() * bytes every token. A sliding layer holds at most
    `window` tokens; with `seq_len` given its cost is amortised over the sequence
    (min(window, seq_len) / seq_len per token); without, it counts as full.
    """
    total = 0.0
    for s in specs:
        if s is None:
            continue
        share = 1.0
        if s.window is not None and seq_len is not None:
            share = min(s.window, seq_len) / seq_len
        total += s.elems_per_token() * bytes_per_elem * share
    return total


class KVCache:
    """A static, preallocated per-layer K/V cache that plugs into `Transformer.forward(cache=)`.

        cache = KVCache.for_model(model, batch_size=1, max_len=256)
        logits = model(prompt_ids, cache=cache)          # prefill: positions 0..P-1
        logits = model(next_ids, cache=cache)            # decode:  position P, then P+1, ...

    The model calls `update(layer, k, v, positions)` in every layer and `advance(positions)` once
    per forward pass; `seq_len` is how many positions the cache holds.
    """

    def __init__(self, specs, batch_size: int, max_len: int, dtype=torch.float32,
                 device="cpu"):
        if batch_size < 1 or max_len < 1:
            raise ValueError(f"need batch_size >= 1 and max_len >= 1, got {batch_size}, "
                             f"{max_len}")
        self.specs = list(specs)
        self.batch_size, self.max_len = int(batch_size), int(max_len)
        self.dtype, self.device = dtype, torch.device(device)
        self.seq_len = 0
        self.k: list[torch.Tensor | None] = []
        self.v: list[torch.Tensor | None] = []
        self.slot_pos: list[torch.Tensor | None] = []     # ring layers: position held by each slot
        for s in self.specs:
            if s is None:
                self.k.append(None), self.v.append(None), self.slot_pos.append(None)
                continue
            ring = s.window is not None and s.window < self.max_len
            slots = s.window if ring else self.max_len
            self.k.append(torch.zeros(batch_size, s.heads, slots, s.k_dim, dtype=dtype,
                                      device=self.device))
            self.v.append(torch.zeros(batch_size, s.heads, slots, s.v_dim, dtype=dtype,
                                      device=self.device))
            self.slot_pos.append(torch.full((slots,), EMPTY, dtype=torch.long,
                                            device=self.device) if ring else None)
        self.positions = torch.arange(self.max_len, device=self.device)
        # a layer with a fixed-size recurrent state (linear attention, lab 09) keeps it here
        self.state: dict[int, tuple] = {}

    @classmethod
    def for_model(cls, model, batch_size: int = 1, max_len: int | None = None, dtype=None,
                  device=None) -> "KVCache":
        """A cache shaped for `model` (default: its full context, its parameters' dtype/device)."""
        p = next(model.parameters())
        max_len = model.config.max_seq_len if max_len is None else max_len
        if max_len > model.config.max_seq_len:
            raise ValueError(f"max_len {max_len} exceeds the model's context of "
                             f"{model.config.max_seq_len} tokens")
        return cls(layer_specs(model), batch_size, max_len, dtype or p.dtype, device or p.device)

    # ---- the protocol the model calls ------------------------------------------------------
    def _start(self, T: int) -> int:
        start = self.seq_len
        if start + T > self.max_len:
            raise ValueError(f"KV cache is full: it holds {start} of {self.max_len} positions "
                             f"and {T} more do not fit; allocate a larger max_len")
        return start

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor):
        """Store k, v [B, heads, T, dim] at the next T positions (`seq_len` onwards; `advance`
        checks that `positions` agree); return every key/value this layer may attend to and
        their positions."""
        if self.k[layer] is None:
            raise ValueError(f"layer {layer} has no KV storage in this cache (it borrows another "
                             f"layer's keys and values)")
        B, _, T, _ = k.shape
        if B != self.batch_size:
            raise ValueError(f"cache was allocated for batch {self.batch_size}, got batch {B}")
        start = self._start(T)
        if self.slot_pos[layer] is None:                     # full layer: write in place
            end = start + T
            self.k[layer][:, :, start:end] = k
            self.v[layer][:, :, start:end] = v
            return self.k[layer][:, :, :end], self.v[layer][:, :, :end], self.positions[:end]
        # sliding-window layer: attend to what the ring holds plus the new block, then keep the
        # newest `window` entries (slot = position % window)
        ks, vs, sp = self.k[layer], self.v[layer], self.slot_pos[layer]
        w = ks.shape[2]
        new_pos = self.positions[start:start + T]
        k_all, v_all = torch.cat([ks, k], dim=2), torch.cat([vs, v], dim=2)
        pos_all = torch.cat([sp, new_pos])
        keep = slice(max(0, T - w), T)
        slots = new_pos[keep] % w
        ks[:, :, slots] = k[:, :, keep]
        vs[:, :, slots] = v[:, :, keep]
        sp[slots] = new_pos[keep]
        return k_all, v_all, pos_all

    def advance(self, positions: torch.Tensor) -> None:
        """Called once per forward pass after every layer has written: the positions are held."""
        T = positions.shape[-1]
        if positions.device.type == "cpu":     # (a GPU check would cost a sync per step)
            first = int(positions.reshape(-1)[0])
            if first != self.seq_len:
                raise ValueError(f"positions start at {first} but the cache holds {self.seq_len}"
                                 f" positions; a KVCache is filled in order (truncate() to roll "
                                 f"back)")
        self.seq_len += T

    # ---- housekeeping ----------------------------------------------------------------------
    def truncate(self, n: int) -> None:
        """Forget every position >= n (e.g. rejected speculative tokens). Full layers only: a
        ring buffer has already overwritten what it would need to roll back."""
        if not 0 <= n <= self.seq_len:
            raise ValueError(f"can only truncate to 0..{self.seq_len}, got {n}")
        if n < self.seq_len and any(sp is not None for sp in self.slot_pos):
            raise ValueError("cannot roll back a cache with sliding-window ring buffers")
        if n < self.seq_len and self.state:
            raise ValueError("cannot roll back a recurrent state: it has already folded in the "
                             "positions to forget")
        self.seq_len = n

    def reset(self) -> None:
        self.seq_len = 0
        self.state.clear()
        for sp in self.slot_pos:
            if sp is not None:
                sp.fill_(EMPTY)

    @property
    def nbytes(self) -> int:
        """Bytes allocated for keys and values plus any recurrent state (what the cache holds)."""
        kv = sum(t.numel() * t.element_size() for t in self.k + self.v if t is not None)
        return kv + sum(t.numel() * t.element_size() for st in self.state.values() for t in st)

    def bytes_per_token(self) -> float:
        """Bytes per position per sequence of the full (non-ring) layers."""
        return kv_bytes_per_token([s for s, sp in zip(self.specs, self.slot_pos)
                                   if s is not None and sp is None],
                                  torch.tensor([], dtype=self.dtype).element_size())

    def __repr__(self) -> str:
        return (f"KVCache(batch={self.batch_size}, max_len={self.max_len}, "
                f"seq_len={self.seq_len}, {self.nbytes / 2**20:.2f} MiB)")
