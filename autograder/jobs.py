"""One submission = one job: built by the trusted grader, executed anywhere, recorded by nbgrader.

    build_job(course, student, lab)   grader: the submission's notebooks with nbgrader's locked
                                      cells restored from the gradebook (nbgrader's own
                                      sanitizing preprocessors), the lab's released assets,
                                      limits (and, added by the grader, the lab's warm compile
                                      cache: autograder/compile_cache.py). A JSON-serialisable
                                      dict, no path into the course.
    execute_job(job) -> result        anywhere (this process, a local pool, a Dask worker): runs
                                      `python -m autograder.jobs IN OUT` under memory / file /
                                      wall-clock limits; that process executes each notebook
                                      with GuardedExecute, the kernel in a sandbox, the locked
                                      cells sealed (autograder/sealed.py), and returns the
                                      executed notebooks and a report. It never sees the
                                      gradebook, the instructor's notebooks or other jobs.
                                      `execute_on_own_cores(slots)` pins each running job to
                                      CPUs of its own (`grade --jobs N`, autograder/cores.py).
    record(course, job, result)       grader: `nbgrader autograde` replays the executed
                                      notebooks (ReplayExecute), so nbgrader scores them and
                                      writes the gradebook; returns the GradeRecord.

Inside the job process the trusted executor turns each signed verdict into the test cell's
outputs: a passing test keeps no error output, a failing one gets exactly its failure message
(never a traceback through hidden test code), and a test cell without a signed verdict scores
zero with status `tampered: ...`. It also takes the values the tests showed (autograder/judge.py)
out of the notebook into the report; `record` compares them with the lab's reference run
(`build_reference_job`: the lab's own notebook, run as a job) before nbgrader scores anything.
"""
from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import sys
import tempfile
from pathlib import Path

from .tester_plan import tester_plan

MAX_NOTEBOOK_BYTES = 25 << 20       # a lab notebook with outputs is well under 1 MB
MAX_CELLS = 2000                    # the largest lab has under 100
MAX_EXTRA_BYTES = 20 << 20          # the student's own files beside the notebook
MAX_CELL_OUTPUT = 1 << 20           # characters of output kept per cell
JOB_MARGIN_S = 120                  # kernel start-up and shut-down around the notebook limit
SEAL_FILE = ".autograder_sealed.json"
COMPILE_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"   # where Inductor keeps its compiled code
TESTER_SOCKET = "tester.sock"       # in the kernel's runtime folder (autograder/tester.py)


class JobError(Exception):
    """A submission that cannot be executed at all (not a notebook, too large, ...)."""


# --- the grader's side ---------------------------------------------------------------------
def _notebook_names(course, lab: str) -> list[str]:
    with course.gradebook() as gb:
        return [nb.name for nb in gb.find_assignment(lab).notebooks]


def _sanitize(course, student: str, lab: str, name: str, path: Path):
    """nbgrader autograde's own sanitizing steps, here in the grader: outputs cleared, ids
    deduplicated, kernelspec and every locked / test cell restored from the gradebook."""
    import nbformat
    from nbgrader.preprocessors import (
        CheckCellMetadata,
        ClearOutput,
        DeduplicateIds,
        OverwriteCells,
        OverwriteKernelspec,
    )
    size = path.stat().st_size
    if size > MAX_NOTEBOOK_BYTES:
        raise JobError(f"rejected: {path.name} is {size >> 20} MB, over the "
                       f"{MAX_NOTEBOOK_BYTES >> 20} MB limit")
    try:
        nb = nbformat.reads(path.read_text(errors="replace"), as_version=4)
    except Exception as e:
        raise JobError(f"rejected: {path.name} is not a notebook ({type(e).__name__}: "
                       f"{str(e)[:200]})") from None
    if len(nb.cells) > MAX_CELLS:
        raise JobError(f"rejected: {path.name} has {len(nb.cells)} cells, over the "
                       f"{MAX_CELLS} limit")
    resources = {"nbgrader": {"notebook": name, "assignment": lab, "student": student,
                              "db_url": course.db_url}}
    try:
        for pp in (ClearOutput, DeduplicateIds, OverwriteKernelspec, OverwriteCells,
                   CheckCellMetadata):
            nb, resources = pp().preprocess(nb, resources)
    except Exception as e:
        raise JobError(f"rejected: nbgrader cannot read {path.name}'s cells "
                       f"({type(e).__name__}: {str(e)[:200]})") from None
    return nb


