"""autograder/judge.py: the values a hidden test checked, judged by the grader against the
lab's reference run (the instructor's own notebook), outside the kernel."""
from __future__ import annotations

import json
import math

import nbformat
import pytest
import torch
from nbformat.v4 import new_code_cell, new_notebook, new_output
from test_pipeline import DUMMY, dummy_course

from autograder import jobs
from autograder import judge as ev
from autograder.jobs import status_of
from autograder.reference_run import reference
from autograder.sandbox import sandbox_unavailable_reason


def item(value, name="v", atol=0.0, rtol=0.0):
    return {"name": name, "value": ev.encode(value), "atol": atol, "rtol": rtol}


def check(got, want, atol=0.0, rtol=0.0):
    return ev.compare([item(want, atol=atol, rtol=rtol)], [item(got)])


# --- encoding and comparing ---------------------------------------------------------------------
def test_equal_values_match_and_the_reference_tolerance_decides():
    x = torch.tensor([[1.0, -2.5], [float("nan"), float("-inf")]])
    assert check(x.clone(), x) is None
    assert check(x + 1e-6, x) is not None                       # exact by default
    near = x.clone()
    near[0] += 1e-6
    assert check(near, x, atol=1e-5) is None
    assert "1 of 4 values differ" in check(x + torch.tensor([[0, 1.0], [0, 0]]), x, atol=1e-3)
    assert "shape [4]" in check(x.reshape(-1), x)
    assert check(torch.tensor([True, False]), torch.tensor([True, False])) is None
    assert check(torch.tensor([True, True]), torch.tensor([True, False])) is not None
    import numpy as np
    assert check(np.array([1.0, 2.0]), torch.tensor([1.0, 2.0])) is None
    assert check(np.float32(0.5), 0.5) is None
    # nested lists of numbers stand for a tensor of their shape, either way round
    assert check([[1.0, -2.5], [float("nan"), float("-inf")]], x) is None
    assert check(x, [[1.0, -2.5], [float("nan"), float("-inf")]]) is None
    assert check([True, False], torch.tensor([True, False])) is None
    assert "shape [3]" in check([1.0, 2.0, 3.0], torch.tensor([1.0, 2.0]))
    assert check([[1.0], [2.0, 3.0]], torch.tensor([[1.0], [2.0]])) is not None     # ragged


def test_scalars_containers_and_kinds():
    assert check(3, 3) is None and check(4, 3) is not None
    assert check(3.0000001, 3.0, rtol=1e-6) is None and check(3.1, 3.0, rtol=1e-6) is not None
    assert check(float("nan"), float("nan")) is None
    assert check(1.0, float("nan")) is not None
    assert check(math.inf, math.inf) is None and check(-math.inf, math.inf) is not None
    assert check(True, True) is None and check(1, True) is not None    # bool is not an int
    assert check("a", "a") is None and check("b", "a") is not None
    assert check(None, None) is None and check(0, None) is not None
    assert check([1, (2.0, "x")], (1, [2.0, "x"])) is None              # tuples are lists
    assert "not a list of 2" in check([1], [1, 2])
    assert check({"a": [1.5], 2: None}, {"a": [1.5], 2: None}) is None
    assert "keys" in check({"b": 1}, {"a": 1})
    with pytest.raises(TypeError, match="cannot record a object"):
        ev.encode(object())
    with pytest.raises(TypeError, match="dict keys"):
        ev.encode({(1, 2): 3})
    with pytest.raises(ValueError, match="more than"):
        ev.encode(torch.zeros(ev.MAX_VALUES + 1))
    with pytest.raises(ValueError, match="atol and rtol"):
        ev.evidence(1, "x", atol=-1)


def test_a_cell_must_show_the_same_items_in_the_same_order():
    ref = [item(1, "a"), item(2.0, "b", atol=0.1)]
    assert ev.compare(ref, [item(1, "a"), item(2.05, "b")]) is None
    assert "1 evidence item(s) where the reference run showed 2" in ev.compare(ref, [item(1, "a")])
    assert "0 evidence item(s)" in ev.compare(ref, None)
    assert "'b' where the reference showed 'a'" in ev.compare(ref, [item(1, "b"), item(2.0, "b")])
    # the tolerance is the reference's: a submission cannot widen it
    assert ev.compare(ref, [item(1, "a"), item(9.0, "b", atol=100)]) is not None
    assert ev.compare(ref, {"error": "a malformed evidence item"}) == "a malformed evidence item"


