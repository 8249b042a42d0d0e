"""Weight-only quantized linear layers: the storage formats and a plain-torch reference.

A weight-only quantized layer keeps its weight in 8 or 4 bits and its activations in 16/32 bits.
The reference here dequantizes the whole weight to float32 and multiplies; the Triton kernels in
`kernels/dequant_matmul.py` compute the same thing without ever writing that float weight to
memory (same signatures, same argument checks).

Formats (W is the float weight of an nn.Linear: [N, K] = [out_features, in_features]):

  w8a16   qweight int8 [N, K], scales float [N] (one per output channel)
          W[n, k] = qweight[n, k] * scales[n]

  w4a16   qweight uint8 [N, K // 2]: two 4-bit codes per byte along K,
          low nibble = even k, high nibble = odd k   (byte = q[n, 2j] | q[n, 2j + 1] << 4)
          scales, zeros float [N, K // G] for groups of G consecutive input features
          W[n, k] = (q[n, k] - zeros[n, k // G]) * scales[n, k // G]
          codes q in 0..15; symmetric int4 is the special case zeros = 8.
          K must be even and a multiple of G; G is a power of two >= 16 (32, 64, 128 usual).

Both matmuls: y = x @ W.T (+ bias), x [..., K] float16 / bfloat16 / float32, y in x's dtype,
accumulated in float32.
"""
from __future__ import annotations

import torch

from .formats import absmax_quantize, group_quantize_int4, pack_int4, unpack_int4

__all__ = ["pack_int4", "unpack_int4", "quantize_w8", "quantize_w4", "dequantize_w8",
           "dequantize_w4", "w8a16_matmul_ref", "w4a16_matmul_ref",
           "check_w8a16_args", "check_w4a16_args"]

X_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_MAX_ELEMENTS = 2**31 - 1  # the kernels index with 32-bit offsets


# ---- quantizers (round to nearest; just what the tests and the benchmark need) -----------------
def _check_weight(weight: torch.Tensor) -> None:
    if not isinstance(weight, torch.Tensor) or not weight.is_floating_point() or weight.dim() != 2:
        raise ValueError(f"expected a 2-D floating-point weight [N, K], got "
                         f"{getattr(weight, 'dtype', type(weight).__name__)} "
                         f"{tuple(getattr(weight, 'shape', ()))}")


def quantize_w8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Absmax int8 per output channel: (qweight int8 [N, K], scales float32 [N])."""
    _check_weight(weight)
    q, s = absmax_quantize(weight, 8, per_channel=True)
    return q, s.squeeze(1)


def quantize_w4(weight: torch.Tensor, group_size: int = 64
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric min/max int4 per group of `group_size` inputs (formats.group_quantize_int4):
    (qweight uint8 [N, K // 2] packed, scales float32 [N, K // G], zeros float32 [N, K // G])."""
    _check_weight(weight)
    _check_group(group_size, weight.shape[1])
    codes, scales, zeros = group_quantize_int4(weight, group_size)
    return pack_int4(codes), scales, zeros


