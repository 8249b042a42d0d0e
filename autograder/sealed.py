"""Sealed cells: the locked cells of a graded notebook run by trusted code, their verdicts signed.

A graded notebook runs student code and the course's test code in one Python process, so a
solution cell can reach everything a test uses: it can rebind `ag`, replace
`autograder.assert_close`, swallow errors with an IPython exception hook, or rewrite later
cells with an input transformer. The grader therefore does not trust the notebook's outputs
for a locked cell. Instead (see autograder/execute.py):

* the executor replaces the source of every locked cell (setup cells and test cells) by a stub,
  `__import__("autograder.sealed").sealed.run("<random key>")`, and hands the real sources and
  a fresh secret to this module in a file that `install` reads and deletes before any student
  code runs;
* `install` adds a Python audit hook (PEP 578). An audit hook cannot be removed, and nothing
  lists it, so the secret and the sources live where student code cannot name them;
* `run(key)` asks the hook for its cell, executes the real source, and reports how it ended;
  the hook runs an integrity check before and after the cell, keeps the first verdict of each
  cell, and signs all verdicts with the secret (HMAC-SHA256), which the executor verifies. A
  missing, unsigned or replayed verdict scores zero;
* setup cells run in the notebook's namespace. Before each test the names bound by locked setup
  cells (`ag`, `torch`, `model`, ...) are set back to the objects those cells bound, and the
  test runs in a copy of the namespace with a private copy of builtins (what it binds is copied
  back afterwards), so rebinding a name, before the test or from code the test calls, cannot
  change what the test calls;
* the integrity check compares the modules and classes of `autograder`, `minillm`, `kernels`,
  `torch`, `numpy` and a few stdlib modules, and the builtins, with what they held when they
  were first seen (and flags any library attribute that is a function defined in the notebook),
  refuses a cell while a thread the notebook started is alive, a torch function/dispatch mode
  is left on or a Python signal handler was installed, and names what changed: the cell scores
  zero with `tampered: <what>`. Tests run with Tensor subclasses' `__torch_function__` off, so
  a tensor the student returns cannot decide what `torch.equal` answers;
* while the kernel runs, the hook refuses ctypes, cffi and the C test modules, reading
  /proc/*/mem, gc's object walks, other threads' frames and trace/profile functions; while a
  test runs it also refuses frame access from notebook code (`sys._getframe`, traceback and
  generator frames) and signals, so student code called by a test cannot simply climb into the
  test's frame (the library's own frame look-ups still work).

What it does not stop, by design of one shared process: code that races the checks from
inside its own kernel (e.g. patching a module attribute *during* a test and restoring it before
the test ends, or a Python signal handler fired by a timer while the hook runs, which receives
the hook's frame), reaches frames through a library helper (`inspect.stack()`), or reads the
process's memory through a primitive that raises no audit event (`ctypes.cast`, ctypes being
loaded by torch already; numpy's as_strided): with the secret it can sign a report of its own
(tests/test_tamper.py, `memory_read`). A signed verdict is therefore not the whole judgement: a
hidden test also shows the grader the values it checked, and the grader compares them with the
lab's reference run outside the kernel (autograder/judge.py), so a forged verdict without the
right values earns nothing. Such code can change its own verdicts and nothing else: every
submission runs in its own sandbox (autograder/sandbox.py), and only the trusted grader writes
the gradebook.
"""
from __future__ import annotations

import ast
import builtins
import gc
import json
import os
import signal
import sys
import time
import types

from .seal import hidden_lines

__all__ = ["run", "install", "report"]

# Bound at import; the executor imports this module before any student code runs.
_audit = sys.audit
_exec = exec
_eval = eval
_isinstance = isinstance
_KeyboardInterrupt = KeyboardInterrupt
_AssertionError = AssertionError
_str, _type, _len = str, type, len
try:
    from torch._C import DisableTorchFunctionSubclass as _no_subclass_torch_function
except ImportError:                     # installed before torch is (never in a lab kernel)
    from contextlib import nullcontext as _no_subclass_torch_function

WATCHED_PACKAGES = ("autograder", "minillm", "kernels")
WATCHED_MODULES = frozenset({
    "torch", "torch.nn", "torch.nn.functional", "torch.testing", "torch.linalg", "numpy",
    "numpy.testing", "numpy.linalg", "math", "random", "operator", "functools", "statistics",
    "itertools", "collections", "copy", "time", "builtins", "contextlib", "torch.overrides"})
