"""`make gpu-check`: what the course must prove on a CUDA GPU, in one run of at most 8 minutes.

    make gpu-pack                 # here, before a lent GPU: the tree that travels (below)
    make gpu-check                # there: the four steps; OUT=dir for what comes back
    make gpu-record FROM=dir/gpu_check.json     # here again: its section into RESULTS.md
    make gpu-check DRY_RUN=1      # any CPU: every step that can run without a GPU

The steps, in order; each is a subprocess with its own time limit, and a step that fails does
not stop the next:

  1. gpu_tests        the kernel tests, the engine's attention backends and the CUDA-graph
                      decoder, compiled for the GPU instead of the CPU interpreter;
  2. student_kernels  labs 04 and 07's kernel checks as graded, compiled: the notebooks'
                      solutions pass, the classic mistakes fail with their messages, and the
                      labs' GPU speed thresholds are measured on the solutions;
  3. labs             labs 04 and 07 executed top to bottom and self-graded with their solutions
                      (`python -m autograder selfgrade`);
  4. benchmarks       dequant_matmul.py, paged_attention.py and gpu_decode.py (the GPU goals
                      of ../shared/GPU.md).

It writes three files to OUT (default benchmarks/out/): gpu_check.json (device, versions, date,
commit, each step's verdict, counts, failures and figures), gpu_check.log (every step's output)
and RESULTS_section.md, the dated section for benchmarks/RESULTS.md. With a GPU on this very
checkout, --append adds the section itself; from a lent machine, `make gpu-record` adds it from
the summary that came back (a lent machine's tree is a copy).

DRY_RUN=1 (--dry-run) on a CPU: steps 1 and 2 are collected, not run (on a CPU they are the
CPU-interpreter tests `make test` already runs, so their collection proves the selection still
names real tests); step 3 checks that its notebooks and nbgrader are there and does not execute
them (tests/test_pipeline.py executes both on the CPU; a third run would cost minutes); step 4
runs each benchmark as it runs without a GPU (paged_attention.py --dry-run on tiny sizes; the
other two say they need CUDA). The summary marks each step "ran", "collected" or "skipped", and
a dry run never appends to RESULTS.md. tests/test_gpu_check.py runs it in `make test`.

The tree that travels (the device tool's limit: 64 MiB, tracked files included). `make gpu-pack`
leaves out of the working tree the model folders the GPU run never loads (LEFT_OUT: the hybrid
and diffusion models, 48 MiB; git keeps them, `make gpu-unpack` puts them back), packs into
.gpu/site-py312.tar.xz the packages that step 3 needs and the GPU image lacks (PACKAGES:
nbgrader and the Jupyter machinery, Python 3.12 wheels pinned by constraints.txt, installed and
pruned of documentation, tests and browser files), and prints what would travel. The device
command is then `make gpu-check` with carry [".gpu"]: the kit unpacks the archive into
build/gpu-site/, so it fetches nothing.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BUDGET_S = 480                      # the whole run, compiles included
LABS = ("04_quantization", "07_paged_attention")
GPU_TESTS = ("tests/test_kernels_dequant.py", "tests/test_kernels_gemv.py",
             "tests/test_kernels_paged.py", "tests/test_serving.py::test_attention_backends_agree",
             "tests/test_graph_decode.py", "tests/test_gpu_timer.py")
STUDENT_TESTS = ("tests/test_student_kernels.py", "tests/test_student_kernels_paged.py")
# what a dry run runs of each (pytest -k): a few cases read back as on a GPU
GPU_SAMPLE = "split_equals_unsplit or test_w8a16_both_paths_any_m"
STUDENT_SAMPLE = "decode_kernel_passes or (notebook_solution_passes and w4a16)"
LEFT_OUT = ("minillm/assets/hybrid", "minillm/assets/diffusion")
CARRY_LIMIT = 64 << 20
SITE_MIB = 12                       # room kept for .gpu/ (8.5 MiB on 2026-11-29: RESULTS.md)
CARRY = REPO / ".gpu"                # what a lent machine needs beside the tree: carry [".gpu"]
SITE = REPO / "build" / "gpu-site"  # where the kit unpacks the carried packages
PLATFORM = ("--only-binary=:all:", "--implementation", "cp",
            *[a for p in ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64",
                          "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64")
              for a in ("--platform", p)])
# What step 3 imports that the GPU image (Python 3.12, torch 2.11, triton 3.6) lacks: nbgrader
# and the Jupyter machinery that executes a notebook, found by logging every import of a
# self-grade of labs 04 and 07 (solutions and released notebooks); versions: constraints.txt.
# Left out as never imported: the front ends (jupyterlab, notebook-shim, widget extensions),
# jupyter_server's extras, prompt_toolkit, jedi, pexpect; debugpy (ipykernel runs without it).
PACKAGES = ("alembic", "arrow", "asttokens", "beautifulsoup4", "bleach", "comm", "defusedxml",
            "executing", "fastjsonschema", "fqdn", "ipykernel", "ipython", "ipywidgets",
            "isoduration", "jsonpointer", "jsonschema", "jsonschema-specifications",
            "jupyter_client", "jupyter_core", "jupyter_server", "jupyterlab_pygments", "Mako",
            "matplotlib-inline", "mistune", "nbclient", "nbconvert", "nbformat", "nbgrader",
            "notebook", "pandocfilters", "platformdirs", "pure_eval", "pyzmq", "RapidFuzz",
            "referencing", "rfc3339-validator", "rfc3986-validator", "rpds-py", "soupsieve",
            "SQLAlchemy", "stack-data", "tinycss2", "tornado", "traitlets", "uri-template",
            "webcolors", "webencodings")
# never read when a notebook is graded: documentation, tests, the browser front ends' files
PRUNE = ("nbgrader/docs", "nbgrader/tests", "notebook/static", "share", "bin", "etc")


@dataclass
class Step:
    name: str
    what: str
    timeout: int
    status: str = "not run"         # ran | failed | timed out | sampled (dry) | skipped
    seconds: float = 0.0
    detail: str = ""
    counts: dict = field(default_factory=dict)
    failures: list = field(default_factory=list)
    figures: list = field(default_factory=list)


class Run:
    """One kit run: the steps, the log, the remaining budget."""

    def __init__(self, out: Path, dry_run: bool, budget: int = BUDGET_S):
        self.out, self.dry_run, self.deadline = out, dry_run, time.monotonic() + budget
        self.work = out / "work"
        shutil.rmtree(self.work, ignore_errors=True)
        self.work.mkdir(parents=True)
        self.log = (out / "gpu_check.log").open("w")
        self.env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=os.pathsep.join(
            p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p))

    def say(self, text: str) -> None:
        print(text, flush=True)
        self.log.write(text + "\n")
        self.log.flush()

    def sh(self, step: Step, cmd: list[str], limit: int | None = None) -> tuple[int | None, str]:
        """Run cmd from the repository root within the step's limit (and the run's budget);
        returns (exit status or None if it timed out, output)."""
        limit = max(1, int(min(limit or step.timeout, self.deadline - time.monotonic())))
        self.say(f"$ {' '.join(cmd)}    (limit {limit} s)")
        # its own session, killed whole on the limit (its pytest-xdist workers, a notebook's
        # kernel), so the GPU is free for the next step
        from autograder.processes import run_logged
        r = run_logged(cmd, cwd=REPO, env=self.env, timeout=limit)
        code, text = r.returncode, r.output
        if r.timed_out:
            text += f"\n[killed at the {limit} s limit]\n"
        self.log.write(text)
        self.log.flush()
        return code, text


def has_gpu() -> bool:
    import torch
    return torch.cuda.is_available()


# --- the steps ------------------------------------------------------------------------------
def pytest_step(run: Run, step: Step, targets: tuple[str, ...], sample: str,
                workers: int) -> None:
    """The tests, compiled for the GPU. In a dry run only `sample` (a -k expression) runs, in the
    CPU interpreter, so that the report is read as on a GPU; all are counted."""
    xml = run.work / f"{step.name}.xml"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o",
           "addopts=", "--junitxml", str(xml), *targets]
    if run.dry_run:
        cmd += ["-k", sample]
        workers = 1                 # pytest-xdist does not report the deselected
    code, text = run.sh(step, cmd + (["-n", str(workers)] if workers > 1 else []))
    step.counts, step.failures, props = junit(xml)
    deselected = re.search(r"(\d+) deselected", text)
    collected = sum(step.counts.values()) + (int(deselected[1]) if deselected else 0)
    step.figures = [f for p in props for f in speed_figures(p)]
    step.status = "timed out" if code is None else ("ran" if code == 0 else "failed")
    step.detail = ", ".join(f"{v} {k}" for k, v in step.counts.items() if v)
    if run.dry_run and step.status == "ran":
        step.status = "sampled"
        step.counts["collected"] = collected
        step.detail = (f"{collected} tests collected; {step.detail} in the sample -k "
                       f"'{sample}' in the interpreter (make test runs them all there)")


def junit(path: Path) -> tuple[dict, list, list]:
    """(counts, failed test ids with their first message line, recorded properties)."""
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    failures, props = [], []
    if not path.is_file():
        return counts, ["pytest wrote no report"], props
    for case in ET.parse(path).iter("testcase"):
        tid = f"{case.get('classname')}::{case.get('name')}"
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        if bad is not None:
            counts["failed"] += 1
            failures.append(f"{tid}: {(bad.get('message') or '').splitlines()[0][:200]}"
                            if bad.get("message") else tid)
        elif case.find("skipped") is not None:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
        for p in case.iter("property"):
            props.append((p.get("name"), p.get("value")))
    return counts, failures, props


def speed_figures(prop: tuple[str, str]) -> list[dict]:
    """A test's recorded speed report (record_property("speed <what>", json)) as figures."""
    name, value = prop
    if not name.startswith("speed "):
        return []
    r = json.loads(value)
    what = name[len("speed "):]
    return [{"figure": f"{what}: fraction of a device copy", "value": r["fraction_of_copy"],
             "want": r.get("min_fraction_of_copy")},
            {"figure": f"{what}: speed vs the course's kernel", "value": r["ratio_to_reference"],
             "want": r.get("min_ratio_to_reference")}]


