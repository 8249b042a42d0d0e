"""Checks for the Triton kernels students write (labs 04 and 07).

A graded kernel cell holds a `@triton.jit` function; the lab's trusted launcher (in
autograder/labs/labNN.py) runs it on inputs the check chooses. Three things make the grade mean
"the student wrote this kernel in Triton":

* `assert_triton_kernel(kernel)`: the object is a bare Triton JIT function (no pre-run hooks or
  replaced methods: `assert_bare_kernel`) (compiled or interpreted)
  defined in the notebook, not one of the course's kernels; its source is the code that runs;
  every name it reads resolves to `triton.language`, `triton`, a few builtins (`range`, `min`,
  `max`...), a number, or another kernel-side `@triton.jit` helper from the notebook (checked
  the same way); attribute names are public (no `_x`, no `.handle`). So the body cannot call
  torch, numpy, `kernels` or `minillm`: on a GPU such code would not even compile, and in the
  CPU interpreter, where a kernel body is plain Python, the check refuses it before it runs.
* `fresh_kernel(kernel)`: what the launchers run (`launch`), a new kernel object built from
  the checked Python function, so nothing a notebook attached to its kernel objects runs; with
  the tests in the tester, `launch` and `assert_triton_kernel` run in the student's kernel,
  where the kernel object lives (autograder/remote.py, `kernel_side`);
* `course_kernels_disabled()`: every function of the course's kernel modules (launchers,
  references and the JIT kernels' Python functions) raises while the block runs; the expected
  values are computed before it.
* `nan_padded(t)` / `assert_padding_untouched(...)`: inputs and outputs live inside buffers
  whose surroundings hold NaN. The interpreter does not fault on an out-of-bounds load or
  store; here an unmasked tail load reads NaN into the result and an unmasked tail store
  overwrites the padding, and both fail with a message that names the mask.

`kernel_speed` / `check_kernel_speed` time a student's kernel against the course's on a GPU
(CUDA events, L2 flushed, interleaved, medians) next to a measured device-to-device copy. With
`dry_run=True` (no GPU) the same code path runs on the CPU at whatever size it is given, and
asserts nothing: the figures mean nothing there.
"""
from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import math
import sys
import textwrap
import types
from pathlib import Path

import numpy as np
import torch

from autograder.checks import reference_disabled
from autograder.remote import Remote, kernel_side
from minillm.gpu_timer import Timer, copy_bandwidth

try:
    import triton
    import triton.language as tl
    from triton.runtime.jit import JITFunction
    try:
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:                                   # pragma: no cover (older triton)
        InterpretedFunction = JITFunction
    _KERNEL_TYPES = (JITFunction, InterpretedFunction)
except ImportError:                                       # pragma: no cover (no triton)
    triton = tl = None
    _KERNEL_TYPES = ()

__all__ = ["assert_triton_kernel", "assert_bare_kernel", "fresh_kernel", "launch", "quiet_numpy",
           "course_kernels_disabled", "nan_padded",
           "assert_padding_untouched", "kernel_speed", "check_kernel_speed", "COURSE_KERNEL_MODULES"]

# the modules whose functions a student kernel must not lean on (kernels.formats, intmath and
# interpret hold layouts and helpers the labs use themselves and stay on)
COURSE_KERNEL_MODULES = ("kernels.dequant_matmul", "kernels.gemv", "kernels.dequant_ref",
                         "kernels.cpu_weight_only",
                         "kernels.paged_attention", "kernels.paged_attention_ref")
_TRUSTED_DIRS = tuple(str(Path(importlib.import_module(p).__file__).resolve().parent)
                      for p in ("kernels", "minillm", "autograder"))
_BUILTINS_OK = {"range", "min", "max", "abs", "int", "float", "bool", "len", "print",
                "True", "False", "None"}
_NUMBERS = (int, float, bool, type(None))
# public attributes of Triton's tensor (and of its dtypes): what a kernel may use on a value
_TENSOR_ATTRS = frozenset()
if tl is not None:
    _TYPES = [tl.tensor, tl.float32]
    try:                                       # instances (their attributes) where they build
        _TYPES += [tl.pointer_type(tl.float32), tl.block_type(tl.float32, [2])]
    except Exception:                          # pragma: no cover (another triton version)
        pass
    _TENSOR_ATTRS = frozenset(a for obj in _TYPES for a in dir(obj)
                              if not a.startswith("_")) - {"handle"} | {
        "dtype", "type", "shape", "numel", "element_ty", "scalar"}     # instance attributes


