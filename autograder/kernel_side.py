"""The kernel's side of a test that runs in the tester: `serve(path)` answers "lookup", "call",
"probe" and "done" with plain values (autograder/plain.py) and never sees the test's text.
"""
from __future__ import annotations

import importlib
import socket

from .plain import Codec, Disconnected, ProtocolError, recv, send

__all__ = ["serve", "MAX_TEXT"]

MAX_TEXT = 4000                  # characters of an exception message that cross


def serve(path: str, namespace: dict | None = None) -> None:
    """Answer the tester at `path` until it is done; `namespace`: default IPython's."""
    if namespace is None:
        namespace = __import__("IPython").get_ipython().user_ns
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
        while True:
            message, blobs = recv(sock)
            if message.get("op") == "done":
                send(sock, {"ok": None}, [])
                return
            reply = Codec()
            try:
                body = _answer(message, blobs, namespace, reply)
            except (KeyboardInterrupt, SystemExit, Disconnected):
                raise
            except BaseException as e:        # noqa: BLE001 - whatever the call raised
                reply = Codec()
                body = {"err": [type(e).__name__, _text(e)]}
            send(sock, body, reply.blobs)
    finally:
        sock.close()


def _lookup(namespace: dict, name) -> object:
    if type(name) is not str or name not in namespace:
        raise NameError(f"name {name!r} is not defined in your notebook")
    return namespace[name]


def _answer(message: dict, blobs: list, namespace: dict, out: Codec) -> dict:
    op = message.get("op")
    if op == "lookup":
        value = _lookup(namespace, message.get("name"))
        return {"ok": {"d": [["callable", True]]} if callable(value)
                else out.enc(value, where=f"your {message['name']}")}
    if op == "call":
        fn = _lookup(namespace, message.get("name"))
        what = f"your {message['name']}"
    elif op == "probe":
        fn, what = _probe(message.get("fn")), f"the probe {message.get('fn')}"
    else:
        raise ProtocolError(f"unknown request {str(op)[:20]}")
    inputs = Codec(blobs, resolve=lambda n: _lookup(namespace, n))
    args, kwargs = inputs.dec(message.get("args")), inputs.dec(message.get("kwargs"))
    if type(args) is not tuple or type(kwargs) is not dict:
        raise ProtocolError("malformed call")
    return {"ok": out.enc(fn(*args, **kwargs), where=f"what {what} returned")}


def _probe(name) -> object:
    from .probes import PROBES
    module = str(name).partition(":")[0]
    if name not in PROBES and module.startswith("autograder.labs."):
        importlib.import_module(module)          # registers its probes
    if name not in PROBES:
        raise ProtocolError(f"no probe {str(name)[:80]}")
    return PROBES[name]


def _text(e: BaseException) -> str:
    try:
        text = str(e)
    except Exception:                        # noqa: BLE001 - a __str__ that raises
        text = "(its message could not be read)"
    return text[:MAX_TEXT]
