"""Lab 03: probes build the lab's layers and models from seeds (the same wherever built); the
speed check times MLA's absorbed decode step against the naive one; the design task's judge
builds a student's cache design with the course's converters and measures its bytes and
perplexity in the tester."""
from __future__ import annotations

import copy
import dataclasses
import functools

import torch

from autograder import labs
from autograder.checks import assert_close
from autograder.labs import args_after
from autograder.labs.speedcheck import SpeedCheck, one_torch_thread
from autograder.probes import fresh_model, probe, shipped_model
from autograder.timing import time_ratio
from minillm.attention import to_cla, to_gqa, to_mla, to_sliding
from minillm.attention.mla import MLAAttention
from minillm.config import ModelConfig
from minillm.kvcache import KVCache, KVSpec, layer_specs
from minillm.kvquant import Int8KVCache, with_kv_cache
from minillm.roofline import Hardware

N_HEADS, HEAD_DIM, ROPE_DIM, DIM = 6, 64, 32, 384     # the shipped target's attention shape
SHAPE = dict(dim=DIM, n_heads=N_HEADS, head_dim=HEAD_DIM)
LATENT = 224        # C: C + R = 256 values per token per layer, the cache of GQA with K = 2
SEQ = 4096          # cached positions S
# time(naive) / time(absorbed), loaded 2-core, in the tester: the library 4.74-5.64, the solution
# 5.73-7.81, the naive step 0.92-1.03 (a half-absorbed one may pass: the counts are graded too)
THRESHOLD = 1.5
WARMUP, REPEATS = 2, 7


random_model = functools.partial(labs.random_model, std=0.2)


def variant(steps=(), seed: int | None = None, config: dict | None = None):
    """The shipped (or a random) model converted by ("sliding" | "cla" | "mla", *args) steps."""
    model = fresh_model() if config is None else random_model(seed, config)
    for name, *args in steps:
        model = {"sliding": to_sliding, "cla": to_cla, "mla": to_mla}[name](model, *args)
    return model


@functools.cache
def _mla_model(latent: int, rope: int):
    return variant([("mla", latent, rope)])


def mla_layer(latent: int, rope: int = ROPE_DIM, seed: int = 0, config: dict | None = None,
              layer: int = 0):
    """A layer of to_mla(the shipped model, latent, rope), or a seeded one of config's shape."""
    if config is None:
        return copy.deepcopy(_mla_model(latent, rope).layers[layer].self_attn)
    torch.manual_seed(seed)
    return MLAAttention(ModelConfig(**config), 0, latent_dim=latent, rope_dim=rope).eval()


def step_inputs(attn, batch: int, seq: int, seed: int):
    """One decode step's seeded q_nope [B, N, H-R], q_rope [B, N, R], c [B, S, C], k_rope."""
    g = torch.Generator().manual_seed(seed)
    N, H, R, C = attn.n_heads, attn.head_dim, attn.rope_dim, attn.latent_dim
    return (torch.randn(batch, N, H - R, generator=g), torch.randn(batch, N, R, generator=g),
            torch.randn(batch, seq, C, generator=g), torch.randn(batch, seq, R, generator=g))


def make_inputs(seq: int = SEQ, latent: int = LATENT, batch: int = 1, seed: int = 0):
    """(attn, q_nope, q_rope, c, k_rope): the speed check's layer and one step's inputs."""
    attn = mla_layer(latent, seed=seed, config=SHAPE)
    return (attn, *step_inputs(attn, batch, seq, seed + 1))


def kv_bytes(kv_bytes_per_token, specs, *args, **kwargs):
    """`kv_bytes_per_token(specs, ...)` in the kernel (the KVSpecs cross as tuples)."""
    specs = [s if s is None else dataclasses.astuple(s) for s in specs]
    return _kv_bytes(kv_bytes_per_token, specs, *args, **kwargs)


@probe
def _kv_bytes(kv_bytes_per_token, specs, *args, **kwargs):
    return kv_bytes_per_token([s if s is None else KVSpec(*s) for s in specs], *args, **kwargs)


@probe
def mla_step(step, layer: dict, batch: int, seq: int, seed: int):
    attn = mla_layer(**layer)
    with torch.no_grad():
        return step(attn, *step_inputs(attn, batch, seq, seed))


def _heads(model):
    return dataclasses.astuple(model.config), [l.self_attn.n_kv_heads for l in model.layers]


@probe
def gqa_run(convert, n_kv_heads: int, ids, seed: int | None = None,
            config: dict | None = None) -> dict:
    """new = convert(model, n_kv_heads): what it is and does, whether the input is unchanged."""
    model = fresh_model() if config is None else random_model(seed, config)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    before = _heads(model)
    with torch.no_grad():
        new = convert(model, n_kv_heads)
        logits = new(ids)
    after = model.state_dict()
    return {"logits": logits, "n_kv_heads": new.config.n_kv_heads,
            "layers": [l.self_attn.n_kv_heads for l in new.layers],
            "specs": [s if s is None else dataclasses.astuple(s) for s in layer_specs(new)],
            "k_proj": new.layers[0].self_attn.k_proj.weight,
            "cache_bytes": KVCache.for_model(new, 1, new.config.max_seq_len).nbytes,
            "new": new is not model,
            "unchanged": before == _heads(model) and state.keys() == after.keys()
            and all(torch.equal(v, after[k]) for k, v in state.items())}


