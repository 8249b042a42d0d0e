"""`make gpu-check` (benchmarks/gpu_check.py), the kit a lent GPU runs first.

* `make gpu-check DRY_RUN=1` passes on this CPU and says, step by step, what ran, what was only
  sampled and what was skipped, in its JSON summary and its RESULTS.md section; it never
  appends to RESULTS.md;
* a failing test fails its step with the test's name; a speed report a test records becomes a
  figure; `selfgrade`'s last line is read as the labs step reads it;
* a GPU summary renders into a dated section; `--record` refuses a dry run;
* `make gpu-pack` (on a clone) leaves the unneeded models out, the tree then fits the device
  tool's 64 MiB with room for the carried packages, and `make gpu-unpack` puts them back.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from autograder.selfgrade import report
from benchmarks import gpu_check as gc

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "RESULTS.md"


@pytest.mark.skipif(gc.has_gpu(), reason="a dry run is for machines without a GPU")
def test_the_dry_run_passes_and_says_what_it_skipped(tmp_path):
    before = RESULTS.read_bytes()
    r = subprocess.run(["make", "-o", ".venv/.installed", "gpu-check", "DRY_RUN=1",
                        f"OUT={tmp_path}"], cwd=REPO,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    summary = json.loads((tmp_path / "gpu_check.json").read_text())
    steps = {s["name"]: s for s in summary["steps"]}
    assert list(steps) == ["gpu_tests", "student_kernels", "labs", "benchmarks"]
    assert summary["dry_run"] is True and "no CUDA GPU" in summary["environment"]["device"]
    for name, at_least in (("gpu_tests", 200), ("student_kernels", 50)):
        s = steps[name]
        assert s["status"] == "sampled" and s["counts"]["collected"] >= at_least, s
        assert s["counts"]["passed"] >= 2 and s["counts"]["failed"] == 0, s
    assert steps["labs"]["status"] == "skipped"
    assert "test_pipeline.py" in steps["labs"]["detail"]
    bench = steps["benchmarks"]
    assert "paged_attention.py: ran (dry run" in bench["detail"]
    assert "gpu_decode.py: skipped (needs CUDA" in bench["detail"]
    assert any(f["figure"].startswith("paged_attention.py") for f in bench["figures"])
    section = (tmp_path / "RESULTS_section.md").read_text()
    assert section.startswith("## make gpu-check, ") and "dry run, not a GPU's figures" in section
    assert "| labs | skipped |" in section
    assert (tmp_path / "gpu_check.log").read_text().count("== ") >= 8
    assert not (tmp_path / "work").exists()                 # three files come back, no more
    assert RESULTS.read_bytes() == before
    assert "every step passed or was skipped as said" in r.stdout


def _step(tmp_path, name="t") -> tuple[gc.Run, gc.Step]:
    return gc.Run(tmp_path, dry_run=False, budget=120), gc.Step(name, "a test", 60)


SPEED = {"fraction_of_copy": 0.31, "ratio_to_reference": 0.9, "min_fraction_of_copy": 0.1,
         "min_ratio_to_reference": 0.25, "dry_run": False}


def test_a_step_reads_failures_skips_and_speed_reports_from_pytest(tmp_path):
    tests = tmp_path / "test_kit_probe.py"
    tests.write_text(
        "import json\nimport pytest\n\n\n"
        "def test_good(record_property):\n"
        f"    record_property('speed lab 04 w8a16 kernel', json.dumps({SPEED!r}))\n\n\n"
        "def test_bad():\n    assert 1 == 2, 'one is not two'\n\n\n"
        "@pytest.mark.skip(reason='no GPU')\ndef test_skipped():\n    pass\n")
    run, step = _step(tmp_path / "out")
    gc.pytest_step(run, step, (str(tests),), "unused", workers=1)
    assert step.status == "failed"
    assert step.counts == {"passed": 1, "failed": 1, "skipped": 1}
    assert len(step.failures) == 1 and "test_bad" in step.failures[0]
    assert "one is not two" in step.failures[0]
    assert step.figures == [
        {"figure": "lab 04 w8a16 kernel: fraction of a device copy", "value": 0.31, "want": 0.1},
        {"figure": "lab 04 w8a16 kernel: speed vs the course's kernel", "value": 0.9,
         "want": 0.25}]
    assert gc.junit(tmp_path / "missing.xml")[1] == ["pytest wrote no report"]


def _record(scores):
    cells = [SimpleNamespace(grade_id=f"c{i}", autograded=True, score=got, max_score=most,
                             errors=[]) for i, (got, most) in enumerate(scores)]
    return SimpleNamespace(cells=cells, status="ok", log="log", exec_seconds=42.0, seconds=50.0)


@pytest.mark.parametrize("scores,want", [([(2, 2), (3, 3)], (5.0, 5.0, True)),
                                         ([(2, 2), (0, 3)], (2.0, 5.0, False))])
def test_selfgrades_verdict_is_read_from_its_last_line(scores, want):
    lines = []
    report(_record(scores), log=lines.append)
    assert gc.read_selfgrade("\n".join(["self-grading ...", *lines])) == want
    assert gc.read_selfgrade("Traceback ...") == (None, None, False)


def _gpu_summary():
    env = {"date": "2026-12-01T10:00:00+00:00", "python": "3.12.3", "torch": "2.11.0",
           "triton": "3.6.0", "numpy": "2.5.2", "cuda": "13.0", "commit": "abc1234",
           "device": "NVIDIA H200, 140 GiB, sm_90"}
    step = {"name": "labs", "status": "ran", "seconds": 61.2, "detail": "a | b",
            "failures": [], "figures": [{"figure": "04_quantization self-graded (points)",
                                         "value": 30.0, "want": 30.0}]}
    return {"dry_run": False, "environment": env, "packages": "site-py312.tar.xz", "budget_s": 480,
            "seconds": 400.4, "steps": [step]}


def test_a_gpu_summary_becomes_a_dated_section_and_is_recorded(tmp_path):
    text = gc.section(_gpu_summary())
    assert text.startswith("## make gpu-check, 2026-12-01: NVIDIA H200, 140 GiB, sm_90\n")
    assert "torch 2.11.0, triton 3.6.0" in text and "400 s of its 480 s" in text
    assert "| labs | ran | 61 | a / b |" in text
    assert "| 04_quantization self-graded (points) | 30 | 30 |" in text
    summary = tmp_path / "gpu_check.json"
    summary.write_text(json.dumps(_gpu_summary()))
    results = tmp_path / "RESULTS.md"
    results.write_text("# Results\n")
    gc.append_section(json.loads(summary.read_text()), results)
    assert results.read_text() == "# Results\n\n" + text
    dry = tmp_path / "dry.json"
    dry.write_text(json.dumps({**_gpu_summary(), "dry_run": True}))
    with pytest.raises(SystemExit, match="is a dry run"):
        gc.main(["--record", str(dry)])
    cpu = tmp_path / "cpu.json"
    cpu.write_text(json.dumps({**_gpu_summary(), "only": ["labs"], "environment": {
        **_gpu_summary()["environment"], "device": "no CUDA GPU (x86_64, 2 CPUs)"}}))
    assert "`make gpu-check (--only labs)` at abc1234" in gc.section(json.loads(cpu.read_text()))
    with pytest.raises(SystemExit, match="not a GPU's"):
        gc.main(["--record", str(cpu)])


def test_without_a_gpu_the_real_run_refuses(tmp_path, monkeypatch):
    monkeypatch.setattr(gc, "has_gpu", lambda: False)
    with pytest.raises(SystemExit, match="needs a CUDA GPU.*DRY_RUN=1"):
        gc.check(tmp_path, dry_run=False)
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        gc.check(tmp_path, dry_run=False, only=("labs", "gpu_tests"))
    with pytest.raises(SystemExit, match=r"no step \['lab'\]"):
        gc.check(tmp_path, dry_run=True, only=("lab",))


def test_the_packed_tree_travels_and_unpacks(tmp_path):
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    shutil.copy2(gc.__file__, clone / "benchmarks" / "gpu_check.py")     # this tree's kit
    kit = [sys.executable, "benchmarks/gpu_check.py"]
    before = sum(p.stat().st_size for folder in gc.LEFT_OUT
                 for p in (clone / folder).rglob("*") if p.is_file())
    r = subprocess.run(kit + ["--pack", "--python", "none"], cwd=clone, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert all(not (clone / folder).exists() for folder in gc.LEFT_OUT)
    assert "travels: " in r.stdout and "left out minillm/assets/hybrid" in r.stdout
    travels = float(r.stdout.split("travels: ")[1].split(" MiB")[0])
    assert before > 40 * 2**20                        # what is left out is worth leaving out
    assert travels < 64 - gc.SITE_MIB, f"{travels} MiB leaves no room for the packages"
    assert (clone / ".gpu" / "commit.txt").read_text().strip()
    r = subprocess.run(kit + ["--unpack"], cwd=clone, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    status = subprocess.run(["git", "status", "--porcelain", "--", *gc.LEFT_OUT], cwd=clone,
                            capture_output=True, text=True, check=True).stdout
    assert status == "" and all((clone / folder).is_dir() for folder in gc.LEFT_OUT)


def test_carried_packages_are_unpacked_onto_the_steps_paths(tmp_path, monkeypatch):
    import platform
    import tarfile
    monkeypatch.setattr(gc, "CARRY", tmp_path / ".gpu")
    monkeypatch.setattr(gc, "SITE", tmp_path / "site")
    run = gc.Run(tmp_path / "out", dry_run=False)
    assert gc.install_site(run) == f"none carried for Python {platform.python_version()}"
    package = tmp_path / "pkg" / "kit_probe_pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("WHERE = 'carried'\n")
    gc.CARRY.mkdir()
    with tarfile.open(gc.site_archive(), "w:xz") as tar:
        tar.add(package, arcname="kit_probe_pkg")
    said = gc.install_site(run)
    assert said.startswith(gc.site_archive().name) and "sandbox off" in said
    assert run.env["PYTHONPATH"].split(":")[0] == str(gc.SITE)
    assert run.env["PATH"].split(":")[0] == str(gc.SITE / "bin")
    assert run.env["AUTOGRADER_BWRAP"] == "/nonexistent"
    alembic = gc.SITE / "bin" / "alembic"
    assert alembic.read_text().startswith(f"#!{sys.executable}\n") and alembic.stat().st_mode & 1
    r = subprocess.run([sys.executable, "-c", "import kit_probe_pkg; print(kit_probe_pkg.WHERE)"],
                       env=run.env, capture_output=True, text=True)
    assert r.stdout.strip() == "carried", r.stderr


def test_a_command_past_its_limit_is_killed_with_its_children(tmp_path):
    run, step = _step(tmp_path)
    child = tmp_path / "child.pid"
    t0 = time.monotonic()
    code, text = run.sh(step, [sys.executable, "-c",
                               "import subprocess, sys, time\n"
                               "p = subprocess.Popen([sys.executable, '-c', "
                               "'import time; time.sleep(60)'])\n"
                               f"open({str(child)!r}, 'w').write(str(p.pid))\n"
                               "print('started', flush=True)\ntime.sleep(60)\n"], limit=2)
    assert code is None and "started" in text and "killed at the 2 s limit" in text
    assert time.monotonic() - t0 < 15
    pid = int(child.read_text())
    import psutil
    try:
        psutil.Process(pid).wait(timeout=5)
    except psutil.NoSuchProcess:
        pass
    except psutil.TimeoutExpired:                  # gone but for its exit status
        assert psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, f"{pid} outlived the limit"


def test_the_benchmarks_reports_become_the_gpu_goals_figures():
    decode = {"tokens": [{"match": True}, {"match": False}],
              "models": [{"model": "7b", "rows": [
                  {"format": "int4", "mode": "graph", "tok_s": 220.4, "bandwidth_fraction": 0.2,
                   "vs_bf16_same_mode": 1.18},
                  {"format": "int4", "mode": "eager", "tok_s": 52, "bandwidth_fraction": 0.05,
                   "vs_bf16_same_mode": 0.6}]}]}
    assert gc.benchmark_figures("gpu_decode.py", decode) == [
        {"figure": "gpu_decode 7b int4 graph: tok/s, fraction of copy, vs bf16",
         "value": [220, 0.2, 1.18], "want": None},
        {"figure": "gpu_decode: GraphDecoder's greedy tokens equal the naive loop's",
         "value": "1 of 2 comparisons", "want": "2 of 2"}]
    dequant = {"goals": {"w4a16": {"want_speedup_at_M1": 2.0, "got": [1.5, 1.48], "met": False}}}
    assert gc.benchmark_figures("dequant_matmul.py", dequant) == [
        {"figure": "dequant_matmul.py w4a16", "value": [1.5, 1.48], "want": 2.0}]
    assert gc.fmt([1.5, 1.48]) == "1.5, 1.48" and gc.fmt(None) == "-"
    assert gc.site_archive("3.12.3").name == "site-py312.tar.xz"
    assert gc.site_archive("3.9.18").name == "site-py39.tar.xz"


def test_a_step_the_budget_never_reached_fails_the_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gc, "has_gpu", lambda: False)
    assert gc.main(["--dry-run", "--only", "labs", "--budget", "0", "--out", str(tmp_path)]) == 1
    step = json.loads((tmp_path / "gpu_check.json").read_text())["steps"][0]
    assert step["status"] == "timed out" and "budget was spent" in step["detail"]
    assert "failed: ['labs']" in capsys.readouterr().out
