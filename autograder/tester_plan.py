"""Which labs run their tests in the tester (autograder/tester.py), and which of the student's
names those tests may read from the kernel: worked out by the grader from the instructor's
source notebook, before any submission runs (no torch needed)."""
from __future__ import annotations

__all__ = ["uses_tester", "tester_plan", "modules_mode"]


def tester_plan(source_nb) -> dict | None:
    """For a lab whose tests run in the tester (autograder/tester.py; `uses_tester`): the names
    they may read from the kernel, those the unlocked cells bind ("names"), and for each test
    the names it reads that an unlocked cell rebound after a locked cell had bound them
    ("rebound", grade_id -> names): the tester holds the locked cell's value, the kernel the
    newer one, and the test must read the kernel's, as it would in one kernel; and how the
    tester's modules cross ("modules": "stand-in", a stand-in whose forward runs in the tester,
    or "copy", the whole module: autograder/remote_objects.py). None: tests in the kernel."""
    from .seal import bound_names, free_names, imported_names
    if not uses_tester(source_nb):
        return None
    names: set[str] = set()
    stale: dict[str, bool] = {}         # name -> its newest binding is the kernel's, not ours
    rebound: dict[str, list[str]] = {}
    for c in source_nb.cells:
        if c.cell_type != "code":
            continue
        m = c.metadata.get("nbgrader", {})
        bound = bound_names(c.source)
        if not m.get("locked"):
            names |= bound - imported_names(c.source)
            stale.update({n: True for n in bound if n in stale})
            continue
        if m.get("grade"):
            reads = sorted(n for n in free_names(c.source) or () if stale.get(n))
            if reads:
                rebound[m.get("grade_id", "?")] = reads
        stale.update({n: False for n in bound})
    return {"names": sorted(names), "rebound": rebound, "modules": modules_mode(source_nb)}


def uses_tester(source_nb) -> bool:      # the instructor's notebook, never a submission
    return source_nb.metadata.get("autograder", {}).get("tests") == "tester"


def modules_mode(source_nb) -> str:
    """"copy" or "stand-in" (the default): how a lab's tests hand the student's code a module."""
    mode = source_nb.metadata.get("autograder", {}).get("modules", "stand-in")
    if mode not in ("copy", "stand-in"):
        raise ValueError(f"the notebook's autograder.modules is {mode!r}: \"copy\" or "
                         "\"stand-in\"")
    return mode
