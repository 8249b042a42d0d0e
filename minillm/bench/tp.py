"""`minillm bench tp`: tensor parallelism on this CPU, measured and held against the napkin.

    minillm bench tp --json            # ~1.5 minutes on 2 cores; --quick (~20 s) for tests

Four measurements, all taken inside gloo ranks started by `minillm.parallel.run_ranks`:

1. **The all-reduce alone** (`time_all_reduce`): W ranks of 1 thread each all-reduce a float32
   buffer of each size, after a barrier so every rank enters each call together; sizes are
   interleaved round by round, and each size's figure is the median of rank 0's times.
   `fit_all_reduce` fits the napkin's own form of one ring all-reduce,

       t = alpha + 2 (W - 1) / W * bytes / link,

   a straight line in x = 2 (W - 1) / W * bytes, by least squares on *relative* errors (weights
   1 / t^2, both coefficients held >= 0: `phase_costs.nonneg_lstsq`). Plain least squares on
   seconds lets the few largest messages (milliseconds) decide alpha, which then comes out
   wrong by more than the whole small-message time; relative errors weigh a 0.3 ms call and a
   4 ms call alike, which is also how the result is judged (measured / fitted within 2x).
2. **One decode step** (`time_tp_steps`): batch 1, a context of `context` tokens in a
   `minillm.kvcache.KVCache` of each rank's model (the cache is cut back after each step, so
   every step sees the same context). Every rank builds the full model from the same seed
   (random weights, or the shipped checkpoint) and keeps its part, `minillm.parallel.shard`.
   In one process group of W ranks, round by round and width by width, it times:
   `tp1_1thread` (rank 0 runs the whole model on 1 thread while the other ranks wait in a
   barrier, which costs no CPU: "one device"), `tp1_wthreads` (the same on W threads: "equal
   total threads"), `tp` (all W ranks, 1 thread each, the split model) and, for the sizes in
   `copies`, `copies` (every rank runs its own whole model on its own stream at the same time:
   they share the memory system as real copies would). Rank 0's step times; medians. During
   `tp` it also adds up the time spent inside the all-reduces (`tp_allreduces_s`: the call
   plus the wait for the slower rank, as the step sees it).
   Rank 0 also measures the read bandwidth (`bandwidth.read_bandwidth`) at 1 thread of a buffer
   the size of each rank's weights (whole and split), and at W threads of the whole; then all
   ranks read their share at once (`concurrent`: what a rank gets while the others read too --
   on a CPU the ranks share one memory system, where the napkin gives each GPU its own HBM).
3. **The napkin** (`predicted_step`): `minillm.roofline.tensor_parallel_napkin` (lab 01's
   formula) with fp32 weights, cache and activations, the measured 1-thread read bandwidth at
   the bytes one rank reads (interpolated in log-log between the measured buffer sizes:
   `bandwidth_at`), and the fitted alpha and link. The napkin splits the LM head as well;
   `minillm.parallel` keeps it whole on every rank, which the sweep's small vocabulary makes
   negligible (the shipped target's head is ~13 % of its bytes).
4. **The crossover**: `crossover_measured` interpolates, in log(time ratio) against the width,
   where TP = W at 1 thread per rank first beats TP = 1 on 1 thread; `crossover_predicted` solves
   the napkin's two latencies for it (on every width `width_config` allows), with the fitted
   alpha and link and, for the split, the bandwidth a rank gets while all read at once (CPU
   cores share one memory system; lab 01's GPUs each have their own: `predicted_dim_own_memory`
   keeps that assumption). `predicted_dim_as_seen` uses the alpha the split step paid instead.
"""
from __future__ import annotations

import math
import os
import time

import numpy as np
import torch
import torch.distributed as dist

from .. import roofline
from ..config import ModelConfig
from .phase_costs import nonneg_lstsq
from .timing import median, perf_counter
from .tp_report import text  # the report in words

__all__ = ["time_all_reduce", "fit_all_reduce", "predicted_all_reduce", "width_config",
           "time_tp_steps", "time_tp_step", "bandwidth_at", "cpu_hardware", "predicted_step",
           "crossover_measured", "crossover_predicted", "bench_tp", "text",
           "ALL_REDUCE_SIZES", "WIDTHS"]

