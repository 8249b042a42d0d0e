"""Values across the grading boundary (autograder/remote.py says what crosses and how): the
codec that writes one message's values as JSON plus raw byte blobs and reads them back, the
`Remote` handle on an object of the other side, and `Exposed`, the tester's wrapper for an
object it lends the kernel."""
from __future__ import annotations

import dataclasses
import importlib
import math
import numbers
import types

from . import remote_autograd, remote_objects, remote_sympy
from .checks import KERNEL_ADDRESS
from .wire import MAX_ITEMS, ProtocolError, _int, _list, _pairs

__all__ = ["Codec", "Remote", "Exposed", "MAX_DEPTH", "DATACLASS_PACKAGES"]

MAX_DEPTH = 32                   # nesting of lists / dicts in one value
DATACLASS_PACKAGES = ("minillm",)   # configs and specs that cross by value, both ways


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


class Codec:
    """Encodes one message's values into JSON-able data plus blobs, and back."""

    def __init__(self, endpoint):
        self.ep = endpoint
        self.blobs: list[bytes] = []
        self.mutables: list = []         # lists, dicts, tensors, generators: for copy-back
        self.count = 0
        self.sent: dict[int, int] = {}   # objects copied whole (remote_objects): id -> index
        self.alive: list = []
        self.got: list = []
        self.tensors: list = []          # every tensor of the message, in order (remote_autograd)
        self.by_value = False            # (hand_over) no handles: the connection will close

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
        if type(v) is torch.nn.Parameter and self.ep.copy_modules and not self.ep.share_handles:
            return remote_objects.encode(self, v, depth)     # one object, wherever it appears
        if isinstance(v, torch.Tensor) and type(v) in (torch.Tensor, torch.nn.Parameter):
            return self.tensor(v)
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
        if self.by_value and (isinstance(v, Exposed) or callable(v)) and \
                not (self.ep.copy_modules and remote_objects.copies(v)):
            raise ProtocolError(f"a {type(v).__name__} cannot be handed to the student's "
                                "notebook by value")
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

    def tensor(self, v) -> dict:
        """Tensor `v` by value (and, from the student's side, the address it has there)."""
        import torch
        c = _cpu_copy(v)
        self.mutables.append(v)
        self.tensors.append(v)
        self.blobs.append(memoryview(c.reshape(-1).view(torch.uint8).numpy())
                          if c.numel() else b"")
        fields = [str(c.dtype).removeprefix("torch."), list(c.shape), len(self.blobs) - 1,
                  str(v.device)]
        if self.ep.share_handles:                # the student's side says where it lives there
            fields.append(v.data_ptr())
        return {"t": fields}

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
            self.tensors.append(t)
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


class Remote:
    """An object of the student's kernel, seen from the tester."""
    __slots__ = ("_ep", "_id")

    def __init__(self, ep, i: int):
        object.__setattr__(self, "_ep", ep)
        object.__setattr__(self, "_id", i)

    def __call__(self, *args, **kwargs):
        if not self._ep.share_handles and remote_autograd.wanted(args, kwargs):
            return remote_autograd.call(self._ep, self._id, args, kwargs, Remote)
        return self._ep.request("call", self._id, args, kwargs, copy_back=True)

    def __getattr__(self, name):
        if name.startswith("__") and name != "__dict__":    # vars(r): the object's attributes
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
