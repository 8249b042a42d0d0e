"""Starting ranks, and failing loudly when one of them dies or hangs.

A tensor-parallel model is W processes ("ranks") that meet in a process group and then exchange
tensors with collectives (`all_reduce`): gloo between CPU processes over loopback TCP, NCCL
between GPUs. Two ways to start them:

* `torchrun --nproc-per-node W -m minillm generate ...`: torchrun starts the W processes and
  sets RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT; `from_torchrun()` reads them.
* `run_ranks(fn, W, ...)`: this process starts W children, each runs fn(rank, world, ...) in
  the group, and it returns their results ([fn of rank 0, fn of rank 1, ...]).
  `start_workers(fn, W, ...)` starts ranks 1..W-1 only: the caller is rank 0 (the server).

Failure is the rule to design for: a rank that dies closes its sockets, so a peer waiting on it
gets an error at once; a rank that hangs is caught by the group's timeout (`timeout_s`), after
which every collective raises. `RankFailure` turns either into one sentence, and the launcher
kills what is left, so nothing hangs.
"""
from __future__ import annotations

import datetime
import os
import pickle
import sys
import tempfile
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

DEFAULT_TIMEOUT_S = 30.0


class RankFailure(RuntimeError):
    """A rank of a tensor-parallel group died, hung, or raised."""


def explain(e: BaseException, timeout_s: float | None = None) -> RankFailure:
    """One clear sentence for an error a collective raised."""
    text = str(e)
    low = text.lower()
    if "timed out" in low or "timeout" in low:
        after = f" within {timeout_s:g} s" if timeout_s else ""
        return RankFailure(f"a peer rank did not answer{after} (hung or too slow); the "
                           f"collective timed out: {text.splitlines()[0][:200]}")
    if "connection closed" in low or "connection reset" in low or "broken pipe" in low \
            or "connection refused" in low or "socket" in low:
        return RankFailure(f"a peer rank is gone (its connection closed: it died or exited): "
                           f"{text.splitlines()[0][:200]}")
    return RankFailure(f"a collective failed: {text.splitlines()[0][:200]}")


def backend_for(device) -> str:
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def init_group(rank: int, world: int, init_method: str, *, timeout_s: float = DEFAULT_TIMEOUT_S,
               device="cpu") -> None:
    """Join the default process group as `rank` of `world`; collectives time out after
    timeout_s seconds."""
    if torch.device(device).type != "cuda":
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")     # loopback: no network needed
    try:
        dist.init_process_group(backend_for(device), init_method=init_method, rank=rank,
                                world_size=world,
                                timeout=datetime.timedelta(seconds=timeout_s))
    except Exception as e:              # a rank that never came: the store's wait times out
        raise RankFailure(f"rank {rank} of {world}: the process group did not form within "
                          f"{timeout_s:g} s ({str(e).splitlines()[0][:160]})") from e