# --- taking the evidence out of an executed notebook --------------------------------------------
def _cell(gid, outputs, grade=True):
    c = new_code_cell("pass", metadata={"nbgrader": {"grade_id": gid, "grade": grade,
                                                     "locked": True, "solution": False}})
    c.outputs = outputs
    return c


def _shown(value, name="v", **tol):
    return new_output("display_data", data={ev.MIME: item(value, name, **tol)})


def test_take_removes_every_evidence_output_and_keeps_the_tests():
    text = new_output("stream", name="stdout", text="visible checks passed\n")
    nb = new_notebook(cells=[
        _cell("sol", [_shown(5, "fake")], grade=False),
        _cell("t1", [text, _shown(1, "a"), _shown([2, 3], "b")]),
        _cell("t2", [_shown(1, "x"), new_output("display_data", data={ev.MIME: {"bad": 1}})]),
    ])
    found = ev.take(nb, {"t1", "t2"})
    assert [i["name"] for i in found["t1"]] == ["a", "b"]
    assert found["t2"] == {"error": "a malformed evidence item"}
    assert "sol" not in found
    assert nb.cells[0].outputs == [] and nb.cells[1].outputs == [text]
    assert all(ev.MIME not in json.dumps(c.outputs) for c in nb.cells)


def test_take_caps_the_evidence_of_a_notebook(monkeypatch):
    monkeypatch.setattr(ev, "MAX_NOTEBOOK_BYTES", 2000)
    nb = new_notebook(cells=[_cell("t1", [_shown(list(range(1000)), "big")])])
    assert ev.take(nb, {"t1"}) == {"t1": {"error": "over 0 MB of evidence"}}


# --- judging a job's result -----------------------------------------------------------------------
def test_the_judge_applies_the_rule_assert_close_applies():
    """One rule (checks.within_tolerance) on both sides: what assert_close accepts in the kernel
    the judge accepts against the reference, at the edges of the tolerance too."""
    from autograder.checks import assert_close
    cases = [(1.0 + 1.5e-5, 1.0, 1e-5, 5e-6), (1.0 + 1.6e-5, 1.0, 1e-5, 5e-6), (0.0, 0.0, 0, 0),
             (1e-300, 0.0, 0, 0), (-2.0, 2.0, 1.0, 1.0), (float("nan"), float("nan"), 0, 0),
             (float("inf"), float("inf"), 0, 0), (float("inf"), 1e308, 1e308, 1.0),
             (float("-inf"), float("inf"), 0, 0), (3, 3.0, 0, 0), (1e20, 1e20 + 1e5, 0, 1e-15)]
    verdicts = []
    for got, want, atol, rtol in cases:
        try:
            assert_close(torch.tensor([got], dtype=torch.float64),
                         torch.tensor([want], dtype=torch.float64), atol=atol, rtol=rtol)
            kernel = True
        except AssertionError:
            kernel = False
        grader = check(torch.tensor([got], dtype=torch.float64),
                       torch.tensor([want], dtype=torch.float64), atol=atol, rtol=rtol) is None
        assert kernel == grader, (got, want, atol, rtol)
        verdicts.append(kernel)
    assert True in verdicts and False in verdicts


def test_assert_close_shown_shows_with_twice_the_tolerance_then_asserts(monkeypatch):
    import IPython.display

    from autograder.checks import assert_close_shown
    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda data, raw: shown.append(data[ev.MIME]))
    monkeypatch.setattr(ev, "SHOWING", True)
    x = torch.tensor([1.0, 2.0])
    assert_close_shown(x + 5e-6, x, atol=1e-5, rtol=1e-4, name="x")
    assert shown == [item(x + 5e-6, "x", atol=2e-5, rtol=2e-4)]
    with pytest.raises(AssertionError, match="x: 1 of 2"):
        assert_close_shown(x + torch.tensor([0.0, 1.0]), x, name="x")
    assert len(shown) == 2 and shown[1]["value"]["data"] == [1.0, 3.0]    # shown, then failed
    monkeypatch.setattr(ev, "SHOWING", False)
    assert_close_shown(x, x)
    assert len(shown) == 2                  # outside a graded kernel nothing is shown


