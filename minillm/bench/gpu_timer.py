"""Timing GPU kernels: interleaved calls timed by CUDA events, with the L2 cache flushed before
each call, and the device-to-device copy bandwidth that kernels are compared with.

Used by the GPU benchmarks (benchmarks/) and by the speed checks of the kernels students write
(autograder/labs/kernelcheck.py). Without a GPU, `Timer` falls back to perf_counter: dry runs
only, to exercise the code path; such figures mean nothing.
"""
from __future__ import annotations

import os
import statistics
import time

import torch

__all__ = ["Timer", "copy_bandwidth"]

# `Timer.run` times again with twice the sleep while more than LATE_SHARE of some function's
# calls were launched after their start event, at most MAX_CUSHION_DOUBLINGS times per run (and
# to 16 times the first sleep in all).
LATE_SHARE = 0.1
MAX_CUSHION_DOUBLINGS = 3


class Timer:
    """Interleaved timing of several calls: CUDA events with the L2 flushed before each call on
    a GPU, perf_counter on the CPU (dry runs only)."""

    def __init__(self, device: torch.device, first_warmup_s: float = 2.0):
        self.cuda = device.type == "cuda"
        # overridable to check that neither changes what is measured
        self.sleep_cycles = int(os.environ.get("BENCH_SLEEP_CYCLES", 100_000))   # about 50 us
        self.max_sleep_cycles = 16 * self.sleep_cycles
        self.warmup_s = float(os.environ.get("BENCH_WARMUP_S", 0.3))
        self.first_warmup_s = first_warmup_s   # the first run also waits for the clock to rise
        self.launch_report: dict = {}          # the last timed rounds' launch check, per name
        if self.cuda:
            self.flush_buf = torch.ones(256 * 2**20 // 4, dtype=torch.float32, device=device)

    def flush(self):
        """Evict everything else from L2 (reads 256 MiB), then keep the GPU busy ~50 us more, so
        that the timed call is queued before its start event fires: the events then time the
        GPU's work alone, not the CPU's launch cost (CUDA graphs hide that in a real server).
        Where the CPU is slower than that, `run` sees it and lengthens the sleep."""
        if self.cuda:
            self.flush_buf.sum()
            torch.cuda._sleep(self.sleep_cycles)

    def run(self, fns: dict, warmup: int, repeats: int) -> dict:
        """Median seconds per call of each function. Warm-up: at least `warmup` interleaved
        rounds and, on a GPU, at least warmup_s seconds of them, with the same flushes as the
        timed rounds, so that the clocks settle under this very load. (The SM clock idles low
        -- 345 MHz seen on an H100 here -- and a kernel that dequantizes, i.e. does arithmetic
        per byte, measured several times slower before it rose, in the first run of a process
        even after 0.3 s of warm-up, hence 2 s then; warming up with dense bf16 matrix products
        instead drew ~350 W and slowed the same kernels several times too.)"""
        t0 = time.perf_counter()
        done = 0
        seconds, self.first_warmup_s = max(self.warmup_s, self.first_warmup_s), 0.0
        while done < warmup or (self.cuda and time.perf_counter() - t0 < seconds):
            for fn in fns.values():
                self.flush()
                fn()
            if self.cuda and done % 16 == 15:
                torch.cuda.synchronize()
            done += 1
        if not self.cuda:
            times = {name: [] for name in fns}
            for _ in range(repeats):
                for name, fn in fns.items():
                    t0 = time.perf_counter()
                    fn()
                    times[name].append(time.perf_counter() - t0)
            return {name: statistics.median(ts) for name, ts in times.items()}
        for _ in range(MAX_CUSHION_DOUBLINGS + 1):
            times = self._timed_rounds(fns, repeats)
            if (not self.late_calls(LATE_SHARE) or os.environ.get("BENCH_SLEEP_CYCLES")
                    or self.sleep_cycles >= self.max_sleep_cycles):
                break
            self.sleep_cycles *= 2       # this machine's launches need a longer cushion
        return times

    def _timed_rounds(self, fns: dict, repeats: int) -> dict:
        # One clock for both sides: an event recorded on an idle GPU fires when the CPU asks
        # (within a launch latency), so GPU event times convert to perf_counter times.
        torch.cuda.synchronize()
        ref = torch.cuda.Event(enable_timing=True)
        ref.record()
        t_ref = time.perf_counter()
        events = {name: [] for name in fns}
        launched = {name: [] for name in fns}
        for _ in range(repeats):
            for name, fn in fns.items():
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                self.flush()
                start.record()
                fn()
                launched[name].append(time.perf_counter() - t_ref)
                end.record()
                events[name].append((start, end))
        torch.cuda.synchronize()
        # A call whose launch returned after its start event fired left the GPU idle in
        # between: its time then holds CPU launch time, not only the GPU's work. (While the CPU
        # runs ahead, the launch queue fills and every call waits for its turn: that is fine.)
        # `run` then doubles the sleep and times again; `launch_report` keeps what it saw.
        self.launch_report = {}
        for name, pairs in events.items():
            slack = [ref.elapsed_time(s) / 1e3 - h for (s, _), h in zip(pairs, launched[name])]
            self.launch_report[name] = {"late": sum(x < 0 for x in slack) / len(slack),
                                        "median_slack_s": statistics.median(slack),
                                        "sleep_cycles": self.sleep_cycles}
        return {name: statistics.median(s.elapsed_time(e) / 1e3 for s, e in pairs)
                for name, pairs in events.items()}

    def late_calls(self, threshold: float = 0.1) -> dict:
        """{name: report} of the functions of the last timed rounds more than `threshold` of whose
        calls were launched after their start event fired (their medians may hold CPU launch
        time); `median_slack_s`: how long before its start event a call was queued (median)."""
        return {k: v for k, v in self.launch_report.items() if v["late"] > threshold}

    def late_warning(self, label: str) -> str | None:
        """One line naming the functions `late_calls` reports, or None: for the benchmarks."""
        late = self.late_calls()
        if not late:
            return None
        return (f"warning: {label}: launched after their start event, so their times may hold "
                f"CPU launch time: " + "; ".join(
                    f"{k} {r['late']:.0%} of the calls (median slack "
                    f"{r['median_slack_s'] * 1e6:.0f} us)" for k, r in late.items()))


def copy_bandwidth(device: torch.device | str = "cuda", nbytes_: int = 2**30,
                   repeats: int = 20) -> float:
    """Device-to-device copy bandwidth in GB/s (bytes read + bytes written per second)."""
    device = torch.device(device)
    src = torch.empty(nbytes_, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    # a copy is bound by memory, not the SM clock: no long warm-up (and 2 s of back-to-back
    # 1 GiB copies would heat the memory before the kernels are timed)
    t = Timer(device, first_warmup_s=0.0).run({"copy": lambda: dst.copy_(src)}, warmup=3,
                                              repeats=repeats)["copy"]
    return 2 * src.numel() / t / 1e9
