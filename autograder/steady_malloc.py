"""Fixed malloc thresholds, so that what a computation costs does not depend on the process's past.

glibc serves a large block from a fresh `mmap` (a page fault per 4 KiB on first touch) until it
sees one freed, then raises its mmap threshold; its trim threshold moves too. Lab 03's naive MLA
step took 3808 page faults and 17.4-18.7 ms per call by default, 0 and 11.6-12.2 ms with
`steady()` (tests/test_steady_malloc.py, 2026-11-28), and a speed check across the tester and
the kernel compared it with itself at 1.12-1.40x. `steady()` runs in the tester and in every
graded kernel before the first cell (autograder/execute.py).
"""
from __future__ import annotations

import ctypes

__all__ = ["steady", "MMAP_THRESHOLD", "TRIM_THRESHOLD"]

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3      # glibc's mallopt parameters (malloc.h)
MMAP_THRESHOLD = 32 << 20       # glibc's largest on 64-bit systems
TRIM_THRESHOLD = 256 << 20


def steady() -> bool:
    """Fix this process's malloc thresholds; False (nothing changed) without glibc's mallopt."""
    try:
        mallopt = ctypes.CDLL(None).mallopt       # this process's C library (no search)
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and \
        bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
