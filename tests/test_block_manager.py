"""The paged-KV block manager: slot formula, prefix sharing, copy-on-write, and property tests.

The property tests drive a BlockManager with random allocate / append / fork / free / preempt /
re-admit sequences against a simulated KV store in which slot s holds the *whole prefix* whose
key/value would be stored there (K/V at position p depend on tokens 0..p). After every operation:
ref counts equal the number of tables holding each block, free blocks are exactly those with
count 0 (no leak), and every live sequence reads exactly its own history through its block table
-- so a forked sequence sees what an independent sequence with the same tokens would see.
"""
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from minillm.sampling import SamplingParams
from minillm.serving import BlockManager, Sequence


def seq(i, tokens):
    return Sequence(i, list(tokens), prompt_len=len(tokens), params=SamplingParams())


def test_slot_formula_and_tables():
    bm = BlockManager(num_blocks=8, block_size=4)
    a = seq(0, range(10))                      # 10 tokens -> 3 blocks
    table = bm.allocate(a)
    assert len(table) == 3 and bm.num_free_blocks == 5
    for pos in range(10):
        assert bm.slot(a, pos) == table[pos // 4] * 4 + pos % 4
    assert bm.slot_mapping(a, [0, 5, 9]) == [table[0] * 4, table[1] * 4 + 1, table[2] * 4 + 1]
    with pytest.raises(IndexError):
        bm.slot(a, 12)
    bm.free(a)
    assert bm.num_free_blocks == 8
    bm.check_invariants()


def test_prefix_sharing_of_a_system_prompt():
    bm = BlockManager(num_blocks=16, block_size=4)
    system = list(range(100, 108))             # two full blocks
    a, b = seq(0, system + [1, 2, 3]), seq(1, system + [7])
    ta, tb = bm.allocate(a), bm.allocate(b)
    assert ta[:2] == tb[:2] and ta[2] != tb[2]
    assert [bm.blocks[i].ref_count for i in ta[:2]] == [2, 2]
    assert a.num_cached_tokens == 0 and b.num_cached_tokens == 8     # b recomputes only [7]
    assert bm.num_free_blocks == 16 - 4
    bm.free(a), bm.free(b)
    assert bm.num_free_blocks == 16
    c = seq(2, system + [5, 5])                # freed blocks stay findable by hash
    assert bm.allocate(c)[:2] == ta[:2] and c.num_cached_tokens == 8
    bm.check_invariants()


def test_block_holding_the_last_token_is_never_reused():
    """Its logits must be computed, so it has to be written, so it cannot be shared."""
    bm = BlockManager(num_blocks=8, block_size=4)
    a = seq(0, range(8))
    bm.allocate(a)
    b = seq(1, range(8))
    tb = bm.allocate(b)
    assert b.num_cached_tokens == 4 and tb[0] == bm.block_table(a)[0] and tb[1] != bm.block_table(a)[1]


def test_no_sharing_without_prefix_caching():
    bm = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=False)
    a, b = seq(0, range(9)), seq(1, range(9))
    assert not set(bm.allocate(a)) & set(bm.allocate(b))
    assert b.num_cached_tokens == 0 and not bm.hash_to_block


def test_fork_then_copy_on_write():
    bm = BlockManager(num_blocks=8, block_size=4)
    parent = seq(0, range(6))                  # blocks: [0..3] full, [4, 5] partial
    pt = list(bm.allocate(parent))
    parent.num_cached_tokens = 6
    child = seq(1, range(6))
    assert bm.fork(parent, child) == pt
    assert [bm.blocks[i].ref_count for i in pt] == [2, 2]
    parent.token_ids.append(50)
    assert bm.append_slot(parent) == [(pt[1], bm.block_table(parent)[1])]    # copy, then write
    assert bm.block_table(parent)[0] == pt[0] and bm.block_table(parent)[1] != pt[1]
    child.token_ids.append(60)
    assert bm.append_slot(child) == []         # the original is the child's alone now
    assert bm.block_table(child) == pt
    bm.check_invariants()
    bm.free(parent), bm.free(child)
    assert bm.num_free_blocks == 8


def test_append_grows_by_one_block_at_a_time():
    bm = BlockManager(num_blocks=3, block_size=2)
    a = seq(0, [1, 2])
    bm.allocate(a)
    a.token_ids.append(3)
    assert bm.can_append(a) and bm.append_slot(a) == [] and len(bm.block_table(a)) == 2
    a.token_ids.append(4)
    assert bm.append_slot(a) == [] and len(bm.block_table(a)) == 2
    b = seq(1, [9])
    bm.allocate(b)
    a.token_ids.append(5)
    assert not bm.can_append(a)
    with pytest.raises(RuntimeError, match="out of KV blocks"):
        bm.append_slot(a)


