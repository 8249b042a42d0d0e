"""Run grading jobs here, on a local thread pool, or on a Dask cluster (`run_jobs`). Every job
gets one result, in order: `fn`'s dict or {"error": "<one line>"}. A job past `timeout` is
abandoned, not killed (`fn` limits its own subprocess; this is a backstop).

Dask (distributed 2026.8): a dead worker's task is re-run by the *scheduler* up to its
allowed-failures (default 3; DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES=0 where it starts),
and the tasks only *queued* on it fail too (KilledWorker). So each job announces its start
(a synchronous log_event), and one that failed unstarted is submitted again.
"""
from __future__ import annotations

import contextlib
import os
import queue
import socket
import threading
import time
import traceback
import uuid
from typing import Any, Callable

Job = Result = dict
__all__ = ["run_jobs"]


def _one_line(text: str, limit: int = 500) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _describe(exc: BaseException, at: bool = True) -> str:
    """`ValueError: boom (at jobs.py:42)`."""
    where = ""
    tb = traceback.extract_tb(exc.__traceback__) if at else None
    if tb:
        frame = tb[-1]
        where = f" (at {os.path.basename(frame.filename)}:{frame.lineno})"
    message = str(exc)
    return _one_line(f"{type(exc).__name__}{': ' + message if message else ''}{where}")


def _fn_name(fn: Callable) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


def _call(fn: Callable[[Job], Result], job: Job) -> tuple[Result, float]:
    """fn(job) and the seconds it took; an exception or a non-dict becomes {"error": ...}."""
    t0 = time.monotonic()
    try:
        out = fn(job)
        if not isinstance(out, dict):
            out = {"error": f"{_fn_name(fn)} returned {type(out).__name__}, not a dict"}
    except (Exception, SystemExit) as e:  # KeyboardInterrupt still stops a plain loop
        out = {"error": f"{_fn_name(fn)} raised {_describe(e)}"}
    return out, time.monotonic() - t0


def _label(job: Any, i: int) -> str:
    if isinstance(job, dict) and (job.get("student") is not None or job.get("lab") is not None):
        return f"{job.get('student', '?')}/{job.get('lab', '?')}"
    return f"job {i}"


class _Results:
    """One slot per job, filled once (a late second answer is dropped); logs each."""

    def __init__(self, jobs: list[Job], log: Callable[[str], Any],
                 on_result: Callable[[int, Result], Any] = lambda i, result: None):
        self.jobs, self.log, self.on_result = jobs, log, on_result
        self.slots: list[Result | None] = [None] * len(jobs)
        self.count = 0

    @property
    def complete(self) -> bool:
        return self.count == len(self.jobs)

    def is_set(self, i: int) -> bool:
        return self.slots[i] is not None

    def set(self, i: int, result: Result, where: str, seconds: float | None) -> None:
        if self.slots[i] is not None:
            return
        self.slots[i] = result
        self.count += 1
        head = f"[{self.count}/{len(self.jobs)}] {_label(self.jobs[i], i)}"
        secs = "?" if seconds is None else f"{seconds:.1f}"
        if "error" in result:
            self.log(f"{head} failed on worker {where} after {secs} s: "
                     f"{_one_line(result['error'], 200)}")
        else:
            self.log(f"{head} done on worker {where} in {secs} s")
        self.on_result(i, result)


def _drain(res: _Results, events: queue.SimpleQueue, timeout: float | None,
           on_done: Callable[[int, Any], None], on_expired: Callable[[int], None],
           on_settled: Callable[[], None] = lambda: None) -> None:
    """Consume ("start"|"done", i, payload) events until every slot is set, expiring jobs."""
    started: dict[int, tuple[float, str]] = {}
    while not res.complete:
        wait = None
        if timeout is not None:
            now = time.monotonic()
            expired = [i for i, (t, _) in started.items()
                       if now - t >= timeout and not res.is_set(i)]
            for i in expired:
                t, where = started.pop(i)
                res.set(i, {"error": f"timed out: still running after {timeout:g} s on worker "
                                     f"{where} (abandoned)"}, where, now - t)
                on_expired(i)
                on_settled()
            if expired:
                continue
            deadlines = [t + timeout for i, (t, _) in started.items() if not res.is_set(i)]
            if deadlines:
                wait = max(0.0, min(deadlines) - now)
        try:
            kind, i, payload = events.get(timeout=wait)
        except queue.Empty:
            continue
        if res.is_set(i):
            continue  # late answer of an abandoned job
        if kind == "start":
            started[i] = (time.monotonic(), payload)  # a re-run (worker died) restarts the clock
        else:
            started.pop(i, None)
            on_done(i, payload)
            on_settled()


