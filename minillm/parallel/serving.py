"""The serving engine over a tensor-parallel model: rank 0 schedules, every rank computes.

Only rank 0 hears requests, so only rank 0 runs the scheduler and the block manager. Each step
it turns the scheduled batch into a `StepPlan` (plain lists: tokens, positions, KV slots, block
tables) and broadcasts it; every rank then runs the same forward pass on its shard -- the
all-reduces inside it line the ranks up -- and writes its own heads' keys and values into its own
paged KV cache, at the same slots. Rank 0 alone samples (the others skip the LM head).

An idle server still speaks every `heartbeat_s` seconds (an empty plan), so a rank that died or
hung is found within the group's timeout even when no request comes, and the workers, waiting
for the next plan, never wait past it.
"""
from __future__ import annotations

import threading
import time
from dataclasses import replace

import torch.distributed as dist

from ..serving.model_runner import ModelRunner, StepPlan
from .launch import DEFAULT_TIMEOUT_S, RankFailure, close_group, explain

_STOP, _IDLE = "stop", "idle"


def _broadcast(message, timeout_s):
    box = [message]
    try:
        dist.broadcast_object_list(box, src=0)
    except RuntimeError as e:
        raise explain(e, timeout_s) from e
    return box[0]


class TPModelRunner(ModelRunner):
    """Rank 0's runner: broadcast each step's plan, then run it like any runner."""

    def __init__(self, model, block_manager, backend="auto", *, workers=None,
                 timeout_s: float = DEFAULT_TIMEOUT_S):
        super().__init__(model, block_manager, backend)
        self.workers, self.timeout_s = workers, timeout_s
        self._lock = threading.Lock()
        self._last = time.monotonic()
        self._closed = threading.Event()
        self.error: BaseException | None = None
        self._beat = threading.Thread(target=self._heartbeat, name="minillm-tp-heartbeat",
                                      daemon=True)
        self._beat.start()

    def execute(self, plan: StepPlan):
        with self._lock:
            if self.error is not None:
                raise RankFailure(str(self.error))
            self._send(replace(plan, rows=[]))
            return super().execute(plan)

    def _send(self, message) -> None:
        try:
            if self.workers is not None:
                self.workers.check()
            _broadcast(message, self.timeout_s)
            self._last = time.monotonic()
        except RankFailure as e:
            self.error = e
            raise

    def _heartbeat(self) -> None:
        period = self.timeout_s / 4
        while not self._closed.wait(period / 2):
            if time.monotonic() - self._last < period:
                continue
            with self._lock:
                if self._closed.is_set() or self.error is not None:
                    return
                try:
                    self._send(_IDLE)
                except RankFailure:
                    return

    def close(self) -> None:
        """Tell the workers to return, then wait for them."""
        self._closed.set()
        with self._lock:
            if self.error is None:
                try:
                    self._send(_STOP)
                except RankFailure:
                    pass
        if self.workers is not None:
            self.workers.close()
        else:                         # torchrun's ranks: leave with them
            close_group(together=True)


def follow(rank: int, world: int, model_name: str, num_blocks: int, block_size: int,
           backend: str, timeout_s: float) -> int:
    """A worker rank of a tensor-parallel server: load and shard the model, then run every plan
    rank 0 broadcasts until it says stop. Returns the number of steps run."""
    import minillm

    from ..serving.block_manager import BlockManager
    from .shard import shard
    model = shard(minillm.load(model_name), rank, world)
    runner = ModelRunner(model, BlockManager(num_blocks, block_size), backend)
    steps = 0
    while True:
        plan = _broadcast(None, timeout_s)
        if plan == _STOP:
            return steps
        if plan != _IDLE:
            runner.execute(plan)
            steps += 1


def start_tp_serving(model_name: str, world: int, *, num_blocks: int, block_size: int,
                     backend: str = "auto", threads: int = 1,
                     timeout_s: float = DEFAULT_TIMEOUT_S, torchrun: bool = False):
    """Rank 0's model and the runner class to give `LLMEngine(runner=...)`. Spawns ranks
    1..world-1 (`follow`), or, with torchrun=True, joins the group torchrun's processes form
    (the other ranks run `follow` themselves: see minillm.cli)."""
    import functools

    import minillm

    from ..model import require_softmax_decoder
    from .launch import init_group, start_workers
    from .shard import shard, shard_plan
    full = minillm.load(model_name)
    require_softmax_decoder(full, "tensor-parallel serving")
    shard_plan(full.config, world, 0)                   # a bad world size: refuse before spawning
    if torchrun:
        init_group(0, world, "env://", timeout_s=timeout_s)
        workers = None
    else:
        workers = start_workers(follow, world, model_name, num_blocks, block_size, backend,
                                timeout_s, threads=threads, timeout_s=timeout_s)
    return shard(full, 0, world), functools.partial(TPModelRunner, workers=workers,
                                                    timeout_s=timeout_s)