def _plan_tester(job: dict, course, lab: str, name: str, source_nb) -> None:
    """Notebook `name`'s tester plan, and the assets for the tester's own folder."""
    plan = tester_plan(source_nb)
    if plan is not None:
        job.setdefault("tester", {})[name] = plan
        job["tester_files"] = pack_files(course.release_dir(lab))


def trusted_names(source_nb) -> dict[str, list[str]]:
    """grade_id of each locked setup cell -> the names it binds that the tests must see as it
    bound them (names the lab's own unlocked cells also assign, like loop variables, excluded)."""
    from .seal import bound_names
    free: set[str] = set()
    for c in source_nb.cells:
        m = c.metadata.get("nbgrader", {})
        if c.cell_type == "code" and not m.get("locked"):
            free |= bound_names(c.source)
    out = {}
    for c in source_nb.cells:
        m = c.metadata.get("nbgrader", {})
        if c.cell_type == "code" and m.get("locked") and not m.get("grade"):
            out[m["grade_id"]] = sorted(bound_names(c.source) - free)
    return out


def pack_files(folder: Path, limit: int | None = None) -> dict[str, str]:
    """Files under `folder` (no notebooks), never through a symlink: a submission may hold a
    link to the instructor's labs/ or the gradebook. {relative path: base64}; JobError past
    `limit` bytes. `unpack_files` writes them out again."""
    out, total = {}, 0
    if not folder.is_dir():
        return out
    for p in sorted(folder.rglob("*")):
        if not p.is_file() or p.is_symlink() or p.suffix == ".ipynb" or \
                not p.resolve().is_relative_to(folder.resolve()) or \
                any(part in (".ipynb_checkpoints", "__pycache__") for part in p.parts):
            continue
        total += p.stat().st_size
        if limit is not None and total > limit:
            raise JobError(f"rejected: the files beside the notebook are over "
                           f"{limit >> 20} MB")
        out[str(p.relative_to(folder))] = base64.b64encode(p.read_bytes()).decode()
    return out


def unpack_files(files: dict[str, str], dest: Path) -> None:
    """Write pack_files' {relative path: base64} under `dest`; ValueError for a path outside."""
    for rel, data in files.items():
        path = dest / rel
        if not path.resolve().is_relative_to(dest.resolve()):
            raise ValueError(f"a file path outside {dest}: {rel!r}")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))


def install_compile_cache(files: dict[str, str], folder: Path) -> dict[str, str]:
    """Write a job's copy of the grader's warm compile cache (autograder/compile_cache.py) into
    `folder`, which the sandbox binds; the environment that points Inductor at it ({} when the
    job carries none)."""
    if not files:
        return {}
    unpack_files(files, folder)
    return {COMPILE_CACHE_ENV: str(folder)}


def _new_job(course, student: str, lab: str, cell_timeout: int | None,
             notebook_timeout: int | None, mem_bytes: int | None, sandbox: bool) -> dict:
    return {"student": student, "lab": lab, "notebooks": {}, "files": {}, "trust": {},
            "sandbox": sandbox,
            "limits": {"cell_timeout": cell_timeout or course.configured_cell_timeout(),
                       "notebook_timeout": notebook_timeout or
                       course.configured_notebook_timeout(),
                       "mem_bytes": mem_bytes}}


def build_job(course, student: str, lab: str, *, cell_timeout: int | None = None,
              notebook_timeout: int | None = None, mem_bytes: int | None = None,
              sandbox: bool = True) -> dict:
    import nbformat
    job = _new_job(course, student, lab, cell_timeout, notebook_timeout, mem_bytes, sandbox)
    folder = course.submitted(student, lab)
    try:
        job["files"] = pack_files(folder, MAX_EXTRA_BYTES)
        job["files"].update(pack_files(course.release_dir(lab)))      # the course's assets win
        for name in _notebook_names(course, lab):
            source = nbformat.read(str(course.source(lab) / f"{name}.ipynb"), as_version=4)
            job["trust"].update(trusted_names(source))
            _plan_tester(job, course, lab, name, source)
            path = folder / f"{name}.ipynb"
            if path.is_symlink():         # a link to labs/ would grade the instructor's notebook
                raise JobError(f"rejected: {path.name} is a symbolic link, not a notebook")
            if path.is_file():
                job["notebooks"][name] = nbformat.writes(_sanitize(course, student, lab,
                                                                   name, path))
    except JobError as e:
        job["rejected"] = str(e)
    return job


