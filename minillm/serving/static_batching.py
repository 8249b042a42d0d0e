"""The baseline continuous batching beats: static batching (wait, pad, run to the longest).

A static server takes the requests that are waiting (up to max_batch), pads their prompts on the
left to the longest one, prefills the [B, P_max] rectangle, and decodes all B rows together
until the LAST one is done. Then, and only then, it looks at the queue again.

    waste 1 (padding): B * P_max prompt slots for sum(P_i) real prompt tokens;
    waste 2 (run to the longest): B * max(O_i) decode slots for sum(O_i) real output tokens --
            a row that finished early keeps computing garbage until the batch ends;
    waste 3 (waiting): a request arriving just after a batch started waits for all of it.

With heavy-tailed output lengths max(O_i) is many times the mean, so most slots are garbage.
`StaticBatchServer` counts the slots exactly (`token_slots` vs `useful_tokens`) and has the
same add_request / step API as `LLMEngine`, so the same driver and metrics serve both.

The padded rows are masked properly (their outputs equal generate_cached's): `PaddedKVCache`
is the lab 02 static cache plus a per-row "this column is padding" mask, and it attends itself
through the model's cache hook.
"""
from __future__ import annotations

import time

import torch

from ..kvcache import KVCache, layer_specs
from ..model import require_softmax_decoder, sdpa
from ..sampling import SamplingParams
from .engine import StepRecord
from .model_runner import ModelRunner
from .sequence import Sequence, SequenceStatus, check_request


class PaddedKVCache(KVCache):
    """A KVCache for a left-padded batch: row b's first pad_lens[b] columns are padding, never
    attended to. Column c of row b holds position c - pad_lens[b]."""

    def __init__(self, specs, pad_lens: list[int], max_len: int, dtype=torch.float32,
                 device="cpu"):
        super().__init__(specs, len(pad_lens), max_len, dtype, device)
        cols = torch.arange(max_len, device=self.device)
        pads = torch.tensor(pad_lens, device=self.device)
        self.valid = cols[None, :] >= pads[:, None]                         # [B, max_len]

    def attention(self, layer, q, k, v, positions, window):
        if window is not None:
            raise ValueError("PaddedKVCache does not serve sliding-window layers")
        start, T = self.seq_len, q.shape[2]
        k_all, v_all, _ = self.update(layer, k, v, positions)               # [B, K, S, H]
        S = k_all.shape[2]
        cols = torch.arange(S, device=q.device)
        q_cols = torch.arange(start, start + T, device=q.device)
        mask = (cols[None, :] <= q_cols[:, None])[None] & self.valid[:, None, :S]   # [B, T, S]
        mask = mask | ~self.valid[:, start:start + T, None]   # a pad query may see anything
        return sdpa(q, k_all, v_all, attn_mask=mask[:, None])  # (no all-masked row, no NaN)

    def advance(self, positions) -> None:
        self.seq_len += positions.shape[-1]


