"""Fan grading jobs out: in this process, on a local thread pool, or on a Dask cluster.

Batch grading is split in two. The *coordinator* (trusted; the only thing that reads or writes
the nbgrader gradebook) builds one *job* per submission: a JSON-serialisable dict holding the
student's notebook, the lab's *released* asset files ({relative path: base64}) and the limits.
An *executor* `fn(job) -> dict` (`autograder.jobs.execute_job`) executes the notebook in a
sandboxed subprocess and returns the executed notebook and a report. `run_jobs` only decides
where each `fn(job)` call runs and brings the results back, in the order of `jobs`:

* ``run_jobs(fn, jobs)``: one after the other, in this process;
* ``run_jobs(fn, jobs, workers=N)``: at most N at a time on threads of this process (each `fn`
  call spawns its own subprocess, so threads are enough);
* ``run_jobs(fn, jobs, scheduler="tcp://HOST:PORT")``: on the workers of an existing Dask
  distributed cluster, as many at a time as the workers have threads.

What a worker receives is the pickled `fn` and one job, nothing else: never the gradebook, the
course directory or the instructor's source notebooks (solutions and hidden tests stay with the
coordinator; the job carries only what the coordinator put in it). `fn` is pickled by reference
when it is a module-level function, so its module (the `autograder` package, with its own
dependencies) must be importable on every worker: install this package in the workers'
environment. What comes back is `fn`'s dict, untouched, or ``{"error": "<one line>"}`` when `fn`
raised, returned something other than a dict, ran past `timeout`, its worker died, or the job
was cancelled (e.g. the scheduler went away). A failing job never stops the batch and every job
gets exactly one result. Only a scheduler that cannot be reached at all raises (``OSError``),
before any job has run.

One line per finished job goes to `log`: ``[i/n] student/lab done on worker W in S s`` (or
``failed on worker W after S s: <error>``); i counts finished jobs, S is the time `fn` ran.

Timeouts (`timeout`, seconds, counted from when the job starts running, not while it queues):
a thread or a Dask task cannot be killed from outside, so a job past its timeout gets an error
result and is abandoned: the local thread is a daemon that keeps running until `fn` returns (it
does not hold up the batch or the interpreter's exit), the Dask task is cancelled but keeps its
worker thread busy until `fn` returns (a job the scheduler had already queued on that worker
waits for it). `fn` is expected to enforce its own limits on the subprocess it starts; this is a
backstop. Without `timeout`, `workers=1` is a plain loop.

Dask failure handling (checked against distributed 2026.8):

* ``retries=0`` only concerns exceptions raised by the task; here `fn`'s exceptions are caught on
  the worker anyway and come back as an error result.
* A worker that dies mid-job is a different mechanism: the *scheduler* re-runs the task on
  another worker up to ``distributed.scheduler.allowed-failures`` times (default 3) and only then
  fails it with ``KilledWorker``. That setting is read when the scheduler starts, in the
  scheduler's process: setting it with ``dask.config.set`` on the client side has no effect on
  an existing cluster. Start the scheduler with ``DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES=0``
  (or ``allowed-failures: 0`` in its dask config) if a job whose worker dies should fail at once
  rather than be retried; with the default, a submission that manages to kill its worker can
  take up to 4 workers down (a nanny restarts each one). `run_jobs` logs the scheduler's value.
* The scheduler fails (or, with allowed-failures > 0, counts a failure against) every task
  *assigned* to the dead worker, including those only queued there behind the one that was
  running (a 1-thread worker is sent up to 2 tasks). So each job announces its start to the
  client (a synchronous ``log_event`` through the worker's client, before `fn` runs); a job that
  gets ``KilledWorker`` without having started is submitted again (at most twice), and only the
  job that was running gets the error.
* A lost scheduler connection cancels every unfinished job: each gets an error result at once.
* Results are gathered and released as each job finishes, so the executed notebooks do not pile
  up in the workers' memory.

dask/distributed are imported only on the scheduler path: ``pip install "minillm[grade]"``.
"""
from __future__ import annotations

import os
import queue
import socket
import threading
import time
import traceback
import uuid
from typing import Any, Callable

Job = dict
Result = dict

__all__ = ["run_jobs"]

_MAX_ERROR = 500


def _one_line(text: str, limit: int = _MAX_ERROR) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _describe(exc: BaseException, at: bool = True) -> str:
    """`ValueError: boom (at jobs.py:42)`: the exception and the innermost frame, one line."""
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
    """One slot per job, filled once (a late second answer for a job is dropped), one log line
    per filled slot."""

    def __init__(self, jobs: list[Job], log: Callable[[str], Any]):
        self.jobs, self.log = jobs, log
        self.slots: list[Result | None] = [None] * len(jobs)
        self.count = 0

    @property
    def complete(self) -> bool:
        return self.count == len(self.jobs)

    def is_set(self, i: int) -> bool:
        return self.slots[i] is not None

    def set(self, i: int, result: Result, where: str, seconds: float | None) -> bool:
        if self.slots[i] is not None:
            return False
        self.slots[i] = result
        self.count += 1
        head = f"[{self.count}/{len(self.jobs)}] {_label(self.jobs[i], i)}"
        secs = "?" if seconds is None else f"{seconds:.1f}"
        if "error" in result:
            self.log(f"{head} failed on worker {where} after {secs} s: "
                     f"{_one_line(result['error'], 200)}")
        else:
            self.log(f"{head} done on worker {where} in {secs} s")
        return True


