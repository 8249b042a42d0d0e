"""The frames of autograder/remote.py's protocol on a socket: one message is a JSON object and
raw byte blobs (tensor data), each length-prefixed, read with hard limits before anything is
decoded. Nothing here ever unpickles or evaluates what it reads."""
from __future__ import annotations

import json
import socket
import struct

__all__ = ["ProtocolError", "Disconnected", "MAX_MESSAGE", "MAX_ITEMS"]

MAX_MESSAGE = 256 << 20          # bytes of one message, JSON and blobs together
MAX_ITEMS = 1_000_000            # values (or blobs) in one message
_HEADER = struct.Struct(">II")   # JSON length, number of blobs
_BLOB = struct.Struct(">Q")


class ProtocolError(Exception):
    """A message that breaks the protocol: too big, too deep, not JSON, a tensor whose bytes do
    not match its shape, an unknown tag. The tester treats it as a failed test."""


class Disconnected(ProtocolError):
    """The other side closed the socket (the student's kernel died, was interrupted, or
    closed it)."""


def _send(sock: socket.socket, message: dict, blobs: list) -> None:
    """`blobs`: bytes-like (bytes, or a memoryview of a tensor's bytes: sent without a copy)."""
    text = json.dumps(message, allow_nan=False).encode()
    sizes = [memoryview(b).nbytes for b in blobs]
    size = _HEADER.size + len(text) + sum(_BLOB.size + n for n in sizes)
    if size > MAX_MESSAGE:
        raise ProtocolError(f"a message of {size >> 20} MB, over the {MAX_MESSAGE >> 20} MB limit")
    small = [_HEADER.pack(len(text), len(blobs)), text]
    for b, n in zip(blobs, sizes):
        small.append(_BLOB.pack(n))
        if n < 65536:
            small.append(bytes(b))
        else:                               # a large blob goes as is, after what precedes it
            sock.sendall(b"".join(small))
            sock.sendall(b)
            small = []
    if small:
        sock.sendall(b"".join(small))


def _recv_exact(sock: socket.socket, n: int) -> bytearray:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:], min(n - got, 1 << 22))
        if not k:
            raise Disconnected("the other side closed the connection")
        got += k
    return buf


def _recv(sock: socket.socket) -> tuple[dict, list[bytearray]]:
    n_text, n_blobs = _HEADER.unpack(_recv_exact(sock, _HEADER.size))
    if n_text > MAX_MESSAGE or n_blobs > MAX_ITEMS:
        raise ProtocolError("a message over the size limit")
    total = n_text
    try:
        message = json.loads(_recv_exact(sock, n_text))
    except ValueError as e:          # not JSON, or an int past Python's digit limit
        raise ProtocolError(f"a message that is not JSON ({str(e)[:100]})") from None
    if not isinstance(message, dict):
        raise ProtocolError("a message that is not an object")
    blobs = []
    for _ in range(n_blobs):
        (size,) = _BLOB.unpack(_recv_exact(sock, _BLOB.size))
        total += size
        if total > MAX_MESSAGE:
            raise ProtocolError(f"a message over the {MAX_MESSAGE >> 20} MB limit")
        blobs.append(_recv_exact(sock, size))
    return message, blobs


# --- reading a decoded message's parts ------------------------------------------------------
def _list(x, n: int | None = None) -> list:
    if type(x) is not list or (n is not None and len(x) != n):
        raise ProtocolError("malformed message")
    return x


def _pairs(x) -> list:
    return [_list(p, 2) for p in _list(x)]


def _int(x) -> int:
    if type(x) is not int:
        raise ProtocolError("malformed message")
    return x
