"""Attacks on the grading itself (tests/test_tamper.py grades them): reading the hidden tests,
delegating to the withheld reference, patching the helpers, IPython's machinery, the old sealed
cells' hook and values shown to the grader (which no longer exist: these find nothing to
attack), reading the kernel's own memory, and the connection to the tester."""
from __future__ import annotations

from attacks_common import (
    CTYPES_CHUNKS,
    E_GOOD,
    E_NONE,
    E_WRONG,
    GOOD,
    MEMSCAN,
    SHOW_LOOT,
    STEAL,
    WRONG,
    Attack,
    src,
)

ATTACKS = [
    # 2. the hidden tests -----------------------------------------------------------------------
    Attack("hidden_tests", "print In / _ih / the history db; search the file system for "
           "notebooks, json and db files holding HIDDEN; inside scale, reach the test's frame: "
           "sys._getframe(1), inspect.stack(), inspect.currentframe().f_back, tb_frame.f_back, "
           "and the f_back chain of a generator whose frame was read before the test (f_back "
           "is not audited): steal `ref`, print any code object found in a frame's locals; "
           "otherwise raise an exception carrying what was found. The tests run in the "
           "tester: the frames are the kernel's own (kernel_side.serve), holding no test",
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
    ''')], at_end=["hunt()", STEAL + SHOW_LOOT], earned=E_WRONG, tamper=False,
           forbid=("STOLE REF", "HIT /", "manual_seed", "randn(3, 7"),
           require=("HITS", "hidden found:", "FRAMES")),

    # 3. delegating to the reference -------------------------------------------------------------
    Attack("delegation", "scale delegates to minillm.sampling.apply_temperature through a default "
           "argument, a closure, a list, a dict, functools.partial, an import alias, a class "
           "attribute, the module attribute, a library function that calls it (filter_logits), "
           "the module reloaded, and the reference's source "
           "read from the installed package: each fails, the reference is withheld from the "
           "kernel (autograder/withheld.py)",
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
                    ("module-attribute", lambda x, t: minillm.sampling.apply_temperature(x, t)),
                    ("library-caller", lambda x, t: minillm.sampling.filter_logits(x, t))]
        import importlib, inspect, pathlib, site
        def _reloaded(x, t):
            return importlib.reload(minillm.sampling).apply_temperature(x, t)
        def _from_source(x, t):
            places = [pathlib.Path(p) for p in site.getsitepackages() + ["/work", "/tmp", "/"]]
            texts = [inspect.getsource(minillm.sampling)]
            for p in places:
                if p.is_dir():
                    texts += [f.read_text() for f in list(p.glob("*/minillm/sampling.py"))[:5]]
            for text in texts:
                if "def apply_temperature" in text and "is withheld while" not in text:
                    ns = {}
                    exec(text, ns)
                    return ns["apply_temperature"](x, t)
            raise NotImplementedError("no source of the reference found")
        VARIANTS += [("reload", _reloaded), ("source", _from_source)]
        def scale(logits, t):
            refused = []
            for name, f in VARIANTS:
                try:
                    out = f(logits, t)
                except NotImplementedError:
                    refused.append(name)
                    continue
                print("DELEGATED via", name)
                return out
            if logits.dim() == 1:
                print("refused: " + " ".join(refused))
                return logits / t                  # the visible test: right on 1-D input
            raise AssertionError("refused: " + " ".join(refused))
    '''), earned=E_WRONG, tamper=False, forbid=("DELEGATED via",),
           require=("refused: default-argument closure list dict functools.partial import-alias "
                    "class-attribute module-attribute library-caller reload source",)),

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
        sys.modules["autograder"] = fake
        print("helpers replaced")
    '''), require=("helpers replaced",)),
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
        print("lazy helpers planted")
    '''), require=("lazy helpers planted",)),
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
        print("helpers reimported")
    '''), require=("helpers reimported",)),
    Attack("unwatched_state", "state the integrity check does not snapshot, each enough for "
           "full marks: contextlib._GeneratorContextManager.__exit__ swallowing AssertionError "
           "(contextlib is not watched: the hidden check inside `with reference_disabled(...)` "
           "cannot fail); assert_close.__kwdefaults__ mutated in place (atol = rtol = 1e9, the "
           "same dict object); a global torch TorchFunctionMode and a torch.Tensor subclass "
           "returned by scale making isclose / eq say 'equal' (it crosses to the tester as a "
           "plain tensor)",
           src('''
        import contextlib, torch, autograder.checks, minillm.sampling
        from torch.overrides import TorchFunctionMode
        _orig_exit = contextlib._GeneratorContextManager.__exit__
        def _swallow(self, typ, value, tb):
            result = _orig_exit(self, typ, value, tb)      # still restores the reference
            return True if typ is not None and issubclass(typ, AssertionError) else result
        contextlib._GeneratorContextManager.__exit__ = _swallow
        autograder.checks.assert_close.__kwdefaults__.update(atol=1e9, rtol=1e9)
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
        print("state planted")
    '''), require=("state planted",)),

    # 5. IPython's machinery ---------------------------------------------------------------------
    Attack("ipython", "set_custom_exc swallowing every exception, sys.excepthook / showtraceback "
           "replaced; later cells never run: an input transformer and an AST transformer turn "
           "them into `pass`, run_cell / run_cell_async and kernel.do_execute answer ok without "
           "running; autograder.kernel_side.serve (the kernel's side of each test) replaced by "
           "a fake that never answers",
           WRONG + src('''
        import sys, ast
        import autograder.kernel_side
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
        autograder.kernel_side.serve = lambda *a, **k: None
        print("ipython replaced")
    '''), earned=E_NONE, require=("ipython replaced",)),
    Attack("partial_credit", "scale emits an execute_result (get_ipython().displayhook) in the "
           "test cell: nbgrader takes the first execute_result of a test cell as its grade "
           "(text that is not a number = full marks) before it looks at the error output the "
           "executor appends after it",
           src('''
        def scale(logits, t):
            get_ipython().displayhook("full marks")
            return logits * t                   # wrong
    ''')),
    # 6. what the old sealed cells' hook refused ------------------------------------------------
    Attack("sealed_hook", "the primitives the old sealed-cell hook refused (gc walks, "
           "_current_frames, settrace / setprofile, ctypes, cffi, _testcapi, /proc/self/mem, "
           "/proc/1/environ, a symlink to /proc) used during the tests to look for the hidden "
           "tests, and an audit hook of the notebook's own that puts no-op assert_close / "
           "reference_disabled into any namespace it sees: the tests run in the tester, so "
           "nothing of theirs is in the kernel to find or change",
           WRONG + STEAL + src(r'''
        import os, gc, contextlib, subprocess
        RESULTS = []
        def probe(name, fn):
            try:
                fn()
                RESULTS.append("PROBE %s: ALLOWED" % name)
            except BaseException as e:
                RESULTS.append("PROBE %s: refused (%s)" % (name, type(e).__name__))
        def _loot_all():
            for o in gc.get_objects():
                _loot_value(o)
            for f in sys._current_frames().values():
                _loot_frames(f, "_current_frames")
        probe("gc.get_objects", _loot_all)
        probe("sys.settrace", lambda: sys.settrace(lambda *a: None))
        probe("sys.setprofile", lambda: sys.setprofile(lambda *a: None))
        probe("ctypes.string_at", lambda: __import__("ctypes").string_at(id(os), 8))
        probe("import _testcapi", lambda: __import__("_testcapi"))
        probe("open /proc/self/mem", lambda: open("/proc/self/mem", "rb").close())
        probe("open /proc/1/environ", lambda: open("/proc/1/environ", "rb").read())
        probe("symlink /proc/self/mem", lambda: os.symlink("/proc/self/mem", "m"))
        def _during(info):                 # in each test cell: walk everything again
            if "kernel_side" in (info.raw_cell or ""):
                probe("gc during a test", _loot_all)
        get_ipython().events.register("pre_run_cell", _during)
        def _my_hook(event, args):
            try:
                for item in args if type(args) is tuple else ():
                    if type(item) is dict and "__builtins__" in item and "assert_close" in item:
                        item["assert_close"] = lambda *a, **k: None
                        item["reference_disabled"] = lambda *a, **k: contextlib.nullcontext()
                        if "INJECTED into a test namespace" not in LOOT["notes"]:
                            LOOT["notes"].append("INJECTED into a test namespace")
            except Exception as e:
                LOOT["notes"].append(repr(e)[:100])
        sys.addaudithook(_my_hook)
        print("\\n".join(RESULTS))
    '''), at_end=['print("\\n".join(RESULTS))', SHOW_LOOT],
           forbid=("INJECTED", "LEAKED SOURCE", "LEAKED CODE"),
           require=("PROBE gc.get_objects: ALLOWED", "PROBE gc during a test: ALLOWED",
                    "hidden found: 0")),
    Attack("hook_reentry", "student code run in the middle of the kernel's side of a test (the "
           "old design's audit hook ran there, holding a signing secret and the hidden "
           "sources): a gc.callbacks callback, with gc.set_threshold(1) around the test cells, "
           "and a __del__ of the `x` the visible test binds, each looting every frame on the "
           "stack for the hidden tests",
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
            if "autograder.kernel_side" in (info.raw_cell or ""):
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

    '''), at_end=[SHOW_LOOT], forbid=("LEAKED SOURCE", "LEAKED CODE"),
           require=("hidden found: 0", "route gc callback: 0")),
    Attack("memory_read", "the kernel's memory read three ways for the hidden tests (the old "
           "design's kernel held them, and a signing secret): /proc/self/mem opened under a str "
           "subclass name; a child process reading /proc/<kernel pid>/mem; ctypes.cast over "
           "every writable mapping. The tests run in the tester: none is there to find",
           WRONG + STEAL + MEMSCAN + CTYPES_CHUNKS + src(r'''
        import os, json, ctypes, struct, subprocess
        # the kernel's memory
        class _Name(str):
            pass
        try:
            cands, snippets = memscan(os.getpid(), id(bytes), mem_path=_Name("/proc/self/mem"))
            LOOT["by_route"]["/proc/self/mem (str subclass)"] = len(snippets)
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
            LOOT["by_route"]["child process"] = len(out.get("snippets", []))
            LOOT["sources"] += out.get("snippets", [])
            if r.stderr:
                LOOT["notes"].append("child: " + r.stderr[-300:])
        except Exception as e:
            LOOT["notes"].append("child: " + repr(e)[:200])
        try:
            _found = []
            for _chunk in ctypes_chunks():
                find_hidden(_chunk, _found, "assert_close")
            LOOT["by_route"]["ctypes"] = len(_found)
            LOOT["sources"] += _found
        except Exception as e:
            LOOT["notes"].append("ctypes: " + repr(e)[:200])
    '''), at_end=[SHOW_LOOT], require=("hidden found: 0", "route ctypes: 0",
                                       "route child process: 0"),
           forbid=("LEAKED SOURCE",)),
    Attack("memory_read_sources", "ctypes.cast reads the kernel's own memory for the text of "
           "the hidden tests (the old design's kernel held them to run them) and prints it, "
           "spaces doubled past the feedback's redaction",
           WRONG + MEMSCAN + CTYPES_CHUNKS + src(r'''
        _found = []
        for _chunk in ctypes_chunks():
            find_hidden(_chunk, _found, "apply_temperature" + "(y")
        print("hidden sources found:", len(_found))
        for _s in list(dict.fromkeys(_found))[:2]:
            print("LEAKED SOURCE:\n" + "  ".join(_s.split(" ")))
    '''), require=("hidden sources found:",), forbid=("LEAKED SOURCE",), tamper=False),
    # what the kernel sends back (the old design's "values shown to the grader" became the
    # kernel's answers to the tester: plain values, read with hard limits)
    Attack("evidence_off", "a right `scale`, but the kernel's answers to the tester are "
           "dropped (autograder.plain.send a no-op in the kernel), as a kernel that would "
           "rather say nothing than be judged: the tester waits, the test fails",
           src('''
        import autograder.kernel_side
        autograder.kernel_side.send = lambda *a, **k: None
        print("answers off")
    ''') + GOOD, earned=E_NONE, require=("answers off",), tamper=False),
    Attack("evidence_flood", "a right `scale` that, called by the hidden test, floods the reply: "
           "5,000 entries of 4 kB each under a key the tester never reads (the old copy-back's "
           "'changed'), beside the right result",
           src('''
        import autograder.kernel_side as _ks
        _real = _ks._answer
        def _flooding(message, blobs, namespace, out):
            body = _real(message, blobs, namespace, out)
            if "ok" in body and len(message.get("args", {}).get("t", [])) == 2:
                body["changed"] = [[99, "x" * 4000]] * 5000
            return body
        _ks._answer = _flooding
        print("flooding answers")
        def scale(logits, t):
            return logits / t
    '''), earned=E_GOOD, require=("flooding answers",), tamper=False),
    Attack("evidence_past_a_float", "a right `scale` on the visible test; on the hidden one it "
           "returns a list of ints of 400 digits where floats are expected (an int JSON allows "
           "and no float holds)",
           src('''
        print("returning numbers past a float")
        def scale(logits, t):
            if logits.dim() == 2:
                return [[10**400] * logits.shape[1]] * logits.shape[0]
            return logits / t
    '''), earned=E_WRONG, require=("returning numbers past a float",)),
    Attack("kernel_message_unreadable", "a right `scale` that, in the hidden call, lifts "
           "Python's limit on int digits in the kernel and displays a 20,000-digit int: a "
           "message the grader's Jupyter client cannot decode",
           src('''
        import sys
        from IPython.display import display
        print("sending an unreadable message")
        def scale(logits, t):
            if logits.dim() == 2:
                sys.set_int_max_str_digits(0)
                display({"application/json": {"value": 10**20000}}, raw=True)
            return logits / t
    '''), earned=E_GOOD, require=("sending an unreadable message",)),
    Attack("sealed_hook_detected", "a background thread flips autograder.assert_close and "
           "autograder.checks.assert_close to fakes and back in a loop; a SIGALRM handler "
           "(setitimer) walks every frame on the stack during the tests for the test's `ref`",
           WRONG + src('''
        import threading, time, signal, torch, autograder, autograder.checks
        _orig = (autograder.assert_close, autograder.checks.assert_close)
        _fakes = (lambda *a, **k: None, lambda *a, **k: None)
        def _flip():
            end = time.time() + 60
            while time.time() < end:
                autograder.assert_close, autograder.checks.assert_close = _fakes
                time.sleep(0.0005)
                autograder.assert_close, autograder.checks.assert_close = _orig
                time.sleep(0.0005)
        threading.Thread(target=_flip, daemon=True).start()
        SEEN, ALARMS = [], [0]
        def _on_alarm(signum, frame):
            ALARMS[0] += 1
            f = frame
            while f is not None:
                if "ref" in f.f_locals:
                    SEEN.append(repr(f.f_locals["ref"])[:100])
                f = f.f_back
        signal.signal(signal.SIGALRM, _on_alarm)
        signal.setitimer(signal.ITIMER_REAL, 0.05, 0.05)
    '''), at_end=['print("SEEN", SEEN, "alarms", ALARMS[0])'],
           require=("SEEN [] alarms",)),

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
           "connection (a dup of the socket in /proc/self/fd whose peer is tester.sock; writing "
           "into the kernel's own ipc sockets would only wreck the kernel) and sends the tester "
           "requests of its own (a probe that would run the reference, a call): the tester makes "
           "requests and reads replies, it never serves one, so what arrives is a malformed "
           "reply and the test fails",
           src('''
        import os, socket
        from autograder.plain import Codec, send
        print("asks the tester ready")
        def scale(logits, t):
            if logits.dim() == 1:
                return logits / t
            for fd in sorted(int(f) for f in os.listdir("/proc/self/fd")):
                try:
                    s = socket.socket(fileno=os.dup(fd))
                except OSError:
                    continue
                try:
                    peer = s.getpeername() if s.family == socket.AF_UNIX else ""
                except OSError:
                    peer = ""
                if not str(peer).endswith("tester.sock"):
                    s.detach()
                    continue
                print("asks the tester at", s.getpeername(), flush=True)
                codec = Codec()
                for msg in ({"op": "probe", "fn": "minillm.sampling:apply_temperature"},
                            {"op": "call", "name": "ref"}):
                    msg = {**msg, "args": codec.enc((logits, t)), "kwargs": codec.enc({})}
                    try:
                        send(s, msg, codec.blobs)
                    except OSError:
                        pass
                s.detach()
            return logits
    '''), require=("asks the tester ready", "asks the tester at")),
    Attack("forged_dataclass", "in the hidden call `scale` returns a dataclass of its own whose "
           "__module__ / __qualname__ claim minillm.sampling's `apply_temperature`, holding the "
           "test's logits and temperature: a kernel encodes a course dataclass by value, and a "
           "tester that rebuilt it by name would run the reference itself and get the right "
           "answer back (a dataclass is not plain: autograder/plain.py refuses it)",
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
]
for _a in ATTACKS:
    if _a.solution and "MEMSCAN_SOURCE" in _a.solution:
        _a.solution = _a.solution.replace("MEMSCAN_SOURCE", repr(MEMSCAN))
