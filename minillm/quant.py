"""Weight quantization: store weights in fewer bits, compute with 16/32-bit activations.

Decode at small batch is memory-bound (lab 01): a step reads every weight once and does 2 FLOPs
with it, so the time per token is about (bytes of weights) / (memory bandwidth). Halving the bytes
per weight halves that floor -- int8 weights make decode up to 2x faster than bf16, int4 up to 4x,
*if* the kernel dequantizes in registers instead of writing a 16-bit copy back to memory
(kernels/dequant_matmul.py). The price is precision: every scheme here trades bits for error.

Schemes (all round-to-nearest, RTN, unless stated):
  absmax int8      q = round(w / s), s = max|w| / 127: per tensor or per output channel.
  zero-point int8  asymmetric: q = round(w / s) + z, s = (max - min) / 255, codes 0..255.
  int4 group-wise  asymmetric 4-bit codes 0..15 with a scale and zero per group of G input
                   weights (G = 32/64/128), two codes packed per byte.
  LLM.int8()       (Dettmers et al. 2022) int8 for weights *and* activations, except the few
                   input features whose activations exceed a threshold (6.0): those columns are
                   multiplied in 16/32-bit ("mixed-precision decomposition").
  AWQ              (Lin et al. 2023) activation-aware: scale input channel j of W up by
                   s_j = mean|x_j|^alpha (and the input down by s_j) before int4 RTN, so the
                   channels that see large activations lose less; alpha is searched per layer
                   on calibration text to minimise the layer's output error.

`QuantLinear` holds weight-only w8 / w4 weights and drops into the model in place of nn.Linear;
`quantize_model(model, "int4-awq", calib_ids=...)` returns a quantized copy; `model_bytes` counts
what it stores. Both build and read the codes with `kernels.formats`' functions, or with the
`Formats` given (`formats=`: lab 04 passes its student's own). Before building anything:
`stored_bits_per_weight` (and its average over a model's linear layers,
`linear_bits_per_weight`) gives the cost of a format, and `fake_quantize` /
`fake_quantize_model` its error (weights quantized and dequantized in place).
"""
from __future__ import annotations

import copy
import re
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

from kernels import cpu_weight_only
from kernels.formats import (  # noqa: F401
    COURSE_FORMATS,
    Formats,
    absmax_quantize,
    dequantize,
    group_quantize,
    group_quantize_int4,
    pack_int4,
    unpack_int4,
    zeropoint_quantize,
)

_SAID: set[str] = set()


def _fallback_once(reason: str) -> None:
    if reason not in _SAID:
        _SAID.add(reason)
        warnings.warn(f"QuantLinear dequantizes and multiplies on the CPU (no speed-up): {reason}",
                      stacklevel=3)


SCHEMES = ("int8", "int8-tensor", "int8-zp", "int4-g32", "int4-g64", "int4-g128", "int4-awq",
           "llm.int8")


# ---- number formats ---------------------------------------------------------------------------
def format_table() -> list[dict]:
    """Range, precision and size of the formats the lab compares, read from torch itself."""
    rows = []
    for name, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16),
                     ("fp8 e4m3", getattr(torch, "float8_e4m3fn", None))):
        if dt is None:
            continue
        fi = torch.finfo(dt)
        rows.append({"format": name, "bits": fi.bits, "max": float(fi.max),
                     "smallest_normal": float(fi.tiny), "eps": float(fi.eps),
                     "bytes": fi.bits / 8})
    for name, bits in (("int8", 8), ("int4", 4)):
        rows.append({"format": name, "bits": bits, "max": float(2 ** (bits - 1) - 1),
                     "smallest_normal": 1.0, "eps": 1.0, "bytes": bits / 8})
    return rows


# ---- what a quantized weight costs ------------------------------------------------------------
def stored_bits_per_weight(bits: int, group_size: int, scale_bits: int = 16,
                           zero_point: bool = False) -> float:
    """Bits stored per weight: `bits` for the code, plus one scale of `scale_bits` bits (and, with
    zero_point, one zero of `scale_bits` bits) shared by the `group_size` weights of a group
    (a whole row of K inputs for per-channel scales).

    >>> stored_bits_per_weight(4, 64, zero_point=True)      # int4, g = 64, 16-bit scale and zero
    4.5
    >>> stored_bits_per_weight(8, 4096, scale_bits=32)      # int8 per row, fp32 scale (kernels/)
    8.0078125
    """
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    return bits + scale_bits * (2 if zero_point else 1) / group_size