def _run_threads(fn, jobs: list[Job], workers: int, timeout: float | None, res: _Results) -> None:
    # daemon threads, not a pool: a pool joins at exit and a hung `fn` would keep its slot
    events: queue.SimpleQueue = queue.SimpleQueue()
    active: set[int] = set()
    next_job = 0

    def target(i: int) -> None:
        events.put(("start", i, "local"))
        try:
            out, secs = _call(fn, jobs[i])
        except BaseException as e:  # whatever happens, the batch hears back from this job
            out, secs = {"error": f"{_fn_name(fn)} raised {_describe(e)}"}, None
        events.put(("done", i, (out, secs)))

    def start_more() -> None:
        nonlocal next_job
        for i in list(active):
            if res.is_set(i):
                active.discard(i)
        while len(active) < workers and next_job < len(jobs):
            threading.Thread(target=target, args=(next_job,), daemon=True,
                             name=f"run_jobs-{next_job}").start()
            active.add(next_job)
            next_job += 1

    start_more()
    _drain(res, events, timeout, lambda i, done: res.set(i, done[0], "local", done[1]),
           on_expired=lambda i: None, on_settled=start_more)


def _run_on_worker(fn, job: Job, topic: str, index: int, attempt: int) -> dict:
    """On a Dask worker: announce the start (timeout, re-queueing), then run fn."""
    from distributed import get_client, get_worker

    worker = get_worker()
    where = str(worker.name if worker.name is not None else worker.address)
    msg = {"index": index, "attempt": attempt, "worker": where}
    try:  # a round trip: worker.log_event is batched and would die unsent with the worker
        get_client().log_event(topic, msg)
    except Exception:
        with contextlib.suppress(Exception):  # else the job just looks never started
            worker.log_event(topic, msg)
    out, secs = _call(fn, job)
    return {"result": out, "worker": where, "seconds": secs}


_MAX_REQUEUES = 2        # resubmissions of a job whose worker died before it started


