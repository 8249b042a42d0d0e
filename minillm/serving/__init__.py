"""Serving many requests at once (labs 06 and 07).

    Request -> Scheduler (waiting / running queues, admission by free KV blocks, preemption by
    recompute) -> BlockManager (block tables, slot mapping, ref counts, prefix hashes,
    copy-on-write) -> ModelRunner (ragged batch flattened for the dense layers, per-sequence
    attention metadata) -> attention backend (torch reference | Triton paged kernel) -> sampler
"""
from .block_manager import Block, BlockManager, block_hash
from .sequence import Sequence, SequenceStatus

__all__ = ["Block", "BlockManager", "block_hash", "Sequence", "SequenceStatus"]
