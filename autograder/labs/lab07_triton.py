"""Lab 07's Triton kernels: the launchers (probes) and the checks: each of DECODE_CASES /
SPLIT_CASES on a fenced case, the likely mistake named; on a GPU, timed (KERNEL_SPEED)."""
from __future__ import annotations

import functools
import math

import torch

from autograder.labs import kernelcheck as kc
from autograder.probes import probe
from kernels.intmath import cdiv
from kernels.paged_attention_ref import merge_splits, paged_attention_decode_ref
from kernels.tiles import kernel_tiles, tokens_per_split
from kernels.tiles import paged_tile_walk as tile_walk  # noqa: F401 (the notebook's tri.tile_walk)

# the course's kernel reaches 95 % of a copy on an H100 (split 74 %: benchmarks/RESULTS.md); well
# below, so that another tiling or fp32 dots pass (not yet measured against the solution)
KERNEL_SPEED = {"min_fraction_of_copy": 0.2, "min_ratio_to_reference": 0.3}


def _scale(q, k_cache, v_cache, block_tables, context_lens, scale) -> float:
    """The scale, after the launch's shape and dtype checks (no value checks: no GPU sync)."""
    if k_cache.dim() != 4 or v_cache.shape != k_cache.shape or q.dim() != 3 or \
            q.shape[2] != k_cache.shape[3] or q.shape[1] % k_cache.shape[2]:
        raise ValueError(f"expected q [B_seq, N, H] and caches [num_blocks, block_size, K, H], "
                         f"N a multiple of K, got {tuple(q.shape)}, {tuple(k_cache.shape)} and "
                         f"{tuple(v_cache.shape)}")
    if not (q.dtype == k_cache.dtype == v_cache.dtype) or not q.dtype.is_floating_point:
        raise ValueError(f"q and the caches must share one float dtype, got {q.dtype}, "
                         f"{k_cache.dtype}, {v_cache.dtype}")
    B = q.shape[0]
    if block_tables.dtype != torch.int32 or block_tables.dim() != 2 or block_tables.shape[0] != B \
            or context_lens.dtype != torch.int32 or tuple(context_lens.shape) != (B,):
        raise ValueError(f"block_tables must be int32 [B_seq={B}, max_blocks] and context_lens "
                         f"int32 [B_seq], got {block_tables.dtype} {tuple(block_tables.shape)} and "
                         f"{context_lens.dtype} {tuple(context_lens.shape)}")
    return q.shape[2] ** -0.5 if scale is None else float(scale)


def _paged(kernel, ins, scale=None, block_t=None, outs=None, splits=None) -> list:
    """The decode (splits None) or split kernel on ins into outs ([out] or [partials, lse])."""
    scale = _scale(*ins, scale)
    q, k_cache, v_cache, tables, lens = (t.contiguous() for t in ins)
    (B, N, H), (_, block_size, K, _) = q.shape, k_cache.shape
    extra = () if splits is None else (tokens_per_split(tables.shape[1], block_size, splits),
                                       splits)
    want = [((B, N, H), q.dtype)] if splits is None else \
        [((B, N, splits, H), torch.float32), ((B, N, splits), torch.float32)]
    outs = outs or [torch.empty(shape, dtype=dtype, device=q.device) for shape, dtype in want]
    for t, (shape, dtype) in zip(outs, want):
        if tuple(t.shape) != shape or t.dtype != dtype or not t.is_contiguous():
            raise ValueError(f"the outputs must be contiguous {[(s, str(d)) for s, d in want]}")
    if B:
        kc.launch(kernel, (B, K, *extra[1:]), q, k_cache, v_cache, tables, lens, *outs, scale, K,
                  tables.shape[1], block_size, N // K, H, *extra,
                  **kernel_tiles(N, K, H, block_t, cuda=q.is_cuda))
    return outs


@probe
def launch_decode(kernel, q, k_cache, v_cache, block_tables, context_lens, scale=None, *,
                  out=None, block_t=None):
    """`kernel[(B_seq, K)](q, k_cache, v_cache, block_tables, context_lens, out, scale, K,
    max_blocks, block_size, G, H, BLOCK_T=, BLOCK_G=, BLOCK_H=)`: out [B_seq, N, H]."""
    ins, home = kc.placed(q, k_cache, v_cache, block_tables, context_lens)
    return _paged(kernel, ins, scale, block_t, None if out is None else
                  [out.to(ins[0].device)])[0].to(home)


