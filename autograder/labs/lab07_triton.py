"""Lab 07's Triton kernels, written by the student: the launchers the notebook uses and the checks
its hidden tests call (the torch paged decode's speed check is autograder/labs/lab07.py).

The student's kernels (07_decode_kernel, 07_split_kernel) are run by the launchers here
(`launch_decode`, `launch_split`: the grid, the tile sizes, the argument checks, the scratch;
the kernel signature and the tensor layout are spelt out below) and graded by
`check_decode_kernel` / `check_split_kernel`: the kernel must be the student's own Triton
(`kernelcheck.assert_triton_kernel`; the launchers run `kernelcheck.fresh_kernel`, so nothing
attached to the kernel object runs), and with the course's kernels off it must match the torch
reference on DECODE_CASES / SPLIT_CASES: ragged lengths (1, and not multiples of the block or
the tile), shuffled blocks, NaN in every slot no sequence owns and around every input and
output, G = 1, 2, 4, fp32 / fp16 / bf16 caches, scores of 110-220 that overflow exp without the
running max, empty splits. On a GPU they also time the kernel against the course's
(`kernelcheck.check_kernel_speed`, KERNEL_SPEED); speed="dry_run" runs that path on the CPU.

    from autograder.labs import lab07_triton as tri
    tri.check_decode_kernel(paged_decode_kernel)        # {"cases": 4, "speed": None | report}
    tri.check_split_kernel(paged_split_kernel)
"""
from __future__ import annotations

import torch

from autograder.judge import evidence
from autograder.labs import kernelcheck
from autograder.remote import kernel_side
from kernels.intmath import cdiv
from kernels.paged_attention_ref import paged_attention_decode_ref
from kernels.tiles import kernel_tiles, tokens_per_split
from kernels.tiles import paged_tile_walk as tile_walk  # noqa: F401 (the notebook's tri.tile_walk)

# captured at import (the grader imports autograder before student code runs)
_Generator, _randn, _randperm = torch.Generator, torch.randn, torch.randperm

# The notebook's kernel cells hold a @triton.jit function each; the launchers below (trusted: the
# grid, the tile sizes, the argument checks, the scratch) run it, and the checks run it on cases
# that make the classic mistakes visible. Everything a launcher or a check calls while the
# student's kernel runs lives here, in kernelcheck or in kernels.intmath / kernels.tiles: the course's
# kernel modules are off
# then (kernelcheck.course_kernels_disabled).
#
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