# float32 elements per all-reduce: ~100 floats to ~1.5M (a factor of 4 apart)
ALL_REDUCE_SIZES = (96, 384, 1536, 6144, 24576, 98304, 393216, 1572864)
WIDTHS = (256, 384, 512, 768, 1024, 1536, 2048, 3072)   # the sweep's model widths D


# ---- 1. the all-reduce alone ----------------------------------------------------------------
def _all_reduce_rank(rank: int, world: int, sizes, warmup: int, repeats: int) -> list:
    bufs = [torch.zeros(int(n)) for n in sizes]          # zeros: sums never overflow
    times = [[] for _ in sizes]
    n = len(sizes)
    for r in range(warmup + repeats):
        for i in [(r + j) % n for j in range(n)]:     # rotated
            buf = bufs[i]
            dist.barrier()
            t0 = perf_counter()
            dist.all_reduce(buf)
            dt = perf_counter() - t0
            if r >= warmup:
                times[i].append(dt)
    return times


def time_all_reduce(sizes=ALL_REDUCE_SIZES, world: int = 2, repeats: int = 40,
                    warmup: int = 5, timeout_s: float = 60) -> list[dict]:
    """One gloo all-reduce (sum) of `n` float32 values between `world` ranks of 1 thread each,
    for each n in `sizes`: rows {floats, bytes, median_s, times_s} (rank 0's seconds per call,
    each call after a barrier; sizes interleaved, each round starting one size later so that
    no size always follows the same one; `warmup` rounds dropped)."""
    from ..parallel import run_ranks
    sizes = [int(n) for n in sizes]
    if not sizes or min(sizes) < 1 or world < 2:
        raise ValueError(f"need sizes >= 1 float and world >= 2, got {sizes}, {world}")
    times = run_ranks(_all_reduce_rank, world, sizes, warmup, repeats, threads=1,
                      timeout_s=timeout_s)[0]
    return [{"floats": n, "bytes": 4 * n, "median_s": median(ts), "times_s": ts}
            for n, ts in zip(sizes, times)]


def fit_all_reduce(rows: list[dict], world: int = 2) -> dict:
    """alpha (s) and link (bytes/s) of t = alpha + 2 (W-1)/W * bytes / link, fitted to rows
    {bytes, median_s} by non-negative least squares on relative errors (see the module
    docstring). Raises ValueError when the times do not grow with the size (no link term)."""
    if world < 2 or len(rows) < 2:
        raise ValueError(f"need world >= 2 and at least two sizes, got {world}, {len(rows)}")
    x = [2 * (world - 1) / world * r["bytes"] for r in rows]
    t = [r["median_s"] for r in rows]
    if min(t) <= 0:
        raise ValueError("all-reduce times must be positive")
    alpha, per_byte = nonneg_lstsq([np.ones(len(x)), x], t, weights=[1 / v ** 2 for v in t])
    if per_byte <= 0:
        raise ValueError("the all-reduce time does not grow with the message size here: no "
                         "link bandwidth to fit (add larger sizes)")
    return {"alpha_s": float(alpha), "link_bytes_per_s": float(1 / per_byte), "world": world,
            "form": "t = alpha + 2 (W-1)/W * bytes / link",
            "method": "least squares on relative error, alpha and 1/link >= 0"}


def predicted_all_reduce(nbytes: float, fit: dict) -> float:
    """The fitted napkin's seconds for one all-reduce of `nbytes`."""
    w = fit["world"]
    return fit["alpha_s"] + 2 * (w - 1) / w * nbytes / fit["link_bytes_per_s"]


