"""`minillm generate --tp W`: every rank runs the same generation loop on its shard.

The all-reduces leave every rank with the same hidden state, the LM head is whole on every
rank, and the sampler is seeded the same, so every rank picks the same token at every step
without being told (SPMD: single program, multiple data); rank 0 reports it."""
from __future__ import annotations

from ..sampling import SamplingParams
from .launch import DEFAULT_TIMEOUT_S, run_ranks


def generate_rank(rank: int, world: int, model_name: str, prompt: list[int],
                  params: SamplingParams) -> list[int] | None:
    """One rank's part of `generate_tp` (also what each torchrun process runs)."""
    import minillm

    from ..generate import generate_naive
    from .shard import shard
    model = shard(minillm.load(model_name), rank, world)
    new = generate_naive(model, prompt, params)[0]
    return new if rank == 0 else None


def generate_tp(model_name: str, prompt: list[int], params: SamplingParams, world: int, *,
                threads: int = 1, timeout_s: float = DEFAULT_TIMEOUT_S) -> list[int]:
    """The new tokens of `prompt`, from `model_name` split over `world` spawned ranks."""
    import minillm

    from .shard import shard_plan
    shard_plan(minillm.load(model_name).config, world, 0)     # a bad world size: refuse now
    return run_ranks(generate_rank, world, model_name, list(prompt), params, threads=threads,
                     timeout_s=timeout_s)[0]
