"""Adversarial tests of `python -m autograder grade`: one batch of hostile submissions.

A temporary course holds only the dummy lab of tests/test_pipeline.py (`99_dummy`: write
`scale(logits, t)`, whose reference `minillm.sampling.apply_temperature` is withheld from the
kernel; 99_scale_test, 2 points, has a visible part and a hidden part; 99_asset_test, 1 point).
Its tests run in the tester, apart from the kernel, as every lab's do. One batch, graded with
`grade_submissions(..., workers=2)`, holds an honest submission and one submission per attack
(tests/attacks_machine.py, tests/attacks_kernel.py: the attack's code is the solution cell's
body and/or extra cells around the tests). The honest submission is also graded alone, in a
course of its own, at the same time.

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
* the batch finishes with one record per submission; an attack whose `scale` is wrong scores 0
  on 99_scale_test, with a reason.

Attacks written against the old design's machinery (the sealed cells' hook and its signed
verdicts, the values tests showed the grader) stay in the batch: they now find nothing to
attack, and still must earn nothing. `TAMPER_ONLY=name,name` grades only those attacks (plus
the honest submission), for working on one attack.
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
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import attacks_kernel
import attacks_machine
import nbformat
import psutil
import pytest
from attacks_common import ASSET_TEST, GOOD, HIDDEN_TOKENS, HONEST, SCALE_TEST, Attack
from nbformat.v4 import new_code_cell
from test_pipeline import DUMMY, dummy_course

from autograder import compile_cache
from autograder.course import Course
from autograder.grade import grade_submissions
from autograder.jobs import MAX_CELL_OUTPUT
from autograder.sandbox import sandbox_unavailable_reason

REPO = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("tamper")]

ATTACKS: list[Attack] = attacks_machine.ATTACKS + attacks_kernel.ATTACKS
BY_NAME = {a.name: a for a in ATTACKS}
# Attacks that still succeed, each a strict xfail: the day one stops working, its test fails
# and this entry goes. autograder/README.md ("Not guaranteed") says why they are open.
KNOWN_OPEN: dict[str, str] = {}
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
    """The batch (and the honest submission alone); yields the Run."""
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
        courses = _in_threads(lambda: dummy_course(alone_root),
                              lambda: dummy_course(batch_root))
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
        yield Run(marker, secret, alone, batch, list(listener.hits), survivors, host_files, roots)
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
    if attack.tamper:
        scale_cell = next(c for c in rec.cells if c.grade_id == SCALE_TEST)
        assert scale_cell.score == 0 and scale_cell.errors, describe(rec)
    # nobody else is affected, nothing leaked
    honest = run.batch.records[HONEST]
    assert _scores(honest.cells) == _scores(run.alone.records[HONEST].cells), describe(honest)
    assert not hidden_leaks(run.batch.feedback.get(name, "")), \
        f"hidden test text in {name}'s feedback: {hidden_leaks(run.batch.feedback[name])}"
    assert run.secret not in out and run.secret not in run.batch.feedback.get(name, "")
    assert not [p for p in run.host_files if name in p or run.marker in p]


def test_the_kernel_never_held_the_hidden_tests(run):
    """memory_read_sources scanned its kernel's memory during the hidden call and found no
    hidden test: it printed how many it found, and that is none."""
    if "memory_read_sources" not in run.batch.records:
        pytest.skip("memory_read_sources not selected (TAMPER_ONLY)")
    out = run.batch.outputs["memory_read_sources"]
    assert "hidden sources found: 0" in out and "LEAKED SOURCE" not in out, out[-3000:]


def test_a_hung_or_dead_kernel_fails_its_test_and_nothing_else(run):
    """hang_in_a_test: the hidden call timed out, the next test was graded (its 1 point);
    exit_in_a_test: the kernel died in the hidden call, that cell and the later ones score 0."""
    if "hang_in_a_test" not in run.batch.records or "exit_in_a_test" not in run.batch.records:
        pytest.skip("hang_in_a_test / exit_in_a_test not selected (TAMPER_ONLY)")
    hang = {c.grade_id: c for c in run.batch.records["hang_in_a_test"].cells}
    assert hang["99_scale_test"].score == 0 and hang["99_asset_test"].score == 1, hang
    dead = run.batch.records["exit_in_a_test"]
    assert dead.status == "kernel died", dead
    assert all(c.score == 0 for c in dead.cells), dead


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
    open_attacks = {a.name for a in SELECTED if a.known_open}
    for graded in (run.alone, run.batch):
        for student, text in graded.feedback.items():
            if student in open_attacks:
                continue
            leaks = hidden_leaks(text) + (["GRADER_SECRET"] if run.secret in text else [])
            if leaks:
                bad[student] = leaks
        assert not hidden_leaks(graded.csv_text) and run.secret not in graded.csv_text
    assert not bad