# ---- 2. one decode step, whole and split ----------------------------------------------------
def width_config(dim: int, layers: int = 2, vocab: int = 256, head_dim: int = 64,
                 multiple: int = 256, max_seq_len: int = 128) -> ModelConfig:
    """The sweep's model of width `dim`: heads of `head_dim`, MLP width 8/3 D rounded to a
    multiple of `multiple` (so 2 and 4 ranks split it evenly), a small vocabulary (the LM head,
    whole on every rank, stays negligible)."""
    if dim % head_dim or dim < head_dim:
        raise ValueError(f"the width {dim} must be a positive multiple of head_dim {head_dim}")
    hidden = max(multiple, round(8 * dim / 3 / multiple) * multiple)
    return ModelConfig(vocab_size=vocab, dim=dim, n_layers=layers, n_heads=dim // head_dim,
                       hidden_dim=hidden, max_seq_len=max_seq_len)


def _build(spec, seed: int):
    """A model from a shipped name (its checkpoint) or a ModelConfig (random weights, `seed`:
    the same on every rank)."""
    import minillm

    from ..model import Transformer
    if isinstance(spec, str):
        return minillm.load(spec).float().eval()
    torch.manual_seed(seed)
    return Transformer(spec).eval()


def _stepper(model, context: int, seed: int):
    """A function that runs one batch-1 decode step of `model` after `context` cached tokens
    (the cache is cut back to `context` after each step, so every step is the same)."""
    from ..kvcache import KVCache
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (1, context + 1), generator=g)
    cache = KVCache.for_model(model, 1, context + 1)
    with torch.no_grad():
        model(ids[:, :context], cache=cache, last_only=True)
    token = ids[:, context:]

    def step():
        with torch.no_grad():
            model(token, cache=cache, last_only=True)
        cache.truncate(context)
    return step


def _step_rank(rank: int, world: int, specs, context: int, warmup: int, repeats: int,
               copies, seed: int):
    from ..parallel import shard, shard_bytes
    from .bandwidth import read_bandwidth
    entries = []
    for name, spec in specs:
        full = _build(spec, seed)
        part = shard(full, rank, world)
        e = {"name": name, "part": _stepper(part, context, seed), "bytes_rank": shard_bytes(part),
             "bytes_full": shard_bytes(full)}
        if rank == 0 or name in copies:
            e["full"] = _stepper(full, context, seed)
        entries.append(e)
        del full

    def alone(fn, threads):           # rank 0 runs; the others wait in a barrier (no CPU)
        dist.barrier()
        dt = None
        if rank == 0:
            torch.set_num_threads(threads)
            t0 = perf_counter()
            fn()
            dt = perf_counter() - t0
            torch.set_num_threads(1)
            if threads > 1:           # OpenMP's idle workers spin on for a while: let them
                time.sleep(0.02)      # sleep, or they take the core a peer's next step runs on
        dist.barrier()
        return dt

    def together(fn):
        dist.barrier()
        t0 = perf_counter()
        fn()
        return perf_counter() - t0

    in_comm = [0.0]                   # seconds inside the split step's all-reduces

    def split_step(fn):
        in_comm[0] = 0.0
        with _timed_all_reduces(in_comm):
            return together(fn)

    bw = None
    dist.barrier()
    if rank == 0:
        bw = _bandwidths(entries, world, read_bandwidth)
    together_bw = []                  # every rank reads its share at once, as the split step does
    for n in sorted({e["bytes_rank"] for e in entries}):
        dist.barrier()
        together_bw.append([n, read_bandwidth(max(n, 4096))])
    if rank == 0:
        bw["concurrent"] = together_bw
    dist.barrier()
    times = {e["name"]: {"tp1_1thread": [], "tp1_wthreads": [], "tp": [], "tp_allreduces": [],
                         "copies": []} for e in entries}
    for r in range(warmup + repeats):
        for e in entries:
            got = {"tp1_1thread": alone(e.get("full"), 1),
                   "tp1_wthreads": alone(e.get("full"), world),
                   "tp": split_step(e["part"]), "tp_allreduces": in_comm[0]}
            if e["name"] in copies:
                got["copies"] = together(e["full"])
            if r >= warmup:
                for k, v in got.items():
                    times[e["name"]][k].append(v)
    if rank:
        return None
    out = {}
    for e in entries:
        row = {"bytes_full": e["bytes_full"], "bytes_rank": e["bytes_rank"]}
        for k, ts in times[e["name"]].items():
            if ts:
                row[f"{k}_s"] = median(ts)
        out[e["name"]] = row
    return {"steps": out, "bandwidth": bw}


