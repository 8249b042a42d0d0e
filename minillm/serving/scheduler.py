"""Iteration-level scheduling (Orca): decide, before EVERY step, who runs.

Static batching fixes a batch, runs it until its longest member is done, and only then looks at
the queue: short requests idle in their slots, new ones wait for the whole batch. Continuous
batching hands control back to the scheduler after every decode step:

    1. every running sequence gets room for its newest token (one KV slot); if the blocks run
       out, the most recently admitted running sequence is *preempted*: its blocks are freed and
       it goes back to the front of the queue, keeping its tokens (it will recompute them);
    2. waiting sequences are admitted first-come first-served while there is a free batch slot
       (max_num_seqs), room in the step's token budget (max_num_batched_tokens) and enough free
       KV blocks for their tokens -- admission by free KV blocks, not by a worst-case reservation.

The step then runs decodes (1 token each) and prefills (whole prompts) together in one ragged
batch (see model_runner.py). Nothing is ever dropped: a request that could never fit is refused
when it is added (engine.py), so a lone sequence always fits and the queue always drains.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from .block_manager import BlockManager
from .sequence import Sequence, SequenceStatus


@dataclass
class ScheduledBatch:
    seqs: list[Sequence] = field(default_factory=list)     # run this step, in this order
    copies: list[tuple[int, int]] = field(default_factory=list)   # copy-on-write block copies
    preempted: list[Sequence] = field(default_factory=list)
    num_prefill_seqs: int = 0

    @property
    def num_tokens(self) -> int:
        return sum(s.num_uncached_tokens for s in self.seqs)


class Scheduler:
    """Owns the waiting queue, the running batch and the KV block manager: every allocation,
    append, fork and free of KV blocks goes through it (the engine only reads the manager)."""

    def __init__(self, num_blocks: int, block_size: int = 16, max_num_seqs: int = 16,
                 max_num_batched_tokens: int = 2048, enable_prefix_caching: bool = True):
        if max_num_seqs < 1 or max_num_batched_tokens < 1:
            raise ValueError(f"need max_num_seqs >= 1 and max_num_batched_tokens >= 1, got "
                             f"{max_num_seqs}, {max_num_batched_tokens}")
        self.block_manager = BlockManager(num_blocks, block_size, enable_prefix_caching)
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []          # in order of admission (oldest first)
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def _preempt(self, seq: Sequence) -> None:
        self.block_manager.free(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1

    def schedule(self, now: float | None = None) -> ScheduledBatch:
        batch = ScheduledBatch()
        # 1. decodes: room for every running sequence's newest token, preempting the newest
        i = 0
        while i < len(self.running):
            seq = self.running[i]
            while not self.block_manager.can_append(seq):
                victim = self.running.pop()                  # the most recently admitted
                self._preempt(victim)
                batch.preempted.append(victim)
                if victim is seq:
                    break
            else:
                batch.copies += self.block_manager.append_slot(seq)
                batch.seqs.append(seq)
                i += 1
        for seq in batch.preempted:          # back to the front of the queue, oldest first
            self.waiting.appendleft(seq)
        # 2. admissions: FIFO, while a slot, the token budget and the KV blocks allow
        budget = self.max_num_batched_tokens - len(batch.seqs)
        while self.waiting and not batch.preempted and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if seq.num_tokens > budget and batch.seqs:
                break
            if not self.block_manager.can_allocate(seq):
                break
            self.block_manager.allocate(seq)
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            if seq.first_scheduled_time is None:
                seq.first_scheduled_time = now
            self.running.append(seq)
            batch.seqs.append(seq)
            batch.num_prefill_seqs += 1
            budget -= seq.num_uncached_tokens
        return batch

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """Parallel sampling: `child` joins the running batch at once, sharing every KV block of
        `parent` (reference counts + 1; copy-on-write on the first diverging append)."""
        child.token_ids = list(parent.token_ids)
        self.block_manager.fork(parent, child)
        child.status = SequenceStatus.RUNNING
        child.first_scheduled_time = parent.first_scheduled_time
        self.running.append(child)

    def finish(self, seq: Sequence) -> None:
        """A sequence is done: it leaves the batch and its blocks are freed."""
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.FINISHED
