"""Helpers for nbgrader test cells: `assert_close`, `reference_disabled`, `WorkCounter`.

Everything these helpers call (torch functions, the hook registration, getattr/setattr...) is
bound when `autograder` is imported, which the grader does before the first notebook cell runs,
so a submission that monkeypatches torch or builtins afterwards cannot change their verdict.
"""
from __future__ import annotations

import contextlib
import importlib
import math
import sys
from typing import Any

import numpy as np
import torch

__all__ = ["assert_close", "reference_disabled", "WorkCounter"]

# --- captured at import -----------------------------------------------------------------------
_Tensor = torch.Tensor
_as_tensor = torch.as_tensor
_is_tensor = torch.is_tensor
_isclose = torch.isclose
_isnan = torch.isnan
_eq = torch.eq
_abs = torch.abs
_argmax = torch.argmax
_where = torch.where
_zeros_like = torch.zeros_like
_float64 = torch.float64
_ndarray = np.ndarray
_np_asarray = np.asarray
_unravel = np.unravel_index
_register_pre_hook = torch.nn.Module.register_forward_pre_hook
_Module = torch.nn.Module
_import_module = importlib.import_module
_getattr, _setattr, _isinstance, _callable = getattr, setattr, isinstance, callable
_modules = sys.modules


# --- assert_close -----------------------------------------------------------------------------
def _describe(x) -> str:
    if _is_tensor(x):
        return f"torch.Tensor {tuple(x.shape)} {x.dtype}"
    if _isinstance(x, _ndarray):
        return f"numpy.ndarray {x.shape} {x.dtype}"
    return type(x).__name__


def _to_tensor(x, name: str, which: str) -> torch.Tensor:
    if _is_tensor(x):
        t = x.detach()
        if t.is_complex():
            raise AssertionError(f"{name}: complex {which} values are not supported")
        return t.cpu()
    try:
        arr = _np_asarray(x)
    except Exception as e:          # ragged lists and the like
        raise AssertionError(f"{name}: cannot read {which} {type(x).__name__} as an array: {e}")
    if arr.dtype == object or arr.dtype.kind not in "biuf":
        raise AssertionError(f"{name}: {which} must be numbers (a tensor, array, float or "
                             f"nested list), got {type(x).__name__} "
                             f"{arr.dtype if arr.dtype != object else ''}".rstrip())
    return _as_tensor(arr)


def _fmt(v: float) -> str:
    return f"{v:.6g}"


def assert_close(actual: Any, expected: Any, *, atol: float = 1e-5, rtol: float = 1e-5,
                 name: str = "value") -> None:
    """Check |actual - expected| <= atol + rtol * |expected| elementwise.

    Works on torch tensors, numpy arrays, Python numbers and nested lists. Infinities must match
    exactly and NaN matches NaN. On failure the AssertionError says what differs: the shapes, the
    dtypes (when both sides are tensors or both are arrays), or how many elements are off, the
    largest absolute and relative differences and, at the worst element, both values.
    """
    if actual is None:
        raise AssertionError(f"{name}: got None (did the function forget to `return`?), "
                             f"expected {_describe(expected)}")
    a = _to_tensor(actual, name, "actual")
    e = _to_tensor(expected, name, "expected")
    if tuple(a.shape) != tuple(e.shape):
        raise AssertionError(f"{name}: shape mismatch: actual {tuple(a.shape)} vs expected "
                             f"{tuple(e.shape)}")
    same_kind = (_is_tensor(actual) and _is_tensor(expected)) or \
        (_isinstance(actual, _ndarray) and _isinstance(expected, _ndarray))
    if same_kind and actual.dtype != expected.dtype:
        raise AssertionError(f"{name}: dtype mismatch: actual {actual.dtype} vs expected "
                             f"{expected.dtype}")
    if a.numel() == 0:
        return
    a64, e64 = a.to(_float64), e.to(_float64)
    ok = _isclose(a64, e64, rtol=rtol, atol=atol, equal_nan=True) | _eq(a64, e64)
    if bool(ok.all()):
        return
    bad = ~ok
    n_bad, n = int(bad.sum()), a64.numel()
    diff = _abs(a64 - e64)
    diff = _where(_isnan(diff), _zeros_like(diff) + math.inf, diff)     # nan / inf mismatches
    diff = _where(bad, diff, _zeros_like(diff))
    rel = diff / _abs(e64)
    rel = _where(_isnan(rel), _zeros_like(rel) + math.inf, rel)
    rel = _where(bad, rel, _zeros_like(rel))

    def at(flat_idx: int) -> str:
        idx = tuple(int(i) for i in _unravel(flat_idx, tuple(a64.shape))) if a64.dim() else ()
        where = f"index {idx if len(idx) != 1 else idx[0]}" if idx else "the scalar"
        return (f"{where}: actual {_fmt(float(a64.reshape(-1)[flat_idx]))} vs expected "
                f"{_fmt(float(e64.reshape(-1)[flat_idx]))}")

    i_abs = int(_argmax(diff.reshape(-1)))
    i_rel = int(_argmax(rel.reshape(-1)))
    msg = (f"{name}: {n_bad} of {n} element{'s' if n != 1 else ''} differ "
           f"(atol={atol:g}, rtol={rtol:g}); max abs diff {_fmt(float(diff.reshape(-1)[i_abs]))}"
           f" at {at(i_abs)}; max rel diff {_fmt(float(rel.reshape(-1)[i_rel]))}")
    msg += f" at {at(i_rel)}" if i_rel != i_abs else " (same element)"
    raise AssertionError(msg)


