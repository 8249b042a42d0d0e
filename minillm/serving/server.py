"""`minillm serve`: the engine behind an OpenAI-compatible HTTP server (FastAPI + uvicorn).

    minillm serve --model target --port 8000 [--max-num-seqs 16 --kv-blocks N
                  --max-batched-tokens T (chunked prefill) --backend torch|triton]

    from openai import OpenAI
    client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="none")
    print(client.completions.create(model="target", prompt="ROMEO.", max_tokens=32).choices[0].text)

There is no authentication (the API key a client sends is ignored): the server binds 127.0.0.1
unless told otherwise; give it `--host 0.0.0.0` only on a network you trust.

Routes: POST /v1/completions, POST /v1/chat/completions (stream: true answers with server-sent
events, `data: {chunk}` lines and a final `data: [DONE]`), GET /v1/models, GET /health and
GET /metrics (Prometheus text). Requests are checked in openai_api.py, run by the engine thread
of async_engine.py, and streamed back as their tokens appear; a client that goes away (closes a
stream, or drops a plain request) has its request aborted and its KV blocks freed at once.

`BackgroundServer` runs the same app in a thread of the current process (a notebook's): it
gives the URL and the engine loop, whose batch limit the lab 06 explorer moves. Its threads
outlive the cell that starts it, so a lab starts it in a cell of the student's, not in a locked
cell (the grader runs locked setup cells in its tester too: autograder/tester.py).
"""
# no `from __future__ import annotations`: FastAPI reads the handlers' annotations at run time
import asyncio
import json
import threading
import time

from .async_engine import EngineLoop
from .engine import LLMEngine
from .model_runner import ModelRunner
from .openai_api import APIError, Detokenizer, Request, choice, envelope, new_id, parse_json, usage


def _need_web():
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise RuntimeError("the HTTP server needs fastapi and uvicorn: pip install "
                           "'minillm[serve]' (make lab / make test install them)") from e


class _Choice:
    """One sample of one prompt as the client sees it: its text so far and how it ended."""

    def __init__(self, index: int, tokenizer, stops):
        self.index, self.detok = index, Detokenizer(tokenizer, stops)
        self.tokens, self.finish_reason, self.first = 0, None, True


async def _run(req: Request, engine_loop: EngineLoop, tokenizer, is_disconnected):
    """Submit every prompt of `req` and yield (choice, new final text) as tokens arrive; the
    choice's finish_reason is set on its last yield. Aborts everything if the caller stops."""
    streams = [engine_loop.submit(p, req.params, req.n) for p in req.prompts]
    choices = [[_Choice(g * req.n + i, tokenizer, req.stops) for i in range(req.n)]
               for g in range(len(streams))]
    merged: asyncio.Queue = asyncio.Queue()

    async def pump(g, stream):
        try:
            async for updates in stream:
                await merged.put((g, updates))
        except Exception as e:          # noqa: BLE001 - handed to the caller below
            await merged.put((g, e))
        await merged.put((g, None))

    tasks = [asyncio.create_task(pump(g, s)) for g, s in enumerate(streams)]
    open_groups, checked = len(streams), time.monotonic()
    try:
        while open_groups:
            if time.monotonic() - checked > 0.25:      # has the client gone away?
                if await is_disconnected():
                    return
                checked = time.monotonic()
            try:
                g, item = await asyncio.wait_for(merged.get(), timeout=0.25)
            except asyncio.TimeoutError:
                continue
            if item is None:
                open_groups -= 1
                continue
            if isinstance(item, Exception):
                raise item
            for u in item:
                c = choices[g][u.index]
                if c.finish_reason is not None:
                    continue                  # ended by a stop string: ignore the rest
                c.tokens += len(u.token_ids)
                text = c.detok.add(u.token_ids)
                if c.detok.stopped:
                    c.finish_reason = "stop"
                    streams[g].abort(u.index)
                elif u.finish_reason is not None:
                    text += c.detok.finish()
                    c.finish_reason = "length" if u.finish_reason == "length" else "stop"
                if text or c.finish_reason is not None:
                    yield c, text
    finally:
        for s in streams:
            s.abort()                         # no-op for finished requests
        for t in tasks:
            t.cancel()