def test_numbers_past_a_float_are_a_mismatch_not_a_crash():
    """The shown values are JSON from a kernel the grader does not trust: an int too large for a
    float (JSON allows it) must make the cell's values differ, never stop the grader."""
    huge = 10 ** 400
    ref = [item(torch.tensor([1.5]))]
    for value in ({"shape": [1], "data": [huge]}, {"float": huge}, huge, {"list": [huge]}):
        why = ev.compare(ref, [{"name": "v", "value": value, "atol": 0, "rtol": 0}])
        assert why is not None and "malformed" not in why, value
        assert len(why) < 200 and "0" * 50 not in why, why        # said, not printed
    assert ev.compare([item(1.5)], [{"name": "v", "value": huge, "atol": 0, "rtol": 0}]) \
        is not None
    # past Python's int-to-text limit (4300 digits): said in bits, still no crash
    why = ev.compare(ref, [{"name": "v", "value": {"shape": [1], "data": [10 ** 5000]},
                            "atol": 0, "rtol": 0}])
    assert "an int of 16610 bits" in why, why


def _result(cells, evidence):
    return {"notebooks": {"nb": nbformat.writes(new_notebook(cells=cells))},
            "reports": {"nb": {"evidence": evidence, "tampered": []}}}


def test_judge_zeroes_a_passing_test_whose_values_differ():
    error = new_output("error", ename="AssertionError", evalue="wrong", traceback=[])
    result = _result([_cell("t_ok", []), _cell("t_forged", []), _cell("t_failed", [error]),
                      _cell("t_missing", []), _cell("t_free", [])],
                     {"t_ok": [item(1.0, "a")], "t_forged": [item(2.0, "a")],
                      "t_failed": [item(2.0, "a")]})
    reference = {"nb": {"t_ok": [item(1.0, "a")], "t_forged": [item(1.0, "a")],
                        "t_failed": [item(1.0, "a")], "t_missing": [item(1.0, "a")]}}
    problems = ev.judge(result, reference)
    assert [p.split(":")[0] for p in problems] == ["t_forged", "t_missing"]
    cells = {c.metadata.nbgrader.grade_id: c for c in
             nbformat.reads(result["notebooks"]["nb"], as_version=4).cells}
    assert cells["t_ok"].outputs == [] and cells["t_free"].outputs == []
    assert cells["t_forged"].outputs[-1].ename == "EvidenceMismatch"
    assert "2.0 against 1.0" in cells["t_forged"].outputs[-1].evalue
    assert [o.ename for o in cells["t_failed"].outputs] == ["AssertionError"]   # zero already
    assert status_of(result).startswith("tampered: t_forged: the values this test checked")


# --- the reference run, and a real kernel ---------------------------------------------------------
@pytest.fixture(scope="module")
def course(tmp_path_factory):
    return dummy_course(tmp_path_factory.mktemp("evidence_course"))


def _submit(course, student, body):
    nb = nbformat.read(str(course.release_dir(DUMMY) / f"{DUMMY}.ipynb"), as_version=4)
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == "99_scale":
            cell.source = body
    dest = course.submitted(student, DUMMY)
    dest.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(dest / f"{DUMMY}.ipynb"))
    course.register_students([student])


@pytest.mark.slow
def test_the_reference_run_is_kept_while_the_lab_is_unchanged(course):
    sandbox = sandbox_unavailable_reason() is None
    log = []
    ref = reference(course, DUMMY, log.append, sandbox=sandbox)
    (items,) = ref[DUMMY]["99_scale_test"]
    y = torch.randn(3, 7, generator=torch.Generator().manual_seed(1))
    assert items["name"] == "scale(y, 0.7)" and items["atol"] == 2e-5
    assert ev.compare([items], [item(y / 0.7, "scale(y, 0.7)")]) is None
    assert "99_asset_test" not in ref[DUMMY]                     # no evidence: none judged
    assert reference(course, DUMMY, log.append, sandbox=sandbox) == ref
    assert any("using the reference run's evidence" in line for line in log), log
    # a lab whose own notebook fails its tests gives no reference, and says why
    source = course.source(DUMMY) / f"{DUMMY}.ipynb"
    saved = source.read_text()
    try:
        source.write_text(saved.replace("return logits / t", "return logits * t"))
        assert reference(course, DUMMY, log.append, sandbox=sandbox) is None
        assert "tests failed: 99_scale_test" in log[-1], log[-1]
    finally:
        source.write_text(saved)


