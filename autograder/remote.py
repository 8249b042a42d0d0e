"""Calls across the grading boundary: the tester (trusted, autograder/tester.py) calls the
student's functions in the student's kernel (untrusted) over a Unix socket.

Why: a test that runs in the student's kernel shares its memory, so the student's code can read
the test's text and forge what the test measures (tests/test_tamper.py, `memory_read_sources`).
A test that runs in the tester only sends the student's kernel the call it makes, with its
arguments, and gets back the result.

What crosses, both ways, and how:

* by value: None, bool, int, float, str, bytes, exact lists / tuples / dicts / sets of these,
  torch tensors (CPU bytes, any dtype, shape checked against the bytes; one from the student's
  side carries the address it had there, for `autograder.data_ptr`), torch dtypes and
  devices, torch Generators (their state), SymPy expressions (as their trees,
  autograder/remote_sympy.py), the course's dataclasses (a model's config, a layer's KVSpec;
  rebuilt only if the class is one); and, from the tester to the student's side only,
  `types.SimpleNamespace` records and, in a lab that says so, whole modules
  (autograder/remote_objects.py). Nothing is ever
  unpickled: a message is JSON plus raw byte blobs (autograder/wire.py), capped at MAX_MESSAGE
  bytes, nested at most MAX_DEPTH deep;
* in place: a list, dict, tensor or Generator passed as an argument comes back when the call
  changed it, and the caller copies it into its own object (a kernel that fills an output
  buffer, a sampler that advances its generator, a function that edits the list it is given;
  autograder/remote_copyback.py);
* by handle: any other object of the student's kernel (a class, an instance, a function it
  returns) stays there; the tester gets a `Remote` that forwards calls, attribute and item
  reads, len, iter, repr, bool;
* gradients: a call from the tester with grad mode on, whose tensors require gradients, is a
  node of the tester's autograd graph whose backward runs the kernel's (remote_autograd.py);
* names: after a test, the tester binds in the student's notebook, by value, what the test's
  visible part bound for a later cell (`Endpoint.hand_over`, tester_plan.py's "handed");
* course functions: one decorated with `kernel_side` (lab 04's Triton launcher) runs in the
  kernel when the tester calls it with a handle on a student object among its arguments;
* callbacks: an object the tester passes with `expose(obj)` (the model, so that the tester
  counts its forward passes and times them) is a handle in the student's kernel that can only be
  called, with arguments and results by value; one passed with `shared(obj)` (lab 05's cache)
  also lets the kernel call its public methods (functions of its class, not properties). The
  student's kernel can reach nothing else of the tester: no attribute, no module, no globals.

An exception in the student's code comes back as the same built-in type (ValueError,
AssertionError, ...) with its message, or as `StudentError` for any other type.
"""
from __future__ import annotations

import importlib
import socket
import types

from . import remote_autograd

# The guard the student's side enters around a call (`autograder.reference_disabled` there),
# taken at import: the tester replaces its own copy by one that forwards here (tester.py).
from .checks import ReferenceGuard as _KernelGuard
from .remote_copyback import copy_into, snapshot
from .remote_values import Codec, Exposed, Remote, _Iterator
from .wire import MAX_MESSAGE, Disconnected, ProtocolError, _int, _list, _recv, _send

__all__ = ["Endpoint", "Remote", "Exposed", "expose", "shared", "resident", "kernel_side",
           "StudentError", "ProtocolError", "Disconnected", "MAX_MESSAGE", "serve"]

MAX_TEXT = 4000                  # characters of an exception message that cross

# exceptions that keep their type when they cross; anything else becomes StudentError
BUILTIN_ERRORS = {e.__name__: e for e in (
    AssertionError, ValueError, TypeError, RuntimeError, IndexError, KeyError, AttributeError,
    NotImplementedError, ZeroDivisionError, ArithmeticError, OverflowError, LookupError,
    StopIteration)}


class StudentError(Exception):
    """An exception of a type the tester does not recreate, raised by the student's code."""


def expose(obj) -> Exposed:
    """Wrap `obj` so that it crosses as a call-only handle instead of by value."""
    return Exposed(obj)


