"""minillm.bench.gpu_timer.Timer: interleaved medians, and on a GPU the launch check (a call queued
after its start event fired is reported, and the sleep before each call grows until no call is).

The launch check needs CUDA: on this course's CPU machines that test is skipped with its reason
(it passed on the lent H200, benchmarks/RESULTS.md "Fifth run")."""
from __future__ import annotations

import time

import pytest
import torch

from minillm.bench.gpu_timer import Timer


def test_the_cpu_timer_gives_each_function_its_median():
    calls = []

    def slow():
        calls.append("slow")
        time.sleep(0.004)

    def fast():
        calls.append("fast")
    t = Timer(torch.device("cpu")).run({"slow": slow, "fast": fast}, warmup=1, repeats=5)
    assert set(t) == {"slow", "fast"}
    assert t["slow"] >= 0.004 > t["fast"]
    assert calls[:4] == ["slow", "fast", "slow", "fast"], "interleaved, warm-up included"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the launch check times CUDA events")
def test_a_call_launched_after_its_start_event_is_reported_and_the_sleep_grows(monkeypatch):
    x = torch.ones(1 << 20, device="cuda")

    def host_bound():                       # the CPU takes 250 us before it launches anything
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 250e-6:
            pass
        x.mul_(1.0)

    def quick():
        x.mul_(1.0)
    monkeypatch.setenv("BENCH_SLEEP_CYCLES", "100000")       # fixed sleep: report only
    fixed = Timer(torch.device("cuda"), first_warmup_s=0.0)
    fixed.run({"host_bound": host_bound, "quick": quick}, warmup=2, repeats=10)
    assert fixed.launch_report["host_bound"]["late"] > 0.5, fixed.launch_report
    assert fixed.launch_report["quick"]["late"] <= 0.1, fixed.launch_report
    assert set(fixed.late_calls()) == {"host_bound"}
    monkeypatch.delenv("BENCH_SLEEP_CYCLES")
    adaptive = Timer(torch.device("cuda"), first_warmup_s=0.0)
    t = adaptive.run({"host_bound": host_bound, "quick": quick}, warmup=2, repeats=10)
    assert adaptive.sleep_cycles > 100_000, adaptive.launch_report     # it lengthened the sleep
    assert t["host_bound"] < 50e-6, f"{t['host_bound'] * 1e6:.0f} us: still the CPU's 250 us"
