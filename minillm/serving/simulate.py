"""Who runs in which step: the two batching policies as pure schedules (no model, no clock).

Given only the output length O_i of each request (all of them queued at the start, in order),
the steps of a server are fully determined by its policy:

    static:      batches of max_batch consecutive requests; a batch runs max(O_i) steps (the
                 first is the prefill, which already yields a token) and only then does the
                 next batch start. Step s of a batch computes every row, but only rows with
                 O_i > s still produce a token.
    continuous:  before every step, queued requests join (first come, first served) while fewer
                 than max_batch run; every running request produces one token; a request leaves
                 right after the step that produced its O_i-th token.

Each function returns the timeline: for every step, the ids of the requests that produce a token
in it (ascending). `LLMEngine` and `StaticBatchServer` follow exactly these schedules when all
requests are queued before the first step and the KV cache never runs out (tests check it), so
the timeline predicts step counts -- and, with a cost per step, run times -- before anything
runs. The lab 06 slides draw their timelines from here.
"""
from __future__ import annotations


def _check(output_lens, max_batch: int) -> list[int]:
    lens = [int(o) for o in output_lens]
    if any(o < 1 for o in lens):
        raise ValueError(f"every output length must be >= 1, got {min(lens)}")
    if int(max_batch) != max_batch or max_batch < 1:
        raise ValueError(f"max_batch must be an integer >= 1, got {max_batch}")
    return lens


def simulate_static(output_lens, max_batch: int) -> list[list[int]]:
    """Static batching's timeline: ids producing a token in each step."""
    lens = _check(output_lens, max_batch)
    steps = []
    for start in range(0, len(lens), max_batch):
        batch = range(start, min(start + max_batch, len(lens)))
        for s in range(max(lens[i] for i in batch)):
            steps.append([i for i in batch if lens[i] > s])
    return steps


def simulate_continuous(output_lens, max_batch: int) -> list[list[int]]:
    """Iteration-level scheduling's timeline: ids producing a token in each step."""
    lens = _check(output_lens, max_batch)
    waiting = list(range(len(lens)))
    running: list[int] = []
    made = [0] * len(lens)
    steps = []
    while waiting or running:
        while waiting and len(running) < max_batch:          # join before the step
            running.append(waiting.pop(0))
        steps.append(sorted(running))
        for i in running:
            made[i] += 1
        running = [i for i in running if made[i] < lens[i]]  # leave after the step
    return steps


def static_slots(prompt_lens, output_lens) -> tuple[int, int]:
    """(token slots computed, useful tokens) of ONE static batch: the prefill computes the
    B x max(P) rectangle, then max(O) - 1 decode steps compute B rows each; useful are the real
    prompt tokens and the decode inputs of rows still generating (sum of O_i - 1)."""
    P, O = [int(p) for p in prompt_lens], [int(o) for o in output_lens]
    if len(P) != len(O) or not P:
        raise ValueError(f"need one prompt length per output length, got {len(P)} and {len(O)}")
    B = len(P)
    return B * max(P) + B * (max(O) - 1), sum(P) + sum(o - 1 for o in O)
