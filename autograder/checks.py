"""Helpers for nbgrader test cells: `assert_close` (`assert_close_shown` in hidden tests),
`reference_disabled`, `WorkCounter`, `data_ptr`.

Everything these helpers call (torch functions, the hook registration, getattr/setattr...) is
bound when `autograder` is imported, which the grader does before the first notebook cell runs,
so a submission that monkeypatches torch or builtins afterwards cannot change their verdict.

`reference_disabled` disables the reference function objects themselves, by swapping their
`__code__` for code that raises, so every alias of them fails while the block runs (see its
docstring for what it covers and its one known gap: a copy of the reference's code object or
source taken before the block).
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import math
import types
from typing import Any

import numpy as np
import torch

from minillm.timing import WorkCounter

from .judge import evidence
from .tolerance import within_tolerance

__all__ = ["assert_close", "assert_close_shown", "reference_disabled", "ReferenceGuard",
           "WorkCounter", "data_ptr", "KERNEL_ADDRESS"]

# --- captured at import -----------------------------------------------------------------------
_Tensor = torch.Tensor
_no_torch_function = torch._C.DisableTorchFunction     # no subclass or mode of the student's
_as_tensor = torch.as_tensor
_is_tensor = torch.is_tensor
_isnan = torch.isnan
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
_hasattr, _id, _len, _type, _all, _list, _set, _reversed = \
    hasattr, id, len, type, all, list, set, reversed
_compile, _exec, _range = compile, exec, range
_FunctionType, _MethodType = types.FunctionType, types.MethodType
_staticmethod, _classmethod, _property = staticmethod, classmethod, property
_cached_property = functools.cached_property


# --- data_ptr ---------------------------------------------------------------------------------
# The attribute autograder/remote.py sets on a tensor the student's kernel sent to the tester:
# the address its data had in the kernel.
KERNEL_ADDRESS = "_kernel_data_ptr"


def data_ptr(t) -> int:
    """`t.data_ptr()`, the address of t's first element, so that a test can check that two
    tensors share memory (a view of a buffer, not a copy; a buffer allocated once). For a tensor
    that crossed from the student's kernel to the tester (a lab whose tests run in the tester,
    autograder/remote.py) it is the address the tensor had in the kernel, as the kernel
    reported it: the tester's copy lives elsewhere."""
    address = _getattr(t, KERNEL_ADDRESS, None)
    return t.data_ptr() if address is None else address


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
        if _type(t) is not _Tensor:
            t = t.as_subclass(_Tensor)
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
    with _no_torch_function():       # a Tensor subclass's or a mode's __torch_function__
        _assert_close(actual, expected, atol=atol, rtol=rtol, name=name)     # decides nothing


def assert_close_shown(actual: Any, expected: Any, *, atol: float = 1e-5, rtol: float = 1e-5,
                       name: str = "value") -> None:
    """A hidden test's value check: show the grader `actual` under `name` (autograder/judge.py)
    with twice this check's tolerance, then `assert_close` it. The grader compares the shown
    value with the reference run's, so twice the tolerance lets through every value that passes
    the assertion here (the reference's value passed it too)."""
    evidence(actual, name, atol=2 * atol, rtol=2 * rtol)
    assert_close(actual, expected, atol=atol, rtol=rtol, name=name)


def _assert_close(actual, expected, *, atol, rtol, name) -> None:
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
    ok = within_tolerance(a64, e64, atol=atol, rtol=rtol)
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
# id(function) -> (function, its own code object), for every function some active block disabled.
# The entry keeps the function alive, so its id stays unique while it is listed.
_disabled: dict[int, tuple[Any, Any]] = {}       # id -> (function, its original code)


def _resolve(dotted: str):
    """'pkg.mod.Class.attr' -> the object that name refers to now."""
    parts = dotted.split(".")
    if _len(parts) < 2 or not _all(parts):
        raise ValueError(f"expected a dotted name like 'minillm.sampling.top_p_filter', "
                         f"got {dotted!r}")
    owner, rest = None, None
    for cut in _range(_len(parts) - 1, 0, -1):      # longest importable module prefix
        try:
            owner = _import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        rest = parts[cut:]
        break
    if owner is None:
        raise ValueError(f"cannot import any module prefix of {dotted!r}")
    for attr in rest:
        if not _hasattr(owner, attr):
            raise ValueError(f"{dotted!r}: {owner!r} has no attribute {attr!r}")
        owner = _getattr(owner, attr)
    return owner


def _functions_in(value, found: list, seen: set) -> None:
    """Append to `found` the Python functions whose code runs when `value` is called or used:
    a function and the functions it wraps (`__wrapped__`, left by functools.wraps and decorators
    such as torch.no_grad()), the function of a bound method, staticmethod or classmethod, and
    the getter/setter/deleter of a property."""
    while _isinstance(value, _MethodType):
        value = value.__func__
    if _isinstance(value, (_staticmethod, _classmethod)):
        _functions_in(value.__func__, found, seen)
    elif _isinstance(value, _property):
        for accessor in (value.fget, value.fset, value.fdel):
            if accessor is not None:
                _functions_in(accessor, found, seen)
    elif _isinstance(value, _cached_property):
        _functions_in(value.func, found, seen)
    elif _isinstance(value, _FunctionType) and _id(value) not in seen:
        seen.add(_id(value))
        found.append(value)
        wrapped = _getattr(value, "__wrapped__", None)
        if wrapped is not None:
            _functions_in(wrapped, found, seen)


