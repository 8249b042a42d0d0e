"""Multi-head latent attention (MLA, DeepSeek-V2, arXiv 2405.04434): cache a small latent, not K/V.

Instead of caching N heads of keys and values, MLA projects each token down to one latent vector
c = W_down x of C dims and caches that; keys and values are linear functions of it,

    k_nope_h = W_uk_h c        v_h = W_uv_h c          (per head h, "up-projections")

DeepSeek-V2: N = 128 heads of H = 128 dims, C = 512. MHA would cache 2 * 128 * 128 = 32768 values
per token per layer; MLA caches 512 + 64 = 576 (the 64 is explained next), 57x fewer.

The RoPE wrinkle. With RoPE a score is q_h^T Rot(p_q - p_k) W_uk_h c: a position-dependent
rotation sits between the query and W_uk, so W_uk can no longer be folded into the query once
(the "absorbed" trick below) -- it would have to be re-done for every cached position.
DeepSeek's fix, "decoupled RoPE":
each query head gets R extra dims that carry RoPE, matched by ONE rotated key of R dims per token,
shared by all heads (d_h^R = 64 in DeepSeek-V2) and cached next to the latent -- hence 512 + 64.
Here a head of H dims is split into H - R "nope" dims (key from the latent, no rotation) and R
rope dims, so the attention scale stays 1/sqrt(H) like the MHA it replaces.

Two ways to compute the same thing:
  naive      expand k_nope and v for every cached position each step (N*(H-R) + N*H values per
             position -- the cache is small but the work is MHA-sized).
  absorbed   q_h . (W_uk_h c) = (W_uk_h^T q_h) . c: fold W_uk into the query once per step and
             attend in latent space, MQA-style -- one shared key [c, k_rope] of C + R dims and one
             shared value c for all heads; then apply each head's W_uv to its latent output.
             Nothing is up-projected per cached position. (DeepSeek also folds W_uv into o_proj.)

`to_mla` converts a trained MHA model without training. Per head it moves the R/2 highest-
frequency RoPE pairs (halves layout: pair i is dims i and i + H/2) to the end of the query and key
rows; the key's rope rows of all heads become the one shared rope key (their mean, or a rank-1
complex fit whose per-head factors move into the queries: rope_key="svd"); and one truncated SVD
of the stacked [W_k_nope ; W_v] gives W_down (top C right singular vectors) and the up-projections
(U S). At C = D the SVD is exact, so the only damage left is (1) one rope key shared by all heads
and (2) no rotation in the H - R low-frequency dims. Smaller C adds truncation error on top.
Measured on the shipped model (head_dim 64, 8192 held-out tokens, MHA ppl 49.5): dropping the
rotation alone costs ppl 91 at R = 16 and 55 at R = 32; sharing the mean rope key brings R = 32 to
about 121 (R = 16: 150), the "svd" key to 79; C from 384 down to 112 changes almost nothing.
Hence R = 32 = H/2 by default -- DeepSeek-V2's ratio too (64 of 128).
(DeepSeek-V2 also compresses the queries through a latent; that saves activations, not cache,
so it is left out.)
"""
from __future__ import annotations

import copy
import math

import torch
import torch.nn as nn

from ..kvcache import KVSpec
from ..model import Attention, apply_rope, attend

DEFAULT_ROPE_DIM = 32     # H/2 for our head_dim 64, chosen by held-out perplexity (see above)


def _check_dims(head_dim: int, latent_dim, rope_dim) -> None:
    if not isinstance(latent_dim, int) or isinstance(latent_dim, bool) or latent_dim < 1:
        raise ValueError(f"latent_dim must be a positive integer, got {latent_dim!r}")
    if (not isinstance(rope_dim, int) or isinstance(rope_dim, bool) or rope_dim < 2
            or rope_dim % 2 or rope_dim >= head_dim):
        raise ValueError(f"rope_dim must be an even integer in [2, head_dim={head_dim}), got "
                         f"{rope_dim!r}")


