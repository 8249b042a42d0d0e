"""Lab 05: probes run the student's `speculative_step` in the course's loop; the speed check times
it with a perfect, free draft (the target's greedy tokens) against plain greedy decoding."""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from autograder.labs import counted, shipped_model
from autograder.labs.speedcheck import SpeedCheck, one_torch_thread
from autograder.probes import fresh_model, probe, working_model
from autograder.timing import time_ratio

NEW_TOKENS = 16     # new tokens per generation
K = 3               # draft tokens per step: 4 passes of k + 1 = 4 tokens
PROMPT = "HAMLET.\nTo be, or not to be, that is the question:\n"
# time(plain) / time(speculative), loaded 2-core, in the tester: the reference step 2.00-2.27, the
# solution 2.02-2.26, a step scoring the k + 1 positions one call at a time 0.92-0.98
THRESHOLD = 1.4
WARMUP, REPEATS = 1, 5
BENCH_KS = (1, 2, 3, 4, 6)   # the draft lengths the lab's bench cell measures
K_MAX = 12                   # the longest draft 05_choose_k may pick


def bench_command() -> list[str]:
    """The bench cell's arguments after the interpreter (torch.compile stays out of the kernel)."""
    return ["-m", "minillm", "bench", "speculative", "--json", "--threads", "1", "--cpu-time",
            "--draft", "draft-distilled", "--draft-engine", "compiled-int8", "--prompt", PROMPT,
            "--k", ",".join(map(str, BENCH_KS)), "--new-tokens", "48", "--repeats", "2",
            "--temperature", "0", "--no-lookup", "--no-predict"]   # both: the student's own


def compile_warmups() -> list[list[str]]:
    """Run once before grading this lab (autograder/compile_cache.py): fills the compile cache."""
    return [bench_command()]


# drafters: propose(context, k) -> (tokens, p [len, V]), rollback(n_keep), last_proposed
class OracleDrafter:
    """A perfect, free draft: proposes the next k tokens of a continuation known beforehand."""

    def __init__(self, prompt: list[int], continuation: list[int], vocab_size: int):
        self.prompt_len, self.continuation = len(prompt), list(continuation)
        self.vocab_size, self.last_proposed = vocab_size, 0

    def propose(self, context, k):
        i = len(context) - self.prompt_len
        tokens = self.continuation[i:i + k]
        self.last_proposed = len(tokens)
        return tokens, F.one_hot(torch.tensor(tokens, dtype=torch.long), self.vocab_size).float()

    def rollback(self, n_keep):
        pass


class ModelDraft:
    """The notebook's ModelDraft, greedy, on minillm's ModelDrafter."""

    def __init__(self, model, prompt: list[int], max_len: int):
        from minillm.sampling import SamplingParams
        from minillm.speculative import ModelDrafter
        self.drafter, self.params = ModelDrafter(model), SamplingParams(temperature=0)
        self.drafter.start(torch.tensor([prompt]), max_len)
        self.vocab_size, self.last_proposed = model.config.vocab_size, 0

    def propose(self, context, k):
        tokens, _ = self.drafter.propose(list(context), k, self.params)
        self.last_proposed = len(tokens)
        return tokens, F.one_hot(torch.tensor(tokens, dtype=torch.long), self.vocab_size).float()

    def rollback(self, n_keep):
        self.drafter.cache.truncate(min(self.drafter.cache.seq_len, n_keep))


@torch.no_grad()
def greedy_plain(target, prompt: list[int], n: int) -> list[int]:
    """The baseline: prefill, then n - 1 one-token forwards with a KV cache."""
    from minillm.kvcache import KVCache
    cache = KVCache.for_model(target, 1, len(prompt) + n)
    nxt = target(torch.tensor([prompt]), cache=cache)[0, -1].argmax()
    out = [int(nxt)]
    for _ in range(n - 1):
        nxt = target(nxt.reshape(1, 1), cache=cache)[0, -1].argmax()
        out.append(int(nxt))
    return out


