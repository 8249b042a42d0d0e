"""Lab 07's Triton kernels, written by the student: the launchers the notebook uses and the checks
its hidden tests call (the torch paged decode's speed check is autograder/labs/lab07.py).

The launchers `launch_decode` and `launch_split` (grid, tile sizes, argument checks, scratch; the
kernel signature and the tensor layout are spelt out below) are probes (autograder/probes.py):
during a test they run in the student's kernel, the only place their Triton code runs. The
checks run in the tester: for each of DECODE_CASES / SPLIT_CASES the probe `fenced_run` builds
the case from its seed in the kernel (`kernel_case`: ragged lengths, shuffled blocks, NaN in
every slot no sequence owns and around every input and output, G = 1, 2, 4, fp32 / fp16 / bf16,
scores of 110-220 that overflow exp without the running max, empty splits), launches the kernel
and returns the fenced output buffers; the tester builds the same case, computes the course's
torch reference and names the likely mistake. On a GPU they also time the kernel in the kernel
(`timed_kernel`) against the course's, timed here, and a device copy (KERNEL_SPEED).

    from autograder.labs import lab07_triton as tri
    tri.check_decode_kernel(paged_decode_kernel)        # {"cases": 4, "speed": None | report}
"""
from __future__ import annotations

import torch

from autograder.labs import kernelcheck as kc
from autograder.probes import probe
from kernels.intmath import cdiv
from kernels.paged_attention_ref import merge_splits, paged_attention_decode_ref
from kernels.tiles import kernel_tiles, tokens_per_split
from kernels.tiles import paged_tile_walk as tile_walk  # noqa: F401 (the notebook's tri.tile_walk)

# The layout the kernels see (every tensor contiguous; the launchers make it so):
#   q, out        [B_seq, N, H]                 (b, n, h)    at (b * N + n) * H + h
#   k, v caches   [num_blocks, block_size, K, H] (slot, kvh, h) at (slot * K + kvh) * H + h,
#                                               slot = table[b, pos // block_size] * block_size
#                                                      + pos % block_size
#   block tables  int32 [B_seq, max_blocks]     (b, j)       at b * max_blocks + j
#   context lens  int32 [B_seq]
#   partials      float32 [B_seq, N, S, H]      (b, n, s, h) at ((b * N + n) * S + s) * H + h
#   lse           float32 [B_seq, N, S]         (b, n, s)    at (b * N + n) * S + s
# N = G * K: query head n reads KV head n // G.

KERNEL_SPEED = {"min_fraction_of_copy": 0.2, "min_ratio_to_reference": 0.3}
# On a GPU the student's kernel must reach a fifth of a device copy's bandwidth and 0.3x the
# speed of the course's kernel, which reaches 95 % of a copy (its split decode 74 %) on an H100
# (benchmarks/RESULTS.md): well below, so that another tiling, or float32 dots instead of the
# course's 16-bit tensor-core dots, still passes. (Not yet measured against the notebook's
# solution on a GPU: autograder/README.md.)


def _scale(q, k_cache, v_cache, block_tables, context_lens, scale) -> float:
    """Shape and dtype checks of a launch (no value checks: no GPU sync); the scale."""
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
    """The decode kernel (splits None) or the split kernel on ins = (q, k_cache, v_cache,
    block_tables, context_lens), into outs ([out] or [partials, lse]; allocated if None)."""
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
    """Run a decode kernel in the notebook's signature on grid (B_seq, K), one program per
    (sequence, KV head):

        kernel[(B_seq, K)](q, k_cache, v_cache, block_tables, context_lens, out,
                           scale, K, max_blocks, block_size, G, H,
                           BLOCK_T=..., BLOCK_G=..., BLOCK_H=...)

    Returns out [B_seq, N, H] in q's dtype (`out=`: a contiguous tensor to write into)."""
    ins, home = kc.placed(q, k_cache, v_cache, block_tables, context_lens)
    return _paged(kernel, ins, scale, block_t, None if out is None else
                  [out.to(ins[0].device)])[0].to(home)


@probe
def launch_split(kernel, q, k_cache, v_cache, block_tables, context_lens, num_splits: int,
                 scale=None, *, block_t=None):
    """Run a split (flash-decoding) kernel in the notebook's signature on grid
    (B_seq, K, num_splits), one program per (sequence, KV head, split):

        kernel[(B_seq, K, S)](q, k_cache, v_cache, block_tables, context_lens, partials, lse,
                              scale, K, max_blocks, block_size, G, H, tokens_per_split, S,
                              BLOCK_T=..., BLOCK_G=..., BLOCK_H=...)

    Returns (partials float32 [B_seq, N, S, H], lse float32 [B_seq, N, S]);
    merge_partials(partials, lse) is the attention output."""
    ins, home = kc.placed(q, k_cache, v_cache, block_tables, context_lens)
    return tuple(t.to(home) for t in _paged(kernel, ins, scale, block_t, splits=num_splits))


