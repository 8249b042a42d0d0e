"""Attacks on the machine around the grading (tests/test_tamper.py grades them): the gradebook,
the sandbox's walls, the CPUs and compile cache of the students graded beside and after, the
grader's browser, and robustness (files that are not notebooks, floods, loops, crashes)."""
from __future__ import annotations

from attacks_common import (
    E_GOOD,
    E_NONE,
    GOOD,
    POISON_CACHE,
    WRONG,
    Attack,
    _million_cells,
    _notebook_with_fake_cells,
    src,
)

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