BLOCKED_IMPORTS = frozenset({"cffi", "_cffi_backend", "_testcapi", "_testinternalcapi",
                             "_testmultiphase", "_xxsubinterpreters", "_xxinterpchannels"})
ALWAYS_REFUSED = frozenset({"gc.get_objects", "gc.get_referrers", "gc.get_referents",
                            "sys._current_frames", "sys._current_exceptions", "sys.settrace",
                            "sys.setprofile", "sys.addaudithook"})
REFUSED_IN_CELL = frozenset({"os.kill", "os.killpg", "signal.pthread_kill"})
FRAME_ATTRIBUTES = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_back"})
SECRET_FILES = frozenset({"mem", "environ"})     # of /proc/<pid>/: the process's memory, env
# IPython puts these into builtins around each cell; they are not the course's to check.
IPYTHON_BUILTINS = frozenset({"get_ipython", "exit", "quit", "display", "__IPYTHON__", "_",
                              "__", "___", "__builtins__", "input", "raw_input", "getpass"})


# --- used by the executor (trusted, outside the kernel) -----------------------------------------
def run(key: str) -> None:
    """Run the locked cell `key` (the stub calls this); raise AssertionError if it failed."""
    box: list = []
    _audit("autograder.fetch", key, box)
    code, namespace, last, test, trash = box     # trash: what the hook let go of (dropped here)
    ok, message, line = True, "", 0
    try:
        if test:                        # a Tensor subclass returned by student code must not
            with _no_subclass_torch_function():     # decide what torch.equal & co. answer
                _exec(code, namespace)
        else:
            _exec(code, namespace)
        if last is not None:
            value = _eval(last, namespace)
            if value is not None:
                _display(value)
    except BaseException as e:          # noqa: BLE001 - every way a cell can end is a verdict
        ok, message = False, _describe(e)
        tb = e.__traceback__
        line = tb.tb_next.tb_lineno if tb is not None and tb.tb_next is not None else 0
        if _isinstance(e, _KeyboardInterrupt):
            _audit("autograder.record", key, False,
                   "interrupted: the cell ran past its time limit", line, trash)
            raise
    _audit("autograder.record", key, ok, message, line, trash)
    if not ok:
        box = []
        _audit("autograder.verdict", key, box)
        raise _AssertionError(box[0] if box else message) from None


def report() -> str:
    """Every verdict so far, signed (the executor asks for it after each locked cell)."""
    box: list = []
    _audit("autograder.report", box)
    return box[0] if box else ""


def _describe(e: BaseException) -> str:
    try:
        text = _str(e)
    except BaseException:                # noqa: BLE001
        text = "<unprintable>"
    if _type(text) is not _str:
        text = "<unprintable>"
    name = _type(e).__name__
    text = f"{name}: {text}" if text else name
    return text if _len(text) <= 2000 else text[:2000] + " ... (cut)"


def _display(value) -> None:
    try:
        from IPython.display import display
        display(value)
    except Exception:                    # noqa: BLE001 - outside IPython: print it
        print(repr(value))


def _library_roots() -> tuple[str, ...]:
    roots = {os.path.dirname(os.__file__), sys.prefix, sys.base_prefix}
    for pkg in WATCHED_PACKAGES:
        mod = sys.modules.get(pkg)
        path = getattr(mod, "__file__", None) if mod is not None else None
        if path:
            roots.add(os.path.dirname(os.path.dirname(os.path.abspath(path))))
    return tuple(sorted(os.path.realpath(r) + os.sep for r in roots))


