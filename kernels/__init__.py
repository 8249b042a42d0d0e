"""Triton kernels, each beside a plain-torch reference with the same signature.

    from kernels import w4a16_matmul, w4a16_matmul_ref, quantize_w4
    qweight, scales, zeros = quantize_w4(weight, group_size=64)
    y = w4a16_matmul(x, qweight, scales, zeros, 64)     # Triton, fused dequantize + matmul
    y_ref = w4a16_matmul_ref(x, qweight, scales, zeros, 64)

Without a CUDA GPU the kernels run in Triton's CPU interpreter (kernels/interpret.py decides).
The package imports only torch and triton: `minillm` builds on it, never the other way.
"""
from .dequant_ref import (
    dequantize_w4,
    dequantize_w8,
    pack_int4,
    quantize_w4,
    quantize_w8,
    unpack_int4,
    w4a16_matmul_ref,
    w8a16_matmul_ref,
)
from .interpret import INTERPRET
from .intmath import cdiv, next_power_of_2
from .paged_attention_ref import (
    paged_attention_decode_ref,
    paged_attention_decode_split_ref,
    slot_mapping_ref,
    write_kv_ref,
)

try:
    from .dequant_matmul import w4a16_matmul, w8a16_matmul
    from .paged_attention import paged_attention_decode, paged_attention_decode_split, write_kv
except ImportError as err:  # triton is an optional dependency (pip install 'minillm[lab]')
    if (getattr(err, "name", None) or "").split(".")[0] != "triton":
        raise
    _missing = err

    def w8a16_matmul(*args, **kwargs):
        raise RuntimeError(f"w8a16_matmul needs Triton ({_missing}); use w8a16_matmul_ref")

    def w4a16_matmul(*args, **kwargs):
        raise RuntimeError(f"w4a16_matmul needs Triton ({_missing}); use w4a16_matmul_ref")

    def write_kv(*args, **kwargs):
        raise RuntimeError(f"write_kv needs Triton ({_missing}); use write_kv_ref")

    def paged_attention_decode(*args, **kwargs):
        raise RuntimeError(f"paged_attention_decode needs Triton ({_missing}); use "
                           f"paged_attention_decode_ref")

    def paged_attention_decode_split(*args, **kwargs):
        raise RuntimeError(f"paged_attention_decode_split needs Triton ({_missing}); use "
                           f"paged_attention_decode_split_ref")

__all__ = ["INTERPRET", "cdiv", "next_power_of_2", "pack_int4", "unpack_int4", "quantize_w8",
           "quantize_w4", "dequantize_w8", "dequantize_w4", "w8a16_matmul_ref", "w4a16_matmul_ref", "w8a16_matmul",
           "w4a16_matmul", "write_kv_ref", "slot_mapping_ref", "paged_attention_decode_ref",
           "paged_attention_decode_split_ref", "write_kv", "paged_attention_decode",
           "paged_attention_decode_split"]