def build_reference_job(course, lab: str, *, sandbox: bool = True) -> dict:
    """The job of the lab's source notebook, solutions included (the reference run of
    autograder/reference_run.py): executed like a submission, sealed and sandboxed the same
    way, without the free code cells that no later nbgrader cell needs (`_needed_cells`)."""
    import nbformat
    job = _new_job(course, "reference", lab, None, None, None, sandbox)
    job["files"] = pack_files(course.release_dir(lab))
    for name in _notebook_names(course, lab):
        source = nbformat.read(str(course.source(lab) / f"{name}.ipynb"), as_version=4)
        job["trust"].update(trusted_names(source))
        _plan_tester(job, course, lab, name, source)
        code = [c for c in source.cells if c.cell_type == "code"]
        keep = _needed_cells(code)
        for cell, kept in zip(code, keep):
            cell.outputs, cell.execution_count = [], None
            if not kept:
                cell.source = "# a free cell no test needs: not run in the reference run"
        job["notebooks"][name] = nbformat.writes(source)
    return job


def _needed_cells(cells) -> list[bool]:
    """Which code cells a reference run executes: every nbgrader cell (locked, solution or
    graded), and each free cell (the lab's measurements and plots) that binds a name a later
    executed cell reads without binding it itself, found backwards from the last cell. A cell
    that does not parse is kept."""
    from .seal import bound_names, free_names
    needed: set[str] = set()
    keep = [False] * len(cells)
    for i in range(len(cells) - 1, -1, -1):
        role = cells[i].metadata.get("nbgrader", {})
        used = free_names(cells[i].source)
        keep[i] = bool(role.get("locked") or role.get("solution") or role.get("grade")) or \
            used is None or bool(bound_names(cells[i].source) & needed)
        if keep[i]:
            needed |= used or set()
    return keep


def execute_job(job: dict) -> dict:
    """Run the job in a child process under the job's limits; never raises. This is the
    function `grade --jobs N` runs N at a time and `grade --scheduler` ships to Dask workers."""
    from .processes import run_logged, subprocess_env
    if job.get("rejected"):
        return {"error": job["rejected"]}
    lim = job["limits"]
    wall = lim.get("wall_timeout") or \
        (lim["notebook_timeout"] + JOB_MARGIN_S) * max(1, len(job["notebooks"]))
    tmp = Path(tempfile.mkdtemp(prefix="autograder_job_"))
    try:
        (tmp / "job.json").write_text(json.dumps(job))
        threads = lim.get("thread_env") or {}
        r = run_logged([sys.executable, "-m", "autograder.jobs", str(tmp)], cwd=tmp,
                       log=tmp / "job.log", timeout=wall, mem_bytes=lim.get("mem_bytes"),
                       env=subprocess_env(threads) if threads else None, cpus=lim.get("cpus"))
        log = r.output[-6000:]
        if r.timed_out:
            return {"error": f"killed after {wall:.0f} s", "killed": True,
                    "seconds": r.seconds, "log": log}
        out = tmp / "result.json"
        if r.returncode != 0 or not out.is_file():
            return {"error": f"the job process failed (exit {r.returncode})",
                    "seconds": r.seconds, "log": log}
        result = json.loads(out.read_text())
        result.update(seconds=r.seconds, log=log)
        return result
    except Exception as e:               # never lose a submission
        return {"error": f"{type(e).__name__}: {e}"}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def execute_on_own_cores(slots):
    """execute_job, each running job pinned to a CPU set of `slots` (a cores.CoreSlots) that no
    other running job has: what `grade --jobs N` runs on this machine."""
    def execute_job_on_own_cores(job: dict) -> dict:
        with slots.take() as cpus:
            return execute_job({**job, "limits": {**job["limits"], "cpus": cpus}})
    return execute_job_on_own_cores


# --- the job's own process ------------------------------------------------------------------
def _error(ename: str, evalue: str) -> dict:
    from nbformat.v4 import new_output
    return new_output("error", ename=ename, evalue=evalue, traceback=[f"{ename}: {evalue}"])


def _split_message(message: str) -> tuple[str, str]:
    if message.isidentifier():                  # an exception without a message
        return message, ""
    head, sep, rest = message.partition(": ")
    if sep and head.isidentifier():
        return head, rest
    return "AssertionError", message