class _timed_all_reduces:
    """Within the block, add the seconds every row-parallel layer spends in its all-reduce to
    acc[0] (the split step's communication as the step sees it: the call itself plus the wait
    for the slower rank)."""

    def __init__(self, acc):
        import sys

        from ..parallel import shard as _  # noqa: F401  (the module, not the function)
        self.module, self.acc = sys.modules["minillm.parallel.shard"], acc

    def __enter__(self):
        self.plain = plain = self.module.all_reduce_sum

        def timed(x, group=None):
            t0 = perf_counter()
            out = plain(x, group)
            self.acc[0] += perf_counter() - t0
            return out
        self.module.all_reduce_sum = timed

    def __exit__(self, *exc):
        self.module.all_reduce_sum = self.plain


def _bandwidths(entries, world, read_bandwidth) -> dict:
    """Rank 0's read bandwidth at 1 thread on buffers of each rank's and each whole model's
    bytes, and at `world` threads on the whole models', as [[nbytes, bytes/s], ...]; and one
    fp32 matmul's FLOP/s on 1 thread (the napkin's Hardware needs a figure; latency ignores it)."""
    one = sorted({e["bytes_full"] for e in entries} | {e["bytes_rank"] for e in entries})
    torch.set_num_threads(1)
    out = {"one_thread": [[n, read_bandwidth(max(n, 4096))] for n in one]}
    torch.set_num_threads(world)
    out["w_threads"] = [[n, read_bandwidth(max(n, 4096))] for n in sorted(
        {e["bytes_full"] for e in entries})]
    torch.set_num_threads(1)
    a, b = torch.randn(256, 1024), torch.randn(1024, 1024)
    times = []
    for _ in range(6):
        t0 = perf_counter()
        a @ b
        times.append(perf_counter() - t0)
    out["flops_per_s_one_thread"] = 2 * 256 * 1024 * 1024 / median(times[1:])
    return out


def time_tp_steps(specs: dict, world: int = 2, *, context: int = 16, warmup: int = 3,
                  repeats: int = 30, copies=(), seed: int = 0, timeout_s: float = 180) -> dict:
    """One batch-1 decode step of each model in `specs` ({name: ModelConfig or shipped name}),
    whole and split over `world` ranks, interleaved in one process group (module docstring):
    {"steps": {name: {tp1_1thread_s, tp1_wthreads_s, tp_s, [copies_s], bytes_full,
    bytes_rank}}, "bandwidth": {...}} (medians of rank 0's seconds per step)."""
    from ..parallel import run_ranks, shard_plan
    for name, spec in specs.items():
        shard_plan(_config_of(spec), world, 0)
    unknown = set(copies) - set(specs)
    if unknown:
        raise ValueError(f"copies names {sorted(unknown)} are not among the models {list(specs)}")
    return run_ranks(_step_rank, world, list(specs.items()), context, warmup, repeats,
                     tuple(copies), seed, threads=1, timeout_s=timeout_s)[0]


def time_tp_step(config_or_name, world: int = 2, **kw) -> dict:
    """`time_tp_steps` of one model: its row ({tp1_1thread_s, tp1_wthreads_s, tp_s, ...})."""
    r = time_tp_steps({"model": config_or_name}, world, **kw)
    return {**r["steps"]["model"], "bandwidth": r["bandwidth"]}


def _config_of(spec) -> ModelConfig:
    """A ModelConfig as it is; a shipped name or checkpoint directory: its model's config."""
    if isinstance(spec, ModelConfig):
        return spec
    import minillm
    return minillm.load(spec).config


# ---- 3. the napkin --------------------------------------------------------------------------
def bandwidth_at(points, nbytes: float) -> float:
    """The read bandwidth at `nbytes`, interpolated in log-log between measured [[nbytes, B/s],
    ...] (clamped at the ends: a bigger buffer reads like the biggest measured)."""
    pts = sorted(points)
    xs = [math.log(n) for n, _ in pts]
    ys = [math.log(b) for _, b in pts]
    return float(math.exp(np.interp(math.log(nbytes), xs, ys)))


