"""Triton's CPU interpreter across versions (kernels/interpret.py).

Triton 3.6 (the GPU image's) reads a kernel's scalar argument with `int(one_element_array)`,
which NumPy 2.4 refuses: `for k in range(0, K, BLOCK)` failed in every kernel. Here that reading
is put back into the installed interpreter, the failure is seen, and the mend is seen to cure it.
The real triton 3.6 run: `benchmarks/triton_versions.sh 3.6.0` (RESULTS.md, "Triton's
interpreter across versions").
"""
from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

import kernels  # noqa: F401  (TRITON_INTERPRET without a GPU)
from kernels import interpret

pytestmark = pytest.mark.skipif(not interpret.INTERPRET, reason="the interpreter is not in use")


@triton.jit
def _row_sum(x_ptr, out_ptr, K, BLOCK: tl.constexpr):
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for k0 in range(0, K, BLOCK):
        offs = k0 + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + offs, mask=offs < K, other=0.0)
    tl.store(out_ptr, tl.sum(acc))


def _run() -> float:
    x = torch.arange(10, dtype=torch.float32)
    out = torch.zeros(1)
    _row_sum[(1,)](x, out, 10, BLOCK=4)
    return out.item()


@pytest.fixture
def triton_36(monkeypatch):
    """The installed interpreter reading scalars as triton 3.6 does, and reporting 3.6.0."""
    from triton.runtime import interpreter
    current = interpreter._patch_lang_tensor

    def old_reading(tensor, scope):
        current(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data))
    monkeypatch.setattr(interpreter, "_patch_lang_tensor", old_reading)
    monkeypatch.setattr(triton, "__version__", "3.6.0")
    monkeypatch.setattr(interpret, "numpy_reads_one_element_arrays", lambda: False)
    return interpreter


def test_the_installed_interpreter_runs_a_loop_over_a_scalar_bound():
    assert _run() == 45.0


@pytest.mark.skipif(interpret.numpy_reads_one_element_arrays(),
                    reason="NumPy before 2.4 reads a one-element array: nothing to cure")
def test_triton_36s_reading_fails_and_the_mend_cures_it(triton_36):
    with pytest.raises(Exception, match="0-dimensional"):
        _run()
    assert interpret.mend_scalar_index() is True
    assert _run() == 45.0
    assert interpret.mend_scalar_index() is True          # mending twice changes nothing
    assert _run() == 45.0


def test_nothing_is_mended_where_nothing_is_broken(monkeypatch):
    from triton.runtime import interpreter
    before = interpreter._patch_lang_tensor
    monkeypatch.setattr(interpret, "numpy_reads_one_element_arrays", lambda: True)
    monkeypatch.setattr(triton, "__version__", "3.6.0")
    assert interpret.mend_scalar_index() is False           # NumPy < 2.4 reads the array
    monkeypatch.setattr(interpret, "numpy_reads_one_element_arrays", lambda: False)
    monkeypatch.setattr(triton, "__version__", "3.7.1")
    assert interpret.mend_scalar_index() is False           # 3.7 squeezes it itself
    assert interpreter._patch_lang_tensor is before


def test_an_interpreter_the_mend_does_not_know_is_refused_by_name(triton_36, monkeypatch):
    monkeypatch.delattr(triton_36, "_patch_lang_tensor")
    with pytest.raises(RuntimeError, match=r"Triton 3\.6\.0.*NumPy .*triton>=3\.7"):
        interpret.mend_scalar_index()
