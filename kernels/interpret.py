"""Compile or interpret: the one place that decides how the Triton kernels run.

Without a CUDA GPU the kernels run in Triton's CPU interpreter (slow, but the same code path the
tests compare). Triton reads TRITON_INTERPRET when a function is decorated with @triton.jit, so
the kernel modules import INTERPRET from here before they define their kernels (this works even
if triton itself was imported earlier).
A value already in the environment wins.
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
