"""One submission = one job (autograder/README.md): `build_job` (grader; JSON, no path into the
course), `execute_job` (anywhere: a limited child process runs the notebook, the kernel sandboxed,
the tests in the tester), `record` (grader: `nbgrader autograde` replays the executed notebooks).
"""
from __future__ import annotations

import base64
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from .tester_plan import tester_plan, to_python, withheld_of

MAX_NOTEBOOK_BYTES = 25 << 20       # a lab notebook with outputs is well under 1 MB
MAX_CELLS = 2000                    # the largest lab has under 100
MAX_EXTRA_BYTES = 20 << 20          # the student's own files beside the notebook
MAX_CELL_OUTPUT = 1 << 20           # characters of output kept per cell
JOB_MARGIN_S = 120                  # kernel start-up and shut-down around the notebook limit
COMPILE_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"   # where Inductor keeps its compiled code
TESTER_SOCKET = "tester.sock"       # in the kernel's runtime folder (autograder/tester.py)


class JobError(Exception):
    """A submission that cannot be executed at all (not a notebook, too large, ...)."""


def _sanitize(course, student: str, lab: str, name: str, path: Path):
    """nbgrader autograde's own sanitizing steps, here in the grader (locked cells restored)."""
    import nbformat
    from nbgrader import preprocessors as steps
    if (size := path.stat().st_size) > MAX_NOTEBOOK_BYTES:
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
        for pp in (steps.ClearOutput, steps.DeduplicateIds, steps.OverwriteKernelspec,
                   steps.OverwriteCells, steps.CheckCellMetadata):
            nb, resources = pp().preprocess(nb, resources)
    except Exception as e:
        raise JobError(f"rejected: nbgrader cannot read {path.name}'s cells "
                       f"({type(e).__name__}: {str(e)[:200]})") from None
    return nb


def pack_files(folder: Path, limit: int | None = None) -> dict[str, str]:
    """{relative path: base64} of the files under `folder` (no notebooks), never through a
    symlink (to labs/ or the gradebook); JobError past `limit` bytes."""
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


def build_job(course, student: str, lab: str, *, cell_timeout: int | None = None,
              notebook_timeout: int | None = None, mem_bytes: int | None = None,
              sandbox: bool = True) -> dict:
    import nbformat
    job = {"student": student, "lab": lab, "notebooks": {}, "files": {}, "plans": {},
           "withheld": {}, "tester_files": pack_files(course.release_dir(lab)),
           "sandbox": sandbox,
           "limits": {"cell_timeout": cell_timeout or
                      course.configured("Execute.timeout", 180),
                      "notebook_timeout": notebook_timeout or
                      course.configured("GuardedExecute.notebook_timeout", 900),
                      "mem_bytes": mem_bytes}}
    folder = course.submitted(student, lab)
    try:
        job["files"] = pack_files(folder, MAX_EXTRA_BYTES)
        job["files"].update(pack_files(course.release_dir(lab)))      # the course's assets win
        with course.gradebook() as gb:
            names = [nb.name for nb in gb.find_assignment(lab).notebooks]
        for name in names:
            source = nbformat.read(str(course.source(lab) / f"{name}.ipynb"), as_version=4)
            job["plans"][name] = tester_plan(source)
            job["withheld"].update(withheld_of(source))
            path = folder / f"{name}.ipynb"
            if path.is_symlink():         # a link to labs/ would grade the instructor's notebook
                raise JobError(f"rejected: {path.name} is a symbolic link, not a notebook")
            if path.is_file():
                job["notebooks"][name] = nbformat.writes(_sanitize(course, student, lab,
                                                                   name, path))
    except JobError as e:
        job["rejected"] = str(e)
    return job


def execute_job(job: dict) -> dict:
    """Run the job in a child process under the job's limits; never raises."""
    from .processes import run_logged, subprocess_env
    if job.get("rejected"):
        return {"error": job["rejected"]}
    lim = job["limits"]
    wall = lim.get("wall_timeout") or \
        (lim["notebook_timeout"] + JOB_MARGIN_S) * max(1, len(job["notebooks"]))
    tmp = Path(tempfile.mkdtemp(prefix="autograder_job_"))
    try:
        (tmp / "job.json").write_text(json.dumps(job))
        r = run_logged([sys.executable, "-m", "autograder.jobs", str(tmp)], cwd=tmp,
                       log=tmp / "job.log", timeout=wall, mem_bytes=lim.get("mem_bytes"),
                       env=subprocess_env(lim["thread_env"]) if lim.get("thread_env") else None,
                       cpus=lim.get("cpus"))
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
    """execute_job, each running job pinned to a CPU set of `slots` (a cores.CoreSlots)."""
    def execute_job_on_own_cores(job: dict) -> dict:
        with slots.take() as cpus:
            return execute_job({**job, "limits": {**job["limits"], "cpus": cpus}})
    return execute_job_on_own_cores


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


