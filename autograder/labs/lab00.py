"""Lab 00: probes run the student's `generate` on a fresh shipped model; the speed check times it
after a LONG and a SHORT prompt, paired with the exact count of `counted_generate`; the recipe
check samples with the student's sampling recipe (KV-cached, seeded) and scores the texts in the
tester: likely under the target, and not repeating itself."""
from __future__ import annotations

import torch

from autograder.labs import args_after, context_ids, counted_generate
from autograder.labs.speedcheck import SpeedCheck, one_torch_thread
from autograder.probes import fresh_model, probe, working_model
from autograder.timing import time_ratio

SHORT, LONG, NEW_TOKENS = 16, 256, 2     # prompt tokens of the fast and slow run; new tokens
# required time(LONG) / time(SHORT): a loop that feeds only the last tokens measures about 1x
THRESHOLD = 2.0
WARMUP, REPEATS = 1, 5


@probe
def generate_tokens(generate, prompt_ids, max_new_tokens, *args, **kwargs):
    return generate(fresh_model(), prompt_ids, max_new_tokens, *args, **kwargs)


@probe
def timed_generate(generate, prompt_len: int, new_tokens: int, seed: int) -> None:
    model = working_model()
    with torch.no_grad(), one_torch_thread():
        generate(model, context_ids(model.config.vocab_size, prompt_len, seed)[0].tolist(),
                 new_tokens, temperature=0)


def step_growth_ratio(generate_fn, *, short: int, long: int, new_tokens: int,
                      warmup: int = WARMUP, repeats: int = REPEATS):
    """.ratio = median(time after a `long`-token prompt) / median(after `short`), interleaved."""
    return time_ratio(lambda: timed_generate(generate_fn, long, new_tokens, 1),
                      lambda: timed_generate(generate_fn, short, new_tokens, 2),
                      warmup=warmup, repeats=repeats)


def reference_generate(model, prompt_ids, max_new_tokens, temperature=1.0, top_k=0, top_p=1.0,
                       generator=None, stop_ids=()):
    from minillm.generate import generate_naive
    from minillm.sampling import SamplingParams
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p,
                            max_new_tokens=max_new_tokens, stop_ids=tuple(stop_ids))
    return generate_naive(model, [list(prompt_ids)], params, generator)[0]


def windowed_generate(model, prompt_ids, max_new_tokens, temperature=1.0, top_k=0, top_p=1.0,
                      generator=None, stop_ids=(), window: int = 8):
    """The counter-example: feeds the model only the last `window` tokens."""
    ids = list(prompt_ids)
    new: list[int] = []
    for _ in range(max_new_tokens):
        nxt = int(model(torch.tensor([ids[-window:]]), last_only=True)[0, -1].argmax())
        new.append(nxt)
        if nxt in stop_ids:
            break
        ids.append(nxt)
    return new


SPEED_CHECK = SpeedCheck(
    grade_id="00_speed_test", threshold=THRESHOLD, measure=step_growth_ratio,
    reference=reference_generate, counter_example=windowed_generate,
    workload=dict(short=SHORT, long=LONG, new_tokens=NEW_TOKENS),
    solution=("generate", "00_sample_next", "00_generate", "00_apply_temperature",
              "00_top_k_filter", "00_top_p_filter"),
    hint="generating {new_tokens} tokens after a {long}-token prompt took only {ratio:.2f}x as "
         "long as after a {short}-token prompt (median {baseline_ms:.3g} ms vs {candidate_ms:.3g} "
         "ms over {runs} interleaved runs); a loop that runs the whole sequence through the model "
         "at every step takes at least {at_least:g}x as long. Does your generate feed the model "
         "the whole prefix each step?")
check_step_growth = SPEED_CHECK.check

# The sampling-recipe task: RECIPE_TEXTS prompts of RECIPE_PROMPT tokens cut from the held-out
# split, RECIPE_NEW new tokens each, drawn from softmax(recipe(logits, ids)) with a seeded
# generator. Graded over the seeds' texts together: mean negative log-likelihood of the new
# tokens under the target (nats/token) at most RECIPE_MAX_NLL, and mean distinct-2 (distinct
# bigrams / bigrams of a text's new tokens) at least RECIPE_MIN_DISTINCT.
RECIPE_TEXTS, RECIPE_PROMPT, RECIPE_NEW = 16, 16, 48
RECIPE_MAX_NLL, RECIPE_MIN_DISTINCT = 3.0, 0.85


def recipe_prompts(seed: int, texts: int = RECIPE_TEXTS, length: int = RECIPE_PROMPT) -> list:
    """`texts` prompts of `length` tokens from the held-out split, at offsets drawn from `seed`
    (each cut from 400 characters, starting after the window's first token)."""
    import minillm
    from minillm.data import load_text
    tok, text = minillm.load_tokenizer("target"), load_text("val")
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(text) - 400, (texts,), generator=g).tolist()
    return [tok.encode(text[s:s + 400])[1:1 + length] for s in starts]


