"""`minillm serve --replicas N`: N copies of the model behind one OpenAI-compatible endpoint.

    minillm serve --model target --port 8000 --replicas 2 --threads 4   # 2 copies, 2 threads each

The lecture's easy parallelism. Each replica is an ordinary `minillm serve` child process on a
free loopback port (`--port 0`, its URL read from the line it prints when ready) with the front's
engine options (--tp too: then each copy is itself split) and `--threads` divided between every
process. The front (FastAPI + uvicorn, like
server.py) owns the user's --host/--port and never loads the model: it forwards each
/v1/completions and /v1/chat/completions body, untouched, to the replica with the fewest requests
in flight (ties: round-robin), and passes the answer back as it comes -- status, JSON body or
server-sent events. So a replica's 400 reaches the client as the same 400, and a client that
closes its stream closes the replica's, which aborts the request there.

GET /v1/models asks one replica; GET /health lists each replica (pid, URL, status) and is 200
only when every one answers ok, 503 otherwise; GET /metrics is each replica's Prometheus text
with a `replica="i"` label on every sample (not summed), plus the front's own per-replica
series: minillm_replica_requests_routed_total, minillm_replica_requests_in_flight and
minillm_replica_up.

A replica that exits is no longer routed to (one line on stderr says so); when none is left the
front stops and `serve_replicas` returns 1. SIGINT/SIGTERM stops the front, then every replica.
"""
# no `from __future__ import annotations`: FastAPI reads the handlers' annotations at run time
import asyncio
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading

from .openai_api import APIError
from .server import _bound_url, _need_web, _uvicorn_server

READY = re.compile(r"minillm serve: .* on (http://\S+)")


