"""How fast decode could be: bytes per token over the memory's read bandwidth.

At batch 1 a decode step multiplies one row of activations by every weight matrix: each weight is
read once and used for 2 FLOPs, so the step is memory-bound (lab 01) and

    time per token  >=  bytes read per step / read bandwidth.

`step_bytes` counts the bytes a packed decode step reads, from the tensors it holds (every weight
matrix, the norm weights, one embedding row) plus the keys and values of the context it attends to.
`read_bandwidth` measures how fast this machine reads a buffer of that size (a median of
`buf.sum()` over a float32 buffer: one pass, no writes). The buffer size matters: a model that
fits in the CPU's last-level cache stays there between steps, and so does a buffer of the same
size, so the figure is the bandwidth the step itself can get. `reader` is the same read as a
function to time interleaved with decoders; `decode_limit` and `bandwidth_report` put bytes and
bandwidth together.
"""
from __future__ import annotations

import torch

from ..kvcache import KVSpec, kv_bytes_per_token
from .timing import median, time_interleaved


def read_bandwidth(nbytes: int, repeats: int = 9) -> float:
    """Bytes per second this CPU reads from a buffer of `nbytes` (the median of `repeats` timed
    passes of a `reader` after a warm-up pass; the current torch thread count)."""
    times = time_interleaved({"read": reader(nbytes, 1)}, warmup=1, repeats=repeats)
    return nbytes // 4 * 4 / median(times["read"])


def nbytes(obj) -> int:
    """Bytes a decoder's weight holds: a tensor; a module's parameters and buffers (QuantLinear);
    a tuple of tensors; anything with an `nbytes` (kernels' packed formats); else 0 (a float)."""
    if isinstance(obj, torch.Tensor):
        return obj.nbytes
    if isinstance(obj, torch.nn.Module):
        return sum(t.nbytes for t in [*obj.parameters(), *obj.buffers()])
    if isinstance(obj, tuple):
        return sum(nbytes(t) for t in obj)
    return int(getattr(obj, "nbytes", 0))


def step_bytes(decoder, context_len: float, batch: int = 1, kv_per_token=None) -> dict:
    """Bytes one packed decode step reads at a context of `context_len` positions, counted from
    the tensors `decoder` (a `PackedDecoder` or `CompiledDecoder`, float or quantized weights)
    holds: every weight matrix and bias (codes, scales and zeros), the norm
    weights, `batch` embedding rows and the cache's keys and values (`batch` sequences, after
    appending the new token). `kv_per_token(config, bytes_per_value)`: the cache bytes one
    token adds over all layers (default: `minillm.kvcache.kv_bytes_per_token` of the plain
    layers; lab 02 passes the student's `kv_bytes_per_token`)."""
    if context_len < 0:
        raise ValueError(f"context_len must be >= 0, got {context_len}")
    c = decoder.config
    weights = sum(nbytes(t) for layer in decoder.layers for t in layer.values())
    weights += nbytes(decoder.norm) + nbytes(decoder.lm_head)
    embed = batch * decoder.embed[0].nbytes
    if kv_per_token is None:
        specs = [KVSpec(c.n_kv_heads, c.head_dim, c.head_dim)] * c.n_layers   # plain layers only
        per_token = kv_bytes_per_token(specs, decoder.embed.element_size())
    else:
        per_token = kv_per_token(c, decoder.embed.element_size())
    kv = batch * (context_len + 1) * per_token
    return {"weight_bytes": weights, "embedding_bytes": embed, "kv_bytes": kv,
            "bytes_per_step": weights + embed + kv}


def decode_limit(bytes_per_step: float, bandwidth: float, batch: int = 1) -> float:
    """The memory-bound ceiling in tokens per second: `batch` tokens per step read at
    `bandwidth`."""
    return batch * bandwidth / bytes_per_step


def reader(nbytes: int, passes: int):
    """A function that reads a float32 buffer of `nbytes` bytes `passes` times: time it beside a
    decode of `passes` steps (interleaved, `minillm.bench.timing`) and the two share the machine's state
    (load, frequency, what else holds the cache) at every round."""
    if nbytes < 4096 or passes < 1:
        raise ValueError(f"need nbytes >= 4096 and passes >= 1, got {nbytes}, {passes}")
    buf = torch.ones(int(nbytes) // 4, dtype=torch.float32)

    def read():
        for _ in range(passes):
            buf.sum()
    return read


def bandwidth_report(bytes_per_token: float, tokens: int, read_seconds: float,
                     speeds: dict[str, float]) -> dict:
    """The bandwidth figures of a decode benchmark: `read_seconds` is the median time a `reader`
    took to read `tokens * bytes_per_token` bytes; `speeds` maps a variant name to its tokens/s.
    Returns bytes_per_token, read_gb_s, limit_tok_s and `<name>_bandwidth_fraction` (tokens/s
    over the limit) per variant."""
    bandwidth = tokens * bytes_per_token / read_seconds
    limit = decode_limit(bytes_per_token, bandwidth)
    out = {"bytes_per_token": bytes_per_token, "read_gb_s": bandwidth / 1e9, "limit_tok_s": limit}
    for name, tok_s in speeds.items():
        out[f"{name}_bandwidth_fraction"] = tok_s / limit
    return out