@pytest.mark.slow
def test_a_forged_verdict_is_zeroed_by_the_values_alone(course):
    """An honest submission matches the reference. A wrong one whose kernel verdict is forged
    (here: its failure removed from the executed notebook, as a kernel that signs its own
    report would) still shows its own values, and the judge alone zeroes the cell."""
    sandbox = sandbox_unavailable_reason() is None
    ref = reference(course, DUMMY, sandbox=sandbox)
    _submit(course, "good", "def scale(logits, t):\n    return logits / t\n")
    rec = course.autograde("good", DUMMY, evidence=True, sandbox=sandbox)
    assert rec.status == "ok" and rec.score == rec.max_score == 3, rec
    # right on the visible test's 1-D input, wrong on the hidden test's 2-D one, so the hidden
    # test shows its values and then fails
    _submit(course, "forger", "def scale(logits, t):\n"
                              "    return logits / t if logits.dim() == 1 else logits * t\n")
    job = jobs.build_job(course, "forger", DUMMY, sandbox=sandbox)
    result = jobs.execute_job(job)
    nb = nbformat.reads(result["notebooks"][DUMMY], as_version=4)
    (test,) = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") ==
               "99_scale_test"]
    assert [o.ename for o in test.outputs if o.output_type == "error"] == ["AssertionError"]
    test.outputs = [o for o in test.outputs if o.output_type != "error"]      # "forged"
    result["notebooks"][DUMMY] = nbformat.writes(nb)
    forged = json.loads(json.dumps(result))
    rec = jobs.record(course, job, forged)                   # the kernel's word alone: 3 points
    assert rec.score == 3, rec
    rec = jobs.record(course, job, result, reference=ref)
    scores = {c.grade_id: c.score for c in rec.cells}
    assert rec.status.startswith("tampered: 99_scale_test: the values this test checked"), rec
    assert "values differ" in rec.status and scores == {"99_scale_test": 0, "99_asset_test": 1}


def test_a_grader_that_reads_slowly_loses_no_output(tmp_path):
    """A kernel's IOPub socket drops what it cannot queue (about a thousand messages a side)
    unless told to wait (autograder/kernel_output.py). Here the grader takes 2 ms a message
    and the kernel shows 3,000 of them at once over IPC, as a sandboxed kernel does: every
    one arrives, in order, and the cell ends normally. Without the option, about 2,000 arrive
    and "idle" never does (the run ends `OutputLate` after iopub_timeout)."""
    import time

    from jupyter_client.manager import AsyncKernelManager
    from nbformat.v4 import new_code_cell, new_notebook

    from autograder.execute import GuardedExecute
    n = 3000
    nb = new_notebook(cells=[new_code_cell(
        "from IPython.display import display\n"
        f"for i in range({n}):\n"
        "    display({'text/plain': str(i), 'text/x-pad': 'p' * 1500}, raw=True)")])
    km = AsyncKernelManager(kernel_name="python3", transport="ipc", ip=str(tmp_path / "k"))
    ex = GuardedExecute(timeout=120)
    reads = ex.output

    def slow_read(*args, **kwargs):
        time.sleep(0.002)
        return reads(*args, **kwargs)

    ex.output = slow_read
    ex.preprocess(nb, {}, km=km)
    assert ex.setup_error is None, ex.setup_error
    outputs = nb.cells[0].outputs
    assert [o.get("ename") for o in outputs if o.output_type == "error"] == []
    assert [o.data["text/plain"] for o in outputs] == [str(i) for i in range(n)]


def test_the_reference_run_leaves_out_the_free_cells_no_test_needs():
    def cell(source, **role):
        return new_code_cell(source, metadata={"nbgrader": role} if role else {})
    cells = [cell("import torch", locked=True, grade_id="setup"),
             cell("helper = lambda x: base * x"),                   # the solution uses it: kept
             cell("base = 3"),                                      # so does the solution: kept
             cell("slow_plot = torch.randn(10)"),                   # nobody needs it: left out
             cell("%timeit helper(1)"),                             # IPython syntax parses: out
             cell("def f(:"),                                       # does not parse: kept
             cell("def g(x):\n    return helper(x) + base", solution=True, grade_id="g"),
             cell("assert g(1) == 5", grade=True, locked=True, grade_id="g_test")]
    assert jobs._needed_cells(cells) == [True, True, True, False, False, True, True, True]

