"""The test-cell helpers of `autograder`: messages, guards, counters and interleaved timing."""
import statistics
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import autograder
import minillm.bench.timing
import minillm.sampling
from autograder import (
    RatioResult,
    WorkCounter,
    assert_close,
    check_ratio,
    time_ratio,
)
from minillm.config import ModelConfig
from minillm.model import Transformer


def error_of(fn) -> str:
    with pytest.raises(AssertionError) as info:
        fn()
    return str(info.value)


# --- assert_close -----------------------------------------------------------------------------
def test_assert_close_passes_within_tolerance_on_every_input_kind():
    assert_close(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0 + 1e-7]))
    assert_close(np.array([[1.0, 2.0]]), [[1.0, 2.0]])
    assert_close(3.0, 3.0 + 1e-9)
    assert_close([1, 2, 3], torch.tensor([1, 2, 3]))
    assert_close(torch.tensor([float("-inf"), 0.5, float("nan")]),
                 torch.tensor([float("-inf"), 0.5, float("nan")]))
    assert_close(torch.tensor([1.0, 2.0]), torch.tensor([1.1, 2.2]), atol=0.25)


def test_assert_close_says_where_and_by_how_much():
    actual = torch.zeros(3, 4)
    expected = torch.zeros(3, 4)
    actual[1, 2] = 0.5
    actual[2, 3] = 1e-3
    msg = error_of(lambda: assert_close(actual, expected, name="probs"))
    assert msg.startswith("probs:")
    assert "2 of 12 elements differ" in msg
    assert "max abs diff 0.5 at index (1, 2): actual 0.5 vs expected 0" in msg
    assert "max rel diff inf" in msg


def test_assert_close_reports_the_largest_relative_difference_separately():
    msg = error_of(lambda: assert_close(torch.tensor([1.0, 100.0]), torch.tensor([1.1, 101.0])))
    assert "max abs diff 1 at index 1: actual 100 vs expected 101" in msg
    assert "max rel diff 0.0909091 at index 0: actual 1 vs expected 1.1" in msg


def test_assert_close_reports_shape_dtype_none_and_infinities():
    assert "shape mismatch: actual (2, 3) vs expected (3, 2)" in \
        error_of(lambda: assert_close(torch.zeros(2, 3), torch.zeros(3, 2)))
    assert "dtype mismatch: actual torch.float32 vs expected torch.float64" in \
        error_of(lambda: assert_close(torch.zeros(2), torch.zeros(2, dtype=torch.float64)))
    assert "dtype mismatch" in error_of(
        lambda: assert_close(np.zeros(2, np.float32), np.zeros(2, np.float64)))
    assert "got None" in error_of(lambda: assert_close(None, torch.zeros(2)))
    msg = error_of(lambda: assert_close(torch.tensor([float("-inf"), 1.0]), torch.tensor([0.0, 1.0])))
    assert "1 of 2 elements differ" in msg and "actual -inf vs expected 0" in msg
    assert "actual nan vs expected 2" in error_of(lambda: assert_close(float("nan"), 2.0))


@pytest.fixture(scope="module")
def tiny_model():
    torch.manual_seed(0)
    return Transformer(ModelConfig(vocab_size=50, dim=16, n_layers=1, n_heads=2, hidden_dim=32,
                                   max_seq_len=32)).eval()


def test_work_counter_counts_calls_and_tokens(tiny_model):
    with torch.no_grad(), WorkCounter(tiny_model) as work:
        tiny_model(torch.zeros(2, 5, dtype=torch.long))              # 10 tokens
        tiny_model(torch.zeros(1, 3, dtype=torch.long), last_only=True)
        tiny_model(ids=torch.zeros(1, 4, dtype=torch.long))           # keyword argument
    assert (work.calls, work.tokens) == (3, 17)
    with torch.no_grad():
        tiny_model(torch.zeros(1, 3, dtype=torch.long))              # after exit: not counted
    assert (work.calls, work.tokens) == (3, 17)
    assert not tiny_model._forward_pre_hooks


def test_work_counter_counts_a_naive_generation_loop(tiny_model):
    from minillm.generate import generate_naive
    from minillm.sampling import SamplingParams
    P, n = 4, 5
    with WorkCounter(tiny_model) as work:
        generate_naive(tiny_model, list(range(1, P + 1)),
                       SamplingParams(temperature=0, max_new_tokens=n))
    assert work.calls == n
    assert work.tokens == sum(P + t for t in range(n))


