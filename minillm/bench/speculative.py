"""`minillm bench speculative`: speculative decoding against the target alone, timed interleaved.

The algorithm is minillm/speculative.py; this module measures it: the speed-up, and inside the
same timed runs the draft's cost ratio c and the verification cost v_{k+1} that the formulas
need (`bench_speculative`), prompt-lookup drafting on a prompt that repeats itself
(`bench_prompt_lookup`), and the plain sampler that sampling runs are compared with
(`sample_packed`).
"""
from __future__ import annotations

import torch

from ..decode import PackedDecoder, generate_packed
from ..kvcache import KVCache
from ..sampling import SamplingParams, probabilities
from ..speculative import (
    ModelDrafter,
    PromptLookupDrafter,
    expected_speedup,
    speculative_generate,
)
from .bandwidth import bandwidth_report, reader, step_bytes
from .timing import cpu_time_interleaved, median, perf_counter, process_time, time_interleaved


@torch.no_grad()
def sample_packed(target, prompt: list[int], decoder: PackedDecoder,
                  params: SamplingParams) -> list[int]:
    """The target alone, sampling: prefill with the model, then one packed step per token."""
    generator = torch.Generator().manual_seed(params.seed if params.seed is not None else 0)
    ids = torch.tensor([prompt])
    cache = KVCache.for_model(target, 1, ids.shape[1] + params.max_new_tokens)
    logits = target(ids, cache=cache, last_only=True)[0, -1]
    out = []
    while True:
        p = probabilities(logits.float(), params.temperature, params.top_k, params.top_p)
        out.append(int(torch.multinomial(p, 1, generator=generator)))
        if len(out) == params.max_new_tokens or out[-1] in params.stop_ids:
            return out
        logits = decoder.step(torch.tensor(out[-1:]), cache)[0]


REPETITIVE_TEXT = "KING RICHARD.\nI am not glad to be a king of death.\n\n"


def repetitive_prompt(tok, repeats: int = 2) -> list[int]:
    """A prompt that repeats a line the shipped target wrote itself when decoding greedily after
    "ROMEO.\n" (a loop it falls into): its continuation keeps reusing earlier n-grams, which is
    where prompt lookup shines (in real use: code edits, answers that quote the document)."""
    return tok.encode(REPETITIVE_TEXT * repeats)


class _StepClock:
    """Time spent inside a method, per label (the run that is going on), by `clock`: how c and v
    are measured *inside* the timed generations, where the draft's weights are cold after each
    target pass and the caches hold the real context -- not in a warm micro-benchmark."""

    def __init__(self, clock):
        self._clock, self.label = clock, None
        self.seconds: dict = {}
        self.calls: dict = {}

    def wrap(self, obj, attr: str, kind: str) -> None:
        fn = getattr(obj, attr)

        def timed(*args, **kwargs):
            t0 = self._clock()
            try:
                return fn(*args, **kwargs)
            finally:
                key = (self.label, kind)
                self.seconds[key] = self.seconds.get(key, 0.0) + self._clock() - t0
                self.calls[key] = self.calls.get(key, 0) + 1
        setattr(obj, attr, timed)

    def mean(self, label, kind) -> float:
        n = self.calls.get((label, kind), 0)
        return self.seconds[(label, kind)] / n if n else float("nan")

    def labelled(self, label, fn):
        def run():
            self.label = label
            return fn()
        return run


