"""The kernel's side of a test that runs in the tester: `serve(path)` answers "lookup", "call",
"probe" and "done" with plain values (autograder/plain.py), sends back arguments the call
changed in place, and never sees the test's text.
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
    given = [*enumerate(args), *kwargs.items()]        # (position or keyword, argument)
    before = [_snapshot(a) for _, a in given]
    result = fn(*args, **kwargs)
    body = {"ok": out.enc(result, where=f"what {what} returned")}
    if changed := [[key, out.enc(a, where=f"argument {key} after {what}")]
                   for (key, a), b in zip(given, before) if not _same(b, _snapshot(a))]:
        body["changed"] = changed
    return body


def _probe(name) -> object:
    from .probes import PROBES
    module = str(name).partition(":")[0]
    if name not in PROBES and module.startswith("autograder.labs."):
        importlib.import_module(module)          # registers its probes
    if name not in PROBES:
        raise ProtocolError(f"no probe {str(name)[:80]}")
    return PROBES[name]


def _snapshot(x, depth: int = 0):
    """What an argument holds, to see whether a call changed it."""
    import numpy as np
    import torch
    if isinstance(x, torch.Tensor):
        return ("T", x.detach().clone())
    if isinstance(x, np.ndarray):
        return ("A", x.copy())
    if isinstance(x, torch.Generator):
        return ("G", x.get_state())
    if type(x) in (list, tuple) and depth < 8:
        return ("l", [_snapshot(v, depth + 1) for v in x])
    if type(x) is dict and depth < 8:
        return ("d", [(k, _snapshot(v, depth + 1)) for k, v in x.items()])
    return ("v", x if x is None or type(x) in (bool, int, float, str) else id(x))


def _same(a, b) -> bool:
    import numpy as np
    import torch
    if a[0] != b[0]:
        return False
    if a[0] in ("T", "G", "A"):
        equal = np.array_equal if a[0] == "A" else torch.equal
        return a[1].shape == b[1].shape and a[1].dtype == b[1].dtype and equal(a[1], b[1])
    if a[0] == "l":
        return len(a[1]) == len(b[1]) and all(map(_same, a[1], b[1]))
    if a[0] == "d":
        return [k for k, _ in a[1]] == [k for k, _ in b[1]] and \
            all(_same(x, y) for (_, x), (_, y) in zip(a[1], b[1]))
    return a[1] == b[1] or a[1] != a[1]       # (NaN: unchanged)


def _text(e: BaseException) -> str:
    try:
        text = str(e)
    except Exception:                        # noqa: BLE001 - a __str__ that raises
        text = "(its message could not be read)"
    return text[:MAX_TEXT]
