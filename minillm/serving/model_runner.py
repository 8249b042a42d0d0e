"""Selective batching: run a ragged batch of sequences through the one model in one call.

Orca's observation: in a step where sequence A brings 7 new tokens (its prompt), B one (a
decode) and C 3, the dense layers do not care which token belongs to whom. So instead of padding
to a [3, 7] rectangle, the runner concatenates the new tokens into one row

    ids       [1, 7 + 1 + 3]    positions  [7 + 1 + 3]   (each token's own position)

and the projections and the MLP -- the bulk of the FLOPs -- run as one [11, D] matmul with no
padding. Only attention needs to know the boundaries: `AttentionMetadata` tells the paged cache
which rows belong to which sequence and where each one's keys and values live. The LM head, a
[D, V] matmul per row, runs only on the rows whose logits are sampled: each sequence's last new
token (and none of a prompt chunk that is not the prompt's last).

The runner owns the KV storage (`PagedKVCache`) and the sampler; the scheduler decides which
sequences run, the block manager where their tokens go.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..model import require_softmax_decoder
from ..sampling import sample
from .attention_backend import AttentionMetadata, PagedKVCache
from .block_manager import BlockManager
from .sequence import Sequence


def flatten_batch(seqs: list[Sequence], num_new: list[int] | None = None
                  ) -> tuple[list[int], list[int], list[int]]:
    """The new tokens of every sequence (all its uncached ones, or num_new[i] of them: a prefill
    chunk), concatenated: (ids, positions, query_lens)."""
    ids, positions, lens = [], [], []
    for i, s in enumerate(seqs):
        start = s.num_cached_tokens
        end = s.num_tokens if num_new is None else start + num_new[i]
        ids.extend(s.token_ids[start:end])
        positions.extend(range(start, end))
        lens.append(end - start)
    return ids, positions, lens


def last_rows(query_lens: list[int]) -> list[int]:
    """Row of each sequence's last new token in the flattened batch (its next-token logits)."""
    rows, acc = [], 0
    for n in query_lens:
        acc += n
        rows.append(acc - 1)
    return rows


@dataclass
class StepPlan:
    """One step of the runner as plain values: block copies, the flattened tokens and their
    positions, per-sequence new / context lengths, KV slots, block tables, sampled rows."""
    copies: list
    ids: list[int]
    positions: list[int]
    lens: list[int]
    context_lens: list[int]
    slots: list[int]
    block_tables: list[list[int]]
    rows: list[int]


class ModelRunner:
    def __init__(self, model, block_manager: BlockManager, backend: str = "auto"):
        require_softmax_decoder(model, "the serving engine")
        self.model, self.bm = model, block_manager
        self.device = next(model.parameters()).device
        self.kv = PagedKVCache.for_model(model, block_manager.num_blocks,
                                         block_manager.block_size, backend)
        self.tokens_run = 0          # tokens pushed through the model, ever (a work counter)
        self.forward_calls = 0

    @torch.no_grad()
    def run(self, seqs: list[Sequence], copies=(), num_new: list[int] | None = None,
            sampled: list[bool] | None = None) -> torch.Tensor:
        """One forward pass over the uncached tokens of `seqs` (or num_new[i] of them):
        next-token logits [number sampled, V] at the last new token of each sequence with
        sampled[i] (default: all), in order.

        `copies` are the copy-on-write block copies the scheduler asked for this step."""
        return self.execute(self.prepare(seqs, copies, num_new, sampled))

    def prepare(self, seqs: list[Sequence], copies=(), num_new: list[int] | None = None,
                sampled: list[bool] | None = None) -> StepPlan:
        """The step as plain lists (what a tensor-parallel rank 0 sends its peers)."""
        if not seqs:
            raise ValueError("run() needs at least one sequence")
        ids, positions, lens = flatten_batch(seqs, num_new)
        bad = [s.seq_id for s, n in zip(seqs, lens)
               if not 1 <= n <= s.num_uncached_tokens]
        if bad:
            raise ValueError(f"sequences {bad}: each must run 1..(its uncached tokens) tokens")
        sampled = [True] * len(seqs) if sampled is None else list(sampled)
        if len(sampled) != len(seqs):
            raise ValueError(f"sampled has {len(sampled)} entries for {len(seqs)} sequences")
        slots = [slot for s, n in zip(seqs, lens) for slot in
                 self.bm.slot_mapping(s, range(s.num_cached_tokens, s.num_cached_tokens + n))]
        return StepPlan(list(copies), ids, positions, lens,
                        [s.num_cached_tokens + n for s, n in zip(seqs, lens)], slots,
                        [list(self.bm.block_table(s)) for s in seqs],
                        [r for r, keep in zip(last_rows(lens), sampled) if keep])

    @torch.no_grad()
    def execute(self, plan: StepPlan) -> torch.Tensor:
        """Run a prepared step: copy-on-write copies, the KV writes and attention through the
        paged cache, the LM head on plan.rows -> logits [len(rows), V]."""
        self.kv.copy_blocks(plan.copies)
        self.kv.meta = AttentionMetadata.build(plan.lens, plan.context_lens, plan.slots,
                                               plan.block_tables, self.device)
        ids_t = torch.tensor(plan.ids, dtype=torch.long, device=self.device)[None]
        pos_t = torch.tensor(plan.positions, dtype=torch.long, device=self.device)
        try:
            logits = self.model(ids_t, pos_t, cache=self.kv,
                                rows=torch.tensor(plan.rows, dtype=torch.long,
                                                  device=self.device))
        finally:
            self.kv.meta = None
        self.tokens_run += len(plan.ids)
        self.forward_calls += 1
        return logits[0]                                              # [len(rows), V]

    @staticmethod
    def sample(seqs: list[Sequence], logits: torch.Tensor) -> list[int]:
        """Each sequence draws with its own parameters and its own generator, so a seeded
        request gets the same tokens whoever else shares the batch."""
        greedy = [i for i, s in enumerate(seqs) if s.params.temperature == 0]
        out = [0] * len(seqs)
        if greedy:
            for i, t in zip(greedy, logits[greedy].argmax(-1).tolist()):
                out[i] = t
        for i, s in enumerate(seqs):
            p = s.params
            if p.temperature != 0:
                out[i] = int(sample(logits[i:i + 1], p.temperature, p.top_k, p.top_p,
                                    s.generator)[0])
        return out


@torch.no_grad()
def selective_prefill_logits(model, token_lists) -> torch.Tensor:
    """Next-token logits [B, V] of several prompts of different lengths, computed in ONE forward
    pass over their sum(lens) tokens (no padding): selective batching of a prefill."""
    from .attention_backend import RaggedPrefill
    lens = [len(t) for t in token_lists]
    if not lens or min(lens) < 1:
        raise ValueError("need at least one prompt, each with at least one token")
    device = next(model.parameters()).device
    ids = torch.tensor([t for toks in token_lists for t in toks], device=device)[None]
    positions = torch.cat([torch.arange(n, device=device) for n in lens])
    logits = model(ids, positions, cache=RaggedPrefill(lens))[0]
    return logits[last_rows(lens)]
