"""autograder.distribute.run_jobs: in process, on a local thread pool, and on a real Dask cluster
(a scheduler and two nanny-managed workers on 127.0.0.1, started and stopped by this module).

The job function is autograder.distribute._echo_job: it lives in the installed `autograder`
package, so the workers import it by reference, as they will the real executor."""
from __future__ import annotations

import csv
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from autograder.distribute import _echo_job, run_jobs

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("dask")]

DASK = Path(sys.executable).with_name("dask")
LOG_LINE = re.compile(r"^\[(\d+)/(\d+)\] (\S+) (done on worker \S+ in|failed on worker \S+ after) "
                      r"(\d+\.\d|\?) s")


def echo_part(results: list[dict]) -> list:
    """The deterministic part of _echo_job's results (pid, host and times vary)."""
    return [r.get("echo", r) for r in results]


def make_jobs(n: int, **extra) -> list[dict]:
    return [{"student": f"s{i}", "lab": "00_sampling", "payload": f"notebook-{i}-" + "x" * i,
             **extra} for i in range(n)]


# --- local: a plain loop and a thread pool ------------------------------------------------------
def test_local_loop_keeps_order_logs_each_job_and_survives_a_raising_job():
    jobs = make_jobs(4)
    jobs[2]["raise"] = "boom"
    lines: list[str] = []
    results = run_jobs(_echo_job, jobs, log=lines.append)
    assert [r["echo"]["payload"] for i, r in enumerate(results) if i != 2] == \
        [j["payload"] for i, j in enumerate(jobs) if i != 2]
    assert set(results[2]) == {"error"}
    assert "RuntimeError: boom" in results[2]["error"] and "\n" not in results[2]["error"]
    assert all(r["pid"] == os.getpid() for i, r in enumerate(results) if i != 2)
    assert len(lines) == 4 and all(LOG_LINE.match(line) for line in lines), lines
    assert "[3/4] s2/00_sampling failed on worker local after" in lines[2]
    assert lines[0].startswith("[1/4] s0/00_sampling done on worker local in ")
    assert run_jobs(_echo_job, [], log=lines.append) == []


def test_local_pool_runs_jobs_concurrently_and_matches_the_loop():
    jobs = make_jobs(4, sleep=0.5)
    t0 = time.monotonic()
    pooled = run_jobs(_echo_job, jobs, workers=2, log=lambda _: None)
    wall = time.monotonic() - t0
    serial = run_jobs(_echo_job, make_jobs(4), log=lambda _: None)
    assert echo_part(pooled) == echo_part(serial)
    assert wall < 1.8, f"4 jobs of 0.5 s on 2 threads took {wall:.2f} s"
    # jobs 0 and 1 start together: their [start, end] intervals overlap; never 3 at once
    assert pooled[0]["start"] < pooled[1]["end"] and pooled[1]["start"] < pooled[0]["end"]
    for r in pooled:
        running = sum(o["start"] <= r["start"] < o["end"] for o in pooled)
        assert running <= 2


def test_local_pool_turns_errors_and_timeouts_into_results_and_goes_on():
    jobs = make_jobs(5)
    jobs[1]["raise"] = "bad notebook"
    lines: list[str] = []
    t0 = time.monotonic()
    results = run_jobs(_echo_job, jobs, workers=2, log=lines.append)
    assert time.monotonic() - t0 < 5, "the timed-out job held up the batch"
    assert results[1] == {"error": results[1]["error"]} and "bad notebook" in results[1]["error"]
    assert [r["echo"]["payload"] for r in (results[0], results[2], results[3], results[4])] == \
        [jobs[i]["payload"] for i in (0, 2, 3, 4)]
    assert len(lines) == 5
    with pytest.raises(ValueError):
        run_jobs(_echo_job, jobs, workers=0)