def _sandbox_spec(work: Path, runtime: Path, cache_env: dict, course: Path, links: list):
    """The kernel's sandbox: the course from `course` (references withheld), never the installed
    packages; the compile cache read-write."""
    from . import sandbox, withheld
    home = work.parent / "home"
    home.mkdir(exist_ok=True)
    hidden = {withheld.package_dir(p) for p in withheld.PACKAGES}
    ro = [p for p in sandbox.default_ro_paths() if p not in hidden] + [course, *links]
    env = sandbox.default_env(home)
    env["PYTHONPATH"] = f"{course}{os.pathsep}{env['PYTHONPATH']}"
    return sandbox.SandboxSpec(workdir=work, runtime_dir=runtime, ro_paths=ro,
                               env={**env, **cache_env},
                               rw_paths=[Path(cache_env[COMPILE_CACHE_ENV])]
                               if COMPILE_CACHE_ENV in cache_env else [])


def _split_cells(nb, plan: dict, socket_path: str, cell_timeout: float) -> tuple[dict, dict]:
    """Test cells become kernel_side.serve, locked setup cells also run in the tester: returns
    ({kernel source: test source}, {kernel source: the tester's command})."""
    original, commands = {}, {}
    for i, cell in enumerate(nb.cells):
        m = cell.metadata.get("nbgrader", {})
        if cell.cell_type != "code" or not m.get("locked") or m.get("solution") or \
                not cell.source.strip():
            continue
        gid = m.get("grade_id", "?")
        if not m.get("grade"):
            if gid not in plan["kernel_only"]:
                commands[cell.source] = {"op": "setup", "grade_id": gid,
                                         "source": to_python(cell.source)}
            continue
        command = {"op": "test", "grade_id": gid, "source": to_python(cell.source),
                   "names": plan["names"], "timeout": cell_timeout + 30}
        served = (f"# {gid}: the grader runs this test apart and your kernel answers its calls\n"
                  f"__import__('autograder.kernel_side').kernel_side.serve({socket_path!r})"
                  f"  # cell {i}\n")
        original[served], commands[served] = cell.source, command
        cell.source = served
    return original, commands


def _apply_verdicts(nb, original: dict, answers: dict, report: dict) -> None:
    """Put back each test cell's source, its outputs the tester's verdict; log failed setups."""
    from nbformat.v4 import new_output
    stopped = {"KernelDied", "KernelUnresponsive", "OutputLate", "KernelUnreadable",
               "NotebookTimeout", "CellTimeoutError"}
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        answer = answers.get(cell.source)
        if cell.source not in original:
            if answer is not None and not answer.get("ok"):
                gid = cell.metadata.get("nbgrader", {}).get("grade_id")
                report.setdefault("tester_setup_errors", []).append(
                    f"{gid}: {answer.get('ename')}: {answer.get('evalue')}")
            continue
        cell.source = original[cell.source]
        outputs = cell.get("outputs", [])
        kept = [o for o in outputs if o.get("output_type") not in ("error", "execute_result")]
        for o in kept:      # the student's code printed it: nbgrader fails a test on stderr
            if o.get("output_type") == "stream":
                o["name"] = "stdout"
        stop = [o for o in outputs if o.get("output_type") == "error" and o.get("ename") in stopped]
        answer = answer or {"ok": False, "ename": "NotRun", "evalue": "the test did not run"}
        shown = [new_output("stream", name="stdout", text=answer["stdout"])] \
            if answer.get("stdout") else []
        ename, evalue = str(answer.get("ename") or "Error"), str(answer.get("evalue", ""))
        error = [] if answer.get("ok") else stop[:1] or [
            new_output("error", ename=ename, evalue=evalue, traceback=[f"{ename}: {evalue}"])]
        cell.outputs = kept + shown + error