def _run_dask(fn, jobs: list[Job], scheduler: str, timeout: float | None, res: _Results,
              log) -> None:
    from concurrent.futures import CancelledError as StdCancelledError

    from distributed import Client, KilledWorker

    token = uuid.uuid4().hex[:12]
    topic = f"autograder-job-start-{token}"
    events: queue.SimpleQueue = queue.SimpleQueue()
    attempt = [0] * len(jobs)
    futures: list = [None] * len(jobs)
    started: dict[tuple[int, int], float] = {}  # (job, attempt) -> when it started

    def on_start(event) -> None:  # on the client's event-loop thread
        msg = event[1]
        i, a = int(msg["index"]), int(msg["attempt"])
        started[(i, a)] = time.monotonic()
        if a == attempt[i]:
            events.put(("start", i, str(msg["worker"])))

    with Client(scheduler, set_as_default=False) as client:
        with contextlib.suppress(Exception):
            allowed = client.run_on_scheduler(
                lambda dask_scheduler: dask_scheduler.allowed_failures)
            if allowed:
                log(f"note: the scheduler re-runs a job whose worker dies on up to {allowed} more "
                    f"worker(s) before failing it (distributed.scheduler.allowed-failures="
                    f"{allowed}, set where the scheduler starts)")
        if not client.scheduler_info().get("workers"):
            log(f"note: {scheduler} has no workers yet; jobs wait until one connects")
        client.subscribe_topic(topic, on_start)

        def submit(i: int) -> None:
            fut = client.submit(_run_on_worker, fn, jobs[i], topic, i, attempt[i],
                                key=f"grade-job-{i}-{attempt[i]}-{token}", pure=False, retries=0)
            futures[i] = fut
            fut.add_done_callback(lambda f, i=i: events.put(("done", i, f)))

        def on_done(i: int, fut) -> None:
            if fut is not futures[i]:
                return  # an earlier attempt
            try:
                payload = fut.result()
                res.set(i, payload["result"], payload["worker"], payload["seconds"])
            except KilledWorker as e:
                last = getattr(e, "last_worker", None)
                where = str(getattr(last, "name", None) or getattr(last, "address", "?"))
                if (i, attempt[i]) not in started and attempt[i] < _MAX_REQUEUES:
                    attempt[i] += 1
                    log(f"note: {_label(jobs[i], i)} was queued on worker {where} when it died; "
                        f"submitted again")
                    try:
                        submit(i)
                    except Exception as e2:
                        res.set(i, {"error": f"could not submit it again after its worker "
                                             f"died: {_describe(e2, at=False)}"}, where, None)
                else:
                    t0 = started.get((i, attempt[i]))
                    what = ("the worker died while running it" if t0 is not None else
                            f"its worker died before it started, {attempt[i] + 1} times")
                    tries = getattr(e, "allowed_failures", None)
                    tries = "" if tries is None else f"{tries + 1} worker(s) died running it, "
                    res.set(i, {"error": f"{what} (KilledWorker: {tries}the last "
                                         f"{getattr(last, 'address', '?')})"},
                            where, None if t0 is None else time.monotonic() - t0)
            except (StdCancelledError, Exception) as e:
                kind = "cancelled" if isinstance(e, StdCancelledError) else "failed"
                res.set(i, {"error": f"job {kind} on the cluster: {_describe(e, at=False)}"}, "?",
                        None)
            finally:
                fut.release()  # the executed notebook need not stay in the worker's memory

        def on_expired(i: int) -> None:
            with contextlib.suppress(Exception):
                client.cancel([futures[i]])

        for i in range(len(jobs)):
            submit(i)
        try:
            _drain(res, events, timeout, on_done, on_expired)
        finally:
            with contextlib.suppress(Exception):
                client.unsubscribe_topic(topic)


def run_jobs(fn: Callable[[Job], Result], jobs: list[Job], *, workers: int = 1,
             scheduler: str | None = None, log: Callable[[str], Any] = print,
             timeout: float | None = None,
             on_result: Callable[[int, Result], Any] = lambda i, result: None) -> list[Result]:
    """``fn(job)`` for every job, in order: on the Dask `scheduler`, else `workers` at a time.
    `on_result(i, result)` hears of each as it comes (in this thread: keep it quick)."""
    jobs = list(jobs)
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if timeout is not None and timeout <= 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
    res = _Results(jobs, log, on_result)
    if not jobs:
        return []
    if scheduler:
        _run_dask(fn, jobs, scheduler, timeout, res, log)
    elif workers == 1 and timeout is None:
        for i, job in enumerate(jobs):
            out, secs = _call(fn, job)
            res.set(i, out, "local", secs)
    else:
        _run_threads(fn, jobs, workers, timeout, res)
    assert res.complete
    return list(res.slots)  # type: ignore[arg-type]


def _echo_job(job: Job) -> Result:
    """Self-test executor (the tests, smoke-testing a cluster); "exit" is os._exit."""
    start = time.time()
    if job.get("pidfile"):
        tmp = f"{job['pidfile']}.tmp"
        with open(tmp, "w") as f:
            f.write(str(os.getpid()))
        os.replace(tmp, job["pidfile"])
    if job.get("raise") is not None:
        raise RuntimeError(str(job["raise"]))
    if job.get("exit") is not None:
        os._exit(int(job["exit"]))
    if job.get("sleep"):
        time.sleep(float(job["sleep"]))
    payload = str(job.get("payload", ""))
    return {"echo": {"payload": payload, "upper": payload.upper(), "reversed": payload[::-1],
                     "length": len(payload), "student": job.get("student"), "lab": job.get("lab")},
            "pid": os.getpid(), "host": socket.gethostname(), "start": start, "end": time.time()}