class StaticBatchServer:
    def __init__(self, model, max_batch: int = 16, clock=None, pad_id: int = 0):
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        require_softmax_decoder(model, "the static-batching server")
        self.model, self.max_batch, self.pad_id = model, max_batch, pad_id
        self.clock = clock or time.perf_counter
        self.device = next(model.parameters()).device
        self.max_seq_len = model.config.max_seq_len
        self.waiting: list[Sequence] = []
        self.batch: list[Sequence] | None = None
        self.cache: PaddedKVCache | None = None
        self.sequences: dict[int, list[Sequence]] = {}
        self.steps: list[StepRecord] = []
        self.token_slots = 0        # token positions pushed through the model, padding included
        self.useful_tokens = 0      # of which real prompt tokens or live decode tokens

    def add_request(self, prompt, params: SamplingParams | None = None, *,
                    arrival_time: float | None = None) -> int:
        params = params or SamplingParams()
        prompt = check_request(prompt, params, self.model.config.vocab_size, self.max_seq_len)
        rid = len(self.sequences)
        gen = None
        if params.seed is not None:
            gen = torch.Generator(device=self.device).manual_seed(params.seed)
        now = self.clock() if arrival_time is None else arrival_time
        seq = Sequence(rid, prompt, len(prompt), params, now, rid, gen)
        self.sequences[rid] = [seq]
        self.waiting.append(seq)
        return rid

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.batch)

    @torch.no_grad()
    def _prefill(self, now: float) -> torch.Tensor:
        self.batch, self.waiting = self.waiting[:self.max_batch], self.waiting[self.max_batch:]
        lens = [s.num_tokens for s in self.batch]
        P = max(lens)
        pads = [P - n for n in lens]
        ids = torch.full((len(lens), P), self.pad_id, dtype=torch.long)
        for b, s in enumerate(self.batch):
            ids[b, pads[b]:] = torch.tensor(s.token_ids)
            s.status, s.first_scheduled_time = SequenceStatus.RUNNING, now
        positions = (torch.arange(P)[None, :] - torch.tensor(pads)[:, None]).clamp(min=0)
        max_len = P + max(s.params.max_new_tokens for s in self.batch)
        p = next(self.model.parameters())
        self.cache = PaddedKVCache(layer_specs(self.model), pads, max_len, p.dtype, p.device)
        self.token_slots += len(lens) * P
        self.useful_tokens += sum(lens)
        return self.model(ids.to(self.device), positions.to(self.device), cache=self.cache,
                          last_only=True)[:, -1]

    @torch.no_grad()
    def _decode(self) -> torch.Tensor:
        ids = torch.tensor([[s.last_token] for s in self.batch], device=self.device)
        positions = torch.tensor([[s.num_tokens - 1] for s in self.batch], device=self.device)
        self.token_slots += len(self.batch)
        self.useful_tokens += sum(not s.is_finished for s in self.batch)
        return self.model(ids, positions, cache=self.cache)[:, -1]

    def step(self) -> list[Sequence]:
        start, slots_before = self.clock(), self.token_slots
        if self.batch is None:
            if not self.waiting:
                return []
            prefill = True
            logits = self._prefill(start)
        else:
            prefill = False
            logits = self._decode()
        live = [i for i, s in enumerate(self.batch) if not s.is_finished]
        tokens = ModelRunner.sample([self.batch[i] for i in live], logits[live])
        end = self.clock()
        record = StepRecord(len(self.steps), start, end, tokens=self.token_slots - slots_before)
        finished = []
        for i, tok in zip(live, tokens):
            s = self.batch[i]
            record.runs.append((s.request_id, s.seq_id, s.num_tokens if prefill else 1))
            s.append_token(tok, end)
            if s.wants_to_stop:
                s.status, s.finish_time = SequenceStatus.FINISHED, end
                finished.append(s)
        self.steps.append(record)
        if all(s.is_finished for s in self.batch):      # only now may the queue move
            self.batch, self.cache = None, None
        return finished

    def all_sequences(self) -> list[Sequence]:
        return [s for seqs in self.sequences.values() for s in seqs]


@torch.no_grad()
def padded_prefill_logits(model, token_lists, pad_id: int = 0) -> torch.Tensor:
    """Next-token logits [B, V] of several prompts, static-batching style: left-padded to the
    longest into a [B, max(lens)] rectangle, padding masked (the static server's prefill)."""
    lens = [len(t) for t in token_lists]
    if not lens or min(lens) < 1:
        raise ValueError("need at least one prompt, each with at least one token")
    P, p = max(lens), next(model.parameters())
    pads = [P - n for n in lens]
    ids = torch.full((len(lens), P), pad_id, dtype=torch.long)
    for b, toks in enumerate(token_lists):
        ids[b, pads[b]:] = torch.tensor(list(toks))
    positions = (torch.arange(P)[None, :] - torch.tensor(pads)[:, None]).clamp(min=0)
    cache = PaddedKVCache(layer_specs(model), pads, P, p.dtype, p.device)
    return model(ids.to(p.device), positions.to(p.device), cache=cache, last_only=True)[:, -1]
