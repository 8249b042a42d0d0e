"""What both GPU benchmark scripts share: interleaved timing with the L2 cache flushed before
each call, and the bytes a call must move."""
from __future__ import annotations

import statistics
import time

import torch


def nbytes(*tensors) -> int:
    """Bytes held by the tensors (None is skipped): what a call must read or write once."""
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


class Timer:
    """Interleaved timing of several calls: CUDA events with the L2 flushed before each call on
    a GPU, perf_counter on the CPU (dry runs only)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.flush_buf = torch.ones(256 * 2**20 // 4, dtype=torch.float32, device=device)

    def flush(self):
        if self.cuda:
            self.flush_buf.sum()  # reads 256 MiB: evicts everything else from L2

    def run(self, fns: dict, warmup: int, repeats: int) -> dict:
        for _ in range(warmup):
            for fn in fns.values():
                fn()
        if not self.cuda:
            times = {name: [] for name in fns}
            for _ in range(repeats):
                for name, fn in fns.items():
                    t0 = time.perf_counter()
                    fn()
                    times[name].append(time.perf_counter() - t0)
            return {name: statistics.median(ts) for name, ts in times.items()}
        torch.cuda.synchronize()
        events = {name: [] for name in fns}
        for _ in range(repeats):
            for name, fn in fns.items():
                self.flush()
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                events[name].append((start, end))
        torch.cuda.synchronize()
        return {name: statistics.median(s.elapsed_time(e) / 1e3 for s, e in pairs)
                for name, pairs in events.items()}