def shared(obj):
    """`obj` passed to the student's code as a handle on the tester's own object, so that what
    the student's calls do with it is done here: a model crosses as a stand-in whose passes
    run here (never copied, in any lab); any other object as a handle whose public methods the
    kernel may call (a cache the tester's model fills, a drafter). With the tests in the kernel
    (no tester), `obj` itself."""
    if CURRENT is None:
        return obj
    import torch
    model = isinstance(obj, torch.nn.Module)
    return Exposed(obj, methods=not model, model=model)


CURRENT: "Endpoint | None" = None    # the tester's connection while a test runs (tester.py)


KERNEL_SIDE: dict = {}       # course functions the tester may ask the kernel to run, by name


def kernel_side(fn):
    """Decorate a course function that must run where the student's objects live: called in
    the tester with an object of the student's kernel (a `Remote`) among its positional
    arguments, it runs in the kernel (the "course" request: arguments and result cross as
    any call's do, with the references the test disabled off there); otherwise, here. Lab 04's
    and 07's launchers use it: the student's Triton kernel is Python in the CPU interpreter,
    and the tester never runs the student's code. What such a function reports is the
    kernel's word, like any result of the student's code."""
    import functools
    name = f"{fn.__module__}.{fn.__qualname__}"
    KERNEL_SIDE[name] = fn

    @functools.wraps(fn)
    def run(*args, **kwargs):
        ep = CURRENT
        if ep is not None and any(isinstance(a, Remote) and a._ep is ep for a in args):
            return ep.request("course", None, name, args, kwargs, copy_back=True)
        return fn(*args, **kwargs)
    return run


def resident(value):
    """`value` copied once into the student's kernel, for a speed check that calls the
    student's code many times on the same inputs: the tester gets a handle (a list or tuple:
    one per item) that crosses back as the kernel's own object, so the timed calls do not
    send the inputs again. With the tests in the kernel (no tester), `value` itself."""
    ep = CURRENT
    if ep is None:
        return value
    if type(value) in (list, tuple):
        return type(value)(ep.request("keep", None, x) for x in value)
    return ep.request("keep", None, value)