def linear_bits_per_weight(model, bits: int, group_size: int | None = None,
                           scale_bits: int = 16, zero_point: bool = False,
                           skip=("lm_head",)) -> float:
    """`stored_bits_per_weight` averaged over the weights of every nn.Linear of `model` except
    `skip` (what quantize_model quantizes), each layer weighted by its N * K weights;
    group_size None: one scale per row (its K inputs)."""
    total = stored = 0.0
    for name in _linears(model, skip):
        N, K = model.get_submodule(name).weight.shape
        total += N * K
        stored += N * K * stored_bits_per_weight(bits, K if group_size is None else group_size,
                                                 scale_bits, zero_point)
    return stored / total


# ---- fake quantization (the quantizers and int4 packing: kernels/formats.py) ------------------
def fake_quantize(weight: torch.Tensor, bits: int, group_size: int | None = None) -> torch.Tensor:
    """Quantize and dequantize: the float32 weight [N, K] that round-to-nearest zero-point
    `bits`-bit codes with one scale and zero per group of `group_size` inputs (None: per row)
    stand for. A model using it computes what a quantized kernel would, without the saving."""
    if group_size is None:
        return dequantize(*zeropoint_quantize(weight, bits, per_channel=True))
    return dequantize(*group_quantize(weight, group_size, bits), group_size)