def _drain(res: _Results, events: queue.SimpleQueue, timeout: float | None,
           on_done: Callable[[int, Any], None], on_expired: Callable[[int], None],
           on_settled: Callable[[], None] = lambda: None) -> None:
    """Consume ("start", i, where) and ("done", i, payload) events until every slot is set;
    a job running past `timeout` gets an error result and `on_expired(i)`; `on_settled()` runs
    after each slot filled (to start the next local job)."""
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


def _run_loop(fn, jobs: list[Job], res: _Results) -> None:
    for i, job in enumerate(jobs):
        out, secs = _call(fn, job)
        res.set(i, out, "local", secs)


def _run_threads(fn, jobs: list[Job], workers: int, timeout: float | None, res: _Results) -> None:
    # Plain daemon threads rather than a concurrent.futures pool: a pool's threads are joined at
    # interpreter exit and a timed-out job would keep its slot, so one hung `fn` could stall the
    # batch or the exit. Here an abandoned job's thread no longer counts against `workers`.
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

    def on_done(i: int, payload) -> None:
        out, secs = payload
        res.set(i, out, "local", secs)

    start_more()
    _drain(res, events, timeout, on_done, on_expired=lambda i: None, on_settled=start_more)


def _run_on_worker(fn, job: Job, topic: str, index: int, attempt: int) -> dict:
    """Runs on a Dask worker: announce the start (for the timeout and the re-queueing), run fn."""
    from distributed import get_client, get_worker

    worker = get_worker()
    where = str(worker.name if worker.name is not None else worker.address)
    msg = {"index": index, "attempt": attempt, "worker": where}
    try:
        # A round trip: the scheduler has passed the event on before fn starts, so a job that
        # kills its worker at once is still known to have started (worker.log_event is batched
        # and would die unsent with the worker).
        get_client().log_event(topic, msg)
    except Exception:
        try:
            worker.log_event(topic, msg)
        except Exception:  # the job then just looks never started (no timeout, may be re-queued)
            pass
    out, secs = _call(fn, job)
    return {"result": out, "worker": where, "seconds": secs}


# A job whose worker died before the job started (it was only queued there) is submitted again,
# at most this many times; a job that had started when its worker died gets an error result.
_MAX_REQUEUES = 2


def _run_dask(fn, jobs: list[Job], scheduler: str, timeout: float | None, res: _Results,
              log) -> None:
    from concurrent.futures import CancelledError as StdCancelledError

    from distributed import Client, KilledWorker

    token = uuid.uuid4().hex[:12]
    topic = f"autograder-job-start-{token}"
    events: queue.SimpleQueue = queue.SimpleQueue()
    attempt = [0] * len(jobs)
    futures: list = [None] * len(jobs)
    started: dict[tuple[int, int], float] = {}  # (job, attempt) announced by its worker -> when

    def on_start(event) -> None:  # on the client's event-loop thread
        msg = event[1]
        i, a = int(msg["index"]), int(msg["attempt"])
        started[(i, a)] = time.monotonic()
        if a == attempt[i]:
            events.put(("start", i, str(msg["worker"])))

    with Client(scheduler, set_as_default=False) as client:
        try:
            allowed = client.run_on_scheduler(
                lambda dask_scheduler: dask_scheduler.allowed_failures)
            if allowed:
                log(f"note: the scheduler re-runs a job whose worker dies on up to {allowed} more "
                    f"worker(s) before failing it (distributed.scheduler.allowed-failures="
                    f"{allowed}, set where the scheduler starts)")
        except Exception:
            pass
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
                    # distributed fails every task *assigned* to a dead worker, queued ones too
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
            try:
                client.cancel([futures[i]])
            except Exception:
                pass

        for i in range(len(jobs)):
            submit(i)
        try:
            _drain(res, events, timeout, on_done, on_expired)
        finally:
            try:
                client.unsubscribe_topic(topic)
            except Exception:
                pass


def run_jobs(fn: Callable[[Job], Result], jobs: list[Job], *, workers: int = 1,
             scheduler: str | None = None, log: Callable[[str], Any] = print,
             timeout: float | None = None) -> list[Result]:
    """Run ``fn(job)`` for every job; return the results in the order of `jobs`.

    scheduler: ``"tcp://HOST:PORT"`` of an existing Dask distributed scheduler (then `workers`
    is ignored: the cluster's threads decide); None runs here, `workers` at a time (threads).
    timeout: seconds a job may run (from its start) before it gets an error result.
    Every job gets a result; failures are ``{"error": "<one line>"}`` (see the module docstring).
    """
    jobs = list(jobs)
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if timeout is not None and timeout <= 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
    res = _Results(jobs, log)
    if not jobs:
        return []
    if scheduler:
        _run_dask(fn, jobs, scheduler, timeout, res, log)
    elif workers == 1 and timeout is None:
        _run_loop(fn, jobs, res)
    else:
        _run_threads(fn, jobs, workers, timeout, res)
    assert res.complete
    return list(res.slots)  # type: ignore[arg-type]


def _echo_job(job: Job) -> Result:
    """Self-test executor for `run_jobs` (the tests; smoke-testing a cluster):
    ``python -c "from autograder.distribute import run_jobs, _echo_job as f;
    print(run_jobs(f, [{'payload': 'hi'}], scheduler='tcp://HOST:8786'))"``.

    job keys (all optional): payload (str), sleep (s), pidfile (path: this process's pid is
    written there before sleeping), raise (message: raise RuntimeError), exit (code: os._exit,
    which kills the process running it: never use it locally).
    Returns {"echo": <deterministic transform of payload>, "pid", "host", "start", "end"}.
    """
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
