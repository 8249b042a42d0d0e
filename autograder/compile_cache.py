"""A compile cache the grader warms once and each graded kernel gets a copy of.

Lab 05's bench cell runs the course's CLI, whose draft decodes through `torch.compile`. In the
sandbox /tmp is a fresh tmpfs, so Inductor's cache (`/tmp/torchinductor_<user>`) starts empty
and every graded submission compiled the same library code again (`benchmarks/grade_batch.py`
measures what that costs). Instead:

* a lab lists, in WARMUPS, the commands whose compiled code its notebook needs. They are the
  course's own commands (`python -m minillm ...`), never student code;
* before a batch, `warm(course, lab)` runs them once in the grader, with
  TORCHINDUCTOR_CACHE_DIR set to `build/compile_cache/<lab>/inductor` (a folder no sandbox
  sees), and keeps the result for later batches while its fingerprint holds: the commands,
  the Python and torch versions, the bytes of the course's packages and the thread variables
  a kernel gets (`OMP_NUM_THREADS` is part of Inductor's cache key). Anything else runs them
  again;
* each job carries the files (`job["compile_cache"]`, packed like the lab's assets, so a Dask
  worker gets them too), and the job process writes them into a folder of the kernel's own,
  bound into its sandbox, and sets TORCHINDUCTOR_CACHE_DIR there
  (`jobs.install_compile_cache`). A kernel that rewrites its copy changes its own grading
  only: the next job gets a fresh copy of the grader's.

A warm-up that fails or runs past WARMUP_TIMEOUT_S is logged and the batch is graded without
the cache, as before: it costs time, never a grade.
"""
from __future__ import annotations

import importlib
import json
import shutil
import sys
import time

from .jobs import COMPILE_CACHE_ENV as ENV
from .jobs import JobError, pack_files
from .processes import environment_fingerprint, run_logged, subprocess_env

__all__ = ["WARMUPS", "warm", "fingerprint", "ENV"]

# lab -> "module:function" returning the argv of each command to run (after the interpreter)
WARMUPS: dict[str, str] = {"05_speculative": "autograder.labs.lab05:compile_warmups"}
WARMUP_TIMEOUT_S = 900
MAX_CACHE_BYTES = 64 << 20          # lab 05's is about 2 MB
FINGERPRINT_FILE = "fingerprint.json"
PACKAGES = ("minillm", "kernels")   # the code a warm-up compiles


def commands(lab: str) -> list[list[str]]:
    """The warm-up commands of `lab` (argv after the interpreter), [] when it has none."""
    target = WARMUPS.get(lab)
    if target is None:
        return []
    module, _, name = target.partition(":")
    return [list(c) for c in getattr(importlib.import_module(module), name)()]


def fingerprint(cmds: list[list[str]], env: dict[str, str]) -> dict:
    """What a warm cache depends on; a different fingerprint runs the warm-up again. `env`: the
    warm-up's environment, of which the variables the sandbox passes to a kernel count
    (OMP_NUM_THREADS is part of Inductor's cache key)."""
    from .sandbox import PASSTHROUGH_ENV
    return {"commands": cmds, **environment_fingerprint(PACKAGES),
            "env": {k: env[k] for k in PASSTHROUGH_ENV if k in env}}


def warm(course, lab: str, log=print, thread_env: dict[str, str] | None = None) -> dict[str, str]:
    """The warm cache of `lab` as {relative path: base64}, built now if needed; {} when the lab
    has no warm-up, or when building it failed (logged). `thread_env`: the thread variables the
    jobs run with (grade --jobs N), which the warm-up must share to compile the same code."""
    cmds = commands(lab)
    if not cmds:
        return {}
    home = course.build / "compile_cache" / lab
    cache, stamp = home / "inductor", home / FINGERPRINT_FILE
    env = subprocess_env({**(thread_env or {}), ENV: str(cache)})
    want = fingerprint(cmds, env)
    try:
        have = json.loads(stamp.read_text())
    except (OSError, ValueError):
        have = None
    if have != want:
        shutil.rmtree(home, ignore_errors=True)
        cache.mkdir(parents=True)
        t0 = time.monotonic()
        for i, cmd in enumerate(cmds):
            out = home / f"warmup_{i}.log"
            r = run_logged([sys.executable, *cmd], cwd=home, log=out, timeout=WARMUP_TIMEOUT_S,
                           env=env)
            if r.returncode != 0 or r.timed_out:
                why = "timed out" if r.timed_out else f"exit {r.returncode}"
                log(f"warning: {lab}'s compile warm-up failed ({why}; see {out}): grading "
                    "without a warm compile cache")
                shutil.rmtree(cache, ignore_errors=True)
                return {}
        stamp.write_text(json.dumps(want))
        log(f"{lab}: compile cache warmed in {time.monotonic() - t0:.0f} s ({home})")
    else:
        log(f"{lab}: using the warm compile cache in {home}")
    try:
        return pack_files(cache, MAX_CACHE_BYTES)
    except JobError:
        log(f"warning: {lab}'s compile cache is over {MAX_CACHE_BYTES >> 20} MB: grading "
            "without it")
        return {}


