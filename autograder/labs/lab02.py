"""Lab 02: probes run the student's cache and loop; the speed check times one decode step at a
long context (a whole generation would need ~30 s of CPU to show the gap); the growth check runs
the student's growing cache through greedy generations and counts, from outside the student's
code, the storage it keeps and the old entries it copies."""
from __future__ import annotations

import contextlib

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode

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

# --- the design task: a cache that does not know the final length ---------------------------------
# Counted in positions' worth of keys and values (bytes / (2 L B K H x bytes per value)), after
# every forward pass of greedy generations: the old entries copied so far, and the most storage
# alive after any call of the cache, may each reach GROWTH_FACTOR x the positions held then, plus
# GROWTH_HEADROOM positions. Doubling copies < 2 per position and holds < 2x; fixed blocks that
# never move copy nothing and hold less than a block more; torch.cat per token copies ~n/2 per
# position (n^2/2 in all); preallocating the model's whole context holds 512 positions for 1.
GROWTH_FACTOR = 4
GROWTH_HEADROOM = 256

# the operations that copy a tensor's values into other memory (as the dispatcher sees them)
_COPYING = frozenset({
    "cat", "stack", "hstack", "vstack", "dstack", "copy_", "copy", "clone", "_to_copy",
    "index_select", "index", "gather", "take", "masked_select", "index_copy", "index_copy_",
    "index_put", "index_put_", "_index_put_impl_", "index_add", "index_add_", "scatter",
    "scatter_", "slice_scatter", "select_scatter", "as_strided_scatter", "diagonal_scatter",
    "narrow_copy", "constant_pad_nd", "pad", "repeat", "repeat_interleave", "flip", "roll",
    "expand_copy", "permute_copy", "view_copy", "transpose_copy", "t_copy", "unfold_copy",
    "alias_copy", "detach_copy", "slice_copy", "select_copy", "split_copy", "unbind_copy",
    "_reshape_copy", "where", "masked_scatter", "masked_scatter_", "put_", "put"})


def _tensors(x):
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from _tensors(y)


def _view_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class _Ledger(TorchDispatchMode):
    """Watches every tensor operation run inside the cache's methods (its constructor too): the
    storage they allocate, alive or freed, and the bytes that copying operations read back out of
    storage allocated in an earlier call -- the keys and values the cache holds."""

    def __init__(self):
        super().__init__()
        self.storages = {}          # storage id -> [weak reference, bytes, call that made it]
        self.earlier = set()        # ids of the storages alive at the start of this call
        self.calls = self.copied = self.depth = self.held = 0

    def alive(self) -> int:
        self.storages = {k: s for k, s in self.storages.items() if not s[0].expired()}
        return sum(s[1] for s in self.storages.values())

    def _held(self, t: torch.Tensor) -> bool:
        return t.numel() > 0 and t.untyped_storage()._cdata in self.earlier

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        schema = func._schema
        written, read = [], []
        for i, arg in enumerate(schema.arguments):
            value = args[i] if i < len(args) else kwargs.get(arg.name)
            (written if arg.alias_info is not None and arg.alias_info.is_write else read).extend(
                _tensors(value))
        name = func.overloadpacket.__name__
        before = written[0].untyped_storage().nbytes() if name == "resize_" and written and \
            self._held(written[0]) else None
        out = func(*args, **kwargs)
        fresh = [t for r, o in zip(schema.returns, out if isinstance(out, (tuple, list)) else [out])
                 if r.alias_info is None for t in _tensors(o)]
        for t in fresh:
            self._keep(t)
        if before is not None:                  # a reallocation copies the old bytes
            st = written[0].untyped_storage()
            if st.nbytes() > before:
                self.copied += before
            self.storages.setdefault(st._cdata, [StorageWeakRef(st), 0, self.calls])[1] = st.nbytes()
        elif name in _COPYING:
            source = sum(_view_bytes(t) for t in read if self._held(t))
            if source:
                target = sum(_view_bytes(t) for t in written + fresh)
                self.copied += min(source, target) if target else source
        return out

    def _keep(self, t: torch.Tensor) -> None:
        st = t.untyped_storage()
        self.storages.setdefault(st._cdata, [StorageWeakRef(st), st.nbytes(), self.calls])

    @contextlib.contextmanager
    def call(self, args=()):
        """One call of the cache's methods (the calls it makes itself belong to it). The tensors
        it is handed count as its own from then on: a cache that keeps the model's k and v
        tensors holds them, and copies them again if it concatenates them later."""
        self.depth += 1
        if self.depth > 1:
            try:
                yield
            finally:
                self.depth -= 1
            return
        self.calls += 1
        for t in _tensors(list(args)):
            self._keep(t)
        self.alive()
        self.earlier = {k for k, s in self.storages.items() if s[2] < self.calls}
        try:
            with self:
                yield
        finally:
            self.depth = 0
            self.held = max(self.held, self.alive())


_WATCHED = ("__init__", "update", "advance", "attention")


def _watched(cache_cls, ledger: _Ledger):
    """A subclass of the student's cache whose methods run under the ledger."""
    def wrap(fn):
        def method(self, *args, **kwargs):
            with ledger.call((*args, *kwargs.values())):
                return fn(self, *args, **kwargs)
        return method
    names = {n: wrap(getattr(cache_cls, n)) for n in _WATCHED if callable(getattr(cache_cls, n, None))}
    return type(cache_cls.__name__, (cache_cls,), names)


