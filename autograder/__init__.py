"""minillm autograder: helpers for nbgrader test cells, and the release / grade / selfgrade CLI.

Test-cell helpers (autograder/README.md, "Writing tests"):

    import autograder as ag
    ag.assert_close(top_p_filter(logits, 0.9), expected, name="top_p_filter(logits, 0.9)")
    ag.check_ratio(baseline, candidate, at_least=2, what="cached vs naive")
    from autograder.labs import lab00            # the lab's probes (autograder/probes.py)
    tokens = lab00.greedy_tokens(generate, prompt, 9)

Command line: python -m autograder release | grade | selfgrade | report.

The helpers load on first use, so that the grader's own processes (the CLI, one job process per
submission) start without torch.
"""
from __future__ import annotations

import importlib

_HOME = {"assert_close": "checks", "WorkCounter": "checks", "time_ratio": "timing",
         "check_ratio": "timing", "RatioResult": "timing", "cuda_sync": "timing"}
__all__ = list(_HOME)


def __getattr__(name: str):
    if name in _HOME:
        value = getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
