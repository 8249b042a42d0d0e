"""The engine behind a server: one thread steps `LLMEngine`, asyncio handlers talk to it.

An HTTP server answers many clients at once on one asyncio event loop, but a model step is a
long blocking computation. So the engine gets a thread of its own:

    handler (event loop)                      engine thread
    stream = loop.submit(prompt, params, n) -> add_request, then step, step, step ...
    async for update in stream:             <- after each step: the new tokens of each sample
        send it to the client                  (loop.call_soon_threadsafe)
    client gone: stream.abort()             -> abort(request): its KV blocks are free at once

Only the engine thread touches the engine; the handlers send it commands through a queue. A
request is admitted at the next step boundary after it arrives and leaves the batch the step it
finishes (continuous batching, lab 06), so requests that arrive while others run join them.
Finished requests are forgotten once answered and only the last KEEP_STEPS step records are
kept, so a server's memory does not grow with the requests it has served. The thread also keeps
the server's metrics: requests running and waiting, KV blocks used, and
TTFT / TPOT histograms of finished requests (`prometheus_text`).
"""
from __future__ import annotations

import asyncio
import queue
import threading
from dataclasses import dataclass

from ..sampling import SamplingParams
from .engine import LLMEngine
from .metrics import Histogram, latencies

TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
KEEP_STEPS = 4096          # step records kept (engine.steps): a server runs for days


@dataclass
class Update:
    """New output of one sample (index) of a request after one step."""
    index: int
    token_ids: list[int]
    finish_reason: str | None = None        # "stop", "length" or "abort" once it is done


class RequestStream:
    """What a handler gets back from `submit`: an async iterator of lists of `Update`s, ended
    when every sample has finished. `abort()` may be called from any thread, any time."""

    def __init__(self, engine_loop: "EngineLoop", n: int, loop: asyncio.AbstractEventLoop):
        self._engine_loop, self.n, self._loop = engine_loop, n, loop
        self._queue: asyncio.Queue = asyncio.Queue()
        self.prompt_tokens = 0
        self.finished = False
        self.error: Exception | None = None

    def _put(self, item) -> None:              # engine thread -> event loop
        self._loop.call_soon_threadsafe(self._queue.put_nowait, item)

    def abort(self, index: int | None = None) -> None:
        """Stop the request (or only its sample `index`) and free its KV blocks."""
        if not self.finished:
            self._engine_loop._commands.put(("abort", self, index))

    def __aiter__(self):
        return self

    async def __anext__(self) -> list[Update]:
        if self.finished:
            raise StopAsyncIteration
        item = await self._queue.get()
        if isinstance(item, Exception):
            self.finished = True
            raise item
        if item is None:
            self.finished = True
            raise StopAsyncIteration
        return item