def test_work_counter_removes_its_hook_on_error(tiny_model):
    with pytest.raises(RuntimeError):
        with WorkCounter(tiny_model):
            raise RuntimeError("boom")
    assert not tiny_model._forward_pre_hooks


# --- timing -----------------------------------------------------------------------------------
def test_time_ratio_interleaves_after_warmup():
    calls = []
    r = time_ratio(lambda: calls.append("b"), lambda: calls.append("c"), warmup=2, repeats=5)
    assert calls == ["b", "c"] * 7
    assert isinstance(r, RatioResult)
    assert len(r.baseline_times) == len(r.candidate_times) == 5


def test_time_ratio_calls_sync_after_each_run():
    calls = []
    time_ratio(lambda: calls.append("b"), lambda: calls.append("c"), warmup=1, repeats=2,
               sync=lambda: calls.append("sync"))
    assert calls == ["b", "sync", "c", "sync"] * 3


def test_time_interleaved_keeps_dict_order():
    calls = []
    times = minillm.bench.timing.time_interleaved({k: (lambda k=k: calls.append(k)) for k in "xyz"},
                                            warmup=1, repeats=3)
    assert calls == list("xyz") * 4
    assert set(times) == set("xyz") and all(len(v) == 3 for v in times.values())


def work(n: int) -> int:
    """A fixed amount of CPU work (twice n: twice the work), in Python."""
    return sum(i * i for i in range(n))


_X = torch.randn(384, 384)


def matmuls(n: int) -> None:
    """n float32 384 x 384 matrix products: the kind of work the labs' speed checks time."""
    for _ in range(n):
        _X @ _X


def test_two_times_the_work_gives_ratio_two(one_thread):
    r = time_ratio(lambda: matmuls(20), lambda: matmuls(10), warmup=1, repeats=5)
    assert 1.6 < r.ratio < 2.5, r
    assert r.ratio == pytest.approx(r.baseline_s / r.candidate_s)
    assert r.baseline_s > r.candidate_s > 0


def test_cpu_work_is_timed_in_cpu_time_and_gpu_work_in_wall_time():
    # without sync: process CPU time, so a sleep costs (almost) nothing ...
    r = time_ratio(lambda: time.sleep(0.05), lambda: work(100_000), warmup=0, repeats=3)
    assert r.baseline_s < 0.01, r
    # ... with sync (GPU work): wall-clock time, in which the sleep is 50 ms
    r = time_ratio(lambda: time.sleep(0.04), lambda: time.sleep(0.02), warmup=0, repeats=3,
                   sync=lambda: None)
    assert 1.5 < r.ratio < 2.5 and 0.039 < r.baseline_s < 0.1, r


def test_identical_work_has_ratio_one_under_a_competing_load(one_thread):
    """CI once measured 1.5x between two identical functions with wall-clock medians while a busy
    loop and another test worker shared the two cores; CPU time does not see the neighbours.
    (Here, with two busy loops on 2 cores, 10 runs: CPU time 0.96x - 1.15x, wall clock 0.62x -
    1.73x.) One CPU-time median of 7 runs still came out at 1.46 once in CI, beside the tamper
    batch on the other worker (baseline 34 ms, candidate 24 ms), so the verdict is the median of
    three such measurements."""
    spins = [subprocess.Popen([sys.executable, "-c", "while True:\n    pass"]) for _ in range(2)]
    try:
        time.sleep(0.2)
        rounds = [time_ratio(lambda: matmuls(10), lambda: matmuls(10), warmup=1, repeats=7)
                  for _ in range(3)]
    finally:
        for spin in spins:
            spin.kill()
            spin.wait()
    ratio = statistics.median(r.ratio for r in rounds)
    assert 0.7 < ratio < 1.4, rounds


def test_check_ratio_passes_and_fails_with_the_figures():
    r = check_ratio(lambda: work(200_000), lambda: None, at_least=2, what="noop vs work",
                    warmup=0, repeats=3)
    assert r.ratio > 2
    msg = error_of(lambda: check_ratio(lambda: None, lambda: work(200_000), at_least=2,
                                       what="work vs noop", warmup=0, repeats=3))
    assert msg.startswith("work vs noop: expected the candidate to be at least 2x faster")
    assert "measured 0.0" in msg and "ms" in msg and "3 interleaved runs" in msg


def test_public_api():
    for name in ("assert_close", "WorkCounter", "time_ratio", "check_ratio", "RatioResult"):
        assert name in autograder.__all__ and hasattr(autograder, name)
    assert minillm.bench.timing.median([3, 1, 2]) == 2
    assert minillm.bench.timing.ratio([2, 2, 2], [1, 1, 1]) == 2
