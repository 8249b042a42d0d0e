"""Paged KV memory: fixed-size blocks, block tables, ref counts, prefix sharing, copy-on-write.

A contiguous KV cache reserves `max_len` positions per sequence up front. Most sequences stop
early, so most of that memory is never used (internal fragmentation), and the holes between
reservations cannot host a new request (external fragmentation). PagedAttention (vLLM) borrows
the operating system's answer, virtual memory:

    physical KV memory = num_blocks blocks of block_size (B) token slots each
    block table of a sequence = the list of physical blocks holding its tokens, in order

    token at position pos lives in  slot = table[pos // B] * B + pos % B

A sequence grabs one block at a time, so at most B - 1 slots per sequence are ever wasted.
Blocks need not be adjacent, so any free block serves any sequence.

Sharing. A block is a page that several tables may point to; `ref_count` says how many.
  * Prefix caching: a *full* block's keys/values depend only on the tokens up to its end, so it
    is named by a hash of (hash of the previous block, its own tokens). A new sequence whose
    prompt starts with the same full blocks (a shared system prompt) reuses them instead of
    recomputing. A block whose count drops to 0 goes back to the free list but stays findable by
    its hash until the free list hands it out again for other tokens.
  * Fork (parallel sampling, n > 1 answers to one prompt): the child's table is a copy of the
    parent's and every block's count goes up by one.
  * Copy-on-write: a sequence only ever writes the slot of its newest token, in its last block.
    If that block is shared (count > 1), it first gets a private copy: `append_slot` returns the
    (source, destination) block pairs the caller must copy in the KV storage before writing.

Invariants (tests/test_block_manager.py checks them after random operation sequences):
every block is either on the free list (count 0) or in use (count = number of tables holding
it), never both; the hash index only names blocks that hold the hashed tokens.

The manager only does bookkeeping: KV storage (per layer [num_blocks, B, n_kv_heads, head_dim])
lives with the model runner.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from kernels.intmath import cdiv

from .sequence import Sequence


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    hash: int | None = None                    # set once the block is full (prefix caching)
    token_ids: tuple[int, ...] = field(default=())   # the tokens of a hashed block


def block_hash(token_ids, prev_hash: int | None) -> int:
    """Name of a full block: depends on its tokens AND everything before it (chained)."""
    return hash((prev_hash, tuple(token_ids)))


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if int(num_blocks) < 1 or int(block_size) < 1:
            raise ValueError(f"need num_blocks >= 1 and block_size >= 1, got {num_blocks}, "
                             f"{block_size}")
        self.num_blocks, self.block_size = int(num_blocks), int(block_size)
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(self.num_blocks)]
        self.free_ids: deque[int] = deque(range(self.num_blocks))   # oldest-freed first
        self.hash_to_block: dict[int, int] = {}
        self.tables: dict[int, list[int]] = {}                      # seq_id -> block ids
        self.num_prefix_hits = 0                                    # blocks reused, ever

    # ---- queries ----------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self.free_ids)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free_ids)

    def blocks_needed(self, num_tokens: int) -> int:
        return cdiv(num_tokens, self.block_size)

    def block_table(self, seq: Sequence) -> list[int]:
        if seq.seq_id not in self.tables:
            raise KeyError(f"sequence {seq.seq_id} holds no blocks (not allocated, or freed)")
        return self.tables[seq.seq_id]

    def has_blocks(self, seq: Sequence) -> bool:
        return seq.seq_id in self.tables

    def slot(self, seq: Sequence, pos: int) -> int:
        """Physical slot of position `pos`: table[pos // B] * B + pos % B."""
        table = self.block_table(seq)
        if not 0 <= pos < len(table) * self.block_size:
            raise IndexError(f"position {pos} is outside the {len(table)} blocks of sequence "
                             f"{seq.seq_id}")
        return table[pos // self.block_size] * self.block_size + pos % self.block_size

    def slot_mapping(self, seq: Sequence, positions) -> list[int]:
        return [self.slot(seq, int(p)) for p in positions]

    # ---- allocation -------------------------------------------------------------------------
    def _full_block_hashes(self, seq: Sequence) -> list[int]:
        """Hashes of the full blocks a prefix-cache hit may replace. The block holding the last
        token never counts: its logits must be computed, so it must be written."""
        B, out, h = self.block_size, [], None
        for i in range((seq.num_tokens - 1) // B):
            h = block_hash(seq.token_ids[i * B:(i + 1) * B], h)
            out.append(h)
        return out

    def _lookup(self, h: int, tokens) -> int | None:
        bid = self.hash_to_block.get(h)
        if bid is None or self.blocks[bid].token_ids != tuple(tokens):
            return None
        return bid

    def _cached_prefix(self, seq: Sequence) -> list[int]:
        """Block ids of the longest run of full prompt blocks already in memory."""
        if not self.enable_prefix_caching:
            return []
        B, hits = self.block_size, []
        for i, h in enumerate(self._full_block_hashes(seq)):
            bid = self._lookup(h, seq.token_ids[i * B:(i + 1) * B])
            if bid is None:
                break
            hits.append(bid)
        return hits

    def can_allocate(self, seq: Sequence) -> bool:
        hits = self._cached_prefix(seq)
        in_use = sum(1 for b in hits if self.blocks[b].ref_count > 0)   # these cost nothing
        return self.blocks_needed(seq.num_tokens) - in_use <= self.num_free_blocks

    def _take_free_block(self) -> int:
        if not self.free_ids:
            raise RuntimeError("out of KV blocks: check can_allocate / can_append first")
        bid = self.free_ids.popleft()
        b = self.blocks[bid]
        if b.hash is not None:                    # its old contents are about to be overwritten
            if self.hash_to_block.get(b.hash) == bid:
                del self.hash_to_block[b.hash]
            b.hash, b.token_ids = None, ()
        b.ref_count = 1
        return bid

    def _register(self, bid: int, h: int, tokens) -> None:
        if self.enable_prefix_caching:
            b = self.blocks[bid]
            b.hash, b.token_ids = h, tuple(tokens)
            self.hash_to_block[h] = bid

    def allocate(self, seq: Sequence, register: bool = True) -> list[int]:
        """Give `seq` a block table for all of seq.token_ids. Full blocks found by hash are
        shared; seq.num_cached_tokens is set to the tokens they hold (no need to recompute).

        Its new full blocks are named (made findable by hash) at once, or, with register=False,
        only when `register_blocks` says a step writes them (chunked prefill)."""
        if seq.seq_id in self.tables:
            raise ValueError(f"sequence {seq.seq_id} already holds blocks")
        if not self.can_allocate(seq):
            raise RuntimeError(f"not enough free KV blocks for sequence {seq.seq_id} "
                               f"({seq.num_tokens} tokens, {self.num_free_blocks} free blocks)")
        hits = self._cached_prefix(seq)
        table: list[int] = []
        for bid in hits:
            b = self.blocks[bid]
            if b.ref_count == 0:
                self.free_ids.remove(bid)      # revive a freed block that still holds the tokens
            b.ref_count += 1
            table.append(bid)
        self.num_prefix_hits += len(hits)
        for _ in range(len(hits), self.blocks_needed(seq.num_tokens)):
            table.append(self._take_free_block())
        self.tables[seq.seq_id] = table
        seq.num_cached_tokens = len(hits) * self.block_size
        if register:
            self.register_blocks(seq, seq.num_tokens)
        return table

    def register_blocks(self, seq: Sequence, upto: int) -> None:
        """Name every full block of `seq` that lies within its first `upto` tokens (call it when
        the step that writes them is scheduled: the step writes before anyone reads)."""
        B, h = self.block_size, None
        table = self.block_table(seq)
        for i in range(min(upto, seq.num_tokens) // B):
            b = self.blocks[table[i]]
            tokens = seq.token_ids[i * B:(i + 1) * B]
            h = block_hash(tokens, h)
            if b.hash is None:
                self._register(table[i], h, tokens)
            elif b.hash != h:
                raise RuntimeError(f"block {table[i]} of sequence {seq.seq_id} is named for "
                                   f"other tokens")

    # ---- growing one token at a time --------------------------------------------------------
    def _append_cost(self, seq: Sequence) -> int:
        table = self.block_table(seq)
        pos = seq.num_tokens - 1                        # the newest token's position
        if pos // self.block_size >= len(table):
            return 1                                    # it starts a new block
        return 1 if self.blocks[table[pos // self.block_size]].ref_count > 1 else 0   # CoW

    def can_append(self, seq: Sequence) -> bool:
        return self._append_cost(seq) <= self.num_free_blocks

    def append_slot(self, seq: Sequence) -> list[tuple[int, int]]:
        """Make room for the newest token (position num_tokens - 1) in a block `seq` owns alone.

        Returns the copies [(src_block, dst_block)] the KV storage must make first: non-empty
        when the block was shared (copy-on-write). Call once per step, after appending the token.
        """
        table, B = self.block_table(seq), self.block_size
        pos = seq.num_tokens - 1
        idx = pos // B
        if idx > len(table):
            raise ValueError(f"sequence {seq.seq_id} grew by more than one token since its last "
                             f"append_slot ({seq.num_tokens} tokens, {len(table)} blocks)")
        if self._append_cost(seq) > self.num_free_blocks:
            raise RuntimeError(f"out of KV blocks for sequence {seq.seq_id}: check can_append")
        copies = []
        if idx == len(table):
            table.append(self._take_free_block())
        elif self.blocks[table[idx]].ref_count > 1:     # shared: copy before writing
            old = table[idx]
            self.blocks[old].ref_count -= 1
            table[idx] = self._take_free_block()
            copies.append((old, table[idx]))
        if (pos + 1) % B == 0:                          # this token fills the block: name it
            prev = self.blocks[table[idx - 1]].hash if idx > 0 else None
            if idx == 0 or prev is not None:
                tokens = seq.token_ids[idx * B:(idx + 1) * B]
                self._register(table[idx], block_hash(tokens, prev), tokens)
        return copies

    # ---- sharing and releasing --------------------------------------------------------------
    def fork(self, parent: Sequence, child: Sequence) -> list[int]:
        """`child` shares every block of `parent` (ref counts + 1). The child must start with the
        parent's cached tokens; the first write into a shared block copies it (append_slot)."""
        if child.seq_id in self.tables:
            raise ValueError(f"sequence {child.seq_id} already holds blocks")
        n = parent.num_cached_tokens
        if child.num_tokens < n or child.token_ids[:n] != parent.token_ids[:n]:
            raise ValueError(f"fork: child {child.seq_id} does not start with the {n} cached "
                             f"tokens of parent {parent.seq_id}")
        table = list(self.block_table(parent))
        for bid in table:
            self.blocks[bid].ref_count += 1
        self.tables[child.seq_id] = table
        child.num_cached_tokens = parent.num_cached_tokens
        return table

    def free(self, seq: Sequence) -> None:
        """Drop `seq`'s table; blocks no table holds return to the free list (last block first,
        so a shared prefix is the last to be handed out again)."""
        table = self.tables.pop(seq.seq_id, None)
        if table is None:
            raise KeyError(f"sequence {seq.seq_id} holds no blocks (double free?)")
        for bid in reversed(table):
            b = self.blocks[bid]
            b.ref_count -= 1
            if b.ref_count == 0:
                self.free_ids.append(bid)
        seq.num_cached_tokens = 0

    # ---- self-check -------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """AssertionError naming the first broken invariant (used by the tests)."""
        holders = [0] * self.num_blocks
        for table in self.tables.values():
            for bid in table:
                holders[bid] += 1
        free = set(self.free_ids)
        assert len(free) == len(self.free_ids), "a block is on the free list twice"
        for b in self.blocks:
            assert b.ref_count == holders[b.block_id], \
                f"block {b.block_id}: ref_count {b.ref_count} but {holders[b.block_id]} tables"
            assert (b.ref_count == 0) == (b.block_id in free), \
                f"block {b.block_id}: ref_count {b.ref_count} but on free list: {b.block_id in free}"
        for h, bid in self.hash_to_block.items():
            assert self.blocks[bid].hash == h, f"hash index names block {bid} with another hash"