def _cap_outputs(cell) -> None:
    """At most MAX_CELL_OUTPUT characters of text per cell (a submission may print 100 MB)."""
    kept, total, cut = [], 0, False
    for o in cell.get("outputs", []):
        size = len(json.dumps(o))
        if total + size > MAX_CELL_OUTPUT:
            cut = True
            if o.get("output_type") == "stream":
                room = max(0, MAX_CELL_OUTPUT - total)
                o["text"] = "".join(o.get("text", ""))[:room]
                kept.append(o)
            elif o.get("output_type") == "error":
                kept.append(o)
            break
        kept.append(o)
        total += size
    if cut:
        from nbformat.v4 import new_output
        kept.append(new_output("stream", name="stdout",
                               text=f"\n[output cut at {MAX_CELL_OUTPUT} characters]\n"))
    cell.outputs = kept


def _sandbox_spec(work: Path, runtime: Path, cache_env: dict):
    """The kernel's sandbox; `cache_env`: install_compile_cache()'s environment naming the kernel's copy of
    the compile cache, which is bound into the sandbox read-write."""
    from . import sandbox
    home = work.parent / "home"
    home.mkdir(exist_ok=True)
    return sandbox.SandboxSpec(workdir=work, runtime_dir=runtime,
                               ro_paths=sandbox.default_ro_paths(),
                               env={**sandbox.default_env(home), **cache_env},
                               rw_paths=[Path(cache_env[COMPILE_CACHE_ENV])]
                               if COMPILE_CACHE_ENV in cache_env else [])


def _seal(nb, tester: dict | None = None, socket_path: str = "") -> tuple:
    """Replace each locked code cell by its stub. Returns (stub -> key, key -> cell info for
    the kernel, key -> original source, stub -> the tester's command). With a `tester` plan,
    setup cells run in the tester too, test cells there alone (the kernel's stub serves it)."""
    from .seal import stub, to_python
    stubs, table, original, commands = {}, {}, {}, {}
    for cell in nb.cells:
        m = cell.metadata.get("nbgrader", {})
        if cell.cell_type != "code" or not m.get("locked") or m.get("solution") or \
                not cell.source.strip():
            continue
        key = secrets.token_hex(16)
        gid, kind = m.get("grade_id", "?"), "test" if m.get("grade") else "setup"
        source = to_python(cell.source)
        command = None
        if tester is not None and kind == "setup":
            if gid not in tester.get("kernel_only", []):   # (one that runs in the kernel only)
                command = {"op": "setup", "grade_id": gid, "source": source}
        elif tester is not None:
            command = {"op": "test", "grade_id": gid, "source": source,
                       "names": tester["names"], "modules": tester.get("modules", "stand-in"),
                       "rebound": tester.get("rebound", {}).get(gid, []),
                       "handed": tester.get("handed", {}).get(gid, [])}
            source = f"__import__('autograder.remote').remote.serve({socket_path!r})\n"
        table[key] = {"source": source, "grade_id": gid, "kind": kind,
                      "in_tester": command is not None and kind == "test"}
        original[key] = cell.source
        cell.source = stub(key)
        stubs[cell.source] = key
        if command is not None:
            commands[cell.source] = command
    return stubs, table, original, commands


def _apply_verdicts(nb, stubs: dict, table: dict, original: dict, records: dict | None,
                    report: dict, answers: dict | None = None) -> list[str]:
    """Put back each locked cell's source; make each test cell's outputs say its verdict.
    `answers`: stub -> the tester's answer, for each test cell run there.
    Returns what the notebook tampered with."""
    tampered = []
    stopped = {"KernelDied", "KernelUnresponsive", "OutputLate", "KernelUnreadable",
               "NotebookTimeout", "CellTimeoutError"}
    for cell in nb.cells:
        key = stubs.get(cell.source) if cell.cell_type == "code" else None
        if key is None:
            continue
        answer = (answers or {}).get(cell.source)
        info, cell.source = table[key], original[key]
        outputs = cell.get("outputs", [])
        errors = [o for o in outputs if o.get("output_type") == "error"]
        plain = [o for o in outputs if o.get("output_type") != "error"]
        ran = not any(o.get("ename") in stopped for o in errors)
        rec = (records or {}).get(key)
        if info["kind"] == "test":          # the stub returns None: a result is an injection,
            plain = [o for o in plain       # and nbgrader would read a number as partial credit
                     if o.get("output_type") != "execute_result"]
        if rec is not None and rec.get("tampered"):
            tampered.append(f"{info['grade_id']}: {rec.get('message')}")
        if info["kind"] != "test":
            if answer is not None and not answer.get("ok"):     # the grader's own failure
                report.setdefault("tester_setup_errors", []).append(
                    f"{info['grade_id']}: {answer.get('ename')}: {answer.get('evalue')}")
            if rec is not None and not rec.get("ok"):
                errors = [_error(*_split_message(str(rec.get("message"))))]
            cell.outputs = plain + [_error(e.get("ename", "Error"), e.get("evalue", ""))
                                    for e in errors[:1]]
            continue
        if rec is None:
            if ran:
                why = "no signed verdict for this test: the notebook interfered with grading"
                tampered.append(f"{info['grade_id']}: no signed verdict")
                cell.outputs = plain + [_error("Tampered", why)]
            else:
                cell.outputs = plain + [_error(e.get("ename", "Error"), e.get("evalue", ""))
                                        for e in errors[:1]]
        elif rec.get("ok") and info.get("in_tester"):   # the kernel answered the tester
            from nbformat.v4 import new_output
            answer = answer or {"ok": False, "ename": "NotRun", "evalue": "no tester answer"}
            shown = [new_output("stream", name="stdout", text=answer["stdout"])] \
                if answer.get("stdout") else []
            cell.outputs = plain + shown + ([] if answer.get("ok") else [
                _error(str(answer.get("ename") or "Error"), str(answer.get("evalue", "")))])
        elif rec.get("ok"):
            cell.outputs = plain
        else:
            cell.outputs = plain + [_error(*_split_message(str(rec.get("message", "failed"))))]
    report["tampered"] = tampered
    return tampered