# ---- a quantized linear layer -----------------------------------------------------------------
class QuantLinear(nn.Module):
    """Weight-only quantized drop-in for nn.Linear (w8: int8 per output channel; w4: packed int4
    with group scales and zeros). Activations stay in the input's dtype.

    input_scale (AWQ): the stored weight is W * diag(s); forward divides the input by s first,
    so y = (x / s) (W s)^T = x W^T up to the quantization error.
    On CUDA the Triton fused dequant-matmul kernel runs (kernels/dequant_matmul.py); on a CPU,
    torch's own packed kernels (kernels/cpu_weight_only.py), which read the codes and widen
    them in registers with the activations rounded to bf16 (the "a16"). Where those are missing
    (an older torch) or do not take the shape (int4: N a multiple of 16, G in 32..256), the
    weight is dequantized and multiplied instead, with a warning the first time.
    formats: the functions that quantize, pack and read the codes (kernels.formats.Formats;
    None: the course's).
    """

    def __init__(self, in_features: int, out_features: int, bits: int, group_size: int = 64,
                 bias: bool = False, input_scale: bool = False, formats: Formats | None = None):
        super().__init__()
        self.formats = COURSE_FORMATS if formats is None else formats
        if bits not in (8, 4):
            raise ValueError(f"QuantLinear supports 8 or 4 bits, got {bits}")
        if bits == 4 and (in_features % group_size or in_features % 2):
            raise ValueError(f"in_features {in_features} must be even and divisible by the "
                             f"group size {group_size}")
        self.in_features, self.out_features, self.bits = in_features, out_features, bits
        self.group_size = group_size if bits == 4 else None
        if bits == 8:
            self.register_buffer("qweight", torch.zeros(out_features, in_features,
                                                        dtype=torch.int8))
            self.register_buffer("scales", torch.ones(out_features))
            self.zeros = None
        else:
            ng = in_features // group_size
            self.register_buffer("qweight", torch.zeros(out_features, in_features // 2,
                                                        dtype=torch.uint8))
            self.register_buffer("scales", torch.ones(out_features, ng))
            self.register_buffer("zeros", torch.zeros(out_features, ng))
        self.register_buffer("bias", torch.zeros(out_features) if bias else None)
        self.register_buffer("input_scale", torch.ones(in_features) if input_scale else None)

    @classmethod
    @torch.no_grad()
    def from_linear(cls, linear: nn.Linear, bits: int = 8, group_size: int = 64,
                    input_scale: torch.Tensor | None = None,
                    formats: Formats | None = None) -> "QuantLinear":
        q = cls(linear.in_features, linear.out_features, bits, group_size,
                bias=linear.bias is not None, input_scale=input_scale is not None,
                formats=formats)
        f = q.formats
        w = linear.weight.detach().float()
        if input_scale is not None:
            if input_scale.shape != (linear.in_features,) or not (input_scale > 0).all():
                raise ValueError(f"input_scale must be positive with shape "
                                 f"({linear.in_features},)")
            q.input_scale.copy_(input_scale)
            w = w * input_scale[None, :]
        if bits == 8:
            qw, s = f.absmax_quantize(w)
            q.qweight.copy_(qw), q.scales.copy_(s.squeeze(-1))
        else:
            codes, s, z = f.group_quantize_int4(w, group_size)
            q.qweight.copy_(f.pack_int4(codes)), q.scales.copy_(s), q.zeros.copy_(z)
        if linear.bias is not None:
            q.bias.copy_(linear.bias.detach().float())
        return q.to(linear.weight.device)

    @classmethod
    @torch.no_grad()
    def cat(cls, layers: list["QuantLinear"]) -> "QuantLinear":
        """One layer whose outputs are those of `layers` side by side (q/k/v or gate/up as one
        product): their rows stacked. They must share the input, bits and group size."""
        first = layers[0]
        for q in layers:
            if not isinstance(q, QuantLinear):
                raise ValueError(f"QuantLinear.cat takes QuantLinear layers, got "
                                 f"{type(q).__name__}")
            if (q.in_features, q.bits, q.group_size) != \
                    (first.in_features, first.bits, first.group_size):
                raise ValueError("QuantLinear.cat needs the same in_features, bits and group "
                                 "size in every layer")
            if q.input_scale is not None:
                raise ValueError("QuantLinear.cat cannot stack AWQ layers: each divides its "
                                 "input by its own scales")
            if (q.bias is None) != (first.bias is None):
                raise ValueError("QuantLinear.cat needs all layers biased or none")
        out = cls(first.in_features, sum(q.out_features for q in layers), first.bits,
                  first.group_size or 64, bias=first.bias is not None,
                  formats=first.formats).to(first.qweight.device)
        for name in ("qweight", "scales", "zeros", "bias"):
            if getattr(out, name) is not None:
                getattr(out, name).copy_(torch.cat([getattr(q, name) for q in layers]))
        return out

    def dequantized_weight(self, scaled: bool = True) -> torch.Tensor:
        """The float32 weight this layer effectively multiplies by (with scaled=False, the stored
        one, before an AWQ input scaling is undone)."""
        if self.bits == 8:
            w = self.qweight.float() * self.scales.float()[:, None]
        else:
            f = self.formats
            w = f.dequantize_groups(f.unpack_int4(self.qweight), self.scales.float(),
                                    self.zeros.float(), self.group_size)
        if scaled and self.input_scale is not None:
            w = w / self.input_scale.float()[None, :]
        return w

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.input_scale is not None:
            x = x / self.input_scale.to(x.dtype)
        bias = None if self.bias is None else self.bias.to(x.dtype)
        if x.is_cuda:
            from kernels import w4a16_matmul, w8a16_matmul  # imports triton: only on a GPU
            if self.bits == 8:
                return w8a16_matmul(x, self.qweight, self.scales, bias)
            return w4a16_matmul(x, self.qweight, self.scales, self.zeros, self.group_size, bias)
        if self.bits == 8:
            if "int8" not in cpu_weight_only.missing():
                return cpu_weight_only.w8_cpu_matmul(x, self.qweight, self.scales, bias)
            _fallback_once("this torch has no int8 CPU kernel (_weight_int8pack_mm)")
        elif (packed := self.w4_cpu_layout()) is not None:
            return cpu_weight_only.w4_cpu_matmul(x, packed, bias)
        return F.linear(x, self.dequantized_weight(scaled=False).to(x.dtype), bias)

    def w4_cpu_layout(self) -> cpu_weight_only.W4Packed | None:
        """An int4 layer's codes in torch's int4 CPU layout (re-packed whenever they change), or
        None where that kernel cannot run this layer (said once per reason)."""
        if "int4" in cpu_weight_only.missing():
            _fallback_once("this torch has no int4 CPU kernel (_weight_int4pack_mm_for_cpu)")
            return None
        if not cpu_weight_only.w4_supported(self.out_features, self.in_features,
                                            self.group_size):
            _fallback_once(f"torch's int4 CPU kernel needs out_features a multiple of 16 and "
                           f"a group size in {cpu_weight_only.W4_GROUPS}; got "
                           f"{self.out_features} and {self.group_size}")
            return None
        key = tuple((t.data_ptr(), t._version) for t in (self.qweight, self.scales, self.zeros))
        if getattr(self, "_w4_cpu_cache", (None,))[0] != key:
            self._w4_cpu_cache = (key, cpu_weight_only.pack_w4_cpu(
                self.qweight, self.scales, self.zeros, self.group_size,
                self.formats.unpack_int4))
        return self._w4_cpu_cache[1]

    def extra_repr(self) -> str:
        g = f", group_size={self.group_size}" if self.bits == 4 else ""
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bits={self.bits}{g}, awq={self.input_scale is not None}")


