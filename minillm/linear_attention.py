"""Linear attention with a decay: a sequence mixer whose decode state has a fixed size (lab 09).

Softmax attention scores a query against every cached key, so its decode state -- the KV cache --
grows by one row per token. Replace exp(q.k) by a product of features phi(q).phi(k) (Katharopoulos
et al., 2020) and the sum over the past factorises:

    y_t = sum_{j<=t} g^(t-j) phi(q_t).phi(k_j) v_j  /  sum_{j<=t} g^(t-j) phi(q_t).phi(k_j)
        = phi(q_t)^T S_t / phi(q_t)^T z_t,     S_t = g S_{t-1} + phi(k_t) v_t^T   [H x H]
                                               z_t = g z_{t-1} + phi(k_t)         [H]

phi(x) = elu(x) + 1 keeps every feature positive, so the normaliser phi(q).z is a positive
weighted count, as softmax's denominator is. g < 1 is a per-head decay (RetNet's fixed schedule
g_h = 1 - 2^(-5-h), the same idea as Lightning Attention's and Mamba's forgetting): old tokens
fade, so a head's state is a recency-weighted summary, and heads look back over 32 to ~1000
tokens. Decode carries (S, z) from step to step: H*H + H numbers per head whatever the context.

The same layer has three forms that compute the same outputs:
  * `parallel`  -- training: a [T, T] matrix like attention's, masked by the decay (O(T^2 H));
  * `recurrent` -- decode: one (S, z) update per token (O(H^2) per token, O(T H^2) in all);
  * `chunked`   -- both: parallel inside chunks of C tokens, the recurrence across chunks
                   (O(T C H + T H^2)): the form fast linear-attention kernels use.
`LinearAttention` is a drop-in for `model.Attention` (same q/k/v/o projections, no RoPE: the
decay carries order); its state lives in a `KVCache` (`cache.state[layer]`). `use_forms` runs a
model's linear layers on other implementations of the chunked form and the recurrent step (lab 09
hands in the student's).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

EPS = 1e-6


def feature_map(x: torch.Tensor) -> torch.Tensor:
    """phi(x) = elu(x) + 1 > 0, elementwise."""
    return F.elu(x) + 1


def head_decays(n_heads: int) -> torch.Tensor:
    """The fixed per-head decay g_h = 1 - 2^(-5-h) (RetNet): heads remember ~32 .. 2^(5+h) tokens."""
    return 1 - 2.0 ** (-5 - torch.arange(n_heads, dtype=torch.float64))


def _decay(decay, n_heads: int, dtype, device) -> torch.Tensor:
    """decay as a [heads, 1, 1] tensor (a float applies to every head)."""
    g = torch.as_tensor(decay)
    if g.dim() == 0:
        g = g.expand(n_heads)
    if g.shape != (n_heads,) or not bool(((g > 0) & (g <= 1)).all()):
        raise ValueError(f"decay must be in (0, 1], one per head ({n_heads}), "
                         f"got {tuple(g.shape)} values")
    return g.to(dtype=dtype, device=device)[:, None, None]


def decay_matrix(decay, T: int, like: torch.Tensor) -> torch.Tensor:
    """D[h, i, j] = g_h^(i-j) for j <= i, else 0: [heads, T, T]."""
    exact = torch.promote_types(like.dtype, torch.float32)          # bf16 only at the end
    g = _decay(decay, like.shape[1], exact, like.device)
    idx = torch.arange(T, device=like.device)
    gap = (idx[:, None] - idx[None, :]).to(exact)
    D = torch.where(gap >= 0, torch.exp(gap.clamp(min=0) * torch.log(g)), 0.0)
    return D.to(like.dtype)


def parallel(q, k, v, decay) -> torch.Tensor:
    """Training form. q, k, v [B, heads, T, H] -> y [B, heads, T, H]."""
    qf, kf = feature_map(q), feature_map(k)
    A = (qf @ kf.transpose(-1, -2)) * decay_matrix(decay, q.shape[-2], q)   # [B, h, T, T]
    return (A @ v) / (A.sum(-1, keepdim=True) + EPS)


def recurrent_step(q, k, v, state, decay):
    """Decode form: one token. q, k, v [B, heads, H]; state (S [B,h,H,H], z [B,h,H]) or None.
    Returns y [B, heads, H] and the new state."""
    qf, kf = feature_map(q), feature_map(k)
    g = _decay(decay, q.shape[1], q.dtype, q.device)                  # [h, 1, 1]
    if state is None:
        S = kf[..., :, None] * v[..., None, :]
        z = kf
    else:
        S = g * state[0] + kf[..., :, None] * v[..., None, :]
        z = g[..., 0] * state[1] + kf
    num = (qf[..., None, :] @ S)[..., 0, :]                           # q^T S   [B, h, H]
    den = (qf * z).sum(-1, keepdim=True)                              # q^T z   [B, h, 1]
    return num / (den + EPS), (S, z)


def recurrent(q, k, v, decay, state=None):
    """The recurrence over a whole sequence, token by token: y [B, h, T, H] and the final state."""
    ys = []
    for t in range(q.shape[-2]):
        y, state = recurrent_step(q[..., t, :], k[..., t, :], v[..., t, :], state, decay)
        ys.append(y)
    return torch.stack(ys, dim=-2), state


def chunked(q, k, v, decay, chunk: int = 64, state=None):
    """Parallel inside chunks of `chunk` tokens, the recurrence between them. Returns y and the
    state after the last token (so a prefill can hand it to decode)."""
    B, h, T, H = q.shape
    if chunk < 1:
        raise ValueError(f"chunk must be a positive number of tokens, got {chunk}")
    g = _decay(decay, h, q.dtype, q.device)                           # [h, 1, 1]
    qf, kf = feature_map(q), feature_map(k)
    if state is None:
        S = q.new_zeros(B, h, H, H)
        z = q.new_zeros(B, h, H)
    else:
        S, z = state
    ys = []
    for s in range(0, T, chunk):
        qc, kc, vc = qf[:, :, s:s + chunk], kf[:, :, s:s + chunk], v[:, :, s:s + chunk]
        C = qc.shape[-2]
        D = decay_matrix(decay, C, q)                                 # [h, C, C]
        A = (qc @ kc.transpose(-1, -2)) * D                           # inside the chunk
        into = g ** torch.arange(1, C + 1, device=q.device, dtype=q.dtype)[:, None]   # [h, C, 1]
        num = A @ vc + into * (qc @ S)                                # + what came before
        den = A.sum(-1, keepdim=True) + into * (qc @ z[..., None])
        ys.append(num / (den + EPS))
        out = g ** torch.arange(C - 1, -1, -1, device=q.device, dtype=q.dtype)[:, None]  # [h,C,1]
        S = g ** C * S + (kc * out).transpose(-1, -2) @ vc
        z = g[..., 0] ** C * z + (kc * out).sum(-2)
    return torch.cat(ys, dim=-2), (S, z)


def state_bytes(n_heads: int, head_dim: int, bytes_per_value: int = 4) -> int:
    """Bytes of one layer's decode state for one sequence: S (H x H) and z (H) per head."""
    return n_heads * (head_dim * head_dim + head_dim) * bytes_per_value