def install(path: str) -> None:
    """Read (and delete) the sealed-cells file, snapshot the library, add the audit hook.

    The file is JSON: {"key": hex secret, "cells": {key: {"source": Python source,
    "kind": "setup" | "test", "grade_id": str, "trust": [names a setup cell binds that tests
    must see as that cell bound them]}}}.
    """
    with open(path, "rb") as f:
        data = json.loads(f.read())
    os.unlink(path)
    import numpy  # noqa: F401  - loaded before the snapshot, like everything the tests use
    import torch  # noqa: F401

    import autograder
    from autograder.cores import restore_torch_threads
    restore_torch_threads()                     # the sandbox's filter leaves torch on one
    import minillm  # noqa: F401
    autograder.bind()                           # the helpers, bound before any student code
    import autograder.judge
    autograder.judge.SHOWING = True             # hidden tests show the grader their values
    try:
        import tqdm.std
        tqdm.std.tqdm.monitor_interval = 0      # no monitor thread: the checks refuse threads
    except ImportError:
        pass
    from IPython import get_ipython
    shell = get_ipython()
    user_ns = shell.user_ns if shell is not None else sys.modules["__main__"].__dict__
    compiled = {}
    for key, cell in data["cells"].items():
        tree = ast.parse(cell["source"], filename=f"<locked cell {cell['grade_id']}>")
        last = None
        if cell["kind"] == "setup" and tree.body and isinstance(tree.body[-1], ast.Expr):
            last = compile(ast.Expression(tree.body.pop().value), "<locked cell>", "eval")
        compiled[key] = (compile(tree, f"<locked cell {cell['grade_id']}>", "exec"), last)
    try:        # PR_SET_DUMPABLE = 0: no other process (a child of the notebook's) may read this
        import ctypes  # one's memory through /proc/<pid>/mem or ptrace
        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    sys.addaudithook(_make_hook(bytes.fromhex(data["key"]), data["cells"], compiled, user_ns))


