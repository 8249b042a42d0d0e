"""Figures for the deck of lab 07: paged attention (slides/07_paged_attention.md)."""
from __future__ import annotations

from matplotlib.figure import Figure

from .common import (
    BLUE,
    GREEN,
    GREY,
    ORANGE,
    PURPLE,
    RED,
    SKY,
    figure,
    html_table,
    new_figure,
    style_axes,
)

# Counts only: the fragmentation replay, BlockManager, lab 07's split cost model, napkin bytes,
# and lab 07's kernel helpers (the walk, the grid, the test cases).

@figure
def fragmentation() -> Figure:
    """KV slots over time for the lab 06 trace (64 requests, 40/s, 2048 slots) replayed by
    minillm.serving.fragmentation: contiguous first-fit reservations of prompt + 256 vs
    16-token blocks."""
    from minillm.serving.fragmentation import held_fill, replay, trace_requests
    requests = trace_requests(num_requests=64, rate=40.0, seed=0, max_new=256)
    fig, axes = new_figure(11, 4.4, nrows=1, ncols=2, sharey=True)
    for ax, paged in zip(axes, (False, True)):
        h = replay(requests, paged, capacity=2048, block_size=16, max_new=256)
        ax.stackplot(range(len(h)), *[[r[k] for r in h] for k in ("used", "internal",
                                                                   "external", "free")],
                     colors=[GREEN, ORANGE, RED, "#e8e8e8"],
                     labels=["used (tokens)", "internal", "external", "free"])
        frac = held_fill(h)
        ax.set_title(f"{'paged, blocks of 16' if paged else 'contiguous, prompt + 256 reserved'}"
                     f"\ntokens fill {100 * frac:.0f} % of held memory; done after {len(h)} "
                     f"steps", fontsize=11)
        ax.set_xlabel("decode step")
        style_axes(ax, grid=False)
    axes[0].set_ylabel("KV slots (2048)")
    axes[1].legend(loc="upper right", fontsize=9)
    return fig


@figure
def block_table() -> Figure:
    """One sequence of 11 tokens in blocks of 4: its block table [7, 2, 5] and where each
    position lands in the pool (kernels.paged_attention_ref.slot_mapping_ref)."""
    import torch
    from matplotlib.patches import FancyArrowPatch, Rectangle

    from kernels.paged_attention_ref import slot_mapping_ref
    B, table, L = 4, [7, 2, 5], 11
    slots = slot_mapping_ref(torch.tensor(table), torch.arange(L), B).tolist()
    fig, ax = new_figure(8.5, 4.4)
    colors = [BLUE, ORANGE, GREEN]
    for pos in range(12):                                        # logical view
        j = pos // B
        ax.add_patch(Rectangle((pos + j * 0.4, 2.2), 0.9, 0.8,
                               color=colors[j] if pos < L else "#eeeeee"))
        ax.text(pos + j * 0.4 + 0.45, 2.6, str(pos) if pos < L else "", ha="center",
                va="center", fontsize=9, color="white")
    ax.text(-0.4, 2.6, "positions", ha="right", va="center", fontsize=11)
    for j, b in enumerate(table):                                # the table
        ax.add_patch(Rectangle((1.2 + j * 4.4, 0.9), 1.4, 0.7, fill=False, lw=1.5))
        ax.text(1.9 + j * 4.4, 1.25, str(b), ha="center", va="center", fontsize=12)
    ax.text(-0.4, 1.25, "block table", ha="right", va="center", fontsize=11)
    for b in range(9):                                           # the pool
        x0 = b * 2.0
        owner = table.index(b) if b in table else None
        for r in range(B):
            slot = b * B + r
            filled = slot in slots
            ax.add_patch(Rectangle((x0 + r * 0.45, -1.0), 0.42, 0.7,
                                   color=colors[owner] if filled else "#eeeeee"))
        ax.text(x0 + 0.9, -1.35, f"block {b}", ha="center", va="top", fontsize=9)
        if owner is not None:
            ax.add_patch(FancyArrowPatch((1.9 + owner * 4.4, 0.85), (x0 + 0.9, -0.25),
                                         arrowstyle="->", mutation_scale=12, color=GREY))
    ax.text(-0.4, -0.65, "KV pool", ha="right", va="center", fontsize=11)
    ax.set_title("slot = table[pos // 4] · 4 + pos % 4\nposition 9 → table[2] · 4 + 1 = "
                 f"{slots[9]}  (block 5, row 1)", fontsize=12)
    ax.set_xlim(-3.2, 18.2)
    ax.set_ylim(-1.9, 3.3)
    ax.axis("off")
    return fig


