"""`minillm generate --tp W`: every rank runs the same generation loop on its shard.

The all-reduces leave every rank with the same hidden state, the LM head is whole on every
rank, and the sampler is seeded the same, so every rank picks the same token at every step
without being told (SPMD: single program, multiple data); rank 0 reports it."""
from __future__ import annotations

import time

import torch.distributed as dist

from ..sampling import SamplingParams
from .launch import DEFAULT_TIMEOUT_S, run_ranks


def generate_rank(rank: int, world: int, model_name: str, prompt: list[int],
                  params: SamplingParams) -> tuple[list[int], float] | None:
    """One rank's part of `generate_tp` (also what each torchrun process runs): rank 0 returns
    (the new tokens, the seconds the generation took once every rank was ready)."""
    import minillm

    from ..generate import generate_naive
    from .shard import shard
    model = shard(minillm.load(model_name), rank, world)
    dist.barrier()                     # time the generation, not the ranks' start
    t0 = time.perf_counter()
    new = generate_naive(model, prompt, params)[0]
    return (new, time.perf_counter() - t0) if rank == 0 else None


def generate_tp(model_name: str, prompt: list[int], params: SamplingParams, world: int, *,
                threads: int = 1, timeout_s: float = DEFAULT_TIMEOUT_S
                ) -> tuple[list[int], float]:
    """The new tokens of `prompt`, from `model_name` split over `world` spawned ranks, and the
    seconds the generation took (without starting the ranks)."""
    import minillm

    from ..model import require_softmax_decoder
    from ..weights import read_config
    from .shard import shard_plan
    config = read_config(minillm.resolve(model_name))[0]     # refuse now, not in every rank
    require_softmax_decoder(config, "tensor parallelism")
    shard_plan(config, world, 0)
    return run_ranks(generate_rank, world, model_name, list(prompt), params, threads=threads,
                     timeout_s=timeout_s)[0]