@probe
def recipe_samples(recipe, prompts, new_tokens: int, seed: int) -> list:
    """New tokens for each prompt (equal lengths), drawn from softmax(recipe(logits, ids)) one
    token at a time with a KV cache and torch.multinomial seeded with `seed`: logits [B, V]
    float32 of the next token, ids [B, T] the tokens so far (prompt and new ones)."""
    from minillm.kvcache import KVCache
    model = fresh_model()
    ids = torch.tensor(prompts, dtype=torch.long)
    g = torch.Generator().manual_seed(seed)
    cache = KVCache.for_model(model, ids.shape[0], ids.shape[1] + new_tokens)
    with torch.no_grad(), one_torch_thread():
        logits = model(ids, cache=cache, last_only=True)[:, -1]
        for step in range(new_tokens):
            z = recipe(logits.float().clone(), ids.clone())
            if not isinstance(z, torch.Tensor) or tuple(z.shape) != tuple(logits.shape):
                raise ValueError(f"the recipe must return logits of shape {tuple(logits.shape)}, "
                                 f"got {type(z).__name__} {tuple(getattr(z, 'shape', ()))}")
            probs = torch.softmax(z.float(), dim=-1)
            if not bool(torch.isfinite(probs).all()):
                raise ValueError("softmax of the recipe's logits is not a distribution (NaN, or a "
                                 "row with every token at -inf): keep at least one token per row")
            nxt = torch.multinomial(probs, 1, generator=g)          # [B, 1]
            ids = torch.cat([ids, nxt], dim=1)
            if step < new_tokens - 1:
                logits = model(nxt, cache=cache)[:, -1]
    return ids[:, -new_tokens:].tolist()


def distinct_2(tokens) -> float:
    """Distinct bigrams / bigrams of one text (1.0: no bigram repeats)."""
    pairs = list(zip(tokens, tokens[1:]))
    return len(set(pairs)) / len(pairs)


@torch.no_grad()
def recipe_scores(prompts, samples) -> dict:
    """{"nll": mean negative log-likelihood of the new tokens under the shipped target
    (nats/token), "distinct": mean distinct-2 of the texts}."""
    from autograder.probes import shipped_model
    if len(samples) != len(prompts) or any(len(s) != RECIPE_NEW for s in samples):
        raise ValueError(f"expected {len(prompts)} texts of {RECIPE_NEW} new tokens")
    full = torch.tensor([list(p) + list(s) for p, s in zip(prompts, samples)])
    vocab = shipped_model().config.vocab_size
    if int(full.min()) < 0 or int(full.max()) >= vocab:
        raise ValueError(f"token ids outside [0, {vocab})")
    with one_torch_thread():
        logp = shipped_model()(full[:, :-1]).float().log_softmax(-1)[:, len(prompts[0]) - 1:]
    nll = -logp.gather(-1, full[:, len(prompts[0]):, None])[..., 0]
    return {"nll": float(nll.mean()), "distinct": sum(map(distinct_2, samples)) / len(samples)}


def recipe_outcome(recipe, seeds) -> dict:
    """The recipe's texts on the seeds' prompts, scored together: {"nll", "distinct",
    "samples": the first seed's texts}."""
    prompts, samples = [], []
    for seed in seeds:
        p = recipe_prompts(seed)
        prompts += p
        samples += recipe_samples(recipe, p, RECIPE_NEW, seed)
    return recipe_scores(prompts, samples) | {"samples": samples[:RECIPE_TEXTS]}


def check_recipe(recipe, seeds) -> dict:
    """Print the thresholds and the recipe's figures, then assert the outcome rule."""
    out = recipe_outcome(recipe, seeds)
    print(f"{len(seeds) * RECIPE_TEXTS} texts of {RECIPE_NEW} tokens: mean NLL under the target "
          f"{out['nll']:.2f} nats/token (at most {RECIPE_MAX_NLL:.1f}), mean distinct-2 "
          f"{out['distinct']:.3f} (at least {RECIPE_MIN_DISTINCT:g})")
    assert out["nll"] <= RECIPE_MAX_NLL, (
        f"the target finds your texts unlikely: {out['nll']:.2f} nats/token, more than "
        f"{RECIPE_MAX_NLL:g}. Which tokens does your recipe still let through?")
    assert out["distinct"] >= RECIPE_MIN_DISTINCT, (
        f"your texts repeat themselves: distinct-2 {out['distinct']:.3f}, under "
        f"{RECIPE_MIN_DISTINCT:g}. Does your recipe leave the model enough choice?")
    return out


__all__ = ["generate_tokens", "counted_generate", "args_after", "timed_generate", "check_step_growth",
           "recipe_prompts", "recipe_samples", "recipe_scores", "recipe_outcome", "check_recipe"]
