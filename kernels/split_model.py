"""Lab 07's cost model of a GPU running the course's split decode (flash-decoding): the time of
one decode of `batch` sequences split `num_splits` ways, for the split-count design task.

An H100 (132 SMs) running the course's split kernel on bf16 K/V, 4 query heads per KV head of
128: n programs in flight stream peak * n / (n + half_programs) bytes/us (memory latency is hidden only
with many loads in flight: Little's law); at most n_sm * per_sm programs run at once (a wave);
every wave pays a program's start, every split launch beyond 1 a merge pass that reads the
partials back. Fitted to the split sweep of benchmarks/RESULTS.md ("Paged attention kernels
(lab 07, NVIDIA H100)"), which the notebook prints beside it.
The sweep quoted (H100_SWEEP_US): B = 1, 8 KV heads, 32 768 tokens, blocks of 16: splits -> us.
"""
from __future__ import annotations

from .intmath import cdiv

MAX_SPLITS = 256
SPLIT_GPU = {"n_sm": 132, "per_sm": 4, "peak_bytes_per_us": 3.35e6, "half_programs": 140,
             "wave_start_us": 0.5, "merge_launch_us": 6.0}
H100_SWEEP_US = {1: 664.9, 4: 257.7, 8: 139.7, 16: 83.9, 24: 68.5, 33: 59.4, 48: 57.6, 64: 57.5,
                 96: 63.7, 128: 60.3, 256: 61.4}


def split_decode_us(batch: int, n_kv_heads: int, context_len: int, num_splits: int,
                    block_size: int = 16, gpu: dict | None = None, head_dim: int = 128,
                    group: int = 4) -> float:
    """The model's time (us) of one split decode of `batch` sequences of `context_len` tokens."""
    gpu = SPLIT_GPU if gpu is None else gpu
    blocks = cdiv(context_len, block_size)
    per_split = cdiv(blocks, max(1, int(num_splits)))          # whole blocks per split
    splits = cdiv(blocks, per_split)                            # the splits that hold a block
    programs = batch * n_kv_heads * splits
    program_bytes = per_split * block_size * 2 * head_dim * 2   # its K and V rows, bf16
    wave, peak = gpu["n_sm"] * gpu["per_sm"], gpu["peak_bytes_per_us"]
    t, left = 0.0, programs
    while left > 0:
        n = min(left, wave)
        t += n * program_bytes * (n + gpu["half_programs"]) / (n * peak) + gpu["wave_start_us"]
        left -= n
    if splits > 1:                          # partials and lse (fp32) written, then read back
        t += batch * n_kv_heads * group * splits * (head_dim + 1) * 4 * 2 / peak \
            + gpu["merge_launch_us"]
    return t


def best_split_us(batch, n_kv_heads, context_len, block_size=16, gpu=None) -> float:
    return min(split_decode_us(batch, n_kv_heads, context_len, s, block_size, gpu)
               for s in range(1, MAX_SPLITS + 1))
