"""What tests/test_tamper.py's attacks share: the dummy lab's scores, the solution bodies, the
code snippets several attacks run, and the `Attack` record. The attacks themselves are in
tests/attacks_machine.py (the machine: gradebook, sandbox, CPUs, caches, browser, robustness)
and tests/attacks_kernel.py (the grading itself: hidden tests, references, helpers, the kernel's
memory, the connection to the tester)."""
from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass, field

import nbformat
from nbformat.v4 import new_code_cell

HONEST = "honest"
SCALE_TEST, ASSET_TEST = "99_scale_test", "99_asset_test"
# Text only the hidden part of 99_scale_test holds (tests/test_pipeline.py): none of it may be
# shown to a student. Feedback is compared as text (tags stripped, entities decoded).
HIDDEN_TOKENS = ("BEGIN HIDDEN TESTS", "END HIDDEN TESTS", "manual_seed", "apply_temperature(y",
                 "torch.randn(3, 7", "Generator()")

# --- solution bodies -----------------------------------------------------------------------
GOOD = "def scale(logits, t):\n    return logits / t\n"
# two submissions run this; each must find the grader's bytes, whatever the other wrote
POISON_CACHE = r'''
        import os
        from pathlib import Path
        _d = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
        _mine = sorted(p for p in _d.rglob("*") if p.is_file())
        print("found:", [p.read_text() for p in _mine])
        for p in _mine:
            p.write_text("import os; os.system('echo POISONED')")
        print(f"poisoned my copy: {len(_mine)} file(s)")
        for _root in @ROOTS@:
            try:
                Path(_root, "build/compile_cache/99_dummy/inductor/entry").write_text("POISON")
                print("MASTER POISONED under", _root)
            except OSError as e:
                print("master out of reach:", type(e).__name__)
        def scale(logits, t):
            return logits / t
'''
WRONG = "def scale(logits, t):\n    return logits * t          # wrong: multiplies\n"
# what each kind of `scale` earns honestly (the most each test cell may score)
E_WRONG = {SCALE_TEST: 0, ASSET_TEST: 1}
E_GOOD = {SCALE_TEST: 2, ASSET_TEST: 1}
E_NONE = {SCALE_TEST: 0, ASSET_TEST: 0}


def src(text: str) -> str:
    return textwrap.dedent(text).strip("\n") + "\n"


# Shared by the attacks that look for the hidden tests, or anything of the grader's, inside the
# kernel: the old design kept a signing secret and the hidden sources in the kernel (sealed
# cells); now the tests run in the tester and the kernel only answers calls. `_loot_frames`
# takes whatever the frames on the stack hold: strings and code objects that mention the hidden
# test marker, and the names of the modules those frames run.
STEAL = src(r'''
    import sys, re, types
    LOOT = {"sources": [], "codes": [], "notes": [], "by_route": {}, "modules": set()}
    _MARK = "BEGIN " + "HIDDEN" + " TESTS"

    def _loot_value(v, depth=0):
        if type(v) is str and _MARK in v and v != _MARK:
            LOOT["sources"].append(v)
        elif type(v) is types.CodeType and any(_MARK in str(c) for c in v.co_consts):
            LOOT["codes"].append(v)
        elif type(v) is dict and depth < 2:
            for w in list(v.values()):
                _loot_value(w, depth + 1)
        elif type(v) in (list, tuple) and depth < 2:
            for w in v[:1000]:
                _loot_value(w, depth + 1)
        elif type(v) is types.FunctionType and depth < 2:
            _loot_value(v.__code__, depth + 1)
            for c in v.__closure__ or ():
                try:
                    _loot_value(c.cell_contents, depth + 1)
                except ValueError:
                    pass

    def _loot_frames(f, route):
        """Everything reachable from the locals (and closures) of every frame on the stack."""
        before = len(LOOT["sources"]) + len(LOOT["codes"])
        while f is not None:
            LOOT["modules"].add(str(f.f_globals.get("__name__")))
            for v in list(f.f_locals.values()):
                _loot_value(v)
            f = f.f_back
        LOOT["by_route"][route] = len(LOOT["sources"]) + len(LOOT["codes"]) - before
''')

# Printed by a cell after the tests: what an attack found. Spaces are doubled so that the
# feedback's redaction of exact hidden lines does not hide what leaked.
SHOW_LOOT = src(r'''
    def _show(text):
        return "  ".join(str(text).split(" "))
    print("hidden found:", len(LOOT.get("sources", [])) + len(LOOT.get("codes", [])))
    for _route, _n in LOOT.get("by_route", {}).items():
        print("route %s: %d" % (_route, _n))
    print("frames of:", sorted(LOOT.get("modules", ())))
    print("notes:", LOOT.get("notes"))
    for _s in dict.fromkeys(LOOT.get("sources", [])):
        print("LEAKED SOURCE:\n" + _show(_s))
    for _c in LOOT.get("codes", [])[:4]:
        print("LEAKED CODE:", _show(_c.co_names),
              _show([x for x in _c.co_consts if type(x) is not types.CodeType]))
''')

