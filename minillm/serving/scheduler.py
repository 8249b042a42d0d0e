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

Chunked prefill (`chunked_prefill=True`). A 500-token prompt admitted whole makes its step as
long as 500 decode steps' worth of work, and every running stream waits for it: one long prompt
stalls every other user's next token. With chunking, the token budget caps each step: decodes
go first (one token each), then prompts take what is left of the budget, a chunk at a time, and
a prompt that does not fit finishes its prefill in later steps while the decodes keep flowing.
A sequence mid-prefill is RUNNING (it holds KV blocks for its whole prompt) but samples nothing
until its last chunk has run. Its full blocks are named for prefix caching only once a step has
been scheduled to write them, so nobody can reuse a block whose keys are not there yet.

Seats. `max_num_seqs` counts sequences, and a request with n parallel samples becomes n of them
once its prompt is prefilled (engine.py forks it): it is admitted only when all n seats are free,
and the seats stay reserved until the fork.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from .block_manager import BlockManager
from .sequence import Sequence, SequenceStatus


@dataclass
class ScheduledBatch:
    seqs: list[Sequence] = field(default_factory=list)     # run this step, in this order
    num_new: list[int] = field(default_factory=list)       # tokens each one runs this step
    copies: list[tuple[int, int]] = field(default_factory=list)   # copy-on-write block copies
    preempted: list[Sequence] = field(default_factory=list)
    num_prefill_seqs: int = 0

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new)

    def add(self, seq: Sequence, n: int) -> None:
        self.seqs.append(seq)
        self.num_new.append(n)


class Scheduler:
    """Owns the waiting queue, the running batch and the KV block manager: every allocation,
    append, fork and free of KV blocks goes through it (the engine only reads the manager)."""

    def __init__(self, num_blocks: int, block_size: int = 16, max_num_seqs: int = 16,
                 max_num_batched_tokens: int = 2048, enable_prefix_caching: bool = True,
                 chunked_prefill: bool = False):
        if max_num_seqs < 1 or max_num_batched_tokens < 1:
            raise ValueError(f"need max_num_seqs >= 1 and max_num_batched_tokens >= 1, got "
                             f"{max_num_seqs}, {max_num_batched_tokens}")
        if chunked_prefill and max_num_batched_tokens < max_num_seqs:
            raise ValueError(f"chunked prefill needs a token budget of at least one token per "
                             f"running sequence: max_num_batched_tokens {max_num_batched_tokens} "
                             f"< max_num_seqs {max_num_seqs}")
        self.block_manager = BlockManager(num_blocks, block_size, enable_prefix_caching)
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self.chunked_prefill = chunked_prefill
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []          # in order of admission (oldest first)
        self.num_preemptions = 0
        self._extra_seats: dict[int, int] = {}     # seq id -> seats reserved for its forks

    def add(self, seq: Sequence, seats: int = 1) -> None:
        """Queue `seq`; `seats` > 1 reserves batch slots for its parallel samples."""
        if not 1 <= seats <= self.max_num_seqs:
            raise ValueError(f"a request needs 1..max_num_seqs ({self.max_num_seqs}) seats, "
                             f"got {seats}")
        seq.status = SequenceStatus.WAITING
        if seats > 1:
            self._extra_seats[seq.seq_id] = seats - 1
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def seats_taken(self) -> int:
        return len(self.running) + sum(self._extra_seats.get(s.seq_id, 0) for s in self.running)

    def _preempt(self, seq: Sequence) -> None:
        self.block_manager.free(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1

    def schedule(self, now: float | None = None) -> ScheduledBatch:
        batch = ScheduledBatch()
        bm = self.block_manager
        # 1. running sequences: room for each decode's newest token, preempting the newest;
        #    a sequence still mid-prefill (chunked) holds blocks for its whole prompt already
        i = 0
        while i < len(self.running):
            seq = self.running[i]
            if seq.num_uncached_tokens > 1:
                i += 1
                continue
            while not bm.can_append(seq):
                victim = self.running.pop()                  # the most recently admitted
                self._preempt(victim)
                batch.preempted.append(victim)
                if victim is seq:
                    break
            else:
                batch.copies += bm.append_slot(seq)
                batch.add(seq, 1)
                i += 1
        for seq in batch.preempted:          # back to the front of the queue, oldest first
            self.waiting.appendleft(seq)
        budget = self.max_num_batched_tokens - len(batch.seqs)
        # 2. (chunked) prompts already admitted go on where their last chunk stopped
        for seq in self.running:
            if seq.num_uncached_tokens > 1 and budget > 0:
                n = min(seq.num_uncached_tokens, budget)
                bm.register_blocks(seq, seq.num_cached_tokens + n)
                batch.add(seq, n)
                budget -= n
        # 3. admissions: FIFO, while seats, the token budget and the KV blocks allow
        while self.waiting and not batch.preempted:
            seq = self.waiting[0]
            if self.seats_taken() + 1 + self._extra_seats.get(seq.seq_id, 0) > self.max_num_seqs:
                break
            if self.chunked_prefill:
                if budget < 1:
                    break
            elif seq.num_tokens > budget and batch.seqs:
                break
            if not bm.can_allocate(seq):
                break
            bm.allocate(seq, register=False)
            n = seq.num_uncached_tokens if not self.chunked_prefill \
                else min(seq.num_uncached_tokens, budget)
            bm.register_blocks(seq, seq.num_cached_tokens + n)
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            if seq.first_scheduled_time is None:
                seq.first_scheduled_time = now
            self.running.append(seq)
            batch.add(seq, n)
            batch.num_prefill_seqs += 1
            budget -= n
        return batch

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """Parallel sampling: `child` joins the running batch at once, sharing every KV block of
        `parent` (reference counts + 1; copy-on-write on the first diverging append). It takes
        one of the seats reserved for the parent's samples."""
        child.token_ids = list(parent.token_ids)
        self.block_manager.fork(parent, child)
        child.status = SequenceStatus.RUNNING
        child.first_scheduled_time = parent.first_scheduled_time
        left = self._extra_seats.pop(parent.seq_id, 0) - 1
        if left > 0:
            self._extra_seats[parent.seq_id] = left
        self.running.append(child)

    def finish(self, seq: Sequence) -> None:
        """A sequence is done: it leaves the batch and its blocks are freed."""
        self.running.remove(seq)
        self.block_manager.free(seq)
        self._extra_seats.pop(seq.seq_id, None)
        seq.status = SequenceStatus.FINISHED

    def abort(self, seq: Sequence) -> None:
        """Drop `seq` wherever it is (a client went away): its blocks are free at once."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
            self.block_manager.free(seq)
        elif seq.status is SequenceStatus.WAITING and seq in self.waiting:
            self.waiting.remove(seq)
        self._extra_seats.pop(seq.seq_id, None)
        seq.status = SequenceStatus.FINISHED
