"""Every attack of tests/test_tamper.py again, against the dummy lab with its tests in the tester
(autograder/tester.py): the same batch, the same honest submission alone, the same checks.

What differs, and why:

* `memory_read_sources` is no longer a known success: the kernel never holds the tests' text,
  so reading its own memory finds none (and the attack's feedback shows none);
* `evidence_off`, `evidence_flood` and `evidence_past_a_float` bring a right `scale` and tricks
  against the values a kernel shows the grader; the tester's verdicts do not rest on such
  values, so they earn what their `scale` is worth (no more) and need not end `tampered`;
* the judge's own check of a number past a float (tests/test_tamper.py) has no counterpart.

`TAMPER_ONLY=name,name` works here too.
"""
from __future__ import annotations

import pytest
from test_tamper import (  # noqa: F401 - pytest collects these here, with this module's `run`
    SELECTED,
    check_attack,
    grade_attacks,
    test_an_image_flood_is_cut_like_printed_text,
    test_an_unreadable_message_zeroes_the_cell_not_the_job,
    test_batch_has_one_record_per_submission,
    test_each_job_of_the_batch_runs_on_cpus_of_its_own,
    test_gradebook_after_the_batch_holds_what_was_recorded,
    test_honest_alone_and_in_batch_get_the_same_grade_and_feedback,
    test_no_hidden_test_and_no_grader_secret_in_any_feedback_or_csv,
    test_no_process_survives_the_batch,
    test_nothing_written_outside_the_sandbox_and_no_connection,
    test_the_graders_compile_cache_is_what_it_warmed,
)

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("tamper_tester")]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    yield from grade_attacks(tmp_path_factory, tester=True)


@pytest.mark.parametrize("name", [a.name for a in SELECTED])
def test_attack(run, name):
    check_attack(run, name)


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
