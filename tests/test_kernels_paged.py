"""Paged-attention kernels (kernels/paged_attention.py) against their torch references
(kernels/paged_attention_ref.py) and against an oracle built here that shares no code with
either: every sequence's K/V is generated contiguously, scattered into a pool of blocks by a
Python loop, and attention is computed on the contiguous copy in float64.

Without a GPU the kernels run in Triton's CPU interpreter (slow: about 50 ms per program), so the
cases are small but awkward: ragged context lengths that are not multiples of the block size,
block ids shuffled and unused table entries pointing at poisoned blocks, query groups of 1, 3,
4 and 8 (MQA), a head dim that is not a power of two, fp32 / fp16 / bf16.
"""

import pytest
import torch

pytest.importorskip("triton")

from kernels import paged_attention as pa  # noqa: E402
from kernels import (  # noqa: E402
    paged_attention_decode,
    paged_attention_decode_ref,
    paged_attention_decode_split,
    paged_attention_decode_split_ref,
    write_kv,
    write_kv_ref,
)
from kernels import paged_attention_ref as par  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
# max |out - oracle| allowed, relative to max |oracle|: output rounding (1 ulp) dominates
TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
POISON = {torch.float32: float("nan"), torch.float16: float("nan"), torch.bfloat16: float("nan")}


def assert_close(got, want, dtype, what):
    err = (got.double() - want).abs().max().item() / max(want.abs().max().item(), 1e-6)
    assert err <= TOL[dtype], f"{what}: relative error {err:.2e} > {TOL[dtype]:.0e}"


