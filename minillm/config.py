"""Model shapes: one dataclass for every Llama-family decoder minillm runs.

The lecture's notation maps onto the fields like this:
    D = dim, F = hidden_dim, L = n_layers, N = n_heads, K = n_kv_heads, H = head_dim, V = vocab_size.

`ModelConfig.from_hf` reads a Hugging Face ``config.json`` (Llama, Qwen2, Mistral without a
sliding window; transformers 4.x and 5.x layouts), and `to_hf` writes one back so that our own
checkpoints are also loadable by `transformers`.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields


@dataclass
class ModelConfig:
    vocab_size: int = 4096
    dim: int = 384                  # D, the residual stream width
    n_layers: int = 6               # L
    n_heads: int = 6                # N query heads
    n_kv_heads: int | None = None   # K key/value heads (None: same as n_heads, i.e. MHA)
    hidden_dim: int = 1024          # F, the SwiGLU MLP width
    head_dim: int | None = None     # H (None: dim // n_heads)
    max_seq_len: int = 512          # longest context the model was trained for
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    qkv_bias: bool = False          # Qwen2 puts a bias on q, k and v
    o_bias: bool = False            # Llama's `attention_bias` also biases the output projection
    mlp_bias: bool = False
    tie_embeddings: bool = True     # lm_head shares the embedding matrix
    mixers: tuple | None = None     # per layer "attention" | "linear" (lab 09); None: attention
    causal: bool = True             # False: bidirectional (the masked-diffusion model, lab 09)

    def __post_init__(self):
        if self.mixers is not None:
            self.mixers = tuple(self.mixers)
            if len(self.mixers) != self.n_layers or set(self.mixers) - {"attention", "linear"}:
                raise ValueError(f"mixers must name 'attention' or 'linear' for each of the "
                                 f"{self.n_layers} layers, got {self.mixers}")
            if set(self.mixers) == {"attention"}:
                self.mixers = None           # one spelling for an all-attention model
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads
        if self.head_dim is None:
            if self.n_heads <= 0 or self.dim % self.n_heads:
                raise ValueError(f"dim={self.dim} is not divisible by n_heads={self.n_heads}; "
                                 "set head_dim explicitly")
            self.head_dim = self.dim // self.n_heads
        for name in ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "hidden_dim",
                     "head_dim", "max_seq_len"):
            if int(getattr(self, name)) <= 0:
                raise ValueError(f"ModelConfig.{name} must be positive, got {getattr(self, name)}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads={self.n_heads} must be a multiple of n_kv_heads="
                             f"{self.n_kv_heads} (each KV head serves a whole group of query heads)")
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for rotary embeddings")

    # --- derived sizes -------------------------------------------------------------------
    @property
    def n_rep(self) -> int:
        """Query heads per KV head (the GQA group size G, with K * G = N)."""
        return self.n_heads // self.n_kv_heads

    def num_params(self) -> int:
        """Exact parameter count of `minillm.model.Transformer` built from this config."""
        D, F, V, H = self.dim, self.hidden_dim, self.vocab_size, self.head_dim
        q, kv = self.n_heads * H, self.n_kv_heads * H
        attn = D * q + 2 * D * kv + q * D
        if self.qkv_bias:
            attn += q + 2 * kv
        if self.o_bias:
            attn += D
        mlp = 3 * D * F + (2 * F + D if self.mlp_bias else 0)
        per_layer = attn + mlp + 2 * D
        head = 0 if self.tie_embeddings else V * D
        return V * D + self.n_layers * per_layer + D + head

    @property
    def attention_layers(self) -> list[int]:
        """The layers with softmax attention (and so a KV cache); the rest are linear."""
        return [i for i in range(self.n_layers)
                if self.mixers is None or self.mixers[i] == "attention"]

    def kv_bytes_per_token(self, bytes_per_value: int = 2) -> int:
        """K*H*L*2 values (keys and values) per token: the lecture's S·K·H·L·2·2 at S = 1
        (L counts the attention layers only: a linear layer's state does not grow)."""
        return self.n_kv_heads * self.head_dim * len(self.attention_layers) * 2 * bytes_per_value

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown ModelConfig fields: {sorted(unknown)}")
        return cls(**d)

    # --- Hugging Face config.json ----------------------------------------------------------
    @classmethod
    def from_hf(cls, hf: dict) -> "ModelConfig":
        """Parse a Hugging Face Llama/Qwen2/Mistral config dict (transformers 4.x or 5.x)."""
        model_type = hf.get("model_type", "llama")
        if model_type == "minillm":          # our own hybrid / diffusion models (lab 09)
            base = asdict(cls.from_hf({**hf, "model_type": "llama"}))
            return cls(**{**base, "mixers": hf.get("layer_types"),
                          "causal": bool(hf.get("is_causal", True))})
        if model_type not in ("llama", "qwen2", "mistral"):
            raise ValueError(f"unsupported model_type {model_type!r}: minillm loads Llama-family "
                             "decoders (llama, qwen2, mistral)")
        # transformers 5.x moved rope settings into `rope_parameters`; 4.x keeps them at top level
        rope = hf.get("rope_parameters") or {}
        theta = rope.get("rope_theta", hf.get("rope_theta", 10000.0))
        scaling = hf.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type")) or scaling.get("rope_type",
                                                                           scaling.get("type"))
        if rope_type not in (None, "default"):
            raise ValueError(f"rope scaling {rope_type!r} is not supported by minillm "
                             "(only plain RoPE); refusing to load a model that would run wrong")
        if model_type == "mistral" and hf.get("sliding_window") not in (None, 0) and \
                hf["sliding_window"] < hf.get("max_position_embeddings", 0):
            raise ValueError("Mistral sliding-window attention is not supported by the base "
                             "loader; its outputs would differ beyond the window")
        if model_type == "qwen2" and hf.get("use_sliding_window", False):
            raise ValueError("Qwen2 use_sliding_window=True is not supported by the base loader")
        n_heads = hf["num_attention_heads"]
        attention_bias = bool(hf.get("attention_bias", False))
        act = hf.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"hidden_act {act!r} is not supported (SwiGLU uses silu)")
        return cls(
            vocab_size=hf["vocab_size"],
            dim=hf["hidden_size"],
            n_layers=hf["num_hidden_layers"],
            n_heads=n_heads,
            n_kv_heads=hf.get("num_key_value_heads") or n_heads,
            hidden_dim=hf["intermediate_size"],
            head_dim=hf.get("head_dim") or hf["hidden_size"] // n_heads,
            max_seq_len=hf.get("max_position_embeddings", 2048),
            rope_theta=float(theta),
            norm_eps=hf.get("rms_norm_eps", 1e-6),
            qkv_bias=(model_type == "qwen2") or attention_bias,
            o_bias=attention_bias and model_type != "qwen2",
            mlp_bias=bool(hf.get("mlp_bias", False)),
            tie_embeddings=bool(hf.get("tie_word_embeddings", False)),  # HF default: untied
        )

    def to_hf(self) -> dict:
        """A config.json that `transformers` can read (our checkpoints use HF layout): Llama, or
        Qwen2 when q/k/v carry a bias and the output projection does not."""
        qwen2 = self.qkv_bias and not self.o_bias
        if self.o_bias and not self.qkv_bias:
            raise ValueError("a Llama config.json can only express q/k/v and o biases together")
        if self.mixers is not None or not self.causal:
            # not a Llama: a model_type transformers refuses, rather than loads wrong
            return {**self._llama_fields(), "architectures": ["MinillmForLab09"],
                    "model_type": "minillm", "layer_types": list(self.mixers or
                    ["attention"] * self.n_layers), "is_causal": self.causal}
        return {"architectures": ["Qwen2ForCausalLM" if qwen2 else "LlamaForCausalLM"],
                "model_type": "qwen2" if qwen2 else "llama", **self._llama_fields()}

    def _llama_fields(self) -> dict:
        return {
            "vocab_size": self.vocab_size,
            "hidden_size": self.dim,
            "intermediate_size": self.hidden_dim,
            "num_hidden_layers": self.n_layers,
            "num_attention_heads": self.n_heads,
            "num_key_value_heads": self.n_kv_heads,
            "head_dim": self.head_dim,
            "max_position_embeddings": self.max_seq_len,
            "rope_theta": self.rope_theta,
            "rms_norm_eps": self.norm_eps,
            "attention_bias": self.qkv_bias,
            "mlp_bias": self.mlp_bias,
            "tie_word_embeddings": self.tie_embeddings,
            "hidden_act": "silu",
            "torch_dtype": "float32",
        }