class EngineLoop:
    """Runs `engine` in a daemon thread; `submit` from the event loop, `stop` when done."""

    def __init__(self, engine: LLMEngine):
        self.engine = engine
        self._commands: queue.Queue = queue.Queue()
        self._live: dict[int, tuple[RequestStream, list[int]]] = {}   # rid -> (stream, sent)
        self._stop = threading.Event()
        self.ttft = Histogram(TTFT_BUCKETS)
        self.tpot = Histogram(TPOT_BUCKETS)
        self.counters = {"requests_finished": 0, "requests_aborted": 0, "prompt_tokens": 0,
                         "generation_tokens": 0}
        self.error: BaseException | None = None
        # the limit requests are checked against: set at once by set_max_num_seqs, while the
        # scheduler takes it between steps
        self.max_num_seqs = engine.scheduler.max_num_seqs
        self._thread = threading.Thread(target=self._run, name="minillm-engine", daemon=True)
        self._thread.start()

    # ---- the event loop's side ------------------------------------------------------------
    def submit(self, prompt: list[int], params: SamplingParams, n: int = 1) -> RequestStream:
        """Queue a request (checked already: see openai_api.py); call from the event loop."""
        stream = RequestStream(self, n, asyncio.get_running_loop())
        stream.prompt_tokens = len(prompt)
        self._commands.put(("add", stream, (list(prompt), params, n, self.engine.clock())))
        return stream

    def set_max_num_seqs(self, value: int) -> None:
        """Change the batch limit between steps (the lab 06 explorer's slider). The KV blocks
        stay as they were made: above the starting limit, sequences may be preempted."""
        if int(value) != value or value < 1:
            raise ValueError(f"max_num_seqs must be an integer >= 1, got {value}")
        s = self.engine.scheduler
        if s.chunked_prefill and value > s.max_num_batched_tokens:
            raise ValueError(f"max_num_seqs {value} > the step's token budget "
                             f"{s.max_num_batched_tokens}: with chunked prefill every running "
                             f"sequence needs a token of it")
        self.max_num_seqs = int(value)
        self._commands.put(("max_num_seqs", None, int(value)))

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.error is None

    def stats(self) -> dict:
        """A snapshot for /metrics (plain reads of ints: safe from any thread)."""
        s, bm = self.engine.scheduler, self.engine.bm
        return {"running": len(s.running), "waiting": len(s.waiting),
                "kv_blocks_used": bm.num_used_blocks, "kv_blocks_total": bm.num_blocks,
                "max_num_seqs": s.max_num_seqs, "preemptions": s.num_preemptions,
                "steps": len(self.engine.steps), **self.counters}

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._commands.put(("stop", None, None))
        self._thread.join(timeout)

    # ---- the engine thread ----------------------------------------------------------------
    def _handle(self, kind, stream, arg) -> None:
        eng = self.engine
        if kind == "add":
            prompt, params, n, arrival = arg
            try:
                rid = eng.add_request(prompt, params, n=n, arrival_time=arrival)
            except (ValueError, KeyError) as e:          # checked before, but never hang
                stream._put(e)
                return
            self._live[rid] = (stream, [0] * n)
            self.counters["prompt_tokens"] += len(prompt)
        elif kind == "abort":
            for rid, (st, _sent) in list(self._live.items()):
                if st is stream:
                    if arg is None:
                        eng.abort(rid)
                    else:
                        self._abort_sample(rid, arg)
                    self._publish(rid)
        elif kind == "max_num_seqs":
            eng.scheduler.max_num_seqs = arg

    def _abort_sample(self, rid: int, index: int) -> None:
        """Stop one sample of a request (a stop string ended it)."""
        s = self.engine.sequences[rid][index]      # it has output, so it is forked already
        if not s.is_finished:
            self.engine.scheduler.abort(s)
            s.finish_reason, s.finish_time = "stop", self.engine.clock()

    def _publish(self, rid: int) -> None:
        """Send each sample's tokens not sent yet; end the stream once all are finished."""
        stream, sent = self._live[rid]
        seqs = self.engine.sequences[rid]
        updates = []
        for i, s in enumerate(seqs):
            if sent[i] < 0:
                continue
            new = s.output_ids[sent[i]:]
            done = s.is_finished
            if new or done:
                updates.append(Update(i, new, s.finish_reason if done else None))
                self.counters["generation_tokens"] += len(new)
                sent[i] += len(new)
            if done:
                sent[i] = -1
                self._record(s)
        if updates:
            stream._put(updates)
        if all(x < 0 for x in sent):
            aborted = all(s.finish_reason == "abort" for s in seqs)
            self.counters["requests_aborted" if aborted else "requests_finished"] += 1
            del self._live[rid]
            self.engine.release(rid)              # forgotten before the answer is complete, so
            stream._put(None)                     # a client that has its answer sees it gone

    def _record(self, s) -> None:
        """TTFT and TPOT of a finished sample into the histograms."""
        if s.finish_reason == "abort" or s.first_token_time is None:
            return
        lat = latencies(s)
        self.ttft.observe(lat["ttft"])
        if lat["output_tokens"] > 1:
            self.tpot.observe(lat["tpot"])

    def _run(self) -> None:
        eng = self.engine
        try:
            while not self._stop.is_set():
                if not eng.has_unfinished():
                    self._handle(*self._commands.get())       # idle: sleep until a command
                while True:
                    try:
                        self._handle(*self._commands.get_nowait())
                    except queue.Empty:
                        break
                if eng.has_unfinished():
                    eng.step()
                    for rid in list(self._live):
                        self._publish(rid)
                    if len(eng.steps) > 2 * KEEP_STEPS:
                        del eng.steps[:-KEEP_STEPS]
        except BaseException as e:                # a broken step: fail every open request
            self.error = e
            for stream, _sent in self._live.values():
                stream._put(RuntimeError(f"the engine stopped: {e!r}"))
            raise

