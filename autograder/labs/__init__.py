"""Each lab's grading module, `autograder/labs/labNN.py`: its probes (autograder/probes.py: the
functions that run the student's code in their kernel and return plain values) and, for a lab
with a timed claim, `SPEED_CHECK = SpeedCheck(...)` (autograder/labs/speedcheck.py): grade id,
threshold, the measure, a reference and a counter-example in the notebook's signature, and the
failure hint. The notebook's graded cell calls the check (e.g.
`lab03.check_absorbed_speedup(mla_attend_absorbed)`, an alias of `SPEED_CHECK.check`).

tests/test_speed_checks.py runs every check many times, also under a competing CPU load, and
requires True every time for the reference and False every time for the counter-example. Keep
each check to a second or two, with a threshold well below what the reference reaches on a
loaded 2-core machine.
"""
from __future__ import annotations

import importlib
import pkgutil
import re
from types import ModuleType

_LAB_MODULE = re.compile(r"^lab\d\d$")
_MODELS: dict = {}


def shipped_model(name: str = "target"):
    """A shipped checkpoint (`minillm.load(name)`), loaded once per process for the checks."""
    if name not in _MODELS:
        import minillm
        _MODELS[name] = minillm.load(name)
    return _MODELS[name]


def lab_modules() -> list[ModuleType]:
    """Import and return every autograder.labs.labNN module, in order."""
    names = sorted(m.name for m in pkgutil.iter_modules(__path__) if _LAB_MODULE.match(m.name))
    return [importlib.import_module(f"{__name__}.{n}") for n in names]


def speed_checks() -> dict:
    """{"labNN": SpeedCheck} for every lab module that defines SPEED_CHECK, in lab order."""
    from .speedcheck import SpeedCheck
    checks = {}
    for mod in lab_modules():
        check = getattr(mod, "SPEED_CHECK", None)
        if check is None:
            continue
        if not isinstance(check, SpeedCheck):
            raise TypeError(f"{mod.__name__}.SPEED_CHECK must be a SpeedCheck, got "
                            f"{type(check).__name__}")
        checks[mod.__name__.rsplit(".", 1)[-1]] = check
    return checks