def flops_per_token(n_heads: int, head_dim: int, form: str, T: int = 1, chunk: int = 64) -> int:
    """FLOPs of the mixing (projections excluded) per token, a multiply-add counted as 2.

    recurrent: add phi(k) v^T into S (2 H^2) and read phi(q)^T S (2 H^2), z and phi(q).z (4 H);
               the decay's scaling of S is left out: 4 H^2 + 4 H per head, whatever T;
    parallel:  a T-token sequence computes the whole T x T score matrix and A v, masked part
               included: 4 H T per head and token;
    chunked:   the parallel form over a chunk of C tokens plus the recurrent terms: 4 H C + 4 H^2
               + 4 H per head and token.
    """
    if form == "recurrent":
        per_head = 4 * head_dim ** 2 + 4 * head_dim
    elif form == "parallel":
        per_head = 4 * head_dim * T
    elif form == "chunked":
        per_head = 4 * head_dim * min(chunk, T) + 4 * head_dim ** 2 + 4 * head_dim
    else:
        raise ValueError(f"form must be 'recurrent', 'parallel' or 'chunked', got {form!r}")
    return n_heads * per_head


def use_forms(model: nn.Module, chunked_form=None, step_form=None) -> nn.Module:
    """Run `model`'s linear-attention layers on `chunked_form(q, k, v, decay, chunk) -> (y, (S,
    z))` (from an empty state: training and a first prefill) and `step_form(q, k, v, state,
    decay) -> (y, state)` (decode) instead of `chunked` and `recurrent_step`; a prefill that
    continues a state runs `step_form` token by token. Both None: the module's own forms again.
    Returns `model`, changed in place (its weights untouched)."""
    if (chunked_form is None) != (step_form is None):
        raise ValueError("give both forms (chunked_form and step_form), or neither")
    forms = None if chunked_form is None else (chunked_form, step_form)
    for m in model.modules():
        if isinstance(m, LinearAttention):
            m.forms = forms
    return model