# --- reference_disabled -----------------------------------------------------------------------
def _resolve(dotted: str):
    """'pkg.mod.Class.attr' -> (owner object, attribute name, current value)."""
    parts = dotted.split(".")
    if len(parts) < 2 or not all(parts):
        raise ValueError(f"expected a dotted name like 'minillm.sampling.top_p_filter', "
                         f"got {dotted!r}")
    owner, rest = None, None
    for cut in range(len(parts) - 1, 0, -1):        # longest importable module prefix
        try:
            owner = _import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        rest = parts[cut:]
        break
    if owner is None:
        raise ValueError(f"cannot import any module prefix of {dotted!r}")
    for attr in rest[:-1]:
        owner = _getattr(owner, attr)
    if not hasattr(owner, rest[-1]):
        raise ValueError(f"{dotted!r}: {owner!r} has no attribute {rest[-1]!r}")
    return owner, rest[-1], _getattr(owner, rest[-1])


def _make_guard(dotted: str, original):
    message = (f"{dotted} is disabled during grading: this check compares your code with the "
               f"reference, so implement it yourself instead of calling {dotted}")

    def disabled(*args, **kwargs):
        raise AssertionError(message)

    disabled.__name__ = _getattr(original, "__name__", dotted.rsplit(".", 1)[-1])
    disabled.__qualname__ = disabled.__name__
    disabled.__doc__ = message
    disabled.__autograder_disabled__ = dotted
    return disabled


def _alias_namespaces(root_pkg: str) -> list[dict]:
    """Namespaces searched for aliases: the notebook (__main__) and every loaded module of the
    package the name belongs to (so `from .sampling import sample` in a sibling module is
    guarded as well)."""
    spaces = []
    main = _modules.get("__main__")
    if main is not None:
        spaces.append(main.__dict__)
    for modname, mod in list(_modules.items()):
        if mod is None or modname == "__main__":
            continue
        if modname == root_pkg or modname.startswith(root_pkg + "."):
            d = _getattr(mod, "__dict__", None)
            if _isinstance(d, dict):
                spaces.append(d)
    return spaces


@contextlib.contextmanager
def reference_disabled(*dotted_names: str):
    """Replace each reference function (e.g. "minillm.sampling.top_p_filter") by one that raises
    AssertionError while the block runs, so a solution that delegates to the reference fails.

    Besides the attribute itself, every alias of the same object in the notebook's namespace
    (`from minillm.sampling import top_p_filter as f`) and in the loaded modules of the same
    package is replaced; internal callers that look the name up through their module hit the guard
    too. Everything is restored on exit, also when the block raises.
    """
    replaced: list[tuple[Any, str, Any, Any]] = []      # (owner, attr, original, guard)
    aliased: list[tuple[dict, str, Any, Any]] = []      # (namespace, key, original, guard)
    try:
        for dotted in dotted_names:
            owner, attr, original = _resolve(dotted)
            if _getattr(original, "__autograder_disabled__", None):
                continue                                # already disabled by an outer block
            guard = _make_guard(dotted, original)
            _setattr(owner, attr, guard)
            replaced.append((owner, attr, original, guard))
            for ns in _alias_namespaces(dotted.split(".", 1)[0]):
                for key, value in list(ns.items()):
                    if value is original:
                        ns[key] = guard
                        aliased.append((ns, key, original, guard))
        yield
    finally:
        for ns, key, original, guard in reversed(aliased):
            if ns.get(key) is guard:                    # leave names the block rebound alone
                ns[key] = original
        for owner, attr, original, guard in reversed(replaced):
            _setattr(owner, attr, original)


# --- WorkCounter ------------------------------------------------------------------------------
class WorkCounter:
    """Count the work a model does while the block runs.

        with WorkCounter(model) as work:
            generate(model, prompt, ...)
        work.calls    # forward calls of `model`
        work.tokens   # sum over those calls of ids.numel() (first positional or `ids` argument)

    Uses a forward pre-hook on `model` (so `model(ids)` is counted, a direct `model.forward(...)`
    is not), removed on exit.
    """

    def __init__(self, model: torch.nn.Module):
        if not _isinstance(model, _Module):
            raise TypeError(f"WorkCounter needs a torch.nn.Module, got {type(model).__name__}")
        self.model = model
        self.calls = 0
        self.tokens = 0
        self._handle = None

    def _hook(self, module, args, kwargs):
        self.calls += 1
        ids = args[0] if args else kwargs.get("ids")
        if _is_tensor(ids):
            self.tokens += int(ids.numel())
        return None

    def __enter__(self) -> "WorkCounter":
        if self._handle is not None:
            raise RuntimeError("WorkCounter is already active")
        self.calls = 0
        self.tokens = 0
        self._handle = _register_pre_hook(self.model, self._hook, with_kwargs=True)
        return self

    def __exit__(self, *exc) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def __repr__(self) -> str:
        return f"WorkCounter(calls={self.calls}, tokens={self.tokens})"