# --- a real Dask cluster ------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gone(proc) -> bool:
    import psutil
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_unreachable_scheduler_raises_before_any_job_runs(tmp_path):
    pytest.importorskip("distributed")  # before dask.config.set: it loads distributed's defaults
    import dask

    jobs = [{"payload": "x", "pidfile": str(tmp_path / "ran.pid")}]
    with dask.config.set({"distributed.comm.timeouts.connect": "1s"}):
        with pytest.raises(OSError, match="Timed out trying to connect"):
            run_jobs(_echo_job, jobs, scheduler=f"tcp://127.0.0.1:{_free_port()}")
    assert not (tmp_path / "ran.pid").exists()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    pytest.importorskip("distributed")
    import psutil
    from distributed import Client

    assert DASK.exists(), f"{DASK} missing: pip install 'minillm[grade]'"
    workdir = tmp_path_factory.mktemp("dask")
    port = _free_port()
    address = f"tcp://127.0.0.1:{port}"
    procs: list[subprocess.Popen] = []
    logs = []

    def start(name: str, args: list[str], env: dict | None = None) -> None:
        log = open(workdir / f"{name}.log", "w")
        logs.append(log)
        procs.append(subprocess.Popen([str(DASK), *args], cwd=workdir, stdout=log,
                                      stderr=subprocess.STDOUT, env=env, start_new_session=True))

    client = None
    try:
        # allowed-failures is read by the scheduler process at start (not by clients): 0 makes a
        # job whose worker dies fail at once with KilledWorker instead of being re-run elsewhere
        start("scheduler", ["scheduler", "--host", "127.0.0.1", "--port", str(port),
                            "--no-dashboard"],
              env=dict(os.environ, DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES="0"))
        for name in ("w1", "w2"):
            start(name, ["worker", address, "--nworkers", "1", "--nthreads", "1", "--no-dashboard",
                         "--name", name, "--host", "127.0.0.1",
                         "--local-directory", str(workdir / name)])
        client = Client(address, timeout=60, set_as_default=False)

        def ready(n: int = 2) -> dict[str, int]:
            """Wait (bounded) for n workers; warm them (import autograder); {name: worker pid}."""
            client.wait_for_workers(n, timeout=60)
            client.run(lambda: __import__("autograder.distribute") and None)
            info = client.scheduler_info(n_workers=-1)["workers"]
            pids = client.run(os.getpid)
            return {str(info[addr]["name"]): pid for addr, pid in pids.items()}

        ready()
        yield SimpleNamespace(address=address, client=client, ready=ready, workdir=workdir)
    finally:
        if client is not None:
            client.close()
        tree = []
        for p in procs:
            try:
                tree += [psutil.Process(p.pid), *psutil.Process(p.pid).children(recursive=True)]
            except psutil.NoSuchProcess:
                pass
        for group in (procs[1:], procs[:1]):  # the workers (their nannies), then the scheduler
            for p in group:
                p.terminate()
            for p in group:
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(timeout=10)
        _, alive = psutil.wait_procs([t for t in tree if not _gone(t)], timeout=10)
        for t in alive:  # a worker process its nanny did not take down
            t.kill()
        for log in logs:
            log.close()
        assert all(p.poll() is not None for p in procs)
        assert all(_gone(t) for t in tree), [t.pid for t in tree if not _gone(t)]


def test_dask_results_come_back_in_order_and_equal_a_local_run(cluster):
    cluster.ready()
    jobs = make_jobs(6)
    for i, job in enumerate(jobs):
        job["sleep"] = 0.1 * (len(jobs) - i)  # later jobs finish first
    lines: list[str] = []
    results = run_jobs(_echo_job, jobs, scheduler=cluster.address, log=lines.append)
    assert echo_part(results) == echo_part(run_jobs(_echo_job, make_jobs(6), log=lambda _: None))
    assert all(r["pid"] != os.getpid() for r in results)
    assert [int(LOG_LINE.match(line).group(1)) for line in lines] == list(range(1, 7))
    assert {LOG_LINE.match(line).group(3) for line in lines} == \
        {f"s{i}/00_sampling" for i in range(6)}
    assert all(re.search(r"done on worker w[12] in \d+\.\d s$", line) for line in lines), lines


