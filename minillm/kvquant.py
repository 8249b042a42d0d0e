"""An int8 KV cache: store keys and values in 8 bits, dequantize them when attention reads them.

Weight quantization (quant.py) shrinks what every decode step reads *once per batch*; the KV
cache is read *once per sequence* and outgrows the weights at long contexts and large batches
(labs 02, 03). Quantizing it halves the cache's bytes against fp16/bf16 (quarters them against
fp32), so twice as many sequences fit next to the weights and each step reads half the cache.

Format: every key (and value) vector of one token in one head -- H numbers -- gets its own
absmax scale,

    s = max_i |x_i| / 127,     q_i = round(x_i / s)  in  -127..127  (int8),    x_i ~ q_i * s,

so a token with large activations does not crush the resolution of the others. The scale is
stored in fp16 (2 bytes per H numbers: with H = 64 the cache is 66 / 128 = 52 % of fp16; vectors
whose largest entry is below ~8e-3 get a subnormal fp16 scale, coarser in relative terms but still
within ~1e-7 in absolute terms).
Keys and values are quantized when they are written, right after RoPE; attention always reads
the dequantized prefix -- also during prefill -- so perplexity measured with this cache is what
a decode with it would see.

`Int8KVCache` reuses `KVCache` (kvcache.py) unchanged for the int8 codes, and a second, tiny
`KVCache` with one number per head and token for the scales: the same in-place writes and ring
buffers (sliding-window layers) for both, nothing forked.

    cache = Int8KVCache.for_model(model, batch_size=1, max_len=256)
    logits = model(prompt_ids, cache=cache)              # as with KVCache

`with_kv_cache(model, Int8KVCache)` wraps a model so that every forward pass runs through a
fresh cache (what `evaluate.perplexity` needs to measure the cache's cost).
"""
from __future__ import annotations

import torch
import torch.nn as nn

from .kvcache import KVCache, KVSpec, kv_bytes_per_token

SCALE_DTYPE = torch.float16


def quantize_kv(x: torch.Tensor, scale_dtype=SCALE_DTYPE):
    """Per-vector absmax int8 over the last dimension: x [..., H] -> (q int8 [..., H],
    s [..., 1] in scale_dtype) with x ~ q * s. The scale is rounded to scale_dtype first and the
    codes are computed with the rounded scale, so dequantizing uses exactly the scale that was
    quantized with."""
    if not x.is_floating_point():
        raise ValueError(f"quantize_kv expects floating-point keys/values, got {x.dtype}")
    amax = x.detach().float().abs().amax(dim=-1, keepdim=True)
    tiny = torch.finfo(scale_dtype).tiny
    s = (amax / 127).to(scale_dtype).clamp(min=tiny)
    q = torch.round(x.float() / s.float()).clamp(-127, 127).to(torch.int8)
    return q, s


def dequantize_kv(q: torch.Tensor, s: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """q [..., H] int8, s [..., 1] -> q * s in `dtype`."""
    return (q.float() * s.float()).to(dtype)


class Int8KVCache(KVCache):
    """A `KVCache` whose keys and values are int8 with one fp16 absmax scale per token, head and
    layer (per-token-per-head). Plugs into `Transformer.forward(cache=)` like `KVCache`;
    `dtype` is the dtype attention computes in (the dequantized keys/values it gets back).
    `quantize` is the per-vector quantizer (a subclass may swap in its own, as lab 04 does)."""

    def __init__(self, specs, batch_size: int, max_len: int, dtype=torch.float32, device="cpu",
                 scale_dtype=SCALE_DTYPE):
        if not torch.empty((), dtype=dtype).is_floating_point():
            raise ValueError(f"dtype is the dtype attention computes in and must be floating "
                             f"point, got {dtype}")
        super().__init__(specs, batch_size, max_len, dtype=torch.int8, device=device)
        self.compute_dtype, self.scale_dtype = dtype, scale_dtype
        # one scale per (token, head) for keys and one for values, with the same slots (and
        # ring buffers) as the codes
        scale_specs = [None if s is None else KVSpec(s.heads, 1, 1, s.window) for s in specs]
        self.scales = KVCache(scale_specs, batch_size, max_len, dtype=scale_dtype,
                              device=device)

    def quantize(self, x: torch.Tensor, scale_dtype):
        """(codes, scales) of the keys or values x [B, heads, T, dim]: `quantize_kv`."""
        return quantize_kv(x, scale_dtype)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor):
        """Quantize the new k, v [B, heads, T, dim], store codes and scales, and return every
        key/value this layer may attend to, dequantized to `dtype`, with their positions."""
        qk, sk = self.quantize(k, self.scale_dtype)
        qv, sv = self.quantize(v, self.scale_dtype)
        k_codes, v_codes, pos = super().update(layer, qk, qv, positions)
        k_scale, v_scale, _ = self.scales.update(layer, sk, sv, positions)
        return (dequantize_kv(k_codes, k_scale, self.compute_dtype),
                dequantize_kv(v_codes, v_scale, self.compute_dtype), pos)

    def advance(self, positions: torch.Tensor) -> None:
        super().advance(positions)
        self.scales.advance(positions)

    def truncate(self, n: int) -> None:
        super().truncate(n)
        self.scales.truncate(n)

    def reset(self) -> None:
        super().reset()
        self.scales.reset()

    @property
    def nbytes(self) -> int:
        """Bytes allocated: int8 codes plus the fp16 scales."""
        return super().nbytes + self.scales.nbytes

    def bytes_per_token(self) -> float:
        """Bytes per position per sequence of the full (non-ring) layers, scales included."""
        full = [s for s, sp in zip(self.specs, self.slot_pos) if s is not None and sp is None]
        scale_bytes = torch.empty((), dtype=self.scale_dtype).element_size()
        return (kv_bytes_per_token(full, 1)
                + sum(2 * s.heads for s in full) * scale_bytes)

    def __repr__(self) -> str:
        return (f"Int8KVCache(batch={self.batch_size}, max_len={self.max_len}, "
                f"seq_len={self.seq_len}, {self.nbytes / 2**20:.2f} MiB)")


class CachedForward(nn.Module):
    """`model` whose every forward pass runs through a fresh cache of `cache_cls` (so a whole
    sequence is prefilled through it and attention reads what the cache stores). Exposes the
    model's `config`, so `evaluate.perplexity(CachedForward(model, Int8KVCache), tok)` measures
    the cache's cost in perplexity."""

    def __init__(self, model: nn.Module, cache_cls=Int8KVCache):
        super().__init__()
        self.model, self.cache_cls = model, cache_cls
        self.config = model.config

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        cache = self.cache_cls.for_model(self.model, batch_size=ids.shape[0],
                                         max_len=ids.shape[1])
        return self.model(ids, cache=cache)


def with_kv_cache(model: nn.Module, cache_cls=Int8KVCache) -> CachedForward:
    """Shorthand for CachedForward(model, cache_cls)."""
    return CachedForward(model, cache_cls)
