"""Fixed malloc thresholds, so that what a computation costs does not depend on the process's past.

glibc's malloc serves a large block (a torch temporary of a few MB) from a fresh `mmap` until it
has seen such a block freed; it then raises its mmap threshold and serves later ones from its
heap, and it gives the top of the heap back to Linux (`M_TRIM_THRESHOLD`) by a rule that moves
too. A block from a fresh mapping costs a page fault per 4 KiB page on first touch. So the same
call costs more in one process than in another, depending on what that process did before:
lab 03's naive MLA step (4096 positions), after three warm-up calls, took 3808 page faults and
17.4-18.7 ms of CPU time per call with the default thresholds, 0 and 11.6-12.2 ms with
`steady()` (medians of 11 calls, three runs of `pytest -s tests/test_steady_malloc.py`,
2026-11-28). A speed check whose two sides run in two
processes, the tester and the student's kernel (autograder/tester.py), compared that step with
itself at 1.12-1.40x (`python -m autograder.labs --tester --runs 10 --loaded 4 lab03`, the
counter-example, before this module).

`steady()` sets both thresholds once (`mallopt`): blocks under 32 MiB come from the heap, and the
heap keeps up to 256 MiB of freed memory for reuse. Both sides of a check then pay the same for
the same work. The grader runs it in the tester and in every graded kernel before the first
cell (autograder/execute.py); a kernel that undoes it slows only itself.
"""
from __future__ import annotations

import ctypes

__all__ = ["steady", "MMAP_THRESHOLD", "TRIM_THRESHOLD"]

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3      # glibc's mallopt parameters (malloc.h)
MMAP_THRESHOLD = 32 << 20       # glibc's largest on 64-bit systems
TRIM_THRESHOLD = 256 << 20


def steady() -> bool:
    """Fix this process's malloc thresholds; False where the C library has no `mallopt`
    (not glibc): there, nothing changes."""
    try:
        mallopt = ctypes.CDLL(None).mallopt       # this process's C library (no search)
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and \
        bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