def bench_speculative(target, draft, prompt: list[int], ks=(1, 2, 3, 4, 6), new_tokens: int = 128,
                      repeats: int = 3, lookup_prompt: list[int] | None = None,
                      lookup_k: int = 6, lookup_new_tokens: int | None = None,
                      cpu_time: bool = False, draft_engine: str = "packed",
                      sample_temperature: float | None = 0.8, sample_k: int = 3,
                      seed: int = 0, predict: bool = True) -> dict:
    """Greedy speculative decoding vs the target alone, timed interleaved in one run.

    The baseline is the target's fastest plain decoder (KV cache + packed step), so the speed-up
    is what speculation adds on top of lab 02's optimisations. Inside the same timed runs it
    measures the cost ratio c (mean draft step / mean plain target step) and, per k, the
    verification cost v_{k+1} (mean scoring pass over k + 1 tokens / mean plain target step), and
    predicts the speed-up from them and the measured alpha. With `lookup_prompt`, it also times
    prompt-lookup drafting (k = lookup_k, `lookup_new_tokens` tokens) on that prompt against the
    target alone on the same prompt. With `sample_temperature`, it also times sampling at that
    temperature (k = sample_k, seeded) against the target sampling alone: the tokens differ from
    run to run of the random stream, the distribution does not (the acceptance rule is exact).

    `draft_engine`: how the draft runs its steps (`ModelDrafter`): "packed" (fp32, op by op) or
    "compiled-int8" (int8 weights, one compiled function per step; compiles on first use).

    Each run's row holds what was measured (alpha, tokens per step, the drafts of each step in
    `drafts_per_step`, c, v, the speed-up) and, with `predict`, the formulas' predictions
    (`predicted_tokens_per_step`, `predicted_speedup`); lab 05 predicts with its own formulas.

    With `cpu_time` every figure (the runs, and c and v inside them) is CPU seconds of this
    process (`time.process_time`): on one torch thread a neighbour that takes the core for a
    while then adds nothing to them, where the wall clock charges it to whichever run or step it
    overlaps. With several threads their CPU seconds add up: keep the wall clock there.
    """
    n_lookup = new_tokens if lookup_new_tokens is None else lookup_new_tokens
    if new_tokens < 1 or n_lookup < 1 or repeats < 1 or not ks or min(ks) < 1 or lookup_k < 1 \
            or sample_k < 1:
        raise ValueError("need new_tokens >= 1, lookup_new_tokens >= 1, repeats >= 1, "
                         "lookup_k >= 1, sample_k >= 1 and every k >= 1")
    # weights packed once, outside the timing; the verify passes read the same copy (default_scorer)
    plain = scorer = PackedDecoder(target)
    drafter = ModelDrafter(draft, engine=draft_engine)
    if drafter._step is None:
        raise ValueError(f"bench_speculative needs a draft model the {draft_engine!r} engine "
                         f"runs")
    clock = _StepClock(process_time if cpu_time else perf_counter)
    clock.wrap(plain, "step", "target step")
    clock.wrap(drafter, "_step", "draft step")
    clock.wrap(scorer, "step", "scoring pass")
    runs_of = {"": (prompt, new_tokens)}
    if lookup_prompt is not None:
        runs_of["lookup "] = (lookup_prompt, n_lookup)
    fns, expect = {}, {}
    for tag, (pr, n) in runs_of.items():
        ids = torch.tensor([pr])
        expect[tag] = generate_packed(target, ids, n, plain)[0]
        fns[f"{tag}target"] = lambda ids=ids, n=n: generate_packed(target, ids, n, plain)
    params = SamplingParams(temperature=0, max_new_tokens=new_tokens)
    for k in ks:
        fns[f"k={k}"] = lambda k=k: speculative_generate(target, drafter, prompt, k, params,
                                                         scorer=scorer)
    if sample_temperature is not None:
        sparams = SamplingParams(temperature=sample_temperature, max_new_tokens=new_tokens,
                                 seed=seed)
        fns["sampled target"] = lambda: sample_packed(target, prompt, plain, sparams)
        fns["sampled"] = lambda: speculative_generate(target, drafter, prompt, sample_k, sparams,
                                                      scorer=scorer)
    if lookup_prompt is not None:
        looker = PromptLookupDrafter(target.config.vocab_size)
        lparams = SamplingParams(temperature=0, max_new_tokens=n_lookup)
        fns["lookup"] = lambda: speculative_generate(target, looker, lookup_prompt, lookup_k,
                                                     lparams, scorer=scorer)
    # the bandwidth scale of a plain target step: one step's bytes read once per token
    per_step = step_bytes(plain, len(prompt) + new_tokens / 2)["bytes_per_step"]
    fns["read"] = reader(per_step, new_tokens)
    fns = {name: clock.labelled(name, fn) for name, fn in fns.items()}
    runs = {name: fn() for name, fn in fns.items()}     # also the warm-up round
    clock.seconds.clear(), clock.calls.clear()
    times = (cpu_time_interleaved if cpu_time else time_interleaved)(fns, warmup=0,
                                                                      repeats=repeats)
    t_step = clock.mean("target", "target step")
    drafts = [(clock.seconds[(f"k={k}", "draft step")], clock.calls[(f"k={k}", "draft step")])
              for k in ks]
    c = sum(s for s, _ in drafts) / sum(n for _, n in drafts) / t_step
    base = median(times["target"])
    rows = []
    for k in ks:
        out, stats = runs[f"k={k}"]
        v = clock.mean(f"k={k}", "scoring pass") / t_step
        rows.append({"drafter": "draft-model", "k": k, "alpha": stats.alpha,
                     "tokens_per_step": stats.tokens_per_step,
                     "drafts_per_step": list(stats.proposed_per_step),
                     "c": clock.mean(f"k={k}", "draft step") / t_step, "verify_cost": v,
                     "speedup": base / median(times[f"k={k}"]),
                     "target_calls": stats.steps + (len(prompt) > 1),
                     "exact_greedy": out == expect[""]})
        if predict:
            rows[-1].update(predicted_tokens_per_step=stats.predicted_tokens_per_step(),
                            predicted_speedup=expected_speedup(stats.alpha, k, c, v))
    best = max(rows, key=lambda r: r["speedup"])
    result = {**best, "c": c, "new_tokens": new_tokens, "prompt_tokens": len(prompt),
              "target_tok_s": new_tokens / base, "target_step_ms": 1e3 * t_step,
              "threads": torch.get_num_threads(), "clock": "cpu" if cpu_time else "wall",
              "draft_engine": drafter.engine,
              "scorer": scorer.layout}
    scale = bandwidth_report(per_step, new_tokens, median(times["read"]),
                             {"target_step": 1 / t_step, "speculative": best["speedup"] *
                              new_tokens / base})
    result.update({"target_bytes_per_token": scale["bytes_per_token"],
                   "read_gb_s": scale["read_gb_s"], "limit_tok_s": scale["limit_tok_s"],
                   "target_step_bandwidth_fraction": scale["target_step_bandwidth_fraction"],
                   # above 1: more tokens per second than reading the weights once per token allows
                   "speculative_vs_limit": scale["speculative_bandwidth_fraction"]})
    if sample_temperature is not None:
        out, stats = runs["sampled"]
        rows.append({"drafter": "draft-model", "k": sample_k, "temperature": sample_temperature,
                     "alpha": stats.alpha, "tokens_per_step": stats.tokens_per_step,
                     "drafts_per_step": list(stats.proposed_per_step),
                     **({"predicted_tokens_per_step": stats.predicted_tokens_per_step()}
                        if predict else {}),
                     "c": clock.mean("sampled", "draft step") / t_step,
                     "verify_cost": clock.mean("sampled", "scoring pass") / t_step,
                     "speedup": median(times["sampled target"]) / median(times["sampled"]),
                     "target_calls": stats.steps + (len(prompt) > 1)})
        result.update({"sampled_speedup": rows[-1]["speedup"], "sampled_alpha": stats.alpha,
                       "sample_temperature": sample_temperature})
    if lookup_prompt is not None:
        out, stats = runs["lookup"]
        rows.append(_lookup_row(lookup_k, out, stats, expect["lookup "], lookup_prompt,
                                clock.mean("lookup", "scoring pass") /
                                clock.mean("lookup target", "target step"),
                                median(times["lookup target"]) / median(times["lookup"]),
                                predict))
    # sampled runs are exact in distribution (tests/test_speculative.py), not token by token
    result["exact_greedy"] = all(r["exact_greedy"] for r in rows if "exact_greedy" in r)
    result["runs"] = rows
    return result


