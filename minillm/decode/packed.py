"""A decode step with packed weights: the same model, fewer and friendlier memory reads.

At batch 1 a decode step is a chain of matrix-vector products: every weight is read once to do
2 FLOPs per weight, so the step is bound by memory bandwidth (lab 01), and on a CPU also by the
per-operator overhead of ~45 small matmuls and ~150 elementwise ops. `PackedDecoder` keeps the
model's arithmetic and changes only the bookkeeping:

* q/k/v projections are one [D, (N + 2K) H] matrix and gate/up one [D, 2F] matrix, so a layer
  does 4 matmuls instead of 7;
* every matrix is stored transposed ([in, out], contiguous), which the CPU BLAS streams faster for
  a single row of activations (layout="in_out", the default); PyTorch's own [out, in] layout is
  layout="out_in"; for scoring a few tokens at once (speculative decoding) on a CPU,
  layout="onednn" stores every matrix in oneDNN's blocked format, whose small-batch matmul can
  beat the plain BLAS call for 3-8 rows on some CPUs (and is slower for one) -- measure with your
  BLAS (`onednn_available()` says whether this torch build has it);
* RoPE cos/sin come from a table built once (the sign of the rotation folded into the sin table),
  and q and k rotate in one op;
* residual adds ride on the matmul (addmm), the RMSNorm weight on the fused norm (fp32);
* no nn.Module dispatch: the step is a plain loop over layers.

Fewer ops matter as much as fewer bytes here: a decode step of the shipped 1.3M-parameter draft
model is mostly per-op overhead (a few microseconds each), not arithmetic.

The layer itself is `Step.layer` (step.py), shared with the compiled and graph decoders. Keys
and values still go through the same `KVCache` (`cache.update` / `cache.advance`), so the
packed decoder and `Transformer.forward` can share one cache: prefill with the model, decode with
the packed step. It is a *snapshot* of the weights: build a new one after changing the model.
Only plain (full-attention, MHA/GQA/MQA) layers are supported; anything else is refused.
Quantized projections (`minillm.quant.QuantLinear`, layout "out_in" only) are merged with
`QuantLinear.cat` and run through their own forward (torch's packed CPU kernels).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..model import Attention, causal_mask, require_softmax_decoder, sdpa
from ..quant import QuantLinear
from .step import Step, rope_tables

LAYOUTS = ("in_out", "out_in", "onednn")
ONEDNN_ROWS = 5       # the batch of rows oneDNN's weight packing is tuned for (k + 1 drafts)

_onednn_pack = getattr(torch.ops.mkldnn, "_reorder_linear_weight", None)
_onednn_linear = getattr(torch.ops.mkldnn, "_linear_pointwise", None)
_ONEDNN_OK: bool | None = None


def onednn_available() -> bool:
    """Whether this torch build can pack weights for oneDNN's CPU matmul and gets the same
    answer as F.linear with them (checked once, on a small product)."""
    global _ONEDNN_OK
    if _ONEDNN_OK is None:
        _ONEDNN_OK = False
        if _onednn_pack is not None and _onednn_linear is not None and \
                torch.backends.mkldnn.is_available():
            try:
                g = torch.Generator().manual_seed(0)
                w, x = torch.randn(24, 16, generator=g), torch.randn(3, 16, generator=g)
                got = _onednn_linear(x, _onednn_pack(w, 3), None, "none", [], "")
                _ONEDNN_OK = bool(torch.allclose(got, F.linear(x, w), atol=1e-5, rtol=1e-5))
            except (RuntimeError, TypeError, NotImplementedError):
                _ONEDNN_OK = False
    return _ONEDNN_OK


class PackedDecoder(Step):
    def __init__(self, model, layout: str = "in_out"):
        require_softmax_decoder(model, "PackedDecoder")
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        if layout == "onednn":
            device = next(model.parameters()).device
            if device.type != "cpu" or not onednn_available():
                raise ValueError(f"layout 'onednn' needs a CPU model and a torch build with "
                                 f"oneDNN's linear ops (model on {device})")
        self.layout = layout
        self.config = c = model.config
        for i, layer in enumerate(model.layers):
            attn = layer.self_attn
            if type(attn) is not Attention or attn.window is not None:
                raise ValueError(f"PackedDecoder supports plain full-attention layers only; layer "
                                 f"{i} is {type(attn).__name__} (window={attn.window})")
        self.layers = []
        with torch.no_grad():
            for layer in model.layers:
                a, m = layer.self_attn, layer.mlp
                qkv, qkv_b = self._pack([a.q_proj, a.k_proj, a.v_proj])
                o, o_b = self._pack([a.o_proj])
                gu, gu_b = self._pack([m.gate_proj, m.up_proj])
                down, down_b = self._pack([m.down_proj])
                self.layers.append(dict(
                    ln1=layer.input_layernorm.weight.detach(), ln2=layer.post_attention_layernorm.weight.detach(),
                    eps1=layer.input_layernorm.eps, eps2=layer.post_attention_layernorm.eps,
                    qkv=qkv, qkv_b=qkv_b, o=o, o_b=o_b, gu=gu, gu_b=gu_b, down=down,
                    down_b=down_b))
            self.embed = model.embed_tokens.weight.detach()
            self.norm, self.norm_eps = model.norm.weight.detach(), model.norm.eps
            self.lm_head, _ = self._pack([model.lm_head])
            self.cos, self.sin_signed = rope_tables(c, self.embed.device, self.embed.dtype)

    def _pack(self, linears) -> tuple:
        """(matrix, bias) of projections that read the same input, as one product: nn.Linear
        weights concatenated and stored in the layout, or quantized layers (minillm.quant)
        merged into one QuantLinear (its bias inside; layout "out_in" only)."""
        if all(isinstance(lin, QuantLinear) for lin in linears):
            if self.layout != "out_in":
                raise ValueError(f"quantized projections run in layout 'out_in' only (their "
                                 f"kernels read [out, in] codes); got layout {self.layout!r}")
            return QuantLinear.cat(linears), None
        if not all(isinstance(lin, torch.nn.Linear) for lin in linears):
            raise ValueError(f"PackedDecoder packs nn.Linear or QuantLinear projections, got "
                             f"{', '.join(type(lin).__name__ for lin in linears)}")
        w = torch.cat([lin.weight for lin in linears])
        b = torch.cat([lin.bias for lin in linears]) if linears[0].bias is not None else None
        return self._store(w), b

    def _store(self, w_out_in: torch.Tensor) -> torch.Tensor:
        w = w_out_in.detach()
        if self.layout == "onednn":
            return _onednn_pack(w.contiguous(), ONEDNN_ROWS)
        return (w.t() if self.layout == "in_out" else w).contiguous()

    def mm(self, x, w, b):
        if isinstance(w, QuantLinear):
            return w(x)
        if self.layout == "out_in":
            return F.linear(x, w, b)
        if self.layout == "onednn":
            return _onednn_linear(x, w, b, "none", [], "")
        return x @ w if b is None else torch.addmm(b, x, w)

    def mm_add(self, x, a, w, b):
        """x + a @ W (+ b): the residual add fused into the matmul where the layout allows."""
        if self.layout == "in_out" and b is None:
            return torch.addmm(x, a, w)
        return x + self.mm(a, w, b)

    @torch.no_grad()
    def step(self, ids: torch.Tensor, cache) -> torch.Tensor:
        """One decode step. ids [B] (the newest token of each row) -> logits [B, V]; or a few
        tokens at once, ids [B, T] -> logits [B, T, V] (e.g. verifying speculative drafts)."""
        c = self.config
        N, H = c.n_heads, c.head_dim
        single = ids.dim() == 1
        ids = ids[:, None] if single else ids
        B, T = ids.shape
        p = cache.seq_len
        if p + T > c.max_seq_len:
            raise ValueError(f"positions {p}..{p + T - 1} run past the model's context of "
                             f"{c.max_seq_len}")
        positions = cache.positions[p:p + T]
        cos, sin = self.cos[p:p + T, None], self.sin_signed[p:p + T, None]     # [T, 1, H]
        if B > 1:                                                     # one table row per token
            cos, sin = cos.repeat(B, 1, 1), sin.repeat(B, 1, 1)
        mask = None
        if T > 1:          # new tokens see the cache and each other causally
            mask = causal_mask(positions, cache.positions[:p + T])

        def attend(i, q, k, v):                       # [B*T, heads, H] -> [B, heads, T, H]
            if T == 1:                                # a decode step: fewer ops for the same
                q, k, v = q.unsqueeze(2), k.unsqueeze(2), v.unsqueeze(2)
            else:
                q, k, v = (t.view(B, T, -1, H).transpose(1, 2) for t in (q, k, v))
            k_all, v_all, _ = cache.update(i, k, v, positions)
            att = sdpa(q, k_all, v_all, attn_mask=mask)                  # [B, N, T, H]
            return (att if T == 1 else att.transpose(1, 2)).reshape(B * T, N * H)

        logits = self.run(self.embed[ids].reshape(B * T, -1), cos, sin, attend)
        cache.advance(positions)
        return logits.view(B, -1) if single else logits.view(B, T, -1)


@torch.no_grad()
def generate_packed(model, prompt: torch.Tensor, max_new_tokens: int,
                    decoder: PackedDecoder | None = None) -> list[list[int]]:
    """Greedy decode: prefill with the model, then packed decode steps (same KVCache)."""
    from ..kvcache import KVCache
    decoder = decoder or PackedDecoder(model)
    cache = KVCache.for_model(model, prompt.shape[0], prompt.shape[1] + max_new_tokens)
    nxt = model(prompt, cache=cache, last_only=True)[:, -1].argmax(-1)
    out = [nxt]
    for _ in range(max_new_tokens - 1):
        nxt = decoder.step(nxt, cache).argmax(-1)
        out.append(nxt)
    return torch.stack(out, 1).tolist()