def dequantize_w8(qweight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The float32 [N, K] weight a w8a16 layer multiplies by."""
    return qweight.float() * scales.float()[:, None]


def dequantize_w4(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                  group_size: int) -> torch.Tensor:
    """The float32 [N, K] weight a w4a16 layer multiplies by."""
    q = unpack_int4(qweight).float()
    N, K = q.shape
    q = q.reshape(N, K // group_size, group_size)
    w = (q - zeros.float()[..., None]) * scales.float()[..., None]
    return w.reshape(N, K)


# ---- argument checks (shared with the Triton versions) -----------------------------------------
def _check_group(group_size, K: int) -> None:
    if isinstance(group_size, bool) or not isinstance(group_size, int):
        raise ValueError(f"group_size must be an int, got {group_size!r}")
    if group_size < 16 or group_size & (group_size - 1):
        raise ValueError(f"group_size must be a power of two >= 16 (32, 64, 128 usual), "
                         f"got {group_size}")
    if K % 2:
        raise ValueError(f"w4 packs two codes per byte along K, so K must be even; got K = {K}")
    if K % group_size:
        raise ValueError(f"K = {K} input features is not a multiple of group_size = "
                         f"{group_size}")


def _check_x(x, K: int) -> None:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"x must be a tensor, got {type(x).__name__}")
    if x.dtype not in X_DTYPES:
        raise ValueError(f"x must be float16, bfloat16 or float32, got {x.dtype}")
    if x.dim() < 1 or x.shape[-1] != K:
        raise ValueError(f"x has shape {tuple(x.shape)}: its last dim must be the layer's "
                         f"K = {K} input features")


def _check_float(name: str, t, shape: tuple, device: torch.device) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a tensor, got {type(t).__name__}")
    if not t.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got {t.dtype}")
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but x is on {device}")


def _flatten(x: torch.Tensor, K: int) -> tuple[torch.Tensor, tuple]:
    lead = tuple(x.shape[:-1])
    x2 = x.reshape(-1, K)
    if x2.numel() > _MAX_ELEMENTS:
        raise ValueError(f"x has {x2.numel()} elements; at most 2**31 - 1 are supported")
    return x2, lead


def check_w8a16_args(x, qweight, scales, bias):
    """Validate a w8a16 call; returns (x as [M, K], leading dims of x, N, K)."""
    if not isinstance(qweight, torch.Tensor) or qweight.dtype != torch.int8 or qweight.dim() != 2:
        raise ValueError(f"w8a16 qweight must be a 2-D int8 tensor [N, K], got "
                         f"{getattr(qweight, 'dtype', type(qweight).__name__)} "
                         f"{tuple(getattr(qweight, 'shape', ()))}")
    N, K = qweight.shape
    if K == 0:
        raise ValueError("qweight has no input features (K = 0)")
    if qweight.numel() > _MAX_ELEMENTS:
        raise ValueError(f"qweight has {qweight.numel()} elements; at most 2**31 - 1 supported")
    _check_x(x, K)
    if qweight.device != x.device:
        raise ValueError(f"qweight is on {qweight.device} but x is on {x.device}")
    _check_float("scales", scales, (N,), x.device)
    if bias is not None:
        _check_float("bias", bias, (N,), x.device)
    x2, lead = _flatten(x, K)
    return x2, lead, N, K


def check_w4a16_args(x, qweight, scales, zeros, group_size, bias):
    """Validate a w4a16 call; returns (x as [M, K], leading dims of x, N, K)."""
    if not isinstance(qweight, torch.Tensor) or qweight.dtype != torch.uint8 or qweight.dim() != 2:
        raise ValueError(f"w4a16 qweight must be a 2-D uint8 tensor [N, K // 2] of packed "
                         f"nibbles, got {getattr(qweight, 'dtype', type(qweight).__name__)} "
                         f"{tuple(getattr(qweight, 'shape', ()))}")
    N, K = qweight.shape[0], 2 * qweight.shape[1]
    if K == 0:
        raise ValueError("qweight has no input features (K = 0)")
    if qweight.numel() > _MAX_ELEMENTS:
        raise ValueError(f"qweight has {qweight.numel()} elements; at most 2**31 - 1 supported")
    if isinstance(x, torch.Tensor) and x.dim() >= 1 and x.shape[-1] % 2:
        raise ValueError(f"w4 packs two codes per byte along K, so K must be even; x has "
                         f"K = {x.shape[-1]}")
    _check_x(x, K)
    _check_group(group_size, K)
    if qweight.device != x.device:
        raise ValueError(f"qweight is on {qweight.device} but x is on {x.device}")
    _check_float("scales", scales, (N, K // group_size), x.device)
    _check_float("zeros", zeros, (N, K // group_size), x.device)
    if bias is not None:
        _check_float("bias", bias, (N,), x.device)
    x2, lead = _flatten(x, K)
    return x2, lead, N, K


# ---- the references ----------------------------------------------------------------------------
def w8a16_matmul_ref(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                     bias: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ (qweight * scales[:, None]).T (+ bias), computed in float32, returned in x.dtype."""
    x2, lead, N, _ = check_w8a16_args(x, qweight, scales, bias)
    y = x2.float() @ dequantize_w8(qweight, scales).T
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype).reshape(*lead, N)


def w4a16_matmul_ref(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                     zeros: torch.Tensor, group_size: int,
                     bias: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ W.T (+ bias) with W = (unpack(qweight) - zeros) * scales per group, in float32."""
    x2, lead, N, _ = check_w4a16_args(x, qweight, scales, zeros, group_size, bias)
    y = x2.float() @ dequantize_w4(qweight, scales, zeros, group_size).T
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype).reshape(*lead, N)
