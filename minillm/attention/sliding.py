"""Sliding-window (local) attention mixed with a few global layers.

A local layer lets the query at position p attend only to the last `window` positions
(p - window, p]. Its cache never needs more than `window` entries: `KVCache` gives such a layer a
ring buffer of `window` slots (slot = position % window), so its memory is flat in the sequence
length, while a global layer's cache grows linearly. Stacking local layers still lets information
travel further -- the receptive field grows by about `window` per layer (Longformer, Mistral 7B).

Local-only models lose long-range recall, so production models interleave: character.ai runs one
global layer for every six (five local, one global), together with cross-layer KV sharing. With
L layers of which G are global, the cache at sequence length S holds

    G * S + (L - G) * min(window, S)        tokens' worth of K/V,

i.e. about G/L of the all-global cost once S >> window.

Here a layer is local simply by setting `attn.window`; `minillm.model.attend` masks by window
(with or without a cache) and `KVCache` sizes the ring from `kv_spec().window`. Converting a
model trained with full attention this way costs quality only on text longer than the window --
and little even then: on the shipped model (8192 held-out tokens in windows of 512) windows of 128
and 64 with one global layer in six move perplexity from 49.5 to 49.7 and 50.2.
"""
from __future__ import annotations

import copy
import operator

from ..kvcache import layer_specs


def to_sliding(model, window: int, global_every: int = 6):
    """A new model whose layers i with (i + 1) % global_every == 0 stay global (window None) and
    all others attend to the last `window` positions. The input model is not modified."""
    if not isinstance(window, int) or isinstance(window, bool) or window < 1:
        raise ValueError(f"window must be a positive integer (tokens), got {window!r}")
    if not isinstance(global_every, int) or isinstance(global_every, bool) or global_every < 1:
        raise ValueError(f"global_every must be a positive integer, got {global_every!r}")
    for i, layer in enumerate(model.layers):
        attn = layer.self_attn
        if not hasattr(attn, "window"):
            raise ValueError(f"layer {i} ({type(attn).__name__}) has no `window` attribute")
        if hasattr(attn, "shared"):
            raise ValueError(f"layer {i} shares keys/values across layers (CLA); apply "
                             f"to_sliding before to_cla so every group gets one window")
    new = copy.deepcopy(model)
    for i, layer in enumerate(new.layers):
        layer.self_attn.window = None if (i + 1) % global_every == 0 else window
    return new


def cache_bytes_vs_length(model, lengths, bytes_per_elem: int = 2) -> list[int]:
    """Bytes of K/V a `KVCache` for `model` holds per sequence at each length in `lengths`.

    Full layers cost length * elems_per_token; a window-w layer min(w, length) * elems_per_token
    (its ring); a layer without storage (a CLA consumer) nothing.
    """
    if not isinstance(bytes_per_elem, int) or bytes_per_elem < 1:
        raise ValueError(f"bytes_per_elem must be a positive integer, got {bytes_per_elem!r}")
    try:
        lengths = [operator.index(n) for n in lengths]
    except TypeError:
        raise ValueError(f"lengths must be integers, got {lengths!r}") from None
    if any(n < 0 for n in lengths):
        raise ValueError(f"lengths must be >= 0, got {lengths}")
    specs = [s for s in layer_specs(model) if s is not None]
    out = []
    for n in lengths:
        tokens = [n if s.window is None else min(s.window, n) for s in specs]
        out.append(sum(t * s.elems_per_token() * bytes_per_elem for t, s in zip(tokens, specs)))
    return out
