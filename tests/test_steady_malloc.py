"""autograder/steady_malloc.py: with fixed malloc thresholds a repeated torch step reuses its
memory (no page faults), so its cost does not depend on the process's past.

`pytest -s tests/test_steady_malloc.py` prints the figures the module's docstring quotes."""
from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = """
import resource, sys, time, torch
torch.set_num_threads(1)
if sys.argv[1] == "steady":
    from autograder.steady_malloc import steady
    assert steady(), "mallopt failed"
from autograder.labs import lab03
step = lab03.make_inputs()                   # lab 03's naive MLA step, 4096 positions
with torch.no_grad():
    for _ in range(3):
        lab03.library_naive(*step)
    faults, cpu = [], []
    for _ in range(11):
        f, t = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.process_time()
        lab03.library_naive(*step)
        cpu.append(time.process_time() - t)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f)
    print(sorted(faults)[5], sorted(cpu)[5])                 # the medians of 11 calls
"""


def _per_call(mode: str) -> tuple[float, float]:
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True,
                         timeout=300, check=True).stdout.split()
    return float(out[0]), float(out[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_repeated_step_reuses_its_memory():
    faults, seconds = _per_call("steady")
    default_faults, default_seconds = _per_call("default")
    print(f"\nlab 03's naive MLA step, median of 11 calls after 3 warm-ups: default malloc "
          f"{default_faults:.0f} page faults, {default_seconds * 1e3:.1f} ms of CPU; steady() "
          f"{faults:.0f} page faults, {seconds * 1e3:.1f} ms")
    assert faults < 50, f"{faults:.0f} page faults per call with fixed malloc thresholds"