@probe
def cache_bytes(cache_bytes_vs_length, lengths, *args, steps=(), seed=None, config=None,
                **kwargs):
    return cache_bytes_vs_length(variant(steps, seed, config), lengths, *args, **kwargs)


@probe
def what_if(gqa_what_if, config: dict, hardware: tuple, seq_len: int, kv_heads: int):
    return gqa_what_if(ModelConfig(**config), Hardware(*hardware), seq_len, kv_heads)



# --- the design task: a cache for a budget -------------------------------------------------------
# A design is a list of steps applied in order to the shipped model: ("gqa", K), ("mla", C,
# "svd" | "mean"), ("cla", share), and last, optionally, ("int8",): the cache stores int8 codes and
# one fp16 scale per vector (minillm.kvquant). Every layer stays global: held-out perplexity over
# 512-token windows cannot see what a sliding window loses (Q5), so windows are not offered.
DESIGN_EVAL_TOKENS = 1024         # the notebook's EVAL_TOKENS: two windows of 512 held-out tokens
DESIGN_TOLERANCE = 0.05           # full marks within 5 % of the best perplexity the course found
# budget (cache bytes per token) -> the held-out ppl of the best design the course's search found:
# MHA, GQA K = 3, 2, 1, CLA share 2, 3 alone and on each GQA, MLA C = 16, 32, ... 384 with the "svd"
# key, each with and without int8 (tests/test_lab03_claims.py keeps the designs and re-measures them)
DESIGN_BEST = {800: 79.673, 1500: 78.067, 3000: 77.941, 5000: 55.485}


def _design_steps(design) -> list[tuple]:
    if not isinstance(design, (list, tuple)):
        raise ValueError(f"a design is a list of steps, got {type(design).__name__}")
    steps = []
    for step in design:
        if not isinstance(step, (list, tuple)) or not step or not isinstance(step[0], str):
            raise ValueError(f"each step is a tuple such as ('gqa', 2); got {step!r}")
        name, *args = step
        want = {"gqa": (int,), "cla": (int,), "mla": (int, str), "int8": ()}.get(name)
        if want is None:
            raise ValueError(f"unknown step {name!r}: use 'gqa', 'mla', 'cla' or 'int8'")
        if name == "mla" and len(args) == 1:
            args = [args[0], "mean"]           # to_mla's default rope key
        if len(args) != len(want) or not all(isinstance(a, t) and not isinstance(a, bool)
                                             for a, t in zip(args, want)):
            raise ValueError(f"step {step!r}: expected ({name!r}"
                             + "".join(f", <{t.__name__}>" for t in want) + ")")
        steps.append((name, *args))
    if any(s[0] == "int8" for s in steps[:-1]) or sum(s[0] == "int8" for s in steps) > 1:
        raise ValueError("('int8',) is the cache's format: at most once, as the last step")
    return steps


def build_design(design, model=None, convert_to_gqa=None):
    """(the converted model, whether its cache is int8). `convert_to_gqa` defaults to the course's
    to_gqa (the notebook hands in the student's own: to_gqa is withheld while it is graded)."""
    m = shipped_model() if model is None else model
    quantized = False
    for name, *args in _design_steps(design):
        if name == "gqa":
            m = (convert_to_gqa or to_gqa)(m, *args)
        elif name == "mla":
            m = to_mla(m, args[0], rope_key=args[1])
        elif name == "cla":
            m = to_cla(m, *args)
        else:
            quantized = True
    return m, quantized


def design_bytes(model, quantized: bool) -> float:
    """Cache bytes per token of `model`'s layout: what KVCache (bf16) or Int8KVCache (codes and
    fp16 scales) allocates for a 512-token sequence, divided by 512."""
    cache = Int8KVCache if quantized else KVCache       # (kv_bytes_per_token is withheld in lab 03)
    return cache.for_model(model, 1, 512, dtype=torch.bfloat16).nbytes / 512


def measure_design(design, model=None, convert_to_gqa=None, tokenizer=None) -> dict:
    """{"bytes_per_token", "ppl"} of a design: its cache's bytes per token and the held-out
    perplexity of the converted model on DESIGN_EVAL_TOKENS tokens, read through its cache."""
    from minillm import load_tokenizer
    from minillm.evaluate import perplexity
    m, quantized = build_design(design, model, convert_to_gqa)
    judged = with_kv_cache(m, Int8KVCache) if quantized else m
    with torch.no_grad():
        ppl = perplexity(judged, tokenizer or load_tokenizer("target"), split="val",
                         max_tokens=DESIGN_EVAL_TOKENS)["ppl"]
    return {"bytes_per_token": design_bytes(m, quantized), "ppl": ppl}


