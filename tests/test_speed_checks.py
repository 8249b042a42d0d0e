"""Every registered speed check gives the same verdict every time, also under a competing load.

autograder/labs/labNN.py registers SPEED_CHECKS (the check on the minillm reference: must say
True) and optionally SLOW_CHECKS (the same check on a deliberately slow or wrong candidate: must
say False). Each is run RUNS times, LOADED_RUNS of them while a busy loop occupies one of the CPU
cores; one different verdict fails the test.
"""
from __future__ import annotations

import contextlib
import subprocess
import sys
import time

import pytest

from autograder.labs import all_slow_checks, all_speed_checks

RUNS = 10
LOADED_RUNS = 4
SPEED = all_speed_checks()
SLOW = all_slow_checks()
pytestmark = pytest.mark.slow


@contextlib.contextmanager
def competing_cpu_load():
    """A subprocess spinning on one core for as long as the block runs."""
    proc = subprocess.Popen([sys.executable, "-c", "while True:\n    pass"])
    try:
        time.sleep(0.2)                         # let it start spinning
        assert proc.poll() is None
        yield proc
    finally:
        proc.kill()
        proc.wait()


def verdicts(check) -> list[tuple[str, bool]]:
    out = []
    for i in range(RUNS):
        loaded = i >= RUNS - LOADED_RUNS
        with competing_cpu_load() if loaded else contextlib.nullcontext():
            out.append(("loaded" if loaded else "quiet", check()))
    return out


def test_the_competing_load_really_competes():
    psutil = pytest.importorskip("psutil")
    with competing_cpu_load() as proc:
        time.sleep(0.3)
        assert psutil.Process(proc.pid).cpu_times().user > 0.1
    assert proc.poll() is not None              # killed


@pytest.mark.skipif(not SPEED, reason="no lab registers SPEED_CHECKS yet")
@pytest.mark.parametrize("name", sorted(SPEED))
def test_speed_check_passes_on_the_reference_every_time(name):
    results = verdicts(SPEED[name])
    assert all(v is True for _, v in results), f"{name}: verdicts {results}"


@pytest.mark.skipif(not SLOW, reason="no lab registers SLOW_CHECKS yet")
@pytest.mark.parametrize("name", sorted(SLOW))
def test_speed_check_fails_on_the_slow_candidate_every_time(name):
    results = verdicts(SLOW[name])
    assert all(v is False for _, v in results), f"{name}: verdicts {results}"


def test_registry_discovers_lab_modules():
    from autograder.labs import lab_modules
    names = [m.__name__ for m in lab_modules()]
    assert names == sorted(names)
    assert all(n.rsplit(".", 1)[-1][:3] == "lab" for n in names)
    for key in list(SPEED) + list(SLOW):
        assert key.split(".", 1)[0] in {n.rsplit(".", 1)[-1] for n in names}