# --- is it a Triton kernel, written here, in Triton? --------------------------------------------
def _python_function(kernel, name: str):
    if not _KERNEL_TYPES or not isinstance(kernel, _KERNEL_TYPES):
        raise AssertionError(f"{name} must be a @triton.jit kernel, got {type(kernel).__name__}")
    fn = getattr(kernel, "fn", None)
    if not isinstance(fn, types.FunctionType):
        raise AssertionError(f"{name}: a @triton.jit kernel wraps a Python function, got "
                             f"{type(fn).__name__}")
    where = str(Path(fn.__code__.co_filename).resolve()) if not \
        fn.__code__.co_filename.startswith("<") else fn.__code__.co_filename
    if where.startswith(_TRUSTED_DIRS) or (fn.__module__ or "").split(".")[0] in \
            ("kernels", "minillm", "autograder"):
        raise AssertionError(f"{name} is the course's kernel {fn.__module__}.{fn.__qualname__}: "
                             f"write your own")
    return fn


def _source_tree(fn, name: str) -> ast.FunctionDef:
    try:
        src = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError) as e:
        raise AssertionError(f"{name}: cannot read the kernel's source ({e}); define it with "
                             f"@triton.jit in a notebook cell") from None
    tree = ast.parse(src)
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.FunctionDef) or \
            tree.body[0].name != fn.__name__:
        raise AssertionError(f"{name}: the kernel's source is not one function named "
                             f"{fn.__name__}")
    fdef = tree.body[0]
    # the source must be the code that runs: compile it (without decorators) and compare
    plain = ast.Module(body=[ast.FunctionDef(**{**{f: getattr(fdef, f) for f in fdef._fields},
                                                "decorator_list": []})], type_ignores=[])
    ast.fix_missing_locations(plain)
    code = compile(plain, fn.__code__.co_filename, "exec")
    compiled = next(c for c in code.co_consts if isinstance(c, types.CodeType))
    # (bytecode differs between the interpreter's rewritten function and a plain compile; the
    # names it can reach and its constants are what matter)
    if compiled.co_names != fn.__code__.co_names or \
            _consts(compiled) != _consts(fn.__code__):
        raise AssertionError(f"{name}: the kernel's code does not match its source")
    return fdef


def _consts(code: types.CodeType) -> tuple:
    return tuple(c for c in code.co_consts if not isinstance(c, types.CodeType))


def _local_names(fdef: ast.FunctionDef) -> set:
    names = {a.arg for a in fdef.args.args + fdef.args.kwonlyargs + fdef.args.posonlyargs}
    for node in ast.walk(fdef):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
    return names


