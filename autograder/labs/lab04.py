"""Lab 04 (Triton kernels: lab04_triton.py): probes run the student's quantization code; the speed
check times their Int4Linear against the fp32 layer at batch 1 on a memory-bound 64 MB layer."""
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
# time(fp32) / time(int4), loaded, in the tester: the library's layer 3.15-3.77 (1.6-2.2 without
# AVX-512), the solution 2.44-3.37, dequantize-then-multiply 0.03; "faster" with room for noise
THRESHOLD = 1.1
WARMUP, REPEATS = 3, 21


def linear_with(weight: torch.Tensor) -> nn.Linear:
    lin = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    with torch.no_grad():
        lin.weight.copy_(weight)
    return lin


@probe
def model_call(fn, *args, config: dict | None = None, **kwargs):
    """`fn(model, ...)`: a fresh fp32 shipped model, or Transformer(ModelConfig(**config))."""
    if config is None:
        return fn(fresh_model().float(), *args, **kwargs)
    from minillm.config import ModelConfig
    from minillm.model import Transformer
    return fn(Transformer(ModelConfig(**config)), *args, **kwargs)


@probe
def awq(awq_search, weight, x, *args, **kwargs):
    return awq_search(linear_with(weight), x, *args, **kwargs)


@probe
def int4_layer(layer_cls, weight, group_size: int, x) -> dict:
    """{"bytes": of every tensor the layer holds (attributes, buffers, parameters), "y"}."""
    layer = layer_cls(linear_with(weight), group_size)
    held = {id(t): t for t in vars(layer).values() if torch.is_tensor(t)}
    held.update((id(t), t) for t in list(layer.buffers()) + list(layer.parameters()))
    with torch.no_grad():
        return {"bytes": sum(t.nbytes for t in held.values()), "y": layer(x)}


def make_layer(shape=SHAPE, rows: int = 1, seed: int = 0):
    """A random nn.Linear [out, in] (no bias) and `rows` inputs of one row each."""
    g = torch.Generator().manual_seed(seed)
    lin = linear_with(torch.randn(*shape, generator=g) * shape[1] ** -0.5)
    return lin, torch.randn(rows, 1, shape[1], generator=g)


_KEPT: dict = {}       # (layer class, shape, group, seed) -> [layer, inputs, outputs]


@probe
def timed_int4(layer_cls, shape, group_size: int, seed: int, i: int, rows: int) -> None:
    """One timed call of the kept layer on input row i, its output kept (i = 0: build it)."""
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
    return _KEPT[(id(layer_cls), tuple(shape), group_size, seed)][2]


def int4_speedup(layer_cls, *, shape=SHAPE, group_size: int = GROUP, warmup: int = WARMUP,
                 repeats: int = REPEATS, seed: int = 0):
    """.ratio = median(fp32) / median(int4), a fresh row per call; every output must match."""
    rows = warmup + repeats + 1
    lin, xs = make_layer(shape, rows, seed)
    w = dequantize(*group_quantize_int4(lin.weight.detach(), group_size), group_size)
    timed_int4(layer_cls, shape, group_size, seed, 0, rows)
    _check(int4_outputs(layer_cls, shape, group_size, seed), xs, w, shape, group_size)
    ours, theirs = iter(xs[1:]), iter(range(1, rows))
    fp32 = torch.no_grad()(lambda: lin(next(ours)))
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


def library_int4(linear, group_size):
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
    hint="at batch 1 on a {shape[0]}x{shape[1]} layer your int4 layer was only {ratio:.2f}x as "
         "fast as the fp32 layer (median {candidate_ms:.3g} ms vs {baseline_ms:.3g} ms over "
         "{runs} interleaved runs); reading 4-bit codes with torch's int4 kernel reaches at least "
         "{at_least:g}x. Does your forward dequantize the weight (or convert the layout) on every "
         "call instead of handing the packed codes to the kernel?")
check_int4_speedup = SPEED_CHECK.check
__all__ = ["model_call", "awq", "int4_layer", "timed_int4", "int4_outputs",
           "check_int4_speedup"]
