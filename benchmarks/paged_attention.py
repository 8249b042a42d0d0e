"""Paged decode attention on one GPU: the Triton kernels (kernels/paged_attention.py) against
torch SDPA on a contiguous cache and against a device copy, in one run.

    python benchmarks/paged_attention.py                 # the issue's two settings (below)
    python benchmarks/paged_attention.py --json > out.json   # figures for benchmarks/RESULTS.md
    python benchmarks/paged_attention.py --sweep         # also try other tile sizes / splits
    python benchmarks/paged_attention.py --dry-run       # tiny sizes on any machine (CPU:
                                                         # Triton interpreter); checks the code
                                                         # path, measures nothing meaningful

What it measures.

1. Batch decode: B = 32 sequences of 4096 tokens, 32 query / 8 KV heads of dim 128, bf16,
   blocks of 16 tokens whose ids are shuffled (a fragmented pool, as after hours of serving).
   - paged     paged_attention_decode (one program per sequence and KV head)
   - sdpa      torch.nn.functional.scaled_dot_product_attention, one query per sequence,
               on the same K/V stored contiguously [B, K, L, H], two ways: `sdpa_gqa`
               (enable_gqa=True) and `sdpa_grouped` (the G = N / K query heads of a KV head
               passed as G query positions of one head: the same math, an MHA-shaped call)
   The decode step reads the cache once: bytes moved = K and V of every context token
   (2 * sum(L) * K * H * 2 bytes) + q + out (+ block tables and lengths for paged). At
   B = 32, L = 4096 that is 537 MB per layer; every other byte is noise.
2. Long context at batch 1: one sequence of 32768 tokens, same heads. The unsplit kernel has
   only K = 8 programs; paged_attention_decode_split (flash-decoding) cuts the context into
   enough splits to fill the GPU and merges them by log-sum-exp.

Columns: median time over interleaved rounds (the L2 cache flushed before each call, so the
cache streams from HBM as in a real forward pass), GB/s = bytes moved / time, % of copy =
GB/s relative to a device-to-device copy measured in the same run (read + write bytes), and
ratios. Every kernel's output is compared with the torch reference before it is timed.

Goals (issue 6): paged >= 75% of copy bandwidth, paged >= 0.9x the speed of the best SDPA,
split >= 4x faster than unsplit at B = 1, L = 32768.
Without a CUDA GPU (and without --dry-run) it says so and exits 0.

Its figures feed benchmarks/RESULTS.md, "Paged attention kernels (lab 07, NVIDIA H100)" and
"What the kernels tried (NVIDIA H100)".
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

# Run from anywhere: import the repo's kernels/ package rather than whatever is installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import Timer, check, copy_bandwidth, nbytes  # noqa: E402

GOALS = {"pct_of_copy": 75.0, "vs_sdpa": 0.9, "split_speedup": 4.0}
FULL = {"batch": dict(B=32, L=4096, N=32, K=8, H=128, block=16),
        "long": dict(B=1, L=32768, N=32, K=8, H=128, block=16)}
DRY = {"batch": dict(B=2, L=40, N=8, K=2, H=16, block=4),
       "long": dict(B=1, L=96, N=8, K=2, H=16, block=4)}


# ---- the problem -------------------------------------------------------------------------------
def make_problem(B, L, N, K, H, block, device, dtype, gen):
    """A paged cache holding B sequences of L tokens in shuffled blocks, the same K/V laid out
    contiguously [B, K, L, H] for SDPA, and one query per sequence."""
    n_blocks_seq = -(-L // block)
    num_blocks = B * n_blocks_seq + 1                      # + 1 spare: ids are not just 0..n-1
    k = torch.randn(B, K, L, H, generator=gen).to(device, dtype)
    v = torch.randn(B, K, L, H, generator=gen).to(device, dtype)
    ids = torch.randperm(num_blocks, generator=gen)[:B * n_blocks_seq]
    tables = ids.reshape(B, n_blocks_seq).to(device, torch.int32)
    k_cache = torch.zeros(num_blocks, block, K, H, device=device, dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    pos = torch.arange(L, device=device)
    for b in range(B):           # sequence b: position p -> (table[p // block], p % block)
        blk, row = tables[b, pos // block].long(), pos % block
        k_cache[blk, row] = k[b].transpose(0, 1)
        v_cache[blk, row] = v[b].transpose(0, 1)
    lens = torch.full((B,), L, device=device, dtype=torch.int32)
    q = torch.randn(B, N, H, generator=gen).to(device, dtype)
    return dict(q=q, k_cache=k_cache, v_cache=v_cache, tables=tables, lens=lens, k=k, v=v)


def sdpa_gqa(q, k, v):
    """q [B, N, H], k/v [B, K, L, H] -> [B, N, H] with enable_gqa."""
    return F.scaled_dot_product_attention(q[:, :, None], k, v, enable_gqa=True)[:, :, 0]


def sdpa_grouped(q, k, v):
    """The G query heads of each KV head as G query positions of one head (no mask: a decode
    token sees the whole context), so SDPA runs an MHA-shaped problem and reads K/V once."""
    B, N, H = q.shape
    K = k.shape[1]
    return F.scaled_dot_product_attention(q.reshape(B, K, N // K, H), k, v).reshape(B, N, H)


# ---- the two settings --------------------------------------------------------------------------
def bench_batch(p: dict, timer: Timer, copy_gbps: float, warmup: int, repeats: int) -> list:
    from kernels import paged_attention_decode, paged_attention_decode_ref
    q, kc, vc, tables, lens, k, v = (p[n] for n in ("q", "k_cache", "v_cache", "tables", "lens",
                                                    "k", "v"))
    want = paged_attention_decode_ref(q, kc, vc, tables, lens)
    check(paged_attention_decode(q, kc, vc, tables, lens), want, "paged decode")
    have_gqa = "enable_gqa" in (F.scaled_dot_product_attention.__doc__ or "")
    fns = {"paged": lambda: paged_attention_decode(q, kc, vc, tables, lens, validate=False),
           "sdpa_grouped": lambda: sdpa_grouped(q, k, v)}
    check(sdpa_grouped(q, k, v), want, "sdpa_grouped")
    if have_gqa:
        check(sdpa_gqa(q, k, v), want, "sdpa_gqa")
        fns["sdpa_gqa"] = lambda: sdpa_gqa(q, k, v)
    kv_bytes = nbytes(k, v)                       # = the K/V of every context token, once
    moved = {name: kv_bytes + 2 * nbytes(q) for name in fns}
    moved["paged"] += nbytes(tables, lens)
    t = timer.run(fns, warmup, repeats)
    best_sdpa = min(t[n] for n in fns if n.startswith("sdpa"))
    rows = []
    for name in fns:
        gbps = moved[name] / t[name] / 1e9
        rows.append({"setting": "batch", "kernel": name, "time_us": t[name] * 1e6,
                     "bytes": moved[name], "GBps": gbps, "pct_of_copy": 100 * gbps / copy_gbps,
                     "speed_vs_best_sdpa": best_sdpa / t[name]})
    return rows


def bench_long(p: dict, timer: Timer, copy_gbps: float, warmup: int, repeats: int,
               num_splits: int | None) -> list:
    from kernels import (
        paged_attention_decode,
        paged_attention_decode_ref,
        paged_attention_decode_split,
    )
    from kernels.paged_attention import _n_sm
    from kernels.paged_attention_ref import pick_num_splits
    q, kc, vc, tables, lens = (p[n] for n in ("q", "k_cache", "v_cache", "tables", "lens"))
    B, N, H = q.shape
    if num_splits is None:
        num_splits = pick_num_splits(B, kc.shape[2], tables.shape[1], kc.shape[1],
                                     n_sm=_n_sm(q.device))
    want = paged_attention_decode_ref(q, kc, vc, tables, lens)
    check(paged_attention_decode(q, kc, vc, tables, lens), want, "unsplit decode")
    check(paged_attention_decode_split(q, kc, vc, tables, lens, num_splits=num_splits), want,
          "split decode")
    fns = {"unsplit": lambda: paged_attention_decode(q, kc, vc, tables, lens, validate=False),
           "split": lambda: paged_attention_decode_split(q, kc, vc, tables, lens,
                                                         num_splits=num_splits, validate=False)}
    moved = nbytes(p["k"], p["v"]) + 2 * nbytes(q) + nbytes(tables, lens)
    scratch = B * N * num_splits * (H + 1) * 4 * 2           # partials written, then read back
    t = timer.run(fns, warmup, repeats)
    rows = []
    for name in fns:
        m = moved + (scratch if name == "split" else 0)
        gbps = m / t[name] / 1e9
        rows.append({"setting": "long", "kernel": name, "time_us": t[name] * 1e6, "bytes": m,
                     "GBps": gbps, "pct_of_copy": 100 * gbps / copy_gbps,
                     "speedup_vs_unsplit": t["unsplit"] / t[name],
                     "num_splits": num_splits if name == "split" else 1})
    return rows


def sweep(p_batch: dict, p_long: dict, timer: Timer, warmup: int, repeats: int,
          small: bool = False) -> list:
    """Other tile sizes for the unsplit kernel (batch setting) and other split counts (long);
    small=True tries just two of each (dry runs)."""
    from kernels import paged_attention as pa
    from kernels.paged_attention_ref import check_decode_args
    out = []
    q, kc, vc, tables, lens = (p_batch[n] for n in ("q", "k_cache", "v_cache", "tables", "lens"))
    _, scale = check_decode_args(q, kc, vc, tables, lens, None)
    o = torch.empty_like(q)
    default = pa.pick_decode_config(q.shape[2], q.shape[1] // kc.shape[2])
    cfgs = [pa.DecodeConfig(bn, w, s) for bn in (16, 32, 64, 128) for w in (2, 4, 8)
            for s in (1, 2, 3, 4)]
    if small:
        cfgs = [pa.DecodeConfig(16, 4, 2)]
    want = None
    fns = {}
    for cfg in [default] + [c for c in cfgs if c != default]:
        pa._launch_decode(q, kc, vc, tables, lens, scale, o, cfg)
        if want is None:
            want = o.clone()
        check(o, want, f"config {cfg}")
        fns[cfg] = (lambda cfg=cfg: pa._launch_decode(q, kc, vc, tables, lens, scale, o, cfg))
    t = timer.run(fns, warmup, repeats)
    best = min(t, key=t.get)
    print(f"sweep batch: default {t[default] * 1e6:.1f} us {default}; best "
          f"{t[best] * 1e6:.1f} us {best}")
    out.append({"setting": "batch", "default": vars(default), "default_us": t[default] * 1e6,
                "best": vars(best), "best_us": t[best] * 1e6})
    q, kc, vc, tables, lens = (p_long[n] for n in ("q", "k_cache", "v_cache", "tables", "lens"))
    _, scale = check_decode_args(q, kc, vc, tables, lens, None)
    o = torch.empty_like(q)
    splits = sorted({s for s in ((2, 4) if small else (4, 8, 16, 24, 33, 48, 64, 96, 128, 256))
                     if s <= tables.shape[1]})
    fns = {s: (lambda s=s: pa._launch_decode_split(q, kc, vc, tables, lens, scale, o, s))
           for s in splits}
    t = timer.run(fns, warmup, repeats)
    best = min(t, key=t.get)
    print("sweep long: " + ", ".join(f"{s} splits {t[s] * 1e6:.1f} us" for s in splits))
    out.append({"setting": "long", "times_us": {str(s): t[s] * 1e6 for s in splits},
                "best_splits": best})
    return out


# ---- main --------------------------------------------------------------------------------------
def run(dry_run: bool, warmup: int, repeats: int, num_splits: int | None, do_sweep: bool,
        sizes: dict | None = None) -> dict:
    """All measurements; returns the report dict (see --json)."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    sizes = sizes or (DRY if dry_run else FULL)
    if dry_run and num_splits is None:
        num_splits = 3                 # a CPU has no SMs to fill; still exercise the split path
    gen = torch.Generator().manual_seed(0)
    timer = Timer(device)
    copy_gbps = copy_bandwidth(device, 2**20 if dry_run else 2**30, 5 if dry_run else 20)
    p_batch = make_problem(**sizes["batch"], device=device, dtype=torch.bfloat16, gen=gen)
    p_long = make_problem(**sizes["long"], device=device, dtype=torch.bfloat16, gen=gen)
    rows = bench_batch(p_batch, timer, copy_gbps, warmup, repeats)
    rows += bench_long(p_long, timer, copy_gbps, warmup, repeats, num_splits)
    paged = next(r for r in rows if r["kernel"] == "paged")
    split = next(r for r in rows if r["kernel"] == "split")
    got = {"pct_of_copy": paged["pct_of_copy"], "vs_sdpa": paged["speed_vs_best_sdpa"],
           "split_speedup": split["speedup_vs_unsplit"]}
    goals = {k: {"want": GOALS[k], "got": got[k], "met": got[k] >= GOALS[k]} for k in GOALS}
    import triton
    report = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
              "dry_run": dry_run, "date": datetime.datetime.now().isoformat(timespec="seconds"),
              "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]),
              "torch": torch.__version__, "triton": triton.__version__,
              "sizes": sizes, "dtype": "bfloat16", "copy_GBps": copy_gbps,
              "repeats": repeats, "rows": rows, "goals": goals}
    if do_sweep:
        report["sweep"] = sweep(p_batch, p_long, timer, warmup, max(3, repeats // 2),
                                small=dry_run)
    return report


def print_report(report: dict) -> None:
    if report["dry_run"]:
        print(f"DRY RUN on {report['device']} at tiny sizes: this checks the benchmark's code "
              f"path; the figures below are NOT measurements of the kernels' speed.")
    sb, sl = report["sizes"]["batch"], report["sizes"]["long"]
    print(f"{report['device']}  torch {report['torch']}  triton {report['triton']}  "
          f"{report['date']}\ndevice-to-device copy: {report['copy_GBps']:.0f} GB/s   "
          f"bf16   median of {report['repeats']} interleaved rounds"
          f"{'' if report['dry_run'] else ', L2 flushed'}\n")
    print(f"batch: B={sb['B']} L={sb['L']} N={sb['N']} K={sb['K']} H={sb['H']} "
          f"block={sb['block']}")
    print(f"{'kernel':>13} {'time us':>9} {'MB moved':>9} {'GB/s':>7} {'% copy':>7} "
          f"{'vs sdpa':>8}")
    for r in report["rows"]:
        if r["setting"] == "batch":
            print(f"{r['kernel']:>13} {r['time_us']:>9.1f} {r['bytes'] / 1e6:>9.2f} "
                  f"{r['GBps']:>7.0f} {r['pct_of_copy']:>6.0f}% {r['speed_vs_best_sdpa']:>7.2f}x")
    print(f"\nlong: B={sl['B']} L={sl['L']} N={sl['N']} K={sl['K']} H={sl['H']} "
          f"block={sl['block']}")
    print(f"{'kernel':>13} {'splits':>6} {'time us':>9} {'MB moved':>9} {'GB/s':>7} "
          f"{'% copy':>7} {'speedup':>8}")
    for r in report["rows"]:
        if r["setting"] == "long":
            print(f"{r['kernel']:>13} {r['num_splits']:>6} {r['time_us']:>9.1f} "
                  f"{r['bytes'] / 1e6:>9.2f} {r['GBps']:>7.0f} {r['pct_of_copy']:>6.0f}% "
                  f"{r['speedup_vs_unsplit']:>7.2f}x")
    print()
    names = {"pct_of_copy": "paged decode % of copy bandwidth",
             "vs_sdpa": "paged decode speed vs best SDPA", "split_speedup":
             "split-K speed-up over unsplit at B=1"}
    tag = "  [dry run: meaningless]" if report["dry_run"] else ""
    for k, g in report["goals"].items():
        print(f"goal {names[k]} >= {g['want']:g}: {g['got']:.2f} -> "
              f"{'met' if g['met'] else 'NOT met'}{tag}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--warmup", type=int, default=5, help="untimed interleaved rounds")
    ap.add_argument("--repeats", type=int, default=50, help="timed interleaved rounds")
    ap.add_argument("--splits", type=int, default=None,
                    help="num_splits for the long setting (default: pick_num_splits)")
    ap.add_argument("--sweep", action="store_true", help="also time other tiles / split counts")
    ap.add_argument("--dry-run", action="store_true",
                    help="tiny sizes, runs anywhere (Triton interpreter on a CPU); no figures")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead")
    ap.add_argument("--json-out", metavar="FILE", help="also write the JSON object to FILE")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available() and not args.dry_run:
        print("benchmarks/paged_attention.py times GPU kernels (Triton vs torch SDPA) and needs a "
              "CUDA GPU; none here, so nothing was measured. (`--dry-run` runs its code path at "
              "tiny sizes; correctness is tested by tests/test_kernels_paged.py.)")
        return 0
    warmup, repeats = (1, 2) if args.dry_run else (args.warmup, args.repeats)
    report = run(args.dry_run, warmup, repeats, args.splits, args.sweep)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(report, indent=1))
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print_report(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())

