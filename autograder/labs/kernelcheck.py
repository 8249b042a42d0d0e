"""What the checks of the student's Triton kernels (labs 04 and 07) share.

The student's @triton.jit kernels run only in their own kernel (in the CPU interpreter they are
Python), launched by the lab's probes (autograder/probes.py) in autograder/labs/lab04_triton.py
and lab07_triton.py with `launch`. A kernel is judged by what it writes: it must be a @triton.jit
function, and what runs is that function (a kernel object rebuilt from it, so Python attached to
the student's object -- a pre-run hook, a replaced `run` -- never runs); nothing is asked of how
it is written.

Fences: a check's probe builds each case's inputs from the case's seed inside buffers whose
other elements hold NaN (`nan_padded`; the interpreter does not fault on an out-of-bounds load
or store), launches the kernel into a fenced output and returns the whole output buffer. The
tester builds the same inputs from the same seed, computes the expected values and reads the
buffer with `unfenced`: a store without a mask on the last, partial tile has written into the
fence; a load without a mask past the end of an input has read NaN into the output.

Speed on a GPU: a kernel can only be timed where it runs, so a probe times the student's kernel
with `seconds_per_call` (CUDA events, the L2 flushed: minillm.gpu_timer.Timer) and returns the
median; the tester times the course's kernel the same way and `speed_report` sets both beside a
device-to-device copy. dry_run=True runs the same path on the CPU (perf_counter; the figures
mean nothing).
"""
from __future__ import annotations

import math
import types
import warnings

import numpy as np
import torch

from kernels.interpret import INTERPRET
from minillm.gpu_timer import Timer, copy_bandwidth

try:
    import triton
    from triton.runtime.jit import KernelInterface
except ImportError:                                       # pragma: no cover (no triton)
    triton, KernelInterface = None, ()

__all__ = ["launch", "device", "placed", "nan_padded", "unfenced", "seconds_per_call",
           "speed_report", "require_speed"]


_FRESH: dict = {}       # id(the Python function) -> (it, the kernel rebuilt from it)


def launch(kernel, grid: tuple, *args, **meta) -> None:
    """`kernel[grid](*args, **meta)`, `kernel` a @triton.jit function rebuilt from its Python
    function (once per function: a GPU compiles it once). NumPy's floating-point warnings are
    off meanwhile: in the interpreter a kernel's arithmetic is NumPy's, which warns on stderr
    about inf - inf, 0 / 0 or an all-NaN max even in lanes a mask or tl.where then discards (a
    GPU says nothing); the NaN and inf that reach an output are judged."""
    fn = getattr(kernel, "fn", None)
    if not isinstance(kernel, KernelInterface) or not isinstance(fn, types.FunctionType):
        raise AssertionError(f"expected a @triton.jit kernel, got {type(kernel).__name__}")
    if _FRESH.get(id(fn), (None,))[0] is not fn:
        _FRESH[id(fn)] = (fn, triton.jit(fn))
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        _FRESH[id(fn)][1][grid](*args, **meta)


def device() -> str:
    """Where the kernels run: the GPU, unless Triton interprets them on the CPU."""
    return "cuda" if torch.cuda.is_available() and not INTERPRET else "cpu"


def placed(*tensors):
    """(the tensors on `device()`, the device to return a result to): a launcher given CPU
    tensors (as a test's arguments arrive) runs compiled kernels on the GPU all the same."""
    home = tensors[0].device
    dev = home if home.type == "cuda" else torch.device(device())
    return [t.to(dev) for t in tensors], home


# --- NaN fences around inputs and outputs ------------------------------------------------------
def nan_padded(t: torch.Tensor, pad: int = 64, fill=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(view, buffer): a contiguous copy of `t` in the middle of a 1-D buffer whose `pad`
    elements on either side hold `fill` (default: NaN for floats, the dtype's largest value for
    integers). A kernel that reads past the tensor's end or before its start reads the fill."""
    flat = torch.empty(t.numel() + 2 * pad, dtype=t.dtype, device=t.device)
    flat.fill_(fill if fill is not None else math.nan if t.dtype.is_floating_point else
               torch.iinfo(t.dtype).max)
    view = flat[pad:pad + t.numel()].view(t.shape)
    view.copy_(t)
    return view, flat


def unfenced(buffer: torch.Tensor, shape, name: str) -> torch.Tensor:
    """The output of `shape` in the middle of a buffer made by nan_padded (fill NaN), after
    checking that the kernel wrote nothing into the fence."""
    n = math.prod(shape)
    pad = (buffer.numel() - n) // 2
    if buffer.dim() != 1 or pad < 0 or not buffer.dtype.is_floating_point:
        raise AssertionError(f"{name}: the output buffer came back as {buffer.dtype} "
                             f"{tuple(buffer.shape)}")
    if not bool(torch.isnan(torch.cat([buffer[:pad], buffer[pad + n:]])).all()):
        raise AssertionError(f"{name}: the kernel wrote outside its output tensor (a store "
                             f"without a mask on the last, partial tile?)")
    return buffer[pad:pad + n].view(tuple(shape))


# --- speed on a GPU -----------------------------------------------------------------------------
def seconds_per_call(fn, *, dry_run: bool = False, warmup: int = 5, repeats: int = 30) -> float:
    """Median seconds of `fn()`: CUDA events, the L2 flushed before each call, after a warm-up
    (minillm.gpu_timer.Timer); dry_run: perf_counter on the CPU."""
    if not dry_run and not torch.cuda.is_available():
        raise RuntimeError("timing a kernel needs a CUDA GPU (dry_run=True runs the code path "
                           "on the CPU)")
    timer = Timer(torch.device("cpu" if dry_run else "cuda"), first_warmup_s=0.0 if dry_run
                  else 2.0)
    return timer.run({"fn": fn}, warmup=warmup, repeats=repeats)["fn"]


def speed_report(student_s: float, reference_s: float, bytes_moved: int, *,
                 dry_run: bool = False) -> dict:
    """{"student_s", "reference_s", "student_GBps", "copy_GBps", "fraction_of_copy",
    "ratio_to_reference", "dry_run"}: `bytes_moved` is what one call must read and write at
    least; the copy bandwidth is measured here (a tiny CPU copy in a dry run)."""
    copy = copy_bandwidth("cpu" if dry_run else "cuda", 2**20 if dry_run else 2**30,
                          repeats=3 if dry_run else 20)
    gbps = bytes_moved / student_s / 1e9
    return {"student_s": student_s, "reference_s": reference_s, "student_GBps": gbps,
            "copy_GBps": copy, "fraction_of_copy": gbps / copy,
            "ratio_to_reference": reference_s / student_s, "dry_run": dry_run}


def require_speed(report: dict, what: str, *, min_fraction_of_copy: float,
                  min_ratio_to_reference: float) -> dict:
    """AssertionError unless the report reaches both thresholds (a dry run passes)."""
    if not report["dry_run"] and not (report["fraction_of_copy"] >= min_fraction_of_copy and
                                      report["ratio_to_reference"] >= min_ratio_to_reference):
        raise AssertionError(
            f"{what}: {report['student_GBps']:.0f} GB/s = {report['fraction_of_copy']:.0%} of a "
            f"device copy ({report['copy_GBps']:.0f} GB/s; at least {min_fraction_of_copy:.0%} "
            f"needed) and {report['ratio_to_reference']:.2f}x the course's kernel's speed (at "
            f"least {min_ratio_to_reference:.2f}x needed)")
    return report
