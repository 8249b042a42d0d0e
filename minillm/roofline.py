"""Roofline napkin math: why decoding is memory-bound, and what latency/throughput it allows.

Read it top to bottom; it follows the lecture.

1. Arithmetic intensity (FLOPs per byte moved), derived with SymPy so the algebra is checked:
       matmul X(B x D) @ W(D x F)          -> B          (when D, F >> B)
       SwiGLU MLP on B x T tokens          -> B * T      (when D, F >> B * T)
       attention, T queries over S keys    -> S*T/(S+T)  (prefill T = S: S/2; decode T = 1: < 1)
   Attention has no B in it: every sequence brings its own KV cache, so batching cannot help.
2. Accelerator intensity = FLOP/s / (bytes/s). Below it a kernel is memory-bound:
       H100 989e12 / 3.35e12 ~ 295,  A100 312e12 / 2.039e12 ~ 153.
3. Napkin latency and throughput of one decode step of a whole model (memory-bound, so time is
   just bytes / bandwidth; compute and transfers are assumed to overlap perfectly):
       params     = 2*V*D + L*(3*D*F + 2*D*N*H + 2*D*K*H)   (the lecture's count, no norms)
       kv_per_seq = S * K*H * L * 2 * 2                     (keys + values, bf16)
       memory     = B * kv_per_seq + 2 * params
       latency    = memory / memory_bandwidth
       throughput = B / latency
   For Llama-2-13B on an H100 at S = 1000: B = 1 -> ~8 ms/token, ~124 tok/s; B = 256 needs
   ~240 GB and does not fit in 80 GB; with GQA (K = 8 instead of 40) it does.
   Several GPUs (`tensor_parallel_napkin`): G copies keep the latency and multiply throughput
   by G; splitting one model G ways divides each GPU's bytes by G and adds two all-reduces of
   B x D activations per layer over NVLink or PCIe.
4. Any machine has a roofline: time X @ W over batch sizes, and the best FLOP/s and the best
   bytes/s reached are its two roofs (`empirical_roofline`); lab 01 measures the CPU it runs on.

Notation as in `minillm.config`: D = dim, F = hidden_dim, L = n_layers, N = n_heads,
K = n_kv_heads, H = head_dim, V = vocab_size; B = batch, S = keys (context), T = queries.

    from minillm.roofline import napkin
    napkin("llama-2-13b", "h100", batch=1, seq_len=1000)["latency_s"]         # ~0.008
    napkin("llama-2-13b", "h100", batch=256, seq_len=1000, kv_heads=8)["fits"]  # True
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import sympy
from sympy import oo

from .config import PRESETS as _CONFIG_PRESETS
from .config import SHIPPED_SHAPES as _SHIPPED_PRESETS
from .config import ModelConfig
from .linear_attention import state_bytes

B, D, F, S, T, c = sympy.symbols("B D F S T c", positive=True)

# ============================================================================================
# 1. Arithmetic intensity, symbolically (everything in bf16: 2 bytes per value)
# ============================================================================================


def matmul_flops_and_bytes() -> tuple[sympy.Expr, sympy.Expr]:
    """FLOPs and HBM bytes of Y = X (B x D) @ W (D x F)."""
    flops, bytes_transferred = 0, 0
    bytes_transferred += 2 * B * D     # 1. read X (B x D)
    bytes_transferred += 2 * D * F     # 2. read W (D x F)
    flops += 2 * B * D * F             # 3. compute Y = X @ W: one multiply + one add per term
    bytes_transferred += 2 * B * F     # 4. write Y (B x F)
    return sympy.sympify(flops), sympy.sympify(bytes_transferred)


def matmul_intensity() -> sympy.Expr:
    """FLOPs per byte of the matmul: B*D*F / (B*D + D*F + B*F)."""
    flops, bytes_transferred = matmul_flops_and_bytes()
    return sympy.simplify(flops / bytes_transferred)


def matmul_intensity_limit() -> sympy.Expr:
    """Batch is much smaller than D and F: put D = F = c*B and let c -> oo. Gives B."""
    return sympy.simplify(sympy.limit(matmul_intensity().subs({D: c * B, F: c * B}), c, oo))


def mlp_flops_and_bytes() -> tuple[sympy.Expr, sympy.Expr]:
    """FLOPs and HBM bytes of a SwiGLU MLP (up, gate, down) on B sequences of T tokens."""
    flops, bytes_transferred = 0, 0
    bytes_transferred += 2 * B * T * D     # 1. read X (B x T x D)
    bytes_transferred += 3 * 2 * D * F     # 2. read Wup (D x F), Wgate (D x F), Wdown (F x D)
    flops += 2 * B * T * D * F             # 3. U = X @ Wup
    bytes_transferred += 2 * B * T * F     # 4. write U (B x T x F)
    flops += 2 * B * T * D * F             # 5. G = X @ Wgate
    bytes_transferred += 2 * B * T * F     # 6. write G (B x T x F)
    flops += 2 * B * T * D * F             # 7. Y = (silu(G) * U) @ Wdown
    bytes_transferred += 2 * B * T * D     # 8. write Y (B x T x D)
    return sympy.sympify(flops), sympy.sympify(bytes_transferred)


def mlp_intensity() -> sympy.Expr:
    flops, bytes_transferred = mlp_flops_and_bytes()
    return sympy.simplify(flops / bytes_transferred)


def mlp_intensity_limit() -> sympy.Expr:
    """B*T tokens much fewer than D and F: D = F = c*B*T, c -> oo. Gives B*T.

    Prefill (T = S) is easily compute-bound; decode (T = 1) needs B concurrent requests."""
    return sympy.simplify(sympy.limit(mlp_intensity().subs({D: c * B * T, F: c * B * T}), c, oo))


def attention_flops_and_bytes() -> tuple[sympy.Expr, sympy.Expr]:
    """FLOPs and HBM bytes of attention's two matmuls, T queries against S keys (FlashAttention:
    the S x T score matrix never goes to HBM). Softmax FLOPs are ignored."""
    flops, bytes_transferred = 0, 0
    bytes_transferred += 2 * B * T * D     # 1. read Q (B x T x D)
    bytes_transferred += 2 * 2 * B * S * D  #    read K and V (B x S x D each): the KV cache
    flops += 2 * B * S * T * D             # 2. A = Q @ K^T
    flops += 2 * B * S * T * D             # 3. Y = softmax(A) @ V
    bytes_transferred += 2 * B * T * D     # 4. write Y (B x T x D)
    return sympy.sympify(flops), sympy.sympify(bytes_transferred)


def attention_intensity() -> sympy.Expr:
    """S*T / (S + T): no B anywhere, because every sequence reads its own K and V."""
    flops, bytes_transferred = attention_flops_and_bytes()
    return sympy.simplify(flops / bytes_transferred)


def prefill_attention_intensity() -> sympy.Expr:
    """T = S: S/2, order S. Long prompts keep prefill compute-bound."""
    return sympy.simplify(attention_intensity().subs(T, S))


def decode_attention_intensity() -> sympy.Expr:
    """T = 1: S/(S+1) < 1, however long the context and however large the batch."""
    return sympy.simplify(attention_intensity().subs(T, 1))


# ============================================================================================
# 2. Hardware and accelerator intensity
# ============================================================================================


@dataclass(frozen=True)
class Hardware:
    """One accelerator. Make your own: ``Hardware("my-gpu", 400e12, 1.5e12, 48e9)``."""
    name: str
    flops_per_s: float                  # dense bf16 FLOP/s (no sparsity)
    mem_bandwidth_bytes_per_s: float    # HBM bandwidth
    memory_bytes: float                 # HBM capacity

    def __post_init__(self):
        for field in ("flops_per_s", "mem_bandwidth_bytes_per_s", "memory_bytes"):
            value = getattr(self, field)
            if not isinstance(value, numbers.Real) or not value > 0 or math.isinf(value):
                raise ValueError(f"Hardware.{field} must be a positive finite number, got {value!r}")


HARDWARE: dict[str, Hardware] = {
    "h100": Hardware("h100", flops_per_s=989e12, mem_bandwidth_bytes_per_s=3.35e12, memory_bytes=80e9),
    "a100": Hardware("a100", flops_per_s=312e12, mem_bandwidth_bytes_per_s=2.039e12, memory_bytes=80e9),
    "h200": Hardware("h200", flops_per_s=989e12, mem_bandwidth_bytes_per_s=4.8e12, memory_bytes=141e9),
}


def get_hardware(hw: Hardware | str) -> Hardware:
    if isinstance(hw, Hardware):
        return hw
    if isinstance(hw, str):
        key = hw.lower()
        if key not in HARDWARE:
            raise ValueError(f"unknown hardware {hw!r}; choose one of {sorted(HARDWARE)} "
                             "or pass a Hardware(name, flops_per_s, mem_bandwidth_bytes_per_s, "
                             "memory_bytes)")
        return HARDWARE[key]
    raise TypeError(f"hw must be a Hardware or a preset name, got {type(hw).__name__}")


def accelerator_intensity(hw: Hardware | str) -> float:
    """FLOPs the chip can do per byte it can load. A kernel whose arithmetic intensity is below
    this is memory-bound (e.g. a matmul with batch B < ~295 on an H100)."""
    hw = get_hardware(hw)
    return hw.flops_per_s / hw.mem_bandwidth_bytes_per_s


# ============================================================================================
# 3. Models, parameter count and KV cache size
# ============================================================================================

# Real shapes from minillm.config plus the course's shipped models ("minillm-target" etc.).
MODELS: dict[str, ModelConfig] = {
    **_CONFIG_PRESETS,
    **{f"minillm-{name}": cfg for name, cfg in _SHIPPED_PRESETS.items()
       if cfg.causal},        # a diffusion model has no decode step to napkin
}


def get_model(model: ModelConfig | str) -> ModelConfig:
    if isinstance(model, ModelConfig):
        return model
    if isinstance(model, str):
        if model not in MODELS:
            raise ValueError(f"unknown model {model!r}; choose one of {sorted(MODELS)} "
                             "or pass a ModelConfig")
        return MODELS[model]
    raise TypeError(f"model must be a ModelConfig or a preset name, got {type(model).__name__}")


def _kv_heads(cfg: ModelConfig, kv_heads: int | None) -> int:
    if kv_heads is None:
        return cfg.n_kv_heads
    if isinstance(kv_heads, bool) or not isinstance(kv_heads, numbers.Integral) or kv_heads < 1:
        raise ValueError(f"kv_heads must be a positive integer, got {kv_heads!r}")
    if cfg.n_heads % kv_heads:
        divisors = [k for k in range(1, cfg.n_heads + 1) if cfg.n_heads % k == 0]
        raise ValueError(f"kv_heads={kv_heads} must divide n_heads={cfg.n_heads} "
                         f"(each KV head serves a whole group of query heads); try one of {divisors}")
    return int(kv_heads)


def lecture_num_params(model: ModelConfig | str, kv_heads: int | None = None) -> int:
    """The lecture's parameter count: embedding + L * (attention + MLP) + lm_head.

    attention = D*N*H (Q) + 2*D*K*H (K, V) + N*H*D (O), MLP = 3*D*F; norms and biases are left
    out (for Llama-2-13B that is 414,720 of 13.0e9, see ``ModelConfig.num_params``). Fewer KV
    heads also shrink the K and V projections. A tied lm_head is counted once."""
    cfg = get_model(model)
    K = _kv_heads(cfg, kv_heads)
    Dm, Fm, L, N, H, V = cfg.dim, cfg.hidden_dim, cfg.n_layers, cfg.n_heads, cfg.head_dim, cfg.vocab_size
    attention = 2 * Dm * N * H + 2 * Dm * K * H
    mlp = 3 * Dm * Fm
    embeddings = (1 if cfg.tie_embeddings else 2) * V * Dm
    return embeddings + L * (attention + mlp)


def kv_cache_bytes_per_seq(model: ModelConfig | str, seq_len: int, kv_heads: int | None = None,
                           bytes_per_value: float = 2) -> float:
    """S * K*H * L * 2 (keys and values) * bytes per value, L counting the attention layers;
    plus, for a hybrid (lab 09), each linear layer's fixed state: N * (H*H + H) values."""
    cfg = get_model(model)
    L_attn = len(cfg.attention_layers)
    kv = seq_len * _kv_heads(cfg, kv_heads) * cfg.head_dim * L_attn * 2 * bytes_per_value
    return kv + (cfg.n_layers - L_attn) * state_bytes(cfg.n_heads, cfg.head_dim, bytes_per_value)


