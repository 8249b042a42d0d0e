"""Lab 02: probes run the student's cache and loop; the speed check times one decode step at a
long context (a whole generation would need ~30 s of CPU to show the gap)."""
from __future__ import annotations

import torch

from autograder import labs
from autograder.labs import context_ids, counted_generate, random_model, with_config
from autograder.labs.speedcheck import SpeedCheck, assert_tensor_close, one_torch_thread
from autograder.probes import probe, working_model
from autograder.timing import time_ratio
from minillm.kvcache import KVCache

CONTEXT = 384       # T: tokens already in the context when the timed token is produced
# time(naive step) / time(cached step), loaded 2-core, in the tester: KVCache 15.6-16.0, the
# solution 15.3-16.1, a step ignoring the cache 0.93-1.00; room for a core slow at Python
THRESHOLD = 3.0
WARMUP, REPEATS = 1, 5


def _state(cache) -> dict:
    return {"seq_len": cache.seq_len, "max_len": cache.max_len, "nbytes": cache.nbytes,
            "k": [t.detach().clone() for t in cache.k], "v": [t.detach().clone() for t in cache.v]}


def _same_memory(a, b) -> bool:
    return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and \
        a.data_ptr() == b.data_ptr()


@probe
def cache_trace(cache_cls, kwargs: dict, ops, overflow=None) -> dict:
    """`cache_cls(**kwargs)` through ops ("update", layer, k, v, positions) / ("advance", n)."""
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
    """`ids` [B, T] fed in chunks ending at `cuts` through one cache: {"logits", "seq_len"}."""
    model = labs.model_of(random_model)
    cache = cache_cls.for_model(model, ids.shape[0], max_len or ids.shape[1])
    bounds = [0, *cuts, ids.shape[1]]
    with torch.no_grad():
        logits = [model(ids[:, a:b], cache=cache) for a, b in zip(bounds, bounds[1:])]
    return {"logits": torch.cat(logits, 1), "seq_len": cache.seq_len}


@probe
def cache_nbytes(cache_cls, batch: int, max_len: int, random_model=None):
    return cache_cls.for_model(labs.model_of(random_model), batch, max_len).nbytes


_KEPT: dict = {}        # seed -> [cache (None: no cache), ids, next position]


def _step(seed: int):
    cache, ids, p = _KEPT[seed]
    _KEPT[seed][2] = p + 1
    model = working_model()
    if cache is None:                   # a step that ignores the cache: the whole sequence again
        return model(ids[:, :p + 1], last_only=True)[:, -1]
    return model(ids[:, p:p + 1], cache=cache)[:, -1]


@probe
def decode_step(cache_cls, context: int, seed: int, room: int = 1) -> dict:
    """One counted decode step after `context` tokens in a new cache (kept for timed_step)."""
    model = working_model()
    ids = context_ids(model.config.vocab_size, context + room, seed)
    with torch.no_grad(), one_torch_thread():
        cache = None if cache_cls is None else cache_cls.for_model(model, 1, context + room)
        if cache is not None:
            model(ids[:, :context], cache=cache)
        _KEPT[seed] = [cache, ids, context]
        logits, work = labs.counted(model, lambda _: _step(seed))
    return {"logits": logits, **work, "seq_len": None if cache is None else cache.seq_len}


@probe
def timed_step(cache_cls, seed: int) -> None:
    with torch.no_grad(), one_torch_thread():
        _step(seed)


def decode_speedup(cache_cls, *, context: int, warmup: int = WARMUP, repeats: int = REPEATS,
                   seed: int = 0):
    """Check a cached step against the naive one; .ratio = median(naive) / median(cached)."""
    model = labs.shipped_model()
    room = 1 + warmup + repeats
    naive_ids = context_ids(model.config.vocab_size, context + room, seed)[:, :context + 1]
    naive_step = torch.no_grad()(lambda: model(naive_ids, last_only=True))
    assert_tensor_close(decode_step(cache_cls, context, seed, room)["logits"],
                        naive_step()[:, -1], 1e-3, f"logits of the token after a {context}-token "
                        f"context, cached decode step vs the full forward")
    return time_ratio(naive_step, lambda: timed_step(cache_cls, seed), warmup=warmup,
                      repeats=repeats)


SPEED_CHECK = SpeedCheck(
    grade_id="02_speed_test", threshold=THRESHOLD, measure=decode_speedup,
    reference=KVCache, counter_example=None,    # None: a step that ignores the cache
    workload=dict(context=CONTEXT),
    solution=("StaticKVCache", "02_cache"),
    hint="at a {context}-token context, a decode step with your cache was only {ratio:.2f}x "
         "faster than a naive step that re-runs the whole sequence (median {candidate_ms:.3g} ms "
         "vs {baseline_ms:.3g} ms over {runs} interleaved runs); a cached step runs one token and "
         "reaches at least {at_least:g}x. Does your update copy or recompute more than the new "
         "entries?")
check_decode_speedup = SPEED_CHECK.check
__all__ = ["cache_trace", "cached_forward", "counted_generate", "with_config", "cache_nbytes",
           "decode_step", "timed_step", "random_model", "context_ids", "check_decode_speedup"]