def cpu_hardware(bandwidth: float, flops_per_s: float, name: str = "this CPU") -> roofline.Hardware:
    """This machine as a `roofline.Hardware`: measured read bandwidth and FLOP/s, and its RAM."""
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return roofline.Hardware(name, flops_per_s=flops_per_s, mem_bandwidth_bytes_per_s=bandwidth,
                             memory_bytes=ram)


def predicted_step(config: ModelConfig, world: int, bandwidth, fit: dict, *, context: int = 16,
                   flops_per_s: float = 1e10) -> dict:
    """Lab 01's napkin (`roofline.tensor_parallel_napkin`) of one batch-1 fp32 decode step of
    `config` split over `world` ranks, with the fitted all-reduce (`fit`) as alpha and link.
    `bandwidth`: bytes/s, or measured [[nbytes, B/s], ...] points, read at the bytes one rank
    reads (`bandwidth_at`). Returns {latency_s, memory_time_s, comm_s, bytes_per_rank,
    bandwidth, copies_latency_s, copies_throughput_tok_s}."""
    def napkin(bw):
        return roofline.tensor_parallel_napkin(
            config, cpu_hardware(bw, flops_per_s), 1, context + 1, world,
            link=fit["link_bytes_per_s"], bytes_per_param=4, activation_bytes=4,
            allreduce_latency_s=fit["alpha_s"])
    if isinstance(bandwidth, (int, float)):
        bw = float(bandwidth)
    else:
        bw = bandwidth_at(bandwidth, napkin(1e9)["memory_per_gpu_bytes"])
    n = napkin(bw)
    return {"latency_s": n["latency_s"], "memory_time_s": n["memory_time_s"],
            "comm_s": n["comm_s"], "bytes_per_rank": n["memory_per_gpu_bytes"], "bandwidth": bw,
            "copies_latency_s": n["copies_latency_s"],
            "copies_throughput_tok_s": n["copies_throughput_tok_s"]}


# ---- 4. the crossover -----------------------------------------------------------------------
def crossover_measured(dims, whole_s, split_s) -> tuple[float | None, str]:
    """The smallest width where the split step (`split_s`) beats the whole one (`whole_s`):
    log(split / whole) interpolated linearly in the width between the last sweep point where
    the split loses and the first where it wins. (None, reason) outside the sweep."""
    rows = sorted(zip(dims, whole_s, split_s))
    logs = [math.log(s / w) for _, w, s in rows]
    for i, v in enumerate(logs):
        if v < 0:
            if i == 0:
                return None, f"the split already wins at the smallest width swept, {rows[0][0]}"
            d0, d1, v0 = rows[i - 1][0], rows[i][0], logs[i - 1]
            return d0 + (d1 - d0) * v0 / (v0 - v), "interpolated between sweep points"
    return None, f"the split never wins up to the largest width swept, {rows[-1][0]}"


def crossover_predicted(fit: dict, bandwidth, world: int = 2, *, context: int = 16,
                        shape=width_config, max_dim: int = 32768,
                        split_bandwidth=None) -> tuple[float | None, str]:
    """The width where the napkin's split step (`world` ranks) first costs less than the whole
    one (`predicted_step`; `split_bandwidth` for the split, default the same `bandwidth`): the
    napkin's difference is evaluated on every width the shape rule allows (multiples of
    64 * world) up to `max_dim` and solved linearly between the two around the first sign
    change."""
    step = 64 * world
    split_bandwidth = bandwidth if split_bandwidth is None else split_bandwidth
    prev = None
    for d in range(step, max_dim + 1, step):
        cfg = shape(d)
        diff = (predicted_step(cfg, world, split_bandwidth, fit, context=context)["latency_s"]
                - predicted_step(cfg, 1, bandwidth, fit, context=context)["latency_s"])
        if diff < 0:
            if prev is None:
                return None, f"the napkin has the split winning at every width from {d}"
            return prev[0] + step * prev[1] / (prev[1] - diff), "solved on the napkin"
        prev = (d, diff)
    return None, f"the napkin has the split losing at every width up to {max_dim}"