class LinearAttention(nn.Module):
    """Decayed linear attention with attention's projections (and HF parameter names)."""

    chunk = 64
    forms = None            # (chunked_form, step_form) of `use_forms`; None: this module's

    def __init__(self, config, layer_idx: int):
        super().__init__()
        c = config
        if c.n_kv_heads != c.n_heads:
            raise ValueError("LinearAttention needs n_kv_heads == n_heads")
        self.layer_idx = layer_idx
        self.n_heads, self.head_dim = c.n_heads, c.head_dim
        self.q_proj = nn.Linear(c.dim, c.n_heads * c.head_dim, bias=c.qkv_bias)
        self.k_proj = nn.Linear(c.dim, c.n_heads * c.head_dim, bias=c.qkv_bias)
        self.v_proj = nn.Linear(c.dim, c.n_heads * c.head_dim, bias=c.qkv_bias)
        self.o_proj = nn.Linear(c.n_heads * c.head_dim, c.dim, bias=c.o_bias)
        self.register_buffer("decay", head_decays(c.n_heads).float(), persistent=False)

    def kv_spec(self):
        return None                       # nothing per token: the state is fixed-size

    def forward(self, x, cos=None, sin=None, positions=None, cache=None):
        B, T, _ = x.shape
        q, k, v = (p(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        decay = self.decay.to(q.dtype)
        if cache is None:
            y, _ = self._chunked(q, k, v, decay, None)
        else:
            state = cache.state.get(self.layer_idx)
            if T == 1:
                y, state = self._step(q[:, :, 0], k[:, :, 0], v[:, :, 0], state, decay)
                y = y[:, :, None]
            else:
                y, state = self._chunked(q, k, v, decay, state)
            cache.state[self.layer_idx] = state
        return self.o_proj(y.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))

    def _step(self, q, k, v, state, decay):
        return (self.forms[1] if self.forms else recurrent_step)(q, k, v, state, decay)

    def _chunked(self, q, k, v, decay, state):
        if self.forms is None:
            return chunked(q, k, v, decay, self.chunk, state)
        if state is None:
            return self.forms[0](q, k, v, decay, self.chunk)
        ys = []                                   # the handed-in chunked form starts empty
        for t in range(q.shape[2]):
            y, state = self._step(q[:, :, t], k[:, :, t], v[:, :, t], state, decay)
            ys.append(y)
        return torch.stack(ys, dim=2), state
