"""Tensor parallelism on torch.distributed: one model split over W processes (gloo on a CPU,
NCCL on GPUs). shard.py splits the weights and places the all-reduces; launch.py starts the
ranks and turns a dead or hung one into a clear error; generate.py and serving.py run
`minillm generate --tp` and `minillm serve --tp` on them."""
from .launch import DEFAULT_TIMEOUT_S, RankFailure, from_torchrun, run_ranks, start_workers
from .shard import (
    ColumnParallelLinear,
    RankShard,
    RowParallelLinear,
    all_reduce_sum,
    shard,
    shard_bytes,
    shard_plan,
)

__all__ = ["DEFAULT_TIMEOUT_S", "RankFailure", "from_torchrun", "run_ranks", "start_workers",
           "ColumnParallelLinear", "RankShard", "RowParallelLinear", "all_reduce_sum", "shard",
           "shard_bytes", "shard_plan"]
