"""Lab 04 speed check: an int4 layer read by torch's packed CPU kernel beats the fp32 layer.

The lab's claim: at batch 1 a linear layer whose weights do not fit the CPU's caches is bound by
the bytes it reads, so 4-bit codes (plus a bf16 scale and zero per 64 weights) beat 32-bit
floats -- *if* the codes are multiplied where they lie, by a kernel that widens them in
registers (torch's `_weight_int4pack_mm_for_cpu`), not first dequantized into a float copy of
the weight. The student's `Int4Linear(linear, group_size)` quantizes with their own
`group_quantize_int4`, converts to the kernel's layout and calls the kernel in `forward`. The
deterministic half is graded exactly in the notebook (`04_int4_layer_test`): the bytes the layer
stores and its output against the dequantized product. Time is graded as a ratio of medians,
interleaved, one torch thread, at batch 1:

    time(fp32 nn.Linear, SHAPE)  /  time(Int4Linear(that layer, 64))

Each call gets a fresh input row, and every output the layer returns, timed ones included,
must match the fp32 product of the dequantized weight within the kernel's bf16 bound (a fast
wrong layer, or one that remembers its answers, earns nothing). SHAPE is 4096 x 4096: 64 MB in fp32, past the
last-level cache of most laptops (a layer of the shipped model, 1.5 MB, stays in cache and is
not bound by memory). While the student's layer is built and runs, the library's quantized
layer and its kernel wrappers are disabled.

Why THRESHOLD sits where it does: the claim is "faster than the float layer", so it sits above 1
with room for noise: the library's layer (the same kernel) measures about twice as fast as fp32,
quiet or beside a busy core (1.6-2.2x on a CPU without AVX-512, where the kernel unpacks nibbles
more slowly; 21 timed runs per side keep one noisy run from deciding), and
dequantize-then-multiply (the usual mistake, and QuantLinear's CPU path before it used torch's
kernels) some 25 times slower (ranges: autograder/README.md).

    from autograder.labs import lab04
    lab04.check_int4_speedup(Int4Linear)        # AssertionError below the threshold
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from autograder.labs.speedcheck import SpeedCheck
from autograder.timing import time_ratio
from kernels.cpu_weight_only import BF16_ERROR
from kernels.formats import dequantize, group_quantize_int4, pack_int4, unpack_int4
from minillm.quant import QuantLinear

SHAPE = (4096, 4096)      # [out, in] of the timed layer
GROUP = 64
THRESHOLD = 1.1           # required time(fp32 layer) / time(student's int4 layer)
WARMUP, REPEATS = 3, 21
LIBRARY = ("minillm.quant.QuantLinear.from_linear", "minillm.quant.QuantLinear.forward",
           "minillm.quant.QuantLinear.w4_cpu_layout", "kernels.cpu_weight_only.pack_w4_cpu",
           "kernels.cpu_weight_only.w4_cpu_matmul", "kernels.cpu_weight_only.w8_cpu_matmul")

# captured at import (the grader imports autograder before student code runs)
_Generator, _randn, _no_grad, _is_tensor = torch.Generator, torch.randn, torch.no_grad, \
    torch.is_tensor
_Linear = nn.Linear


def make_layer(shape=SHAPE, rows: int = 1, seed: int = 0):
    """A random fp32 nn.Linear [out, in] (no bias) and `rows` inputs of one row each."""
    g = _Generator().manual_seed(seed)
    lin = _Linear(shape[1], shape[0], bias=False)
    with _no_grad():
        lin.weight.copy_(_randn(*shape, generator=g) * shape[1] ** -0.5)
    return lin, _randn(rows, 1, shape[1], generator=g)


def int4_speedup(layer_cls, guard, *, shape=SHAPE, group_size: int = GROUP,
                 warmup: int = WARMUP, repeats: int = REPEATS, seed: int = 0):
    """Build `layer_cls(linear, group_size)` (guarded), then time it against the fp32 layer,
    interleaved, on a fresh input row per call: .ratio = median(fp32) / median(int4). Every
    output the layer returned, timed calls included, must match the dequantized product."""
    calls = warmup + repeats
    lin, xs = make_layer(shape, calls + 1, seed)
    with _no_grad():
        codes, scales, zeros = group_quantize_int4(lin.weight, group_size)
        w = dequantize(codes, scales, zeros, group_size)
        with guard:
            layer = layer_cls(lin, group_size)
        outputs, inputs = [], iter(xs)

        def candidate():
            x = next(inputs)
            with guard:
                outputs.append(layer(x))

        candidate()                                      # checked before any timing
        _check(outputs[:1], xs[:1], w, shape, group_size)
        done = iter(xs[1:])
        r = time_ratio(lambda: lin(next(done)), candidate, warmup=warmup, repeats=repeats)
        _check(outputs, xs, w, shape, group_size)
        return r


def _check(outputs, xs, w, shape, group_size) -> None:
    for got, x in zip(outputs, xs):
        want = x @ w.T
        if not _is_tensor(got) or tuple(got.shape) != tuple(want.shape):
            raise AssertionError(f"your layer returned {type(got).__name__} "
                                 f"{tuple(getattr(got, 'shape', ()))}, expected a tensor "
                                 f"{tuple(want.shape)}")
        err = (got.float() - want).abs()
        bound = BF16_ERROR * (x.abs() @ w.abs().T) + 1e-6
        if not bool((err <= bound).all()):
            raise AssertionError(
                f"your {shape[0]}x{shape[1]} int4 layer's output is off: error up to "
                f"{float(err.max()):.3g} where bf16 activations allow {float(bound.max()):.3g} "
                f"(compared with x @ W.T, W dequantized from the codes of "
                f"group_quantize_int4 with groups of {group_size})")


def library_int4(linear, group_size):
    """The reference: minillm's QuantLinear (torch's int4 CPU kernel) in the notebook's
    signature."""
    return QuantLinear.from_linear(linear, 4, group_size)


class DequantizeInt4(nn.Module):
    """The counter-example: the same codes, dequantized into a float weight on every call."""

    def __init__(self, linear, group_size):
        super().__init__()
        codes, self.scales, self.zeros = group_quantize_int4(linear.weight.detach(), group_size)
        self.qweight, self.group_size = pack_int4(codes), group_size

    def forward(self, x):
        w = dequantize(unpack_int4(self.qweight), self.scales, self.zeros, self.group_size)
        return F.linear(x, w)


SPEED_CHECK = SpeedCheck(
    grade_id="04_speed_test", threshold=THRESHOLD, measure=int4_speedup,
    reference=library_int4, counter_example=DequantizeInt4, disabled=LIBRARY,
    workload=dict(shape=SHAPE, group_size=GROUP),
    solution=("Int4Linear", "04_zeropoint", "04_int4", "04_int4_layer"),
    hint="at batch 1 on a {shape[0]}x{shape[1]} layer your int4 layer was only {ratio:.2f}x "
         "as fast as the fp32 layer (median {candidate_ms:.3g} ms vs {baseline_ms:.3g} ms over "
         "{runs} interleaved runs); reading 4-bit codes with torch's int4 kernel reaches at "
         "least {at_least:g}x. Does your forward dequantize the weight (or convert the layout) "
         "on every call instead of handing the packed codes to the kernel?")
check_int4_speedup = SPEED_CHECK.check