# ---- a paged cache built by hand, and the oracle ------------------------------------------------
def make_case(lens, N, K, H, block, dtype, seed, spare_blocks=3, width_extra=1):
    """Sequences of the given lengths in a shared pool of blocks.

    Every slot that no sequence owns (whole spare blocks, and the tail of each sequence's last
    block) holds NaN; block ids are a random permutation; the table of each sequence has
    `width_extra` columns more than the longest sequence needs, pointing at poisoned spare blocks
    or holding -1, so reading anything past a sequence's length shows up as NaN."""
    gen = torch.Generator().manual_seed(seed)
    B = len(lens)
    need = [-(-L // block) for L in lens]
    num_blocks = sum(need) + spare_blocks
    width = max(need) + width_extra
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    owned, spare = perm[:sum(need)], perm[sum(need):]
    k_cache = torch.full((num_blocks, block, K, H), POISON[dtype], dtype=dtype)
    v_cache = torch.full((num_blocks, block, K, H), POISON[dtype], dtype=dtype)
    tables = torch.full((B, width), -1, dtype=torch.int32)
    seqs = []
    for b, L in enumerate(lens):
        ids, owned = owned[:need[b]], owned[need[b]:]
        row = ids + [spare[(b + j) % len(spare)] if j % 2 == 0 else -1
                     for j in range(width - need[b])]
        tables[b] = torch.tensor(row, dtype=torch.int32)
        k = torch.randn(L, K, H, generator=gen).to(dtype)
        v = torch.randn(L, K, H, generator=gen).to(dtype)
        for pos in range(L):                               # the slot formula, spelt out
            k_cache[ids[pos // block], pos % block] = k[pos]
            v_cache[ids[pos // block], pos % block] = v[pos]
        seqs.append((k, v))
    q = torch.randn(B, N, H, generator=gen).to(dtype)
    context_lens = torch.tensor(lens, dtype=torch.int32)
    return q, k_cache, v_cache, tables, context_lens, seqs


def oracle(q, seqs, scale=None):
    """softmax(q k^T * scale) v per sequence in float64, query head n reading KV head n // G."""
    B, N, H = q.shape
    scale = H ** -0.5 if scale is None else scale
    out = torch.empty(B, N, H, dtype=torch.float64)
    for b, (k, v) in enumerate(seqs):
        G = N // k.shape[1]
        kk = k.double().repeat_interleave(G, dim=1)                    # [L, N, H]
        vv = v.double().repeat_interleave(G, dim=1)
        s = torch.einsum("nh,lnh->nl", q[b].double(), kk) * scale
        out[b] = torch.einsum("nl,lnh->nh", torch.softmax(s, dim=-1), vv)
    return out


def to_dev(*ts):
    return [t.to(DEV) for t in ts]


# ---- decode: Triton and reference against the oracle ------------------------------------------
DECODE_CASES = [  # (context lens, N, K, H, block size, dtype)
    ([1, 7, 13], 4, 4, 16, 4, torch.float32),         # MHA (G = 1), a 1-token context
    ([16, 37], 8, 2, 32, 8, torch.bfloat16),          # G = 4; exactly one block, then ragged
    ([5, 70], 8, 1, 16, 16, torch.float16),           # MQA (G = 8); 70 > one 64-token tile
    ([19, 3], 6, 2, 24, 5, torch.float32),            # G = 3, H = 24, block of 5 (not 2^k)
    ([33], 4, 2, 16, 32, torch.bfloat16),             # blocks of 32: one full, one with 1 token
]


@pytest.mark.parametrize("lens,N,K,H,block,dtype", DECODE_CASES)
def test_decode_matches_oracle_and_reference(lens, N, K, H, block, dtype):
    q, kc, vc, tables, cl, seqs = make_case(lens, N, K, H, block, dtype, seed=sum(lens) + N)
    want = oracle(q, seqs)
    q, kc, vc, tables, cl = to_dev(q, kc, vc, tables, cl)
    out = paged_attention_decode(q, kc, vc, tables, cl)
    ref = paged_attention_decode_ref(q, kc, vc, tables, cl)
    assert out.dtype == q.dtype and out.shape == q.shape
    assert_close(ref.cpu(), want, dtype, "reference vs oracle")
    assert_close(out.cpu(), want, dtype, "triton vs oracle")
    assert_close(out.cpu(), ref.cpu().double(), dtype, "triton vs reference")


@pytest.mark.parametrize("lens,N,K,H,block,dtype,num_splits", [
    ([1, 7, 13], 4, 4, 16, 4, torch.float32, 2),      # some splits empty for short sequences
    ([16, 37], 8, 2, 32, 8, torch.bfloat16, 3),
    ([19, 3], 6, 2, 24, 5, torch.float16, 9),         # more splits than the table has blocks
])
def test_split_matches_oracle_and_reference(lens, N, K, H, block, dtype, num_splits):
    q, kc, vc, tables, cl, seqs = make_case(lens, N, K, H, block, dtype, seed=len(lens) + H)
    want = oracle(q, seqs, scale=0.3)
    q, kc, vc, tables, cl = to_dev(q, kc, vc, tables, cl)
    out = paged_attention_decode_split(q, kc, vc, tables, cl, scale=0.3, num_splits=num_splits)
    ref = paged_attention_decode_split_ref(q, kc, vc, tables, cl, scale=0.3,
                                           num_splits=num_splits)
    assert_close(ref.cpu(), want, dtype, "split reference vs oracle")
    assert_close(out.cpu(), want, dtype, "split triton vs oracle")


def test_split_partials_are_each_ranges_softmax():
    """The scratch the split kernel writes: split s holds the softmax over its own positions
    and lse_s = log sum e^{scale q.k} over them (-inf when empty); merged they equal unsplit."""
    lens, N, K, H, block, S = [10, 3], 4, 2, 16, 4, 3     # table width 4 -> 2 blocks per split
    q, kc, vc, tables, cl, seqs = make_case(lens, N, K, H, block, torch.float32, seed=5,
                                            width_extra=1)
    q, kc, vc, tables, cl = to_dev(q, kc, vc, tables, cl)
    out = torch.empty_like(q)
    part, lse = pa._launch_decode_split(q, kc, vc, tables, cl, H ** -0.5, out, S)
    part, lse = part.cpu(), lse.cpu()
    tps = par.split_bounds(tables.shape[1], block, S)
    assert tps == 2 * block
    for b, (k, v) in enumerate(seqs):
        for s in range(S):
            t0, t1 = s * tps, min((s + 1) * tps, lens[b])
            if t0 >= t1:
                assert torch.isinf(lse[b, :, s]).all() and (lse[b, :, s] < 0).all()
                assert (part[b, :, s] == 0).all()
                continue
            kk = k[t0:t1].double().repeat_interleave(N // K, dim=1)
            vv = v[t0:t1].double().repeat_interleave(N // K, dim=1)
            x = torch.einsum("nh,lnh->nl", q[b].cpu().double(), kk) * H ** -0.5
            assert torch.allclose(lse[b, :, s].double(), torch.logsumexp(x, -1), atol=1e-5)
            want = torch.einsum("nl,lnh->nh", torch.softmax(x, -1), vv)
            assert torch.allclose(part[b, :, s].double(), want, atol=1e-5)
    merged = par.merge_splits(part, lse)
    assert torch.allclose(merged.double(), oracle(q.cpu(), seqs), atol=1e-5)
    assert torch.allclose(out.cpu(), merged, atol=1e-6)


def test_split_equals_unsplit_for_any_split_count():
    lens, N, K, H, block = [29, 8, 17], 4, 1, 16, 4
    q, kc, vc, tables, cl, _ = make_case(lens, N, K, H, block, torch.float32, seed=9)
    q, kc, vc, tables, cl = to_dev(q, kc, vc, tables, cl)
    unsplit = paged_attention_decode(q, kc, vc, tables, cl)
    for S in (1, 4, None):
        got = paged_attention_decode_split(q, kc, vc, tables, cl, num_splits=S)
        assert torch.allclose(got, unsplit, atol=2e-6), f"num_splits={S}"
        ref = paged_attention_decode_split_ref(q, kc, vc, tables, cl, num_splits=S)
        assert torch.allclose(ref, unsplit, atol=2e-6), f"reference, num_splits={S}"


def test_tile_smaller_than_block():
    """BLOCK_N = 16 positions per step with blocks of 32: a step covers half a block."""
    lens, N, K, H, block = [45, 20], 4, 2, 16, 32
    q, kc, vc, tables, cl, seqs = make_case(lens, N, K, H, block, torch.float16, seed=4)
    q, kc, vc, tables, cl = to_dev(q, kc, vc, tables, cl)
    out = torch.empty_like(q)
    pa._launch_decode(q, kc, vc, tables, cl, H ** -0.5, out, pa.DecodeConfig(block_n=16))
    assert_close(out.cpu(), oracle(q.cpu(), seqs), torch.float16, "block_n 16, block 32")


def test_comparison_sees_a_one_token_slip():
    """The tolerance is sharp enough to catch a plausible bug: attending to one token too few
    (an off-by-one in the length), or one block read from another sequence's table. (Reading a
    sequence's own blocks in another order is no bug at decode time: softmax attention over a
    set of K/V does not depend on their order; the positions are already rotated into K.)"""
    lens, N, K, H, block = [11, 26], 8, 2, 16, 4
    q, kc, vc, tables, cl, seqs = make_case(lens, N, K, H, block, torch.bfloat16, seed=2)
    want = oracle(q, seqs)
    q, kc, vc, tables, cl = to_dev(q, kc, vc, tables, cl)
    with pytest.raises(AssertionError, match="relative error"):
        assert_close(paged_attention_decode(q, kc, vc, tables, cl - 1).cpu(), want,
                     torch.bfloat16, "one token short")
    mixed = tables.clone()
    mixed[1, 1] = tables[0, 1]
    with pytest.raises(AssertionError, match="relative error"):
        assert_close(paged_attention_decode(q, kc, vc, mixed, cl).cpu(), want,
                     torch.bfloat16, "a block of the other sequence")
    reordered = tables.clone()
    reordered[1, :3] = tables[1, [2, 0, 1]]
    assert_close(paged_attention_decode(q, kc, vc, reordered, cl).cpu(), want, torch.bfloat16,
                 "own full blocks in another order")


# ---- boundaries: nothing outside the tensors is read or written -------------------------------
def poisoned_view(data, fill):
    """`data` in a corner of a bigger tensor full of `fill`: a strided view whose neighbours
    poison any output they leak into."""
    big = torch.full([s + 3 for s in data.shape], fill, dtype=data.dtype, device=DEV)
    view = big[tuple(slice(0, s) for s in data.shape)]
    view.copy_(data)
    return view


@pytest.mark.parametrize("split", [False, True])
def test_reads_and_writes_only_inside_the_tensors(split):
    lens, N, K, H, block = [9, 14], 4, 2, 16, 4
    q, kc, vc, tables, cl, seqs = make_case(lens, N, K, H, block, torch.float32, seed=8)
    want = oracle(q, seqs)
    nan = float("nan")
    qv, kv, vv = poisoned_view(q.to(DEV), nan), poisoned_view(kc.to(DEV), nan), \
        poisoned_view(vc.to(DEV), 1e30)
    tv = poisoned_view(tables.to(DEV), 2**30)     # a block id far outside the cache
    lv = poisoned_view(cl.to(DEV), 2**30)
    assert not (qv.is_contiguous() or kv.is_contiguous() or tv.is_contiguous())
    sentinel = 12345.0
    big = torch.full((len(lens) + 2, N + 2, H + 3), sentinel, device=DEV)
    out = big[:len(lens), :N, :H]
    if split:
        pa._launch_decode_split(qv, kv, vv, tv, lv, H ** -0.5, out, 3)
    else:
        pa._launch_decode(qv, kv, vv, tv, lv, H ** -0.5, out)
    assert_close(out.cpu(), want, torch.float32, "poisoned views")
    outside = torch.ones_like(big, dtype=torch.bool)
    outside[:len(lens), :N, :H] = False
    assert (big[outside] == sentinel).all(), "the kernel wrote outside its output"


# ---- write_kv ----------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_write_kv_scatters_into_slots_and_skips_negative(dtype):
    gen = torch.Generator().manual_seed(3)
    num_blocks, block, K, H = 5, 4, 3, 12                  # K * H not a power of two
    slots = torch.tensor([17, -1, 0, 6, 19, -7, 8])        # out of order, two paddings
    T = len(slots)
    k = torch.randn(T, K, H, generator=gen).to(dtype)
    v = torch.randn(T, K, H, generator=gen).to(dtype)
    sentinel = -3.0
    caches = []
    for fn in (write_kv, write_kv_ref):
        kc = torch.full((num_blocks, block, K, H), sentinel, dtype=dtype, device=DEV)
        vc = torch.full((num_blocks, block, K, H), sentinel, dtype=dtype, device=DEV)
        fn(poisoned_view(k.to(DEV), float("nan")), v.to(DEV), kc, vc, slots.to(DEV))
        caches.append((kc.cpu(), vc.cpu()))
    want_k = torch.full((num_blocks * block, K, H), sentinel, dtype=dtype)
    want_v = want_k.clone()
    for t, s in enumerate(slots.tolist()):                 # slot s = row s % B of block s // B
        if s >= 0:
            want_k[s], want_v[s] = k[t], v[t]
    for kc, vc in caches:
        assert torch.equal(kc.reshape(-1, K, H), want_k)   # exact: a copy, not arithmetic
        assert torch.equal(vc.reshape(-1, K, H), want_v)


def test_write_kv_then_decode_equals_contiguous_sdpa():
    """End to end: write a prompt's K/V through a slot mapping built from block tables, then
    the paged decode equals torch's SDPA on the same K/V stored contiguously."""
    gen = torch.Generator().manual_seed(21)
    lens, N, K, H, block, num_blocks = [6, 11], 4, 2, 16, 4, 8
    tables = torch.tensor([[5, 2, -1], [0, 7, 3]], dtype=torch.int32)
    kc = torch.full((num_blocks, block, K, H), float("nan"), device=DEV)
    vc = torch.full((num_blocks, block, K, H), float("nan"), device=DEV)
    ks = [torch.randn(L, K, H, generator=gen) for L in lens]
    vs = [torch.randn(L, K, H, generator=gen) for L in lens]
    slot_mapping = torch.cat([tables[b, torch.arange(L) // block].long() * block
                              + torch.arange(L) % block for b, L in enumerate(lens)])
    write_kv(torch.cat(ks).to(DEV), torch.cat(vs).to(DEV), kc, vc, slot_mapping.to(DEV))
    q = torch.randn(len(lens), N, H, generator=gen)
    out = paged_attention_decode(q.to(DEV), kc, vc, tables.to(DEV),
                                 torch.tensor(lens, dtype=torch.int32, device=DEV)).cpu()
    for b, L in enumerate(lens):
        k = ks[b].transpose(0, 1).repeat_interleave(N // K, dim=0)     # [N, L, H]
        v = vs[b].transpose(0, 1).repeat_interleave(N // K, dim=0)
        want = torch.nn.functional.scaled_dot_product_attention(q[b][:, None], k, v)[:, 0]
        assert torch.allclose(out[b], want, atol=1e-5)


# ---- bad input ---------------------------------------------------------------------------------
def _decode_args(**over):
    a = dict(q=torch.randn(2, 4, 8), k_cache=torch.zeros(6, 4, 2, 8),
             v_cache=torch.zeros(6, 4, 2, 8), block_tables=torch.zeros(2, 3, dtype=torch.int32),
             context_lens=torch.tensor([3, 9], dtype=torch.int32))
    a.update(over)
    return a


def _write_args(**over):
    a = dict(k=torch.randn(3, 2, 8), v=torch.randn(3, 2, 8), k_cache=torch.zeros(6, 4, 2, 8),
             v_cache=torch.zeros(6, 4, 2, 8), slot_mapping=torch.tensor([0, 5, -1]))
    a.update(over)
    return a


DECODE_BAD = [
    (dict(q=torch.randn(2, 4)), "q must be a 3-D tensor"),
    (dict(q=torch.randn(2, 4, 8, dtype=torch.float64)), "q is torch.float64"),
    (dict(q=torch.randn(2, 3, 8)), "not a positive multiple"),
    (dict(q=torch.randn(2, 4, 16)), "head_dim 16"),
    (dict(k_cache=torch.zeros(6, 4, 8)), "k_cache must be a 4-D"),
    (dict(v_cache=torch.zeros(6, 4, 2, 4)), "must match"),
    (dict(k_cache=torch.zeros(6, 4, 2, 8, dtype=torch.int32)), "float16, bfloat16 or float32"),
    (dict(block_tables=torch.zeros(2, 3, dtype=torch.int64)), "block_tables must be a 2-D int32"),
    (dict(block_tables=torch.zeros(3, 3, dtype=torch.int32)), "B = 2 sequences"),
    (dict(block_tables=torch.zeros(2, 0, dtype=torch.int32)), "no columns"),
    (dict(context_lens=torch.tensor([3, 9])), "context_lens must be a 1-D int32"),
    (dict(context_lens=torch.tensor([0, 9], dtype=torch.int32)), ">= 1"),
    (dict(context_lens=torch.tensor([3, 13], dtype=torch.int32)), "only 3 columns"),
    (dict(block_tables=torch.tensor([[0, 9, 9], [1, 2, 6]], dtype=torch.int32)), "block id 6"),
    (dict(block_tables=torch.tensor([[-1, 0, 0], [1, 2, 3]], dtype=torch.int32)),
     "block id -1"),
    (dict(scale=0.0), "scale must be a positive"),
    (dict(scale=float("nan")), "scale must be a positive"),
    (dict(q=torch.randn(2, 4, 8, device="meta"), k_cache=torch.zeros(6, 4, 2, 8, device="meta"),
          v_cache=torch.zeros(6, 4, 2, 8, device="meta")), "block_tables is on cpu"),
]


@pytest.mark.parametrize("fn", [paged_attention_decode, paged_attention_decode_ref,
                                paged_attention_decode_split, paged_attention_decode_split_ref],
                         ids=["triton", "ref", "triton_split", "ref_split"])
@pytest.mark.parametrize("over,match", DECODE_BAD)
def test_decode_rejects_bad_input(fn, over, match):
    with pytest.raises(ValueError, match=match):
        fn(**_decode_args(**over))


def test_unused_table_entries_may_hold_anything():
    """Only the blocks a sequence uses are checked: -1 or stale ids past its length are fine."""
    a = _decode_args(block_tables=torch.tensor([[0, -1, 99], [1, 2, 3]], dtype=torch.int32))
    assert paged_attention_decode_ref(**a).shape == (2, 4, 8)


@pytest.mark.parametrize("fn", [paged_attention_decode_split, paged_attention_decode_split_ref],
                         ids=["triton", "ref"])
@pytest.mark.parametrize("splits", [0, 2.0, True])
def test_split_rejects_bad_num_splits(fn, splits):
    with pytest.raises(ValueError, match="num_splits must be a positive int"):
        fn(**_on_dev(_decode_args()), num_splits=splits)


def _on_dev(args: dict) -> dict:
    """The arguments on the device the compiled kernels accept (CUDA where there is one)."""
    return {k: v.to(DEV) if isinstance(v, torch.Tensor) else v for k, v in args.items()}


WRITE_BAD = [
    (dict(slot_mapping=torch.tensor([0, 5, -1], dtype=torch.int32)), "1-D int64"),
    (dict(slot_mapping=torch.tensor([0, 5])), "2 entries for T = 3"),
    (dict(slot_mapping=torch.tensor([0, 24, -1])), "slot 24 but the cache has only 24"),
    (dict(slot_mapping=torch.tensor([4, 4, -1])), "same slot"),
    (dict(k=torch.randn(3, 2, 8, dtype=torch.float16)), "cast it first"),
    (dict(k=torch.randn(3, 3, 8), v=torch.randn(3, 3, 8)), "K=2, H=8"),
    (dict(v=torch.randn(2, 2, 8)), "same shape"),
    (dict(v_cache=torch.zeros(6, 4, 2, 8, dtype=torch.float16)), "must match"),
]


@pytest.mark.parametrize("fn", [write_kv, write_kv_ref], ids=["triton", "ref"])
@pytest.mark.parametrize("over,match", WRITE_BAD)
def test_write_kv_rejects_bad_input(fn, over, match):
    with pytest.raises(ValueError, match=match):
        fn(**_write_args(**over))


def test_validate_false_skips_only_the_value_checks():
    with pytest.raises(ValueError, match="int32"):
        paged_attention_decode_ref(**_decode_args(context_lens=torch.tensor([3, 9])),
                                   validate=False)
    k = torch.zeros(6, 4, 2, 8)
    write_kv_ref(**_write_args(k_cache=k, slot_mapping=torch.tensor([4, 4, -1])), validate=False)
    assert k[1, 0].abs().sum() > 0


def test_config_rules_and_empty_batch():
    with pytest.raises(ValueError, match="power of two >= 16"):
        pa._check_config(pa.DecodeConfig(block_n=8))
    a = _decode_args(q=torch.randn(0, 4, 8).to(DEV), block_tables=torch.zeros(
        0, 3, dtype=torch.int32, device=DEV), context_lens=torch.zeros(0, dtype=torch.int32,
                                                                          device=DEV),
        k_cache=torch.zeros(6, 4, 2, 8, device=DEV), v_cache=torch.zeros(6, 4, 2, 8, device=DEV))
    for fn in (paged_attention_decode, paged_attention_decode_split, paged_attention_decode_ref,
               paged_attention_decode_split_ref):
        assert fn(**a).shape == (0, 4, 8)
    write_kv(**_on_dev(_write_args(k=torch.zeros(0, 2, 8), v=torch.zeros(0, 2, 8),
                                   slot_mapping=torch.zeros(0, dtype=torch.int64))))
    if not torch.cuda.is_available():
        assert pa.INTERPRET, "kernels/ must switch Triton to its interpreter without CUDA"


def test_pick_num_splits_fills_the_gpu():
    # batch 1, 8 KV heads, 32k tokens in blocks of 16: 8 programs -> 33 splits (264 programs)
    assert par.pick_num_splits(1, 8, 2048, 16, n_sm=132) == 33
    assert par.pick_num_splits(32, 8, 256, 16, n_sm=132) == 2     # 256 programs already
    assert par.pick_num_splits(1, 8, 4, 16) == 1                 # 64 tokens: not worth a split
    assert par.split_bounds(10, 16, 3) == 4 * 16                 # whole blocks per split


def test_slot_mapping_ref():
    table = torch.tensor([7, 2, 5], dtype=torch.int32)
    got = par.slot_mapping_ref(table, torch.arange(10), 4)
    assert got.tolist() == [28, 29, 30, 31, 8, 9, 10, 11, 20, 21] and got.dtype == torch.int64
    tables = torch.tensor([[3, 0], [1, 4]])
    assert par.slot_mapping_ref(tables, torch.tensor([[0, 5], [2, 3]]), 3).tolist() == \
        [[9, 2], [5, 12]]
    for bad, match in [(dict(positions=torch.tensor([12])), "0..11"),
                       (dict(positions=torch.tensor([-1])), "0..11"),
                       (dict(positions=torch.tensor([1.0])), "integer"),
                       (dict(block_size=0), "positive int")]:
        a = dict(block_tables=table, positions=torch.arange(3), block_size=4)
        a.update(bad)
        with pytest.raises(ValueError, match=match):
            par.slot_mapping_ref(**a)


# ---- the GPU benchmark's code path, at tiny sizes -----------------------------------------------
def test_benchmark_dry_run(capsys):
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "paged_attention.py"
    spec = importlib.util.spec_from_file_location("bench_paged", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    report = bench.run(dry_run=True, warmup=0, repeats=1, num_splits=None, do_sweep=True)
    kinds = {(r["setting"], r["kernel"]) for r in report["rows"]}
    assert {("batch", "paged"), ("batch", "sdpa_grouped"), ("long", "unsplit"),
            ("long", "split")} <= kinds
    paged = next(r for r in report["rows"] if r["kernel"] == "paged")
    s = report["sizes"]["batch"]
    kv = 2 * s["B"] * s["L"] * s["K"] * s["H"] * 2                # bf16 K and V, every token
    assert paged["bytes"] == kv + 2 * s["B"] * s["N"] * s["H"] * 2 + s["B"] * (
        -(-s["L"] // s["block"]) + 1) * 4
    assert set(report["goals"]) == {"pct_of_copy", "vs_sdpa", "split_speedup"}
    assert report["dry_run"] and report["sweep"]
    bench.print_report(report)
    assert "DRY RUN" in capsys.readouterr().out
    if not torch.cuda.is_available():
        assert bench.main([]) == 0
        assert "needs a CUDA GPU" in capsys.readouterr().out
