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
* callbacks: an object the tester passes with `expose(obj)` (the model, so that the tester
  counts its forward passes and times them) is a handle in the student's kernel that can only be
  called, with arguments and results by value; one passed with `shared(obj)` (lab 05's cache)
  also lets the kernel call its public methods (functions of its class, not properties). The
  student's kernel can reach nothing else of the tester: no attribute, no module, no globals.

An exception in the student's code comes back as the same built-in type (ValueError,
AssertionError, ...) with its message, or as `StudentError` for any other type.
"""
from __future__ import annotations

import dataclasses
import importlib
import math
import numbers
import socket
import types

from . import remote_objects, remote_sympy

# The guard the student's side enters around a call (`autograder.reference_disabled` there),
# taken at import: the tester replaces its own copy by one that forwards here (tester.py).
from .checks import KERNEL_ADDRESS
from .checks import ReferenceGuard as _KernelGuard
from .remote_copyback import copy_into, snapshot
from .wire import (
    MAX_ITEMS,
    MAX_MESSAGE,
    Disconnected,
    ProtocolError,
    _int,
    _list,
    _pairs,
    _recv,
    _send,
)

__all__ = ["Endpoint", "Remote", "Exposed", "expose", "shared", "resident", "StudentError",
           "ProtocolError", "Disconnected", "MAX_MESSAGE", "serve"]

MAX_DEPTH = 32                   # nesting of lists / dicts in one value
MAX_TEXT = 4000                  # characters of an exception message that cross
DATACLASS_PACKAGES = ("minillm",)   # configs and specs that cross by value, both ways

# exceptions that keep their type when they cross; anything else becomes StudentError
BUILTIN_ERRORS = {e.__name__: e for e in (
    AssertionError, ValueError, TypeError, RuntimeError, IndexError, KeyError, AttributeError,
    NotImplementedError, ZeroDivisionError, ArithmeticError, OverflowError, LookupError,
    StopIteration)}


class StudentError(Exception):
    """An exception of a type the tester does not recreate, raised by the student's code."""


# --- values -------------------------------------------------------------------------------------
def _dtypes():
    import torch
    names = ["float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8",
             "uint8", "bool", "complex64", "complex128"]
    return {n: getattr(torch, n) for n in names}


class Exposed:
    """An object of the tester that the student's kernel may call, and nothing more (with
    `methods`: it may also call the object's public methods; `model`: it crosses as a stand-in
    module)."""
    __slots__ = ("obj", "methods", "model")

    def __init__(self, obj, methods: bool = False, model: bool = False):
        self.obj, self.methods, self.model = obj, methods, model


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