# ---- LLM.int8(): int8 activations too, outlier features in high precision --------------------
class Int8MixedLinear(nn.Module):
    """LLM.int8() matmul: x W^T = x[:, O] W[:, O]^T (high precision, outlier feature columns O)
    + int8(x[:, ~O]) int8(W[:, ~O])^T (one scale per token row of x, one per output row of W,
    integer accumulation). O = input features where any |x| > threshold in this batch;
    `outlier_counts` tallies how often each feature was an outlier."""

    def __init__(self, linear: nn.Linear, threshold: float = 6.0):
        super().__init__()
        self.threshold = float(threshold)
        w = linear.weight.detach().float()
        q, s = absmax_quantize(w, 8, per_channel=True)
        self.register_buffer("qweight", q)
        self.register_buffer("scales", s.squeeze(-1))
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().float())
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.outlier_counts = torch.zeros(linear.in_features, dtype=torch.long)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape, dtype = x.shape, x.dtype
        x2 = x.reshape(-1, shape[-1]).float()
        outliers = (x2.abs() > self.threshold).any(dim=0)           # [K] feature columns
        self.outlier_counts += outliers.cpu().long()
        w = self.qweight.float() * self.scales[:, None]
        y = x2[:, outliers] @ w[:, outliers].T                       # the high-precision part
        rest = x2.masked_fill(outliers, 0.0)
        sx = rest.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / 127   # per row (token)
        qx = torch.round(rest / sx).clamp(-127, 127)
        # integer products accumulate exactly in float64 (as int32 would on the GPU)
        acc = qx.double() @ self.qweight.double().T
        y = y + (acc * sx.double() * self.scales.double()[None, :]).float()
        if self.bias is not None:
            y = y + self.bias
        return y.to(dtype).reshape(*shape[:-1], self.out_features)


# ---- AWQ --------------------------------------------------------------------------------------
@torch.no_grad()
def awq_search(linear: nn.Linear, x: torch.Tensor, group_size: int = 64, grid: int = 20):
    """Per-input-channel scales s = mean|x|^alpha for the alpha in [0, 1] (grid steps) that
    minimises the layer's output error on the calibration inputs x [tokens, K]:
    mean over tokens and outputs of (x Q(W s)^T / s - x W^T)^2. alpha = 0 is plain RTN.
    Returns (s, best_alpha, errors per alpha).

    The error of a weight error D = Wq - W is mean_t,n (x_t . d_n)^2 = sum_n d_n^T G d_n / N with
    G = X^T X / T [K, K]: the calibration set enters only through G, so each alpha costs N K^2
    multiply-adds instead of T N K."""
    if x.shape[-1] != linear.in_features or x.numel() == 0:
        raise ValueError(f"calibration inputs must be [tokens, {linear.in_features}], got "
                         f"{tuple(x.shape)}")
    if not isinstance(grid, int) or grid < 1:
        raise ValueError(f"grid must be a positive integer, got {grid!r}")
    x = x.reshape(-1, x.shape[-1]).float()
    w = linear.weight.detach().float()
    gram = x.T @ x / x.shape[0]
    act = x.abs().mean(dim=0).clamp(min=1e-8)
    errors, best = [], (float("inf"), None, None)
    for i in range(grid + 1):
        alpha = i / grid
        s = act ** alpha
        s = s / (s.max() * s.min()).sqrt()                         # keep scales around 1
        codes, sc, z = group_quantize_int4(w * s[None, :], group_size)
        d = dequantize(codes, sc, z, group_size) / s[None, :] - w
        err = float(((d @ gram) * d).sum() / w.shape[0])
        errors.append(err)
        if err < best[0]:
            best = (err, alpha, s)
    return best[2], best[1], errors


def linear_inputs(model, ids: torch.Tensor, names) -> dict[str, torch.Tensor]:
    """Run `model(ids)` once and capture the input of each named nn.Linear (flattened tokens)."""
    mods = dict(model.named_modules())
    seen, hooks = {}, []
    for n in names:
        hooks.append(mods[n].register_forward_hook(
            lambda m, args, out, n=n: seen.__setitem__(n, args[0].detach().reshape(
                -1, args[0].shape[-1]).float())))
    try:
        with torch.no_grad():
            model(ids)
    finally:
        for h in hooks:
            h.remove()
    return seen


# ---- whole models -----------------------------------------------------------------------------
def _linears(model, skip=("lm_head",)) -> list[str]:
    return [n for n, m in model.named_modules()
            if isinstance(m, nn.Linear) and not any(n == s or n.endswith("." + s) for s in skip)]


def _set(model, name: str, module: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, module)


