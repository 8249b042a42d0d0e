"""Where KV memory goes: fragmentation of contiguous vs paged allocation, replayed on a trace.

A server keeps every running request's keys and values in one memory of `capacity` *slots*
(room for one token's K and V in every layer). Each step that memory splits into four parts:

    used      slots holding a token
    internal  slots held by a request that hold no token (internal fragmentation)
    external  free slots in holes too small for the next waiting request (external fragmentation)
    free      the other free slots

Contiguous allocation reserves prompt + max_new slots in one piece when it admits a request
(it cannot know when the answer stops), at the first hole big enough (`first_fit`): most of the
reservation stays empty (internal), and requests finishing in any order leave holes (external).
Paged allocation (vLLM's PagedAttention) hands out blocks of `block_size` slots as a sequence
grows: only the last block of each sequence has empty slots, and any free block serves anyone.

    requests = trace_requests(num_requests=64, rate=40.0, seed=0, max_new=256)
    history = replay(requests, paged=False)              # one row per decode step
    held_fill(history)                                   # tokens / held memory, about 0.2
    held_fill(replay(requests, paged=True))              # about 0.9

`replay` is the server of lab 07 (and of its slides' fragmentation figure): requests arrive at
their step, are admitted in arrival order while the head of the queue fits, each running request
gains one token per step and leaves after its last one. The paged server preempts the most
recently admitted request when it runs out of blocks (recompute: it rejoins the queue head and
keeps the tokens it had before this step). Lab 07's students write `contiguous_waste` and
`paged_waste` themselves; `replay(..., waste=their_function)` records their numbers instead.
"""
from __future__ import annotations

from collections import deque
from typing import Callable

__all__ = ["first_fit", "contiguous_waste", "paged_waste", "trace_requests", "replay",
           "held_fill", "napkin_fill"]