def from_torchrun() -> tuple[int, int] | None:
    """(rank, world) when this process was started by torchrun (or another launcher that sets
    RANK and WORLD_SIZE), else None."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    return None


def close_group(together: bool = False) -> None:
    """Leave the process group; together=True waits at a barrier for every rank first (a rank
    that tears down while a peer is still inside a collective or still joining can abort it).
    Not for a rank whose peers may already be gone (Workers.close joins them first)."""
    if not dist.is_initialized():
        return
    try:
        if together and dist.get_world_size() > 1:
            dist.barrier()
    finally:
        dist.destroy_process_group()


def _child(rank, world, init_method, timeout_s, threads, device, fn, args, results):
    torch.set_num_threads(threads)
    try:
        init_group(rank, world, init_method, timeout_s=timeout_s, device=device)
        value = fn(rank, world, *args)
        # by value (plain pickle): tensors in torch's shared memory would vanish with this rank
        if results is not None:
            results.put((rank, "ok", pickle.dumps(value)))
    except BaseException as e:                 # noqa: BLE001 -- reported to the launcher
        if _from_a_collective(e):            # fn's own collective failed: say why in words
            e = explain(e, timeout_s)
        message = str(e) if isinstance(e, RankFailure) else \
            "".join(traceback.format_exception_only(type(e), e)).strip()
        if results is not None:
            results.put((rank, "error", message))
        print(f"minillm tensor parallel, rank {rank}: {message}", file=sys.stderr, flush=True)
        os._exit(1)
    close_group(together=results is not None)       # run_ranks' ranks leave together


def _from_a_collective(e: BaseException) -> bool:
    """An error of the communication library (gloo raises plain RuntimeErrors), not of fn's own
    code, which is reported as it is."""
    text = str(e)
    return isinstance(e, dist.DistError) or isinstance(e, RuntimeError) and any(
        k in text for k in ("gloo/transport", "Connection closed", "Timed out waiting", "NCCL"))


def _store_file() -> str:
    fd, path = tempfile.mkstemp(prefix="minillm-tp-")
    os.close(fd)
    os.unlink(path)                              # the FileStore creates it
    return path


def run_ranks(fn, world: int, *args, threads: int = 1, timeout_s: float = DEFAULT_TIMEOUT_S,
              device="cpu", start: str = "spawn") -> list:
    """Run fn(rank, world, *args) in `world` new processes that form one process group; return
    [result of rank 0, result of rank 1, ...]. Raises RankFailure naming each rank that failed
    (the first one is usually the cause, the rest its peers timing out or losing it).

    threads: torch threads per rank. start: "spawn" (fn must be importable) or "fork" (fn may
    be defined in a notebook; Linux)."""
    if not isinstance(world, int) or world < 1:
        raise ValueError(f"world must be a positive integer, got {world!r}")
    ctx = mp.get_context(start)
    results = ctx.SimpleQueue()         # written at once: a rank may os._exit right after
    init = f"file://{_store_file()}"
    procs = [ctx.Process(target=_child, name=f"minillm-tp-rank{r}",
                         args=(r, world, init, timeout_s, threads, device, fn, args, results),
                         daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    got, errors = {}, {}
    # the peers of a dead rank learn of it at once (closed sockets) or after timeout_s (a hang)
    deadline_after_failure = None
    try:
        while len(got) + len(errors) < world:
            item = _poll(results)
            if item is not None:
                _take(item, got, errors)
                continue
            for r, p in enumerate(procs):
                if r not in got and r not in errors and p.exitcode not in (None, 0):
                    # a rank that failed put its reason in the queue before exiting: it may
                    # have arrived since the poll above
                    while not results.empty():
                        _take(results.get(), got, errors)
                if r not in got and r not in errors and p.exitcode not in (None, 0):
                    # gone without a word: killed by a signal, or the interpreter died
                    errors[r] = f"exited with code {p.exitcode} (killed or crashed)"
            if errors and deadline_after_failure is None:
                # the others' collectives fail at once (a closed socket) or time out together
                deadline_after_failure = time.monotonic() + min(timeout_s, 5.0) + 1
            if deadline_after_failure and time.monotonic() > deadline_after_failure:
                for r in range(world):
                    if r not in got and r not in errors:
                        errors[r] = "still running after a peer's failure: killed"
                break
    finally:
        for p in procs:
            p.join(0.5 if errors else 10)
            if p.is_alive():
                p.kill()
                p.join(1)
    if errors:
        lines = "; ".join(f"rank {r}: {m}" for r, m in sorted(errors.items()))
        raise RankFailure(f"tensor parallel run of {world} ranks failed -- {lines}")
    return [got[r] for r in range(world)]


def _take(item, got: dict, errors: dict) -> None:
    rank, kind, value = item
    if kind == "ok":
        got[rank] = pickle.loads(value)
    else:
        errors[rank] = value


def _poll(results):
    if results.empty():
        time.sleep(0.05)
        return None
    return results.get()


class Workers:
    """Ranks 1..W-1 in child processes, each running fn(rank, world, *args); the caller joins the
    group as rank 0 (`start_workers`). `check()` raises RankFailure if one has died; `close()`
    waits for them to return and kills any that do not."""

    def __init__(self, procs, timeout_s):
        self.procs, self.timeout_s = procs, timeout_s

    def check(self) -> None:
        for r, p in enumerate(self.procs, start=1):
            if p.exitcode not in (None, 0):
                how = f"was killed by signal {-p.exitcode}" if p.exitcode < 0 else \
                    f"exited with code {p.exitcode}"
                raise RankFailure(f"tensor parallel rank {r} of {len(self.procs) + 1} {how}; "
                                  f"the model cannot run without its shard")

    def close(self, wait_s: float = 10.0) -> None:
        for p in self.procs:
            p.join(wait_s)
            if p.is_alive():
                p.kill()
                p.join(1)
        close_group()


def start_workers(fn, world: int, *args, threads: int = 1,
                  timeout_s: float = DEFAULT_TIMEOUT_S, device="cpu") -> Workers:
    """Start ranks 1..world-1 (spawned processes running fn(rank, world, *args)) and join the
    group as rank 0 in this process."""
    ctx = mp.get_context("spawn")
    init = f"file://{_store_file()}"
    # no result queue: a worker reports by its exit code and its stderr line
    procs = [ctx.Process(target=_child, name=f"minillm-tp-rank{r}",
                         args=(r, world, init, timeout_s, threads, device, fn, args, None),
                         daemon=True) for r in range(1, world)]
    for p in procs:
        p.start()
    try:
        init_group(0, world, init, timeout_s=timeout_s, device=device)
    except BaseException:
        for p in procs:
            p.kill()
        raise
    return Workers(procs, timeout_s)
