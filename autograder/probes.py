"""Probes (autograder/README.md): `@probe` registers a lab's course function; during a test in
the tester a call runs it in the student's kernel, elsewhere it is an ordinary call.
"""
from __future__ import annotations

import functools

__all__ = ["probe", "PROBES", "shipped_model", "fresh_model", "working_model", "connection"]

PROBES: dict = {}        # "module:qualname" -> the probe's own function
_CONNECTION = None       # (tester) the kernel of the running test: tester.Kernel


def connection():
    """The tester's connection to the kernel during a test, else None."""
    return _CONNECTION


def probe(fn):
    name = f"{fn.__module__}:{fn.__qualname__}"
    PROBES[name] = fn

    @functools.wraps(fn)
    def run(*args, **kwargs):
        if (kernel := _CONNECTION) is not None:
            return kernel.probe(name, args, kwargs)
        return fn(*args, **kwargs)
    return run


_PRISTINE: dict = {}
_WORKING: dict = {}


def shipped_model(name: str = "target"):
    """A shipped checkpoint, loaded once per process (the checks' baselines: not to change)."""
    if name not in _PRISTINE:
        import minillm
        _PRISTINE[name] = minillm.load(name)
    return _PRISTINE[name]


def fresh_model(name: str = "target"):
    """A fresh copy of a shipped checkpoint."""
    import copy
    return copy.deepcopy(shipped_model(name))


def working_model(name: str = "target"):
    """One copy of a shipped checkpoint kept for the timed probes: they time code, not loading."""
    if name not in _WORKING:
        _WORKING[name] = fresh_model(name)
    return _WORKING[name]