# ============================================================================================
# 4. Napkin latency / throughput of a memory-bound decode step
# ============================================================================================


def decode_step_symbolic() -> dict[str, sympy.Expr]:
    """The same napkin formulas as SymPy expressions (bf16 weights and cache), as in the lecture.

    Substitute a shape, e.g. ``{S: 1000, D: 5120, F: 13824, N: 40, K: 40, H: 128, L: 40,
    V: 32000, bandwidth: 3.35e12}``, and read off memory, latency and throughput as functions of
    B. B appears in throughput's numerator and denominator, so it saturates:
    throughput -> bandwidth / kv_per_seq as B -> oo."""
    V, L, N, K, H, bandwidth = sympy.symbols("V L N K H bandwidth", positive=True)
    num_params = 2 * V * D + D * F * 3 * L + (2 * D * N * H + 2 * D * K * H) * L
    parameter_size = num_params * 2                 # 2 bytes per bf16 parameter
    kv_cache_size = S * (K * H) * L * 2 * 2         # 2 for key + value, 2 for bf16
    memory = B * kv_cache_size + parameter_size
    latency = memory / bandwidth
    throughput = B / latency
    return {"num_params": num_params, "kv_cache_size": kv_cache_size, "memory": memory,
            "latency": latency, "throughput": throughput,
            "throughput_limit": sympy.limit(throughput, B, oo)}


