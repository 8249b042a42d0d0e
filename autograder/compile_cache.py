"""A compile cache the grader warms once (the lab's WARMUPS: course commands, never student code)
and each graded kernel gets a copy of: in the sandbox Inductor's cache started empty, and every
lab 05 submission compiled the same library code again (autograder/README.md, "Instructors").
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
    """The warm-up commands of `lab` (argv after the interpreter)."""
    if (target := WARMUPS.get(lab)) is None:
        return []
    module, _, name = target.partition(":")
    return [list(c) for c in getattr(importlib.import_module(module), name)()]


def fingerprint(cmds: list[list[str]], env: dict[str, str]) -> dict:
    """What a warm cache depends on; `env`'s PASSTHROUGH_ENV variables count (OMP_NUM_THREADS
    is part of Inductor's cache key)."""
    from .sandbox import PASSTHROUGH_ENV
    return {"commands": cmds, **environment_fingerprint(PACKAGES),
            "env": {k: env[k] for k in PASSTHROUGH_ENV if k in env}}


def warm(course, lab: str, log=print, thread_env: dict[str, str] | None = None) -> dict[str, str]:
    """`lab`'s warm cache as {path: base64}, built with the jobs' `thread_env` if needed; {}
    for none or on failure (logged)."""
    if not (cmds := commands(lab)):
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
            r = run_logged([sys.executable, *cmd], cwd=home, log=out, env=env,
                           timeout=WARMUP_TIMEOUT_S)
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