def _up_projected(attn, q_nope, q_rope, c, k_rope, q_pos, k_pos):
    """`MLAAttention.attend_naive`'s computation (see there)."""
    B, N, S = c.shape[0], attn.n_heads, c.shape[2]
    k_nope = attn.k_up(c[:, 0]).view(B, S, N, attn.nope_dim).transpose(1, 2)
    v = attn.v_up(c[:, 0]).view(B, S, N, attn.head_dim).transpose(1, 2)
    k = torch.cat([k_nope, k_rope.expand(B, N, S, attn.rope_dim)], dim=-1)
    q = torch.cat([q_nope, q_rope], dim=-1)
    return attend(q, k, v, q_pos, k_pos, attn.window)


class MLAAttention(nn.Module):
    """DeepSeek-V2 style attention whose cache holds a latent c [C] and a shared rope key [R].

    Cache layout (KVSpec(1, C, R)): the latent is stored as the "key" [B, 1, T, C] and the
    already-rotated rope key as the "value" [B, 1, T, R].

    decode_step (lab 03): a function (attn, q_nope [B, N, H-R], q_rope [B, N, R], c [B, S, C],
    k_rope [B, S, R]) -> [B, N, H] that computes each decode step (one query per sequence, no
    window: it sees every cached position, no mask) instead of the naive or absorbed path;
    a prefill still takes that path.
    """

    def __init__(self, config, layer_idx: int, latent_dim: int, rope_dim: int,
                 absorb: bool = False, decode_step=None):
        super().__init__()
        N, H, D = config.n_heads, config.head_dim, config.dim
        _check_dims(H, latent_dim, rope_dim)
        self.layer_idx = layer_idx
        self.window: int | None = None
        self.n_heads, self.head_dim = N, H
        self.latent_dim, self.rope_dim, self.nope_dim = latent_dim, rope_dim, H - rope_dim
        self.absorb = bool(absorb)
        self.decode_step = decode_step      # see forward
        self.q_proj = nn.Linear(D, N * H, bias=config.qkv_bias)   # per head: [nope | rope]
        self.kv_down = nn.Linear(D, latent_dim, bias=False)          # W_down: x -> c
        self.k_up = nn.Linear(latent_dim, N * self.nope_dim, bias=False)   # W_uk
        self.v_up = nn.Linear(latent_dim, N * H, bias=False)                # W_uv
        self.k_rope_proj = nn.Linear(D, rope_dim, bias=False)        # the shared rope key
        self.o_proj = nn.Linear(N * H, D, bias=config.o_bias)

    def kv_spec(self) -> KVSpec:
        return KVSpec(1, self.latent_dim, self.rope_dim, self.window)

    def extra_repr(self) -> str:
        return f"latent_dim={self.latent_dim}, rope_dim={self.rope_dim}, absorb={self.absorb}"

    def _rope_tables(self, cos, sin):
        """The model's [.., H] tables -> [.., R]: keep the R/2 highest-frequency pairs."""
        half = self.rope_dim // 2
        return (torch.cat([cos[..., :half], cos[..., :half]], dim=-1),
                torch.cat([sin[..., :half], sin[..., :half]], dim=-1))

    def forward(self, x, cos, sin, positions, cache=None):
        B, T, _ = x.shape
        N, H, R = self.n_heads, self.head_dim, self.rope_dim
        cos_r, sin_r = self._rope_tables(cos, sin)
        q = self.q_proj(x).view(B, T, N, H).transpose(1, 2)             # [B, N, T, H]
        q_nope, q_rope = q.split([self.nope_dim, R], dim=-1)
        q_rope = apply_rope(q_rope, cos_r, sin_r)
        c = self.kv_down(x)[:, None]                                     # [B, 1, T, C]
        k_rope = apply_rope(self.k_rope_proj(x)[:, None], cos_r, sin_r)  # [B, 1, T, R]
        if cache is not None:
            c, k_rope, k_pos = cache.update(self.layer_idx, c, k_rope, positions)
        else:
            k_pos = positions
        if self.decode_step is not None and T == 1 and self.window is None:
            out = self.decode_step(self, q_nope[:, :, 0], q_rope[:, :, 0], c[:, 0],
                                   k_rope[:, 0])[:, :, None]
        elif self.absorb:
            out = self.attend_absorbed(q_nope, q_rope, c, k_rope, positions, k_pos)
        else:       # not attend_naive: lab 03 withholds it, and its MLA models run this
            out = _up_projected(self, q_nope, q_rope, c, k_rope, positions, k_pos)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, N * H))

    def attend_naive(self, q_nope, q_rope, c, k_rope, q_pos, k_pos):
        """Up-project every cached latent to per-head keys and values, then plain MHA.

        q_nope [B, N, T, H-R], q_rope [B, N, T, R] (rotated), c [B, 1, S, C], k_rope
        [B, 1, S, R] (rotated), positions q_pos / k_pos -> [B, N, T, H]. Lab 03's baseline."""
        return _up_projected(self, q_nope, q_rope, c, k_rope, q_pos, k_pos)

    def attend_absorbed(self, q_nope, q_rope, c, k_rope, q_pos, k_pos):
        """Attend in latent space: every head shares the key [c, k_rope] and the value c.
        Same inputs and output as attend_naive, without up-projecting the cache."""
        B, N, T, _ = q_nope.shape
        C, R, H = self.latent_dim, self.rope_dim, self.head_dim
        w_uk = self.k_up.weight.view(N, self.nope_dim, C)
        q_lat = torch.einsum("bntd,ndc->bntc", q_nope, w_uk)            # W_uk_h^T q_nope_h
        # attend() scales scores by 1/sqrt(C + R); MLA's scale is 1/sqrt(H)
        q_abs = torch.cat([q_lat, q_rope], dim=-1) * math.sqrt((C + R) / H)
        k_abs = torch.cat([c, k_rope], dim=-1)                           # [B, 1, S, C + R]
        # one KV head for all N query heads: stack the heads as extra query rows (row h*T + t)
        # so the shared latent cache is read once, not copied per head
        if q_pos is None:                          # plain causal pass from position 0
            q_pos = k_pos = torch.arange(T, device=q_nope.device)
        rows_pos = q_pos.repeat(N) if q_pos.dim() == 1 else q_pos.repeat(1, N)
        out_lat = attend(q_abs.reshape(B, 1, N * T, C + R), k_abs, c, rows_pos, k_pos,
                         self.window).view(B, N, T, C)
        w_uv = self.v_up.weight.view(N, H, C)
        return torch.einsum("bntc,nhc->bnth", out_lat, w_uv)            # W_uv_h o_h


