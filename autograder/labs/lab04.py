"""Lab 04's probes and speed check (its Triton kernels: autograder/labs/lab04_triton.py).

Probes (autograder/probes.py) run the student's code where it lives, on what it needs built
there, and return plain values:

    from autograder.labs import lab04
    lab04.model_call(quantized_model_bytes, 4, 64, zero_point=True)   # on the shipped model
    lab04.model_call(quantized_model_bytes, 8, config=dataclasses.asdict(cfg))   # a random one
    lab04.awq(awq_search, weight, x, 64, 10)      # awq_search(nn.Linear with that weight, x, ...)
    lab04.int4_layer(Int4Linear, weight, 64, x)   # -> {"bytes": what it holds, "y": layer(x)}

The speed check: an int4 layer read by torch's packed CPU kernel beats the fp32 layer. At batch
1 a linear layer whose weights do not fit the CPU's caches is bound by the bytes it reads, so
4-bit codes (plus a bf16 scale and zero per 64 weights) beat 32-bit floats -- *if* the codes are
multiplied where they lie, by a kernel that widens them in registers
(`_weight_int4pack_mm_for_cpu`), not first dequantized into a float copy of the weight. The
deterministic half is graded exactly in `04_int4_layer_test` (the bytes the layer holds, its
output). Time is graded as a ratio of medians, interleaved, one torch thread, batch 1:

    time(fp32 nn.Linear of SHAPE, in the tester)
        / time(the student's Int4Linear(that layer, GROUP), in their kernel: `timed_int4`)

Each call gets a fresh input row, and every output the layer returns, timed ones included
(`int4_outputs`), must match the fp32 product of the dequantized weight within the kernel's
bf16 bound: a fast wrong layer, or one that remembers its answers, earns nothing. SHAPE is
4096 x 4096: 64 MB in fp32, past the last-level cache of most laptops (a layer of the shipped
model, 1.5 MB, stays in cache and is not bound by memory). Why 1.1: see THRESHOLD.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from autograder.labs.speedcheck import SpeedCheck, one_torch_thread
from autograder.probes import fresh_model, probe
from autograder.timing import time_ratio
from kernels.cpu_weight_only import BF16_ERROR
from kernels.formats import dequantize, group_quantize_int4, pack_int4, unpack_int4

SHAPE = (4096, 4096)      # [out, in] of the timed layer
GROUP = 64
# required time(fp32 layer) / time(student's int4 layer). The claim is "faster than the float
# layer", so it sits above 1 with room for noise. Graded in the tester (the fp32 layer there, the
# student's layer in the kernel, one probe call per run) on a machine busy with other work, 6
# runs of each, 2 beside a busy loop: the library's layer (the same kernel) 3.15-3.77, the
# notebook's solution 2.44-3.37, dequantize-then-multiply (the usual mistake) 0.03 (`python -m
# autograder.labs --tester --solution lab04`, 2026-11-29). A CPU without AVX-512 unpacks the
# nibbles more slowly: the library's layer measured 1.6-2.2 on one.
THRESHOLD = 1.1
WARMUP, REPEATS = 3, 21


def held_bytes(layer: nn.Module) -> int:
    """Bytes of every tensor a layer holds: plain attributes, buffers and parameters."""
    held = {id(t): t for t in vars(layer).values() if torch.is_tensor(t)}
    held.update((id(t), t) for t in list(layer.buffers()) + list(layer.parameters()))
    return sum(t.nbytes for t in held.values())


def linear_with(weight: torch.Tensor) -> nn.Linear:
    lin = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    with torch.no_grad():
        lin.weight.copy_(weight)
    return lin


@probe
def model_call(fn, *args, config: dict | None = None, **kwargs):
    """`fn(model, *args, **kwargs)` on a fresh fp32 copy of the shipped model, or with config
    (a ModelConfig's fields) on a new random Transformer(ModelConfig(**config))."""
    if config is None:
        return fn(fresh_model().float(), *args, **kwargs)
    from minillm.config import ModelConfig
    from minillm.model import Transformer
    return fn(Transformer(ModelConfig(**config)), *args, **kwargs)


@probe
def awq(awq_search, weight, x, *args, **kwargs):
    """`awq_search(linear, x, *args, **kwargs)`, linear an nn.Linear (no bias) with `weight`."""
    return awq_search(linear_with(weight), x, *args, **kwargs)


@probe
def int4_layer(layer_cls, weight, group_size: int, x) -> dict:
    """`layer_cls(linear, group_size)`, linear an nn.Linear (no bias) with `weight`, and
    {"bytes": held_bytes(the layer), "y": layer(x) without gradients}."""
    layer = layer_cls(linear_with(weight), group_size)
    with torch.no_grad():
        return {"bytes": held_bytes(layer), "y": layer(x)}


def make_layer(shape=SHAPE, rows: int = 1, seed: int = 0):
    """A random fp32 nn.Linear [out, in] (no bias) and `rows` inputs of one row each."""
    g = torch.Generator().manual_seed(seed)
    lin = linear_with(torch.randn(*shape, generator=g) * shape[1] ** -0.5)
    return lin, torch.randn(rows, 1, shape[1], generator=g)


_KEPT: dict = {}       # (the layer class, shape, group, seed) -> [layer, inputs, outputs]


@probe
def timed_int4(layer_cls, shape, group_size: int, seed: int, i: int, rows: int) -> None:
    """One timed call: `layer_cls(make_layer(shape, rows, seed)'s layer, group_size)` on input
    row i, its output kept for int4_outputs. i = 0 builds the layer afresh (untimed)."""
    key = (id(layer_cls), tuple(shape), group_size, seed)
    if i == 0:
        lin, xs = make_layer(shape, rows, seed)
        with torch.no_grad():
            _KEPT[key] = [layer_cls(lin, group_size), xs, []]
    layer, xs, outputs = _KEPT[key]
    with torch.no_grad(), one_torch_thread():
        outputs.append(layer(xs[i]))


@probe
def int4_outputs(layer_cls, shape, group_size: int, seed: int) -> list:
    """What the timed calls returned so far, in order."""
    return _KEPT[(id(layer_cls), tuple(shape), group_size, seed)][2]


def int4_speedup(layer_cls, *, shape=SHAPE, group_size: int = GROUP, warmup: int = WARMUP,
                 repeats: int = REPEATS, seed: int = 0):
    """Build `layer_cls(linear, group_size)` in its kernel and check its first output, then time
    it against the fp32 layer here, interleaved, on a fresh input row per call: .ratio =
    median(fp32) / median(int4). Every output it returned, timed calls included, must match."""
    rows = warmup + repeats + 1
    lin, xs = make_layer(shape, rows, seed)
    w = dequantize(*group_quantize_int4(lin.weight.detach(), group_size), group_size)
    timed_int4(layer_cls, shape, group_size, seed, 0, rows)
    _check(int4_outputs(layer_cls, shape, group_size, seed), xs, w, shape, group_size)
    ours, theirs = iter(xs[1:]), iter(range(1, rows))

    def fp32():
        with torch.no_grad():
            lin(next(ours))

    r = time_ratio(fp32, lambda: timed_int4(layer_cls, shape, group_size, seed, next(theirs),
                                            rows), warmup=warmup, repeats=repeats)
    _check(int4_outputs(layer_cls, shape, group_size, seed), xs, w, shape, group_size)
    return r


def _check(outputs, xs, w, shape, group_size) -> None:
    for got, x in zip(outputs, xs):
        want = x @ w.T
        if not torch.is_tensor(got) or tuple(got.shape) != tuple(want.shape):
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


# --- a correct candidate on the library, and the usual mistake, in the notebook's signature -----
def library_int4(linear, group_size):
    """The reference: minillm's QuantLinear (torch's int4 CPU kernel) in the notebook's
    signature."""
    from minillm.quant import QuantLinear
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
    reference=library_int4, counter_example=DequantizeInt4,
    workload=dict(shape=SHAPE, group_size=GROUP),
    solution=("Int4Linear", "04_zeropoint", "04_int4", "04_int4_layer"),
    hint="at batch 1 on a {shape[0]}x{shape[1]} layer your int4 layer was only {ratio:.2f}x "
         "as fast as the fp32 layer (median {candidate_ms:.3g} ms vs {baseline_ms:.3g} ms over "
         "{runs} interleaved runs); reading 4-bit codes with torch's int4 kernel reaches at "
         "least {at_least:g}x. Does your forward dequantize the weight (or convert the layout) "
         "on every call instead of handing the packed codes to the kernel?")
check_int4_speedup = SPEED_CHECK.check
__all__ = ["model_call", "awq", "int4_layer", "timed_int4", "int4_outputs", "held_bytes",
           "check_int4_speedup"]