def build_app(engine_loop: EngineLoop, tokenizer, model_name: str):
    """The FastAPI application over a running `EngineLoop`."""
    _need_web()
    from fastapi import FastAPI
    from fastapi import Request as HTTPRequest
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
    from starlette.exceptions import HTTPException

    app = FastAPI(title="minillm", description="OpenAI-compatible server over LLMEngine")
    engine = engine_loop.engine
    ctx = engine.max_seq_len
    created = int(time.time())

    @app.exception_handler(APIError)
    async def _api_error(_request, e: APIError):
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(HTTPException)
    async def _http_error(_request, e: HTTPException):
        return JSONResponse(APIError(e.status_code, str(e.detail), code=str(e.status_code)
                                     ).body(), status_code=e.status_code)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_request, e: RequestValidationError):
        return JSONResponse(APIError(400, str(e.errors())).body(), status_code=400)

    @app.get("/health")
    async def health():
        if not engine_loop.alive:
            return JSONResponse({"status": "error", "error": repr(engine_loop.error)},
                                status_code=503)
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model",
                                            "created": created, "owned_by": "minillm",
                                            "max_model_len": ctx}]}

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(prometheus_text(engine_loop),
                                 media_type="text/plain; version=0.0.4")

    async def _answer(kind: str, http: HTTPRequest):
        if not engine_loop.alive:
            raise APIError(503, "the engine has stopped", type_="server_error")
        req = Request(kind, parse_json(await http.body()), model_name, tokenizer, ctx,
                      engine_loop.max_num_seqs)
        bm = engine.bm
        need = max(bm.blocks_needed(len(p) + req.params.max_new_tokens) for p in req.prompts)
        if need > bm.num_blocks:
            raise APIError(400, f"this request needs {need} KV blocks but the server has "
                           f"{bm.num_blocks} (--kv-blocks): lower max_tokens or the prompt",
                           "max_tokens", code="context_length_exceeded")
        rid = new_id(kind)
        prompt_tokens = sum(len(p) for p in req.prompts)
        if req.stream:
            return StreamingResponse(_sse(kind, req, rid, http, prompt_tokens),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        texts: dict[int, list[str]] = {}
        ends: dict[int, str] = {}
        tokens = 0
        try:
            async for c, text in _run(req, engine_loop, tokenizer, http.is_disconnected):
                texts.setdefault(c.index, []).append(text)
                if c.finish_reason is not None:
                    ends[c.index] = c.finish_reason
                    tokens += c.tokens
        except ValueError as e:               # the engine refused the request itself (its
            raise APIError(400, str(e)) from e    # limit changed since the check above)
        except RuntimeError as e:
            raise APIError(500, str(e), type_="server_error") from e
        if len(ends) < len(req.prompts) * req.n:
            return JSONResponse(APIError(499, "the client closed the request").body(),
                                status_code=499)
        choices = [choice(kind, i, "".join(texts.get(i, [])), ends[i]) for i in sorted(ends)]
        return envelope(kind, rid, model_name, choices, chunk=False,
                        usage_=usage(prompt_tokens, tokens))

    async def _sse(kind, req, rid, http, prompt_tokens):
        tokens = 0
        try:
            async for c, text in _run(req, engine_loop, tokenizer, http.is_disconnected):
                if c.finish_reason is not None:
                    tokens += c.tokens
                ch = choice(kind, c.index, text, c.finish_reason, delta=True, first=c.first)
                c.first = False
                yield "data: " + json.dumps(envelope(kind, rid, model_name, [ch],
                                                     chunk=True)) + "\n\n"
        except (ValueError, RuntimeError) as e:     # the status line is sent: say it in-band
            err = (APIError(400, str(e)) if isinstance(e, ValueError)
                   else APIError(500, str(e), type_="server_error")).body()
            yield "data: " + json.dumps(err) + "\n\n"
        if req.include_usage:
            yield "data: " + json.dumps(envelope(kind, rid, model_name, [], chunk=True,
                                                 usage_=usage(prompt_tokens, tokens))) + "\n\n"
        yield "data: [DONE]\n\n"

    @app.post("/v1/completions")
    async def completions(http: HTTPRequest):
        return await _answer("completion", http)

    @app.post("/v1/chat/completions")
    async def chat_completions(http: HTTPRequest):
        return await _answer("chat", http)

    return app


def prometheus_text(engine_loop: EngineLoop) -> str:
    s = engine_loop.stats()
    lines = []

    def metric(name, kind, help_text, value):
        lines.extend([f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{name} {value}"])

    metric("minillm_requests_running", "gauge", "sequences in the running batch", s["running"])
    metric("minillm_requests_waiting", "gauge", "sequences queued for admission", s["waiting"])
    metric("minillm_kv_blocks_used", "gauge", "KV cache blocks in use", s["kv_blocks_used"])
    metric("minillm_kv_blocks_total", "gauge", "KV cache blocks in all", s["kv_blocks_total"])
    metric("minillm_max_num_seqs", "gauge", "the batch limit", s["max_num_seqs"])
    metric("minillm_engine_steps_total", "counter", "engine steps run", s["steps"])
    metric("minillm_preemptions_total", "counter", "sequences preempted", s["preemptions"])
    for key in ("requests_finished", "requests_aborted", "prompt_tokens", "generation_tokens"):
        metric(f"minillm_{key}_total", "counter", key.replace("_", " "), s[key])
    lines += engine_loop.ttft.prometheus("minillm_time_to_first_token_seconds",
                                         "time from arrival to the first token")
    lines += engine_loop.tpot.prometheus("minillm_time_per_output_token_seconds",
                                         "mean time between a request's output tokens")
    return "\n".join(lines) + "\n"


def make_engine_loop(model, *, max_num_seqs: int = 16, kv_blocks: int | None = None,
                     block_size: int = 16, max_batched_tokens: int | None = None,
                     backend: str = "auto", runner=ModelRunner) -> EngineLoop:
    """An engine thread over `model`; max_batched_tokens turns on chunked prefill; `runner` is
    the engine's model runner class (minillm.parallel's for a tensor-parallel model)."""
    engine = LLMEngine(model, num_blocks=kv_blocks, block_size=block_size,
                       max_num_seqs=max_num_seqs, max_num_batched_tokens=max_batched_tokens,
                       chunked_prefill=max_batched_tokens is not None, backend=backend,
                       runner=runner)
    return EngineLoop(engine)


def _uvicorn_server(app, host: str, port: int):
    import uvicorn
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off",
                            timeout_graceful_shutdown=2)
    return uvicorn.Server(config)


def _bound_url(server, host: str) -> str:
    port = server.servers[0].sockets[0].getsockname()[1]
    return f"http://{host}:{port}"


def serve(model, tokenizer, model_name: str, *, host: str = "127.0.0.1", port: int = 8000,
          on_ready=print, **engine_kw) -> None:
    """Serve until SIGINT/SIGTERM; `on_ready(message)` gets the URL once the port is bound
    (port 0 picks a free one). If the engine stops (a broken step; with tensor parallelism, a
    rank that died or hung), the server shuts down and the engine's error is raised."""
    _need_web()
    engine_loop = make_engine_loop(model, **engine_kw)
    server = _uvicorn_server(build_app(engine_loop, tokenizer, model_name), host, port)

    def failure():          # the engine's error, or the runner's (a tensor-parallel rank lost)
        return engine_loop.error or getattr(engine_loop.engine.runner, "error", None)

    async def main():
        task = asyncio.create_task(server.serve())
        while not server.started and not task.done():
            await asyncio.sleep(0.02)
        if server.started:
            on_ready(f"minillm serve: {model_name} on {_bound_url(server, host)} "
                     f"(OpenAI API under /v1)")
        while not task.done():
            if failure() is not None:
                server.should_exit = True
            await asyncio.wait({task}, timeout=0.2)
        await task

    try:
        asyncio.run(main())
    finally:
        engine_loop.stop()
        close = getattr(engine_loop.engine.runner, "close", None)
        if close is not None:                 # a tensor-parallel runner: stop its workers
            close()
    if failure() is not None:
        raise failure()


class BackgroundServer:
    """The server in a thread of this process (a notebook's): `.url`, `.engine_loop`, `.stop()`.

        with BackgroundServer(model, tok, "target", max_num_seqs=8) as srv:
            OpenAI(base_url=srv.url + "/v1", api_key="none") ...
    """

    def __init__(self, model, tokenizer, model_name: str, *, host: str = "127.0.0.1",
                 port: int = 0, **engine_kw):
        _need_web()
        self.engine_loop = make_engine_loop(model, **engine_kw)
        self.model_name = model_name
        self._server = _uvicorn_server(build_app(self.engine_loop, tokenizer, model_name),
                                       host, port)
        self._thread = threading.Thread(target=self._server.run, name="minillm-http",
                                        daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.engine_loop.stop()
                raise RuntimeError(f"the HTTP server did not start on {host}:{port}")
            time.sleep(0.02)
        self.url = _bound_url(self._server, host)

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(10)
        self.engine_loop.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
