"""minillm.serving.fragmentation: the waste split, first fit, and the replay of lab 07 and its
slides, on cases small enough to follow by hand, against a slot-by-slot oracle, and against
what the two copies it replaced (lab 07's `simulate` cell, the slides' `_frag_history`)
computed on the lab's trace."""
from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minillm.serving import fragmentation as fr
from minillm.serving.trace import make_trace


# ---- first_fit, contiguous_waste, paged_waste --------------------------------------------------
def test_first_fit_takes_the_first_hole_that_is_big_enough():
    res = [(6, 2), (0, 4)]                          # holes [4, 6) and [8, 10), order ignored
    assert fr.first_fit(res, 1, 10) == 4
    assert fr.first_fit(res, 2, 10) == 4
    assert fr.first_fit(res, 3, 10) is None
    assert fr.first_fit([], 10, 10) == 0
    assert fr.first_fit([], 11, 10) is None
    assert fr.first_fit([(0, 3)], 7, 10) == 3       # the hole after the last reservation


def test_contiguous_waste_by_hand():
    # 20 slots: [0, 6) holds 2 tokens, hole [6, 9), [9, 16) holds 7 tokens, hole [16, 20)
    res = [(9, 7, 7), (0, 6, 2)]
    assert fr.contiguous_waste(res, 20, 4) == {"used": 9, "internal": 4, "external": 3, "free": 4}
    assert fr.contiguous_waste(res, 20, 5) == {"used": 9, "internal": 4, "external": 7, "free": 0}
    assert fr.contiguous_waste(res, 20) == {"used": 9, "internal": 4, "external": 0, "free": 7}
    assert fr.contiguous_waste([], 10, 11) == {"used": 0, "internal": 0, "external": 10, "free": 0}
    assert fr.contiguous_waste([(0, 10, 3)], 10, 1) == {"used": 3, "internal": 7, "external": 0,
                                                        "free": 0}


@pytest.mark.parametrize("bad", [[(0, 5, 1), (4, 2, 0)],      # overlap
                                 [(8, 4, 0)],                 # past the end
                                 [(-1, 2, 0)],                # before the start
                                 [(0, 2, 3)]])                # more tokens than slots
def test_contiguous_waste_refuses_impossible_memories(bad):
    with pytest.raises(ValueError):
        fr.contiguous_waste(bad, 10, 1)


def test_paged_waste_by_hand():
    # blocks of 4: 5 tokens -> 2 blocks (3 empty), 16 -> 4 (0), 1 -> 1 (3); 7 of 10 blocks held
    assert fr.paged_waste([5, 16, 1], 4, 10) == {"used": 22, "internal": 6, "external": 0,
                                                 "free": 12}
    assert fr.paged_waste([], 16, 3) == {"used": 0, "internal": 0, "external": 0, "free": 48}
    with pytest.raises(ValueError):
        fr.paged_waste([9], 4, 2)                   # 3 blocks needed, 2 exist


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_contiguous_waste_matches_a_slot_by_slot_oracle(data):
    cap = data.draw(st.integers(1, 40))
    owner, res, s = [None] * cap, [], 0
    while s < cap:
        if data.draw(st.booleans()):
            s += data.draw(st.integers(1, 4))
            continue
        r = data.draw(st.integers(1, min(6, cap - s)))
        u = data.draw(st.integers(0, r))
        res.append((s, r, u))
        owner[s:s + r] = ["used"] * u + ["internal"] * (r - u)
        s += r
    need = data.draw(st.one_of(st.none(), st.integers(1, 12)))
    want = {"used": owner.count("used"), "internal": owner.count("internal"), "external": 0,
            "free": 0}
    j = 0
    while j < cap:                                  # walk the holes one slot at a time
        if owner[j] is not None:
            j += 1
            continue
        k = j
        while k < cap and owner[k] is None:
            k += 1
        want["external" if need is not None and k - j < need else "free"] += k - j
        j = k
    assert fr.contiguous_waste(data.draw(st.permutations(res)), cap, need) == want


# ---- replay ------------------------------------------------------------------------------------
def rows(history, keys=("used", "internal", "external", "free", "running", "waiting")):
    return [tuple(r[k] for k in keys) for r in history]


def test_contiguous_replay_by_hand():
    # 10 slots, reservations of prompt + 4. Step 0: request 0 takes [0, 6); request 1 (7 slots)
    # does not fit the hole [6, 10) and waits. Request 0 finishes after step 0, request 1 takes
    # [0, 7) at step 1 and runs 3 steps while request 2 (5 slots) waits on the hole [7, 10);
    # request 2 runs steps 4-5 with nobody waiting (the hole after it is free, not external).
    h = fr.replay([(0, 2, 1), (0, 3, 3), (0, 1, 2)], paged=False, capacity=10, max_new=4)
    assert rows(h) == [(3, 3, 4, 0, 1, 2),
                       (4, 3, 3, 0, 1, 1),
                       (5, 2, 3, 0, 1, 1),
                       (6, 1, 3, 0, 1, 1),
                       (2, 3, 0, 5, 1, 0),
                       (3, 2, 0, 5, 1, 0)]
    assert fr.held_fill(h) == 23 / 37


