"""Run grading jobs here, on a local thread pool, or on a Dask cluster (`run_jobs`). Every job
gets one result, in order: `fn`'s dict or {"error": "<one line>"}. `fn` limits its own
subprocess (execute_job's wall clock), so nothing here times a job out.

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

__all__ = ["run_jobs"]


def _one_line(text: str, limit: int = 500) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _describe(exc: BaseException, at: bool = True) -> str:
    """`ValueError: boom (at jobs.py:42)`."""
    tb = traceback.extract_tb(exc.__traceback__) if at else None
    where = f" (at {os.path.basename(tb[-1].filename)}:{tb[-1].lineno})" if tb else ""
    message = str(exc)
    return _one_line(f"{type(exc).__name__}{': ' + message if message else ''}{where}")


def _call(fn: Callable[[dict], dict], job: dict) -> tuple[dict, float]:
    """fn(job) and the seconds it took; an exception or a non-dict becomes {"error": ...}."""
    t0, name = time.monotonic(), getattr(fn, "__qualname__", repr(fn))
    try:
        out = fn(job)
        if not isinstance(out, dict):
            out = {"error": f"{name} returned {type(out).__name__}, not a dict"}
    except (Exception, SystemExit) as e:  # KeyboardInterrupt still stops a plain loop
        out = {"error": f"{name} raised {_describe(e)}"}
    return out, time.monotonic() - t0


def _label(job: Any, i: int) -> str:
    if isinstance(job, dict) and (job.get("student") is not None or job.get("lab") is not None):
        return f"{job.get('student', '?')}/{job.get('lab', '?')}"
    return f"job {i}"


class _Results:
    """One slot per job, filled once (a late second answer is dropped); logs each."""

    def __init__(self, jobs: list[dict], log, on_result):
        self.jobs, self.log, self.on_result = jobs, log, on_result
        self.slots: list[dict | None] = [None] * len(jobs)
        self.count = 0

    def set(self, i: int, result: dict, where: str, seconds: float | None) -> None:
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


def _run_on_worker(fn, job: dict, topic: str, index: int, attempt: int) -> dict:
    """On a Dask worker: announce the start (re-queueing), then run fn."""
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


def _run_dask(fn, jobs: list[dict], scheduler: str, res: _Results, log) -> None:
    from concurrent.futures import CancelledError as StdCancelledError

    from distributed import Client, KilledWorker

    token = uuid.uuid4().hex[:12]
    topic = f"autograder-job-start-{token}"
    done: queue.SimpleQueue = queue.SimpleQueue()
    attempt = [0] * len(jobs)
    futures: list = [None] * len(jobs)
    started: dict[tuple[int, int], float] = {}  # (job, attempt) -> when it started

    def on_start(event) -> None:  # on the client's event-loop thread
        started[(int(event[1]["index"]), int(event[1]["attempt"]))] = time.monotonic()

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
            fut.add_done_callback(lambda f, i=i: done.put((i, f)))

        def on_done(i: int, fut) -> None:
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

        for i in range(len(jobs)):
            submit(i)
        try:
            while res.count < len(jobs):
                i, fut = done.get()
                if fut is futures[i]:           # else an earlier attempt
                    on_done(i, fut)
        finally:
            with contextlib.suppress(Exception):
                client.unsubscribe_topic(topic)


def run_jobs(fn: Callable[[dict], dict], jobs: list[dict], *, workers: int = 1,
             scheduler: str | None = None, log: Callable[[str], Any] = print,
             on_result: Callable[[int, dict], Any] = lambda i, result: None) -> list[dict]:
    """``fn(job)`` for every job, in order: on the Dask `scheduler`, else `workers` at a time.
    `on_result(i, result)` hears of each as it comes (in this thread: keep it quick)."""
    jobs = list(jobs)
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    res = _Results(jobs, log, on_result)
    if scheduler and jobs:
        _run_dask(fn, jobs, scheduler, res, log)
    elif workers == 1:                  # a plain loop: Ctrl-C reaches the running job
        for i, job in enumerate(jobs):
            out, secs = _call(fn, job)
            res.set(i, out, "local", secs)
    else:       # daemon threads, not a pool: a pool joins at exit, Ctrl-C would wait for every job
        done: queue.SimpleQueue = queue.SimpleQueue()

        def start(i: int) -> None:
            threading.Thread(target=lambda: done.put((i, *_call(fn, jobs[i]))), daemon=True,
                             name=f"run_jobs-{i}").start()
        for i in range(min(workers, len(jobs))):
            start(i)
        for n in range(len(jobs)):
            i, out, secs = done.get()
            res.set(i, out, "local", secs)
            if n + workers < len(jobs):
                start(n + workers)
    return list(res.slots)  # type: ignore[arg-type]


def _echo_job(job: dict) -> dict:
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
