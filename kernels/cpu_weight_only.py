"""PyTorch's own CPU kernels for weight-only quantized layers, fed the course's formats.

The Triton kernels (dequant_matmul.py) are the GPU's way to read 8- or 4-bit weights and widen
them in registers. On a CPU, PyTorch ships two such kernels:

    aten._weight_int8pack_mm(x [M, K], w int8 [N, K], scales [N]) -> [M, N]
        W[n, k] = w[n, k] * scales[n]                      (our w8a16 format as it is)
    aten._convert_weight_to_int4pack_for_cpu(q int32 [N, K], inner_k_tiles) -> uint8 [N, K / 2]
    aten._weight_int4pack_mm_for_cpu(x [M, K], packed, G, scale_and_zero [K / G, N, 2]) -> [M, N]
        W[n, k] = (q[n, k] - 8) * scale[k // G, n] + zero[k // G, n]

Both want bf16 activations (and scales): with fp32 ones the int8 kernel takes a much slower
path. So the activations are rounded to bf16 on the way in -- the "a16" of
w8a16 -- and the output goes back to x's dtype. Our w4 format stores W = (q - z) * s, which is
torch's with zero = (8 - z) * s. The int4 kernel takes N a multiple of 16 and G in 32, 64, 128,
256; `w4_supported` says whether a layer fits, and `missing()` which kernels this torch lacks
(the callers fall back to dequantize-then-matmul and say so). Argument checks are the
references' (dequant_ref.py), so bad input gets the same message on every path.

    qweight, scales, zeros = quantize_w4(weight, 64)
    packed = pack_w4_cpu(qweight, scales, zeros, 64)            # once per layer
    y = w4_cpu_matmul(x, packed)                                # ~ w4a16_matmul_ref(x, ...)
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from .dequant_ref import check_w4a16_args, check_w8a16_args
from .formats import unpack_int4

__all__ = ["W4Packed", "missing", "w4_supported", "w8_cpu_matmul", "pack_w4_cpu",
           "w4_cpu_matmul"]

W4_GROUPS = (32, 64, 128, 256)
# Error bound of these kernels against the fp32 product of the dequantized weight, elementwise:
# |y - x W^T| <= BF16_ERROR * (|x| |W|^T). Rounding x, the int8 scales and y to bf16 costs at
# most 2^-8 relative each (bf16 keeps 8 significant bits); 2^-6 leaves room for the rest.
BF16_ERROR = 2 ** -6
_OPS = {"int8": ("_weight_int8pack_mm",),
        "int4": ("_convert_weight_to_int4pack_for_cpu", "_weight_int4pack_mm_for_cpu")}


@functools.cache
def missing() -> tuple[str, ...]:
    """The formats ("int8", "int4") whose CPU kernels this torch build does not have."""
    return tuple(fmt for fmt, ops in _OPS.items()
                 if not all(hasattr(torch.ops.aten, op) for op in ops))


def w4_supported(N: int, K: int, group_size: int) -> bool:
    """Whether torch's int4 CPU kernel takes an [N, K] weight with groups of `group_size`."""
    return N % 16 == 0 and group_size in W4_GROUPS and K % group_size == 0


def _finish(y: torch.Tensor, bias, dtype, lead, N) -> torch.Tensor:
    y = y.to(dtype)
    if bias is not None:
        y = y + bias.to(dtype)
    return y.reshape(*lead, N)


def w8_cpu_matmul(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                  bias: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ (qweight * scales[:, None]).T (+ bias) with torch's int8 CPU kernel, bf16
    activations, returned in x.dtype (same arguments as w8a16_matmul_ref)."""
    x2, lead, N, _ = check_w8a16_args(x, qweight, scales, bias)
    y = torch.ops.aten._weight_int8pack_mm(x2.to(torch.bfloat16).contiguous(), qweight,
                                           scales.to(torch.bfloat16))
    return _finish(y, bias, x.dtype, lead, N)


@dataclass(frozen=True)
class W4Packed:
    """An int4 layer in torch's CPU layout: codes [N, K / 2] and scale_and_zero [K / G, N, 2]."""
    packed: torch.Tensor
    scale_and_zero: torch.Tensor
    group_size: int
    N: int
    K: int

    @property
    def nbytes(self) -> int:
        return self.packed.nbytes + self.scale_and_zero.nbytes


def pack_w4_cpu(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                group_size: int, unpack=unpack_int4) -> W4Packed:
    """Our w4 layer (dequant_ref.py's format) in the layout torch's int4 CPU kernel reads;
    `unpack` reads the packed codes (formats.unpack_int4, or one's own: formats.Formats)."""
    N, K = qweight.shape[0], 2 * qweight.shape[1]
    check_w4a16_args(torch.empty(0, K, device=qweight.device), qweight, scales, zeros,
                     group_size, None)
    if not w4_supported(N, K, group_size):
        raise ValueError(f"torch's int4 CPU kernel needs N a multiple of 16 and a group size in "
                         f"{W4_GROUPS} dividing K; got N = {N}, K = {K}, G = {group_size}")
    codes = unpack(qweight).to(torch.int32)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)
    s, z = scales.float(), zeros.float()
    scale_and_zero = torch.stack([s, (8 - z) * s], dim=-1).transpose(0, 1).contiguous()
    return W4Packed(packed, scale_and_zero.to(torch.bfloat16), group_size, N, K)


def w4_cpu_matmul(x: torch.Tensor, w: W4Packed, bias: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ W.T (+ bias) with torch's int4 CPU kernel on a `pack_w4_cpu` layer, bf16
    activations, returned in x.dtype."""
    if not isinstance(x, torch.Tensor) or x.dim() < 1 or x.shape[-1] != w.K:
        raise ValueError(f"x has shape {tuple(getattr(x, 'shape', ()))}: its last dim must be the "
                         f"layer's K = {w.K} input features")
    if not x.is_floating_point():
        raise ValueError(f"x must be a floating-point tensor, got {x.dtype}")
    if bias is not None and tuple(bias.shape) != (w.N,):
        raise ValueError(f"bias must have shape ({w.N},), got {tuple(bias.shape)}")
    lead = tuple(x.shape[:-1])
    y = torch.ops.aten._weight_int4pack_mm_for_cpu(
        x.reshape(-1, w.K).to(torch.bfloat16).contiguous(), w.packed, w.group_size,
        w.scale_and_zero)
    return _finish(y, bias, x.dtype, lead, w.N)