def _dotted(node) -> list | None:
    """a.b.c -> ['a', 'b', 'c'] when the chain starts at a plain name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id] + parts[::-1]
    return None


_TRITON_DIR = str(Path(triton.__file__).resolve().parent) if triton is not None else None


def _defined_in(obj) -> str | None:
    """The file that defines `obj`: a module's file, a function's (or a JIT function's) code, a
    class's module file, else its type's."""
    if isinstance(obj, types.ModuleType):
        return getattr(obj, "__file__", None)
    code = getattr(obj, "__code__", None) or getattr(getattr(obj, "fn", None), "__code__", None)
    if isinstance(code, types.CodeType):
        return code.co_filename
    cls = obj if isinstance(obj, type) else type(obj)
    mod = sys.modules.get(getattr(cls, "__module__", ""), None)
    return getattr(mod, "__file__", None)


def _from_triton(obj) -> bool:
    """True for Triton's own modules, functions, classes and values: defined in a file of the
    installed triton package (a module or function the notebook made and named "triton..." is
    not)."""
    where = _defined_in(obj)
    if _TRITON_DIR is None or not where or where.startswith("<"):
        return False
    if isinstance(obj, types.ModuleType) and sys.modules.get(obj.__name__) is not obj:
        return False
    return str(Path(where).resolve()).startswith(_TRITON_DIR)


def _resolve_global(fn, name: str):
    if name in fn.__globals__:
        return fn.__globals__[name], True
    if name in _BUILTINS_OK and hasattr(builtins, name):
        return getattr(builtins, name), True
    return None, False


@kernel_side           # the student's kernel object lives in the kernel (autograder/remote.py)
def assert_triton_kernel(kernel, name: str = "the kernel", _seen: set | None = None) -> None:
    """AssertionError unless `kernel` is a @triton.jit function written in the notebook whose
    body uses only Triton (see the module docstring)."""
    seen = set() if _seen is None else _seen
    if id(kernel) in seen:
        return
    seen.add(id(kernel))
    fn = _python_function(kernel, name)
    if _seen is None:
        assert_bare_kernel(kernel, name)
    if fn.__closure__:
        raise AssertionError(f"{name}: a kernel must not close over outer variables "
                             f"({', '.join(fn.__code__.co_freevars)})")
    for d in (fn.__defaults__ or ()) + tuple((fn.__kwdefaults__ or {}).values()):
        if not isinstance(d, _NUMBERS) and not (tl is not None and isinstance(d, tl.constexpr)):
            raise AssertionError(f"{name}: default arguments must be numbers, got "
                                 f"{type(d).__name__}")
    fdef = _source_tree(fn, name)
    local = _local_names(fdef)
    for node in ast.walk(fdef):
        if isinstance(node, (ast.Import, ast.ImportFrom, ast.Global, ast.Nonlocal, ast.Lambda,
                             ast.ClassDef, ast.AsyncFunctionDef)) or \
                (isinstance(node, ast.FunctionDef) and node is not fdef):
            raise AssertionError(f"{name}: `{ast.unparse(node).splitlines()[0]}` has no place "
                                 f"in a Triton kernel")
        if isinstance(node, ast.Attribute):
            if node.attr.startswith("_") or node.attr == "handle":
                raise AssertionError(f"{name}: attribute .{node.attr} is off limits in a kernel")
            chain = _dotted(node)
            if chain is None or chain[0] in local:
                if node.attr not in _TENSOR_ATTRS and not isinstance(node.ctx, ast.Store):
                    raise AssertionError(f"{name}: .{node.attr} is not an attribute of a Triton "
                                         f"tensor")
                continue
            obj, ok = _resolve_global(fn, chain[0])
            for attr in chain[1:]:
                obj = getattr(obj, attr, None)
            if not ok or not _from_triton(obj):
                raise AssertionError(f"{name}: `{'.'.join(chain)}` is not part of Triton: a "
                                     f"kernel computes with tl.* only")
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            if node.id.startswith("__"):
                raise AssertionError(f"{name}: {node.id} is off limits in a kernel")
            if node.id in local:
                continue
            obj, ok = _resolve_global(fn, node.id)
            if not ok:
                raise AssertionError(f"{name}: unknown name {node.id!r}")
            if isinstance(obj, _KERNEL_TYPES):
                assert_triton_kernel(obj, f"{name} -> {node.id}", seen)
            elif isinstance(obj, _NUMBERS) or (tl is not None and isinstance(obj, tl.constexpr)):
                continue
            elif obj is getattr(builtins, node.id, object()) and node.id in _BUILTINS_OK:
                continue
            elif not (isinstance(obj, types.ModuleType) and _from_triton(obj)):
                raise AssertionError(f"{name} uses {node.id!r} ({type(obj).__name__}): a kernel "
                                     f"may only call tl.* and other @triton.jit functions, not "
                                     f"torch, numpy or the course's kernels")


# --- what the launchers run ---------------------------------------------------------------------
# In the interpreter a kernel's arithmetic is NumPy's, which warns on stderr about inf - inf or
# 0 / 0 even in lanes that a mask or tl.where then discards (a GPU says nothing), and nbgrader
# fails a graded cell that writes to stderr: the launchers silence NumPy's floating-point
# warnings while the kernel runs; NaN and inf that reach an output are what the checks judge.
def quiet_numpy():
    """A context in which NumPy's floating-point warnings are off (the launchers wrap each launch
    of a student's kernel in it)."""
    return np.errstate(all="ignore")


def launch(kernel, grid: tuple, *args, **kwargs) -> None:
    """`fresh_kernel(kernel)[grid](*args, **kwargs)` with NumPy's warnings off: what every
    launcher runs. With the tests in the tester (autograder/tester.py) `kernel` is a handle on
    the student's kernel object and the launch runs in the kernel (the student's Triton code
    is Python in the CPU interpreter and never runs in the tester): each tensor argument
    crosses with its whole buffer and its place in it (offset, shape, strides), so a strided
    view stays one and the NaN fences around a check's inputs and outputs cross too; the
    buffers come back with what the kernel wrote, fences included."""
    if isinstance(kernel, Remote):
        _launch_there(kernel, tuple(grid), [_strided(a) for a in args],
                      {k: _strided(v) for k, v in kwargs.items()})
        return
    with quiet_numpy():
        fresh_kernel(kernel)[grid](*args, **kwargs)


def _strided(v):
    """A tensor as {"buffer": its whole storage, 1-D, "offset", "shape", "stride"}."""
    if not isinstance(v, torch.Tensor):
        return v
    n = v.untyped_storage().nbytes() // v.element_size()
    whole = torch.empty(0, dtype=v.dtype, device=v.device).set_(v.untyped_storage(), 0, (n,),
                                                                  (1,))
    return {"buffer": whole, "offset": v.storage_offset(), "shape": list(v.shape),
            "stride": list(v.stride())}


@kernel_side
def _launch_there(kernel, grid: tuple, args: list, kwargs: dict) -> None:
    """(In the student's kernel) `launch`, on the buffers the tester sent."""
    def view(v):
        if type(v) is dict and set(v) == {"buffer", "offset", "shape", "stride"}:
            return v["buffer"].as_strided(v["shape"], v["stride"], v["offset"])
        return v
    launch(kernel, grid, *[view(a) for a in args], **{k: view(v) for k, v in kwargs.items()})


_FRESH: dict = {}       # id(python function) -> (that function, the kernel rebuilt from it)


def _rebuilt_function(fn, seen: dict):
    """fn with a private copy of its globals in which every @triton.jit helper it names is
    itself rebuilt from its Python function (fresh kernel objects, nothing attached to them)."""
    env = dict(fn.__globals__)
    for name in fn.__code__.co_names:
        obj = env.get(name)
        if _KERNEL_TYPES and isinstance(obj, _KERNEL_TYPES) and \
                isinstance(getattr(obj, "fn", None), types.FunctionType):
            if id(obj.fn) not in seen:
                seen[id(obj.fn)] = None                    # (no recursion in Triton anyway)
                seen[id(obj.fn)] = triton.jit(_rebuilt_function(obj.fn, seen))
            env[name] = seen[id(obj.fn)]
    new = types.FunctionType(fn.__code__, env, fn.__name__, fn.__defaults__, fn.__closure__)
    new.__kwdefaults__, new.__module__, new.__qualname__, new.__doc__ = \
        fn.__kwdefaults__, fn.__module__, fn.__qualname__, fn.__doc__
    return new


def fresh_kernel(kernel):
    """The kernel the launchers run: a new Triton kernel object made from `kernel`'s Python
    function (the code kernelcheck.assert_triton_kernel reads), its @triton.jit helpers rebuilt
    the same way. Whatever a notebook attached to its kernel objects -- pre-run hooks (Python
    that runs at each launch), a replaced `run` or `rewrite` -- stays behind. Cached per
    function, so a GPU compiles it once."""
    fn = getattr(kernel, "fn", None)
    if not _KERNEL_TYPES or not isinstance(kernel, _KERNEL_TYPES) or \
            not isinstance(fn, types.FunctionType):
        raise TypeError(f"expected a @triton.jit kernel, got {type(kernel).__name__}")
    hit = _FRESH.get(id(fn))
    if hit is None or hit[0] is not fn:
        hit = _FRESH[id(fn)] = (fn, triton.jit(_rebuilt_function(fn, {})))
    return hit[1]


def assert_bare_kernel(kernel, name: str) -> None:
    """The launchers run fresh_kernel(kernel), so Python attached to the kernel object never
    runs; say so plainly rather than fail on the missing output."""
    hooks = getattr(kernel, "pre_run_hooks", None)
    if hooks:
        raise AssertionError(f"{name} carries pre-run hooks ({len(hooks)}): Python that runs at "
                             f"each launch is not part of a kernel, and the check runs the "
                             f"kernel without it")
    shadowed = sorted(k for k in vars(kernel) if hasattr(type(kernel), k))
    if shadowed:
        raise AssertionError(f"{name}: the kernel object's {', '.join(shadowed)} was replaced; "
                             f"the check runs the @triton.jit function itself")


# --- the course's kernels off -----------------------------------------------------------------
def _course_functions() -> list[str]:
    names = []
    for modname in COURSE_KERNEL_MODULES:
        try:
            mod = importlib.import_module(modname)
        except ImportError:                                # triton missing: nothing to disable
            continue
        for attr, obj in sorted(vars(mod).items()):
            if isinstance(obj, types.FunctionType) and obj.__module__ == modname:
                names.append(f"{modname}.{attr}")
            elif _KERNEL_TYPES and isinstance(obj, _KERNEL_TYPES) and \
                    isinstance(getattr(obj, "fn", None), types.FunctionType):
                names.append(f"{modname}.{attr}.fn")
    return names


COURSE_FUNCTIONS = tuple(_course_functions())


def course_kernels_disabled():
    """Every function of the course's kernel modules raises while the block runs (the JIT
    kernels' Python functions too, which is what the interpreter executes)."""
    return reference_disabled(*COURSE_FUNCTIONS)


# --- NaN fences around inputs and outputs ------------------------------------------------------
def nan_padded(t: torch.Tensor, pad: int = 64, fill: float = math.nan) -> tuple[torch.Tensor,
                                                                                 torch.Tensor]:
    """(view, buffer): a copy of `t` (contiguous) in the middle of a 1-D buffer whose other
    elements are `fill` (NaN for floats, the dtype's largest value for integers). A kernel that
    reads past the tensor's end or before its start reads the fill."""
    flat = torch.empty(t.numel() + 2 * pad, dtype=t.dtype, device=t.device)
    if t.dtype.is_floating_point:
        flat.fill_(fill)
    else:
        flat.fill_(torch.iinfo(t.dtype).max)
    view = flat[pad:pad + t.numel()].view(t.shape)
    view.copy_(t)
    return view, flat


def assert_padding_untouched(buffer: torch.Tensor, view: torch.Tensor, name: str) -> None:
    """The elements of `buffer` outside `view` still hold the fill nan_padded wrote."""
    pad = (buffer.numel() - view.numel()) // 2
    outside = torch.cat([buffer[:pad], buffer[pad + view.numel():]])
    fresh = torch.isnan(outside) if buffer.dtype.is_floating_point else \
        outside == torch.iinfo(buffer.dtype).max
    if not bool(fresh.all()):
        raise AssertionError(f"{name}: the kernel wrote outside its output tensor (a store "
                             f"without a mask on the last, partial tile?)")


# --- speed on a GPU -----------------------------------------------------------------------------
def kernel_speed(student, reference, bytes_moved: int, *, dry_run: bool = False,
                 warmup: int = 5, repeats: int = 30) -> dict:
    """Median seconds per call of `student()` and `reference()` (interleaved, L2 flushed, CUDA
    events) and the device-copy bandwidth: {"student_s", "reference_s", "student_GBps",
    "copy_GBps", "fraction_of_copy", "ratio_to_reference"}. `bytes_moved` is what one call must
    read and write at least. dry_run: the CPU, perf_counter, tiny copy (figures meaningless)."""
    device = torch.device("cpu" if dry_run else "cuda")
    if not dry_run and not torch.cuda.is_available():
        raise RuntimeError("kernel_speed needs a CUDA GPU (dry_run=True runs the code path on "
                           "the CPU)")
    timer = Timer(device, first_warmup_s=0.0 if dry_run else 2.0)
    t = timer.run({"student": student, "reference": reference}, warmup=warmup, repeats=repeats)
    copy = copy_bandwidth(device, 2**20 if dry_run else 2**30, repeats=3 if dry_run else 20)
    student_gbps = bytes_moved / t["student"] / 1e9
    return {"student_s": t["student"], "reference_s": t["reference"],
            "student_GBps": student_gbps, "copy_GBps": copy,
            "fraction_of_copy": student_gbps / copy,
            "ratio_to_reference": t["reference"] / t["student"], "dry_run": dry_run}


def check_kernel_speed(student, reference, bytes_moved: int, *, what: str,
                       min_fraction_of_copy: float, min_ratio_to_reference: float,
                       dry_run: bool = False, **kw) -> dict:
    """kernel_speed(...), then AssertionError unless the student's kernel reaches both
    thresholds (on a GPU; a dry run asserts nothing and returns the figures)."""
    r = kernel_speed(student, reference, bytes_moved, dry_run=dry_run, **kw)
    if dry_run:
        return r
    if not (r["fraction_of_copy"] >= min_fraction_of_copy
            and r["ratio_to_reference"] >= min_ratio_to_reference):
        raise AssertionError(
            f"{what}: {r['student_GBps']:.0f} GB/s = {r['fraction_of_copy']:.0%} of a device "
            f"copy ({r['copy_GBps']:.0f} GB/s; at least {min_fraction_of_copy:.0%} needed) and "
            f"{r['ratio_to_reference']:.2f}x the course's kernel's speed (at least "
            f"{min_ratio_to_reference:.2f}x needed)")
    return r