# ---- the whole bench ------------------------------------------------------------------------
QUICK = {"sizes": (96, 6144, 393216, 1572864), "widths": (256, 1024), "repeats": 8,
         "all_reduce_repeats": 12}


def bench_tp(model: str = "target", *, widths=WIDTHS, sizes=ALL_REDUCE_SIZES, layers: int = 2,
             context: int = 16, repeats: int = 40, all_reduce_repeats: int = 40,
             worlds=None, quick: bool = False, seed: int = 0) -> dict:
    """`minillm bench tp`: the all-reduce and its fit, the step at TP = 1 and W for the shipped
    `model` and a sweep of widths, the napkin beside each, the crossovers, copies against split
    (at the shipped size and the widest width). `worlds`: default 2, and 4 where the machine has
    4 CPUs. `quick`: a few sizes and widths (tests)."""
    if quick:
        sizes, widths = QUICK["sizes"], QUICK["widths"]
        repeats, all_reduce_repeats = QUICK["repeats"], QUICK["all_reduce_repeats"]
    cpus = os.cpu_count() or 1
    worlds = list(worlds or ([2, 4] if cpus >= 4 else [2]))
    for name, v in (("repeats", repeats), ("all-reduce repeats", all_reduce_repeats),
                    ("context", context), ("layers", layers)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    if not widths or any(w < 2 for w in worlds):
        raise ValueError(f"need at least one width and world sizes >= 2, got {list(widths)}, "
                         f"{worlds}")
    for d in widths:                  # refused now, before a minute of timing
        width_config(d, layers)
        if d % 128:
            raise ValueError(f"the width {d} has {d // 64} heads of 64, which 2 ranks cannot "
                             f"split; use multiples of 128")
    _config_of(model)
    ar = time_all_reduce(sizes, 2, repeats=all_reduce_repeats)
    fit = fit_all_reduce(ar, 2)
    for r in ar:
        r["predicted_s"] = predicted_all_reduce(r["bytes"], fit)
        r["measured_over_fit"] = r["median_s"] / r["predicted_s"]
    ratios = [r["measured_over_fit"] for r in ar]
    out = {"model": model, "cpus": cpus, "context": context, "layers": layers, "repeats": repeats,
           "all_reduce": {"rows": ar, "fit": fit, "worst_ratio": max(max(ratios),
                                                                     1 / min(ratios)),
                          "within_2x": all(0.5 <= v <= 2 for v in ratios)},
           "worlds": {}}
    for W in worlds:
        if W != 2:           # the napkin's link and alpha for W ranks: fit at W ranks too
            ar_w = time_all_reduce(sizes, W, repeats=all_reduce_repeats)
            fit_w = fit_all_reduce(ar_w, W)
        else:
            fit_w = fit
        dims = [d for d in widths if (d // 64) % W == 0]
        if not dims:
            raise ValueError(f"no width in {list(widths)} splits over {W} ranks (heads of 64: "
                             f"use multiples of {64 * W})")
        from ..parallel import shard_plan
        try:                             # the shipped model, where its heads split W ways
            shard_plan(_config_of(model), W, 0)
            specs, skipped = {model: model}, None
        except ValueError as e:
            specs, skipped = {}, str(e)
        specs.update({f"D={d}": width_config(d, layers) for d in dims})
        widest = f"D={max(dims)}"
        m = time_tp_steps(specs, W, context=context, repeats=repeats,
                          copies=[n for n in (model, widest) if n in specs], seed=seed)
        bw = m["bandwidth"]
        rows = []
        for name, spec in specs.items():
            cfg = _config_of(spec)
            row = {"name": name, "dim": cfg.dim, "layers": cfg.n_layers,
                   "hidden": cfg.hidden_dim, "vocab": cfg.vocab_size, **m["steps"][name]}
            p1 = predicted_step(cfg, 1, bw["one_thread"], fit_w, context=context,
                                flops_per_s=bw["flops_per_s_one_thread"])
            pw = predicted_step(cfg, W, bw["one_thread"], fit_w, context=context,
                                flops_per_s=bw["flops_per_s_one_thread"])
            pt = predicted_step(cfg, 1, bw["w_threads"], fit_w, context=context,
                                flops_per_s=bw["flops_per_s_one_thread"])
            shared = predicted_step(cfg, W, bw["concurrent"], fit_w, context=context,
                                    flops_per_s=bw["flops_per_s_one_thread"])
            row["predicted"] = {"tp_shared_memory_s": shared["latency_s"],
                                "bandwidth_rank_concurrent": shared["bandwidth"],
                                "tp1_1thread_s": p1["latency_s"], "tp1_wthreads_s":
                                pt["latency_s"], "tp_s": pw["latency_s"],
                                "tp_comm_s": pw["comm_s"], "tp_memory_s": pw["memory_time_s"],
                                "bandwidth_1thread": p1["bandwidth"],
                                "bandwidth_rank": pw["bandwidth"],
                                "bandwidth_wthreads": pt["bandwidth"]}
            row["split_over_whole"] = row["tp_s"] / row["tp1_1thread_s"]
            row["split_over_equal_threads"] = row["tp_s"] / row["tp1_wthreads_s"]
            rows.append(row)
        sweep = [r for r in rows if r["name"] != model]
        meas, meas_why = crossover_measured([r["dim"] for r in sweep],
                                            [r["tp1_1thread_s"] for r in sweep],
                                            [r["tp_s"] for r in sweep])
        # the napkin with this machine's figures: the fitted alpha and link, and for the split
        # the bandwidth each rank gets while all read at once (the ranks share one memory; a
        # GPU has its own); beside it lab 01's assumption, every rank reading at 1 core alone
        pred, pred_why = crossover_predicted(fit_w, bw["one_thread"], W, context=context,
                                             shape=lambda d: width_config(d, layers),
                                             split_bandwidth=bw["concurrent"])
        own, own_why = crossover_predicted(fit_w, bw["one_thread"], W, context=context,
                                           shape=lambda d: width_config(d, layers))
        both = meas is not None and pred is not None
        # the all-reduce as the split step saw it (its wait for the slower rank included):
        # alpha that would explain each sweep row's measured all-reduce time, the median
        seen = median([s["tp_allreduces_s"] / (2 * s["layers"])
                       - (predicted_all_reduce(4 * s["dim"], fit_w) - fit_w["alpha_s"])
                       for s in sweep])
        fit_seen = {**fit_w, "alpha_s": max(seen, 0.0)}
        pred_seen, why_seen = crossover_predicted(fit_seen, bw["one_thread"], W,
                                                  context=context,
                                                  shape=lambda d: width_config(d, layers),
                                                  split_bandwidth=bw["concurrent"])
        copies = []
        for r in rows:
            if "copies_s" in r:
                copies.append({"name": r["name"], "dim": r["dim"],
                               "copies_tok_s": W / r["copies_s"], "split_tok_s": 1 / r["tp_s"],
                               "throughput_ratio": (W / r["copies_s"]) / (1 / r["tp_s"]),
                               "copies_latency_s": r["copies_s"], "split_latency_s": r["tp_s"],
                               "latency_ratio": r["copies_s"] / r["tp_s"],
                               "past_measured_crossover": None if meas is None
                               else r["dim"] > meas})
        out["worlds"][str(W)] = {
            "fit": fit_w, "bandwidth": bw, "steps": rows, "model_skipped": skipped,
            "crossover": {"measured_dim": meas, "measured_reason": meas_why,
                          "predicted_dim": pred, "predicted_reason": pred_why,
                          "predicted_dim_own_memory": own, "predicted_own_memory_reason": own_why,
                          "in_step_alpha_s": fit_seen["alpha_s"],
                          "predicted_dim_as_seen": pred_seen,
                          "predicted_as_seen_reason": why_seen,
                          "measured_over_predicted": meas / pred if both else None,
                          "within_2x": (0.5 <= meas / pred <= 2) if both else None},
            "equal_threads_wins": [r["name"] for r in rows if r["tp_s"] < r["tp1_wthreads_s"]],
            "copies_vs_split": copies}
    return out
