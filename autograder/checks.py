"""Test-cell helpers. They run in the tester, on values it holds: nothing here defends against
student code.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from minillm.bench.timing import WorkCounter

__all__ = ["assert_close", "WorkCounter"]


def _describe(x) -> str:
    if torch.is_tensor(x):
        return f"torch.Tensor {tuple(x.shape)} {x.dtype}"
    if isinstance(x, np.ndarray):
        return f"numpy.ndarray {x.shape} {x.dtype}"
    return type(x).__name__


def _to_tensor(x, name: str, which: str) -> torch.Tensor:
    if torch.is_tensor(x):
        t = x.detach()
        if type(t) is not torch.Tensor:
            t = t.as_subclass(torch.Tensor)
        if t.is_complex():
            raise AssertionError(f"{name}: complex {which} values are not supported")
        return t.cpu()
    try:
        arr = np.asarray(x)
    except Exception as e:          # ragged lists and the like
        raise AssertionError(f"{name}: cannot read {which} {type(x).__name__} as an array: {e}")
    if arr.dtype == object or arr.dtype.kind not in "biuf":
        raise AssertionError(f"{name}: {which} must be numbers (a tensor, array, float or "
                             f"nested list), got {type(x).__name__} "
                             f"{arr.dtype if arr.dtype != object else ''}".rstrip())
    return torch.as_tensor(arr)


def _fmt(v: float) -> str:
    return f"{v:.6g}"


def assert_close(actual: Any, expected: Any, *, atol: float = 1e-5, rtol: float = 1e-5,
                 name: str = "value") -> None:
    """Elementwise closeness of tensors, arrays, numbers or nested lists; the AssertionError
    says what differs, where and by how much."""
    if actual is None:
        raise AssertionError(f"{name}: got None (did the function forget to `return`?), "
                             f"expected {_describe(expected)}")
    a = _to_tensor(actual, name, "actual")
    e = _to_tensor(expected, name, "expected")
    if tuple(a.shape) != tuple(e.shape):
        raise AssertionError(f"{name}: shape mismatch: actual {tuple(a.shape)} vs expected "
                             f"{tuple(e.shape)}")
    same_kind = (torch.is_tensor(actual) and torch.is_tensor(expected)) or \
        (isinstance(actual, np.ndarray) and isinstance(expected, np.ndarray))
    if same_kind and actual.dtype != expected.dtype:
        raise AssertionError(f"{name}: dtype mismatch: actual {actual.dtype} vs expected "
                             f"{expected.dtype}")
    if a.numel() == 0:
        return
    a64, e64 = a.to(torch.float64), e.to(torch.float64)
    # |actual - expected| <= atol + rtol * |expected|; NaN matches NaN, inf only itself
    ok = torch.isclose(a64, e64, rtol=rtol, atol=atol, equal_nan=True) | torch.eq(a64, e64)
    if bool(ok.all()):
        return
    bad = ~ok
    n_bad, n = int(bad.sum()), a64.numel()
    diff = torch.abs(a64 - e64)
    diff = torch.where(torch.isnan(diff), torch.zeros_like(diff) + math.inf, diff)  # nan / inf
    diff = torch.where(bad, diff, torch.zeros_like(diff))
    rel = diff / torch.abs(e64)
    rel = torch.where(torch.isnan(rel), torch.zeros_like(rel) + math.inf, rel)
    rel = torch.where(bad, rel, torch.zeros_like(rel))

    def at(flat_idx: int) -> str:
        idx = tuple(map(int, np.unravel_index(flat_idx, tuple(a64.shape)))) if a64.dim() else ()
        where = f"index {idx if len(idx) != 1 else idx[0]}" if idx else "the scalar"
        return (f"{where}: actual {_fmt(float(a64.reshape(-1)[flat_idx]))} vs expected "
                f"{_fmt(float(e64.reshape(-1)[flat_idx]))}")

    i_abs = int(torch.argmax(diff.reshape(-1)))
    i_rel = int(torch.argmax(rel.reshape(-1)))
    msg = (f"{name}: {n_bad} of {n} element{'s' if n != 1 else ''} differ "
           f"(atol={atol:g}, rtol={rtol:g}); max abs diff {_fmt(float(diff.reshape(-1)[i_abs]))}"
           f" at {at(i_abs)}; max rel diff {_fmt(float(rel.reshape(-1)[i_rel]))}")
    msg += f" at {at(i_rel)}" if i_rel != i_abs else " (same element)"
    raise AssertionError(msg)
