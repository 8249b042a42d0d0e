"""The plain values that cross between the tester and the kernel (autograder/README.md), and
their frames on a Unix socket: one JSON object and byte blobs, length-prefixed and read with
hard limits before anything is decoded; nothing is unpickled or evaluated.
"""
from __future__ import annotations

import json
import math
import socket
import struct

__all__ = ["NotPlain", "ProtocolError", "Disconnected", "StudentRef", "Codec", "send", "recv",
           "MAX_MESSAGE"]

MAX_MESSAGE = 512 << 20          # bytes of one message, JSON and blobs together
MAX_ITEMS = 1_000_000            # blobs in one message
MAX_DEPTH = 32                   # nesting of lists, tuples and dicts
_HEADER = struct.Struct(">II")   # JSON length, number of blobs
_BLOB = struct.Struct(">Q")


class NotPlain(TypeError):
    """A value that cannot cross: not plain data."""


class ProtocolError(Exception):
    """A message that breaks the protocol (too big, too deep, malformed): the test fails."""


class Disconnected(ProtocolError):
    """The other side closed the socket."""


class StudentRef:
    """(Tester) One of the student's objects, by its name in their notebook; never sent."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"<your {self.name}>"


class Codec:
    """Values <-> JSON-able trees plus blobs; `resolve` (kernel): name -> the student's object."""

    def __init__(self, blobs: list | None = None, resolve=None):
        self.blobs = [] if blobs is None else blobs
        self.resolve = resolve

    def _blob(self, data) -> int:
        self.blobs.append(data)
        return len(self.blobs) - 1

    def enc(self, x, depth: int = 0, where: str = "the value"):
        if depth > MAX_DEPTH:
            raise NotPlain(f"{where} is nested more than {MAX_DEPTH} deep")
        t = type(x)
        if x is None or t is bool or t is str:
            return x
        if t is int:
            return x if abs(x) < 1 << 63 else {"i": str(x)}
        if t is float:
            return x if math.isfinite(x) else {"f": repr(x)}
        if t in (list, tuple, set, frozenset):
            items = [self.enc(v, depth + 1, f"an item of {where}") for v in x]
            return items if t is list else {"t" if t is tuple else "s": items}
        if t is dict:
            return {"d": [[self.enc(k, depth + 1, f"a key of {where}"),
                           self.enc(v, depth + 1, f"an item of {where}")] for k, v in x.items()]}
        if t is bytes:
            return {"b": self._blob(x)}
        if isinstance(x, StudentRef):
            return {"S": x.name}
        import torch
        if isinstance(x, torch.Tensor):
            return {"T": self._tensor(x, where)}
        if t is torch.dtype:
            return {"dt": str(x).removeprefix("torch.")}
        if t is torch.Generator:
            return {"G": self._tensor(x.get_state(), where), "dev": str(x.device)}
        if t is torch.Size:
            return {"t": [int(v) for v in x]}
        import numpy as np
        if isinstance(x, np.ndarray):
            if x.dtype.kind not in "biufc":
                raise NotPlain(f"{where} is a NumPy array of {x.dtype}, not numbers")
            a = np.ascontiguousarray(x)
            return {"A": [self._blob(a.tobytes()), a.dtype.str, list(a.shape)]}
        if isinstance(x, np.generic):                   # a NumPy scalar: its Python value
            return self.enc(x.item(), depth, where)
        for base in (int, float, str, list, tuple, dict):     # a subclass: its plain part
            if isinstance(x, base):
                return self.enc(_plain_part(x, base), depth, where)
        raise NotPlain(f"{where} is a {t.__module__}.{t.__qualname__}, which cannot cross "
                       "between the tests and your kernel (only tensors, arrays, numbers, "
                       "strings and lists / tuples / dicts of them do)")

    def _tensor(self, x, where: str) -> list:
        import torch
        if x.layout != torch.strided or x.is_quantized or x.device.type == "meta":
            raise NotPlain(f"{where} is a {x.layout} / quantized / meta tensor")
        t = torch.Tensor.detach(x).as_subclass(torch.Tensor).cpu().contiguous()
        data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        return [self._blob(data), str(t.dtype).removeprefix("torch."), list(t.shape),
                str(x.device)]

    def dec(self, x, depth: int = 0):
        if depth > MAX_DEPTH:
            raise ProtocolError("a value nested too deep")
        if x is None or type(x) in (bool, int, float, str):
            return x
        if type(x) is list:
            return [self.dec(v, depth + 1) for v in x]
        if type(x) is not dict or len(x) not in (1, 2):
            raise ProtocolError("malformed value")
        (tag, v), *rest = x.items()
        if tag == "t":
            return tuple(self.dec(i, depth + 1) for i in _list(v))
        if tag == "s":
            return set(self.dec(i, depth + 1) for i in _list(v))
        if tag == "d":
            return {self.dec(k, depth + 1): self.dec(w, depth + 1)
                    for k, w in (_list(p, 2) for p in _list(v))}
        if tag == "i":
            return int(str(v)[:4000])
        if tag == "f":
            if v not in ("nan", "inf", "-inf"):
                raise ProtocolError("malformed float")
            return float(v)
        if tag == "b":
            return bytes(self._get(v))
        if tag == "S":
            if self.resolve is None or type(v) is not str:
                raise ProtocolError("a reference to the student's object where none may be")
            return self.resolve(v)
        import torch
        if tag == "T":
            return self._dec_tensor(v)
        if tag == "dt":
            dtype = getattr(torch, str(v), None)
            if type(dtype) is not torch.dtype:
                raise ProtocolError(f"unknown dtype {str(v)[:40]}")
            return dtype
        if tag == "G":
            g = torch.Generator()
            g.set_state(self._dec_tensor(v))
            return g
        if tag == "A":
            import numpy as np
            i, dtype, shape = _list(v, 3)
            try:
                return np.frombuffer(bytes(self._get(i)), dtype=np.dtype(str(dtype))).reshape(
                    [int(s) for s in _list(shape)]).copy()
            except (TypeError, ValueError) as e:
                raise ProtocolError(f"an array that does not match its bytes ({e})") from None
        raise ProtocolError(f"unknown tag {str(tag)[:20]}")

    def _dec_tensor(self, v):
        import torch
        i, dtype_name, shape, *device = _list(v)
        dtype = getattr(torch, str(dtype_name), None)
        if type(dtype) is not torch.dtype:
            raise ProtocolError(f"unknown dtype {str(dtype_name)[:40]}")
        shape = [int(s) for s in _list(shape)]
        data = self._get(i)
        numel = math.prod(shape)
        if numel < 0 or len(data) != numel * dtype.itemsize:
            raise ProtocolError("a tensor whose bytes do not match its shape")
        if numel == 0:
            return torch.empty(shape, dtype=dtype)
        if type(data) is bytes:
            data = bytearray(data)
        return torch.frombuffer(data, dtype=torch.uint8).view(dtype).reshape(shape)

    def _get(self, i):
        if type(i) is not int or not 0 <= i < len(self.blobs):
            raise ProtocolError("a blob out of range")
        return self.blobs[i]