class Replica:
    """One child `minillm serve`: its process, URL, and the front's counts for it."""

    def __init__(self, index: int, argv: list[str]):
        self.index, self.url, self.alive = index, None, True
        self.in_flight = self.routed = 0
        # its own session: a terminal's Ctrl-C reaches the front only, which stops it by SIGTERM
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True,
                                     start_new_session=True)
        self._first_line: queue.Queue = queue.Queue()
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self):
        """Hand the first stdout line to `wait_ready`, echo the rest (stderr is the front's)."""
        for i, line in enumerate(self.proc.stdout):
            if i == 0:
                self._first_line.put(line)
            else:
                print(f"[replica {self.index}] {line}", end="", flush=True)
        self._first_line.put("")

    def wait_ready(self, timeout_s: float, stopping: threading.Event) -> None:
        """Until the replica prints its URL (or `stopping` is set); a RuntimeError if it
        exits or stays silent for `timeout_s`."""
        for _ in range(int(timeout_s * 10)):
            try:
                line = self._first_line.get(timeout=0.1)
                break
            except queue.Empty:
                if stopping.is_set():
                    return
        else:
            raise RuntimeError(f"replica {self.index} (pid {self.proc.pid}) printed no URL "
                               f"within {timeout_s:.0f} s")
        m = READY.search(line)
        if not m:
            raise RuntimeError(f"replica {self.index} (pid {self.proc.pid}) did not start: it "
                               f"exited with code {self.proc.wait()} (its error is above)")
        self.url = m.group(1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def replica_argv(model: str, threads: int, engine_args: list[str]) -> list[str]:
    return [sys.executable, "-m", "minillm", "serve", "--host", "127.0.0.1", "--port", "0",
            "--model", model, "--threads", str(threads), *engine_args]


def label_metrics(texts: list[str]) -> list[str]:
    """Merge replicas' Prometheus texts: each family's HELP/TYPE once, then its samples from
    every replica with `replica="i"` added to their labels."""
    families: dict[str, list[str]] = {}
    for i, text in enumerate(texts):
        family = None
        for line in text.splitlines():
            if line.startswith("# "):
                family = line.split()[2]
                head = families.setdefault(family, [])
                if i == 0:
                    head.append(line)
            elif line.strip():
                name, rest = re.match(r"([^\s{]+)(.*)", line).groups()
                rest = (rest.replace("{", f'{{replica="{i}",', 1) if rest.startswith("{")
                        else f'{{replica="{i}"}}' + rest)
                families.setdefault(family or name, []).append(name + rest)
    return [line for lines in families.values() for line in lines]


class Front:
    """The routing state: the replicas, least-in-flight choice with a round-robin tie-break."""

    def __init__(self, replicas: list[Replica]):
        self.replicas, self._next = replicas, 0
        self.server = None              # the front's uvicorn server while it runs
        self.stopping = threading.Event()       # set by SIGINT/SIGTERM

    def pick(self) -> Replica:
        alive = [r for r in self.replicas if r.alive]
        if not alive:
            raise APIError(503, "every replica has exited", type_="server_error")
        n = len(self.replicas)
        r = min(alive, key=lambda r: (r.in_flight, (r.index - self._next) % n))
        self._next = r.index + 1
        return r

    def check(self) -> int:
        """Mark replicas whose process has exited, one stderr line each; how many are alive."""
        for r in self.replicas:
            if r.alive and r.proc.poll() is not None:
                r.alive = False
                left = sum(x.alive for x in self.replicas)
                print(f"minillm serve: replica {r.index} (pid {r.proc.pid}, {r.url}) exited "
                      f"with code {r.proc.returncode}; routing to the {left} left",
                      file=sys.stderr, flush=True)
        return sum(r.alive for r in self.replicas)


def build_front_app(front: Front, client):
    """The front's FastAPI app; `client` is the httpx.AsyncClient it forwards with."""
    _need_web()
    import httpx
    from fastapi import FastAPI
    from fastapi import Request as HTTPRequest
    from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

    app = FastAPI(title="minillm replicas", description="N minillm servers behind one endpoint")

    @app.exception_handler(APIError)
    async def _api_error(_request, e: APIError):
        return JSONResponse(e.body(), status_code=e.status)

    async def _send(path: str, body: bytes):
        """(replica, streamed response) from the chosen replica, counted in flight there. If
        it fails before its status line because its process exited, the next one is tried (so
        a plain request a killed replica was working on is answered by another)."""
        for _ in front.replicas:
            r = front.pick()
            r.in_flight += 1
            r.routed += 1
            req = client.build_request("POST", r.url + path, content=body,
                                       headers={"content-type": "application/json"})
            try:
                resp = await client.send(req, stream=True)
            except BaseException as e:      # cancelled (see _forward), or a transport error
                r.in_flight -= 1
                if not isinstance(e, httpx.TransportError):
                    raise
                for _ in range(100):        # a dying process closes its sockets, then exits
                    front.check()
                    if not r.alive:
                        break
                    await asyncio.sleep(0.05)
                if r.alive:
                    raise APIError(502, f"replica {r.index} failed: {e!r}",
                                   type_="server_error") from e
                continue
            return r, resp
        raise APIError(503, "no replica accepted the request", type_="server_error")

    async def _forward(path: str, http: HTTPRequest):
        """The replica's answer as it comes: its status, then its JSON or its events. If our
        client goes, the replica's connection is closed and the replica aborts the request:
        here while we wait for its status line (a plain request's comes with its whole
        answer), and in `_relay`, which Starlette cancels, once it streams."""
        sending = asyncio.ensure_future(_send(path, await http.body()))
        while not sending.done():
            await asyncio.wait({sending}, timeout=0.25)
            if not sending.done() and await http.is_disconnected():
                if not sending.cancel() and sending.exception() is None:   # answered meanwhile
                    r, resp = sending.result()
                    await resp.aclose()
                    r.in_flight -= 1
                return Response(status_code=499)
        r, resp = sending.result()
        media = resp.headers.get("content-type", "application/json")
        return StreamingResponse(_relay(r, resp, media.startswith("text/event-stream")),
                                 status_code=resp.status_code, media_type=media,
                                 headers={"Cache-Control": "no-cache"})

    async def _relay(r: Replica, resp, events: bool):
        try:
            async for chunk in resp.aiter_raw():
                yield chunk
        except httpx.HTTPError as e:
            if not events:
                raise
            err = APIError(502, f"replica {r.index} failed while streaming: {e!r}",
                           type_="server_error")      # the status is sent: say it in-band
            yield f"data: {json.dumps(err.body())}\n\ndata: [DONE]\n\n".encode()
        finally:
            await resp.aclose()
            r.in_flight -= 1

    @app.post("/v1/completions")
    async def completions(http: HTTPRequest):
        return await _forward("/v1/completions", http)

    @app.post("/v1/chat/completions")
    async def chat_completions(http: HTTPRequest):
        return await _forward("/v1/chat/completions", http)

    async def _get(r: Replica, path: str):
        try:
            resp = await client.get(r.url + path, timeout=10)
            return resp if resp.status_code == 200 else None
        except httpx.HTTPError:
            return None

    @app.get("/v1/models")
    async def models():
        for r in front.replicas:
            if r.alive and (resp := await _get(r, "/v1/models")) is not None:
                return Response(resp.content, media_type="application/json")
        raise APIError(503, "no replica answered /v1/models", type_="server_error")

    @app.get("/health")
    async def health():
        answers = await asyncio.gather(*(_get(r, "/health") for r in front.replicas))
        states = [{"replica": r.index, "pid": r.proc.pid, "url": r.url,
                   "status": "ok" if a is not None else "exited" if not r.alive else "error"}
                  for r, a in zip(front.replicas, answers)]
        ok = all(s["status"] == "ok" for s in states)
        return JSONResponse({"status": "ok" if ok else "error", "replicas": states},
                            status_code=200 if ok else 503)

    @app.get("/metrics")
    async def metrics():
        answers = await asyncio.gather(*(_get(r, "/metrics") for r in front.replicas))
        lines = label_metrics([a.text if a is not None else "" for a in answers])
        for name, kind, help_text, attr in (
                ("requests_routed_total", "counter", "requests sent to the replica", "routed"),
                ("requests_in_flight", "gauge", "requests the replica is answering",
                 "in_flight"),
                ("up", "gauge", "1 while the replica's process runs", "alive")):
            lines += [f"# HELP minillm_replica_{name} {help_text}",
                      f"# TYPE minillm_replica_{name} {kind}"]
            lines += [f'minillm_replica_{name}{{replica="{r.index}"}} {int(getattr(r, attr))}'
                      for r in front.replicas]
        return PlainTextResponse("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4")

    return app


def serve_replicas(model: str, replicas: int, *, threads: int | None = None,
                   engine_args: list[str] = (), ranks_each: int = 1, host: str = "127.0.0.1",
                   port: int = 8000, on_ready=print, start_timeout_s: float = 300) -> int:
    """Start `replicas` copies of `minillm serve --model model ...engine_args` (each of
    `ranks_each` processes when engine_args has --tp) with `threads` in all (default
    os.cpu_count()) divided between every process, and serve the front until SIGINT/SIGTERM (0)
    or until every replica has exited (1). Stops every replica on return."""
    if replicas < 1:
        raise ValueError(f"--replicas must be >= 1, got {replicas}")
    _need_web()
    import httpx
    each = max(1, (threads or os.cpu_count() or 1) // (replicas * ranks_each))
    started: list[Replica] = []
    front = Front(started)

    def on_signal(_signum, _frame):
        """SIGINT/SIGTERM: start no more replicas, or stop the front once it runs (uvicorn's own
        handler does that while it serves, then raises the signal again here)."""
        front.stopping.set()
        if front.server is not None:
            front.server.should_exit = True

    main = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.signal(sig, on_signal)
                for sig in (signal.SIGINT, signal.SIGTERM)} if main else {}
    try:
        for i in range(replicas):
            if not front.stopping.is_set():
                started.append(Replica(i, replica_argv(model, each, list(engine_args))))
        try:
            for r in started:
                r.wait_ready(start_timeout_s, front.stopping)
        except RuntimeError as e:
            print(f"minillm serve: error: {e}", file=sys.stderr, flush=True)
            return 1
        if front.stopping.is_set():
            return 0
        return asyncio.run(_run_front(front, host, port, on_ready, each, model, httpx))
    finally:
        for r in started:
            r.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


async def _run_front(front: Front, host, port, on_ready, each, model, httpx) -> int:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=httpx.Timeout(None, connect=5), limits=limits) as client:
        server = front.server = _uvicorn_server(build_front_app(front, client), host, port)
        if front.stopping.is_set():     # a signal came before on_signal could see the server
            return 0
        task = asyncio.create_task(server.serve())
        while not server.started and not task.done():
            await asyncio.sleep(0.02)
        if server.started:
            on_ready(f"minillm serve: {model} on {_bound_url(server, host)} (OpenAI API under "
                     f"/v1; {len(front.replicas)} replicas, {each} thread(s) per process)")
        rc = 0
        while not task.done():
            await asyncio.wait({task}, timeout=0.2)
            if front.check() == 0 and not server.should_exit:
                print(f"minillm serve: error: every replica has exited (codes "
                      f"{[r.proc.returncode for r in front.replicas]}); stopping the front",
                      file=sys.stderr, flush=True)
                server.should_exit, rc = True, 1
        await task
        return rc
