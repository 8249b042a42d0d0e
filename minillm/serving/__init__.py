"""Serving many requests at once (labs 06 and 07).

    Request -> Scheduler (waiting / running queues, admission by free KV blocks, preemption by
    recompute) -> BlockManager (block tables, slot mapping, ref counts, prefix hashes,
    copy-on-write) -> ModelRunner (ragged batch flattened for the dense layers, per-sequence
    attention metadata) -> attention backend (torch reference | Triton paged kernel) -> sampler

    from minillm.serving import LLMEngine
    engine = LLMEngine(model, num_blocks=256, block_size=16, max_num_seqs=16)
    outputs = engine.generate(prompts, SamplingParams(max_new_tokens=32, seed=0))

Files: sequence.py, block_manager.py, scheduler.py, attention_backend.py, model_runner.py,
engine.py (the engine); static_batching.py (the baseline), trace.py (workloads), metrics.py,
simulate.py (schedules without a model), fragmentation.py (KV waste of contiguous vs paged
allocation, replayed on a trace). Over HTTP: openai_api.py (the OpenAI API's requests and
answers), async_engine.py (the engine in its own thread), server.py (`minillm serve`),
replicas.py (`minillm serve --replicas N`). Measured
by minillm/bench/: batching.py (a trace through static and continuous batching: `minillm bench
batching`) and load_gen.py (open-loop Poisson load over HTTP: `minillm bench serve`).

Copies or a split. `serve --replicas N` is the lecture's easy parallelism: N whole copies of the
model, each its own server process with its share of the threads, behind one front that routes
each request to the copy with the fewest in flight. A request's latency is one copy's, N copies
answer up to N times as many requests, and the copies never communicate; they need N times the
memory, weights and KV cache both. Splitting one copy (tensor parallelism, minillm.parallel) is
what is left when a copy does not fit, or when one request must be faster: each step's work is
divided, at the price of an all-reduce after attention and after the MLP of every layer.
"""
from .block_manager import Block, BlockManager, block_hash
from .engine import LLMEngine, StepRecord
from .scheduler import ScheduledBatch, Scheduler
from .sequence import Sequence, SequenceStatus
from .static_batching import StaticBatchServer

__all__ = ["Block", "BlockManager", "block_hash", "LLMEngine", "StepRecord", "ScheduledBatch",
           "Scheduler", "Sequence", "SequenceStatus", "StaticBatchServer"]