def _kernel_inputs(q, k_cache, v_cache, block_tables, context_lens, scale):
    """Shape and dtype checks of a kernel launch (no value checks: no GPU sync). Returns
    (B, N, K, H, block_size, max_blocks, scale)."""
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache),
                    ("block_tables", block_tables), ("context_lens", context_lens)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a tensor, got {type(t).__name__}")
    if k_cache.dim() != 4 or v_cache.shape != k_cache.shape:
        raise ValueError(f"k_cache and v_cache must both be [num_blocks, block_size, K, H], got "
                         f"{tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    _, block_size, K, H = k_cache.shape
    if q.dim() != 3 or q.shape[2] != H or q.shape[1] % K:
        raise ValueError(f"q must be [B_seq, N, H={H}] with N a multiple of K={K}, got "
                         f"{tuple(q.shape)}")
    if not (q.dtype == k_cache.dtype == v_cache.dtype) or not q.dtype.is_floating_point:
        raise ValueError(f"q and the caches must share one float dtype, got {q.dtype}, "
                         f"{k_cache.dtype}, {v_cache.dtype}")
    B = q.shape[0]
    if block_tables.dtype != torch.int32 or block_tables.dim() != 2 or \
            block_tables.shape[0] != B or block_tables.shape[1] < 1:
        raise ValueError(f"block_tables must be int32 [B_seq={B}, max_blocks], got "
                         f"{block_tables.dtype} {tuple(block_tables.shape)}")
    if context_lens.dtype != torch.int32 or tuple(context_lens.shape) != (B,):
        raise ValueError(f"context_lens must be int32 [B_seq={B}], got {context_lens.dtype} "
                         f"{tuple(context_lens.shape)}")
    devices = {t.device for t in (q, k_cache, v_cache, block_tables, context_lens)}
    if len(devices) != 1:
        raise ValueError(f"all tensors must be on one device, got {sorted(map(str, devices))}")
    scale = H ** -0.5 if scale is None else float(scale)
    return B, q.shape[1], K, H, block_size, block_tables.shape[1], scale


def _contiguous(*ts):
    return [t if t.is_contiguous() else t.contiguous() for t in ts]


def launch_decode(kernel, q, k_cache, v_cache, block_tables, context_lens, scale=None, *,
                  out=None, block_t=None):
    """Run a decode kernel in the notebook's signature on grid (B_seq, K), one program per
    (sequence, KV head):

        kernel[(B_seq, K)](q, k_cache, v_cache, block_tables, context_lens, out,
                           scale, K, max_blocks, block_size, G, H,
                           BLOCK_T=..., BLOCK_G=..., BLOCK_H=...)

    Returns out [B_seq, N, H] in q's dtype (`out=`: a contiguous tensor to write into)."""
    B, N, K, H, block_size, max_blocks, scale = _kernel_inputs(
        q, k_cache, v_cache, block_tables, context_lens, scale)
    q, k_cache, v_cache, block_tables, context_lens = _contiguous(
        q, k_cache, v_cache, block_tables, context_lens)
    if out is None:
        out = torch.empty_like(q)
    elif tuple(out.shape) != tuple(q.shape) or out.dtype != q.dtype or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous {q.dtype} tensor {tuple(q.shape)}")
    if B == 0:
        return out
    tiles = kernel_tiles(N, K, H, block_t, cuda=q.is_cuda)
    kernelcheck.launch(kernel, (B, K), q, k_cache, v_cache, block_tables, context_lens, out,
                       scale, K, max_blocks, block_size, N // K, H, **tiles)
    return out


def launch_split(kernel, q, k_cache, v_cache, block_tables, context_lens, num_splits: int,
                 scale=None, *, partials=None, lse=None, block_t=None):
    """Run a split (flash-decoding) kernel in the notebook's signature on grid
    (B_seq, K, num_splits), one program per (sequence, KV head, split):

        kernel[(B_seq, K, S)](q, k_cache, v_cache, block_tables, context_lens, partials, lse,
                              scale, K, max_blocks, block_size, G, H, tokens_per_split, S,
                              BLOCK_T=..., BLOCK_G=..., BLOCK_H=...)

    Returns (partials float32 [B_seq, N, S, H], lse float32 [B_seq, N, S]); `partials=`,
    `lse=`: contiguous float32 tensors to write into. merge_partials(partials, lse) is the
    attention output."""
    B, N, K, H, block_size, max_blocks, scale = _kernel_inputs(
        q, k_cache, v_cache, block_tables, context_lens, scale)
    tps = tokens_per_split(max_blocks, block_size, num_splits)
    q, k_cache, v_cache, block_tables, context_lens = _contiguous(
        q, k_cache, v_cache, block_tables, context_lens)
    shapes = {"partials": (B, N, num_splits, H), "lse": (B, N, num_splits)}
    given = {"partials": partials, "lse": lse}
    for name, t in given.items():
        if t is None:
            given[name] = torch.empty(shapes[name], dtype=torch.float32, device=q.device)
        elif tuple(t.shape) != shapes[name] or t.dtype != torch.float32 or \
                not t.is_contiguous():
            raise ValueError(f"{name} must be a contiguous float32 tensor {shapes[name]}")
    partials, lse = given["partials"], given["lse"]
    if B == 0:
        return partials, lse
    tiles = kernel_tiles(N, K, H, block_t, cuda=q.is_cuda)
    kernelcheck.launch(kernel, (B, K, num_splits), q, k_cache, v_cache, block_tables,
                       context_lens, partials, lse, scale, K, max_blocks, block_size, N // K, H,
                       tps, num_splits, **tiles)
    return partials, lse


def merge(partials: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """The log-sum-exp merge of split partials [..., S, H] by their lse [..., S] (the checks'
    own copy: the course's merge_splits is off while a student's kernel is checked)."""
    top = lse.max(dim=-1, keepdim=True).values
    w = torch.exp(lse - top)
    return (w[..., None] * partials).sum(dim=-2) / w.sum(dim=-1, keepdim=True)


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


def _fence(t: torch.Tensor, pad: int, fill=None):
    """kernelcheck.nan_padded, with `fill` in the fence of an integer tensor (-1: a block id
    that reads the NaN fence in front of the cache, instead of a huge one)."""
    view, buf = kernelcheck.nan_padded(t, pad=pad)
    if fill is not None:
        buf[:pad] = fill
        buf[pad + t.numel():] = fill
    return view, buf


def kernel_case(lens, N, K, H, block_size, dtype=torch.float32, block_t=16, large=False,
                seed=0, device="cpu"):
    """(q, k_cache, v_cache, block_tables, context_lens) for a kernel check, every tensor inside
    a fence: the caches and q inside NaN, the tables inside -1. The sequences' blocks are
    shuffled in the pool; every slot no sequence owns holds NaN (spare blocks and the tail of
    each last block); table columns past a sequence's last block hold -1 or a spare block's id,
    and the table is wide enough that a tile read without a mask stays in its row. large=True:
    the scores scale * q . k lie between about 110 and 220 (a component the keys share)."""
    g = _Generator().manual_seed(seed)
    need = [cdiv(L, block_size) for L in lens]
    spare = 3
    num_blocks = sum(need) + spare
    reach = max(cdiv(L, block_t) * block_t for L in lens)        # positions an unmasked tile reads
    width = cdiv(reach, block_size) + 1
    perm = _randperm(num_blocks, generator=g).tolist()
    owned, spares = perm[:sum(need)], perm[sum(need):]
    k_cache = torch.full((num_blocks, block_size, K, H), float("nan"))
    v_cache = torch.full((num_blocks, block_size, K, H), float("nan"))
    tables = torch.full((len(lens), width), -1, dtype=torch.int32)
    common = _randn(K, H, generator=g)
    common = common / common.norm(dim=-1, keepdim=True) * H ** 0.5      # |common|^2 = H
    start = 0
    for b, L in enumerate(lens):
        ids = owned[start:start + need[b]]
        start += need[b]
        extra = [spares[(b + j) % spare] if j % 2 else -1 for j in range(width - need[b])]
        tables[b] = torch.tensor(ids + extra, dtype=torch.int32)
        k = _randn(L, K, H, generator=g)
        if large:
            k = common + 0.5 * k
        pos = torch.arange(L)
        blk = torch.tensor(ids)[pos // block_size]
        k_cache[blk, pos % block_size] = k
        v_cache[blk, pos % block_size] = _randn(L, K, H, generator=g)
    q = _randn(len(lens), N, H, generator=g)
    if large:       # q . k = 40 |common|^2 + ...: scale * q . k = 40 sqrt(H) + O(sqrt(H))
        q = 40.0 * common.repeat_interleave(N // K, dim=0)[None] + q
    q, k_cache, v_cache = (t.to(dtype).to(device) for t in (q, k_cache, v_cache))
    pads = kernel_tiles(N, K, H)
    G_pad, H_pad = pads["BLOCK_G"], pads["BLOCK_H"]
    q, _ = _fence(q, pad=G_pad * H_pad)
    k_cache, _ = _fence(k_cache, pad=block_size * K * H)
    v_cache, _ = _fence(v_cache, pad=block_size * K * H)
    tables, _ = _fence(tables.to(device), pad=block_t, fill=-1)
    lens_t = torch.tensor(lens, dtype=torch.int32, device=device)
    return q, k_cache, v_cache, tables, lens_t


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


def _case_name(what: str, case) -> str:
    lens, N, K, H, block_size, dtype = case[:6]
    return f"[{what}: lens {lens}, N = {N}, K = {K}, H = {H}, blocks of {block_size}, " \
           f"{str(dtype).replace('torch.', '')}]"


def _diagnose(got: torch.Tensor, want: torch.Tensor, name: str, large: bool, K: int,
              tol: float, rows: str, G: int | None = None) -> None:
    """AssertionError naming the likely mistake when got (float) differs from want."""
    evidence(got, name, atol=2 * tol, rtol=2 * tol)           # for the grader (autograder/judge.py)
    bad_nan = ~torch.isfinite(got) & torch.isfinite(want)
    if bool(bad_nan.any()):
        if large:
            raise AssertionError(
                f"{name}: NaN or inf in the output. The scores here lie between 110 and 220, and e^x "
                f"overflows float32 above x = 88.7: keep the running max m and exponentiate "
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
    # which (sequence, query head) rows are off
    per_row = (~ok).flatten(2).any(-1) if got.dim() > 2 else ~ok
    wrong = [tuple(int(i) for i in idx) for idx in per_row.nonzero()[:6]]
    G = got.shape[1] // K if G is None else G
    raise AssertionError(
        f"{name}: {int((~ok).sum())} of {ok.numel()} {rows} values differ from the reference "
        f"(largest difference {float(err.max()):.3g}, tolerance {tol:g} + {tol:g} |expected|); "
        f"wrong (sequence, query head) rows include {wrong}. Usual causes: query head n must "
        f"read KV head n // G (here G = {G}, K = {K}: the program of KV head kvh serves the "
        f"query heads kvh * G .. kvh * G + G - 1); the scores are scale * q . k, set to -inf "
        f"past the sequence's length; when the running max grows from m_old to m_new, l and "
        f"acc are rescaled by exp(m_old - m_new); the walk covers every tile of positions "
        f"0 .. context_lens[b] - 1")


def _run_decode_case(kernel, case, seed, device):
    lens, N, K, H, block_size, dtype, block_t, scale, large, _, what = case
    name = f"paged_decode_kernel {_case_name(what, case)}"
    q, kc, vc, tables, lens_t = kernel_case(lens, N, K, H, block_size, dtype, block_t, large,
                                            seed, device)
    want = paged_attention_decode_ref(q.cpu(), kc.cpu(), vc.cpu(), tables.cpu(), lens_t.cpu(),
                                      scale).float()
    tiles = kernel_tiles(N, K, H, block_t, cuda=q.is_cuda)
    out, out_buf = kernelcheck.nan_padded(torch.empty_like(q),
                                          pad=tiles["BLOCK_G"] * tiles["BLOCK_H"])
    with kernelcheck.course_kernels_disabled():
        launch_decode(kernel, q, kc, vc, tables, lens_t, scale, out=out, block_t=block_t)
    kernelcheck.assert_padding_untouched(out_buf, out, name)
    _diagnose(out.cpu().float(), want, name, large, K, _OUT_TOL[dtype], "output")


def _run_split_case(kernel, case, seed, device):
    lens, N, K, H, block_size, dtype, block_t, scale, large, S, what = case
    name = f"paged_split_kernel {_case_name(what, case)}"
    q, kc, vc, tables, lens_t = kernel_case(lens, N, K, H, block_size, dtype, block_t, large,
                                            seed, device)
    want_part, want_lse = split_reference(q.cpu(), kc.cpu(), vc.cpu(), tables.cpu(),
                                          lens_t.cpu(), scale, S)
    want_out = paged_attention_decode_ref(q.cpu(), kc.cpu(), vc.cpu(), tables.cpu(),
                                          lens_t.cpu(), scale).float()
    tiles = kernel_tiles(N, K, H, block_t, cuda=q.is_cuda)
    pad = tiles["BLOCK_G"] * S * tiles["BLOCK_H"]
    part, part_buf = kernelcheck.nan_padded(
        torch.empty(want_part.shape, dtype=torch.float32, device=device), pad=pad)
    lse, lse_buf = kernelcheck.nan_padded(
        torch.empty(want_lse.shape, dtype=torch.float32, device=device), pad=pad)
    with kernelcheck.course_kernels_disabled():
        launch_split(kernel, q, kc, vc, tables, lens_t, S, scale, partials=part, lse=lse,
                     block_t=block_t)
    kernelcheck.assert_padding_untouched(part_buf, part, f"{name}, partials")
    kernelcheck.assert_padding_untouched(lse_buf, lse, f"{name}, lse")
    part, lse = part.cpu(), lse.cpu()
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
    _diagnose(part.masked_fill(empty[..., None], 0.0), want_part.masked_fill(empty[..., None], 0.0),
              f"{name}, partials", large, K, 1e-4, "partial output")
    _diagnose(merge(part, lse), want_out, f"{name}, merged output", large, K,
              max(_OUT_TOL[dtype], 1e-4), "output")


def _device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _speed_mode(speed) -> tuple[bool, bool]:
    """(run the speed check, dry run) for speed = "auto" | "gpu" | "dry_run" | None."""
    if speed in (None, False, "off"):
        return False, False
    if speed == "dry_run":
        return True, True
    if speed == "auto":
        return torch.cuda.is_available(), False
    if speed == "gpu":
        if not torch.cuda.is_available():
            raise RuntimeError("speed='gpu' needs a CUDA GPU (speed='dry_run' runs the code path "
                               "on the CPU)")
        return True, False
    raise ValueError(f"speed must be 'auto', 'gpu', 'dry_run' or None, got {speed!r}")


# the speed cases: (lens, N, K, H, block size, dtype) on a GPU; a tiny one for dry runs
SPEED_DECODE = ([4096] * 16, 32, 8, 128, 16, torch.bfloat16)
SPEED_SPLIT = ([32768], 32, 8, 128, 16, torch.bfloat16)
SPEED_DRY = ([37, 20], 4, 2, 16, 4, torch.float32)


def _speed_inputs(shape, dry: bool, seed: int):
    lens, N, K, H, block_size, dtype = shape
    device = "cpu" if dry else "cuda"
    g = _Generator().manual_seed(seed)
    need = [cdiv(L, block_size) for L in lens]
    num_blocks = sum(need)
    perm = _randperm(num_blocks, generator=g).to(torch.int32)
    tables = torch.zeros(len(lens), max(need), dtype=torch.int32)
    start = 0
    for b, n in enumerate(need):
        tables[b, :n] = perm[start:start + n]
        start += n
    kc = _randn(num_blocks, block_size, K, H, generator=g).to(dtype)
    vc = _randn(num_blocks, block_size, K, H, generator=g).to(dtype)
    q = _randn(len(lens), N, H, generator=g).to(dtype)
    lens_t = torch.tensor(lens, dtype=torch.int32)
    kv_bytes = 2 * sum(lens) * K * H * kc.element_size() + 2 * q.numel() * q.element_size()
    return [t.to(device) for t in (q, kc, vc, tables, lens_t)], kv_bytes


@kernel_side            # timed where the student's kernel lives (autograder/remote.py)
def decode_kernel_speed(kernel, *, dry_run: bool = False, check: bool = False,
                        seed: int = 7012, **kw) -> dict:
    """Time the student's decode kernel against the course's on SPEED_DECODE (a GPU;
    dry_run: SPEED_DRY on the CPU, figures meaningless), after checking its output once:
    kernelcheck.kernel_speed's report. check=True: kernelcheck.check_kernel_speed, an
    AssertionError below KERNEL_SPEED's thresholds (never in a dry run)."""
    from kernels.paged_attention import paged_attention_decode
    (q, kc, vc, tables, lens), nbytes = _speed_inputs(SPEED_DRY if dry_run else SPEED_DECODE,
                                                       dry_run, seed)
    out = torch.empty_like(q)
    want = paged_attention_decode(q, kc, vc, tables, lens, validate=False)
    launch_decode(kernel, q, kc, vc, tables, lens, out=out)
    _diagnose(out.float().cpu(), want.float().cpu(), "paged_decode_kernel on the timing case",
              False, kc.shape[2], _OUT_TOL[q.dtype], "output")
    if dry_run:
        kw = {"warmup": 1, "repeats": 3, **kw}

    def student():
        launch_decode(kernel, q, kc, vc, tables, lens, out=out)

    def course():
        paged_attention_decode(q, kc, vc, tables, lens, validate=False)

    if check:
        return kernelcheck.check_kernel_speed(student, course, nbytes, what="paged_decode_kernel",
                                              dry_run=dry_run, **KERNEL_SPEED, **kw)
    return kernelcheck.kernel_speed(student, course, nbytes, dry_run=dry_run, **kw)


@kernel_side            # timed where the student's kernel lives (autograder/remote.py)
def split_kernel_speed(kernel, *, dry_run: bool = False, check: bool = False,
                       seed: int = 7013, **kw) -> dict:
    """The same for the split kernel on SPEED_SPLIT (one sequence of 32k tokens, the case
    flash-decoding is for) with the course's split count: the student's kernel (partials and
    lse; the merge that follows is a few small torch operations) against the course's whole
    split decode (its split kernel and its merge kernel). The report adds "num_splits"."""
    from kernels.paged_attention import paged_attention_decode_split
    from kernels.paged_attention_ref import pick_num_splits
    (q, kc, vc, tables, lens), nbytes = _speed_inputs(SPEED_DRY if dry_run else SPEED_SPLIT,
                                                       dry_run, seed)
    S = 2 if dry_run else pick_num_splits(q.shape[0], kc.shape[2], tables.shape[1], kc.shape[1])
    part, lse = launch_split(kernel, q, kc, vc, tables, lens, S)
    want = paged_attention_decode_split(q, kc, vc, tables, lens, num_splits=S, validate=False)
    _diagnose(merge(part, lse).cpu(), want.float().cpu(), "paged_split_kernel on the timing case",
              False, kc.shape[2], _OUT_TOL[q.dtype], "merged output")
    if dry_run:
        kw = {"warmup": 1, "repeats": 3, **kw}

    def student():
        launch_split(kernel, q, kc, vc, tables, lens, S, partials=part, lse=lse)

    def course():
        paged_attention_decode_split(q, kc, vc, tables, lens, num_splits=S, validate=False)

    if check:
        report = kernelcheck.check_kernel_speed(student, course, nbytes, dry_run=dry_run,
                                                what=f"paged_split_kernel ({S} splits)",
                                                **KERNEL_SPEED, **kw)
    else:
        report = kernelcheck.kernel_speed(student, course, nbytes, dry_run=dry_run, **kw)
    return {**report, "num_splits": S}


def check_decode_kernel(kernel, *, speed="auto", seed: int = 7010) -> dict:
    """The hidden test of 07_decode_kernel_test. AssertionError unless `kernel` is a Triton
    kernel written in the notebook (kernelcheck.assert_triton_kernel) that computes the paged
    decode on every DECODE_CASES case with the course's kernels off, reads no slot its
    sequences do not own and writes nothing outside its output; then, on a GPU (speed="auto";
    "dry_run": the same code path on the CPU, asserting nothing; None: skipped), at least
    KERNEL_SPEED of a device copy and of the course's kernel's speed. Returns {"cases": n,
    "speed": the timing report or None}."""
    kernelcheck.assert_triton_kernel(kernel, "paged_decode_kernel")       # bare, too
    device = _device()
    for i, case in enumerate(DECODE_CASES):
        _run_decode_case(kernel, case, seed + i, device)
    timed, dry = _speed_mode(speed)
    report = decode_kernel_speed(kernel, dry_run=dry, check=True) if timed else None
    return {"cases": len(DECODE_CASES), "speed": report}


def check_split_kernel(kernel, *, speed="auto", seed: int = 7020) -> dict:
    """The hidden test of 07_split_kernel_test: as check_decode_kernel, for the split kernel's
    partials and lse on every SPLIT_CASES case (empty splits included)."""
    kernelcheck.assert_triton_kernel(kernel, "paged_split_kernel")       # bare, too
    device = _device()
    for i, case in enumerate(SPLIT_CASES):
        _run_split_case(kernel, case, seed + i, device)
    timed, dry = _speed_mode(speed)
    report = split_kernel_speed(kernel, dry_run=dry, check=True) if timed else None
    return {"cases": len(SPLIT_CASES), "speed": report}
