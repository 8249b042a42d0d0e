"""Lab 02's probes and speed check.

Probes (autograder/probes.py) run the student's cache and loop where they live and return plain
values; the tests compare them with minillm's KVCache and generate_cached, run in the tester:

    from autograder.labs import lab02
    lab02.cache_trace(StaticKVCache, dict(n_layers=2, ...), [("update", 0, k, v, pos),
                      ("advance", pos)], overflow=(0, k, v, pos))   # each op's results, views...
    lab02.cached_forward(StaticKVCache, ids, [5, 6])     # logits of ids fed in chunks, seq_len
    lab02.counted_generate(generate_cached, prompt, 9, temperature=0)  # tokens, calls, through
    lab02.decode_step(StaticKVCache, 384, seed=8)        # one counted decode step after 384
    lab02.with_config(kv_bytes_per_token, cfg.to_dict(), 4)   # a function of a ModelConfig
    lab02.cache_nbytes(StaticKVCache, 3, 100)            # .nbytes of a cache for the model

On the shipped model (a fresh copy each call), or with random_model=(seed, config) on
`random_model(seed, config)`, which a test builds in the tester too for the expected values.

The speed check times one token at a long context. The naive loop produces the token after a
T-token context by running all T + 1 tokens through the model again; a cached loop runs ONE
token and reads the T cached keys and values:

    time(naive step: model(ids[:, :T + 1]), in the tester)
        / time(cached step: model(next_id, cache=cache), in the kernel: `timed_step`)

where `cache` is the student's class (`for_model(model, 1, ...)`), prefilled once, untimed, with
the same T tokens (`decode_step`, whose logits must first equal the naive step's: a fast but
wrong cache earns nothing). Each timed step appends one position (T grows by WARMUP + REPEATS,
negligible at T = 384). A ratio of medians of CPU time measured interleaved on one torch thread,
paired with exact claims graded in the same notebook: one token through the model per decode
step (`02_speed_test`), P + n - 1 tokens in n calls per generation (`02_work_test`).

Why one step and not a whole generation: the speed-up of a whole generation grows with n and
reaches 10-15x only near n = 480, where the naive loop alone takes ~30 s of CPU time (`minillm
bench decode` compares whole generations); one step at a long context shows the same per-token
gap in ~0.2 s. Why 3.0: see THRESHOLD.
"""
from __future__ import annotations

import torch

from autograder.checks import WorkCounter, assert_close
from autograder.labs import shipped_model
from autograder.labs.speedcheck import SpeedCheck, one_torch_thread
from autograder.probes import fresh_model, probe, working_model
from autograder.timing import time_ratio
from minillm.kvcache import KVCache

CONTEXT = 384       # T: tokens already in the context when the timed token is produced
# required time(naive step) / time(cached step). Graded in the tester (the naive step there, the
# cached step in the kernel, one probe call per step) on a 2-core machine busy with other work, 6
# runs of each, 2 beside a busy loop: minillm's KVCache 15.6-16.0, the notebook's solution
# 15.3-16.1, a step that ignores the cache 0.93-1.00 (`python -m autograder.labs --tester
# --solution lab02`, 2026-11-29); 11.6 in a graded run on the loaded machine. 3.0 sits 3x over
# the one and 5x under the other: room for a core slower at running Python, where a cached
# step's fixed cost weighs more (autograder/README.md). It was 4.0 when the tests ran in the kernel.
THRESHOLD = 3.0
WARMUP, REPEATS = 1, 5


def random_model(seed: int, config: dict):
    """A small random `Transformer(ModelConfig(**config))`, its weights drawn after
    torch.manual_seed(seed), in eval mode: the same weights wherever it is built."""
    from minillm.config import ModelConfig
    from minillm.model import Transformer
    torch.manual_seed(seed)
    return Transformer(ModelConfig(**config)).eval()


def _model(random):
    return fresh_model() if random is None else random_model(*random)


