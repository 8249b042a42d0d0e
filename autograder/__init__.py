"""minillm autograder: helpers for nbgrader test cells, and the release / grade / selfgrade CLI.

Test-cell helpers (import them in graded cells):

    from autograder import assert_close, reference_disabled, WorkCounter, time_ratio, check_ratio

    with reference_disabled("minillm.sampling.top_p_filter"):
        assert_close(top_p_filter(logits, 0.9), expected, name="top_p_filter(logits, 0.9)")
    with WorkCounter(model) as work:
        generate(model, prompt, n)
    assert work.tokens == len(prompt) + n - 1
    check_ratio(lambda: naive(x), lambda: cached(x), at_least=2, what="cached vs naive")
    # hidden tests also show the grader what they check (autograder/judge.py):
    assert_close_shown(out, expected, atol=1e-5, name="top_p_filter(logits, 0.9)")
    evidence([len(out), work.calls], "tokens, calls")      # a value checked another way
    assert data_ptr(view) == data_ptr(buffer)               # a view, not a copy

Command line (see autograder/README.md): python -m autograder release | grade | selfgrade.

The helpers load on first use, so that the grader's own processes (the CLI, one job process per
submission) start without torch. `bind()` loads them all at once and binds the clock, the median
and the torch functions the checks use: the grader runs it in the kernel before any notebook cell
runs (autograder/execute.py, autograder/sealed.py), so student code cannot patch them first.
"""
from __future__ import annotations

import importlib

_HOME = {"assert_close": "checks", "assert_close_shown": "checks", "reference_disabled": "checks",
         "WorkCounter": "checks", "time_ratio": "timing", "check_ratio": "timing",
         "RatioResult": "timing", "cuda_sync": "timing", "evidence": "judge", "data_ptr": "checks"}
__all__ = list(_HOME)


def bind() -> None:
    """Import every helper and bind it as an attribute of this package."""
    g = globals()
    for name, module in _HOME.items():
        g[name] = getattr(importlib.import_module(f"{__name__}.{module}"), name)


def __getattr__(name: str):
    if name in _HOME:
        bind()
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
