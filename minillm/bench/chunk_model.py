"""Lab 09's cost model of the chunked form of linear attention on one CPU core, for the chunk-size
design task: the time of `linear_attention.chunked` over T tokens in chunks of C.

A chunk of c tokens pays a fixed cost (the dozen torch operations each chunk launches, whatever
their size), a cost per value of the state it reads and rewrites (B * N * H^2: S moves past the
chunk), its arithmetic at a FLOP rate (linear_attention.flops_per_token's count for a chunk of c:
4 H c + 4 H^2 + 4 H per head and token) and a cost per entry of its c x c score matrix (the mask,
the decay and the row sums: elementwise work that no FLOP count of the matmuls sees):

    chunk_us(c) = per_chunk_us + per_state_value_us * B N H^2
                  + B N c (4 H c + 4 H^2 + 4 H) / flops_per_us + per_score_us * B N c^2

Few chunks pay the C^2 work; many chunks pay the fixed cost again and again. CPU_CORE's constants
were fitted (least squares on relative error) to the sweep in DEV_SWEEP_US, measured on the
development machine with one torch thread (benchmarks/beyond_attention.py --part chunk;
benchmarks/RESULTS.md, "Beyond attention: a hybrid and a diffusion model"): the measured times
are 0.79-1.26x the model's for C <= 256, and up to 1.86x at C = 1,024, where the score matrices
outgrow the caches, which the model knows nothing of (tests/test_lab09_claims.py checks these).
"""
from __future__ import annotations

import torch

from minillm.linear_attention import flops_per_token

# the sweep (benchmarks/beyond_attention.py --part chunk): (B, N, T, H) -> {C: us}, CPU time,
# medians of 3 interleaved rounds, one torch thread
DEV_SWEEP_US = {
    (1, 6, 1024, 64): {1: 110018, 2: 65852, 4: 33873, 8: 19145, 16: 12468, 32: 8355,
                       64: 7614, 128: 8551, 256: 13975, 512: 34891, 1024: 76383},
    (1, 2, 2048, 32): {1: 200748, 2: 105708, 4: 50450, 8: 25070, 16: 13343, 32: 7546,
                       64: 4893, 128: 4336, 256: 6054, 512: 13140, 1024: 41715},
    (4, 8, 1024, 64): {1: 191610, 2: 111450, 4: 61994, 8: 46365, 16: 31256, 32: 28396,
                       64: 30381, 128: 38082, 256: 56953, 512: 140264, 1024: 295184},
    (1, 1, 2048, 16): {1: 185774, 2: 95049, 4: 49030, 8: 23857, 16: 12152, 32: 6610,
                       64: 3957, 128: 2796, 256: 2683, 512: 4205, 1024: 9401},
    (2, 4, 512, 128): {1: 95680, 2: 49718, 4: 29650, 8: 18258, 16: 12665, 32: 10241,
                       64: 9361, 128: 10841, 256: 14283, 512: 21601},
}
CPU_CORE = {"per_chunk_us": 97.3, "per_state_value_us": 0.00079, "flops_per_us": 60000.0,
            "per_score_us": 0.0031}
# not measured: a machine with CPU_CORE's per-chunk costs and 100 times its arithmetic (FLOPs
# and score entries), as an accelerator has: its best chunks are 10 times longer
FAST_ARITHMETIC = {**CPU_CORE, "flops_per_us": 100 * CPU_CORE["flops_per_us"],
                   "per_score_us": CPU_CORE["per_score_us"] / 100}


def _chunk_us(c, batch, n_heads, head_dim, machine):
    """The model's time of one chunk of c tokens (c a number or a float64 tensor)."""
    m, bn, h = machine, batch * n_heads, head_dim
    per_token = flops_per_token(1, h, "chunked", T=1, chunk=1) - 4 * h        # 4 H^2 + 4 H
    return (m["per_chunk_us"] + m["per_state_value_us"] * bn * h * h
            + bn * c * (4 * h * c + per_token) / m["flops_per_us"] + m["per_score_us"] * bn * c * c)


def chunk_time_us(T: int, batch: int, n_heads: int, head_dim: int, chunk: int,
                  machine: dict | None = None) -> float:
    """The model's time (us) of the chunked form over T tokens in chunks of `chunk` (the last one
    shorter when chunk does not divide T; a chunk longer than T is one chunk of T)."""
    machine = CPU_CORE if machine is None else machine
    full, rest = divmod(T, min(int(chunk), T))
    t = full * _chunk_us(min(int(chunk), T), batch, n_heads, head_dim, machine)
    return float(t + (_chunk_us(rest, batch, n_heads, head_dim, machine) if rest else 0.0))


def chunk_times_us(T: int, batch: int, n_heads: int, head_dim: int,
                   machine: dict | None = None) -> torch.Tensor:
    """chunk_time_us for every chunk = 1 .. T at once: a float64 tensor, entry C - 1 for C."""
    machine = CPU_CORE if machine is None else machine
    C = torch.arange(1, T + 1, dtype=torch.float64)
    full, rest = torch.div(T, C, rounding_mode="floor"), T % C
    last = torch.where(rest > 0, _chunk_us(rest, batch, n_heads, head_dim, machine), 0.0)
    return full * _chunk_us(C, batch, n_heads, head_dim, machine) + last


def best_chunk_us(T: int, batch: int, n_heads: int, head_dim: int,
                  machine: dict | None = None) -> float:
    """The model's least time over chunk = 1 .. T."""
    return float(chunk_times_us(T, batch, n_heads, head_dim, machine).min())