def _execute_notebook(nb, base: Path, job: dict, log, plan: dict) -> dict:
    """Run one sanitized notebook: the kernel in `base`/work, the tester beside it."""
    from . import withheld
    from .execute import GuardedExecute
    from .tester import TesterProcess
    work, runtime = base / "work", _socket_dir(base)
    work.mkdir()
    unpack_files(job["files"], work)
    lim = job["limits"]
    socket_path = str(runtime / TESTER_SOCKET)
    original, commands = _split_cells(nb, plan, socket_path, lim["cell_timeout"])
    home = base / "tester"
    home.mkdir()
    unpack_files(job.get("tester_files") or {}, home)
    course, links = withheld.build(job.get("withheld") or {}, job["lab"], base / "course")
    cache_env = {COMPILE_CACHE_ENV: str(base / "compile_cache")} if job.get("compile_cache") else {}
    unpack_files(job.get("compile_cache") or {}, base / "compile_cache")
    tester = TesterProcess(socket_path, cwd=str(home), env=dict(os.environ))   # the real course
    kw = {}
    if job.get("sandbox"):
        from .sandbox import SandboxKernelManager
        kw = {"kernel_manager_class": SandboxKernelManager,
              "sandbox": _sandbox_spec(work, runtime, cache_env, course, links)}
    else:                               # the kernel inherits this process's environment
        os.environ.update(cache_env)
        os.environ["PYTHONPATH"] = os.pathsep.join(
            [str(course)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    ex = GuardedExecute(timeout=lim["cell_timeout"], notebook_timeout=lim["notebook_timeout"],
                        startup_timeout=120, interrupt_on_timeout=True, allow_errors=True,
                        kernel_name="python3", tester=tester, tester_cells=commands, **kw)
    try:
        ex.preprocess(nb, {"metadata": {"path": str(work)}})
    finally:
        tester.close()
        shutil.rmtree(runtime, ignore_errors=True)
    report = dict(getattr(ex, "last_report", {}) or {})
    if ex.setup_error:                  # before any student code: the grader's own failure
        report["setup_error"] = ex.setup_error
        log(f"the grader's set-up failed in the kernel: {ex.setup_error}")
    _apply_verdicts(nb, original, ex.tester_answers, report)
    for line in report.get("tester_setup_errors", []):
        log(f"a setup cell failed in the tester: {line}")
    for cell in nb.cells:
        if cell.cell_type == "code":
            _cap_outputs(cell)
    return report


def _main(folder: str) -> int:
    import nbformat
    tmp = Path(folder)
    job = json.loads((tmp / "job.json").read_text())
    if job.get("sandbox"):
        from .sandbox import sandbox_unavailable_reason
        if why := sandbox_unavailable_reason():
            print(f"no sandbox on this machine: {why}", file=sys.stderr)
            return 3
    result = {"notebooks": {}, "reports": {}}
    for name, text in job["notebooks"].items():
        nb = nbformat.reads(text, as_version=4)
        base = Path(tempfile.mkdtemp(prefix="run_", dir=tmp))
        result["reports"][name] = _execute_notebook(nb, base, job, print, job["plans"][name])
        result["notebooks"][name] = nbformat.writes(nb)
        shutil.rmtree(base, ignore_errors=True)
    (tmp / "result.json").write_text(json.dumps(result))
    return 0


def _socket_dir(base: Path) -> Path:
    """`base/runtime`, or a folder in /tmp where that is too long for a Unix socket."""
    from .sandbox import MAX_IPC_PATH
    runtime = base / "runtime"
    if len(str(runtime)) + len("/k0123456789ab-65535") > MAX_IPC_PATH:
        return Path(tempfile.mkdtemp(prefix="agrt_", dir="/tmp"))
    runtime.mkdir()
    return runtime


def status_of(result: dict) -> str:
    if result.get("error"):
        return result["error"] if result.get("killed") or \
            result["error"].startswith("rejected") else f"failed: {result['error']}"
    reports = list(result.get("reports", {}).values())
    if setup := [r["setup_error"] for r in reports if r.get("setup_error")]:
        return f"failed: the grader's set-up did not run in the kernel ({setup[0]})"
    for key, status in (("kernel_died", "kernel died"), ("unresponsive", "kernel unresponsive"),
                        ("unreadable", "kernel unreadable")):
        if any(r.get(key) is not None for r in reports):
            return status
    for key, status in (("notebook_timeout", "notebook timeout"),
                        ("cell_timeouts", "cell timeout")):
        if any(r.get(key) for r in reports):
            return status
    return "ok"


def record(course, job: dict, result: dict):
    """nbgrader autograde with the executed notebooks replayed; the GradeRecord."""
    import nbformat

    from .records import GradeRecord
    student, lab = job["student"], job["lab"]
    replay_root = course.build / "executed"
    dest = replay_root / student / lab
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for name, text in result.get("notebooks", {}).items():
        nbformat.write(nbformat.reads(text, as_version=4), str(dest / f"{name}.ipynb"))
    log_dir = course.build / "logs"
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