def _execute_notebook(nb, work: Path, runtime: Path, job: dict, log,
                      plan: dict | None = None) -> dict:
    """Run one sanitized notebook in this process's executor (`plan`: its tester plan, if any);
    returns the report."""
    from .execute import GuardedExecute
    from .seal import verify
    lim = job["limits"]
    socket_path = str(runtime / TESTER_SOCKET)
    stubs, table, original, commands = _seal(nb, plan, socket_path)
    tester = None
    if plan is not None:
        from .tester import TesterProcess
        home = work.parent / "tester"
        home.mkdir()
        unpack_files(job.get("tester_files") or {}, home)
        tester = TesterProcess(socket_path, cwd=str(home))
    for key, info in table.items():
        if info["kind"] == "setup":
            info["trust"] = job["trust"].get(info["grade_id"], [])
    secret = secrets.token_bytes(32)
    seal_path = work / SEAL_FILE
    seal_path.write_text(json.dumps({"key": secret.hex(), "cells": table}))
    # this kernel's own copy of the grader's warm compile cache (autograder/compile_cache.py)
    cache_env = install_compile_cache(job.get("compile_cache") or {},
                                      work.parent / "compile_cache")
    kw = {}
    if job.get("sandbox"):
        from .sandbox import SandboxKernelManager
        kw = {"kernel_manager_class": SandboxKernelManager,
              "sandbox": _sandbox_spec(work, runtime, cache_env)}
    else:                               # the kernel inherits this process's environment
        os.environ.update(cache_env)
    ex = GuardedExecute(timeout=lim["cell_timeout"], notebook_timeout=lim["notebook_timeout"],
                        startup_timeout=120, interrupt_on_timeout=True, allow_errors=True,
                        seal=stubs, kernel_name="python3", tester=tester,
                        tester_cells=commands,
                        setup_code=f"import autograder.sealed as _s\n_s.install({str(seal_path)!r})"
                                   f"\ndel _s", **kw)
    resources = {"metadata": {"path": str(work)}}
    try:
        ex.preprocess(nb, resources)
    finally:
        if tester is not None:
            tester.close()
    report = dict(getattr(ex, "last_report", {}) or {})
    records = verify(ex.reports, secret) if ex.reports else None
    if stubs and records is None:
        log("no signed report from the kernel")
    if ex.setup_error:                  # before any student code: the grader's own failure
        report["setup_error"] = ex.setup_error
        log(f"the sealed-cell setup failed in the kernel: {ex.setup_error}")
    _apply_verdicts(nb, stubs, table, original, records, report, ex.tester_answers)
    for line in report.get("tester_setup_errors", []):
        log(f"a setup cell failed in the tester: {line}")
    from .judge import take  # the values the tests checked, judged by the grader
    report["evidence"] = take(nb, {i["grade_id"] for i in table.values() if i["kind"] == "test"})
    for cell in nb.cells:
        if cell.cell_type == "code":
            _cap_outputs(cell)
    seal_path.unlink(missing_ok=True)
    return report