@torch.no_grad()
def run_speculative(step, target, drafter, prompt: list[int], k: int, n: int) -> dict:
    """The notebook's `speculative_decode` around `step`, greedy: the n tokens and statistics."""
    from minillm.kvcache import KVCache
    cache = KVCache.for_model(target, 1, len(prompt) + n + k + 1)
    if len(prompt) > 1:
        target(torch.tensor([prompt[:-1]]), cache=cache)
    context, out = list(prompt), []
    stats = {"steps": 0, "proposed": 0, "accepted": 0, "rejected": 0}
    while len(out) < n:
        kk = min(k, n - len(out) - 1)
        drafter.last_proposed = 0
        new = step(target, cache, drafter, list(context), kk, 0.0, None)
        if not isinstance(new, list) or not 1 <= len(new) <= kk + 1:
            raise AssertionError(f"speculative_step must return a list of 1 to k + 1 = {kk + 1} "
                                 f"token ids, got {new!r}")
        if cache.seq_len != len(context) + len(new) - 1:
            raise AssertionError(f"after a step that kept {len(new) - 1} draft tokens the "
                                 f"target's cache should hold {len(context) + len(new) - 1} "
                                 f"positions (the context and the accepted drafts), it holds "
                                 f"{cache.seq_len}: roll back the rejected positions")
        new = [int(t) for t in new]
        stats["steps"] += 1
        stats["proposed"] += drafter.last_proposed
        stats["accepted"] += len(new) - 1
        stats["rejected"] += len(new) - 1 < drafter.last_proposed
        out += new
        context += new
    judged = stats["accepted"] + stats["rejected"]
    return {"tokens": out[:n], **stats, "alpha": stats["accepted"] / max(1, judged),
            "tokens_per_step": len(out) / stats["steps"]}


@probe
def speculative_run(step, prompt_ids, k: int, n: int, *, oracle=None,
                    draft: str = "draft-distilled") -> dict:
    """`run_speculative` on fresh models, drafting with `draft` or `oracle`, counted."""
    target, prompt = fresh_model("target"), [int(t) for t in prompt_ids]
    drafter = OracleDrafter(prompt, oracle, target.config.vocab_size) if oracle is not None \
        else ModelDraft(fresh_model(draft), prompt, len(prompt) + n + k + 1)
    run, work = counted(target, lambda t: run_speculative(step, t, drafter, prompt, k, n))
    return {**run, **work}


@probe
def timed_speculative(step, prompt_ids: list[int], oracle: list[int], k: int) -> None:
    target = working_model("target")
    drafter = OracleDrafter(prompt_ids, oracle, target.config.vocab_size)
    with one_torch_thread():
        got = run_speculative(step, target, drafter, prompt_ids, k, len(oracle))["tokens"]
    if got != oracle:
        raise AssertionError(f"with a perfect draft, speculative decoding produced {got} "
                             f"instead of the target's greedy tokens {oracle}")


def speculative_speedup(step, *, new_tokens: int, k: int, warmup: int = WARMUP,
                        repeats: int = REPEATS):
    """.ratio = median(plain) / median(speculative, oracle draft); the tokens must agree."""
    import minillm
    target = shipped_model("target")
    prompt = minillm.load_tokenizer("target").encode(PROMPT)
    expect = greedy_plain(target, prompt, new_tokens)
    got = speculative_run(step, prompt, k, new_tokens, oracle=expect)["tokens"]
    if got != expect:
        raise AssertionError(f"with a perfect draft, speculative decoding produced {got} "
                             f"instead of the target's greedy tokens {expect}")
    return time_ratio(lambda: greedy_plain(target, prompt, new_tokens),
                      lambda: timed_speculative(step, prompt, expect, k),
                      warmup=warmup, repeats=repeats)


def reference_step(target, cache, drafter, context, k, temperature=0.0, generator=None, *,
                   one_pass=True):
    """Draft, ONE target pass, verify, roll back (one_pass=False: one call per position)."""
    from minillm.sampling import probabilities
    from minillm.speculative import verify
    draft, p_draft = drafter.propose(context, k)
    ids = [context[-1]] + draft
    logits = target(torch.tensor([ids]), cache=cache)[0] if one_pass else \
        torch.cat([target(torch.tensor([[t]]), cache=cache)[0] for t in ids])
    n, nxt = verify(probabilities(logits.float(), temperature), p_draft, draft, generator)
    cache.truncate(len(context) + n)
    drafter.rollback(len(context) + n)
    return draft[:n] + [nxt]


SPEED_CHECK = SpeedCheck(
    grade_id="05_speed_test", threshold=THRESHOLD, measure=speculative_speedup,
    reference=reference_step, counter_example=functools.partial(reference_step, one_pass=False),
    workload=dict(new_tokens=NEW_TOKENS, k=K),
    solution=("speculative_step", "05_step", "05_verify", "05_residual"),
    hint="with a perfect draft (every draft token accepted, k = {k}), {new_tokens} new tokens "
         "took only {ratio:.2f}x less time than the plain loop (median {candidate_ms:.3g} ms vs "
         "{baseline_ms:.3g} ms over {runs} interleaved runs); scoring the k + 1 positions in ONE "
         "target pass reaches at least {at_least:g}x. Does your step call the target once per "
         "step?")
check_speculative_speedup = SPEED_CHECK.check
__all__ = ["speculative_run", "timed_speculative", "greedy_plain", "check_speculative_speedup",
           "bench_command", "OracleDrafter", "PROMPT", "NEW_TOKENS", "K", "BENCH_KS", "K_MAX"]