# --- the two ends ---------------------------------------------------------------------------------
class Endpoint:
    """One end of the connection. `share_handles`: objects that cannot cross by value cross as
    handles (the student's side); the tester's side shares only what it wraps with `expose`."""

    def __init__(self, sock: socket.socket, *, share_handles: bool, namespace=None,
                 keep_devices: bool = True, copy_modules: bool = False):
        self.sock = sock
        self.share_handles = share_handles
        self.copy_modules = copy_modules        # modules cross whole (remote_objects)
        self.namespace = namespace              # the student's globals (student side only)
        self.keep_devices = keep_devices
        self.objects: dict[int, object] = {}
        self.call_only: set[int] = set()
        self.with_methods: set[int] = set()    # call-only objects whose methods may be called
        self.disabled: list[str] = []           # references the student's calls run without
        self.guards: dict[tuple, object] = {}   # (student's side) a guard per list of them
        self.done = False

    # objects that stay on this side
    def export(self, obj, call_only: bool = False, methods: bool = False) -> int:
        i = len(self.objects) + 1
        self.objects[i] = obj
        if call_only:
            self.call_only.add(i)
        if methods:
            self.with_methods.add(i)
        return i

    def local(self, i: int):
        if i not in self.objects:
            raise ProtocolError(f"no object {i} on this side")
        return self.objects[i]

    # requests
    def request(self, op: str, target: int | None, *args, copy_back: bool = False):
        """Send a request about the other side's object `target` (its handle; None for
        `lookup` and `done`) and wait for the reply, serving the other side's requests
        (callbacks) meanwhile. Returns the decoded result."""
        return self.exchange(*self.prepare(op, target, *args), copy_back=copy_back)

    def prepare(self, op: str, target: int | None, *args,
                by_value: bool = False) -> tuple[dict, Codec]:
        """A request, encoded: its message and the codec that holds its blobs and the
        objects it sent (`exchange` sends it). `by_value`: no argument may cross as a handle."""
        codec = Codec(self)
        codec.by_value = by_value
        msg = {"op": op, "target": target, "args": [codec.enc(a) for a in args],
               "disabled": list(self.disabled)}
        return msg, codec

    def hand_over(self, name: str, value) -> None:
        """(The tester) Bind `name` to `value` in the student's notebook, by value only (no
        handle: the connection closes when the test ends): a name a test's visible part
        binds that a later cell of the notebook reads (tester_plan's "handed")."""
        self.exchange(*self.prepare("bind", None, name, value, by_value=True))

    def exchange(self, msg: dict, codec: Codec, copy_back: bool = False):
        """Send a `prepare`d request and wait for its reply (see `request`)."""
        _send(self.sock, msg, codec.blobs)
        while True:
            message, blobs = _recv(self.sock)
            if "op" in message:
                self._serve_one(message, blobs)
                continue
            return self._reply_value(message, blobs, codec if copy_back else None)

    def _reply_value(self, message: dict, blobs: list[bytes], sent: Codec | None):
        reply = Codec(self)
        reply.blobs = blobs
        if "err" in message:
            name, text = _list(message["err"], 2)
            text = str(text)[:MAX_TEXT]
            cls = BUILTIN_ERRORS.get(name)
            if cls is None:
                raise StudentError(f"{str(name)[:80]}: {text}")
            raise cls(text)
        value = reply.dec(message.get("ok"))
        if sent is not None:                     # the arguments the call changed in place
            for change in _list(message.get("changed", [])):
                slot, d, *grad = _list(change)
                if not (type(slot) is int and 0 <= slot < len(sent.mutables)) or len(grad) > 1:
                    raise ProtocolError("a changed argument out of range")
                copy_into(sent.mutables[slot], reply.dec(d), *(reply.dec(g) for g in grad))
        return value

    def serve(self) -> None:
        """Answer requests until the other side says it is done."""
        while not self.done:
            message, blobs = _recv(self.sock)
            if "op" not in message:
                raise ProtocolError("a reply with no request")
            self._serve_one(message, blobs)

    def _serve_one(self, message: dict, blobs: list[bytes]) -> None:
        codec = Codec(self)
        codec.blobs = blobs
        op = message.get("op")
        out = Codec(self)
        try:
            args = [codec.dec(a) for a in _list(message.get("args", []))]
            if op == "gcall" and self.share_handles:   # a call the tester differentiates
                args[2] = remote_autograd.leaves(codec.tensors, args[2])
            before = [snapshot(m) for m in codec.mutables] if op in ("call", "gcall", "course") \
                else None
            target = message.get("target")
            value = self._do(op, None if target is None else _int(target), args,
                             [str(n) for n in _list(message.get("disabled", []))])
            reply = {"ok": out.enc(value)}
            if before is not None:             # with its gradient, if it has one here
                changed = [[i, out.enc(m)] + ([out.enc(m.grad)] if _has_grad(m) else [])
                           for i, m in enumerate(codec.mutables) if not before[i].holds(m)]
                if changed:
                    reply["changed"] = changed
        except (KeyboardInterrupt, SystemExit, Disconnected):
            raise
        except BaseException as e:          # noqa: BLE001 - everything the call raised crosses
            out = Codec(self)
            reply = {"err": [type(e).__name__, _describe(e)]}
        _send(self.sock, reply, out.blobs)

    def _do(self, op: str, h: int | None, args: list, disabled: list[str]):
        if op == "done":
            self.done = True
            return None
        if op == "keep":                         # resident(): a copy that stays here
            if not self.share_handles:
                raise ProtocolError("the student's side cannot leave objects in the tester")
            (value,) = args
            return Exposed(value)
        if op == "bind":                         # hand_over(): a test's name, for later cells
            name, value = args
            if not self.share_handles or self.namespace is None or type(name) is not str \
                    or not name.isidentifier():
                raise ProtocolError("a name the tester cannot bind")
            self.namespace[name] = value
            return None
        if op == "course":                       # kernel_side(): a course function, run here
            name, a, kw = args
            if not self.share_handles or type(name) is not str or type(a) is not tuple or \
                    type(kw) is not dict:
                raise ProtocolError("a course function the tester cannot ask for")
            module = name.rpartition(".")[0]
            if name not in KERNEL_SIDE and module.startswith("autograder.labs."):
                importlib.import_module(module)  # registers its kernel-side functions
            if name not in KERNEL_SIDE:
                raise ProtocolError(f"no kernel-side course function {name[:80]}")
            return self._guarded(disabled, KERNEL_SIDE[name], *a, **kw)
        if op == "lookup":
            (name,) = args
            if self.namespace is None or type(name) is not str or name not in self.namespace:
                raise NameError(f"name {name!r} is not defined in your notebook")
            return self.namespace[name]
        if h is None:
            raise ProtocolError(f"a request {str(op)[:20]} without its object")
        target = self.local(h)
        if op == "gcall" and not self.share_handles:
            raise ProtocolError("only the tester differentiates through a call")
        if op in ("call", "gcall"):
            fn, a, kw = target, args[0], args[1]
            if type(a) is not tuple or type(kw) is not dict:
                raise ProtocolError("malformed call")
            if not self.share_handles:           # the tester's object, for the student's code
                import torch
                with torch.no_grad():
                    return fn(*a, **kw)
            if op == "gcall":                    # [its result, its graph] (remote_autograd)
                return self._guarded(disabled, remote_autograd.Graph.run, fn, a, kw, args[2])
            return self._guarded(disabled, fn, *a, **kw)
        if op == "grad" and self.share_handles and isinstance(target, remote_autograd.Graph):
            return self._guarded(disabled, target.backward, *args)
        if h in self.call_only:
            name = str(args[0]) if op == "getattr" and args else "_"
            if h in self.with_methods and not name.startswith("_") and \
                    isinstance(getattr(type(target), name, None), types.FunctionType):
                return getattr(target, name)     # a bound method: crosses call-only
            raise PermissionError("the grader's objects can only be called")
        if op == "getattr":
            return getattr(target, str(args[0]))
        if op == "getitem":
            return target[args[0]]
        if op == "setitem":
            target[args[0]] = args[1]
            return None
        if op == "setattr":
            setattr(target, str(args[0]), args[1])
            return None
        if op == "len":
            return len(target)
        if op == "iter":
            return _Iterator(iter(target))
        if op == "next":
            return next(target)
        if op == "repr":
            return repr(target)[:MAX_TEXT]
        if op == "str":
            return str(target)[:MAX_TEXT]
        if op == "bool":
            return bool(target)
        if op == "contains":
            return args[0] in target
        raise ProtocolError(f"unknown request {str(op)[:20]}")


    def _guarded(self, disabled: list[str], fn, *a, **kw):
        """(The student's side) `fn(*a, **kw)` with the references in `disabled` off."""
        if not disabled:
            return fn(*a, **kw)
        key = tuple(disabled)
        if key not in self.guards:               # resolved and compiled once, entered per call
            self.guards[key] = _KernelGuard(*disabled)
        with self.guards[key]:
            return fn(*a, **kw)


def _has_grad(m) -> bool:
    """Whether `m` is a tensor that collects a gradient here (a parameter of a copied module,
    an input the tester differentiates), whose gradient then crosses back with it."""
    import torch
    return isinstance(m, torch.Tensor) and m.is_leaf and m.requires_grad


def _describe(e: BaseException) -> str:
    try:
        text = str(e)
    except Exception:                        # noqa: BLE001 - a __str__ that raises
        text = "(its message could not be read)"
    return text[:MAX_TEXT]


# --- the student's side ---------------------------------------------------------------------------
def serve(path: str, namespace: dict | None = None) -> None:
    """Run in the student's kernel while the tester runs a test: connect to the tester's socket
    at `path` and answer its requests (look up a name of the notebook, call, read attributes)
    until it says it is done. `namespace`: the notebook's globals (default: IPython's)."""
    if namespace is None:
        namespace = __import__("IPython").get_ipython().user_ns
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
        Endpoint(sock, share_handles=True, namespace=namespace).serve()
    finally:
        sock.close()