def labs_step(run: Run, step: Step) -> None:
    notebooks = [REPO / "labs" / lab / f"{lab}.ipynb" for lab in LABS]
    missing = [str(n.relative_to(REPO)) for n in notebooks if not n.is_file()]
    code, text = run.sh(step, [sys.executable, "-c", "import nbgrader, nbclient, ipykernel"],
                        limit=60)
    if missing or code != 0:
        step.status = "failed"
        step.detail = f"missing: {missing}" if missing else \
            "nbgrader or Jupyter is missing (make gpu-pack puts them in .gpu/: carry it)"
        return
    if run.dry_run:
        step.status = "skipped"
        step.detail = ("notebooks and nbgrader present; not executed: tests/test_pipeline.py "
                       "self-grades both on the CPU")
        return
    failed = False
    for lab, nb in zip(LABS, notebooks):
        code, text = run.sh(step, [sys.executable, "-m", "autograder", "selfgrade", str(nb),
                                   "--mem-gb", "0"], limit=step.timeout // len(LABS))
        got, most, full = read_selfgrade(text)
        full &= code == 0
        step.figures.append({"figure": f"{lab} self-graded (points)", "value": got,
                             "want": most})
        failed |= not full
        if not full:
            step.failures += [f"{lab}: {line.strip()}" for line in text.splitlines()
                              if "FAILED" in line or "Error" in line][:8] or \
                [f"{lab}: {'timed out' if code is None else f'exit {code}'}"]
    step.status = "failed" if failed else "ran"
    step.detail = "; ".join(f"{f['figure']}: {fmt(f['value'])} of {fmt(f['want'])}"
                            for f in step.figures)


def read_selfgrade(text: str) -> tuple[float | None, float | None, bool]:
    """(points, of how many, full marks) from `autograder selfgrade`'s last line."""
    m = re.search(r"^autograded: ([\d.]+) / ([\d.]+) in \d+ s.*$", text, re.M)
    if not m:
        return None, None, False
    return float(m[1]), float(m[2]), m[0].endswith("-- full marks")


BENCHMARKS = (  # (script, arguments on a GPU, arguments in a dry run, seconds)
    ("dequant_matmul.py", ["--batch", "1,16", "--repeats", "20"], [], 40),
    ("paged_attention.py", ["--repeats", "20"], ["--dry-run", "--repeats", "2", "--warmup", "1"],
     40),
    ("gpu_decode.py", ["--models", "shipped,7b", "--rounds", "3"], [], 120),
)
SWEEPS = (      # --sweeps (SWEEPS=1), after the four steps and outside their 8 minutes
    ("paged_attention.py", ["--sweep", "--repeats", "20"], ["--dry-run", "--sweep"], 240),
    ("dequant_matmul.py", ["--sizes", "4096,8192", "--batch", "1", "--sweep", "--repeats", "20"],
     [], 300),
    ("gemv_sweep.py", [], [], 300),
)


def benchmarks_step(run: Run, step: Step, gpu: bool, table=BENCHMARKS) -> None:
    statuses = []
    for script, args, dry_args, limit in table:
        out = run.work / f"{step.name}_{script.replace('.py', '.json')}"
        code, text = run.sh(step, [sys.executable, f"benchmarks/{script}",
                                   *(dry_args if run.dry_run else args),
                                   "--json-out", str(out)], limit=limit)
        if code is None or code != 0:
            statuses.append(f"{script}: {'timed out' if code is None else f'exit {code}'}")
            step.failures.append(statuses[-1])
        elif out.is_file():
            report = json.loads(out.read_text())
            step.figures += benchmark_figures(script, report)
            statuses.append(f"{script}: ran" + (" (dry run: figures meaningless)"
                                                if report.get("dry_run") else ""))
        else:
            statuses.append(f"{script}: skipped (needs CUDA: "
                            f"{text.strip().splitlines()[-1][:80] if text.strip() else ''})")
    step.detail = "; ".join(statuses)
    step.status = "failed" if step.failures else (
        "ran" if all(": ran" in s for s in statuses) else "skipped" if not gpu else "failed")


def benchmark_figures(script: str, report: dict) -> list[dict]:
    """The figures that ../shared/GPU.md's goals name, from a benchmark's JSON report."""
    figs = []
    for name, g in report.get("goals", {}).items():
        got = g.get("got")
        want = g.get("want", g.get("want_speedup_at_M1"))
        figs.append({"figure": f"{script} {name}", "value": got, "want": want})
    for m in report.get("models", []):
        for r in m.get("rows", []):
            if r.get("mode") != "graph":
                continue
            figs.append({"figure": f"gpu_decode {m.get('model')} {r['format']} graph: tok/s, "
                                   f"fraction of copy, vs bf16",
                         "value": [round(r["tok_s"]), round(r["bandwidth_fraction"], 3),
                                   round(r["vs_bf16_same_mode"], 3)], "want": None})
    if "tokens" in report:
        rows = report["tokens"]
        figs.append({"figure": "gpu_decode: GraphDecoder's greedy tokens equal the naive loop's",
                     "value": f"{sum(r['match'] for r in rows)} of {len(rows)} comparisons",
                     "want": f"{len(rows)} of {len(rows)}"})
    return figs


# --- the environment and the summary -------------------------------------------------------
def site_archive(python: str | None = None) -> Path:
    major, minor = (python or platform.python_version()).split(".")[:2]
    return CARRY / f"site-py{major}{minor}.tar.xz"


def install_site(run: Run) -> str:
    """Unpack the carried packages (make gpu-pack) into build/gpu-site/ and put them on the
    steps' paths: nothing is fetched. nbgrader runs `alembic` as a command: it gets one too."""
    archive = site_archive()
    if not archive.is_file():
        others = sorted(p.name for p in CARRY.glob("site-py*.tar.xz"))
        return f"none carried for Python {platform.python_version()}" + \
            (f" (there is {', '.join(others)})" if others else "")
    stamp = SITE / ".unpacked"
    if not stamp.is_file() or stamp.read_text() != archive.name:
        shutil.rmtree(SITE, ignore_errors=True)
        (SITE / "bin").mkdir(parents=True)
        with tarfile.open(archive) as tar:
            tar.extractall(SITE, filter="data")
        alembic = SITE / "bin" / "alembic"
        alembic.write_text(f"#!{sys.executable}\nimport sys\nfrom alembic.config import main\n"
                           "sys.exit(main())\n")
        alembic.chmod(0o755)
        stamp.write_text(archive.name)
    run.env["PYTHONPATH"] = os.pathsep.join([str(SITE), run.env["PYTHONPATH"]])
    run.env["PATH"] = os.pathsep.join([str(SITE / "bin"), run.env.get("PATH", "")])
    # a kernel in bubblewrap sees neither these packages nor the GPU: the kit grades the
    # course's own solutions, unsandboxed
    run.env["AUTOGRADER_BWRAP"] = "/nonexistent"
    return f"{archive.name} ({archive.stat().st_size / 2**20:.1f} MiB) unpacked; sandbox off"


def environment() -> dict:
    import numpy
    import torch
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    env = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "python": platform.python_version(), "torch": torch.__version__,
           "triton": triton_version, "numpy": numpy.__version__, "cuda": torch.version.cuda,
           "commit": commit()}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        env["device"] = f"{p.name}, {p.total_memory / 2**30:.0f} GiB, sm_{p.major}{p.minor}"
    else:
        env["device"] = f"no CUDA GPU ({platform.processor() or platform.machine()}, "\
                        f"{os.cpu_count()} CPUs)"
    return env


