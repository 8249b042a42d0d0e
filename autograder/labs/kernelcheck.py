"""What the checks of the student's Triton kernels (labs 04 and 07) share: `launch`, NaN fences
(the interpreter does not fault out of bounds) and GPU timing (dry_run: on the CPU)."""
from __future__ import annotations

import contextlib
import math
import types
import warnings

import numpy as np
import torch

from kernels.interpret import INTERPRET
from minillm.bench.gpu_timer import Timer, copy_bandwidth

try:
    import triton
    from triton.runtime.jit import KernelInterface
except ImportError:                                       # pragma: no cover (no triton)
    triton, KernelInterface = None, ()

__all__ = ["launch", "recording", "device", "placed", "nan_padded", "unfenced", "seconds_per_call",
           "speed_report", "require_speed"]

_FRESH: dict = {}       # id(the Python function) -> (it, the kernel rebuilt from it)
_RECORD = None          # during `recording`: the Record that every launch reports to


def launch(kernel, grid: tuple, *args, **meta) -> None:
    """`kernel[grid](...)`, rebuilt from its Python function (nothing attached to it runs);
    NumPy's warnings off: in the interpreter they fire on lanes a mask discards."""
    fn = getattr(kernel, "fn", None)
    if not isinstance(kernel, KernelInterface) or not isinstance(fn, types.FunctionType):
        raise AssertionError(f"expected a @triton.jit kernel, got {type(kernel).__name__}")
    if _FRESH.get(id(fn), (None,))[0] is not fn:
        _FRESH[id(fn)] = (fn, triton.jit(fn))
    record = _RECORD
    if record is not None:
        record.before(args)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        _FRESH[id(fn)][1][grid](*args, **meta)
    if record is not None:
        record.after()


def _bits(t: torch.Tensor) -> torch.Tensor:
    """`t`'s elements as integers of their size: compared bit for bit, NaN included."""
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


class Record:
    """What the launches made of a watched output buffer during `recording` (it starts as NaN):
    how many launched, which elements a launch changed (`stored`; in the summary, `unstored`
    counts the outputs that hold a value no launch stored), and whether anything changed the
    buffer after the last launch (`late`); `foreign`: the float tensors a launch was given that are none of `given` and
    hold at least `big` elements (a weight dequantized outside the kernel)."""

    def __init__(self, buffer: torch.Tensor, given: list, big: int):
        self.buffer, self.big, self.launches, self.foreign = buffer, big, 0, []
        self.given = {t.untyped_storage().data_ptr() for t in given}
        self.stored = torch.zeros(buffer.shape, dtype=torch.bool, device=buffer.device)
        self.last = buffer.clone()          # as the last launch left it (at first: as given)
        self._start = None

    def before(self, args) -> None:
        for a in args:
            if isinstance(a, torch.Tensor) and a.is_floating_point() and a.numel() >= self.big \
                    and a.untyped_storage().data_ptr() not in self.given:
                self.foreign.append(f"{a.dtype} {tuple(a.shape)}".replace("torch.", ""))
        self._start = self.buffer.clone()

    def after(self) -> None:
        self.launches += 1
        self.stored |= _bits(self.buffer) != _bits(self._start)
        self.last = self.buffer.clone()

    def summary(self, view: torch.Tensor) -> dict:
        """Plain figures about the output `view` (a part of the buffer)."""
        pad = view.data_ptr() - self.buffer.data_ptr()
        pad //= view.element_size()
        part = slice(pad, pad + view.numel())
        by_torch = ~self.stored[part] & ~torch.isnan(self.buffer[part])   # set, not by a launch
        return {"launches": self.launches, "foreign": list(self.foreign),
                "unstored": int(by_torch.sum()),
                "late": int((_bits(self.buffer) != _bits(self.last)).sum())}


@contextlib.contextmanager
def recording(buffer: torch.Tensor, given: list, big: int):
    """Every `launch` inside the block reports to the Record yielded (one at a time)."""
    global _RECORD
    if _RECORD is not None:
        raise RuntimeError("recording inside a recording")
    _RECORD = Record(buffer, given, big)
    try:
        yield _RECORD
    finally:
        _RECORD = None


def device() -> str:
    """Where the kernels run: the GPU, unless Triton interprets them on the CPU."""
    return "cuda" if torch.cuda.is_available() and not INTERPRET else "cpu"


def placed(*tensors):
    """(the tensors on `device()`, the device to return a result to)."""
    home = tensors[0].device
    dev = home if home.type == "cuda" else torch.device(device())
    return [t.to(dev) for t in tensors], home


def nan_padded(t: torch.Tensor, pad: int = 64, fill=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(view, buffer): `t` amid `pad` elements of fill (NaN; integers: their largest value)."""
    flat = torch.empty(t.numel() + 2 * pad, dtype=t.dtype, device=t.device)
    flat.fill_(fill if fill is not None else math.nan if t.dtype.is_floating_point else
               torch.iinfo(t.dtype).max)
    view = flat[pad:pad + t.numel()].view(t.shape)
    view.copy_(t)
    return view, flat


def unfenced(buffer: torch.Tensor, shape, name: str) -> torch.Tensor:
    """The output of `shape` in a nan_padded buffer, after checking the fence is untouched."""
    n = math.prod(shape)
    pad = (buffer.numel() - n) // 2
    if buffer.dim() != 1 or pad < 0 or not buffer.dtype.is_floating_point:
        raise AssertionError(f"{name}: the output buffer came back as {buffer.dtype} "
                             f"{tuple(buffer.shape)}")
    if not bool(torch.isnan(torch.cat([buffer[:pad], buffer[pad + n:]])).all()):
        raise AssertionError(f"{name}: the kernel wrote outside its output tensor (a store "
                             f"without a mask on the last, partial tile?)")
    return buffer[pad:pad + n].view(tuple(shape))


def seconds_per_call(fn, *, dry_run: bool = False, warmup: int = 5, repeats: int = 30) -> float:
    """Median seconds of `fn()`: CUDA events, the L2 flushed (dry_run: on the CPU)."""
    if not dry_run and not torch.cuda.is_available():
        raise RuntimeError("timing a kernel needs a CUDA GPU (dry_run=True runs the code path "
                           "on the CPU)")
    timer = Timer(torch.device("cpu" if dry_run else "cuda"), first_warmup_s=0.0 if dry_run
                  else 2.0)
    return timer.run({"fn": fn}, warmup=warmup, repeats=repeats)["fn"]


def speed_report(student_s: float, reference_s: float, bytes_moved: int, *,
                 dry_run: bool = False) -> dict:
    """The times beside a device copy's bandwidth; `bytes_moved`: what one call must move."""
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