def rope_last_permutation(head_dim: int, rope_dim: int) -> torch.Tensor:
    """Order of one head's dims that puts the kept RoPE pairs last, in halves layout.

    Pair i of a halves-layout head is dims (i, i + H/2); pairs i < R/2 keep RoPE. Result:
    [other dims ... | 0..R/2-1, H/2..H/2+R/2-1].
    """
    half, r2 = head_dim // 2, rope_dim // 2
    nope = list(range(r2, half)) + list(range(half + r2, head_dim))
    rope = list(range(r2)) + list(range(half, half + r2))
    return torch.tensor(nope + rope)


ROPE_KEY_INITS = ("mean", "svd")


@torch.no_grad()
def mla_weights_from_mha(wq, wk, wv, n_heads: int, head_dim: int, latent_dim: int,
                         rope_dim: int, rope_key: str = "mean") -> dict[str, torch.Tensor]:
    """MLA projection weights from MHA q/k/v weights [N*H, D] (see the module docstring).

    rope_key: how the N heads' rope rows of W_k become one shared rope key.
      "mean"  their average. Simple, but trained heads point their rope keys in unrelated
              directions, so much of the average cancels out.
      "svd"   RoPE turns each pair (x1, x2) into the complex number x1 + i x2 times e^(i p theta),
              and multiplying by a complex scalar commutes with that rotation. So for each kept
              pair fit the heads' complex key rows K_h ~ alpha_h s (best rank-1 fit, one SVD over
              heads), cache the shared s, and move each head's alpha_h into its query rows
              (q_h <- conj(alpha_h) q_h): the scores are those of the rank-1 fitted keys.
    Returns q_proj, kv_down, k_up, v_up, k_rope_proj weights in float64 (the caller casts).
    """
    if rope_key not in ROPE_KEY_INITS:
        raise ValueError(f"rope_key must be one of {ROPE_KEY_INITS}, got {rope_key!r}")
    N, H, R, C = n_heads, head_dim, rope_dim, latent_dim
    D = wq.shape[1]
    perm = rope_last_permutation(H, R).to(wq.device)
    wq_p = wq.double().view(N, H, D)[:, perm]                          # per head [nope | rope]
    wk_p = wk.double().view(N, H, D)[:, perm]
    k_nope = wk_p[:, :H - R].reshape(N * (H - R), D)
    stacked = torch.cat([k_nope, wv.double()], dim=0)                  # [(N(H-R) + NH), D]
    if C > min(stacked.shape):
        raise ValueError(f"latent_dim={C} exceeds the rank limit min(dim={D}, "
                         f"N*(2H-R)={stacked.shape[0]}) of the stacked [W_k_nope; W_v]")
    U, S, Vh = torch.linalg.svd(stacked, full_matrices=False)
    us = U[:, :C] * S[:C]
    k_rope = wk_p[:, H - R:]                                           # [N, R, D]
    if rope_key == "mean":
        shared = k_rope.mean(dim=0)
    else:
        r2 = R // 2
        rows = torch.complex(k_rope[:, :r2], k_rope[:, r2:])          # [N, R/2, D] complex
        q_rope = wq_p[:, H - R:]                                       # a view: edited in place
        shared = torch.empty(R, D, dtype=torch.float64, device=wq.device)
        for i in range(r2):
            u, s, vh = torch.linalg.svd(rows[:, i], full_matrices=False)
            alpha, key = u[:, 0] * s[0], vh[0]                         # K_h ~ alpha_h * key
            shared[i], shared[r2 + i] = key.real, key.imag
            a, b = alpha.real[:, None], alpha.imag[:, None]
            q1, q2 = q_rope[:, i].clone(), q_rope[:, r2 + i].clone()
            q_rope[:, i], q_rope[:, r2 + i] = a * q1 + b * q2, a * q2 - b * q1   # conj(alpha) q
    return {"q_proj": wq_p.reshape(N * H, D),
            "kv_down": Vh[:C],
            "k_up": us[:N * (H - R)],
            "v_up": us[N * (H - R):],
            "k_rope_proj": shared}