def _plain_part(x, base):
    """The built-in value inside a subclass instance (its own methods unused)."""
    if base is int:
        return int.__index__(x)
    if base is float:
        return float.__float__(x)
    if base is str:
        return str.__str__(x)
    if base is dict:
        return {k: dict.__getitem__(x, k) for k in dict.__iter__(x)}
    return list(list.__iter__(x)) if base is list else tuple(tuple.__iter__(x))


def _list(x, n: int | None = None) -> list:
    if type(x) is not list or (n is not None and len(x) != n):
        raise ProtocolError("malformed message")
    return x


def send(sock: socket.socket, message: dict, blobs: list) -> None:
    text = json.dumps(message, allow_nan=False).encode()
    sizes = [memoryview(b).nbytes for b in blobs]
    size = _HEADER.size + len(text) + sum(_BLOB.size + n for n in sizes)
    if size > MAX_MESSAGE:
        raise NotPlain(f"a message of {size >> 20} MB, over the {MAX_MESSAGE >> 20} MB limit")
    parts = [_HEADER.pack(len(text), len(blobs)), text]
    for b, n in zip(blobs, sizes):
        parts += [_BLOB.pack(n), b]
    sock.sendall(b"".join(parts))


def _exact(sock: socket.socket, n: int) -> bytearray:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:], min(n - got, 1 << 22))
        if not k:
            raise Disconnected("the other side closed the connection")
        got += k
    return buf


def recv(sock: socket.socket) -> tuple[dict, list[bytearray]]:
    n_text, n_blobs = _HEADER.unpack(_exact(sock, _HEADER.size))
    if n_text > MAX_MESSAGE or n_blobs > MAX_ITEMS:
        raise ProtocolError("a message over the size limit")
    try:
        message = json.loads(_exact(sock, n_text))
    except ValueError as e:          # not JSON, or an int past Python's digit limit
        raise ProtocolError(f"a message that is not JSON ({str(e)[:100]})") from None
    if type(message) is not dict:
        raise ProtocolError("a message that is not an object")
    total, blobs = n_text, []
    for _ in range(n_blobs):
        (size,) = _BLOB.unpack(_exact(sock, _BLOB.size))
        total += size
        if total > MAX_MESSAGE:
            raise ProtocolError(f"a message over the {MAX_MESSAGE >> 20} MB limit")
        blobs.append(_exact(sock, size))
    return message, blobs
