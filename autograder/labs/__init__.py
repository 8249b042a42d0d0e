"""Registry of the labs' speed checks.

Each lab with a timed claim has a module `autograder/labs/labNN.py` defining

    SPEED_CHECKS: dict[str, Callable[[], bool]]   # runs the lab's speed check against the
                                                  # minillm reference; returns the verdict
    SLOW_CHECKS:  dict[str, Callable[[], bool]]   # optional: the same check against a
                                                  # deliberately slow candidate (must be False)

tests/test_speed_checks.py runs every SPEED_CHECK many times, also under a competing CPU load,
and requires True every time (and False every time for SLOW_CHECKS). Keep each check well under
a second or two: build ratios with autograder.time_ratio / check_ratio and a threshold well below
what the reference reaches on a loaded 2-core machine.
"""
from __future__ import annotations

import importlib
import pkgutil
import re
from types import ModuleType
from typing import Callable

_LAB_MODULE = re.compile(r"^lab\d\d$")
_MODELS: dict = {}


def shipped_model(name: str = "target"):
    """A shipped checkpoint (`minillm.load(name)`), loaded once per process for the checks."""
    if name not in _MODELS:
        import minillm
        _MODELS[name] = minillm.load(name)
    return _MODELS[name]


def passes(check: Callable, *args) -> bool:
    """A registry verdict: True if `check(*args)` returns, False if it raises AssertionError."""
    try:
        check(*args)
    except AssertionError:
        return False
    return True


def lab_modules() -> list[ModuleType]:
    """Import and return every autograder.labs.labNN module, in order."""
    names = sorted(m.name for m in pkgutil.iter_modules(__path__) if _LAB_MODULE.match(m.name))
    return [importlib.import_module(f"{__name__}.{n}") for n in names]


def _collect(attr: str) -> dict[str, Callable[[], bool]]:
    checks: dict[str, Callable[[], bool]] = {}
    for mod in lab_modules():
        table = getattr(mod, attr, None) or {}
        if not isinstance(table, dict):
            raise TypeError(f"{mod.__name__}.{attr} must be a dict of name -> callable")
        for name, fn in table.items():
            if not callable(fn):
                raise TypeError(f"{mod.__name__}.{attr}[{name!r}] is not callable")
            checks[f"{mod.__name__.rsplit('.', 1)[-1]}.{name}"] = fn
    return checks


def all_speed_checks() -> dict[str, Callable[[], bool]]:
    """{"labNN.check_name": check} for every SPEED_CHECKS entry of every lab module."""
    return _collect("SPEED_CHECKS")


def all_slow_checks() -> dict[str, Callable[[], bool]]:
    """{"labNN.check_name": check} for every SLOW_CHECKS entry (their verdict must be False)."""
    return _collect("SLOW_CHECKS")