@probe
def design_for(design_fn, budget: float):
    """design_fn(budget) where the student's code runs: the design, as plain values."""
    design = design_fn(budget)
    if isinstance(design, (list, tuple)):
        return [list(s) if isinstance(s, (list, tuple)) else s for s in design]
    return design


def judge_design(design_fn, budget: float) -> dict:
    """Run the student's design_fn(budget) in the kernel; build and measure the design here (the
    tester, with the course's converters). Returns the design, its bytes and perplexity, the best
    perplexity the course found for this budget and the most that earns the points."""
    design = design_for(design_fn, budget)
    try:
        figures = measure_design(design)
    except ValueError as e:
        raise AssertionError(f"budget {budget:,} B/token: the design {design!r} cannot be built: "
                             f"{e}") from None
    best_ppl = DESIGN_BEST[budget]
    return {"design": design, **figures, "budget": budget, "best_ppl": best_ppl,
            "allowed_ppl": best_ppl * (1 + DESIGN_TOLERANCE)}


def check_design(design_fn, budget: float) -> dict:
    """The graded check of one budget: prints the outcome and the bar, then asserts both."""
    r = judge_design(design_fn, budget)
    print(f"budget {budget:,} B/token: {r['design']} caches {r['bytes_per_token']:,.0f} B/token, "
          f"held-out ppl {r['ppl']:.2f}; full marks at most {budget:,} B/token and ppl "
          f"<= {r['allowed_ppl']:.2f} (the course's best: {r['best_ppl']:.2f})")
    assert r["bytes_per_token"] <= budget, (
        f"budget {budget:,} B/token: the design caches {r['bytes_per_token']:,.0f} B/token")
    assert r["ppl"] <= r["allowed_ppl"], (
        f"budget {budget:,} B/token: held-out ppl {r['ppl']:.2f}, more than "
        f"{1 + DESIGN_TOLERANCE:.2f} x the best the course found ({r['best_ppl']:.2f}); which "
        f"other layouts fit this budget, and what did they measure?")
    return r

_kept_inputs = functools.lru_cache(maxsize=1)(make_inputs)


@probe
def timed_step(step, seq: int, latent: int, seed: int) -> None:
    with torch.no_grad(), one_torch_thread():
        step(*_kept_inputs(seq, latent, seed=seed))


def _one_step(path, q_nope, q_rope, c, k_rope):
    S = c.shape[1]
    out = path(q_nope[:, :, None], q_rope[:, :, None], c[:, None], k_rope[:, None],
               torch.tensor([S - 1]), torch.arange(S))
    return out[:, :, 0]


def library_naive(attn, q_nope, q_rope, c, k_rope):
    """MLAAttention.attend_naive in the notebook's signature: the baseline, the counter-example."""
    return _one_step(attn.attend_naive, q_nope, q_rope, c, k_rope)


def library_absorbed(attn, q_nope, q_rope, c, k_rope):
    return _one_step(attn.attend_absorbed, q_nope, q_rope, c, k_rope)


def absorbed_ratio(absorbed_fn, *, seq: int, latent: int, warmup: int = WARMUP,
                   repeats: int = REPEATS, seed: int = 0):
    """Check `absorbed_fn`'s output; .ratio = median(naive) / median(absorbed), interleaved."""
    attn, *inputs = make_inputs(seq, latent, seed=seed)
    baseline = torch.no_grad()(lambda: library_naive(attn, *inputs))
    got = mla_step(absorbed_fn, dict(latent=latent, seed=seed, config=SHAPE), 1, seq, seed + 1)
    assert_close(got, baseline(), atol=1e-4, rtol=1e-4,
                 name=f"mla_attend_absorbed (S={seq}, C={latent}) vs the naive step")
    return time_ratio(baseline, lambda: timed_step(absorbed_fn, seq, latent, seed),
                      warmup=warmup, repeats=repeats)


SPEED_CHECK = SpeedCheck(
    grade_id="03_mla_speed_test", threshold=THRESHOLD, measure=absorbed_ratio,
    reference=library_absorbed, counter_example=library_naive,
    workload=dict(seq=SEQ, latent=LATENT),
    solution=("mla_attend_absorbed", "03_mla_absorbed"),
    hint="with {seq} cached positions your absorbed MLA step was only {ratio:.2f}x faster than "
         "up-projecting every cached latent (median {candidate_ms:.3g} ms vs {baseline_ms:.3g} ms "
         "over {runs} interleaved runs); a step that only reads the latents reaches at least "
         "{at_least:g}x. Does mla_attend_absorbed still multiply the cached latents by k_up / "
         "v_up?")
check_absorbed_speedup = SPEED_CHECK.check
__all__ = ["args_after", "kv_bytes", "mla_step", "gqa_run", "cache_bytes", "what_if", "timed_step",
           "mla_layer", "step_inputs", "variant", "random_model", "check_absorbed_speedup",
           "measure_design", "build_design", "design_for", "judge_design", "check_design"]