def test_dask_uses_both_workers(cluster):
    pids = cluster.ready()
    results = run_jobs(_echo_job, make_jobs(8, sleep=0.3), scheduler=cluster.address,
                       log=lambda _: None)
    assert {r["pid"] for r in results} == set(pids.values())
    assert {r["host"] for r in results} == {socket.gethostname()}
    # two at a time: some jobs overlap
    assert any(a["start"] < b["end"] and b["start"] < a["end"] and a["pid"] != b["pid"]
               for a in results for b in results)


def test_dask_job_that_raises_gives_an_error_and_the_rest_complete(cluster):
    cluster.ready()
    jobs = make_jobs(5)
    jobs[2]["raise"] = "student code escaped"
    lines: list[str] = []
    results = run_jobs(_echo_job, jobs, scheduler=cluster.address, log=lines.append)
    assert set(results[2]) == {"error"}
    assert "RuntimeError: student code escaped" in results[2]["error"]
    assert [r["echo"]["payload"] for i, r in enumerate(results) if i != 2] == \
        [j["payload"] for i, j in enumerate(jobs) if i != 2]
    assert sum("failed on worker w" in line for line in lines) == 1


def test_dask_worker_killed_mid_job_gives_an_error_and_the_batch_finishes(cluster, tmp_path):
    pids = cluster.ready()
    jobs = make_jobs(4, sleep=0.2)
    jobs[1].update(sleep=60, pidfile=str(tmp_path / "victim.pid"))
    out: dict = {}
    lines: list[str] = []
    runner = threading.Thread(target=lambda: out.update(results=run_jobs(
        _echo_job, jobs, scheduler=cluster.address, log=lines.append)), daemon=True)
    runner.start()
    deadline = time.monotonic() + 30
    while not (tmp_path / "victim.pid").exists():
        assert time.monotonic() < deadline, "the victim job never started"
        time.sleep(0.05)
    victim = int((tmp_path / "victim.pid").read_text())
    assert victim in pids.values()
    os.kill(victim, signal.SIGKILL)
    runner.join(timeout=40)
    assert not runner.is_alive(), "run_jobs did not finish after its worker was killed"
    results = out["results"]
    assert set(results[1]) == {"error"}
    assert "worker died" in results[1]["error"] and "KilledWorker" in results[1]["error"]
    assert [r["echo"]["payload"] for i, r in enumerate(results) if i != 1] == \
        [j["payload"] for i, j in enumerate(jobs) if i != 1]
    assert sum(bool(LOG_LINE.match(line)) for line in lines) == 4, lines
    assert re.match(r"\[\d/4\] s1/00_sampling failed on worker w[12] after \d+\.\d s: the worker "
                    r"died while running it \(KilledWorker", \
        next(line for line in lines if LOG_LINE.match(line) and " s1/" in line))
    assert victim not in cluster.ready().values()  # the nanny started a fresh worker process


def test_dask_job_that_kills_its_own_worker_gives_an_error(cluster):
    cluster.ready()
    jobs = make_jobs(3)
    jobs[0]["exit"] = 3
    lines: list[str] = []
    results = run_jobs(_echo_job, jobs, scheduler=cluster.address, log=lines.append)
    assert set(results[0]) == {"error"} and "KilledWorker" in results[0]["error"]
    # a job only queued on the dying worker fails with KilledWorker too (allowed-failures=0):
    # run_jobs submits it again, as it had not started
    assert [r.get("echo", r)["payload"] for r in results[1:]] == \
        [j["payload"] for j in jobs[1:]], (results, lines)
    assert all(LOG_LINE.match(line) or re.match(r"note: s[12]/00_sampling was queued on worker "
                                                r"w[12] when it died; submitted again$", line)
               for line in lines), lines  # never the job that did it (s0)
    cluster.ready()  # the nanny has restarted its worker (a restart cut short slows the teardown)


