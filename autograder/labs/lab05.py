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
medians of CPU time measured interleaved, on one torch thread (lab 05's tests run in the tester:
the student's step runs in the kernel, the target's passes and its cache stay in the tester, and
both processes' CPU time counts):

    time(plain greedy loop: prefill, then NEW_TOKENS - 1 one-token forwards with a KV cache)
  / time(speculative loop with the student's `speculative_step` and the oracle draft, k = K)

Both use `Transformer.forward` with a `minillm.kvcache.KVCache`. Before timing, the speculative
output must equal the plain loop's tokens (a fast but wrong step earns nothing) and every step
must return between 1 and k + 1 tokens.

Why 1.15: under the reference step on a loaded 2-core machine graded in the tester (four passes
of four tokens against a prefill and 15 one-token steps; each step's calls cross between kernel
and tester: 1.59-1.72), over a step that produces the same tokens but scores the k + 1
positions with k + 1 one-token calls (0.73-0.76 there), by about the same factor each way. It
was 1.4 while the tests ran in the kernel (ranges: autograder/README.md).

    from autograder.labs import lab05
    lab05.check_speculative_speedup(speculative_step, target)   # AssertionError below THRESHOLD
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from autograder.labs import shipped_model
from autograder.labs.speedcheck import SpeedCheck
from autograder.remote import shared as _shared
from autograder.timing import time_ratio

NEW_TOKENS = 16     # new tokens per generation
K = 3               # draft tokens per step: 4 passes of k + 1 = 4 tokens
PROMPT = "HAMLET.\nTo be, or not to be, that is the question:\n"
THRESHOLD = 1.15    # required time(plain loop) / time(speculative loop, perfect draft)
WARMUP, REPEATS = 1, 5
BENCH_KS = (1, 2, 3, 4, 6)   # the draft lengths the lab's bench cell measures


def bench_command() -> list[str]:
    """The lab's bench cell, as arguments after the interpreter: `bench_speculative` on PROMPT
    with the distilled draft decoding through `torch.compile` (int8 weights), run by the
    course's CLI in a process of its own so that compiling stays out of the kernel."""
    return ["-m", "minillm", "bench", "speculative", "--json", "--threads", "1", "--cpu-time",
            "--draft", "draft-distilled", "--draft-engine", "compiled-int8", "--prompt", PROMPT,
            "--k", ",".join(map(str, BENCH_KS)), "--new-tokens", "48", "--repeats", "2",
            "--temperature", "0", "--lookup-k", "6", "--lookup-new-tokens", "96"]


def compile_warmups() -> list[list[str]]:
    """What the grader runs once before grading this lab (autograder/compile_cache.py): the
    bench, whose compiled draft step every graded kernel then finds in its cache."""
    return [bench_command()]

# captured at import (the grader imports autograder before student code runs)
_no_grad = torch.no_grad
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
    # with the tests in the tester: the student's step runs in the kernel on handles of the
    # target and its cache, which stay here (the target's passes run, and are counted, here;
    # what the step does to the cache is done to this cache); the drafter crosses whole (a
    # copy in the kernel, lab 05's "modules": "copy"); in one kernel, the objects themselves
    model_arg, cache_arg = _shared(target), _shared(cache)
    with _no_grad():
        if _len(prompt) > 1:
            target(_tensor([prompt[:-1]]), cache=cache)
        while _len(out) < n:
            kk = min(k, n - _len(out) - 1)
            new = step(model_arg, cache_arg, drafter, context, kk, temperature, generator)
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


def speculative_speedup(step, guard, target, *, new_tokens: int, k: int, tok=None,
                        warmup: int = WARMUP, repeats: int = REPEATS):
    """Time the plain greedy loop against the speculative loop with `step` and the oracle draft,
    interleaved: .ratio = median(plain) / median(speculative). AssertionError if the tokens
    differ."""
    import minillm
    tok = tok or minillm.load_tokenizer("target")
    prompt = tok.encode(PROMPT)
    expect = greedy_plain(target, prompt, new_tokens)
    oracle = OracleDrafter(prompt, expect, target.config.vocab_size)
    with guard:
        got, steps = run_speculative(step, target, oracle, prompt, k, new_tokens)
    if got != expect:
        raise AssertionError(f"with a perfect draft, speculative decoding produced {got} "
                             f"instead of the target's greedy tokens {expect}")

    def candidate():
        with guard:
            run_speculative(step, target, oracle, prompt, k, new_tokens)

    return time_ratio(lambda: greedy_plain(target, prompt, new_tokens), candidate,
                      warmup=warmup, repeats=repeats)


# --- a correct candidate on the library, and the usual mistake, in the notebook's signature -----
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




SPEED_CHECK = SpeedCheck(
    grade_id="05_speed_test", threshold=THRESHOLD, measure=speculative_speedup,
    reference=reference_step, counter_example=one_at_a_time_step,
    workload=dict(new_tokens=NEW_TOKENS, k=K),
    disabled=("minillm.speculative.verify", "minillm.speculative.residual_distribution",
              "minillm.speculative.speculative_generate"),
    fixture=lambda: (shipped_model(),),
    hint="with a perfect draft (every draft token accepted, k = {k}), {new_tokens} new tokens "
         "took only {ratio:.2f}x less time than the plain loop (median {candidate_ms:.3g} ms vs "
         "{baseline_ms:.3g} ms over {runs} interleaved runs); scoring the k + 1 positions in ONE "
         "target pass reaches at least {at_least:g}x. Does your step call the target once per "
         "step?")
check_speculative_speedup = SPEED_CHECK.check
