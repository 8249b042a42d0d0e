"""A busy neighbour for the tests that check measurements and speed verdicts under load."""
from __future__ import annotations

import contextlib
import subprocess
import sys
import time

NICE = 10


@contextlib.contextmanager
def competing_cpu_load(nice: int = NICE):
    """A subprocess spinning for as long as the block runs (killed by its pid, also on error).

    It runs at a lower priority (nice 10): alone beside a test it has a core of its own, the busy
    neighbour of a laptop; in `make test` the suite's other worker is such a neighbour already,
    and the spinner then gets about a tenth of a core instead of a third of both for the ten
    minutes these tests take (tests/test_speed_checks.py checks that it still spins)."""
    proc = subprocess.Popen([sys.executable, "-c",
                             f"import os\nos.nice({int(nice)})\nwhile True:\n    pass"])
    try:
        time.sleep(0.2)                         # let it start spinning
        assert proc.poll() is None
        yield proc
    finally:
        proc.kill()
        proc.wait()
