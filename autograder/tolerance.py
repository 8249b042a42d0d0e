"""The one rule by which the course compares values: `within_tolerance`.

`checks.assert_close` applies it in the kernel, to what a test computed; the grader's judge
(autograder/judge.py) applies it outside the kernel, to the values a test showed against the
reference run's. The torch functions it calls are bound at import, which the grader does before
any notebook cell runs (autograder/__init__.py's `bind`), as the checks' own are.
"""
from __future__ import annotations

import torch

__all__ = ["within_tolerance"]

_isclose, _eq = torch.isclose, torch.eq


def within_tolerance(actual: torch.Tensor, expected: torch.Tensor, *, atol: float,
                     rtol: float) -> torch.Tensor:
    """Elementwise, on two float64 tensors of one shape: |actual - expected| <= atol + rtol *
    |expected|; NaN matches NaN, and an infinity only the same infinity."""
    return _isclose(actual, expected, rtol=rtol, atol=atol, equal_nan=True) | _eq(actual, expected)
