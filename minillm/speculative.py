"""Speculative sampling: a cheap drafter guesses k tokens, the target checks them in one pass.

A decode step of the target is memory-bound: scoring k + 1 positions in one forward costs about
the same as scoring one (the weights are read once either way). So let a small draft model
propose k tokens x_1..x_k (k cheap steps), run the target once over all of them, and keep a
prefix (Leviathan et al. 2023; Chen et al. 2023):

    for i = 1..k:  accept x_i with probability min(1, p(x_i) / q(x_i))
                   (p = target distribution, q = draft distribution at that position)
                   on the first rejection: sample from normalize(max(0, p - q)) and stop
    all accepted:  sample one bonus token from the target's distribution after x_k

The accepted-or-resampled token is distributed exactly as p: P(x) = q(x) min(1, p/q) +
(1 - sum_y min(p, q)) (p - q)^+ / sum(p - q)^+ = min(p, q) + (p - q)^+ = p(x). So the output has the
*target's* distribution, whatever the drafter does; a good drafter only makes it faster.
At temperature 0 both distributions are one-hot and this is "accept while the argmaxes agree":
token-identical to the target's greedy output.

With acceptance rate alpha (per token, assumed independent), a step yields on average
(1 - alpha^(k+1)) / (1 - alpha) tokens and costs k draft steps plus one target step; with c =
draft cost / target cost, the expected speed-up is (1 - alpha^(k+1)) / ((1 - alpha)(k c + 1)).

Both models keep KV caches (minillm.kvcache.KVCache); rejected positions are rolled back with
`truncate`. Drafters: `ModelDrafter` (a small model) and `PromptLookupDrafter` (no model: copy
the tokens that followed the last occurrence of the current n-gram -- prompt lookup / n-gram
drafting, which shines on repetitive text such as code edits or quoting the prompt).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .fast_decode import PackedDecoder
from .generate import as_prompt_batch, check_fits, check_vocab
from .kvcache import KVCache
from .sampling import SamplingParams, probabilities


def expected_tokens_per_step(alpha: float, k: int) -> float:
    """E[tokens per target pass] = 1 + alpha + ... + alpha^k = (1 - alpha^(k+1)) / (1 - alpha)."""
    if not 0 <= alpha <= 1 or k < 0:
        raise ValueError(f"need 0 <= alpha <= 1 and k >= 0, got alpha={alpha}, k={k}")
    return float(k + 1) if alpha == 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


def expected_speedup(alpha: float, k: int, c: float) -> float:
    """Tokens per unit of target-time: tokens per step / (k c + 1), c = draft/target cost."""
    if c < 0:
        raise ValueError(f"the cost ratio c must be >= 0, got {c}")
    return expected_tokens_per_step(alpha, k) / (k * c + 1)


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """normalize(max(0, p - q)): where to sample after rejecting a draft token.
    (If p == q the residual is empty -- a rejection then has probability 0 -- return p.)"""
    r = (p - q).clamp(min=0)
    total = r.sum(-1, keepdim=True)
    return torch.where(total > 0, r / total.clamp(min=1e-30), p)


def verify(p: torch.Tensor, q: torch.Tensor, draft: list[int],
           generator: torch.Generator | None = None) -> tuple[int, int]:
    """The acceptance rule. p [k+1, V] target distributions at the k draft positions and after
    them; q [k, V] draft distributions; draft: the k proposed tokens.
    Returns (number accepted n, the token that follows them: resampled or bonus)."""
    k = len(draft)
    for i, x in enumerate(draft):
        u = torch.rand((), generator=generator).item()
        px, qx = p[i, x].item(), q[i, x].item()
        if qx > 0 and u < min(1.0, px / qx):
            continue
        return i, int(torch.multinomial(residual_distribution(p[i], q[i]), 1,
                                        generator=generator))
    return k, int(torch.multinomial(p[k], 1, generator=generator))


class ModelDrafter:
    """Proposes k tokens by sampling a small model autoregressively (with its own KV cache).

    The draft's cost per token is what the speed-up hinges on (c in the formula), so its
    one-token steps use the packed decode step (minillm.fast_decode) when the model allows it.
    """

    def __init__(self, model, packed: bool = True):
        self.model = model
        self.cache = None
        self._step = None
        if packed:
            try:
                self._step = PackedDecoder(model).step
            except ValueError:          # attention variants: fall back to the plain forward
                self._step = None

    def _logits(self, token: int) -> torch.Tensor:
        if self._step is not None:
            return self._step(torch.tensor([token]), self.cache)[0]
        return self.model(torch.tensor([[token]]), cache=self.cache)[0, -1]

    def start(self, prompt: torch.Tensor, max_len: int) -> None:
        """Prefill all but the last prompt token (the loop feeds `last` itself)."""
        self.cache = KVCache.for_model(self.model, 1, max_len)
        if prompt.shape[1] > 1:
            self.model(prompt[:, :-1], cache=self.cache)

    def propose(self, context: list[int], last: int, k: int, params: SamplingParams,
                generator) -> tuple[list[int], torch.Tensor]:
        tokens, qs, nxt = [], [], last
        for _ in range(k):
            logits = self._logits(nxt)
            q = probabilities(logits.float(), params.temperature, params.top_k, params.top_p)
            nxt = int(q.argmax()) if params.temperature == 0 else \
                int(torch.multinomial(q, 1, generator=generator))
            tokens.append(nxt), qs.append(q)
        return tokens, torch.stack(qs)

    def accept(self, n_context: int, draft: list[int], n: int) -> None:
        """Keep the context plus the n accepted draft tokens in the cache."""
        if n == len(draft):          # the last draft token was sampled but never fed
            self._logits(draft[-1])
        self.cache.truncate(n_context + n)


class PromptLookupDrafter:
    """Draft-free: find the most recent earlier occurrence of the last `ngram` tokens and propose
    the k tokens that followed it (q is one-hot: a deterministic proposal)."""

    def __init__(self, vocab_size: int, ngram: int = 3):
        if ngram < 1:
            raise ValueError(f"ngram must be >= 1, got {ngram}")
        self.vocab_size, self.ngram = vocab_size, ngram

    def start(self, prompt, max_len):
        pass

    def lookup(self, context: list[int], k: int) -> list[int]:
        for n in range(min(self.ngram, len(context) - 1), 0, -1):
            tail = context[-n:]
            for s in range(len(context) - n - 1, -1, -1):      # most recent match first
                if context[s:s + n] == tail:
                    return context[s + n:s + n + k]
        return []

    def propose(self, context, last, k, params, generator):
        tokens = self.lookup(context, k)
        q = torch.nn.functional.one_hot(torch.tensor(tokens, dtype=torch.long),
                                        self.vocab_size).float()
        return tokens, q

    def accept(self, n_context, draft, n):
        pass


@dataclass
class SpecStats:
    steps: int = 0                   # target forward passes after the prefill
    proposed: int = 0
    accepted: int = 0
    accepted_per_step: list[int] = field(default_factory=list)

    @property
    def alpha(self) -> float:
        """Measured acceptance rate: accepted / proposed draft tokens."""
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def tokens_per_step(self) -> float:
        return (self.accepted + self.steps) / self.steps if self.steps else 0.0


@torch.no_grad()
def speculative_generate(target, drafter, prompt, k: int = 4,
                         params: SamplingParams | None = None,
                         generator: torch.Generator | None = None,
                         scorer: PackedDecoder | None = None) -> tuple[list[int], SpecStats]:
    """Generate up to params.max_new_tokens tokens with the target's distribution.
    drafter: ModelDrafter(draft_model) or PromptLookupDrafter(vocab). Batch 1.
    scorer: a PackedDecoder(target, layout="out_in") to reuse across calls (packing the weights
    costs about one forward pass); by default one is built when the target allows it.
    Returns (new token ids, statistics)."""
    params = params or SamplingParams()
    if k < 1:
        raise ValueError(f"k (draft tokens per step) must be >= 1, got {k}")
    ids = as_prompt_batch(prompt)
    if ids.shape[0] != 1:
        raise ValueError(f"speculative_generate decodes one sequence; got batch {ids.shape[0]}")
    check_vocab(target, ids)
    check_fits(target, ids.shape[1], params.max_new_tokens)
    if generator is None and params.seed is not None:
        generator = torch.Generator().manual_seed(params.seed)
    max_len = ids.shape[1] + params.max_new_tokens + k + 1
    max_len = min(max_len, target.config.max_seq_len)
    cache = KVCache.for_model(target, 1, max_len)
    if scorer is None:
        try:                # score the drafts with the packed step when the model allows it
            scorer = PackedDecoder(target, layout="out_in")
        except ValueError:
            pass
    score = scorer.step if scorer is not None else \
        (lambda feed, cache: target(feed, cache=cache))
    drafter.start(ids, max_len)
    context = ids[0].tolist()
    if len(context) > 1:
        target(ids[:, :-1], cache=cache)          # caches hold everything but the last token
    out: list[int] = []
    stats = SpecStats()
    budget = params.max_new_tokens
    while len(out) < budget:
        n_ctx = len(context) - 1                   # positions held by the caches
        room = target.config.max_seq_len - len(context) - 1
        kk = max(0, min(k, budget - len(out) - 1, room))
        draft, q = drafter.propose(context, context[-1], kk, params, generator) if kk else \
            ([], torch.zeros(0, target.config.vocab_size))
        feed = torch.tensor([[context[-1]] + draft])
        logits = score(feed, cache)[0].float()                        # [len(draft) + 1, V]
        p = probabilities(logits, params.temperature, params.top_k, params.top_p)
        if params.temperature == 0:
            n = 0
            while n < len(draft) and draft[n] == int(p[n].argmax()):
                n += 1
            nxt = int(p[n].argmax())
        else:
            n, nxt = verify(p, q, draft, generator)
        cache.truncate(n_ctx + 1 + n)
        if draft:
            drafter.accept(n_ctx + 1, draft, n)
        stats.steps += 1
        stats.proposed += len(draft)
        stats.accepted += n
        stats.accepted_per_step.append(n)
        new = draft[:n] + [nxt]
        for t in new:
            if len(out) >= budget:
                break
            out.append(t)
            if t in params.stop_ids:
                return out, stats
        context.extend(new)
    return out, stats


def bench_speculative(target, draft, prompt: list[int], ks=(1, 2, 3, 4, 6), new_tokens: int = 128,
                      repeats: int = 3, lookup: bool = True) -> dict:
    """Greedy speculative decoding vs the target alone, timed interleaved in one run.

    The baseline is the target's fastest plain decoder (KV cache + packed step), so the speed-up
    is what speculation adds on top of lab 02's optimisations. Also measures the cost ratio c
    (draft step / target step) and, with `lookup`, prompt-lookup drafting at the best k.
    """
    from .bench import median, time_interleaved
    from .fast_decode import generate_packed
    if new_tokens < 1 or repeats < 1 or not ks or min(ks) < 1:
        raise ValueError("need new_tokens >= 1, repeats >= 1 and every k >= 1")
    params = SamplingParams(temperature=0, max_new_tokens=new_tokens)
    ids = torch.tensor([prompt])
    plain = PackedDecoder(target)                       # weights packed once, outside the timing
    scorer, drafter = PackedDecoder(target, layout="out_in"), ModelDrafter(draft)
    looker = PromptLookupDrafter(target.config.vocab_size)
    expect = generate_packed(target, ids, new_tokens, plain)[0]
    fns = {"target": lambda: generate_packed(target, ids, new_tokens, plain)}
    runs = {}
    for k in ks:
        fns[f"k={k}"] = lambda k=k: speculative_generate(target, drafter, prompt, k, params,
                                                         scorer=scorer)
    if lookup:
        fns["lookup"] = lambda: speculative_generate(target, looker, prompt, max(ks), params,
                                                     scorer=scorer)
    for name, fn in fns.items():
        runs[name] = fn()
    times = time_interleaved(fns, warmup=0, repeats=repeats)
    # cost ratio c: one packed decode step of each model at the same context length
    steps = {}
    for name, m in (("target", target), ("draft", draft)):
        dec, cache = PackedDecoder(m), KVCache.for_model(m, 1, len(prompt) + 1)
        m(ids, cache=cache)

        def one(dec=dec, cache=cache, n=len(prompt)):
            dec.step(ids[:, -1], cache)
            cache.truncate(n)
        steps[name] = one
    st = time_interleaved(steps, warmup=3, repeats=31)
    c = median(st["draft"]) / median(st["target"])
    base = median(times["target"])
    rows = []
    for name in fns:
        if name == "target":
            continue
        out, stats = runs[name]
        k = max(ks) if name == "lookup" else int(name[2:])
        rows.append({"drafter": "prompt-lookup" if name == "lookup" else "draft-model", "k": k,
                     "alpha": stats.alpha, "tokens_per_step": stats.tokens_per_step,
                     "predicted_tokens_per_step": expected_tokens_per_step(stats.alpha, k),
                     "speedup": base / median(times[name]), "exact_greedy": out == expect})
    model_rows = [r for r in rows if r["drafter"] == "draft-model"]
    best = max(model_rows, key=lambda r: r["speedup"])
    return {**best, "c": c, "new_tokens": new_tokens, "prompt_tokens": len(prompt),
            "target_tok_s": new_tokens / base, "threads": torch.get_num_threads(),
            "exact_greedy": all(r["exact_greedy"] for r in rows), "runs": rows}
