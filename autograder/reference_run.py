"""The reference run: the lab's own notebook, solutions included, run as a job like any
submission (its free code cells, the lab's measurements and plots, left out), for the values its
tests show the grader (autograder/judge.py).

`reference(course, lab)` runs it once per lab and keeps its evidence in
build/reference/<lab>.json while its fingerprint holds: the lab's notebooks and assets, the
course's packages, Python, torch, the thread variables the jobs get (which can change a float's
last bits) and whether it ran sandboxed. A run that fails, or one of whose tests does not pass,
is logged and gives no reference: the batch is then judged by the kernels' verdicts alone.
"""
from __future__ import annotations

import json

from . import jobs
from .processes import environment_fingerprint, tree_sha256
from .tester_plan import uses_tester

__all__ = ["reference", "fingerprint", "REFERENCE_DIR"]

REFERENCE_DIR = "reference"          # build/reference/<lab>.json
PACKAGES = ("minillm", "kernels", "autograder")     # the code a reference run executes


def fingerprint(course, lab: str) -> dict:
    """What a reference run depends on besides the jobs' settings: the lab's notebooks and
    assets, the course's packages, Python and torch."""
    digest = tree_sha256(course.source(lab))
    tree_sha256(course.release_dir(lab), digest=digest)
    return {"lab": digest.hexdigest(), **environment_fingerprint(PACKAGES)}


def reference(course, lab: str, log=print, *, thread_env: dict | None = None,
              sandbox: bool = True, execute=None, where: str = "here") -> dict | None:
    """The evidence of the lab's source notebook, notebook -> grade_id -> items (see the module
    docstring); None, logged, when the run fails or one of its tests does not pass.
    `execute`: what runs the job (default `jobs.execute_job`, here); `where` names it in the
    fingerprint, so that a reference run on a Dask cluster's workers, whose CPUs may round a
    float differently from this machine's, is kept apart from one run here."""
    if _tester_only(course, lab):
        log(f"{lab}: its tests run in the tester, apart from the kernel: no reference run")
        return None
    path = course.build / REFERENCE_DIR / f"{lab}.json"
    stamp = {**fingerprint(course, lab), "threads": dict(thread_env or {}), "sandbox": sandbox,
             "where": where}
    try:
        kept = json.loads(path.read_text())
        if kept.get("fingerprint") == stamp:
            log(f"{lab}: using the reference run's evidence ({path})")
            return kept["evidence"]
    except (OSError, ValueError, KeyError, AttributeError):
        pass
    log(f"{lab}: running the lab's own notebook for the evidence each test checks ...")
    job = jobs.build_reference_job(course, lab, sandbox=sandbox)
    job["limits"]["thread_env"] = dict(thread_env or {})
    result = (execute or jobs.execute_job)(job)
    failed = _failures(result)
    if failed:
        log(f"WARNING: {lab}: the reference run failed ({failed}); its tests are judged by "
            "the kernel's verdicts alone")
        return None
    found = {name: r.get("evidence") or {} for name, r in result.get("reports", {}).items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"fingerprint": stamp, "evidence": found}))
    return found


def _tester_only(course, lab: str) -> bool:
    """Do all the lab's notebooks run their tests in the tester (autograder/tester.py)? Their
    verdicts are then the tester's, which no kernel can forge: nothing to compare."""
    import nbformat
    names = jobs._notebook_names(course, lab)
    return bool(names) and all(
        uses_tester(nbformat.read(str(course.source(lab) / f"{n}.ipynb"), as_version=4))
        for n in names)


def _failures(result: dict) -> str:
    """Why a reference run cannot be used ('' when every test passed)."""
    status = jobs.status_of(result)
    if status != "ok":
        return status
    import nbformat
    bad = []
    for text in result.get("notebooks", {}).values():
        for cell in nbformat.reads(text, as_version=4).cells:
            m = cell.metadata.get("nbgrader", {})
            if cell.cell_type == "code" and m.get("grade") and any(
                    o.get("output_type") == "error" for o in cell.get("outputs", [])):
                bad.append(m.get("grade_id", "?"))
    for r in result.get("reports", {}).values():
        bad += [f"{gid} ({items['error']})" for gid, items in (r.get("evidence") or {}).items()
                if isinstance(items, dict)]
    return f"tests failed: {', '.join(bad)}" if bad else ""
