"""`LLMEngine`: scheduler + block manager + model runner, behind two small APIs.

    engine = LLMEngine(model, num_blocks=256, block_size=16, max_num_seqs=16)
    outs = engine.generate([[1, 2, 3], [4, 5]], SamplingParams(max_new_tokens=20, seed=0))

    rid = engine.add_request(prompt_ids, params, arrival_time=t)    # the step API
    while engine.has_unfinished():
        finished = engine.step()        # one iteration: schedule, one forward pass, sample

Each step schedules a ragged batch (decodes + admitted prefills, or prefill chunks with
chunked_prefill=True), runs it through the model in one call, samples one token per sequence
whose prompt is all in the cache and retires finished sequences, freeing their KV blocks at once
for the queue. `abort(request_id)` drops a request wherever it is (a client went away). Outputs equal `minillm.generate.generate_cached` run on each request
alone with the same SamplingParams: each request samples with its own seeded generator, so who
shares its batch does not matter (up to float rounding of the differently shaped matmuls).

Parallel sampling: `add_request(..., n=3)` prefills the prompt once and forks 3 sequences that
share its KV blocks (copy-on-write); sample i is seeded with params.seed + i. The request takes
n of the max_num_seqs seats from its admission on (scheduler.py).

`engine.steps` records, per step, which request ran how many tokens (the lab 06 timeline), and
the sequences keep their arrival / first-token / finish times (metrics.py).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from kernels.intmath import cdiv

from ..sampling import SamplingParams
from .model_runner import ModelRunner
from .scheduler import Scheduler
from .sequence import Sequence, check_request


@dataclass
class StepRecord:
    step: int
    start: float
    end: float
    runs: list[tuple[int, int, int]] = field(default_factory=list)  # (request, seq, new tokens)
    num_preempted: int = 0
    tokens: int = 0           # token positions pushed through the model (padding included)


class LLMEngine:
    def __init__(self, model, *, num_blocks: int | None = None, block_size: int = 16,
                 max_num_seqs: int = 16, max_num_batched_tokens: int | None = None,
                 enable_prefix_caching: bool = True, chunked_prefill: bool = False,
                 backend: str = "auto", clock=None, runner=ModelRunner):
        ctx = model.config.max_seq_len
        if num_blocks is None:              # enough that max_num_seqs full contexts never evict
            num_blocks = max_num_seqs * cdiv(ctx, block_size)
        self.model = model
        self.max_seq_len = ctx
        self.scheduler = Scheduler(num_blocks, block_size, max_num_seqs,
                                   max_num_batched_tokens or max(2048, ctx),
                                   enable_prefix_caching, chunked_prefill)
        # runner: ModelRunner, or a class like it (minillm.parallel's rank-0 runner)
        self.runner = runner(model, self.scheduler.block_manager, backend)
        self.clock = clock or time.perf_counter
        self.device = self.runner.device
        self.sequences: dict[int, list[Sequence]] = {}     # request id -> its sequence(s)
        self.steps: list[StepRecord] = []
        self._pending_forks: dict[int, list[Sequence]] = {}  # parent seq id -> children
        self._next_seq = self._next_request = self.num_steps = 0

    # ---- requests ---------------------------------------------------------------------------
    def _new_seq(self, prompt, params, arrival, request_id, seed) -> Sequence:
        gen = None
        if seed is not None:
            gen = torch.Generator(device=self.device).manual_seed(seed)
        s = Sequence(self._next_seq, list(prompt), len(prompt), params, arrival, request_id, gen)
        self._next_seq += 1
        return s

    def add_request(self, prompt, params: SamplingParams | None = None, *,
                    arrival_time: float | None = None, n: int = 1) -> int:
        """Queue one prompt (a list of token ids); returns its request id."""
        params = params or SamplingParams()
        if int(n) != n or not 1 <= n <= self.scheduler.max_num_seqs:
            raise ValueError(f"n (samples per prompt) must be an integer in 1..max_num_seqs "
                             f"({self.scheduler.max_num_seqs}), got {n}")
        prompt = check_request(prompt, params, self.model.config.vocab_size, self.max_seq_len)
        need = self.bm.blocks_needed(len(prompt) + params.max_new_tokens)
        if need > self.bm.num_blocks:
            raise ValueError(f"this request needs {need} KV blocks of {self.bm.block_size} "
                             f"tokens but the engine has only {self.bm.num_blocks}: it could "
                             f"never run")
        rid = self._next_request
        self._next_request += 1
        now = self.clock() if arrival_time is None else arrival_time
        seed = params.seed
        parent = self._new_seq(prompt, params, now, rid, seed)
        kids = [self._new_seq(prompt, params, now, rid, None if seed is None else seed + i)
                for i in range(1, int(n))]
        self.sequences[rid] = [parent, *kids]
        if kids:
            self._pending_forks[parent.seq_id] = kids
        self.scheduler.add(parent, seats=int(n))
        return rid

    def abort(self, request_id: int) -> list[Sequence]:
        """Stop every unfinished sample of a request now and free its KV blocks; returns them
        (finish_reason "abort"). Samples not forked yet are dropped with their parent."""
        if request_id not in self.sequences:
            raise KeyError(f"no request {request_id}")
        stopped = []
        for s in self.sequences[request_id]:
            self._pending_forks.pop(s.seq_id, None)
            if not s.is_finished:
                self.scheduler.abort(s)
                s.finish_reason = s.finish_reason or "abort"
                s.finish_time = self.clock()
                stopped.append(s)
        return stopped

    @property
    def bm(self):
        """The scheduler's KV block manager (read it; the scheduler alone changes it)."""
        return self.scheduler.block_manager

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # ---- one iteration ----------------------------------------------------------------------
    def step(self) -> list[Sequence]:
        """Schedule, run one forward pass, sample; returns the sequences that finished."""
        start = self.clock()
        batch = self.scheduler.schedule(start)
        if not batch.seqs:
            return []
        done = [s.num_cached_tokens + n == s.num_tokens for s, n in zip(batch.seqs, batch.num_new)]
        logits = self.runner.run(batch.seqs, batch.copies, batch.num_new, done)
        for s, n in zip(batch.seqs, batch.num_new):
            s.num_cached_tokens += n                    # the pass stored these tokens' K/V
        seqs = [s for s, d in zip(batch.seqs, done) if d]   # they sample; chunks wait
        new_tokens = [n for n, d in zip(batch.num_new, done) if d]
        rows = list(range(len(seqs)))
        for i, s in enumerate(list(seqs)):            # parallel sampling: fork after prefill
            for kid in self._pending_forks.pop(s.seq_id, ()):
                self.scheduler.fork(s, kid)             # shares every block, ref counts + 1
                seqs.append(kid)
                rows.append(i)                          # samples from the parent's logits
                new_tokens.append(0)
        tokens = self.runner.sample(seqs, logits[rows])
        end = self.clock()
        record = StepRecord(self.num_steps, start, end, num_preempted=len(batch.preempted),
                            tokens=batch.num_tokens)
        record.runs = [(s.request_id, s.seq_id, n)
                       for s, n, d in zip(batch.seqs, batch.num_new, done) if not d]
        finished = []
        for s, tok, n in zip(seqs, tokens, new_tokens):
            record.runs.append((s.request_id, s.seq_id, n))
            s.append_token(tok, end)
            if s.wants_to_stop:
                s.finish_time = end
                self.scheduler.finish(s)
                finished.append(s)
        self.steps.append(record)
        self.num_steps += 1
        return finished

    # ---- offline use ------------------------------------------------------------------------
    def generate(self, prompts, params: SamplingParams | list[SamplingParams] | None = None
                 ) -> list[list[int]]:
        """New token ids for each prompt (a list of token-id lists), served together."""
        if not isinstance(params, (list, tuple)):
            params = [params or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(params)} SamplingParams")
        rids = [self.add_request(p, sp) for p, sp in zip(prompts, params)]
        while self.has_unfinished():
            self.step()
        return [self.sequences[r][0].output_ids for r in rids]

    def release(self, request_id: int) -> None:
        """Forget a finished request (a long-running server calls this once it has answered)."""
        seqs = self.sequences.get(request_id)
        if seqs is None:
            raise KeyError(f"no request {request_id}")
        if not all(s.is_finished for s in seqs):
            raise ValueError(f"request {request_id} has not finished: abort it first")
        del self.sequences[request_id]

    def outputs(self, request_id: int) -> list[list[int]]:
        """Generated token ids of every sample of a request."""
        return [s.output_ids for s in self.sequences[request_id]]

    def all_sequences(self) -> list[Sequence]:
        return [s for seqs in self.sequences.values() for s in seqs]