def _main(folder: str) -> int:
    import nbformat
    tmp = Path(folder)
    job = json.loads((tmp / "job.json").read_text())
    if job.get("sandbox"):
        from .sandbox import sandbox_unavailable_reason
        why = sandbox_unavailable_reason()
        if why:
            print(f"no sandbox on this machine: {why}", file=sys.stderr)
            return 3
    result = {"notebooks": {}, "reports": {}}
    for name, text in job["notebooks"].items():
        nb = nbformat.reads(text, as_version=4)
        base = Path(tempfile.mkdtemp(prefix="run_", dir=tmp))
        work, runtime = base / "work", _socket_dir(base)
        work.mkdir()
        unpack_files(job["files"], work)
        result["reports"][name] = _execute_notebook(nb, work, runtime, job, print,
                                                    (job.get("tester") or {}).get(name))
        result["notebooks"][name] = nbformat.writes(nb)
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(runtime, ignore_errors=True)
    (tmp / "result.json").write_text(json.dumps(result))
    return 0


def _socket_dir(base: Path) -> Path:
    """The folder for the kernel's connection file and ipc sockets: `base/runtime`, or a fresh
    folder in /tmp where that path is too long for a Unix socket (a long TMPDIR)."""
    from .sandbox import MAX_IPC_PATH
    runtime = base / "runtime"
    if len(str(runtime)) + len("/k0123456789ab-65535") > MAX_IPC_PATH:
        return Path(tempfile.mkdtemp(prefix="agrt_", dir="/tmp"))
    runtime.mkdir()
    return runtime


# --- recording ------------------------------------------------------------------------------
def status_of(result: dict) -> str:
    if result.get("error"):
        return result["error"] if result.get("killed") or \
            result["error"].startswith("rejected") else f"failed: {result['error']}"
    reports = list(result.get("reports", {}).values())
    setup = [r["setup_error"] for r in reports if r.get("setup_error")]
    if setup:
        return f"failed: the grader's set-up did not run in the kernel ({setup[0]})"
    tampered = [t for r in reports for t in r.get("tampered", [])]
    if tampered:
        return "tampered: " + tampered[0]
    if any(r.get("kernel_died") is not None for r in reports):
        return "kernel died"
    if any(r.get("unresponsive") is not None for r in reports):
        return "kernel unresponsive"
    if any(r.get("unreadable") is not None for r in reports):
        return "kernel unreadable"
    if any(r.get("notebook_timeout") for r in reports):
        return "notebook timeout"
    if any(r.get("cell_timeouts") for r in reports):
        return "cell timeout"
    return "ok"


def record(course, job: dict, result: dict, *, log_dir: Path | None = None,
           reference: dict | None = None):
    """nbgrader autograde with the executed notebooks replayed; the GradeRecord. `reference`:
    the lab's reference-run evidence (autograder/judge.py), which each test that passed in
    the kernel must match."""
    import nbformat

    from .records import GradeRecord
    student, lab = job["student"], job["lab"]
    if reference and not result.get("error") and not job.get("rejected"):
        from .judge import judge
        judge(result, reference)
    replay_root = course.build / "executed"
    dest = replay_root / student / lab
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for name, text in result.get("notebooks", {}).items():
        nbformat.write(nbformat.reads(text, as_version=4), str(dest / f"{name}.ipynb"))
    log_dir = log_dir or course.build / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    status = status_of(result)
    if job.get("rejected"):             # nothing nbgrader could read: zeros, no replay
        r = None
        course.zero_submission(student, lab)
    else:
        r = course.nbgrader("autograde", lab, f"--student={student}", "--force",
                            log=log_dir / f"autograde_{student}_{lab}.log", timeout=600,
                            env_extra={"AUTOGRADER_REPLAY": str(replay_root)})
        if r.returncode != 0 and not result.get("error"):
            status = "failed: nbgrader could not record the grades"
        if result.get("error") or r.returncode != 0:
            course.zero_submission(student, lab)
    reports = result.get("reports", {}).values()
    exec_s = sum(x.get("seconds", 0.0) for x in reports) if reports else None
    (log_dir / f"job_{student}_{lab}.log").write_text(
        f"status: {status}\n{result.get('error') or ''}\n{result.get('log') or ''}")
    return GradeRecord(student=student, lab=lab, status=status[:200],
                       seconds=float(result.get("seconds", 0.0)) + (r.seconds if r else 0.0),
                       exec_seconds=exec_s, cells=course.scores(student, lab),
                       log=r.log if r else None)


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1]))
