"""One decode step of a Llama-family decoder, written once for every fast decoder.

`Transformer.forward` (minillm/model.py) is the readable reference: modules, any cache, any
layer kind. The fast decoders run the same arithmetic on weights packed once (q/k/v and gate/up
each one matrix) and differ only in *how* they run this step:

* `PackedDecoder` (packed.py): op by op, any batch and a few tokens per row, in a layout chosen
  for the CPU's BLAS, keys and values in a `KVCache`;
* `CompiledDecoder` (compiled.py): one token, the whole step handed to `torch.compile`;
* `GraphDecoder` (graph.py): one token on fixed buffers, which a CUDA graph records.

Each is a `Step`: it holds the packed weights, says how to multiply by a matrix (`mm`), and
passes `run` an `attend(i, q, k, v)` that writes layer i's new keys and values into its own
cache and attends over everything cached. A change to the layer (a norm, RoPE, the MLP) is made
here once; tests/test_decode.py changes a line of `layer` and checks that every decoder follows.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..model import rope_cos_sin


class Step:
    """The step over packed weights. A decoder sets `config`, `layers` (one dict per layer:
    `ln1`, `eps1`, `qkv`, `qkv_b`, `o`, `o_b`, `ln2`, `eps2`, `gu`, `gu_b`, `down`, `down_b`),
    `norm`, `norm_eps` and `lm_head`, and defines `mm`."""

    def mm(self, a: torch.Tensor, w, b) -> torch.Tensor:
        """a [R, in] times the matrix w (with bias b, or None) -> [R, out]."""
        raise NotImplementedError

    def mm_add(self, x: torch.Tensor, a: torch.Tensor, w, b) -> torch.Tensor:
        """x + a times w (+ b): a decoder may fuse the residual add into its product."""
        return x + self.mm(a, w, b)

    def run(self, x: torch.Tensor, cos, sin_signed, attend) -> torch.Tensor:
        """x [R, D]: the embeddings of R new tokens -> logits [R, V]. cos, sin_signed: each
        row's rotary tables ([R, 1, H]; for one token also [1, H] or [H]), from `rope_tables`."""
        for i, w in enumerate(self.layers):
            x = self.layer(i, w, x, cos, sin_signed, attend)
        return self.mm(rms(x, self.norm, self.norm_eps), self.lm_head, None)

    def layer(self, i: int, w: dict, x, cos, sin_signed, attend):
        """One decoder layer: x + attention(norm(x)), then + SwiGLU(norm(x))."""
        c = self.config
        N, K, H = c.n_heads, c.n_kv_heads, c.head_dim
        qkv = self.mm(rms(x, w["ln1"], w["eps1"]), w["qkv"], w["qkv_b"]).view(-1, N + 2 * K, H)
        qk = rotate(qkv[:, :N + K], cos, sin_signed)          # RoPE on q and k in one op
        att = attend(i, qk[:, :N], qk[:, N:], qkv[:, N + K:])  # [R, N * H]
        x = self.mm_add(x, att, w["o"], w["o_b"])
        gate, up = self.mm(rms(x, w["ln2"], w["eps2"]), w["gu"], w["gu_b"]).chunk(2, -1)
        return self.mm_add(x, F.silu(gate) * up, w["down"], w["down_b"])


def rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm as the model computes it (fp32), one fused op for fp32 activations."""
    if x.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), weight.float(), eps)
    return weight * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """`model.apply_rope` with the rotation's sign folded into the sin table:
    x cos + cat(-x2, x1) sin == x cos + roll(x, H/2) sin_signed, one op fewer."""
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, -1), sin_signed)


def rope_tables(config, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin_signed [max_seq_len, H] for every position, built once per decoder."""
    pos = torch.arange(config.max_seq_len, device=device)
    cos, sin = rope_cos_sin(pos, config.head_dim, config.rope_theta, dtype)
    half = config.head_dim // 2
    return cos, torch.cat([-sin[:, :half], sin[:, half:]], dim=-1)