@probe
def growth_run(cache_cls, prompt, new_tokens: int, chunks=(), random_model=None) -> dict:
    """Greedy generation of `new_tokens` tokens after `prompt` ([B, P] ids; prefilled in pieces
    ending at `chunks`) on a fresh model, with `cache_cls.for_model(model, B)` watched: per
    forward pass the positions held after it, the old entries copied so far and the most storage
    alive after any call of the cache so far (bytes); the tokens and each pass's last logits."""
    model = labs.model_of(random_model)
    ledger = _Ledger()
    watched = _watched(cache_cls, ledger)
    cache = watched.for_model(model, prompt.shape[0])
    if type(cache) is not watched:
        raise ValueError(f"{cache_cls.__name__}.for_model(model, batch_size) must build the class "
                         f"it is called on, cls(...), not a class it names (it returned a "
                         f"{type(cache).__module__}.{type(cache).__qualname__})")
    passes = []
    out = _greedy(model, cache, prompt, new_tokens, chunks,
                  lambda held: passes.append([held, ledger.copied, ledger.held]))
    return {**out, "passes": passes, "seq_len": getattr(cache, "seq_len", None)}


def _greedy(model, cache, prompt, new_tokens: int, chunks=(), after_pass=None) -> dict:
    """Greedy generation through `cache`: the prompt prefilled in pieces ending at `chunks`, then
    one token a pass; `after_pass(positions held)` after every forward pass. The tokens and each
    new token's logits."""
    bounds = [0, *chunks, prompt.shape[1]]
    pieces = [prompt[:, a:b] for a, b in zip(bounds, bounds[1:])]
    logits, tokens, held = [], [], 0
    with torch.no_grad():
        for step in range(len(pieces) + new_tokens - 1):
            ids = pieces[step] if step < len(pieces) else tokens[-1][:, None]
            held += ids.shape[1]
            last = model(ids, cache=cache)[:, -1]
            if after_pass is not None:
                after_pass(held)
            if step >= len(pieces) - 1:
                logits.append(last)
                tokens.append(last.argmax(-1))
    return {"tokens": torch.stack(tokens, 1), "logits": torch.stack(logits, 1)}


def check_growth(cache_cls, prompt, new_tokens: int, chunks=(), random_model=None) -> dict:
    """Generation identical to the static cache's, then the two bounds, printed before they are
    checked: copied and held storage, in positions' worth, against GROWTH_FACTOR x the positions
    held (+ GROWTH_HEADROOM), after every forward pass."""
    model = labs.shipped_model() if random_model is None else labs.random_model(*random_model)
    c = model.config
    per_position = 2 * c.n_layers * prompt.shape[0] * c.n_kv_heads * c.head_dim * 4   # fp32
    run = growth_run(cache_cls, prompt, new_tokens, chunks, random_model=random_model)
    # the same generation through the course's static cache, in the tester
    want = _greedy(model, KVCache.for_model(model, prompt.shape[0], prompt.shape[1] + new_tokens),
                   prompt, new_tokens, chunks)
    where = f"{prompt.shape[0]} x {prompt.shape[1]}-token prompt, {new_tokens} new tokens"
    assert_tensor_close(run["logits"], want["logits"], 1e-4, f"next-token logits ({where})")
    got, ref = run["tokens"].tolist(), want["tokens"].tolist()
    assert got == ref, f"greedy tokens ({where}) differ from the static cache's:\n{got}\n{ref}"
    n, copied, held = (max(p[i] / (1 if i == 0 else per_position) for p in run["passes"])
                       for i in range(3))
    # the share of its allowance (GROWTH_FACTOR x the positions held + GROWTH_HEADROOM) each
    # figure used at its worst step
    worst = {k: max(p[i] / per_position / (GROWTH_FACTOR * p[0] + GROWTH_HEADROOM)
                    for p in run["passes"]) for k, i in (("copied", 1), ("held", 2))}
    print(f"{where}: {n:.0f} positions held at the end; old entries copied, in all: "
          f"{copied:,.0f} positions' worth ({copied / n:.2f} per position held); the most storage "
          f"alive after a call: {held:,.0f} positions' worth. Allowed at every step: "
          f"{GROWTH_FACTOR} x the positions held + {GROWTH_HEADROOM} for each; your worst step "
          f"used {worst['copied']:.0%} of it copying and {worst['held']:.0%} holding (at most 100%)")
    assert worst["copied"] <= 1, (
        f"your cache copied {copied:,.0f} positions' worth of old keys and values to hold {n:.0f}: "
        f"more than {GROWTH_FACTOR} per position held (+ {GROWTH_HEADROOM}) at some step. How "
        f"often does it move what it already holds?")
    assert worst["held"] <= 1, (
        f"your cache kept {held:,.0f} positions' worth of storage alive: more than "
        f"{GROWTH_FACTOR}x the positions it held then (+ {GROWTH_HEADROOM}). Does it allocate for "
        f"a length it does not know yet, or keep what it has outgrown?")
    return {"positions": n, "copied": copied, "held": held, **worst}


__all__ = ["cache_trace", "cached_forward", "counted_generate", "with_config", "cache_nbytes",
           "decode_step", "timed_step", "random_model", "context_ids", "check_decode_speedup",
           "growth_run", "check_growth"]