class _Codec:
    """Encodes one message's values into JSON-able data plus blobs, and back."""

    def __init__(self, endpoint: Endpoint):
        self.ep = endpoint
        self.blobs: list[bytes] = []
        self.mutables: list = []         # lists, dicts, tensors, generators: for copy-back
        self.count = 0
        self.sent: dict[int, int] = {}   # objects copied whole (remote_objects): id -> index
        self.alive: list = []
        self.got: list = []

    # encoding
    def enc(self, v, depth: int = 0):
        import torch
        self.count += 1
        if depth > MAX_DEPTH or self.count > MAX_ITEMS:
            raise ProtocolError("a value nested too deep or too large to send")
        if v is None or type(v) in (bool, str):
            return v
        if isinstance(v, str):               # a str subclass crosses as a plain str
            return str.__str__(v)
        if isinstance(v, numbers.Integral):
            return int(v)
        if isinstance(v, numbers.Real):
            v = float(v)
            return {"f": repr(v)} if v != v or v in (math.inf, -math.inf) else v
        t = type(v)
        if t in (list, dict):                    # registered before their items, as dec does
            self.mutables.append(v)
        if t in (list, tuple, set, frozenset):
            tag = {list: "L", tuple: "T", set: "S", frozenset: "S"}[t]
            return {tag: [self.enc(x, depth + 1) for x in v]}
        if t is dict:
            return {"D": [[self.enc(k, depth + 1), self.enc(x, depth + 1)] for k, x in v.items()]}
        if t is bytes:
            self.blobs.append(v)
            return {"b": len(self.blobs) - 1}
        if isinstance(v, torch.Tensor) and type(v) in (torch.Tensor, torch.nn.Parameter):
            c = _cpu_copy(v)
            self.mutables.append(v)
            self.blobs.append(memoryview(c.reshape(-1).view(torch.uint8).numpy())
                              if c.numel() else b"")
            fields = [str(c.dtype).removeprefix("torch."), list(c.shape), len(self.blobs) - 1,
                      str(v.device)]
            if self.ep.share_handles:            # the student's side says where it lives there
                fields.append(v.data_ptr())
            return {"t": fields}
        if isinstance(v, torch.dtype):
            return {"dt": str(v).removeprefix("torch.")}
        if isinstance(v, torch.device):
            return {"dev": str(v)}
        if isinstance(v, torch.Size):
            return {"T": [self.enc(x, depth + 1) for x in v]}
        if isinstance(v, torch.Generator):
            self.mutables.append(v)
            self.blobs.append(v.get_state().numpy().tobytes())
            return {"g": [str(v.device), len(self.blobs) - 1]}
        if isinstance(v, Remote) and v._ep is self.ep:
            return {"yours": v._id}
        if remote_sympy.is_sympy(v):
            return {"sy": remote_sympy.encode(v, int, depth, ProtocolError)}
        if isinstance(v, Exposed):
            return self._stand_in(v.obj, depth) if v.model else \
                {"h": self.ep.export(v.obj, call_only=True, methods=v.methods)}
        if dataclasses.is_dataclass(v) and not isinstance(v, type) and \
                type(v).__module__.split(".")[0] in DATACLASS_PACKAGES:
            return {"dc": [type(v).__module__, type(v).__qualname__,
                           [[f.name, self.enc(getattr(v, f.name), depth + 1)]
                            for f in dataclasses.fields(v)]]}
        if type(v) is types.SimpleNamespace and not self.ep.share_handles:
            return {"ns": [[str(k), self.enc(x, depth + 1)] for k, x in vars(v).items()]}
        if self.ep.copy_modules and not self.ep.share_handles and remote_objects.copies(v):
            return remote_objects.encode(self, v, depth)
        if isinstance(v, torch.nn.Module) and not self.ep.share_handles:
            return self._stand_in(v, depth)
        if self.ep.share_handles:
            return {"h": self.ep.export(v)}
        if callable(v):                          # the tester's model, a function of the test
            return {"h": self.ep.export(v, call_only=True)}
        raise ProtocolError(f"a {type(v).__name__} cannot be sent to the student's code: pass "
                            "plain values, tensors, or expose(obj)")

    def _stand_in(self, v, depth: int):
        """The tester's model `v` as a stand-in module (remote_objects.stand_in)."""
        p = next(iter(v.parameters()), None)
        return {"m": [self.ep.export(v, call_only=True),
                      self.enc(getattr(v, "config", None), depth + 1),
                      str(p.device) if p is not None else "cpu",
                      str(p.dtype).removeprefix("torch.") if p is not None else "float32",
                      self.enc(remote_objects.specs_of(v), depth + 1)]}

    # decoding
    def dec(self, d, depth: int = 0):
        import torch
        self.count += 1
        if depth > MAX_DEPTH or self.count > MAX_ITEMS:
            raise ProtocolError("a value nested too deep or too large")
        if d is None or isinstance(d, (bool, int, float, str)):
            return d
        if not isinstance(d, dict) or len(d) != 1:
            raise ProtocolError(f"not a value: {str(d)[:80]}")
        (tag, x), = d.items()
        if tag == "L":
            out: list = []
            self.mutables.append(out)
            out.extend(self.dec(i, depth + 1) for i in _list(x))
            return out
        if tag in ("T", "S"):
            items = [self.dec(i, depth + 1) for i in _list(x)]
            return {"T": tuple, "S": set}[tag](items)
        if tag == "D":
            d: dict = {}
            self.mutables.append(d)
            for k, v in _pairs(x):
                key = self.dec(k, depth + 1)
                d[key] = self.dec(v, depth + 1)
            return d
        if tag == "f":
            if x not in ("nan", "inf", "-inf"):
                raise ProtocolError(f"not a float: {str(x)[:40]}")
            return float(x)
        if tag == "b":
            return bytes(self._blob(x))
        if tag == "t":
            address = None
            if self.ep.share_handles:
                dtype_name, shape, blob, device = _list(x, 4)
            else:                                # from the student's side: and its address
                dtype_name, shape, blob, device, address = _list(x, 5)
                _int(address)
            dtype = _dtypes().get(dtype_name)
            if dtype is None or not all(type(s) is int and s >= 0 for s in _list(shape)):
                raise ProtocolError(f"not a tensor: {dtype_name} {str(shape)[:80]}")
            data = self._blob(blob)
            numel = 1
            for s in shape:
                numel *= s
            size = torch.empty((), dtype=dtype).element_size()
            if numel * size != len(data):
                raise ProtocolError(f"a tensor of shape {shape} and dtype {dtype_name} "
                                    f"sent with {len(data)} bytes")
            t = (torch.frombuffer(data, dtype=torch.uint8).view(dtype).reshape(shape)
                 .clone() if numel else torch.empty(shape, dtype=dtype))   # own, resizable
            if self.ep.keep_devices and str(device) != "cpu" and torch.cuda.is_available():
                t = t.to(device)
            if address is not None:              # autograder.data_ptr(t) reads it
                setattr(t, KERNEL_ADDRESS, address)
            self.mutables.append(t)
            return t
        if tag == "dt":
            dtype = _dtypes().get(x)
            if dtype is None:
                raise ProtocolError(f"unknown dtype {str(x)[:40]}")
            return dtype
        if tag == "dev":
            return torch.device(str(x)[:40])
        if tag == "g":
            device, blob = _list(x, 2)
            g = torch.Generator(device=device if self.ep.keep_devices else "cpu")
            g.set_state(torch.frombuffer(bytearray(self._blob(blob)), dtype=torch.uint8).clone())
            self.mutables.append(g)
            return g
        if tag == "h":
            return Remote(self.ep, _int(x))
        if tag == "sy":
            return remote_sympy.decode(x, ProtocolError)
        if tag in ("m", "ns", "M", "O", "P", "or") and not self.ep.share_handles:
            raise ProtocolError("the student's side sent an object the tester does not accept")
        if tag in ("M", "O", "P", "or"):         # the tester's module, copied (remote_objects)
            return remote_objects.decode(self, tag, x, depth)
        if tag == "dc":                          # a config or a spec of the course, either way
            module, qualname, fields = _list(x, 3)
            if type(module) is not str or module.split(".")[0] not in DATACLASS_PACKAGES:
                raise ProtocolError(f"a dataclass of {str(module)[:40]}")
            cls = importlib.import_module(module)
            for part in str(qualname).split("."):
                cls = getattr(cls, part, None)
            if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)
                    and cls.__module__ == module):   # never any other callable
                raise ProtocolError(f"not a dataclass: {module[:40]}.{str(qualname)[:40]}")
            return cls(**{str(k): self.dec(v, depth + 1) for k, v in _pairs(fields)})
        if tag == "ns":                          # a test's SimpleNamespace, by value
            fields = {}
            for k, v in _pairs(x):
                if type(k) is not str or not k.isidentifier() or k.startswith("__"):
                    raise ProtocolError(f"not an attribute name: {str(k)[:40]}")
                fields[k] = self.dec(v, depth + 1)
            return types.SimpleNamespace(**fields)
        if tag == "m":                           # the tester's model: a stand-in module here
            h, config, device, dtype, specs = _list(x, 5)
            return remote_objects.stand_in(Remote(self.ep, _int(h)), self.dec(config, depth + 1),
                                           str(device) if self.ep.keep_devices else "cpu",
                                           _dtypes().get(dtype, torch.float32),
                                           self.dec(specs, depth + 1))
        if tag == "yours":
            return self.ep.local(_int(x))
        raise ProtocolError(f"unknown tag {str(tag)[:20]}")

    def _blob(self, i) -> bytes:
        i = _int(i)
        if not 0 <= i < len(self.blobs):
            raise ProtocolError("a blob index out of range")
        return self.blobs[i]


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
        codec = _Codec(self)
        msg = {"op": op, "target": target, "args": [codec.enc(a) for a in args],
               "disabled": list(self.disabled)}
        _send(self.sock, msg, codec.blobs)
        while True:
            message, blobs = _recv(self.sock)
            if "op" in message:
                self._serve_one(message, blobs)
                continue
            return self._reply_value(message, blobs, codec if copy_back else None)

    def _reply_value(self, message: dict, blobs: list[bytes], sent: _Codec | None):
        reply = _Codec(self)
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
            for slot, d in _pairs(message.get("changed", [])):
                if not (type(slot) is int and 0 <= slot < len(sent.mutables)):
                    raise ProtocolError("a changed argument out of range")
                copy_into(sent.mutables[slot], reply.dec(d))
        return value

    def serve(self) -> None:
        """Answer requests until the other side says it is done."""
        while not self.done:
            message, blobs = _recv(self.sock)
            if "op" not in message:
                raise ProtocolError("a reply with no request")
            self._serve_one(message, blobs)

    def _serve_one(self, message: dict, blobs: list[bytes]) -> None:
        codec = _Codec(self)
        codec.blobs = blobs
        op = message.get("op")
        out = _Codec(self)
        try:
            args = [codec.dec(a) for a in _list(message.get("args", []))]
            before = [snapshot(m) for m in codec.mutables] if op == "call" else None
            target = message.get("target")
            value = self._do(op, None if target is None else _int(target), args,
                             [str(n) for n in _list(message.get("disabled", []))])
            reply = {"ok": out.enc(value)}
            if before is not None:
                changed = [[i, out.enc(m)] for i, m in enumerate(codec.mutables)
                           if not before[i].holds(m)]
                if changed:
                    reply["changed"] = changed
        except (KeyboardInterrupt, SystemExit, Disconnected):
            raise
        except BaseException as e:          # noqa: BLE001 - everything the call raised crosses
            out = _Codec(self)
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
        if op == "lookup":
            (name,) = args
            if self.namespace is None or type(name) is not str or name not in self.namespace:
                raise NameError(f"name {name!r} is not defined in your notebook")
            return self.namespace[name]
        if h is None:
            raise ProtocolError(f"a request {str(op)[:20]} without its object")
        target = self.local(h)
        if op == "call":
            fn, a, kw = target, args[0], args[1]
            if type(a) is not tuple or type(kw) is not dict:
                raise ProtocolError("malformed call")
            if not self.share_handles:           # the tester's object, for the student's code
                import torch
                with torch.no_grad():
                    return fn(*a, **kw)
            if disabled:
                key = tuple(disabled)
                if key not in self.guards:       # resolved and compiled once, entered per call
                    self.guards[key] = _KernelGuard(*disabled)
                with self.guards[key]:
                    return fn(*a, **kw)
            return fn(*a, **kw)
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