def test_bad_use_gives_clear_errors():
    with pytest.raises(ValueError, match="num_blocks"):
        BlockManager(0, 4)
    bm = BlockManager(num_blocks=2, block_size=4)
    a = seq(0, range(5))
    bm.allocate(a)
    with pytest.raises(ValueError, match="already holds"):
        bm.allocate(a)
    with pytest.raises(RuntimeError, match="not enough free KV blocks"):
        bm.allocate(seq(1, range(20, 25)))
    bm.free(a)
    with pytest.raises(KeyError, match="double free"):
        bm.free(a)
    with pytest.raises(ValueError, match="prompt is empty"):
        seq(3, [])


# ---- property tests ---------------------------------------------------------------------------
PREFIXES = [(), (1, 2, 3, 4, 5, 6), (1, 2, 3, 4, 9), (7, 7, 7, 7, 7, 7, 7, 7, 7)]


class BlockManagerMachine(RuleBasedStateMachine):
    @initialize(num_blocks=st.integers(1, 14), block_size=st.integers(1, 5),
                caching=st.booleans())
    def setup(self, num_blocks, block_size, caching):
        self.bm = BlockManager(num_blocks, block_size, enable_prefix_caching=caching)
        self.store = [None] * (num_blocks * block_size)    # slot -> prefix stored there
        self.live, self.waiting, self.next_id = {}, [], 0

    # simulated model step: write the K/V (here: the prefix) of every uncached token
    def _compute(self, s):
        for p in range(s.num_cached_tokens, s.num_tokens):
            self.store[self.bm.slot(s, p)] = tuple(s.token_ids[:p + 1])
        s.num_cached_tokens = s.num_tokens

    def _admit(self, s):
        if not self.bm.can_allocate(s):
            return False
        self.bm.allocate(s)
        for p in range(s.num_cached_tokens):             # prefix hits hold the right K/V
            assert self.store[self.bm.slot(s, p)] == tuple(s.token_ids[:p + 1])
        self._compute(s)
        self.live[s.seq_id] = s
        return True

    @rule(prefix=st.sampled_from(PREFIXES), tail=st.lists(st.integers(0, 3), max_size=6))
    def add(self, prefix, tail):
        tokens = list(prefix) + tail or [0]
        s = seq(self.next_id, tokens)
        self.next_id += 1
        if not self._admit(s):
            self.waiting.append(s)

    @precondition(lambda self: self.live)
    @rule(data=st.data(), token=st.integers(0, 3))
    def append(self, data, token):
        s = self.live[data.draw(st.sampled_from(sorted(self.live)))]
        s.token_ids.append(token)
        if not self.bm.can_append(s):                      # the scheduler would preempt
            self._preempt(s)
            return
        for src, dst in self.bm.append_slot(s):            # copy-on-write
            B = self.bm.block_size
            self.store[dst * B:(dst + 1) * B] = self.store[src * B:(src + 1) * B]
        self._compute(s)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def fork(self, data):
        parent = self.live[data.draw(st.sampled_from(sorted(self.live)))]
        child = seq(self.next_id, parent.token_ids)
        self.next_id += 1
        self.bm.fork(parent, child)
        assert child.num_cached_tokens == parent.num_tokens
        self.live[child.seq_id] = child

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def free(self, data):
        s = self.live.pop(data.draw(st.sampled_from(sorted(self.live))))
        self.bm.free(s)

    def _preempt(self, s):
        self.live.pop(s.seq_id)
        self.bm.free(s)
        assert s.num_cached_tokens == 0 and not self.bm.has_blocks(s)
        self.waiting.append(s)                             # keeps its tokens: recompute later

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def preempt(self, data):
        self._preempt(self.live[data.draw(st.sampled_from(sorted(self.live)))])

    @precondition(lambda self: self.waiting)
    @rule()
    def readmit(self):
        if self._admit(self.waiting[0]):
            self.waiting.pop(0)

    @invariant()
    def books_balance(self):
        if not hasattr(self, "bm"):
            return
        self.bm.check_invariants()
        B = self.bm.block_size
        for s in self.live.values():
            table = self.bm.block_table(s)
            assert len(table) == -(-s.num_tokens // B)
            for p in range(s.num_tokens):                   # reads exactly its own history
                assert self.store[self.bm.slot(s, p)] == tuple(s.token_ids[:p + 1])
        held = {b for s in self.live.values() for b in self.bm.block_table(s)}
        assert self.bm.num_used_blocks == len(held)          # nothing leaked

    def teardown(self):
        if hasattr(self, "bm"):
            for s in list(self.live.values()):
                self.bm.free(s)
            assert self.bm.num_free_blocks == self.bm.num_blocks
            self.bm.check_invariants()


BlockManagerMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
test_block_manager_properties = BlockManagerMachine.TestCase