def _lookup_row(k, out, stats, expect, prompt, verify_cost, speedup, predict) -> dict:
    row = {"drafter": "prompt-lookup", "k": k, "alpha": stats.alpha,
           "tokens_per_step": stats.tokens_per_step,
           "drafts_per_step": list(stats.proposed_per_step), "c": 0.0,
           "verify_cost": verify_cost, "speedup": speedup,
           "target_calls": stats.steps + (len(prompt) > 1), "prompt_tokens": len(prompt),
           "new_tokens": len(expect), "exact_greedy": out == expect}
    if predict:
        row["predicted_tokens_per_step"] = stats.predicted_tokens_per_step()
    return row


def bench_prompt_lookup(target, prompt: list[int], k: int = 6, new_tokens: int = 96,
                        repeats: int = 3, cpu_time: bool = False, lookup=None,
                        ngram: int = 3) -> dict:
    """Greedy prompt-lookup drafting against the target alone on `prompt`, timed interleaved:
    `bench_speculative`'s prompt-lookup row (without the prediction), measured on its own.
    `lookup(context, k, ngram)` proposes the drafts (default `prompt_lookup`; lab 05 passes the
    student's). Both sides step with one packed decoder of the target (`default_scorer`); v is
    a scoring pass over a plain step, both timed inside the runs; `cpu_time` as in
    `bench_speculative`."""
    if k < 1 or new_tokens < 1 or repeats < 1:
        raise ValueError(f"need k, new_tokens and repeats >= 1, got {k}, {new_tokens}, {repeats}")
    plain = PackedDecoder(target)
    clock = _StepClock(process_time if cpu_time else perf_counter)
    clock.wrap(plain, "step", "step")
    ids = torch.tensor([list(prompt)])
    drafter = PromptLookupDrafter(target.config.vocab_size, ngram, lookup)
    params = SamplingParams(temperature=0, max_new_tokens=new_tokens)
    fns = {"target": lambda: generate_packed(target, ids, new_tokens, plain),
           "lookup": lambda: speculative_generate(target, drafter, list(prompt), k, params,
                                                  scorer=plain)}
    fns = {name: clock.labelled(name, fn) for name, fn in fns.items()}
    runs = {name: fn() for name, fn in fns.items()}     # also the warm-up round
    clock.seconds.clear(), clock.calls.clear()
    times = (cpu_time_interleaved if cpu_time else time_interleaved)(fns, warmup=0,
                                                                      repeats=repeats)
    out, stats = runs["lookup"]
    return {**_lookup_row(k, out, stats, runs["target"][0], prompt,
                          clock.mean("lookup", "step") / clock.mean("target", "step"),
                          median(times["target"]) / median(times["lookup"]), False),
            "clock": "cpu" if cpu_time else "wall"}
