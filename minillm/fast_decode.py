"""A decode step with packed weights: the same model, fewer and friendlier memory reads.

At batch 1 a decode step is a chain of matrix-vector products: every weight is read once to do
2 FLOPs per weight, so the step is bound by memory bandwidth (lab 01), and on a CPU also by the
per-operator overhead of ~45 small matmuls and ~150 elementwise ops. `PackedDecoder` keeps the
model's arithmetic and changes only the bookkeeping:

* q/k/v projections are one [D, (N + 2K) H] matrix and gate/up one [D, 2F] matrix, so a layer
  does 4 matmuls instead of 7;
* every matrix is stored transposed ([in, out], contiguous), which the CPU BLAS streams faster for
  a single row of activations (layout="in_out", the default); for scoring a few tokens at once
  (speculative decoding) PyTorch's own [out, in] layout is faster (layout="out_in") -- measure
  both with your BLAS;
* RoPE cos/sin come from a table built once, and q and k rotate in one op;
* no nn.Module dispatch: the step is a plain loop over layers.

Keys and values still go through the same `KVCache` (`cache.update` / `cache.advance`), so the
packed decoder and `Transformer.forward` can share one cache: prefill with the model, decode with
the packed step. It is a *snapshot* of the weights: build a new one after changing the model.
Only plain (full-attention, MHA/GQA/MQA) layers are supported; anything else is refused.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .model import Attention, apply_rope, causal_mask, rope_cos_sin, sdpa


class PackedDecoder:
    def __init__(self, model, layout: str = "in_out"):
        if layout not in ("in_out", "out_in"):
            raise ValueError(f"layout must be 'in_out' or 'out_in', got {layout!r}")
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
                qkv = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])
                qkv_b = (torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias])
                         if a.q_proj.bias is not None else None)
                self.layers.append(dict(
                    ln1=layer.input_layernorm.weight.detach(), ln2=layer.post_attention_layernorm.weight.detach(),
                    eps1=layer.input_layernorm.eps, eps2=layer.post_attention_layernorm.eps,
                    qkv=self._store(qkv), qkv_b=qkv_b,
                    o=self._store(a.o_proj.weight), o_b=a.o_proj.bias,
                    gu=self._store(torch.cat([m.gate_proj.weight, m.up_proj.weight])),
                    gu_b=(torch.cat([m.gate_proj.bias, m.up_proj.bias])
                          if m.gate_proj.bias is not None else None),
                    down=self._store(m.down_proj.weight), down_b=m.down_proj.bias))
            self.embed = model.embed_tokens.weight.detach()
            self.norm, self.norm_eps = model.norm.weight.detach(), model.norm.eps
            self.lm_head = self._store(model.lm_head.weight)
            pos = torch.arange(c.max_seq_len, device=self.embed.device)
            self.cos, self.sin = rope_cos_sin(pos, c.head_dim, c.rope_theta, self.embed.dtype)

    def _store(self, w_out_in: torch.Tensor) -> torch.Tensor:
        w = w_out_in.detach()
        return (w.t() if self.layout == "in_out" else w).contiguous()

    def _mm(self, x, w, b):
        if self.layout == "out_in":
            return F.linear(x, w, b)
        return x @ w if b is None else torch.addmm(b, x, w)

    def _rms(self, x, w, eps):
        return w * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)

    @torch.no_grad()
    def step(self, ids: torch.Tensor, cache) -> torch.Tensor:
        """One decode step. ids [B] (the newest token of each row) -> logits [B, V]; or a few
        tokens at once, ids [B, T] -> logits [B, T, V] (e.g. verifying speculative drafts)."""
        c = self.config
        N, K, H = c.n_heads, c.n_kv_heads, c.head_dim
        single = ids.dim() == 1
        ids = ids[:, None] if single else ids
        B, T = ids.shape
        p = cache.seq_len
        if p + T > c.max_seq_len:
            raise ValueError(f"positions {p}..{p + T - 1} run past the model's context of "
                             f"{c.max_seq_len}")
        positions = cache.positions[p:p + T]
        cos, sin = self.cos[p:p + T], self.sin[p:p + T]
        mask = None
        if T > 1:          # new tokens see the cache and each other causally
            mask = causal_mask(positions, cache.positions[:p + T])
        x = self.embed[ids].reshape(B * T, -1)                        # [B*T, D]
        for i, w in enumerate(self.layers):
            h = self._rms(x, w["ln1"], w["eps1"])
            qkv = self._mm(h, w["qkv"], w["qkv_b"]).view(B, T, -1).transpose(1, 2)  # [B, ., T]
            qk = apply_rope(qkv[:, :(N + K) * H].reshape(B, N + K, H, T).transpose(2, 3),
                            cos, sin)                                  # one rotation for q, k
            q, k = qk[:, :N], qk[:, N:]
            v = qkv[:, (N + K) * H:].reshape(B, K, H, T).transpose(2, 3)
            k_all, v_all, _ = cache.update(i, k, v, positions)
            att = sdpa(q, k_all, v_all, attn_mask=mask)                 # [B, N, T, H]
            x = x + self._mm(att.transpose(1, 2).reshape(B * T, N * H), w["o"], w["o_b"])
            h = self._rms(x, w["ln2"], w["eps2"])
            gate, up = self._mm(h, w["gu"], w["gu_b"]).chunk(2, dim=-1)
            x = x + self._mm(F.silu(gate) * up, w["down"], w["down_b"])
        cache.advance(positions)
        logits = self._mm(self._rms(x, self.norm, self.norm_eps), self.lm_head, None)
        return logits.view(B, -1) if single else logits.view(B, T, -1)


@torch.no_grad()
def generate_packed(model, prompt: torch.Tensor, max_new_tokens: int,
                    decoder: PackedDecoder | None = None) -> list[list[int]]:
    """Greedy decode: prefill with the model, then packed decode steps (same KVCache)."""
    from .kvcache import KVCache
    decoder = decoder or PackedDecoder(model)
    cache = KVCache.for_model(model, prompt.shape[0], prompt.shape[1] + max_new_tokens)
    nxt = model(prompt, cache=cache, last_only=True)[:, -1].argmax(-1)
    out = [nxt]
    for _ in range(max_new_tokens - 1):
        nxt = decoder.step(nxt, cache).argmax(-1)
        out.append(nxt)
    return torch.stack(out, 1).tolist()