# The kernel's own writable memory in chunks of 4 MB, read with ctypes.cast (no audit event).
CTYPES_CHUNKS = src(r'''
    import ctypes
    def ctypes_chunks():
        for line in open("/proc/self/maps").read().splitlines():
            parts = line.split()
            if len(parts) < 2 or not parts[1].startswith("rw") or \
                    (len(parts) > 5 and parts[5].startswith("[") and parts[5] != "[heap]"):
                continue
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if hi - lo > (1 << 30):
                continue
            for off in range(lo, hi, 4 << 20):
                n = min(4 << 20, hi - off)
                yield ctypes.cast(off, ctypes.POINTER(ctypes.c_char * n)).contents.raw
''')

MEMSCAN = src(r'''
    import struct
    def memscan(pid, bytes_type_address, mem_path=None, limit=200000):
        """32-byte bytes objects (secret candidates) and text around the hidden-test marker in
        process `pid`'s writable memory."""
        pattern = struct.pack("<Qq", bytes_type_address, 32)   # ob_type, ob_size of bytes[32]
        cands, snippets = set(), []
        maps = open("/proc/%d/maps" % pid).read().splitlines()
        mem = open(mem_path or "/proc/%d/mem" % pid, "rb", buffering=0)
        for line in maps:
            parts = line.split()
            if len(parts) < 2 or not parts[1].startswith("rw"):
                continue
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if hi - lo > (1 << 30):
                continue
            off = lo
            while off < hi:
                n = min(4 << 20, hi - off)
                try:
                    mem.seek(off)
                    chunk = mem.read(n)
                except (OSError, OverflowError, ValueError):
                    break
                i = chunk.find(pattern)
                while i >= 0 and len(cands) < limit:
                    data = chunk[i + 24:i + 56]     # after ob_shash
                    if len(data) == 32:
                        cands.add(data)
                    i = chunk.find(pattern, i + 1)
                find_hidden(chunk, snippets, "assert_close")
                off += n
        return cands, snippets

    def find_hidden(chunk, snippets, near):
        """Add the text around each hidden-test marker in `chunk` that mentions `near`."""
        j = chunk.find(b"HIDDEN" + b" TESTS")
        while j >= 0 and len(snippets) < 40:
            text = chunk[max(0, j - 400):j + 700].decode("utf-8", "replace")
            if near in text:
                snippets.append(text)
            j = chunk.find(b"HIDDEN" + b" TESTS", j + 1)
''')


@dataclass
class Attack:
    name: str                          # the student id
    what: str                          # one line for the report
    solution: str | None = None        # body of the solution cell (None: the released stub)
    after: list[str] = field(default_factory=list)     # code cells right after the solution
    at_end: list[str] = field(default_factory=list)    # code cells after the tests
    earned: dict = field(default_factory=lambda: dict(E_WRONG))
    tamper: bool = True                # must score 0 with a reason on 99_scale_test
    forbid: tuple = ()                 # strings that must not be in the attack's own outputs
    require: tuple = ()                # strings that must be (the attack really ran)
    raw: str | None = None             # a notebook file that is not a notebook
    build: object = None               # fn(released notebook) -> notebook text (special files)
    known_open: str = ""               # an attack that still succeeds: why (strict xfail)


def _notebook_with_fake_cells(nb):
    nb = nbformat.from_dict(json.loads(json.dumps(nb)))
    meta = lambda gid, points: {"nbgrader": {"schema_version": 3, "grade": True,     # noqa: E731
                                             "solution": False, "locked": False,
                                             "grade_id": gid, "points": points}}
    nb.cells[2].source = WRONG
    nb.cells[2].metadata["nbgrader"].update(grade=True, points=50)     # a graded solution cell
    nb.cells.insert(2, new_code_cell("pass", metadata=meta(SCALE_TEST, 2)))   # a duplicate id
    nb.cells.insert(3, new_code_cell("pass", metadata=meta("99_bonus", 100)))  # an unknown id
    nb.cells.append(new_code_cell("pass", metadata=meta(ASSET_TEST, 1)))
    return nbformat.writes(nb)


def _million_cells(nb):
    """1,000,000 empty markdown cells after the lab's own cells, written as text directly."""
    base = json.loads(nbformat.writes(nb))
    base["cells"][2]["source"] = GOOD
    head = json.dumps(base)
    cut = head.index('"cells": [') + len('"cells": [')
    empty = '{"cell_type": "markdown", "metadata": {}, "source": ""}'
    return head[:cut] + ", ".join([empty] * 1_000_000) + ", " + head[cut:]
