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
    or "copy", the whole module: autograder/remote_objects.py); and for each test the names its
    visible part binds that a later cell of the kernel reads ("handed", grade_id -> names: in
    one kernel the test would have bound them there, so the tester hands their values over
    after the test, by value); and the locked cells that are not tests but run in the kernel
    only ("kernel_only", grade_ids): those that call the student's code (they read a name an
    unlocked cell binds, and do more than define functions and classes) and those whose
    metadata says `{"autograder": {"runs": "kernel"}}` (a class whose objects the student's
    code changes in place, such as lab 07's BlockPool: the tests make them in the kernel). The
    tests read what such a cell binds from the kernel, as they read the student's names.
    None: tests in the kernel."""
    from .seal import bound_names, defines_only, free_names, imported_names
    if not uses_tester(source_nb):
        return None
    names: set[str] = set()
    stale: dict[str, bool] = {}         # name -> its newest binding is the kernel's, not ours
    rebound: dict[str, list[str]] = {}
    pending: dict[str, str] = {}        # name -> the test whose visible part bound it last
    handed: dict[str, set[str]] = {}
    kernel_only: list[str] = []
    for c in source_nb.cells:
        if c.cell_type != "code":
            continue
        m = c.metadata.get("nbgrader", {})
        bound = bound_names(c.source)
        if m.get("locked") and m.get("grade"):          # a test: it runs in the tester
            gid = m.get("grade_id", "?")
            reads = sorted(n for n in free_names(c.source) or () if stale.get(n))
            if reads:
                rebound[gid] = reads
            stale.update({n: False for n in bound})
            visible, hidden = _parts(c.source)
            for n in bound_names(hidden):
                pending.pop(n, None)                    # never a value the hidden part made
            pending.update({n: gid for n in bound_names(visible) - bound_names(hidden)})
            continue
        reads = free_names(c.source) or set()
        for n in sorted(reads & set(pending)):
            handed.setdefault(pending[n], set()).add(n)
        for n in bound:                                  # the kernel binds it itself
            pending.pop(n, None)
        if m.get("locked") and ((reads & names and not defines_only(c.source)) or
                                c.metadata.get("autograder", {}).get("runs") == "kernel"):
            kernel_only.append(m.get("grade_id", "?"))   # read like the student's names
            names |= bound - imported_names(c.source)
            stale.update({n: True for n in bound if n in stale})
        elif not m.get("locked"):
            names |= bound - imported_names(c.source)
            stale.update({n: True for n in bound if n in stale})
        else:
            stale.update({n: False for n in bound})
    return {"names": sorted(names), "rebound": rebound, "modules": modules_mode(source_nb),
            "handed": {gid: sorted(ns) for gid, ns in handed.items()},
            "kernel_only": kernel_only}


def _parts(source: str) -> tuple[str, str]:
    """A test cell's visible part and its hidden tests."""
    from .seal import hidden_lines
    hidden = hidden_lines(source)
    lines = source.splitlines()
    return ("\n".join(x for i, x in enumerate(lines, 1) if i not in hidden),
            "\n".join(x for i, x in enumerate(lines, 1) if i in hidden))


def uses_tester(source_nb) -> bool:      # the instructor's notebook, never a submission
    return source_nb.metadata.get("autograder", {}).get("tests") == "tester"


def modules_mode(source_nb) -> str:
    """"copy" or "stand-in" (the default): how a lab's tests hand the student's code a module."""
    mode = source_nb.metadata.get("autograder", {}).get("modules", "stand-in")
    if mode not in ("copy", "stand-in"):
        raise ValueError(f"the notebook's autograder.modules is {mode!r}: \"copy\" or "
                         "\"stand-in\"")
    return mode