class _Iterator:
    """An iterator of the student's side, kept there (never crosses by value)."""

    def __init__(self, it):
        self.it = it

    def __next__(self):
        return next(self.it)


def _cpu_copy(t):
    """A CPU copy of `t` whose bytes may be read through numpy: `.numpy()` on the caller's own
    tensor would leave its storage unresizable."""
    return t.detach().to("cpu", copy=True).contiguous()


def _describe(e: BaseException) -> str:
    try:
        text = str(e)
    except Exception:                        # noqa: BLE001 - a __str__ that raises
        text = "(its message could not be read)"
    return text[:MAX_TEXT]


class Remote:
    """An object of the student's kernel, seen from the tester."""
    __slots__ = ("_ep", "_id")

    def __init__(self, ep: Endpoint, i: int):
        object.__setattr__(self, "_ep", ep)
        object.__setattr__(self, "_id", i)

    def __call__(self, *args, **kwargs):
        return self._ep.request("call", self._id, args, kwargs, copy_back=True)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self._ep.request("getattr", self._id, name)

    def __setattr__(self, name, value):
        self._ep.request("setattr", self._id, name, value)

    def __getitem__(self, key):
        return self._ep.request("getitem", self._id, key)

    def __setitem__(self, key, value):
        self._ep.request("setitem", self._id, key, value)

    def __len__(self):
        return self._ep.request("len", self._id)

    def __iter__(self):
        it = self._ep.request("iter", self._id)
        while True:
            try:
                yield self._ep.request("next", it._id)
            except StopIteration:
                return

    def __next__(self):
        return self._ep.request("next", self._id)

    def __contains__(self, item):
        return self._ep.request("contains", self._id, item)

    def __bool__(self):
        return self._ep.request("bool", self._id)

    def __repr__(self):
        return self._ep.request("repr", self._id)

    def __str__(self):
        return self._ep.request("str", self._id)


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