def _check_positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return int(value)


def _check_bytes(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value > 0 \
            or math.isinf(value):
        raise ValueError(f"{name} must be a positive number of bytes, got {value!r}")
    return value


def napkin(model: ModelConfig | str, hw: Hardware | str, batch: int, seq_len: int,
           kv_heads: int | None = None, bytes_per_param: float = 2,
           kv_bytes_per_value: float | None = None) -> dict:
    """One decode step of `batch` sequences, each with `seq_len` tokens of KV cache.

    Every step reads all parameters and every sequence's KV cache once, so
    latency = memory / bandwidth and throughput = batch / latency (tokens per second).
    `kv_heads` overrides the model's K (the GQA what-if); `kv_bytes_per_value` defaults to
    `bytes_per_param` (2 = bf16; 1 = int8/fp8; 0.5 = int4)."""
    cfg, hw = get_model(model), get_hardware(hw)
    batch = _check_positive_int("batch", batch)
    seq_len = _check_positive_int("seq_len", seq_len)
    K = _kv_heads(cfg, kv_heads)
    bytes_per_param = _check_bytes("bytes_per_param", bytes_per_param)
    kv_bytes_per_value = _check_bytes(
        "kv_bytes_per_value", bytes_per_param if kv_bytes_per_value is None else kv_bytes_per_value)

    params = lecture_num_params(cfg, K)
    param_bytes = params * bytes_per_param
    kv_per_seq = kv_cache_bytes_per_seq(cfg, seq_len, K, kv_bytes_per_value)
    memory = batch * kv_per_seq + param_bytes
    latency = memory / hw.mem_bandwidth_bytes_per_s
    throughput = batch / latency
    name = model if isinstance(model, str) else next(
        (k for k, v in MODELS.items() if v == cfg), "custom")
    return {
        "model": name, "gpu": hw.name, "batch": batch, "seq_len": seq_len, "kv_heads": K,
        "n_heads": cfg.n_heads, "bytes_per_param": bytes_per_param,
        "kv_bytes_per_value": kv_bytes_per_value,
        "params": params,
        "param_bytes": param_bytes,
        "kv_bytes_per_seq": kv_per_seq,
        "kv_bytes": batch * kv_per_seq,
        "memory_bytes": memory,
        "latency_s": latency,
        "throughput_tok_s": throughput,
        # B -> oo: throughput -> bandwidth / kv_per_seq (parameter reads amortize away, KV does not)
        "max_throughput_tok_s": hw.mem_bandwidth_bytes_per_s / kv_per_seq,
        "fits": memory <= hw.memory_bytes,
        "accelerator_intensity": accelerator_intensity(hw),
    }


def max_batch_that_fits(model: ModelConfig | str, hw: Hardware | str, seq_len: int,
                        kv_heads: int | None = None, bytes_per_param: float = 2,
                        kv_bytes_per_value: float | None = None) -> int:
    """Largest B with B * kv_per_seq + param_bytes <= HBM (0 if the weights alone do not fit)."""
    one = napkin(model, hw, 1, seq_len, kv_heads, bytes_per_param, kv_bytes_per_value)
    free = get_hardware(hw).memory_bytes - one["param_bytes"]
    return max(0, math.floor(free / one["kv_bytes_per_seq"]))


def latency_throughput_curve(model: ModelConfig | str, hw: Hardware | str, seq_len: int,
                             batches, kv_heads: int | None = None, bytes_per_param: float = 2,
                             kv_bytes_per_value: float | None = None) -> dict:
    """`napkin` over a list of batch sizes, as parallel lists ready to plot, e.g.

        curve = latency_throughput_curve("llama-2-13b", "h100", 1000, [1, 2, 4, ..., 256])
        plt.plot(curve["latency_ms"], curve["throughput_tok_s"])   # the latency/throughput trade-off
    """
    batches = list(batches)
    if not batches:
        raise ValueError("batches must contain at least one batch size")
    rows = [napkin(model, hw, b, seq_len, kv_heads, bytes_per_param, kv_bytes_per_value)
            for b in batches]
    return {
        "batch": [r["batch"] for r in rows],
        "memory_bytes": [r["memory_bytes"] for r in rows],
        "latency_s": [r["latency_s"] for r in rows],
        "latency_ms": [1e3 * r["latency_s"] for r in rows],
        "throughput_tok_s": [r["throughput_tok_s"] for r in rows],
        "fits": [r["fits"] for r in rows],
        "max_batch": max_batch_that_fits(model, hw, seq_len, kv_heads, bytes_per_param,
                                         kv_bytes_per_value),
        "max_throughput_tok_s": rows[0]["max_throughput_tok_s"],
        "memory_limit_bytes": get_hardware(hw).memory_bytes,
    }


# ============================================================================================
# 4b. Several GPUs: M copies of the model, or one model split G ways (tensor parallelism)
# ============================================================================================

# GPU-to-GPU links, bytes/s per GPU in one direction. The notes give NVLink 300 GB/s (an A100's
# NVLink 3) and PCIe 60 GB/s; an H100 SXM's NVLink 4 moves 450 GB/s each way (900 GB/s both).
LINKS: dict[str, float] = {"nvlink-a100": 300e9, "nvlink-h100": 450e9, "pcie": 60e9}


def _link_bytes_per_s(link: float | str) -> float:
    if isinstance(link, str):
        if link.lower() not in LINKS:
            raise ValueError(f"unknown link {link!r}; choose one of {sorted(LINKS)} or pass "
                             f"bytes/s")
        return LINKS[link.lower()]
    return _check_bytes("link bandwidth (bytes/s)", link)


def kv_share_per_gpu(kv_heads: int, gpus: int) -> float:
    """Fraction of each sequence's KV cache one of G GPUs holds: K/G heads each when G divides K;
    when G > K each GPU keeps the one KV head its query heads read (replicated G/K times)."""
    if kv_heads % gpus == 0:
        return 1 / gpus
    if gpus % kv_heads == 0:
        return 1 / kv_heads
    raise ValueError(f"G = {gpus} GPUs must divide K = {kv_heads} KV heads or be a multiple of "
                     f"it (a KV head is never split)")


def tensor_parallel_napkin(model: ModelConfig | str, hw: Hardware | str, batch: int,
                           seq_len: int, gpus: int, link: float | str = "nvlink-h100",
                           kv_heads: int | None = None, bytes_per_param: float = 2,
                           kv_bytes_per_value: float | None = None,
                           allreduce_latency_s: float = 0.0, activation_bytes: float = 2) -> dict:
    """One decode step of `batch` sequences with the model split over `gpus` GPUs (Megatron-style
    tensor parallelism), next to the lecture's easy alternative, `gpus` independent copies.

    Split: every layer's query heads (and their KV heads) and MLP columns are divided among the
    G GPUs, and so are the embedding and output head; each GPU reads 1/G of the weights and its
    share of the KV cache (`kv_share_per_gpu`). Two all-reduces per layer, after W_o and after
    the MLP's down projection, sum the partial outputs: B tokens x D values each. A ring
    all-reduce sends and receives 2 (G - 1) / G of the message per GPU, over the link:

        memory per GPU = params * bytes / G + B * kv_per_seq * share
        communication  = 2 L (2 (G - 1) / G * B * D * activation_bytes / link + allreduce_latency)
        latency        = memory per GPU / bandwidth + communication     (no overlap assumed)
        throughput     = B / latency;  fits = memory per GPU <= HBM

    Copies: each of the G GPUs runs the whole model on its own B sequences: latency is the
    single-GPU napkin's, throughput G times it (`copies_*`; they fit only if one GPU holds a copy
    and its batch)."""
    cfg = get_model(model)
    G = _check_positive_int("gpus", gpus)
    K = _kv_heads(cfg, kv_heads)
    if cfg.n_heads % G:
        raise ValueError(f"G = {G} GPUs must divide N = {cfg.n_heads} query heads")
    share = kv_share_per_gpu(K, G)
    link_bw = _link_bytes_per_s(link)
    if not isinstance(allreduce_latency_s, numbers.Real) or allreduce_latency_s < 0:
        raise ValueError(f"allreduce_latency_s must be >= 0, got {allreduce_latency_s!r}")
    one = napkin(cfg, hw, batch, seq_len, kv_heads=K, bytes_per_param=bytes_per_param,
                 kv_bytes_per_value=kv_bytes_per_value)
    hw = get_hardware(hw)
    per_gpu = one["param_bytes"] / G + one["batch"] * one["kv_bytes_per_seq"] * share
    message = one["batch"] * cfg.dim * activation_bytes
    ring = 2 * (G - 1) / G * message
    comm = 2 * cfg.n_layers * (ring / link_bw + allreduce_latency_s) if G > 1 else 0.0
    latency = per_gpu / hw.mem_bandwidth_bytes_per_s + comm
    per_seq_s = (one["kv_bytes_per_seq"] * share / hw.mem_bandwidth_bytes_per_s
                 + (2 * cfg.n_layers * 2 * (G - 1) / G * cfg.dim * activation_bytes / link_bw
                    if G > 1 else 0.0))
    free = hw.memory_bytes - one["param_bytes"] / G
    return {
        "gpus": G, "batch": one["batch"], "seq_len": one["seq_len"], "kv_heads": K,
        # as B grows: the weights and the all-reduces' fixed latency amortize away
        "max_throughput_tok_s": 1 / per_seq_s,
        "max_batch": max(0, math.floor(free / (one["kv_bytes_per_seq"] * share))),
        "memory_per_gpu_bytes": per_gpu, "memory_time_s": per_gpu / hw.mem_bandwidth_bytes_per_s,
        "allreduce_bytes_per_gpu": ring, "comm_s": comm, "latency_s": latency,
        "throughput_tok_s": one["batch"] / latency, "fits": per_gpu <= hw.memory_bytes,
        "copies_latency_s": one["latency_s"], "copies_throughput_tok_s": G * one["throughput_tok_s"],
        "copies_fit": one["fits"], "single": one,
    }


def serving_outcome(model: ModelConfig | str, hw: Hardware | str, seq_len: int, gpus: int,
                    split: int, batch: int, bytes_per_param: float = 2,
                    link: float | str = "nvlink-h100", allreduce_latency_s: float = 0.0) -> dict:
    """`gpus` GPUs serving sequences of `seq_len` tokens: each copy of the model is split over
    `split` GPUs (tensor parallelism) and decodes `batch` sequences, gpus // split copies side by
    side. Step latency and fit are one copy's (`tensor_parallel_napkin`); the throughput counts
    every copy."""
    if gpus % split:
        raise ValueError(f"the split G = {split} must divide the {gpus} GPUs")
    r = tensor_parallel_napkin(model, hw, batch, seq_len, split, link,
                               bytes_per_param=bytes_per_param,
                               allreduce_latency_s=allreduce_latency_s)
    copies = gpus // split
    return {"split": split, "batch": r["batch"], "bytes_per_param": bytes_per_param,
            "copies": copies, "latency_s": r["latency_s"], "fits": r["fits"],
            "memory_per_gpu_bytes": r["memory_per_gpu_bytes"],
            "throughput_tok_s": copies * r["throughput_tok_s"]}


def best_serving_config(model: ModelConfig | str, hw: Hardware | str, seq_len: int, gpus: int,
                        slo_s: float, precisions=(2,), link: float | str = "nvlink-h100",
                        allreduce_latency_s: float = 0.0) -> dict | None:
    """The configuration (`serving_outcome`) with the most throughput among those that fit and
    whose step latency is at most `slo_s`; None if none does. Splits G divide the GPUs and the
    model's N and K. For each split and precision a copy's throughput B / latency grows with B,
    and latency and memory are linear in B: the best B is the largest both limits allow (solved
    from two points of the line, then stepped to the exact edge)."""
    cfg = get_model(model)
    best = None
    for split in range(1, gpus + 1):
        if gpus % split or cfg.n_heads % split or cfg.n_kv_heads % split:
            continue
        for bpp in precisions:
            def at(b, split=split, bpp=bpp):
                return serving_outcome(cfg, hw, seq_len, gpus, split, b, bpp, link,
                                       allreduce_latency_s)

            def ok(r):
                return r["fits"] and r["latency_s"] <= slo_s

            one, two = at(1), at(2)
            if not ok(one):
                continue
            dt, dm = two["latency_s"] - one["latency_s"], (two["memory_per_gpu_bytes"]
                                                           - one["memory_per_gpu_bytes"])
            b = min((slo_s - one["latency_s"]) / dt, (get_hardware(hw).memory_bytes
                                                      - one["memory_per_gpu_bytes"]) / dm)
            b = max(1, 1 + math.floor(b))
            while b > 1 and not ok(at(b)):
                b -= 1
            while ok(at(b + 1)):
                b += 1
            r = at(b)
            if best is None or r["throughput_tok_s"] > best["throughput_tok_s"]:
                best = r
    return best


# ============================================================================================
# 5. A measured roofline: the same two roofs, read off timings of a real machine (e.g. a CPU)
# ============================================================================================


def matmul_counts(batch: int, d_in: int, d_out: int, bytes_per_value: float = 2) -> tuple:
    """(FLOPs, bytes) of one X (batch x d_in) @ W (d_in x d_out) as numbers: the counts of
    `matmul_flops_and_bytes` at this shape, with `bytes_per_value` bytes per value
    (2 = bf16, 4 = fp32). FLOPs 2*B*D*F; bytes read X and W, write Y."""
    for name, value in (("batch", batch), ("d_in", d_in), ("d_out", d_out)):
        _check_positive_int(name, value)
    bytes_per_value = _check_bytes("bytes_per_value", bytes_per_value)
    flops = 2 * batch * d_in * d_out
    nbytes = bytes_per_value * (batch * d_in + d_in * d_out + batch * d_out)
    return flops, nbytes


def empirical_roofline(intensity, flops_per_s) -> dict:
    """The roofline that measured points prove this machine has at least:

        peak      = the best FLOP/s any point reached            (the flat roof)
        bandwidth = the best bytes/s any point reached,
                    i.e. max(flops_per_s / intensity)            (the slanted roof)
        ridge     = peak / bandwidth                             (this machine's accelerator intensity)

    Every point then lies on or under min(peak, bandwidth * intensity), and touches it at least
    twice. Both roofs are lower bounds on the hardware's true figures."""
    intensity, flops_per_s = [float(x) for x in intensity], [float(y) for y in flops_per_s]
    if not intensity or len(intensity) != len(flops_per_s):
        raise ValueError("need the same (nonzero) number of intensities and FLOP/s measurements")
    if any(not (x > 0 and math.isfinite(x)) for x in intensity + flops_per_s):
        raise ValueError("intensities and FLOP/s must be positive finite numbers")
    peak = max(flops_per_s)
    bandwidth = max(y / x for x, y in zip(intensity, flops_per_s))
    return {"peak_flops_per_s": peak, "bandwidth_bytes_per_s": bandwidth,
            "ridge_intensity": peak / bandwidth}


def roofline_flops_per_s(intensity: float, peak_flops_per_s: float,
                         bandwidth_bytes_per_s: float) -> float:
    """The napkin prediction: attainable FLOP/s = min(peak, bandwidth * intensity)."""
    return min(peak_flops_per_s, bandwidth_bytes_per_s * intensity)


def format_row(r: dict) -> str:
    return (f"{r['model']:>12} on {r['gpu']}: B={r['batch']:<4} K={r['kv_heads']:<3} "
            f"params={r['params'] / 1e9:.2f}B  memory={r['memory_bytes'] / 1e9:7.1f} GB  "
            f"latency={r['latency_s'] * 1e3:6.2f} ms  throughput={r['throughput_tok_s']:8.1f} tok/s"
            f"  {'fits' if r['fits'] else 'does NOT fit'}")


if __name__ == "__main__":  # python -m minillm.roofline: the lecture's table
    print(f"accelerator intensity: h100 {accelerator_intensity('h100'):.0f}, "
          f"a100 {accelerator_intensity('a100'):.0f}, h200 {accelerator_intensity('h200'):.0f}")
    for kv in (None, 8):
        for b in (1, 64, 256):
            print(format_row(napkin("llama-2-13b", "h100", batch=b, seq_len=1000, kv_heads=kv)))
    print("4 H100s, Llama-2-13B, S = 1000, all-reduce latency 5 us: copies | split (NVLink, PCIe)")
    for b in (1, 64, 256):
        nv, pc = (tensor_parallel_napkin("llama-2-13b", "h100", b, 1000, 4, link,
                                         allreduce_latency_s=5e-6) for link in ("nvlink-h100", "pcie"))
        print(f"  B={b:<4} copies {nv['copies_latency_s'] * 1e3:6.2f} ms "
              f"{nv['copies_throughput_tok_s']:7.0f} tok/s {'fits' if nv['copies_fit'] else 'no fit'}"
              f" | NVLink {nv['latency_s'] * 1e3:5.2f} ms (all-reduces {nv['comm_s'] * 1e3:.2f})"
              f" {nv['throughput_tok_s']:6.0f} tok/s | PCIe {pc['latency_s'] * 1e3:5.2f} ms "
              f"(all-reduces {pc['comm_s'] * 1e3:.2f}) {pc['throughput_tok_s']:6.0f} tok/s")