def _block_map_history(steps: int = 40, num_blocks: int = 32, block: int = 4):
    """The serving BlockManager (no prefix caching) under a scripted load: a 10-token system
    prompt kept as sequence 0; every 3rd step a request forks it, appends 2-6 prompt tokens and
    4-12 answer tokens; every 3rd request forks a sibling answer after its prompt."""
    import numpy as np

    from minillm.serving import BlockManager, Sequence
    bm = BlockManager(num_blocks, block, enable_prefix_caching=False)
    root = Sequence(0, [1] * 10, prompt_len=10)
    bm.allocate(root)
    seqs, plans, next_id, copies = {}, {}, 1, 0
    owner = np.full((steps, num_blocks), -1)
    for step in range(steps):
        if step % 3 == 0 and bm.num_free_blocks > 6:
            s = Sequence(next_id, [1] * 10, prompt_len=10)
            bm.fork(root, s)
            seqs[next_id], plans[next_id] = s, [2 + next_id % 5, 4 + (3 * next_id) % 9,
                                                next_id % 3 == 0]
            next_id += 1
        for sid in list(plans):
            s, plan = seqs[sid], plans[sid]
            s.token_ids.append(1)
            if not bm.can_append(s):
                s.token_ids.pop()
                continue
            copies += len(bm.append_slot(s))
            if plan[0] > 0:
                plan[0] -= 1
                if plan[0] == 0 and plan[2]:
                    sib = Sequence(next_id, list(s.token_ids), prompt_len=s.prompt_len)
                    bm.fork(s, sib)
                    seqs[next_id], plans[next_id] = sib, [0, 3 + next_id % 7, False]
                    next_id += 1
            else:
                plan[1] -= 1
                if plan[1] == 0:
                    bm.free(s)
                    del plans[sid]
        for sid, table in bm.tables.items():
            for b in table:
                owner[step, b] = sid if bm.blocks[b].ref_count == 1 else -2
    return owner, copies


@figure
def block_map() -> Figure:
    """Which sequence owns which physical block, step by step (minillm.serving.BlockManager under
    a scripted load with a shared system prompt and forked sibling answers)."""
    import numpy as np
    from matplotlib import colormaps
    owner, copies = _block_map_history()
    palette = colormaps["tab20"]([i for i in range(20) if i not in (14, 15)])
    rgb = np.ones(owner.shape + (3,))
    for s in range(owner.max() + 1):
        rgb[owner == s] = palette[s % len(palette), :3]
    rgb[owner == -2] = 0.35
    fig, ax = new_figure(10, 4.6)
    ax.imshow(rgb, aspect="auto", interpolation="nearest")
    ax.set_xlabel("physical block")
    ax.set_ylabel("step")
    ax.set_title(f"colour: owner; dark gray: shared (ref count > 1); white: free — "
                 f"{copies} copy-on-write copies", fontsize=11)
    return fig