def to_mla(model, latent_dim: int, rope_dim: int = DEFAULT_ROPE_DIM, absorb: bool = False,
           rope_key: str = "mean", decode_step=None):
    """A new model whose attention layers are `MLAAttention`, initialised from `model`'s MHA
    weights by SVD (rope_key: see `mla_weights_from_mha`; decode_step: see `MLAAttention`).
    The input model is not modified; sliding windows are kept."""
    cfg = model.config
    N, H, D = cfg.n_heads, cfg.head_dim, cfg.dim
    _check_dims(H, latent_dim, rope_dim)
    if rope_key not in ROPE_KEY_INITS:
        raise ValueError(f"rope_key must be one of {ROPE_KEY_INITS}, got {rope_key!r}")
    if cfg.n_kv_heads != cfg.n_heads:
        raise ValueError(f"to_mla needs a multi-head model (n_kv_heads == n_heads), got "
                         f"n_kv_heads={cfg.n_kv_heads}, n_heads={N}")
    if cfg.qkv_bias:
        raise ValueError("to_mla does not support biased q/k/v projections (qkv_bias=True)")
    if latent_dim > D:
        raise ValueError(f"latent_dim={latent_dim} is larger than the model dim {D}: the latent "
                         f"would hold more than the token's residual stream")
    for i, layer in enumerate(model.layers):
        if type(layer.self_attn) is not Attention:
            raise ValueError(f"to_mla converts standard Attention layers; layer {i} is "
                             f"{type(layer.self_attn).__name__}")
    new = copy.deepcopy(model)
    for i, layer in enumerate(new.layers):
        old = layer.self_attn
        ref = old.q_proj.weight
        mla = MLAAttention(cfg, i, latent_dim, rope_dim, absorb, decode_step)
        mla = mla.to(ref.device, ref.dtype)
        mla.window = old.window
        w = mla_weights_from_mha(old.q_proj.weight, old.k_proj.weight, old.v_proj.weight,
                                 N, H, latent_dim, rope_dim, rope_key)
        with torch.no_grad():
            for name, value in w.items():
                getattr(mla, name).weight.copy_(value)
            mla.o_proj.load_state_dict(old.o_proj.state_dict())
        layer.self_attn = mla
    return new