# --- the cases the checks run ------------------------------------------------------------------
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
# (the notebook's visible tests use kernel_case too, on other lengths and seeds)


def kernel_case(lens, N, K, H, block_size, dtype=torch.float32, block_t=16, large=False,
                seed=0, device="cpu"):
    """(q, k_cache, v_cache, block_tables, context_lens) for a kernel check, every tensor inside
    a fence: the caches and q inside NaN, the tables inside -1. The sequences' blocks are
    shuffled in the pool; every slot no sequence owns holds NaN (spare blocks and the tail of
    each last block); table columns past a sequence's last block hold -1 or a spare block's id,
    and the table is wide enough that a tile read without a mask stays in its row. large=True:
    the scores scale * q . k lie between about 110 and 220 (a component the keys share)."""
    g = torch.Generator().manual_seed(seed)
    need = [cdiv(L, block_size) for L in lens]
    spare = 3
    num_blocks = sum(need) + spare
    reach = max(cdiv(L, block_t) * block_t for L in lens)        # positions an unmasked tile reads
    width = cdiv(reach, block_size) + 1
    perm = torch.randperm(num_blocks, generator=g).tolist()
    owned, spares = perm[:sum(need)], perm[sum(need):]
    k_cache = torch.full((num_blocks, block_size, K, H), float("nan"))
    v_cache = torch.full((num_blocks, block_size, K, H), float("nan"))
    tables = torch.full((len(lens), width), -1, dtype=torch.int32)
    common = torch.randn(K, H, generator=g)
    common = common / common.norm(dim=-1, keepdim=True) * H ** 0.5      # |common|^2 = H
    start = 0
    for b, L in enumerate(lens):
        ids = owned[start:start + need[b]]
        start += need[b]
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
    k_cache = kc.nan_padded(k_cache, pad=block_size * K * H)[0]
    v_cache = kc.nan_padded(v_cache, pad=block_size * K * H)[0]
    tables = kc.nan_padded(tables.to(device), pad=block_t, fill=-1)[0]
    return q, k_cache, v_cache, tables, torch.tensor(lens, dtype=torch.int32, device=device)


def split_reference(q, k_cache, v_cache, tables, lens, scale, num_splits):
    """What a split kernel must write, from the course's torch reference: (partials
    [B, N, S, H], lse [B, N, S]) in float32, zeros and -inf for the empty splits."""
    import kernels.paged_attention_ref as par
    tps = tokens_per_split(tables.shape[1], k_cache.shape[1], num_splits)
    longest = int(lens.max())
    parts, lses = [], []
    for s in range(num_splits):
        t0, t1 = s * tps, min((s + 1) * tps, longest)
        if t0 >= t1:
            parts.append(torch.zeros(q.shape, dtype=torch.float32, device=q.device))
            lses.append(torch.full(q.shape[:2], float("-inf"), device=q.device))
            continue
        o, lse = par._partial_attention(q, k_cache, v_cache, tables, lens,
                                        scale if scale is not None else q.shape[-1] ** -0.5,
                                        t0, t1)
        parts.append(o)
        lses.append(lse)
    return torch.stack(parts, dim=2), torch.stack(lses, dim=2)


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
    """(In the student's kernel) the decode kernel (a DECODE_CASES case) or the split kernel (a
    SPLIT_CASES case) on kernel_case(case, seed), into outputs inside NaN fences: the whole
    buffers ([out] or [partials, lse]), the outputs filled with NaN before the launch."""
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
    """(In the tester) one case of DECODE_CASES or SPLIT_CASES: AssertionError naming the likely
    mistake unless the kernel writes the reference's values and nothing around them."""
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


# --- speed on a GPU --------------------------------------------------------------------------------
# the speed cases: (lens, N, K, H, block size, dtype) on a GPU; a tiny one for dry runs
SPEED = {"decode": ([4096] * 16, 32, 8, 128, 16, torch.bfloat16),
         "split": ([32768], 32, 8, 128, 16, torch.bfloat16)}
SPEED_DRY = ([37, 20], 4, 2, 16, 4, torch.float32)


def _speed_inputs(which: str, dry_run: bool, seed: int):
    """((q, k_cache, v_cache, tables, lens) on the kernels' device, the bytes of K/V and q a
    step must read, the split count: 2 dry, else the course's) for "decode" or "split"."""
    from kernels.paged_attention_ref import pick_num_splits
    lens, N, K, H, block_size, dtype = SPEED_DRY if dry_run else SPEED[which]
    g = torch.Generator().manual_seed(seed)
    need = [cdiv(L, block_size) for L in lens]
    perm = torch.randperm(sum(need), generator=g).to(torch.int32)
    tables = torch.zeros(len(lens), max(need), dtype=torch.int32)
    for b, n in enumerate(need):
        tables[b, :n] = perm[sum(need[:b]):sum(need[:b]) + n]
    kv = [torch.randn(sum(need), block_size, K, H, generator=g).to(dtype) for _ in "kv"]
    q = torch.randn(len(lens), N, H, generator=g).to(dtype)
    ins = [t.to("cpu" if dry_run else "cuda") for t in (q, *kv, tables, torch.tensor(
        lens, dtype=torch.int32))]
    nbytes = 2 * sum(lens) * K * H * kv[0].element_size() + 2 * q.numel() * q.element_size()
    return ins, nbytes, 2 if dry_run else pick_num_splits(len(lens), K, max(need), block_size)