@torch.no_grad()
def fake_quantize_model(model, quantize_weight, skip=("lm_head",)):
    """A copy of `model` whose nn.Linear weights (except `skip`) are replaced by
    quantize_weight(W) (W in float32, e.g. `lambda w: fake_quantize(w, 3, 64)`): measures the
    quality of a scheme with the model's own layers; it stores nothing smaller."""
    new = copy.deepcopy(model)
    for name in _linears(new, skip):
        w = new.get_submodule(name).weight
        w.copy_(quantize_weight(w.detach().float()))
    return new


def quantize_model(model, scheme: str, calib_ids: torch.Tensor | None = None,
                   skip=("lm_head",), threshold: float = 6.0, formats: Formats | None = None):
    """A quantized copy of `model`: every nn.Linear except `skip` replaced according to `scheme`
    (one of SCHEMES). "int4-awq" needs `calib_ids` [B, T] (calibration text, not the eval
    split); the embedding, norms and lm_head stay in floating point. formats: the QuantLinear
    layers' (see QuantLinear)."""
    if scheme not in SCHEMES:
        raise ValueError(f"unknown quantization scheme {scheme!r}; choose from "
                         f"{', '.join(SCHEMES)}")
    if scheme == "int4-awq" and calib_ids is None:
        raise ValueError("int4-awq needs calibration token ids (calib_ids)")
    new = copy.deepcopy(model)
    names = _linears(new, skip)
    inputs = linear_inputs(new, calib_ids, names) if scheme == "int4-awq" else {}
    for name in names:
        lin = new.get_submodule(name)
        try:
            q = _quantize_linear(lin, scheme, inputs.get(name), threshold, formats)
        except ValueError as e:
            raise ValueError(f"{scheme} cannot quantize {name} ({lin.in_features} -> "
                             f"{lin.out_features}): {e}") from None
        _set(new, name, q)
    return new


def _quantize_linear(lin: nn.Linear, scheme: str, x, threshold: float,
                     formats: Formats | None = None) -> nn.Module:
    if scheme == "int8":
        return QuantLinear.from_linear(lin, 8, formats=formats)
    if scheme in ("int8-tensor", "int8-zp"):
        return _FakeQuant(lin, scheme)
    if scheme.startswith("int4-g"):
        return QuantLinear.from_linear(lin, 4, int(scheme[len("int4-g"):]), formats=formats)
    if scheme == "int4-awq":
        s, _, _ = awq_search(lin, x, group_size=64)
        return QuantLinear.from_linear(lin, 4, 64, input_scale=s, formats=formats)
    return Int8MixedLinear(lin, threshold)


class _FakeQuant(nn.Module):
    """Per-tensor absmax or zero-point int8, stored as codes and applied by dequantizing (these
    schemes are for comparison in the lab; QuantLinear is the deployable one)."""

    def __init__(self, linear: nn.Linear, scheme: str):
        super().__init__()
        w = linear.weight.detach()
        if scheme == "int8-tensor":
            q, s = absmax_quantize(w, 8, per_channel=False)
            z = None
        else:
            q, s, z = zeropoint_quantize(w, 8, per_channel=True)
        self.register_buffer("qweight", q)
        self.register_buffer("scales", s.reshape(-1))
        self.register_buffer("zeros", None if z is None else z.reshape(-1))
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().float())

    def forward(self, x):
        s = self.scales[:, None] if self.scales.numel() > 1 else self.scales
        z = None if self.zeros is None else self.zeros[:, None]
        w = dequantize(self.qweight, s, z).to(x.dtype)
        return F.linear(x, w, None if self.bias is None else self.bias.to(x.dtype))


def model_bytes(model, float_bytes: int = 2) -> int:
    """Bytes the model stores: quantized codes, scales and zeros at their size; floating-point
    parameters at `float_bytes` each (2 = bf16, how the shipped checkpoints are stored).
    Scales/zeros count at 2 bytes too (they would be stored in 16-bit)."""
    total, seen = 0, set()
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        if t is None or t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        if t.dtype in (torch.int8, torch.uint8):
            total += t.numel() * t.element_size()
        elif re.search(r"(scales|zeros|input_scale)$", name):
            total += t.numel() * 2
        else:
            total += t.numel() * float_bytes
    return total


def bits_per_weight(model, float_bytes: int = 2) -> float:
    """Average stored bits per parameter of the original model's linear layers (plus the rest)."""
    n = sum(p.numel() for p in model.parameters())
    n += sum(m.in_features * m.out_features + (0 if m.bias is None else m.out_features)
             for m in model.modules() if isinstance(m, (QuantLinear, Int8MixedLinear))) \
        + sum(m.qweight.numel() for m in model.modules() if isinstance(m, _FakeQuant))
    return 8 * model_bytes(model, float_bytes) / max(n, 1)