def context_ids(vocab_size: int, n: int, seed: int) -> torch.Tensor:
    """[1, n] seeded token ids."""
    return torch.randint(1, vocab_size, (1, n), generator=torch.Generator().manual_seed(seed))


def _state(cache) -> dict:
    return {"seq_len": cache.seq_len, "max_len": cache.max_len, "nbytes": cache.nbytes,
            "k": [t.detach().clone() for t in cache.k], "v": [t.detach().clone() for t in cache.v]}


def _same_memory(a, b) -> bool:
    return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and \
        a.data_ptr() == b.data_ptr()


@probe
def cache_trace(cache_cls, kwargs: dict, ops, overflow=None) -> dict:
    """`cache = cache_cls(**kwargs)`, then each op in order: ("update", layer, k, v, positions)
    or ("advance", positions). Returns {"new": the new cache's seq_len, max_len, nbytes, k and
    v, "ops": per op {"seq_len"} and for an update its "k", "v", "positions" and whether the keys
    and values returned share memory with cache.k[layer] / cache.v[layer] ("k_view", "v_view"),
    "end": the cache at the end, "same_storage": whether its k and v tensors are still the ones
    allocated at first, "overflow": the type of what `cache.update(*overflow)` raised (None:
    nothing)}."""
    cache = cache_cls(**kwargs)
    new = _state(cache)
    first = [t.data_ptr() for t in cache.k + cache.v]
    records = []
    for op in ops:
        if op[0] == "update":
            layer = op[1]
            k, v, pos = cache.update(*op[1:])
            records.append({"k": k.detach().clone() if isinstance(k, torch.Tensor) else k,
                            "v": v.detach().clone() if isinstance(v, torch.Tensor) else v,
                            "positions": pos, "k_view": _same_memory(k, cache.k[layer]),
                            "v_view": _same_memory(v, cache.v[layer])})
        else:
            cache.advance(op[1])
            records.append({})
        records[-1]["seq_len"] = cache.seq_len
    out = {"new": new, "ops": records, "end": _state(cache), "overflow": None,
           "same_storage": [t.data_ptr() for t in cache.k + cache.v] == first}
    if overflow is not None:
        try:
            cache.update(*overflow)
        except ValueError:
            out["overflow"] = "ValueError"
        except Exception as e:          # noqa: BLE001 - reported, judged by the test
            out["overflow"] = type(e).__name__
    return out


@probe
def cached_forward(cache_cls, ids, cuts, max_len: int | None = None, random_model=None) -> dict:
    """`ids` [B, T] fed to the model in chunks ending at `cuts` (then at T) with one
    `cache_cls.for_model(model, B, max_len or T)`: {"logits": [B, T, V], "seq_len": after}."""
    model = _model(random_model)
    cache = cache_cls.for_model(model, ids.shape[0], max_len or ids.shape[1])
    bounds = [0, *cuts, ids.shape[1]]
    with torch.no_grad():
        logits = [model(ids[:, a:b], cache=cache) for a, b in zip(bounds, bounds[1:])]
    return {"logits": torch.cat(logits, 1), "seq_len": cache.seq_len}


@probe
def counted_generate(generate_cached, prompt_ids, max_new_tokens, *args, random_model=None,
                     **kwargs) -> dict:
    """`generate_cached(model, prompt_ids, max_new_tokens, *args, **kwargs)`, its forward passes
    counted: {"tokens": what it returned, "calls": forward calls, "through": token positions}."""
    model = _model(random_model)
    with WorkCounter(model) as work:
        tokens = generate_cached(model, prompt_ids, max_new_tokens, *args, **kwargs)
    return {"tokens": tokens, "calls": work.calls, "through": work.tokens}


@probe
def with_config(fn, config: dict, *args):
    """`fn(ModelConfig.from_dict(config), *args)`: a function of a model's config."""
    from minillm.config import ModelConfig
    return fn(ModelConfig.from_dict(config), *args)


