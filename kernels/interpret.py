"""Compile or interpret: the one place that decides how the Triton kernels run.

Without a CUDA GPU the kernels run in Triton's CPU interpreter (slow, but the same code path the
tests compare). Triton reads TRITON_INTERPRET when a function is decorated with @triton.jit, so
the kernel modules import INTERPRET from here before they define their kernels (this works even
if triton itself was imported earlier).
A value already in the environment wins.

One interpreter bug is mended here. Before Triton 3.7, the interpreter holds a scalar argument
(a length `K`) as a one-element array and reads it as a Python int with `int(array)`, which
NumPy 2.4 refuses: every `range(0, K, BLOCK)` in a kernel failed with "only 0-dimensional arrays
can be converted to Python scalars" (with triton 3.6, the GPU image's, 18 of lab 04's 29 kernel
checks failed, the course's own kernels among them). Triton 3.7 squeezes the array first;
`mend_scalar_index` gives an older interpreter the same reading, and refuses, naming the
versions, when it cannot.
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


def numpy_reads_one_element_arrays() -> bool:
    """Whether `int(np.array([3]))` still works (NumPy before 2.4)."""
    import numpy as np
    try:
        int(np.array([3]))
    except TypeError:
        return False
    return True


def mend_scalar_index() -> bool:
    """Make Triton's interpreter read a scalar argument held as a one-element array with NumPy
    2.4 or later; True if it is mended. Raises RuntimeError, naming both versions, if this
    Triton's interpreter is not laid out as the mend expects."""
    if numpy_reads_one_element_arrays():
        return False
    try:
        import triton
        from triton.runtime import interpreter
    except ImportError:          # no Triton (an optional dependency): nothing to mend
        return False
    patch = getattr(interpreter, "_patch_lang_tensor", None)
    if getattr(patch, "mended", False):
        return True
    if tuple(int(p) for p in triton.__version__.split(".")[:2]) >= (3, 7):
        return False             # 3.7 reads the array squeezed
    if patch is None:
        import numpy as np
        raise RuntimeError(
            f"Triton {triton.__version__}'s CPU interpreter cannot read a kernel's scalar "
            f"arguments with NumPy {np.__version__}: install triton>=3.7 (make install pins "
            "3.7.1) or numpy<2.4")

    def mended(tensor, scope):
        patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))
    mended.mended = True
    interpreter._patch_lang_tensor = mended
    return True


if INTERPRET:
    mend_scalar_index()