def _blocks(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


def first_fit(reservations, size: int, capacity: int) -> int | None:
    """Start of the first hole of at least `size` free slots in a memory of `capacity` slots, or
    None. reservations: (start, reserved) pairs, in any order, not overlapping.

    >>> first_fit([(0, 4), (6, 2)], 2, 10)     # holes [4, 6) and [8, 10)
    4
    >>> first_fit([(0, 4), (6, 2)], 3, 10) is None
    True
    """
    end = 0                                     # first slot after the previous reservation
    for start, reserved in sorted(reservations) + [(capacity, 0)]:
        if start - end >= size:
            return end
        end = start + reserved
    return None


def contiguous_waste(reservations, capacity: int, request_size: int | None = None) -> dict:
    """Split a contiguous KV memory of `capacity` slots into used / internal / external / free.

    reservations: (start, reserved, used) triples, in any order: a request holds slots
        [start, start + reserved) and stores tokens in the first `used` of them. They must not
        overlap and must lie inside [0, capacity) (ValueError otherwise).
    request_size: slots the next waiting request needs (None: nobody waits, nothing is external).
    A *hole* is a maximal run of free slots (before the first and after the last reservation
    too); holes smaller than request_size are external, the others free. Returns
    {"used", "internal", "external", "free"} (ints adding up to capacity).

    >>> contiguous_waste([(9, 7, 7), (0, 6, 2)], 20, request_size=4)
    {'used': 9, 'internal': 4, 'external': 3, 'free': 4}
    """
    used = internal = external = free = 0
    end = 0
    for start, reserved, filled in sorted(reservations) + [(capacity, 0, 0)]:
        if start < end or not 0 <= filled <= reserved:
            raise ValueError(f"reservation ({start}, {reserved}, {filled}) overlaps the one "
                             f"before it, leaves the memory of {capacity} slots, or holds "
                             f"more tokens than slots")
        hole = start - end
        if request_size is not None and hole < request_size:
            external += hole
        else:
            free += hole
        used += filled
        internal += reserved - filled
        end = start + reserved
    return {"used": used, "internal": internal, "external": external, "free": free}


def paged_waste(lengths, block_size: int, num_blocks: int) -> dict:
    """The same split for a paged memory of `num_blocks` blocks of `block_size` slots: sequence i
    holds lengths[i] tokens in ceil(lengths[i] / block_size) blocks; the empty slots of its last
    block are internal. External is always 0: any free block serves any sequence.

    >>> paged_waste([5, 16, 1], 4, 10)        # 2 + 4 + 1 blocks of 4
    {'used': 22, 'internal': 6, 'external': 0, 'free': 12}
    """
    held = sum(_blocks(n, block_size) for n in lengths)
    if held > num_blocks:
        raise ValueError(f"the sequences hold {held} blocks, more than the {num_blocks} there are")
    used = sum(lengths)
    return {"used": used, "internal": held * block_size - used, "external": 0,
            "free": (num_blocks - held) * block_size}


def trace_requests(num_requests: int = 64, rate: float = 40.0, seed: int = 0,
                   max_new: int = 256, step_s: float = 0.02) -> list[tuple[int, int, int]]:
    """A lab 06 workload (`minillm.serving.trace.make_trace`, answers of at most `max_new`
    tokens) as (arrival step, prompt tokens, answer tokens) per request, in arrival order; one
    decode step takes `step_s` seconds."""
    from .trace import make_trace
    trace = make_trace(num_requests=num_requests, rate=rate, seed=seed, output_max=max_new)
    return [(int(r.arrival_time / step_s), len(r.prompt_ids), r.max_new_tokens) for r in trace]


def _check_requests(requests, paged: bool, capacity: int, block_size: int, max_new: int):
    for i, (arrival, prompt, answer) in enumerate(requests):
        if i and arrival < requests[i - 1][0]:
            raise ValueError(f"requests must come sorted by arrival step (request {i})")
        if prompt < 1 or answer < 1:
            raise ValueError(f"request {i}: prompt and answer need >= 1 token each")
        if paged and _blocks(prompt + answer, block_size) > capacity // block_size:
            raise ValueError(f"request {i} ({prompt} + {answer} tokens) can never fit in "
                             f"{capacity // block_size} blocks of {block_size}")
        if not paged and (answer > max_new or prompt + max_new > capacity):
            raise ValueError(f"request {i}: an answer of {answer} > max_new = {max_new}, or a "
                             f"reservation of {prompt} + {max_new} slots > capacity {capacity}")


def replay(requests, paged: bool, capacity: int = 2048, block_size: int = 16,
           max_new: int = 256, waste: Callable[..., dict] | None = None) -> list[dict]:
    """Serve `requests` ((arrival step, prompt, answer) triples sorted by arrival) with
    continuous batching on a KV memory of `capacity` slots; one history row per decode step:
    {"used", "internal", "external", "free", "running", "waiting"}.

    Every step: arrived requests join the queue; the queue's head is admitted while it fits
    (contiguous: prompt + max_new slots at the first big-enough hole; paged: its tokens plus the
    one it is about to write, in whole blocks); every running request writes one token; the
    paged server, out of blocks, preempts the most recently admitted request (it loses this
    step's token and rejoins the head of the queue); the memory is measured (after the step's
    tokens, before finished requests leave); finished requests release their memory.
    waste: the measuring function, called like `paged_waste` (paged) or `contiguous_waste`
    (contiguous, with the waiting head's reservation as request_size); None: this module's."""
    _check_requests(requests, paged, capacity, block_size, max_new)
    if waste is None:
        waste = paged_waste if paged else contiguous_waste
    num_blocks = capacity // block_size
    arrivals = deque(range(len(requests)))
    waiting, running, done = deque(), {}, [0] * len(requests)
    history, step = [], 0

    def blocks_held() -> int:
        return sum(_blocks(s["len"], block_size) for s in running.values())

    while arrivals or waiting or running:
        while arrivals and requests[arrivals[0]][0] <= step:
            waiting.append(arrivals.popleft())
        while waiting:                                  # admit in order while the head fits
            i = waiting[0]
            length = requests[i][1] + done[i]           # a preempted request resumes
            if paged:
                if blocks_held() + _blocks(length + 1, block_size) > num_blocks:
                    break
                running[i] = {"len": length}
            else:
                size = requests[i][1] + max_new
                start = first_fit([(s["start"], s["size"]) for s in running.values()], size,
                                  capacity)
                if start is None:
                    break
                running[i] = {"len": length, "start": start, "size": size}
            waiting.popleft()
        for i, s in running.items():                    # one decode step: one token each
            s["len"] += 1
            done[i] += 1
        while paged and blocks_held() > num_blocks:     # out of blocks: preempt the newest
            i = list(running)[-1]
            done[i] -= 1
            del running[i]
            waiting.appendleft(i)
        if paged:
            row = waste([s["len"] for s in running.values()], block_size, num_blocks)
        else:
            nxt = requests[waiting[0]][1] + max_new if waiting else None
            row = waste([(s["start"], s["size"], s["len"]) for s in running.values()],
                        capacity, nxt)
        history.append({**dict(row), "running": len(running), "waiting": len(waiting)})
        for i in [i for i in running if done[i] >= requests[i][2]]:
            del running[i]                              # finished: its memory is released
        step += 1
    return history


def held_fill(history) -> float:
    """The fraction of held memory (used + internal) that holds tokens, over a whole replay."""
    used = sum(r["used"] for r in history)
    held = used + sum(r["internal"] for r in history)
    return used / held if held else 0.0


def napkin_fill(requests, paged: bool, block_size: int = 16, max_new: int = 256) -> float:
    """The napkin prediction of `held_fill`: request i (prompt p_i, answer o_i) lives o_i steps
    and stores p_i + o_i / 2 tokens on average; it holds p_i + max_new slots (contiguous) or
    about (block_size - 1) / 2 empty slots more than its tokens (paged). Weighted by lifetime:
    sum o_i (p_i + o_i / 2) / sum o_i (p_i + max_new)  or  / sum o_i (p_i + o_i / 2 + (B-1) / 2)."""
    tokens = sum(o * (p + o / 2) for _, p, o in requests)
    if paged:
        held = sum(o * (p + o / 2 + (block_size - 1) / 2) for _, p, o in requests)
    else:
        held = sum(o * (p + max_new) for _, p, o in requests)
    return tokens / held