@probe
def launch_split(kernel, q, k_cache, v_cache, block_tables, context_lens, num_splits: int,
                 scale=None, *, block_t=None):
    """As launch_decode on grid (B_seq, K, S), with partials, lse for out and tokens_per_split,
    S after H: (partials, lse)."""
    ins, home = kc.placed(q, k_cache, v_cache, block_tables, context_lens)
    return tuple(t.to(home) for t in _paged(kernel, ins, scale, block_t, splits=num_splits))


# (context lens, N, K, H, block_size, dtype, BLOCK_T, scale, large scores, num_splits, what)
DECODE_CASES = (
    ([1, 7, 16, 37], 4, 2, 16, 4, torch.float32, 16, None, False, None,
     "G = 2, lengths 1, 7, 16, 37 (blocks of 4, tiles of 16)"),
    ([9, 3], 2, 2, 8, 8, torch.bfloat16, 16, 0.3, False, None,
     "G = 1 (one query head per KV head), H = 8, bf16 cache, scale 0.3"),
    ([33, 20], 8, 2, 12, 5, torch.float16, 32, None, False, None,
     "G = 4, H = 12, blocks of 5, tiles of 32, fp16 cache"),
    ([40, 23], 4, 2, 16, 8, torch.float32, 16, None, True, None,
     "scores of 110 to 220 (exp overflows float32 above 88.7)"),
)
SPLIT_CASES = (
    ([1, 30, 17], 4, 2, 16, 4, torch.float32, 16, None, False, 4,
     "4 splits of 12 positions, G = 2: 1 to 3 of them empty in each sequence"),
    ([45, 6], 2, 1, 8, 8, torch.bfloat16, 16, 0.3, False, 2,
     "2 splits of 32 positions (2 tiles each), G = 2 on one KV head, H = 8, bf16, scale 0.3"),
    ([40, 12], 8, 2, 16, 8, torch.float32, 16, None, True, 2,
     "2 splits of 32, G = 4, scores of 110 to 220"),
    ([13], 2, 2, 12, 5, torch.float16, 32, None, False, 1,
     "1 split (the whole context), G = 1, H = 12, blocks of 5, fp16 cache"),
)