def commit() -> str:
    """HEAD here; on a lent machine (no .git) the commit `make gpu-pack` wrote."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, text=True,
                              capture_output=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        packed = CARRY / "commit.txt"
        return packed.read_text().strip() if packed.is_file() else "unknown"


def section(summary: dict) -> str:
    """The dated RESULTS.md section for a summary."""
    env = summary["environment"]
    title = "dry run, not a GPU's figures" if summary["dry_run"] else env["device"]
    command = "make gpu-check" + (" DRY_RUN=1" if summary["dry_run"] else "") + \
        (f" (--only {','.join(summary['only'])})" if summary.get("only") else "")
    lines = [f"## make gpu-check, {env['date'][:10]}: {title}", "",
             f"`{command}` at {env['commit']};"
             f" {env['device']}; Python {env['python']}, torch {env['torch']}, triton "
             f"{env['triton']}, numpy {env['numpy']}, CUDA {env['cuda']}; {env['date']}; "
             f"{summary['seconds']:.0f} s of its {summary['budget_s']} s. Carried packages: "
             f"{summary['packages']}.", "",
             "| step | verdict | seconds | what happened |", "|---|---|---:|---|"]
    for s in summary["steps"]:
        lines.append(f"| {s['name']} | {s['status']} | {s['seconds']:.0f} | "
                     f"{s['detail'].replace('|', '/')} |")
    failures = [f for s in summary["steps"] for f in s["failures"]]
    if failures:
        lines += ["", "Failures:", ""] + [f"- {f.replace('|', '/')}" for f in failures[:30]]
    figures = [f for s in summary["steps"] for f in s["figures"]]
    if figures:
        lines += ["", "| figure | value | goal or threshold |", "|---|---|---|"]
        for f in figures:
            lines.append(f"| {f['figure']} | {fmt(f['value'])} | {fmt(f['want'])} |")
    return "\n".join(lines) + "\n"


def fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}"
    if isinstance(v, list):
        return ", ".join(fmt(x) for x in v)
    return str(v)


def append_section(summary: dict, results: Path) -> None:
    text = results.read_text()
    results.write_text(text.rstrip("\n") + "\n\n" + section(summary))


def check(out: Path, dry_run: bool, budget: int = BUDGET_S, append: Path | None = None,
          sweeps: bool = False, only: tuple[str, ...] = ()) -> dict:
    """Run the steps (`only`: those named) and write the summary, the log and the section."""
    gpu = has_gpu()
    if not gpu and not dry_run and set(only) != {"labs"}:
        raise SystemExit("make gpu-check needs a CUDA GPU; without one: make gpu-check DRY_RUN=1 "
                         "(or --only labs: the labs step runs on a CPU too)")
    out.mkdir(parents=True, exist_ok=True)
    run = Run(out, dry_run, budget)
    t0 = time.monotonic()
    packages = install_site(run)
    # first sizes, to be trimmed by the seconds each step records
    steps = [Step("gpu_tests", "kernel, backend and CUDA-graph tests", 80),
             Step("student_kernels", "labs 04 and 07's kernels as graded", 60),
             Step("labs", "labs 04 and 07 self-graded", 140),
             Step("benchmarks", "kernel and decode benchmarks",
                  sum(b[-1] for b in BENCHMARKS))]
    if sweeps:
        steps.append(Step("sweeps", "block-size and split sweeps", sum(b[-1] for b in SWEEPS)))
        run.deadline += steps[-1].timeout
    workers = min(4, os.cpu_count() or 1)
    unknown = set(only) - {s.name for s in steps}
    if unknown:
        raise SystemExit(f"no step {sorted(unknown)}; the steps: {[s.name for s in steps]}")
    steps = [s for s in steps if not only or s.name in only]
    for step in steps:
        if time.monotonic() >= run.deadline:
            step.status, step.detail = "timed out", "not started: the run's budget was spent"
            continue
        run.say(f"== {step.name}: {step.what}")
        t = time.monotonic()
        if step.name == "gpu_tests":
            pytest_step(run, step, GPU_TESTS, GPU_SAMPLE, workers)
        elif step.name == "student_kernels":
            pytest_step(run, step, STUDENT_TESTS, STUDENT_SAMPLE, workers)
        elif step.name == "labs":
            labs_step(run, step)
        else:
            benchmarks_step(run, step, gpu, BENCHMARKS if step.name == "benchmarks" else SWEEPS)
        step.seconds = time.monotonic() - t
        run.say(f"== {step.name}: {step.status} in {step.seconds:.0f} s -- {step.detail}")
        for f in step.failures:
            run.say(f"   {f}")
    summary = {"kit": "make gpu-check", "dry_run": dry_run, "only": list(only),
               "environment": environment(),
               "packages": packages, "budget_s": budget, "seconds": time.monotonic() - t0,
               "steps": [vars(s) for s in steps]}
    (out / "gpu_check.json").write_text(json.dumps(summary, indent=1))
    (out / "RESULTS_section.md").write_text(section(summary))
    shutil.rmtree(run.work, ignore_errors=True)
    if append and not dry_run:
        append_section(summary, append)
        run.say(f"appended to {append}")
    run.log.close()
    return summary


# --- the tree that travels -----------------------------------------------------------------
def travelling_bytes() -> tuple[int, list[tuple[int, str]]]:
    """(bytes of what the device tool sends: tracked and untracked-not-ignored files that
    exist, plus .gpu/, the carry; the largest files)."""
    names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                            "--exclude-standard"], cwd=REPO, capture_output=True,
                           check=True).stdout.decode().split("\0")
    files = [REPO / n for n in dict.fromkeys(names) if n and (REPO / n).is_file()]
    files += [p for p in CARRY.rglob("*") if p.is_file()]
    sizes = [(p.stat().st_size, str(p.relative_to(REPO))) for p in files]
    return sum(s for s, _ in sizes), sorted(sizes, reverse=True)[:5]


def build_site(python: str) -> Path:
    """The packages of PACKAGES for CPython `python` on x86-64 Linux, pinned by constraints.txt,
    installed into a folder, pruned and packed into .gpu/site-pyXY.tar.xz."""
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.strip().split("==", 1)
            pins[re.sub(r"[-_.]+", "-", name).lower()] = version
    wanted = [f"{p}=={pins[re.sub(r'[-_.]+', '-', p).lower()]}" for p in PACKAGES]
    target = [*PLATFORM, "--python-version", python]
    wheels = REPO / "build" / f"gpu-wheels-py{python}"
    site = REPO / "build" / f"gpu-site-py{python}"
    shutil.rmtree(site, ignore_errors=True)
    for what in ("download", "install"):
        cmd = ["download", "-q", "--no-deps", *target, "-d", str(wheels), *wanted] \
            if what == "download" else \
            ["install", "-q", "--no-deps", "--no-index", "--no-compile", *target, "--target",
             str(site), *map(str, sorted(wheels.glob("*.whl")))]
        r = subprocess.run([sys.executable, "-m", "pip", *cmd], capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"pip could not {what} the packages for Python {python}: "
                             + " ".join(r.stderr.strip().splitlines()[-2:]))
    for rel in PRUNE:
        shutil.rmtree(site / rel, ignore_errors=True)
    for cache in list(site.rglob("__pycache__")):
        shutil.rmtree(cache, ignore_errors=True)
    archive = site_archive(python)
    CARRY.mkdir(exist_ok=True)
    with tarfile.open(archive, "w:xz") as tar:
        for path in sorted(site.iterdir()):
            tar.add(path, arcname=path.name)
    shutil.rmtree(site)
    return archive


def pack(python: str | None = "3.12") -> int:
    """Make the tree travel: leave out LEFT_OUT, carry the packages for `python` (None: none)."""
    for folder in LEFT_OUT:
        path = REPO / folder
        if path.exists():
            shutil.rmtree(path)
            print(f"left out {folder} (git keeps it: make gpu-unpack puts it back)")
    CARRY.mkdir(exist_ok=True)
    if python:
        archive = build_site(python)
        print(f"packed {archive.relative_to(REPO)}: {archive.stat().st_size / 2**20:.1f} MiB")
    (CARRY / "commit.txt").write_text(commit() + "\n")
    total, largest = travelling_bytes()
    print(f"travels: {total / 2**20:.1f} MiB of the device tool's {CARRY_LIMIT >> 20} MiB "
          f"(carry [\".gpu\"]); largest: " + ", ".join(f"{n} {s / 2**20:.1f} MiB"
                                                      for s, n in largest[:3]))
    if total > CARRY_LIMIT:
        print("too large to travel")
        return 1
    return 0


def unpack() -> int:
    return subprocess.run(["git", "checkout", "--", *LEFT_OUT], cwd=REPO).returncode


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dry-run", action="store_true", help="on a CPU: what runs without a GPU")
    ap.add_argument("--out", default=os.environ.get("OUT") or str(REPO / "benchmarks" / "out"))
    ap.add_argument("--budget", type=int, default=BUDGET_S, help="seconds for the whole run")
    ap.add_argument("--sweeps", action="store_true",
                    help="then the kernels' block-size and split sweeps (up to 14 more minutes)")
    ap.add_argument("--only", default="", help="comma-separated steps to run (without a GPU: "
                    "labs, which self-grades on the CPU; with the carried packages, the check "
                    "that they are enough)")
    ap.add_argument("--append", action="store_true",
                    help="add the section to benchmarks/RESULTS.md (a GPU run on this checkout)")
    ap.add_argument("--record", metavar="JSON", help="add the section of a gpu_check.json "
                    "brought back from a lent machine to benchmarks/RESULTS.md, and stop")
    ap.add_argument("--pack", action="store_true", help="make the tree travel, and stop")
    ap.add_argument("--python", default="3.12", help="with --pack: the lent machine's Python "
                    "(the GPU image's: 3.12); 'none' carries no packages")
    ap.add_argument("--unpack", action="store_true", help="put LEFT_OUT back, and stop")
    args = ap.parse_args(argv)
    results = REPO / "benchmarks" / "RESULTS.md"
    if args.pack:
        return pack(None if args.python == "none" else args.python)
    if args.unpack:
        return unpack()
    if args.record:
        summary = json.loads(Path(args.record).read_text())
        if summary.get("dry_run") or summary["environment"]["device"].startswith("no CUDA"):
            raise SystemExit(f"{args.record} is a dry run or a CPU's: its figures are not a "
                             "GPU's")
        append_section(summary, results)
        print(f"appended the section of {args.record} to {results}")
        return 0
    summary = check(Path(args.out), args.dry_run, args.budget,
                    append=results if args.append else None, sweeps=args.sweeps,
                    only=tuple(filter(None, args.only.split(","))))
    bad = [s["name"] for s in summary["steps"] if s["status"] in ("failed", "timed out")]
    print(f"gpu-check{' (dry run)' if args.dry_run else ''}: "
          + ("every step passed or was skipped as said" if not bad else f"failed: {bad}")
          + f"; {args.out}/gpu_check.json")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