@figure
def sharing_table() -> str:
    """Blocks in use, counted by minillm.serving.BlockManager: a shared system prompt (prefix
    caching on vs off) and parallel sampling (fork + copy-on-write vs independent copies)."""
    from minillm.serving import BlockManager, Sequence
    B, rows = 16, []
    for P, s, n in ((512, 32, 64), (100, 20, 16)):
        used = []
        for cache in (False, True):
            bm = BlockManager(n * (-(-(P + s) // B)), B, enable_prefix_caching=cache)
            for i in range(n):
                ids = list(range(1, P + 1)) + [10_000 + 100 * i + j for j in range(s)]
                bm.allocate(Sequence(i, ids, prompt_len=len(ids)))
            used.append(bm.num_used_blocks)
        rows.append([f"system prompt {P} + {n} questions of {s}", str(used[0]), str(used[1]),
                     f"{used[0] / used[1]:.1f}×"])
    for P, T, n in ((500, 200, 8), (500, 20, 8)):
        bm = BlockManager(n * (-(-(P + T) // B)), B, enable_prefix_caching=False)
        seqs = [Sequence(0, [1] * P, prompt_len=P)]
        bm.allocate(seqs[0])
        for c in range(1, n):
            seqs.append(Sequence(c, [1] * P, prompt_len=P))
            bm.fork(seqs[0], seqs[c])
        copies = 0
        for _ in range(T):
            for s in seqs:
                s.token_ids.append(1)
                copies += len(bm.append_slot(s))
        alone = n * (-(-(P + T) // B))
        rows.append([f"{n} answers of {T} to a {P}-token prompt (fork; {copies} CoW copies)",
                     str(alone), str(bm.num_used_blocks), f"{alone / bm.num_used_blocks:.1f}×"])
    return html_table(["workload (blocks of 16)", "blocks, no sharing", "blocks, shared", "saving"],
                  rows)


@figure
def decode_bytes() -> str:
    """Napkin for one paged decode step per layer (bf16, 32 query / 8 KV heads of 128): bytes
    of K/V read, FLOPs per byte, and the time floor on an H100 (minillm.roofline preset)."""
    from minillm import roofline as rf
    h100 = rf.get_hardware("h100")
    rows = []
    for B, L in ((32, 4096), (1, 32768), (64, 1024)):
        kv = 2 * B * L * 8 * 128 * 2
        flops = 4 * B * L * 32 * 128
        rows.append([f"B = {B}, context {L:,}", f"{kv / 1e6:,.0f} MB", f"{flops / kv:.0f}",
                     f"{kv / h100.mem_bandwidth_bytes_per_s * 1e6:,.0f} µs"])
    return html_table(["decode step", "K/V bytes read", "FLOPs / byte",
                   f"floor at {h100.mem_bandwidth_bytes_per_s / 1e12:.2f} TB/s"], rows)


@figure
def split_programs() -> Figure:
    """Lab 07's cost model of an H100 running the split decode (kernels.split_model.
    split_decode_us: programs in flight, waves, the merge) against the number of splits, for 1,
    4 and 32 sequences of 32k tokens with 8 KV heads, beside the H100 sweep of
    benchmarks/RESULTS.md (1 sequence)."""
    import numpy as np

    from kernels.split_model import H100_SWEEP_US, split_decode_us
    splits = np.arange(1, 257)
    fig, ax = new_figure(7, 3.0)
    for batch, color in ((1, BLUE), (4, GREEN), (32, ORANGE)):
        ax.plot(splits, [split_decode_us(batch, 8, 32768, int(s)) for s in splits], color=color,
                label=f"model, batch {batch}")
    ax.plot(list(H100_SWEEP_US), list(H100_SWEEP_US.values()), "k+", ms=9,
            label="H100, batch 1, measured")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("splits S")
    ax.set_ylabel("time per decode step (us)")
    ax.set_title("a split buys programs for idle SMs and costs a merge", fontsize=11)
    ax.legend(fontsize=9)
    style_axes(ax)
    return fig


# --- the student's Triton kernel: grid, tile walk, masks -------------------------------------------
# The same helpers the lab uses (kernels/tiles.py): paged_tile_walk prints the walk in the notebook
# (07_tile_walk); tokens_per_split and kernel_tiles are what the launchers
# (autograder/labs/lab07_triton.py) pass to the kernels.
WALK_TABLE, WALK_LEN, WALK_BLOCK, WALK_TILE = [7, 2, 5, 11, 0, 9, -1], 21, 4, 16


@figure
def kernel_grid() -> Figure:
    """The programs of the split kernel's grid (B_seq, K, S) for sequences of 21, 9 and 14
    tokens, 8 query and 2 KV heads, blocks of 4, a table of 7 columns, 3 splits
    (kernels.tiles.tokens_per_split); S = 1 is the decode kernel's grid (B_seq, K)."""
    from matplotlib.patches import Rectangle

    from kernels.tiles import tokens_per_split
    lens, N, K, width, S = [21, 9, 14], 8, 2, 7, 3
    G, tps = N // K, tokens_per_split(width, WALK_BLOCK, S)
    fig, ax = new_figure(10, 4.3)
    for b, L in enumerate(lens):
        for kvh in range(K):
            y = -(b * K + kvh) - 0.35 * b
            ax.text(-0.1, y + 0.45, f"seq {b} (L = {L}), KV head {kvh}: q heads "
                    f"{kvh * G}..{kvh * G + G - 1}", ha="right", va="center", fontsize=10)
            for s in range(S):
                t0, t1 = s * tps, min((s + 1) * tps, L)
                empty = t1 <= t0
                ax.add_patch(Rectangle((s * 1.1, y), 1.0, 0.9, color="#eeeeee" if empty else
                                       [BLUE, ORANGE][kvh], lw=0))
                ax.text(s * 1.1 + 0.5, y + 0.45, "empty: lse = -inf" if empty else
                        f"positions {t0}..{t1 - 1}", ha="center", va="center", fontsize=9,
                        color="black" if empty else "white")
    for s in range(S):
        ax.text(s * 1.1 + 0.5, 1.05, f"split {s}: [{s * tps}, {(s + 1) * tps})", ha="center",
                va="bottom", fontsize=10)
    ax.set_title(f"program (b, kvh, s) = (tl.program_id(0), (1), (2)); {S} splits of "
                 f"{tps} positions (whole blocks of {WALK_BLOCK})", fontsize=11)
    ax.set_xlim(-4.2, S * 1.1)
    ax.set_ylim(-len(lens) * K - 0.35 * len(lens), 1.6)
    ax.axis("off")
    return fig


@figure
def tile_walk() -> Figure:
    """One program's walk over a sequence of 21 tokens, blocks of 4, tiles of 16 positions
    (kernels.tiles.paged_tile_walk, the walk the lab prints): each position's block-table column, block id
    and slot; masked positions (>= the length) are never loaded."""
    from matplotlib.patches import Rectangle

    from kernels.tiles import paged_tile_walk as walk
    tiles = walk(WALK_TABLE, WALK_LEN, WALK_BLOCK, WALK_TILE)
    palette = [BLUE, ORANGE, GREEN, PURPLE, SKY, RED]
    fig, ax = new_figure(11, 3.9)
    for i, tile in enumerate(tiles):
        y = -1.9 * i
        ax.text(-0.3, y + 0.45, f"tile {i}\nt0 = {tile['positions'][0]}", ha="right",
                va="center", fontsize=10)
        for j, (pos, col, blk, slot, ok) in enumerate(zip(tile["positions"], tile["column"],
                                                          tile["block"], tile["slot"],
                                                          tile["mask"])):
            colour = palette[col % len(palette)] if ok else "#eeeeee"
            ax.add_patch(Rectangle((j, y), 0.94, 0.9, color=colour, lw=0,
                                   hatch=None if ok else "//"))
            ax.text(j + 0.47, y + 0.45, str(pos), ha="center", va="center", fontsize=9,
                    color="white" if ok else GREY)
            ax.text(j + 0.47, y - 0.2, str(slot) if ok else "×", ha="center", va="center",
                    fontsize=8, color="black" if ok else RED)
        for col in sorted(set(tile["column"])):
            js = [j for j, c in enumerate(tile["column"]) if c == col]
            label = f"table[{col}] = {WALK_TABLE[col]}" if col < len(WALK_TABLE) else \
                f"column {col}: past the table"
            ax.text(js[0] + len(js) / 2 - 0.03, y + 1.05, label, ha="center", va="bottom",
                    fontsize=8)
    ax.text(-0.3, -0.2, "slot", ha="right", va="center", fontsize=9)
    ax.set_title(f"slot = table[pos // {WALK_BLOCK}] · {WALK_BLOCK} + pos % {WALK_BLOCK};  "
                 f"positions ≥ L = {WALK_LEN} masked (×): never loaded", fontsize=11)
    ax.set_xlim(-2.2, WALK_TILE + 0.2)
    ax.set_ylim(-1.9 * (len(tiles) - 1) - 0.6, 1.5)
    ax.axis("off")
    return fig


@figure
def kernel_masks() -> Figure:
    """The three masked tiles of one step of the walk, for G = 4 query heads of H = 12 and the
    last tile of the 21-token sequence (BLOCK_G, BLOCK_H from kernels.tiles.kernel_tiles, the mask from
    its paged_tile_walk): q [BLOCK_G, BLOCK_H], K or V [BLOCK_T, BLOCK_H], scores [BLOCK_G, BLOCK_T]."""
    import numpy as np

    from kernels.tiles import kernel_tiles
    from kernels.tiles import paged_tile_walk as walk
    G, H = 4, 12
    tiles = kernel_tiles(G * 2, 2, H, WALK_TILE)
    BG, BH, BT = tiles["BLOCK_G"], tiles["BLOCK_H"], tiles["BLOCK_T"]
    t_ok = np.array(walk(WALK_TABLE, WALK_LEN, WALK_BLOCK, WALK_TILE)[-1]["mask"])
    g_ok, h_ok = np.arange(BG) < G, np.arange(BH) < H
    panels = [("q tile: rows < G, columns < H\n(load with other=0)", g_ok[:, None] & h_ok[None, :],
               "query head in the group", "head dim"),
              ("K / V tile: positions < L, columns < H\n(never loaded past L)",
               t_ok[:, None] & h_ok[None, :], "position t0 + i", "head dim"),
              ("scores: set to -inf past L\n(weight e^(-inf) = 0)",
               np.broadcast_to(t_ok[None, :], (BG, BT)) & g_ok[:, None], "query head",
               "position t0 + j")]
    fig, axes = new_figure(11, 3.9, ncols=3)
    from matplotlib.colors import ListedColormap
    for ax, (title, mask, ylabel, xlabel) in zip(axes, panels):
        ax.imshow(mask, cmap=ListedColormap(["#e6e6e6", BLUE]), vmin=0, vmax=1,
                  interpolation="nearest")
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(ylabel, fontsize=10)
        ax.set_xlabel(xlabel, fontsize=10)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle(f"blue: real values; gray: padding (BLOCK_G = {BG}, BLOCK_H = {BH}, "
                 f"BLOCK_T = {BT}; G = {G}, H = {H}, last tile of L = {WALK_LEN})", fontsize=11)
    return fig


@figure
def running_max() -> Figure:
    """Scores of one query head over the 40 positions of a sequence built like the hidden tests'
    large-score case (the keys share a component and the query points along it, so scale * q . k
    lies far above 88.7), the running max after each tile of 8 positions, and where exp overflows
    float32."""
    import numpy as np
    import torch

    H, L, tile = 16, 40, 8
    g = torch.Generator().manual_seed(7013)
    common = torch.randn(H, generator=g)
    common = common / common.norm() * H ** 0.5
    k = common + 0.5 * torch.randn(L, H, generator=g)
    q = 40.0 * common + torch.randn(H, generator=g)
    s = (k @ q * H ** -0.5).numpy()
    fig, ax = new_figure(9, 3.8)
    top = max(s.max(), 90) * 1.15
    ax.axhspan(88.7, top, color=RED, alpha=0.08, lw=0)
    ax.axhline(88.7, color=RED, ls="--", lw=1.2)
    ax.bar(np.arange(L), s, color=BLUE, width=0.8, label="score s_j of query head 0")
    run = np.maximum.accumulate([s[t0:t0 + tile].max() for t0 in range(0, L, tile)])
    for i, m in enumerate(run):
        ax.hlines(m, i * tile - 0.5, min(L, i * tile + tile) - 0.5, color=ORANGE, lw=3,
                  label=f"running max m after each tile of {tile}" if i == 0 else None)
    ax.text(-0.5, 80, "above 88.7: e^s = inf in float32; e^(s - m) <= 1 always", color=RED,
            ha="left", va="top", fontsize=10,
            bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.85})
    ax.set_xlabel("position j")
    ax.set_ylabel("scale · q · k_j")
    ax.set_ylim(0, top)
    ax.legend(loc="lower right", fontsize=9, framealpha=0.9)
    style_axes(ax)
    return fig
