"""Lab 05 speed check: one target pass over k + 1 positions replaces k + 1 sequential steps.

The lab's claim is the premise of speculative decoding, "checking is faster than generating": a
speculative step runs the target ONCE over the last token and the k draft tokens (like a small
prefill) and keeps the accepted prefix, where plain decoding runs the target once per token. To
time that claim apart from the quality of any real draft, the check uses a *perfect and free*
draft: an oracle that proposes the target's own greedy continuation, computed beforehand (to
know it you must run the target -- which is why such a draft does not exist; see the lab's last
question). Every draft token is then accepted, n new tokens take ceil(n / (k + 1)) target passes
instead of n, and the ratio measures how cheap scoring k + 1 tokens at once is on this machine.

The timed claim is paired with deterministic ones graded exactly in the same notebook: the
target's forward calls and tokens counted by `ag.WorkCounter` (1 prefill + one pass per step,
fewer passes than new tokens, `05_work_test`) and the token-identity of greedy speculative
decoding with the target's greedy output (`05_greedy_test`). Time is graded only as a ratio of
medians measured interleaved in one process, on one torch thread:

    time(plain greedy loop: prefill, then NEW_TOKENS - 1 one-token forwards with a KV cache)
  / time(speculative loop with the student's `speculative_step` and the oracle draft, k = K)

Both use `Transformer.forward` with a `minillm.kvcache.KVCache`. Before timing, the speculative
output must equal the plain loop's tokens (a fast but wrong step earns nothing) and every step
must return between 1 and k + 1 tokens.

Measured on the shared 2-core development machine with the shipped target, NEW_TOKENS = 16, K = 3
(4 passes of 4 tokens against a prefill and 15 one-token steps), one thread, other sessions' jobs
sharing the machine throughout (load average 4-6), in two series of 6 and 14 runs (the last 5 of
the second with a busy loop spinning on one core):

    reference_step (the notebook's solution)                  1.83x - 2.65x  (median ~2.1x)
    one_at_a_time_step (same tokens, k + 1 one-token calls)   0.81x - 1.08x  (median ~0.94x)

THRESHOLD = 1.4 is 1.3x under the worst reference run and 1.3x over the worst one-at-a-time run.
A check takes ~2.5-3 s on the loaded machine (~5-9 s with the busy loop); the plain loop's 16
one-token forwards are most of it. (With NEW_TOKENS = 24 the ratios were the same, 1.9x - 2.3x
against 0.94x - 1.08x, for half again the time.)

    from autograder.labs import lab05
    lab05.check_speculative_speedup(speculative_step, target)   # AssertionError below THRESHOLD

`SPEED_CHECKS[grade_id]()` runs the check on the reference step (expected True) and
`COUNTER_EXAMPLES[grade_id]()` (alias `SLOW_CHECKS`) on a step that produces the same tokens but
scores the k + 1 positions with k + 1 separate one-token target calls (expected False);
tests/test_speed_checks.py runs both many times, also under a competing load.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from autograder.labs import passes, shipped_model
from autograder.timing import time_ratio

NEW_TOKENS = 16     # new tokens per generation
K = 3               # draft tokens per step: 4 passes of k + 1 = 4 tokens
PROMPT = "HAMLET.\nTo be, or not to be, that is the question:\n"
THRESHOLD = 1.4     # required time(plain loop) / time(speculative loop, perfect draft); ref 1.8-2.7
WARMUP, REPEATS = 1, 5

GRADE_ID = "05_speed_test"

# captured at import (the grader imports autograder before student code runs)
_no_grad = torch.no_grad
_get_threads, _set_threads = torch.get_num_threads, torch.set_num_threads
_tensor, _one_hot, _argmax = torch.tensor, F.one_hot, torch.argmax
_long = torch.long
_isinstance, _int, _len, _list = isinstance, int, len, list


class OracleDrafter:
    """A perfect, free draft: proposes the next k tokens of a continuation known beforehand.
    Protocol of the lab's drafters: propose(context, k) -> (tokens, p_draft [len(tokens), V]),
    rollback(n_keep)."""

    def __init__(self, prompt: list[int], continuation: list[int], vocab_size: int):
        self.prompt_len, self.continuation = _len(prompt), _list(continuation)
        self.vocab_size = vocab_size

    def propose(self, context, k):
        i = _len(context) - self.prompt_len
        tokens = self.continuation[i:i + k]
        return tokens, _one_hot(_tensor(tokens, dtype=_long), self.vocab_size).float()

    def rollback(self, n_keep):
        pass


def greedy_plain(target, prompt: list[int], n: int) -> list[int]:
    """The baseline: prefill, then n - 1 one-token forwards with a KV cache (lab 02's loop)."""
    from minillm.kvcache import KVCache
    cache = KVCache.for_model(target, 1, _len(prompt) + n)
    with _no_grad():
        nxt = _argmax(target(_tensor([prompt]), cache=cache)[0, -1])
        out = [_int(nxt)]
        for _ in range(n - 1):
            nxt = _argmax(target(nxt.reshape(1, 1), cache=cache)[0, -1])
            out.append(_int(nxt))
    return out


def run_speculative(step, target, drafter, prompt: list[int], k: int, n: int,
                    temperature: float = 0.0, generator=None) -> tuple[list[int], int]:
    """The lab's loop around `step(target, cache, drafter, context, k, temperature, generator)`:
    the target's cache holds the context but its last token; each step returns the accepted
    draft tokens plus one. Returns (n new tokens, number of steps)."""
    from minillm.kvcache import KVCache
    cache = KVCache.for_model(target, 1, _len(prompt) + n + k + 1)
    context, out, steps = _list(prompt), [], 0
    with _no_grad():
        if _len(prompt) > 1:
            target(_tensor([prompt[:-1]]), cache=cache)
        while _len(out) < n:
            kk = min(k, n - _len(out) - 1)
            new = step(target, cache, drafter, context, kk, temperature, generator)
            if not _isinstance(new, _list) or not 1 <= _len(new) <= kk + 1:
                raise AssertionError(f"speculative_step must return a list of 1 to k + 1 = "
                                     f"{kk + 1} token ids, got {new!r}")
            if cache.seq_len != _len(context) + _len(new) - 1:
                raise AssertionError(f"after a step that kept {_len(new) - 1} draft tokens the "
                                     f"target's cache should hold {_len(context) + _len(new) - 1} "
                                     f"positions (the context and the accepted drafts), it "
                                     f"holds {cache.seq_len}: roll back the rejected positions")
            new = [_int(t) for t in new]
            out.extend(new)
            context.extend(new)
            steps += 1
    return out[:n], steps


def speculative_speedup(step, target, *, tok=None, new_tokens: int = NEW_TOKENS, k: int = K,
                        warmup: int = WARMUP, repeats: int = REPEATS):
    """Time the plain greedy loop against the speculative loop with `step` and the oracle draft,
    interleaved, on one torch thread (restored afterwards); returns the RatioResult
    (.ratio = median(plain) / median(speculative)). AssertionError if the tokens differ."""
    import minillm
    tok = tok or minillm.load_tokenizer("target")
    prompt = tok.encode(PROMPT)
    threads = _get_threads()
    _set_threads(1)
    try:
        expect = greedy_plain(target, prompt, new_tokens)
        oracle = OracleDrafter(prompt, expect, target.config.vocab_size)
        got, steps = run_speculative(step, target, oracle, prompt, k, new_tokens)
        if got != expect:
            raise AssertionError(f"with a perfect draft, speculative decoding produced {got} "
                                 f"instead of the target's greedy tokens {expect}")
        return time_ratio(lambda: greedy_plain(target, prompt, new_tokens),
                          lambda: run_speculative(step, target, oracle, prompt, k, new_tokens),
                          warmup=warmup, repeats=repeats)
    finally:
        _set_threads(threads)


def check_speculative_speedup(step, target, *, at_least: float = THRESHOLD, **kw) -> float:
    """AssertionError unless the speculative loop with `step` and a perfect draft is at least
    `at_least` times faster than the plain greedy loop; returns the measured ratio."""
    r = speculative_speedup(step, target, **kw)
    k, n = kw.get("k", K), kw.get("new_tokens", NEW_TOKENS)
    if not r.ratio >= at_least:
        raise AssertionError(
            f"with a perfect draft (every draft token accepted, k = {k}), {n} new tokens took "
            f"only {r.ratio:.2f}x less time than the plain loop (median {r.candidate_s * 1e3:.3g} "
            f"ms vs {r.baseline_s * 1e3:.3g} ms over {len(r.baseline_times)} interleaved runs); "
            f"scoring the k + 1 positions in ONE target pass reaches at least {at_least:g}x. Does "
            f"your step call the target once per step?")
    return r.ratio


# --- the reference and a deliberately slow candidate --------------------------------------------
def reference_step(target, cache, drafter, context, k, temperature=0.0, generator=None):
    """The lab's solution: draft, ONE target pass over [last] + draft, verify, roll back."""
    from minillm.sampling import probabilities
    from minillm.speculative import verify
    draft, p_draft = drafter.propose(context, k)
    logits = target(torch.tensor([[context[-1]] + draft]), cache=cache)[0]
    q_target = probabilities(logits.float(), temperature)
    n, nxt = verify(q_target, p_draft, draft, generator)
    cache.truncate(len(context) + n)
    drafter.rollback(len(context) + n)
    return draft[:n] + [nxt]


def one_at_a_time_step(target, cache, drafter, context, k, temperature=0.0, generator=None):
    """Same tokens, but the k + 1 positions are scored by k + 1 one-token target calls (decoding
    the drafts instead of checking them): no speed-up."""
    from minillm.sampling import probabilities
    from minillm.speculative import verify
    draft, p_draft = drafter.propose(context, k)
    logits = torch.cat([target(torch.tensor([[t]]), cache=cache)[0]
                        for t in [context[-1]] + draft])
    q_target = probabilities(logits.float(), temperature)
    n, nxt = verify(q_target, p_draft, draft, generator)
    cache.truncate(len(context) + n)
    drafter.rollback(len(context) + n)
    return draft[:n] + [nxt]




SPEED_CHECKS = {  # expected True
    GRADE_ID: lambda: passes(check_speculative_speedup, reference_step, shipped_model())}
COUNTER_EXAMPLES = {  # expected False
    GRADE_ID: lambda: passes(check_speculative_speedup, one_at_a_time_step, shipped_model())}
SLOW_CHECKS = COUNTER_EXAMPLES   # same dict under the other name the test suite looks for