@probe
def timed_kernel(which: str, kernel, *, dry_run: bool = False, seed: int = 7012,
                 warmup: int = 5, repeats: int = 30) -> dict:
    """(In the student's kernel) their "decode" or "split" kernel on _speed_inputs: {"out": its
    outputs ([out] or [partials, lse]), "seconds": median seconds per launch}."""
    ins, _, splits = _speed_inputs(which, dry_run, seed)
    outs = _paged(kernel, ins, splits=None if which == "decode" else splits)
    seconds = kc.seconds_per_call(lambda: _paged(kernel, ins, outs=outs, splits=None if which ==
                                                 "decode" else splits),
                                  dry_run=dry_run, warmup=warmup, repeats=repeats)
    return {"out": [t.cpu() for t in outs], "seconds": seconds}


def kernel_speed(which: str, kernel, *, dry_run: bool = False, check: bool = False,
                 seed: int = 7012, warmup: int | None = None, repeats: int | None = None):
    """The student's "decode" kernel on 16 sequences of 4096 tokens or "split" kernel on one of
    32k tokens (the case flash-decoding is for; the course's split count, the merge left out),
    timed in their kernel (`timed_kernel`) after checking its output, against the course's whole
    decode timed here (dry_run: SPEED_DRY on the CPU, figures meaningless): the speed report,
    and "num_splits". check=True: AssertionError below KERNEL_SPEED (never in a dry run)."""
    from kernels.paged_attention import paged_attention_decode, paged_attention_decode_split
    warmup = (1 if dry_run else 5) if warmup is None else warmup
    repeats = (3 if dry_run else 30) if repeats is None else repeats
    ins, nbytes, splits = _speed_inputs(which, dry_run, seed)

    def course():
        if which == "decode":
            return paged_attention_decode(*ins, validate=False)
        return paged_attention_decode_split(*ins, num_splits=splits, validate=False)
    got = timed_kernel(which, kernel, dry_run=dry_run, seed=seed, warmup=warmup, repeats=repeats)
    _diagnose((got["out"][0] if which == "decode" else merge_splits(*got["out"])).float(),
              course().float().cpu(), f"paged_{which}_kernel on the timing case", False,
              ins[1].shape[2], _OUT_TOL[ins[0].dtype], "output")
    report = kc.speed_report(got["seconds"], kc.seconds_per_call(
        course, dry_run=dry_run, warmup=warmup, repeats=repeats), nbytes, dry_run=dry_run)
    if check:
        kc.require_speed(report, f"paged_{which}_kernel", **KERNEL_SPEED)
    return {**report, "num_splits": splits if which == "split" else None}


def _check(which: str, kernel, cases, seed: int, speed) -> dict:
    if speed not in ("auto", "gpu", "dry_run", None):
        raise ValueError(f"speed must be 'auto', 'gpu', 'dry_run' or None, got {speed!r}")
    if speed == "gpu" and not torch.cuda.is_available():
        raise RuntimeError("speed='gpu' needs a CUDA GPU (speed='dry_run' runs the code path on "
                           "the CPU)")
    for i, case in enumerate(cases):
        _check_case(kernel, case, seed + i)
    timed = speed in ("gpu", "dry_run") or (speed == "auto" and torch.cuda.is_available())
    return {"cases": len(cases), "speed": kernel_speed(which, kernel, dry_run=speed == "dry_run",
                                                       check=True) if timed else None}


def check_decode_kernel(kernel, *, speed="auto", seed: int = 7010) -> dict:
    """The hidden test of 07_decode_kernel_test. AssertionError unless `kernel` computes the
    paged decode on every DECODE_CASES case, reads no slot its sequences do not own and writes
    nothing outside its output; then, on a GPU (speed="auto"; "dry_run": the same code path on
    the CPU, asserting nothing; None: skipped), at least KERNEL_SPEED of a device copy and of
    the course's kernel's speed. Returns {"cases": n, "speed": the timing report or None}."""
    return _check("decode", kernel, DECODE_CASES, seed, speed)


def check_split_kernel(kernel, *, speed="auto", seed: int = 7020) -> dict:
    """The hidden test of 07_split_kernel_test: as check_decode_kernel, for the split kernel's
    partials and lse on every SPLIT_CASES case (empty splits included)."""
    return _check("split", kernel, SPLIT_CASES, seed, speed)
