"""What the GPU benchmark scripts (dequant_matmul.py, paged_attention.py, gemv_sweep.py) share:
interleaved timing with the L2 cache flushed before each call, the bytes a call must move, the
device-copy bandwidth they are compared with, and the correctness check that runs before
anything is timed."""
from __future__ import annotations

import torch

from minillm.bench.gpu_timer import Timer, copy_bandwidth  # noqa: F401 (re-exported)


def nbytes(*tensors) -> int:
    """Bytes held by the tensors (None is skipped): what a call must read or write once."""
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def check(got: torch.Tensor, want: torch.Tensor, what: str, tol: float = 2e-2) -> float:
    """max |got - want| / max |want|; exits (SystemExit) above `tol`: a wrong kernel is never
    timed."""
    err = float((got.float() - want.float()).abs().max()
                / want.float().abs().max().clamp(min=1e-6))
    if not err < tol:
        raise SystemExit(f"{what}: result differs from the torch reference (relative error "
                         f"{err:.3g}); not timing a wrong kernel")
    return err