@probe
def cache_nbytes(cache_cls, batch: int, max_len: int, random_model=None):
    """`cache_cls.for_model(model, batch, max_len).nbytes`."""
    return cache_cls.for_model(_model(random_model), batch, max_len).nbytes


_KEPT: dict = {}        # seed -> [cache (None: no cache), ids, next position]: for timed_step


def _step(seed: int):
    cache, ids, p = _KEPT[seed]
    _KEPT[seed][2] = p + 1
    model = working_model()
    if cache is None:                   # a step that ignores the cache: the whole sequence again
        return model(ids[:, :p + 1], last_only=True)[:, -1]
    return model(ids[:, p:p + 1], cache=cache)[:, -1]


@probe
def decode_step(cache_cls, context: int, seed: int, room: int = 1) -> dict:
    """On the kept model: `context_ids(V, context + room, seed)`, the first `context` prefilled
    into a new `cache_cls.for_model(model, 1, context + room)`, then one decode step, counted:
    {"logits": [1, V], "calls", "through", "seq_len"}. The cache stays for `timed_step`;
    cache_cls None: a step that ignores the cache (re-runs the whole sequence)."""
    model = working_model()
    ids = context_ids(model.config.vocab_size, context + room, seed)
    with torch.no_grad(), one_torch_thread():
        cache = None if cache_cls is None else cache_cls.for_model(model, 1, context + room)
        if cache is not None:
            model(ids[:, :context], cache=cache)
        _KEPT[seed] = [cache, ids, context]
        with WorkCounter(model) as work:
            logits = _step(seed)
    return {"logits": logits, "calls": work.calls, "through": work.tokens,
            "seq_len": None if cache is None else cache.seq_len}


@probe
def timed_step(cache_cls, seed: int) -> None:
    """One timed decode step on the cache `decode_step(cache_cls, ..., seed)` left."""
    with torch.no_grad(), one_torch_thread():
        _step(seed)


def decode_speedup(cache_cls, *, context: int, warmup: int = WARMUP, repeats: int = REPEATS,
                   seed: int = 0):
    """Check one decode step with a `cache_cls` cache after `context` tokens against the naive
    step, then time both, interleaved: .ratio = median(naive) / median(cached)."""
    model = shipped_model()
    room = 1 + warmup + repeats
    naive_ids = context_ids(model.config.vocab_size, context + room, seed)[:, :context + 1]
    with torch.no_grad():
        want = model(naive_ids, last_only=True)[:, -1]
    got = decode_step(cache_cls, context, seed, room)["logits"]
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(want.shape):
        raise AssertionError("a decode step with your cache did not return logits of shape "
                             f"{tuple(want.shape)}")
    assert_close(got, want, atol=1e-3, rtol=1e-3, name=f"logits of the token after a "
                 f"{context}-token context, cached decode step vs the full forward")

    def naive_step():
        with torch.no_grad():
            model(naive_ids, last_only=True)

    return time_ratio(naive_step, lambda: timed_step(cache_cls, seed), warmup=warmup,
                      repeats=repeats)


SPEED_CHECK = SpeedCheck(
    grade_id="02_speed_test", threshold=THRESHOLD, measure=decode_speedup,
    reference=KVCache, counter_example=None,    # None: a step that ignores the cache
    workload=dict(context=CONTEXT),
    solution=("StaticKVCache", "02_cache"),
    hint="at a {context}-token context, a decode step with your cache was only {ratio:.2f}x "
         "faster than a naive step that re-runs the whole sequence (median {candidate_ms:.3g} ms "
         "vs {baseline_ms:.3g} ms over {runs} interleaved runs); a cached step runs one token "
         "and reaches at least {at_least:g}x. Does your update copy or recompute more than the "
         "new entries?")
check_decode_speedup = SPEED_CHECK.check
__all__ = ["cache_trace", "cached_forward", "counted_generate", "with_config", "cache_nbytes",
           "decode_step", "timed_step", "random_model", "context_ids", "check_decode_speedup"]