def test_paged_replay_preempts_the_newest_by_hand():
    # 4 blocks of 2. Step 0: both admitted (2 + 2 blocks for 3 + 1 and 2 + 1 tokens), then hold
    # 4 and 3 tokens. Step 1: 5 + 4 tokens need 5 blocks: request 1 is preempted, loses this
    # step's token and keeps its first; request 0 finishes. Steps 2-3: request 1 resumes at
    # 2 + 1 tokens and writes its last two.
    h = fr.replay([(0, 3, 2), (0, 2, 3)], paged=True, capacity=8, block_size=2)
    assert rows(h) == [(7, 1, 0, 0, 2, 0),
                       (5, 1, 0, 2, 1, 1),
                       (4, 0, 0, 4, 1, 0),
                       (5, 1, 0, 2, 1, 0)]


def test_replay_waits_for_arrivals_and_measures_with_the_given_function():
    seen = []

    def mine(lengths, block_size, num_blocks):
        seen.append(list(lengths))
        return fr.paged_waste(lengths, block_size, num_blocks)

    h = fr.replay([(2, 1, 1)], paged=True, capacity=4, block_size=4, waste=mine)
    assert rows(h) == [(0, 0, 0, 4, 0, 0), (0, 0, 0, 4, 0, 0), (2, 2, 0, 0, 1, 0)]
    assert seen == [[], [], [2]]


@pytest.mark.parametrize("requests, paged", [([(1, 2, 2), (0, 2, 2)], True),   # not sorted
                                              ([(0, 0, 2)], True),             # empty prompt
                                              ([(0, 8, 9)], True),             # never fits
                                              ([(0, 2, 5)], False),            # answer > max_new
                                              ([(0, 7, 1)], False)])           # 7 + 4 > 10
def test_replay_refuses_requests_it_could_never_finish(requests, paged):
    with pytest.raises(ValueError):
        fr.replay(requests, paged, capacity=16 if paged else 10, block_size=2, max_new=4)


def test_napkin_fill_by_hand():
    req = [(0, 2, 2), (0, 4, 4)]           # tokens: 2 (2 + 1) + 4 (4 + 2) = 30
    assert fr.napkin_fill(req, paged=False, max_new=4) == 30 / (2 * 6 + 4 * 8)
    assert fr.napkin_fill(req, paged=True, block_size=3) == 30 / (2 * 4 + 4 * 7)


def test_trace_requests_are_the_lab_06_trace_in_steps():
    trace = make_trace(num_requests=10, rate=40.0, seed=3, output_max=64)
    assert fr.trace_requests(10, 40.0, 3, max_new=64) == [
        (int(r.arrival_time / 0.02), len(r.prompt_ids), r.max_new_tokens) for r in trace]


# ---- what the replaced copies computed ---------------------------------------------------------
# Lab 07's `simulate` cell and the slides' `_frag_history` (before they imported this module) on
# trace_requests(64, 40.0, 0, max_new=256): steps, column sums of (used, internal, external,
# free, running), the first 16 hex digits of the sha256 of those columns as int64, and the sum
# of `waiting`. At 2048 slots the paged server never preempts (both copies agreed); at 512 it
# preempts (only the notebook's copy handled that).
OLD = {
    (False, 2048): (322, [100980, 405232, 84327, 68917, 1752], "c13b93c29d279486", 4948),
    (True, 2048): (162, [100980, 13276, 0, 217520, 1752], "1593abac7eb07166", 0),
    (True, 512): (265, [100980, 13276, 0, 21424, 1752], "8f586417e727f2fd", 3044),
    (False, 1024): (715, [100980, 405232, 212800, 13148, 1752], "840b4c196c33bb0b", 16634),
}


@pytest.mark.parametrize("paged, capacity", list(OLD))
def test_replay_reproduces_the_copies_it_replaced(paged, capacity):
    import numpy as np
    h = fr.replay(fr.trace_requests(64, 40.0, 0, max_new=256), paged, capacity=capacity)
    cols = np.array(rows(h, ("used", "internal", "external", "free", "running")), dtype=np.int64)
    got = (len(h), cols.sum(0).tolist(), hashlib.sha256(cols.tobytes()).hexdigest()[:16],
           sum(r["waiting"] for r in h))
    assert got == OLD[(paged, capacity)]


def test_the_lab_trace_fills_what_the_notebook_printed():
    req = fr.trace_requests(64, 40.0, 0, max_new=256)
    for paged, measured, napkin in ((False, 0.1994816401033559, 0.19775113983864467),
                                    (True, 0.8838047892452038, 0.883967362509272)):
        assert fr.held_fill(fr.replay(req, paged)) == pytest.approx(measured, rel=1e-12)
        assert fr.napkin_fill(req, paged) == pytest.approx(napkin, rel=1e-12)