def _make_hook(secret: bytes, cells: dict, compiled: dict, user_ns: dict):
    """The audit hook. Everything it uses is a local of this function (a closure cell), or a
    C function bound here: a student who patches a module or builtins cannot get code of theirs
    to run inside the hook, where the secret is."""
    import _hashlib
    import _signal
    import _thread
    import pathlib

    type_, str_, list_, dict_, int_, bool_, bytes_, set_ = type, str, list, dict, int, bool, \
        bytes, set
    len_, repr_, id_, callable_, issubclass_ = len, repr, id, callable, issubclass
    RuntimeError_, ValueError_, KeyError_, AttributeError_ = RuntimeError, ValueError, \
        KeyError, AttributeError
    PermissionError_, ImportError_, AssertionError_ = PermissionError, ImportError, \
        AssertionError
    getframe, hmac_digest, sleep, range_ = sys._getframe, _hashlib.hmac_digest, time.sleep, range
    str_getitem, bytes_getitem, slice_ = str.__getitem__, bytes.__getitem__, slice
    gc_enabled, gc_enable, gc_disable = gc.isenabled, gc.enable, gc.disable
    thread_count, getsignal = _thread._count, _signal.getsignal
    function_type, module_type = types.FunctionType, types.ModuleType
    module_dict = types.ModuleType.__dict__["__dict__"].__get__
    type_module = type.__dict__["__module__"].__get__
    type_qualname = type.__dict__["__qualname__"].__get__
    type_dict = type.__dict__["__dict__"].__get__
    func_code = types.FunctionType.__dict__["__code__"].__get__
    func_defaults = types.FunctionType.__dict__["__defaults__"].__get__
    func_kwdefaults = types.FunctionType.__dict__["__kwdefaults__"].__get__
    code_filename = types.CodeType.__dict__["co_filename"].__get__
    path_parts = pathlib.PurePath.__dict__["_parts"].__get__
    path_types = (pathlib.PurePosixPath, pathlib.PosixPath)
    modules = sys.modules
    watched_packages, watched_modules = WATCHED_PACKAGES, WATCHED_MODULES
    always_refused, refused_in_cell, frame_attributes = ALWAYS_REFUSED, REFUSED_IN_CELL, \
        FRAME_ATTRIBUTES
    blocked_imports, secret_files, ipython_builtins = BLOCKED_IMPORTS, SECRET_FILES, \
        IPYTHON_BUILTINS
    run_code, run_globals = run.__code__, run.__globals__
    protected = {id(run), id(install), id(report), id(_make_hook)}
    private_builtins = dict(builtins.__dict__)
    hidden = {key: hidden_lines(cell["source"]) for key, cell in cells.items()}
    roots = _library_roots()
    pid, sigint, missing = os.getpid(), int(signal.SIGINT), object()
    state = {"busy": False, "cell": None, "test": False, "namespace": None, "keys": None}
    records: dict = {}
    trusted: dict = {}                          # names bound by locked setup cells -> object
    namespaces: dict = {}                       # label -> (live mapping, {name: value})
    functions: dict = {}        # id -> (label, function, code, defaults, kwdefaults, its items)
    loaded: dict = {}                           # module name -> module object

    def watched(name) -> bool:
        return name in watched_modules or name.split(".", 1)[0] in watched_packages

    def is_class(v) -> bool:
        return issubclass_(type_(v), type_)

    def remember(label, mapping) -> None:
        if label in namespaces:
            return
        snap = {}
        for k in list_(mapping.keys()):
            if type_(k) is not str_ or (label == "builtins" and k in ipython_builtins):
                continue
            v = mapping[k]
            if type_(v) is function_type or type_(v) is module_type or is_class(v) or \
                    callable_(v):
                snap[k] = v
            if type_(v) is function_type and id_(v) not in functions:
                kw = func_kwdefaults(v)
                functions[id_(v)] = (label + "." + k, v, func_code(v), func_defaults(v), kw,
                                     dict_(kw) if type_(kw) is dict_ else None)
            if is_class(v):
                mod = type_module(v)
                if type_(mod) is str_ and watched(mod):
                    remember(mod + "." + type_qualname(v), type_dict(v))
        namespaces[label] = (mapping, snap)

    def remember_loaded() -> None:
        for name in list_(modules.keys()):
            if type_(name) is not str_ or not watched(name) or name in namespaces:
                continue
            mod = modules.get(name)
            if type_(mod) is not module_type:
                continue
            remember(name, module_dict(mod))
            loaded[name] = mod
        torch = loaded.get("torch")
        if torch is not None:
            for label, cls in (("torch.Tensor", torch.Tensor), ("torch.nn.Module",
                                                                  torch.nn.Module)):
                remember(label, type_dict(cls))

    def notebook_function(v) -> bool:
        if type_(v) is not function_type:
            return False
        name = code_filename(func_code(v))
        return not (type_(name) is str_ and name.startswith(roots))

    def problems() -> list:
        found = []
        for name, mod in loaded.items():
            if modules.get(name, missing) is not mod:
                found.append("sys.modules[" + repr_(name) + "] was replaced")
        for label, (mapping, snap) in namespaces.items():
            keys = list_(mapping.keys())
            odd = [k for k in keys if type_(k) is not str_]
            if odd:
                found.append(label + " has a key that is not a string")
                continue
            for k, v in snap.items():
                if mapping.get(k, missing) is not v:
                    found.append(label + "." + k + " was replaced")
            for k in keys:
                if k not in snap and notebook_function(mapping.get(k)):
                    found.append(label + "." + k + " is a function defined in the notebook")
        for label, f, code, defaults, kwdefaults, kw_items in functions.values():
            changed = func_code(f) is not code or func_defaults(f) is not defaults or \
                func_kwdefaults(f) is not kwdefaults
            if not changed and kw_items is not None:     # the same dict, edited in place
                changed = len_(kwdefaults) != len_(kw_items)
                for name, value in kw_items.items():
                    if kwdefaults.get(name, missing) is not value:
                        changed = True
            if changed:
                found.append("the code or defaults of " + label + " were replaced")
        for _ in range_(20):                    # a library's short-lived thread (matplotlib's
            stray = stray_threads()             # font-cache timer) gets a second to end
            if not stray:
                break
            sleep(0.05)
        else:
            found.append("a thread started by the notebook is still running (" +
                         ", ".join(stray[:3]) + ")")
        if torch_modes() > state["modes"]:
            found.append("a torch function or dispatch mode was left active")
        for s, handler in state["signals"].items():
            if getsignal(s) is not handler:
                found.append("a handler was installed for signal " + repr_(int_(s)))
                break
        return found[:5]

    def stray_threads() -> list:
        """The threads started since the hook was installed, beyond library threads known to
        run no notebook code (pyzmq's garbage collector, started with the first large output):
        their classes' names ([] if none)."""
        extra = thread_count() - state["threads"]
        if extra <= 0:
            return []
        names = []
        for t in list_(active_threads.values()):
            if id_(t) in state["thread_ids"]:
                continue
            harmless = False
            for allowed in harmless_thread_types:
                if type_(t) is allowed:
                    harmless = True
                    break
            if harmless:
                extra -= 1
            else:
                names.append(str_(type_module(type_(t))) + "." + str_(type_qualname(type_(t))))
        return (names or ["started with _thread"]) if extra > 0 else []

    def refuse(what, exc=RuntimeError_):
        raise exc("autograder: " + what + " is not allowed while a notebook is graded")

    def sign() -> str:
        body = repr_(records)
        return body + "\n" + hmac_digest(secret, body.encode(), "sha256").hex()

    def fetch(key, box) -> None:
        cell = cells.get(key)
        if cell is None:
            refuse("running an unknown locked cell " + repr_(key), KeyError_)
        if key in records or state["cell"] is not None:
            refuse("running locked cell " + repr_(cell["grade_id"]) + " twice")
        bad = problems()
        if bad:
            message = "tampered: " + "; ".join(bad)
            records[key] = {"grade_id": cell["grade_id"], "kind": cell["kind"], "ok": False,
                            "message": message, "tampered": True}
            raise AssertionError_(cell["grade_id"] + ": not run: " + message)
        code, last = compiled[key]
        trash = []
        if cell["kind"] == "test":
            for name, value in trusted.items():  # what the setup cells bound, whatever since
                old = user_ns.get(name, missing)
                if old is not value:
                    trash.append(old)
                    user_ns[name] = value
            namespace = dict_(user_ns)
            namespace["__builtins__"] = private_builtins
        else:
            namespace = user_ns                 # its functions must see the student's later
        state.update(cell=key, test=cell["kind"] == "test", namespace=namespace,
                     keys=set_(k for k in namespace if type_(k) is str_))
        box.extend([code, namespace, last, cell["kind"] == "test", trash])

    def record(key, ok, message, line, trash) -> None:
        cell, namespace = cells[key], state["namespace"]
        state.update(cell=None, test=False, namespace=None)
        for name in list_(namespace.keys()) if namespace is not user_ns else ():
            if type_(name) is not str_ or name == "__builtins__" or \
                    (cell["kind"] == "test" and name in trusted):
                continue
            value = namespace[name]
            old = user_ns.get(name, missing)
            if old is not value:
                trash.append(old)
                user_ns[name] = value
        for name in state["keys"] if namespace is not user_ns else ():
            if name not in namespace and name != "__builtins__":
                trash.append(user_ns.pop(name, None))
        if cell["kind"] == "setup":
            for name in cell.get("trust", []):
                if name in namespace:
                    trusted[name] = namespace[name]
            remember_loaded()
        bad = problems()
        ok = type_(ok) is bool_ and ok and not bad
        message = message if type_(message) is str_ else "failed"
        if type_(line) is not int_:
            line = 0
        if not ok and message == "AssertionError" and line:
            lines = cell["source"].splitlines()
            if line in hidden[key]:
                message = "AssertionError: a hidden check failed"
            elif 0 < line <= len_(lines):
                message = "AssertionError at: " + lines[line - 1].strip()
        if bad:
            message = "tampered: " + "; ".join(bad)
        records[key] = {"grade_id": cell["grade_id"], "kind": cell["kind"], "ok": ok,
                        "message": message, "tampered": bool_(bad)}

    def checked(event, args) -> None:
        """autograder.* events: fetch and record only from autograder.sealed.run. The hook
        ignores the events its own work raises (reading code objects, its frame look-up): it
        calls only C functions and its own closures, the hook keeps the garbage collector off
        (no gc.callbacks), and the student objects it lets go of are handed back to run() to
        drop (no __del__ in here), so no student code runs meanwhile."""
        state["busy"] = True
        try:
            if event in ("autograder.fetch", "autograder.record"):
                caller = getframe(3)            # checked <- screen <- hook <- sys.audit's caller
                if caller.f_code is not run_code or caller.f_globals is not run_globals:
                    refuse("raising " + event + " outside autograder.sealed.run")
                if event == "autograder.fetch" and len_(args) == 2 and \
                        type_(args[0]) is str_ and type_(args[1]) is list_ and not args[1]:
                    fetch(args[0], args[1])
                elif event == "autograder.record" and len_(args) == 5 and \
                        type_(args[0]) is str_ and args[0] == state["cell"] and \
                        type_(args[4]) is list_:
                    record(*args)
                else:
                    refuse("a malformed " + event)
            elif event == "autograder.report" and len_(args) == 1 and type_(args[0]) is list_:
                args[0].append(sign())
            elif event == "autograder.verdict" and len_(args) == 2 and \
                    type_(args[1]) is list_ and type_(args[0]) is str_ and args[0] in records:
                args[1].append(records[args[0]]["message"])
        finally:
            state["busy"] = False

    def path_name(target):
        """The last component of an open() target, read without running any code of its."""
        if issubclass_(type_(target), str_):     # a str subclass's methods are not called
            target = str_getitem(target, slice_(None))
            return target.rstrip("/").rsplit("/", 1)[-1]
        if issubclass_(type_(target), bytes_):
            target = bytes_getitem(target, slice_(None))
            return target.rstrip(b"/").rsplit(b"/", 1)[-1].decode("utf-8", "replace")
        if type_(target) in path_types:
            parts = path_parts(target)
            if type_(parts) is list_ and parts and type_(parts[-1]) is str_:
                return parts[-1]
        return ""

    def hook(event, args):
        if type_(event) is not str_:            # a str subclass could run code in here
            refuse("an audit event that is not a plain string")
        if state["busy"]:
            return
        collecting = gc_enabled()               # no gc.callbacks of the student's in here
        gc_disable()
        try:
            screen(event, args)
        finally:
            if collecting:
                gc_enable()

    def screen(event, args):
        if event.startswith("autograder."):
            checked(event, args)
            return
        if event in always_refused or event.startswith("ctypes."):
            refuse(event)
        if event == "import" and args and type_(args[0]) is str_ and args[0] in blocked_imports:
            refuse("importing " + args[0], ImportError_)
        if event == "open" and args and path_name(args[0]) in secret_files:
            refuse("opening a process's " + path_name(args[0]), PermissionError_)
        if event in ("os.symlink", "os.link", "os.chdir") and args and \
                type_(args[0]) is str_ and "proc" in args[0]:
            refuse(event + " into /proc", PermissionError_)
        if event == "object.__setattr__" and args and id_(args[0]) in protected:
            refuse("changing the grader's functions")
        if event == "object.__getattr__" and len_(args) == 2 and id_(args[0]) in protected:
            refuse("reading the grader's code")
        if event == "sys._getframe" or (event == "object.__getattr__" and len_(args) == 2 and
                                        type_(args[1]) is str_ and args[1] in frame_attributes):
            if from_notebook():                 # the library's own frame look-ups are fine
                refuse(event + (" " + args[1] if event == "object.__getattr__" else "") +
                       " from notebook code", ValueError_ if event == "sys._getframe"
                       else AttributeError_)
        if state["test"] and event in refused_in_cell:
            if event == "os.kill" and len_(args) == 2 and type_(args[0]) is int_ and \
                    args[0] == pid and type_(args[1]) is int_ and args[1] == sigint:
                return
            refuse(event + " while a test runs")

    def from_notebook() -> bool:
        """Was the audited call made by code compiled from a notebook cell (not the library)?"""
        state["busy"] = True
        try:
            name = code_filename(getframe(3).f_code)    # from_notebook <- screen <- hook <- caller
        finally:
            state["busy"] = False
        return not (type_(name) is str_ and name.startswith(roots))

    import threading
    active_threads = threading._active          # the dict object itself, mutated in place
    harmless_thread_types = []
    try:
        from zmq.utils.garbage import GarbageCollectorThread
        harmless_thread_types.append(GarbageCollectorThread)
    except ImportError:
        pass
    torch_c = sys.modules["torch"]._C
    function_stack, dispatch_stack = torch_c._len_torch_function_stack, \
        torch_c._len_torch_dispatch_stack

    def torch_modes() -> int:
        return function_stack() + dispatch_stack()

    state["modes"] = torch_modes()
    remember_loaded()
    state["thread_ids"] = {id(t) for t in active_threads.values()}
    state["baseline"] = list(active_threads.values())      # keeps those ids from being reused
    state["threads"] = thread_count()
    state["signals"] = {int(s): getsignal(int(s)) for s in signal.valid_signals()}
    return hook