# --- the grader on the cluster: same grades as one submission at a time -------------------------
def test_grading_two_at_a_time_and_on_dask_gives_the_grades_of_one_at_a_time(cluster, tmp_path):
    """`grade --jobs 2` and `grade --scheduler` record exactly what `grade --jobs 1` does, on an
    honest, a wrong and a tampering submission of the pipeline's dummy lab (the tester runs on
    the worker, beside the kernel). The workers only execute (they get the job, not the
    course); the grader alone writes the gradebook."""
    import shutil

    import nbformat
    from test_pipeline import DUMMY, REPO, write_dummy_lab, wrong_notebook

    from autograder.course import Course
    from autograder.grade import grade_submissions
    from autograder.sandbox import sandbox_unavailable_reason

    root = tmp_path / "course"
    root.mkdir()
    shutil.copy2(REPO / "nbgrader_config.py", root / "nbgrader_config.py")
    write_dummy_lab(root / "labs" / DUMMY)
    course = Course(root)
    course.release()
    source = nbformat.read(str(course.source(DUMMY) / f"{DUMMY}.ipynb"), as_version=4)
    tamper = nbformat.from_dict(json.loads(json.dumps(source)))
    tamper.cells[2].source = ("import contextlib, autograder\n"     # the tests are not here
                              "autograder.assert_close = lambda *a, **k: None\n"
                              "def scale(logits, t):\n    return logits * t\n")
    subs = tmp_path / "subs"
    for student, nb in [("honest", source), ("wrong", wrong_notebook(course.source(DUMMY))),
                        ("tamper", tamper)]:
        (subs / student / DUMMY).mkdir(parents=True)
        nbformat.write(nb, str(subs / student / DUMMY / f"{DUMMY}.ipynb"))
    sandbox = sandbox_unavailable_reason() is None

    def grades(**how):
        records = grade_submissions(course, subs, feedback=False, sandbox=sandbox,
                                    cell_timeout=30, notebook_timeout=120, log=lambda *a: None,
                                    **how)
        rows = sorted(csv.DictReader(open(course.build / "grades.csv")),
                      key=lambda r: r["student_id"])
        return ([(r.student, r.status.split(":")[0], [(c.grade_id, c.score) for c in r.cells])
                 for r in records], [(r["student_id"], r["score"]) for r in rows])

    one = grades(workers=1)
    assert one[0] == [
        ("honest", "ok", [("99_scale_test", 2.0), ("99_asset_test", 1.0)]),
        ("tamper", "ok", [("99_scale_test", 0.0), ("99_asset_test", 1.0)]),
        ("wrong", "ok", [("99_scale_test", 0.0), ("99_asset_test", 1.0)])], one
    assert grades(workers=2) == one
    cluster.ready()
    assert grades(scheduler=cluster.address) == one


def test_each_local_job_gets_its_share_of_the_cores(monkeypatch):
    """`grade --jobs N`: each job process (and the kernel, through the sandbox's pass-through)
    gets cores // N torch threads and compile workers (autograder/cores.py, tested in
    tests/test_cores.py) on top of the grader's environment, and the CPUs it is lent; one job
    at a time changes nothing."""
    from autograder import cores, jobs, processes
    for name in cores.THREAD_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(cores.os, "sched_getaffinity", lambda pid: set(range(4)))
    monkeypatch.setenv("OMP_NUM_THREADS", "3")                  # the instructor's choice wins
    seen = []

    def fake_run_logged(cmd, *, env=None, cpus=None, **kw):
        seen.append((env, cpus))
        return processes.RunResult(cmd=cmd, returncode=1, seconds=0.0, timed_out=False,
                                   log=None, output="")
    monkeypatch.setattr(processes, "run_logged", fake_run_logged)
    job = {"notebooks": {"x": "{}"}, "limits": {"notebook_timeout": 10,
                                                "thread_env": cores.share_of_cores(2)}}
    assert "error" in jobs.execute_job(job)
    env, cpus = seen[-1]
    assert env["TORCHINDUCTOR_COMPILE_THREADS"] == "2" and env["OMP_NUM_THREADS"] == "3"
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(processes.package_parent()) and \
        env["MPLBACKEND"] == processes.KERNEL_MPLBACKEND, "the grader's job environment is lost"
    assert cpus is None
    jobs.execute_on_own_cores(cores.CoreSlots(2, [[0, 1], [2, 3]]))(job)
    assert seen[-1][1] == [0, 1]
    job["limits"]["thread_env"] = {}
    jobs.execute_job(job)
    assert seen[-1] == (None, None)                            # the grader's environment                                     # the grader's environment
