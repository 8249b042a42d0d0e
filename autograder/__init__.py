"""minillm autograder: helpers for nbgrader test cells, and the release / grade / selfgrade CLI.

Test-cell helpers (import them in graded cells):

    from autograder import assert_close, reference_disabled, WorkCounter, time_ratio, check_ratio

    with reference_disabled("minillm.sampling.top_p_filter"):
        assert_close(top_p_filter(logits, 0.9), expected, name="top_p_filter(logits, 0.9)")
    with WorkCounter(model) as work:
        generate(model, prompt, n)
    assert work.tokens == len(prompt) + n - 1
    check_ratio(lambda: naive(x), lambda: cached(x), at_least=2, what="cached vs naive")

Command line (see autograder/README.md): python -m autograder release | grade | selfgrade.

Importing this package binds the clock, the median and the torch functions the checks use; the
grader imports it in the kernel before any notebook cell runs, so student code cannot patch them.
"""
from .checks import WorkCounter, assert_close, reference_disabled
from .timing import RatioResult, check_ratio, cuda_sync, time_ratio

__all__ = ["assert_close", "reference_disabled", "WorkCounter", "time_ratio", "check_ratio",
           "RatioResult", "cuda_sync"]
