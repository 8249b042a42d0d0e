"""Speculative sampling: a cheap drafter guesses k tokens, the target checks them in one pass.

Notation (the lecture's, after Chen et al. 2023): **q is the target's distribution, p the draft's**.
In code the names say it: `q_target`, `p_draft`.

A decode step of the target is memory-bound on a GPU: scoring k + 1 positions in one forward
costs about the same as scoring one (the weights are read once either way). So let a small draft
model propose k tokens x_1..x_k (k cheap steps), run the target once over all of them, and keep a
prefix (Leviathan et al. 2023; Chen et al. 2023):

    for i = 1..k:  accept x_i with probability min(1, q(x_i) / p(x_i))
                   on the first rejection: sample from normalize(max(0, q - p)) and stop
    all accepted:  sample one bonus token from the target's distribution after x_k

The accepted-or-resampled token is distributed exactly as q: with beta = sum_y min(q(y), p(y)),
P(x) = p(x) min(1, q(x)/p(x)) + (1 - beta) (q(x) - p(x))^+ / (1 - beta) = min(p, q) + (q - p)^+
= q(x). So the output has the *target's* distribution, whatever the drafter does; a good drafter
only makes it faster. At temperature 0 both distributions are one-hot and this is "accept while
the argmaxes agree": token-identical to the target's greedy output.

With acceptance rate alpha (per judged draft token, assumed independent), a step yields on
average (1 - alpha^(k+1)) / (1 - alpha) tokens and costs k draft steps plus one target pass; with
c = draft step cost / target step cost, the expected speed-up is
(1 - alpha^(k+1)) / ((1 - alpha)(k c + 1)). The "+ 1" assumes that scoring k + 1 tokens costs one
step; where a step is not deeply memory-bound (a CPU core, a tiny model) it costs v_{k+1} > 1
steps, and the speed-up is tokens / (k c + v_{k+1}) -- `minillm.bench.speculative` measures v too.

Both models keep KV caches (minillm.kvcache.KVCache); rejected positions are rolled back with
`truncate`. Drafters: `ModelDrafter` (a small model) and `PromptLookupDrafter` (no model: copy
the tokens that followed the last occurrence of the current n-gram -- prompt lookup / n-gram
drafting, which shines on repetitive text such as code edits or quoting the prompt).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .decode import PackedDecoder
from .generate import as_prompt_batch, check_fits, check_vocab
from .kvcache import KVCache
from .sampling import SamplingParams, probabilities


# --- the formulas ---------------------------------------------------------------------------------
def expected_tokens_per_step(alpha: float, k: int) -> float:
    """E[tokens per target pass] = 1 + alpha + ... + alpha^k = (1 - alpha^(k+1)) / (1 - alpha)."""
    if not 0 <= alpha <= 1 or k < 0:
        raise ValueError(f"need 0 <= alpha <= 1 and k >= 0, got alpha={alpha}, k={k}")
    return float(k + 1) if alpha == 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


def expected_speedup(alpha: float, k: int, c: float, verify_cost: float = 1.0) -> float:
    """Tokens per unit of target-step time: tokens per step / (k c + verify_cost).
    c = draft step / target step; verify_cost = one pass over k + 1 tokens / one target step
    (1 in the lecture's memory-bound picture)."""
    if c < 0 or verify_cost <= 0:
        raise ValueError(f"need c >= 0 and verify_cost > 0, got c={c}, "
                         f"verify_cost={verify_cost}")
    return expected_tokens_per_step(alpha, k) / (k * c + verify_cost)


# --- the acceptance rule --------------------------------------------------------------------------
def residual_distribution(q_target: torch.Tensor, p_draft: torch.Tensor) -> torch.Tensor:
    """normalize(max(0, q - p)) over the last dimension: where to sample after rejecting a draft
    token. (If q == p the residual is empty -- a rejection then has probability 0 -- return q.)"""
    r = (q_target - p_draft).clamp(min=0)
    total = r.sum(-1, keepdim=True)
    return torch.where(total > 0, r / total.clamp(min=1e-30), q_target)


def verify(q_target: torch.Tensor, p_draft: torch.Tensor, draft: list[int],
           generator: torch.Generator | None = None) -> tuple[int, int]:
    """The acceptance rule. q_target [k+1, V]: the target's distributions at the k draft
    positions and after them; p_draft [k, V]: the draft's; draft: the k proposed tokens.
    Returns (number accepted n, the token that follows them: resampled or bonus)."""
    k = len(draft)
    for i, x in enumerate(draft):
        u = torch.rand((), generator=generator).item()
        qx, px = q_target[i, x].item(), p_draft[i, x].item()
        if px > 0 and u < min(1.0, qx / px):
            continue
        return i, int(torch.multinomial(residual_distribution(q_target[i], p_draft[i]), 1,
                                        generator=generator))
    return k, int(torch.multinomial(q_target[k], 1, generator=generator))


def verify_greedy(target_argmax: list[int], draft: list[int]) -> tuple[int, int]:
    """verify() at temperature 0, where q and p are one-hot: accept while the draft token is the
    target's argmax; the next token is the target's argmax at the first mismatch (or the bonus)."""
    n = 0
    while n < len(draft) and draft[n] == target_argmax[n]:
        n += 1
    return n, target_argmax[n]


# --- drafters -------------------------------------------------------------------------------------
class ModelDrafter:
    """Proposes k tokens by running a small model autoregressively (with its own KV cache).

    The draft's cost per token is what the speed-up hinges on (c in the formula), so its steps
    use the packed decode step (minillm.decode.packed) when the model allows it. Its cache holds a
    prefix of the context; `propose` first feeds every context token it does not hold yet, in one
    pass (usually 1 token; 2 after a step whose drafts were all accepted: the last draft token and
    the bonus), then drafts.
    """

    ENGINES = ("packed", "compiled-int8", "forward")

    def __init__(self, model, engine: str = "packed"):
        if engine not in self.ENGINES:
            raise ValueError(f"draft engine must be one of {self.ENGINES}, got {engine!r}")
        self.model = model
        self.cache = None
        self._step = None
        self._one_token = False          # the step takes one token at a time
        if engine == "packed":
            try:
                self._step = PackedDecoder(model).step
            except ValueError:          # attention variants: fall back to the plain forward
                self._step = None
        elif engine == "compiled-int8":
            from .decode import CompiledDecoder
            from .quant import quantize_model
            # int8 weights (one scale per row, the LM head too): a quarter of the fp32 bytes the
            # draft reads per step, in one compiled function instead of ~20 ops per layer
            self._step = CompiledDecoder(quantize_model(model, "int8", skip=())).step
            self._one_token = True
        self.engine = engine if self._step is not None else "forward"

    def _logits(self, tokens: list[int]) -> torch.Tensor:
        """Feed tokens (appended to the cache); logits after the last one [V]."""
        ids = torch.tensor([tokens])
        if self._one_token:
            for t in ids[0].split(1):
                logits = self._step(t, self.cache)
            return logits[-1]
        if self._step is not None:
            return self._step(ids[0] if len(tokens) == 1 else ids, self.cache).reshape(
                len(tokens), -1)[-1]
        return self.model(ids, cache=self.cache)[0, -1]

    def start(self, prompt: torch.Tensor, max_len: int) -> None:
        """Prefill all but the last prompt token (the first `propose` feeds it). The prefill runs
        the fp32 model also for the "compiled-int8" engine, whose steps then append keys and values
        of its int8 copy: a draft's cache only has to be close (the target checks every token)."""
        self.cache = KVCache.for_model(self.model, 1, max_len)
        if prompt.shape[1] > 1:
            self.model(prompt[:, :-1], cache=self.cache)

    def propose(self, context: list[int], k: int, params: SamplingParams,
                generator=None) -> tuple[list[int], torch.Tensor | None]:
        """k draft tokens after `context` and their draft distributions p [k, V] (None at
        temperature 0, where p is one-hot on the tokens and nobody needs it)."""
        greedy = params.temperature == 0
        tokens, ps = [], []
        feed = context[self.cache.seq_len:]
        for _ in range(k):
            logits = self._logits(feed)
            if greedy:
                nxt = int(logits.argmax())
            else:
                p = probabilities(logits.float(), params.temperature, params.top_k, params.top_p)
                nxt = int(torch.multinomial(p, 1, generator=generator))
                ps.append(p)
            tokens.append(nxt)
            feed = [nxt]
        return tokens, (None if greedy else torch.stack(ps))

    def accept(self, n_context: int, draft: list[int], n: int) -> None:
        """Keep the context and the n accepted draft tokens (at most what the cache holds: the
        last draft token was never fed; the next `propose` feeds it)."""
        self.cache.truncate(min(self.cache.seq_len, n_context + n))


def prompt_lookup(context: list[int], k: int, ngram: int = 3) -> list[int]:
    """Draft-free proposal: find the most recent earlier occurrence of the last `ngram` tokens of
    the context (or, failing that, of the last ngram - 1, ..., 1 tokens) and return the up to k
    tokens that followed it; [] if even the last token never occurred before."""
    if ngram < 1 or k < 0:
        raise ValueError(f"need ngram >= 1 and k >= 0, got ngram={ngram}, k={k}")
    for n in range(min(ngram, len(context) - 1), 0, -1):
        tail = context[-n:]
        for s in range(len(context) - n - 1, -1, -1):      # most recent match first
            if context[s:s + n] == tail:
                return context[s + n:s + n + k]
    return []


class PromptLookupDrafter:
    """Draft-free: propose what followed the latest earlier occurrence of the current n-gram
    (`lookup(context, k, ngram)`, by default `prompt_lookup`); p is one-hot on the proposal (a
    deterministic guess)."""

    def __init__(self, vocab_size: int, ngram: int = 3, lookup=None):
        if ngram < 1:
            raise ValueError(f"ngram must be >= 1, got {ngram}")
        self.vocab_size, self.ngram, self._lookup = vocab_size, ngram, lookup

    def start(self, prompt, max_len):
        pass

    def lookup(self, context: list[int], k: int) -> list[int]:
        found = (self._lookup or prompt_lookup)(list(context), k, self.ngram)
        return [int(t) for t in found]

    def propose(self, context, k, params, generator=None):
        tokens = self.lookup(context, k)
        if params.temperature == 0:
            return tokens, None
        p = torch.nn.functional.one_hot(torch.tensor(tokens, dtype=torch.long),
                                        self.vocab_size).float()
        return tokens, p

    def accept(self, n_context, draft, n):
        pass


# --- the loop -------------------------------------------------------------------------------------
@dataclass
class SpecStats:
    steps: int = 0                   # target forward passes after the prefill
    proposed: int = 0                # draft tokens proposed
    accepted: int = 0                # draft tokens accepted
    rejected: int = 0                # draft tokens rejected (at most one per step)
    accepted_per_step: list[int] = field(default_factory=list)
    proposed_per_step: list[int] = field(default_factory=list)

    @property
    def alpha(self) -> float:
        """Measured acceptance rate: accepted / judged draft tokens. The target judges the drafts
        in order and stops at the first rejection, so the drafts after it are never judged (they
        are neither accepted nor rejected); counting them as rejections would bias alpha low."""
        judged = self.accepted + self.rejected
        return self.accepted / judged if judged else 0.0

    @property
    def tokens_per_step(self) -> float:
        """New tokens per target pass: the accepted drafts plus one (resampled or bonus)."""
        return (self.accepted + self.steps) / self.steps if self.steps else 0.0

    def predicted_tokens_per_step(self) -> float:
        """The formula at the measured alpha, averaged over the steps with the number of drafts
        each step really had (a prompt-lookup step may find fewer than k, or none; the last steps
        draft less to stay within the budget)."""
        if not self.proposed_per_step:
            return 0.0
        return sum(expected_tokens_per_step(self.alpha, k)
                   for k in self.proposed_per_step) / len(self.proposed_per_step)


def default_scorer(target) -> PackedDecoder | None:
    """How we score a few tokens with `target`: the packed step of lab 02 (layout "in_out"), or
    None (use target.forward) for attention variants it does not run.

    Pass the *same* decoder to the plain decode loop you compare with: on a CPU the target's fp32
    weights (49 MB) live in the shared last-level cache, and a second copy in another layout
    ([out, in], or oneDNN's blocked one) competes with the first for it (benchmarks/RESULTS.md,
    "Speculative decoding with the distilled draft")."""
    try:
        return PackedDecoder(target)
    except ValueError:
        return None


@torch.no_grad()
def speculative_generate(target, drafter, prompt, k: int = 4,
                         params: SamplingParams | None = None,
                         generator: torch.Generator | None = None,
                         scorer: PackedDecoder | None = None) -> tuple[list[int], SpecStats]:
    """Generate up to params.max_new_tokens tokens with the target's distribution.
    drafter: ModelDrafter(draft_model) or PromptLookupDrafter(vocab). Batch 1.
    scorer: a PackedDecoder of the target to reuse across calls (packing the weights costs about
    one forward pass); by default `default_scorer(target)`.
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
    greedy = params.temperature == 0
    max_len = min(ids.shape[1] + params.max_new_tokens + k + 1, target.config.max_seq_len)
    cache = KVCache.for_model(target, 1, max_len)
    scorer = scorer if scorer is not None else default_scorer(target)
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
        n_ctx = len(context) - 1                   # positions held by the target's cache
        room = target.config.max_seq_len - len(context) - 1
        kk = max(0, min(k, budget - len(out) - 1, room))
        draft, p = drafter.propose(context, kk, params, generator) if kk else ([], None)
        logits = score(torch.tensor([[context[-1]] + draft]), cache)[0]   # [len(draft) + 1, V]
        if greedy:
            n, nxt = verify_greedy(logits.argmax(-1).tolist(), draft)
        else:
            q = probabilities(logits.float(), params.temperature, params.top_k, params.top_p)
            n, nxt = verify(q, p, draft, generator) if draft else \
                (0, int(torch.multinomial(q[0], 1, generator=generator)))
        cache.truncate(n_ctx + 1 + n)              # roll back the rejected positions
        if draft:
            drafter.accept(n_ctx + 1, draft, n)
        stats.steps += 1
        stats.proposed += len(draft)
        stats.accepted += n
        stats.rejected += n < len(draft)
        stats.accepted_per_step.append(n)
        stats.proposed_per_step.append(len(draft))
        new = draft[:n] + [nxt]
        for t in new:
            if len(out) >= budget:
                break
            out.append(t)
            if t in params.stop_ids:
                return out, stats
        context.extend(new)
    return out, stats