def kernel_case(lens, N, K, H, block_size, dtype=torch.float32, block_t=16, large=False,
                seed=0, device="cpu"):
    """(q, k_cache, v_cache, block_tables, context_lens) fenced, blocks shuffled, NaN in unowned
    slots, tables wide enough for an unmasked tile; large: scores of 110-220."""
    g = torch.Generator().manual_seed(seed)
    need = [cdiv(L, block_size) for L in lens]
    spare = 3
    num_blocks = sum(need) + spare
    reach = max(cdiv(L, block_t) * block_t for L in lens)        # positions an unmasked tile reads
    width = cdiv(reach, block_size) + 1
    perm = torch.randperm(num_blocks, generator=g).tolist()
    owned, spares = perm[:sum(need)], perm[sum(need):]
    k_cache, v_cache = (torch.full((num_blocks, block_size, K, H), math.nan) for _ in "kv")
    tables = torch.full((len(lens), width), -1, dtype=torch.int32)
    common = torch.randn(K, H, generator=g)
    common = common / common.norm(dim=-1, keepdim=True) * H ** 0.5      # |common|^2 = H
    for b, L in enumerate(lens):
        ids = owned[sum(need[:b]):sum(need[:b + 1])]
        extra = [spares[(b + j) % spare] if j % 2 else -1 for j in range(width - need[b])]
        tables[b] = torch.tensor(ids + extra, dtype=torch.int32)
        k = torch.randn(L, K, H, generator=g)
        if large:
            k = common + 0.5 * k
        pos = torch.arange(L)
        blk = torch.tensor(ids)[pos // block_size]
        k_cache[blk, pos % block_size] = k
        v_cache[blk, pos % block_size] = torch.randn(L, K, H, generator=g)
    q = torch.randn(len(lens), N, H, generator=g)
    if large:       # q . k = 40 |common|^2 + ...: scale * q . k = 40 sqrt(H) + O(sqrt(H))
        q = 40.0 * common.repeat_interleave(N // K, dim=0)[None] + q
    q, k_cache, v_cache = (t.to(dtype).to(device) for t in (q, k_cache, v_cache))
    pads = kernel_tiles(N, K, H)
    q = kc.nan_padded(q, pad=pads["BLOCK_G"] * pads["BLOCK_H"])[0]
    k_cache, v_cache = (kc.nan_padded(t, pad=block_size * K * H)[0] for t in (k_cache, v_cache))
    tables = kc.nan_padded(tables.to(device), pad=block_t, fill=-1)[0]
    return q, k_cache, v_cache, tables, torch.tensor(lens, dtype=torch.int32, device=device)


def split_reference(q, k_cache, v_cache, tables, lens, scale, num_splits):
    """(partials, lse) a split kernel must write, fp32; zeros and -inf for an empty split."""
    from kernels.paged_attention_ref import _partial_attention
    tps = tokens_per_split(tables.shape[1], k_cache.shape[1], num_splits)
    scale, longest = q.shape[-1] ** -0.5 if scale is None else scale, int(lens.max())
    parts = [_partial_attention(q, k_cache, v_cache, tables, lens, scale, s * tps,
                                max(s * tps, min((s + 1) * tps, longest)))  # empty: zeros, -inf
             for s in range(num_splits)]
    return tuple(torch.stack(x, dim=2) for x in zip(*parts))


_OUT_TOL = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def _diagnose(got: torch.Tensor, want: torch.Tensor, name: str, large: bool, K: int,
              tol: float, rows: str) -> None:
    """AssertionError naming the likely mistake when got (float) differs from want."""
    bad_nan = ~torch.isfinite(got) & torch.isfinite(want)
    if bool(bad_nan.any()):
        if large:
            raise AssertionError(
                f"{name}: NaN or inf in the output. The scores here lie between 110 and 220, and "
                f"e^x overflows float32 above x = 88.7: keep the running max m and exponentiate "
                f"s - m, rescaling l and acc by exp(m_old - m_new) when m grows")
        raise AssertionError(
            f"{name}: NaN or inf in the output ({int(bad_nan.sum())} values). Slots that the "
            f"sequence does not own hold NaN here: mask the loads of positions >= "
            f"context_lens[b] (the ragged tail of the last tile), the table columns past the "
            f"sequence's last block, and the padding rows/columns of the q tile (other=0.0)")
    err = (got - want).abs()
    ok = err <= tol + tol * want.abs()
    if bool(ok.all()):
        return
    per_row = (~ok).flatten(2).any(-1) if got.dim() > 2 else ~ok     # (sequence, head) rows
    wrong = [tuple(int(i) for i in idx) for idx in per_row.nonzero()[:6]]
    G = got.shape[1] // K
    raise AssertionError(
        f"{name}: {int((~ok).sum())} of {ok.numel()} {rows} values differ from the reference "
        f"(largest difference {float(err.max()):.3g}, tolerance {tol:g} + {tol:g} |expected|); "
        f"wrong (sequence, query head) rows include {wrong}. Usual causes: query head n must "
        f"read KV head n // G (here G = {G}, K = {K}: the program of KV head kvh serves the "
        f"query heads kvh * G .. kvh * G + G - 1); the scores are scale * q . k, set to -inf "
        f"past the sequence's length; when the running max grows from m_old to m_new, l and "
        f"acc are rescaled by exp(m_old - m_new); the walk covers every tile of positions "
        f"0 .. context_lens[b] - 1")


@probe
def fenced_run(kernel, case, seed: int) -> list:
    """The kernel on kernel_case(case, seed) into NaN-filled fenced outputs: the whole buffers."""
    lens, N, K, H, block_size, dtype, block_t, scale, large, S = case[:10]
    ins = kernel_case(lens, N, K, H, block_size, dtype, block_t, large, seed, kc.device())
    tiles, B = kernel_tiles(N, K, H), len(lens)
    pad = tiles["BLOCK_G"] * (S or 1) * tiles["BLOCK_H"]
    shapes = [((B, N, H), dtype)] if S is None else [((B, N, S, H), torch.float32),
                                                     ((B, N, S), torch.float32)]
    fenced = [kc.nan_padded(torch.full(shape, float("nan"), dtype=dt, device=ins[0].device),
                            pad=pad) for shape, dt in shapes]
    _paged(kernel, ins, scale, block_t, [view for view, _ in fenced], S)
    return [buffer.cpu() for _, buffer in fenced]


def _check_case(kernel, case, seed: int) -> None:
    """AssertionError naming the likely mistake unless the kernel writes what it must."""
    lens, N, K, H, block_size, dtype, block_t, scale, large, S = case[:10]
    name = f"paged_{'decode' if S is None else 'split'}_kernel [{case[-1]}: lens {lens}, " \
           f"N = {N}, K = {K}, H = {H}, blocks of {block_size}, {str(dtype)[6:]}]"
    ins = kernel_case(lens, N, K, H, block_size, dtype, block_t, large, seed)
    want_out = paged_attention_decode_ref(*ins, scale).float()
    buffers = fenced_run(kernel, case, seed)
    if S is None:
        out = kc.unfenced(buffers[0], want_out.shape, name)
        return _diagnose(out.float(), want_out, name, large, K, _OUT_TOL[dtype], "output")
    want_part, want_lse = split_reference(*ins, scale, S)
    part = kc.unfenced(buffers[0], want_part.shape, f"{name}, partials")
    lse = kc.unfenced(buffers[1], want_lse.shape, f"{name}, lse")
    empty = torch.isinf(want_lse) & (want_lse < 0)
    if bool(torch.isnan(lse).any()) or bool(torch.isnan(part).any()):
        if large:
            _diagnose(part, want_part, f"{name}, partials", large, K, 1e-4, "partial output")
        raise AssertionError(
            f"{name}: NaN in the partials or the lse. Every program writes the partial output "
            f"and the lse of each of its G query heads, for an empty split (no position of the "
            f"sequence in its range) too: zeros and lse = -inf; and every load needs its mask "
            f"(slots the sequence does not own hold NaN here)")
    if bool((lse[empty] != float("-inf")).any()) or bool((lse[~empty] == float("-inf")).any()):
        where = (lse != want_lse) & (empty | torch.isinf(lse))
        raise AssertionError(
            f"{name}: an empty split must have lse = -inf (and only an empty one): (sequence, "
            f"head, split) {[tuple(int(i) for i in x) for x in where.nonzero()[:6]]} wrong; "
            f"split s covers positions [s * tokens_per_split, (s + 1) * tokens_per_split) cut "
            f"at context_lens[b]")
    if not bool(torch.isfinite(part[empty]).all()):
        raise AssertionError(f"{name}: an empty split must write a finite partial (zeros), not "
                             f"0 / 0")
    _diagnose(lse.masked_fill(empty, 0.0), want_lse.masked_fill(empty, 0.0), f"{name}, lse",
              large, K, 2e-5 if not large else 1e-5, "lse")
    _diagnose(part.masked_fill(empty[..., None], 0.0), want_part.masked_fill(empty[..., None],
              0.0), f"{name}, partials", large, K, 1e-4, "partial output")
    _diagnose(merge_splits(part, lse), want_out, f"{name}, merged output", large, K,
              max(_OUT_TOL[dtype], 1e-4), "output")


# (lens, N, K, H, block size, dtype) timed on a GPU; a tiny one for dry runs
SPEED = {"decode": ([4096] * 16, 32, 8, 128, 16, torch.bfloat16),
         "split": ([32768], 32, 8, 128, 16, torch.bfloat16)}
# the split kernel is timed with 33 splits, the count of benchmarks/RESULTS.md's H100 run (59.4 us
# in its sweep): a fixed number, so that the kernel's grade does not hang on the split rule
SPEED_SPLITS = 33
SPEED_DRY = ([37, 20], 4, 2, 16, 4, torch.float32)


def _speed_inputs(which: str, dry_run: bool, seed: int):
    """(inputs on the kernels' device, the bytes a step must read, the split count)."""
    from autograder.labs.lab07 import make_case
    lens, N, K, H, block_size, dtype = SPEED_DRY if dry_run else SPEED[which]
    q, k_cache, v_cache, tables, context_lens = make_case(seed, (lens, N, K, H, block_size))
    ins = [t.to(dtype) for t in (q, k_cache, v_cache)] + [tables, context_lens]
    nbytes = (2 * sum(lens) * K * H + 2 * q.numel()) * dtype.itemsize
    return ([t.to("cpu" if dry_run else "cuda") for t in ins], nbytes,
            2 if dry_run else SPEED_SPLITS)


@probe
def timed_kernel(which: str, kernel, *, dry_run: bool = False, seed: int = 7012,
                 warmup: int = 5, repeats: int = 30) -> dict:
    """Their "decode" or "split" kernel on _speed_inputs: {"out", "seconds": median}."""
    ins, _, splits = _speed_inputs(which, dry_run, seed)
    splits = None if which == "decode" else splits
    outs = _paged(kernel, ins, splits=splits)
    seconds = kc.seconds_per_call(lambda: _paged(kernel, ins, outs=outs, splits=splits),
                                  dry_run=dry_run, warmup=warmup, repeats=repeats)
    return {"out": [t.cpu() for t in outs], "seconds": seconds}


def kernel_speed(which: str, kernel, *, dry_run: bool = False, check: bool = False,
                 seed: int = 7012, warmup: int | None = None, repeats: int | None = None):
    """The kernel on SPEED[which] checked, then timed against the course's: the speed report."""
    from kernels.paged_attention import paged_attention_decode, paged_attention_decode_split
    warmup = (1 if dry_run else 5) if warmup is None else warmup
    repeats = (3 if dry_run else 30) if repeats is None else repeats
    ins, nbytes, splits = _speed_inputs(which, dry_run, seed)
    course = (functools.partial(paged_attention_decode, *ins, validate=False) if which == "decode"
              else functools.partial(paged_attention_decode_split, *ins, num_splits=splits,
                                     validate=False))
    got = timed_kernel(which, kernel, dry_run=dry_run, seed=seed, warmup=warmup, repeats=repeats)
    _diagnose((got["out"][0] if which == "decode" else merge_splits(*got["out"])).float(),
              course().float().cpu(), f"paged_{which}_kernel on the timing case", False,
              ins[1].shape[2], _OUT_TOL[ins[0].dtype], "output")
    report = kc.speed_report(got["seconds"], kc.seconds_per_call(
        course, dry_run=dry_run, warmup=warmup, repeats=repeats), nbytes, dry_run=dry_run)
    if check:
        kc.require_speed(report, f"paged_{which}_kernel", **KERNEL_SPEED)
    return {**report, "num_splits": splits if which == "split" else None}


def _check(which: str, kernel, *, speed="auto", seed: int | None = None) -> dict:
    """Every case of DECODE_CASES / SPLIT_CASES, then on a GPU (speed "auto"; "dry_run": on the
    CPU; None: skipped) KERNEL_SPEED: {"cases": n, "speed": the report or None}."""
    cases, first = {"decode": (DECODE_CASES, 7010), "split": (SPLIT_CASES, 7020)}[which]
    if speed not in ("auto", "gpu", "dry_run", None):
        raise ValueError(f"speed must be 'auto', 'gpu', 'dry_run' or None, got {speed!r}")
    if speed == "gpu" and not torch.cuda.is_available():
        raise RuntimeError("speed='gpu' needs a CUDA GPU (speed='dry_run' runs the code path on "
                           "the CPU)")
    for i, case in enumerate(cases):
        _check_case(kernel, case, (first if seed is None else seed) + i)
    timed = speed in ("gpu", "dry_run") or (speed == "auto" and torch.cuda.is_available())
    return {"cases": len(cases), "speed": kernel_speed(which, kernel, dry_run=speed == "dry_run",
                                                       check=True) if timed else None}


check_decode_kernel = functools.partial(_check, "decode")
check_split_kernel = functools.partial(_check, "split")
