"""Where the programs of a Triton launch work: two tracer kernels, for the pictures of lab 04's
Triton primer and of its slides (slides/figures/lab04_quantization.py).

    owner = program_map(n=100, block=32)        # int32 [n]: the program that stored element i
    prog, step = tile_walk(N=40, K=96, block_n=16, block_k=32)
                                                # int32 [N, K] each: which program loads W[n, k],
                                                # and at which step of its loop over K

They launch the way the primer's kernels do (a 1-D grid of cdiv(n, BLOCK) programs; a grid over
blocks of output rows, each looping over K in tiles), store instead of compute, and mask exactly
as those kernels must: what they leave at -1 nobody touched.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .interpret import INTERPRET
from .intmath import cdiv

__all__ = ["program_map", "tile_walk", "kernel_tiles", "tokens_per_split", "paged_tile_walk"]


@triton.jit
def _program_map_kernel(owner_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    tl.store(owner_ptr + offs, tl.zeros((BLOCK,), dtype=tl.int32) + pid, mask=offs < n)


@triton.jit
def _tile_walk_kernel(prog_ptr, step_ptr, N, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        mask = (rows < N)[:, None] & (ks < K)[None, :]
        where = rows[:, None] * K + ks[None, :]
        here = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.int32)
        tl.store(prog_ptr + where, here + pid, mask=mask)
        tl.store(step_ptr + where, here + k0 // BLOCK_K, mask=mask)


def _device() -> str:
    return "cpu" if INTERPRET else "cuda"


def program_map(n: int, block: int) -> torch.Tensor:
    """int32 [n]: element i holds the id of the program that stored it (-1 if none did)."""
    if n < 1 or block < 1 or block & (block - 1):
        raise ValueError(f"need n >= 1 and a power-of-two block, got n={n}, block={block}")
    owner = torch.full((n,), -1, dtype=torch.int32, device=_device())
    _program_map_kernel[(cdiv(n, block),)](owner, n, BLOCK=block)
    return owner.cpu()


def tile_walk(N: int, K: int, block_n: int, block_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(program, step), int32 [N, K] each: program pid = n // block_n loads W[n, k] at step
    k // block_k of its loop over K (-1 where nothing was loaded)."""
    for name, v in (("block_n", block_n), ("block_k", block_k)):
        if v < 1 or v & (v - 1):
            raise ValueError(f"{name} must be a power of two, got {v}")
    if N < 1 or K < 1:
        raise ValueError(f"need N, K >= 1, got {N}, {K}")
    prog = torch.full((N, K), -1, dtype=torch.int32, device=_device())
    step = torch.full_like(prog, -1)
    _tile_walk_kernel[(cdiv(N, block_n),)](prog, step, N, K, BLOCK_N=block_n, BLOCK_K=block_k)
    return prog.cpu(), step.cpu()


# --- lab 07's paged decode kernel: its tiles, its splits, one program's walk ---------------------
def _pow2_at_least(n: int, lo: int = 16) -> int:
    p = lo
    while p < n:
        p *= 2
    return p


def kernel_tiles(N: int, K: int, H: int, block_t: int | None = None, *,
                 cuda: bool = False) -> dict:
    """The constexpr tile sizes a launcher passes: BLOCK_T positions per step (a power of two
    >= 16; 16 in the interpreter, 64 on a GPU), BLOCK_G >= G query heads and BLOCK_H >= H head
    dims, powers of two >= 16 (tl.dot needs 16 on a GPU), and num_warps."""
    if block_t is None:
        block_t = 64 if cuda else 16
    if block_t < 16 or block_t & (block_t - 1):
        raise ValueError(f"block_t must be a power of two >= 16, got {block_t}")
    return {"BLOCK_T": block_t, "BLOCK_G": _pow2_at_least(N // K),
            "BLOCK_H": _pow2_at_least(H), "num_warps": 8 if cuda else 4}




def tokens_per_split(max_blocks: int, block_size: int, num_splits: int) -> int:
    """Split s covers positions [s * tps, (s + 1) * tps) of each sequence: tps is a whole
    number of blocks, and the num_splits splits cover the block table's width."""
    if isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 1:
        raise ValueError(f"num_splits must be a positive int, got {num_splits!r}")
    return cdiv(max_blocks, num_splits) * block_size




def paged_tile_walk(block_table, length: int, block_size: int, block_t: int) -> list[dict]:
    """What one program of the decode kernel reads, tile by tile, for a sequence of `length`
    tokens with this block table: for each tile of block_t positions, the positions, their
    block-table column pos // block_size, the block id in that column, the row pos % block_size,
    the slot, and the mask pos < length (masked positions: block id and slot None)."""
    table = [int(x) for x in block_table]
    tiles = []
    for t0 in range(0, length, block_t):
        pos = list(range(t0, t0 + block_t))
        ok = [p < length for p in pos]
        col = [p // block_size for p in pos]
        blk = [table[c] if o else None for c, o in zip(col, ok)]
        row = [p % block_size for p in pos]
        slot = [b * block_size + r if b is not None else None for b, r in zip(blk, row)]
        tiles.append({"positions": pos, "column": col, "block": blk, "row": row, "slot": slot,
                      "mask": ok})
    return tiles
