"""Probes: course functions that run the student's code where it lives, in their kernel, and
return plain values (autograder/plain.py) for a test to compare with what the tester computes.

A test passes the student's function (or class) to a probe with the test's seeds and sizes:

    from autograder.labs import lab00
    tokens = lab00.greedy_tokens(generate, prompt, 9)     # in lab00.py: @probe def greedy_...

In JupyterLab (the student running the visible tests) a probe is an ordinary call. While the
grader runs a test in the tester (autograder/tester.py), calling a probe sends its name and
arguments to the kernel, which runs it there on its own models, caches and pools, built from
the test's seeds and the shipped weights (`fresh_model`), and sends back the result: what a test
reads of a model or an object of the student's is computed in the kernel, and what it compares
that with is computed in the tester. Probes live in the lab's module, autograder/labs/labNN.py,
and are registered by the decorator; the kernel runs only registered ones.
"""
from __future__ import annotations

import functools

__all__ = ["probe", "PROBES", "fresh_model", "working_model", "connection"]

PROBES: dict = {}        # "module:qualname" -> the probe's own function
_CONNECTION = None       # (tester) the kernel of the running test: tester.Kernel


def connection():
    """The tester's connection to the kernel during a test, else None (in the kernel itself,
    in JupyterLab, in the instructor's measurements)."""
    return _CONNECTION


def probe(fn):
    """Register `fn` as a probe: in the tester during a test, it runs in the student's kernel."""
    name = f"{fn.__module__}:{fn.__qualname__}"
    PROBES[name] = fn

    @functools.wraps(fn)
    def run(*args, **kwargs):
        kernel = _CONNECTION
        if kernel is not None:
            return kernel.probe(name, args, kwargs)
        return fn(*args, **kwargs)
    run.probe_name = name
    return run


_PRISTINE: dict = {}
_WORKING: dict = {}


def fresh_model(name: str = "target"):
    """A fresh copy of a shipped checkpoint (`minillm.load(name)`, loaded once per process):
    what the student's code does to it reaches no other probe."""
    import copy
    if name not in _PRISTINE:
        import minillm
        _PRISTINE[name] = minillm.load(name)
    return copy.deepcopy(_PRISTINE[name])


def working_model(name: str = "target"):
    """One copy of a shipped checkpoint kept for the timed probes (loaded once per process):
    a speed check times the student's code, not the loading."""
    if name not in _WORKING:
        _WORKING[name] = fresh_model(name)
    return _WORKING[name]
