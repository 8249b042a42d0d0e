"""The weight formats the quantized layers store and the kernels read: round-to-nearest (RTN)
quantizers, int4 packing and dequantization.

  absmax (symmetric)   q = round(w / s) in [-qmax, qmax], s = max|w| / qmax, qmax = 2^(b-1) - 1
  zero-point           q = round(w / s) + z in [0, 2^b - 1], covering [min, max] (0 kept exact)
  group-wise           zero-point codes with one (s, z) per group of G consecutive input weights
  int4 packing         two 4-bit codes per byte along K: low nibble = even k, high = odd k

`minillm.quant` builds its layers (QuantLinear, LLM.int8(), AWQ) on these, and the Triton kernels
(kernels/dequant_matmul.py) decode exactly this layout; this module imports only torch so both
can depend on it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

__all__ = ["absmax_quantize", "zeropoint_quantize", "group_quantize", "group_quantize_int4",
           "dequantize", "pack_int4", "unpack_int4", "Formats", "COURSE_FORMATS"]


def _check_weight(w: torch.Tensor) -> None:
    if not isinstance(w, torch.Tensor) or not w.is_floating_point():
        raise ValueError(f"expected a floating-point weight tensor, got {type(w).__name__}"
                         f"{'' if not isinstance(w, torch.Tensor) else ' of ' + str(w.dtype)}")
    if not torch.isfinite(w).all():
        raise ValueError("weight contains NaN or inf: cannot quantize")


def absmax_quantize(w: torch.Tensor, bits: int = 8, per_channel: bool = True):
    """Symmetric: q = round(w / s) in [-(2^(b-1) - 1), 2^(b-1) - 1], s = max|w| / qmax.
    per_channel: one scale per output row (dim 0); else one for the tensor.
    Returns (q int8, s float32 of shape [rows, 1] or [])."""
    _check_weight(w)
    qmax = 2 ** (bits - 1) - 1
    w = w.float()
    amax = w.abs().amax(dim=-1, keepdim=True) if per_channel else w.abs().amax()
    s = amax.clamp(min=1e-12) / qmax
    q = torch.round(w / s).clamp(-qmax, qmax).to(torch.int8)
    return q, s


def zeropoint_quantize(w: torch.Tensor, bits: int = 8, per_channel: bool = True):
    """Asymmetric: codes q = round(w / s) + z in [0, 2^b - 1] cover [min, max] exactly.
    per_channel: one (s, z) per row of the last dimension (any leading dims); else one for the
    tensor. Returns (q uint8, s, z) with w ~ (q - z) * s."""
    _check_weight(w)
    return _zeropoint(w, bits, per_channel)


def _zeropoint(w: torch.Tensor, bits: int, per_channel: bool):
    if not isinstance(bits, int) or not 1 <= bits <= 8:
        raise ValueError(f"zero-point codes are stored in uint8: bits must be 1..8, got {bits!r}")
    levels = 2 ** bits - 1
    w = w.float()
    lo = w.amin(dim=-1, keepdim=True) if per_channel else w.amin()
    hi = w.amax(dim=-1, keepdim=True) if per_channel else w.amax()
    lo, hi = lo.clamp(max=0), hi.clamp(min=0)           # keep 0 exactly representable
    s = (hi - lo).clamp(min=1e-12) / levels
    z = torch.round(-lo / s)
    q = (torch.round(w / s) + z).clamp(0, levels).to(torch.uint8)
    return q, s, z


def group_quantize(w: torch.Tensor, group_size: int = 64, bits: int = 4):
    """Asymmetric `bits`-bit codes per group of `group_size` consecutive input weights of each
    row. Returns (codes uint8 [N, K], scales [N, K/G], zeros [N, K/G]); w ~ (q - z) * s."""
    _check_weight(w)
    if w.dim() != 2:
        raise ValueError(f"expected a 2-D weight [N, K], got shape {tuple(w.shape)}")
    N, K = w.shape
    if group_size < 2 or K % group_size:
        raise ValueError(f"group_size {group_size} must divide the {K} input features")
    g = w.float().reshape(N, K // group_size, group_size)
    q, s, z = _zeropoint(g, bits, per_channel=True)
    return q.reshape(N, K), s.squeeze(-1), z.squeeze(-1)


def group_quantize_int4(w: torch.Tensor, group_size: int = 64):
    """Asymmetric int4 (codes 0..15) per group of `group_size` consecutive input weights of each
    row. Returns (codes uint8 [N, K], scales [N, K/G], zeros [N, K/G]); w ~ (q - z) * s."""
    return group_quantize(w, group_size, bits=4)


def dequantize(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None = None,
               group_size: int | None = None) -> torch.Tensor:
    """The float weights the codes stand for: (q - z) * s, scales broadcast per group."""
    q = q.float()
    if group_size is not None:
        N, K = q.shape
        q = q.reshape(N, K // group_size, group_size)
        scale = scale.reshape(N, K // group_size, 1)
        zero = None if zero is None else zero.reshape(N, K // group_size, 1)
        out = (q - (zero if zero is not None else 0)) * scale
        return out.reshape(N, K)
    return (q - (zero if zero is not None else 0)) * scale


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """[N, K] codes in 0..15 -> uint8 [N, K // 2]; low nibble = even k, high nibble = odd k."""
    if not isinstance(codes, torch.Tensor) or codes.dim() != 2:
        raise ValueError(f"pack_int4 expects a 2-D [N, K] tensor of codes, got "
                         f"{getattr(codes, 'shape', type(codes).__name__)}")
    if codes.dtype.is_floating_point or codes.dtype.is_complex or codes.dtype == torch.bool:
        raise ValueError(f"int4 codes must be an integer tensor, got {codes.dtype}")
    if codes.shape[1] % 2:
        raise ValueError(f"int4 packing puts two codes per byte along K, so K must be even; "
                         f"got K = {codes.shape[1]}")
    if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) > 15):
        raise ValueError(f"int4 codes must lie in 0..15, got min {int(codes.min())} "
                         f"max {int(codes.max())}")
    c = codes.to(torch.uint8)
    return c[:, 0::2] | (c[:, 1::2] << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [N, K // 2] -> uint8 codes [N, K]; the inverse of pack_int4."""
    if not isinstance(packed, torch.Tensor) or packed.dim() != 2 or packed.dtype != torch.uint8:
        raise ValueError(f"unpack_int4 expects a 2-D uint8 tensor, got "
                         f"{getattr(packed, 'dtype', type(packed).__name__)} "
                         f"{tuple(getattr(packed, 'shape', ()))}")
    low, high = packed & 0x0F, packed >> 4
    return torch.stack([low, high], dim=-1).reshape(packed.shape[0], 2 * packed.shape[1])


@dataclass(frozen=True)
class Formats:
    """The format functions a quantized layer is built and read with (`minillm.quant`'s
    QuantLinear and quantize_model, `kernels.cpu_weight_only.pack_w4_cpu`): the course's
    (`COURSE_FORMATS`, the default) or one's own. Lab 04 builds its quantized models with the
    functions its student wrote, since its grading kernel withholds the course's.

      absmax_quantize(w [N, K])            -> (q int8 [N, K], s [N, 1]): int8 per output row
      group_quantize_int4(w, group_size)   -> (codes uint8 [N, K], scales, zeros [N, K / G])
      pack_int4(codes [N, K])              -> uint8 [N, K / 2]; unpack_int4, its inverse
      dequantize_groups(codes, scales, zeros, group_size) -> float32 [N, K]
    """
    absmax_quantize: Callable
    group_quantize_int4: Callable
    pack_int4: Callable
    unpack_int4: Callable
    dequantize_groups: Callable


COURSE_FORMATS = Formats(absmax_quantize, group_quantize_int4, pack_int4, unpack_int4, dequantize)