# The two shipped checkpoints (trained by minillm/train.py): full multi-head attention in the
# target, so lab 03 can convert it to GQA/MQA/MLA/CLA; the draft has <= 1/8 of its parameters.
SHIPPED_SHAPES: dict[str, ModelConfig] = {
    "target": ModelConfig(vocab_size=4096, dim=384, n_layers=6, n_heads=6, hidden_dim=1024,
                          max_seq_len=512),
    "draft": ModelConfig(vocab_size=4096, dim=128, n_layers=4, n_heads=4, hidden_dim=352,
                         max_seq_len=512),
    # lab 09: seven linear-attention layers to one softmax-attention layer (Jamba's 1:7), about
    # the target's parameters (8 thinner blocks instead of 6); and a bidirectional masked-
    # diffusion model of the target's shape, whose extra token id 4096 is [MASK]
    "hybrid": ModelConfig(vocab_size=4096, dim=384, n_layers=8, n_heads=6, hidden_dim=704,
                          max_seq_len=512, mixers=("linear",) * 4 + ("attention",)
                          + ("linear",) * 3),
    "diffusion": ModelConfig(vocab_size=4097, dim=384, n_layers=6, n_heads=6, hidden_dim=1024,
                             max_seq_len=512, causal=False),
}

# Shapes of real models, for napkin math (roofline.py) and for building random test models.
PRESETS: dict[str, ModelConfig] = {
    # the lecture's running example: S=1000, D=5120, F=13824, N=K=40, H=128, L=40, V=32000
    "llama-2-13b": ModelConfig(vocab_size=32000, dim=5120, n_layers=40, n_heads=40,
                               n_kv_heads=40, hidden_dim=13824, max_seq_len=4096,
                               tie_embeddings=False),
    "llama-2-7b": ModelConfig(vocab_size=32000, dim=4096, n_layers=32, n_heads=32,
                              hidden_dim=11008, max_seq_len=4096, tie_embeddings=False),
    "llama-3-8b": ModelConfig(vocab_size=128256, dim=4096, n_layers=32, n_heads=32,
                              n_kv_heads=8, hidden_dim=14336, max_seq_len=8192,
                              rope_theta=500000.0, tie_embeddings=False),
}