def _functions_to_disable(dotted: str, obj) -> list:
    """The functions whose code `reference_disabled(dotted)` swaps. For a class: those defined in
    its own body (methods, static/class methods, property accessors, dunders; not what it
    inherits), counted as the class's when they come from the class's module or carry its
    qualified name, so a helper of some other library assigned in the body is left alone."""
    found: list = []
    if _isinstance(obj, _type):
        module = obj.__dict__.get("__module__")
        prefix = f"{_getattr(obj, '__qualname__', obj.__name__)}."
        candidates: list = []
        for value in _list(obj.__dict__.values()):
            _functions_in(value, candidates, _set())
        for f in candidates:
            if (f.__module__ == module or f.__qualname__.startswith(prefix)) and f not in found:
                found.append(f)
        if not found:
            raise ValueError(f"cannot disable {dotted!r}: class {obj.__qualname__} defines no "
                             f"Python functions of its own (a builtin or C-extension class?)")
        return found
    _functions_in(obj, found, _set())
    if not found:
        raise ValueError(f"cannot disable {dotted!r}: it is a {_type(obj).__name__}, not a Python "
                         f"function or class (builtins, C functions and modules cannot be "
                         f"disabled)")
    return found


def _guard_code(message: str, original):
    """A code object that raises AssertionError(message) whatever it is called with, with as many
    free variables as `original` (assigning __code__ requires that). The message is a constant of
    the code and `assert` loads AssertionError without a global lookup (compiled with
    optimize=0, so it is kept under `python -O`), so nothing in the function's own __globals__
    (the reference module's) or in builtins can change what it does."""
    n_free = _len(original.co_freevars)
    free = [f"_ag_free{i}" for i in _range(n_free)]
    lines = ["def _ag_outer():"]
    lines += [f"    {name} = None" for name in free]
    lines += ["    def _ag_guard(*_ag_args, **_ag_kwargs):",
              f"        assert False, {message!r}"]
    if free:                                        # never runs; makes the names free variables
        lines.append(f"        ({', '.join(free)},)")
    lines.append("    return _ag_guard")
    namespace: dict = {"__builtins__": {}}
    _exec(_compile("\n".join(lines) + "\n", "<autograder: reference disabled>", "exec",
                   dont_inherit=True, optimize=0), namespace)
    code = namespace["_ag_outer"]().__code__
    return code.replace(co_name=original.co_name)


class ReferenceGuard:
    """`reference_disabled` prepared once and entered any number of times.

    The names are resolved and the guard code compiled when the object is made; entering swaps
    the functions' code objects and leaving restores them (also when the block raises), so a
    speed check can disable the references around each call of the student's code and leave
    them working for its own baseline in between, at a few microseconds per call.
    """

    def __init__(self, *dotted_names: str):
        self._targets: list = []                    # (function, guard code)
        for dotted in dotted_names:                 # resolve (and import) everything first
            message = (f"{dotted} is disabled during grading: this check compares your code with "
                       f"the reference, so implement it yourself instead of calling {dotted}")
            for f in _functions_to_disable(dotted, _resolve(dotted)):
                self._targets.append((f, _guard_code(message, _getattr(f, "__code__"))))
        self._entered: list = []                    # per open block: the functions it disabled

    def __enter__(self) -> "ReferenceGuard":
        mine: list = []
        try:
            for f, guard in self._targets:
                if _id(f) in _disabled and _getattr(f, "__code__").co_filename == \
                        "<autograder: reference disabled>":
                    continue                        # an outer block (or an earlier name) has it
                original = _getattr(f, "__code__")
                _setattr(f, "__code__", guard)
                _disabled[_id(f)] = (f, original)
                mine.append(f)
        except BaseException:
            _restore(mine)
            raise
        self._entered.append(mine)
        return self

    def __exit__(self, *exc) -> None:
        _restore(self._entered.pop())


def _restore(functions: list) -> None:
    for f in _reversed(functions):
        _, original = _disabled.pop(_id(f))
        _setattr(f, "__code__", original)


@contextlib.contextmanager
def reference_disabled(*dotted_names: str):
    """Make each named reference ("minillm.sampling.top_p_filter") raise AssertionError while the
    block runs, so a solution that delegates to the reference fails.

    What is disabled is the function object itself: its `__code__` is swapped for code that
    raises "<name> is disabled during grading: ... implement it yourself instead of calling
    <name>", whatever the arguments (generators and async functions raise on the call). So every
    alias of the object fails, however it is reached: an imported name, a default argument, a
    closure, a list or dict, a functools.partial, a student class's attribute, the reference's
    own internal callers. A decorated reference is disabled together with the functions it wraps
    (`__wrapped__`). For a reference class, every function defined in its body (methods,
    static/class methods, property accessors, `__init__`, `__call__`...; not inherited ones) is
    disabled, so its instances, bound methods and subclasses hit the guard too. A name that
    refers to a method or property of a class disables just that.

    Everything is restored on exit, also when the block raises. Blocks nest: an inner block
    naming an already disabled function leaves it to the outer one. Builtins, C functions and
    modules cannot be disabled (ValueError), nor can unknown names.

    Limit: a submission that copies the reference's code object (`f.__code__`) into a new
    function, or its source text, before the block runs keeps a working copy; this guard does
    not stop that.
    """
    with ReferenceGuard(*dotted_names):
        yield


# --- WorkCounter ------------------------------------------------------------------------------
