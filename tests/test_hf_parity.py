"""minillm vs Hugging Face `transformers`, which is used here only as a test oracle.

Each test builds a tiny random HF model (fp32, fixed seed, every parameter randomized: HF inits
norm weights to 1 and biases to 0, which would leave them untested), saves it with
``save_pretrained`` and loads it with ``minillm.load``. The two models must agree on logits
(max |diff| < 1e-4) and on a 12-step greedy continuation. The other direction, our
``save_checkpoint`` output loaded by ``AutoModelForCausalLM``, is checked the same way.
"""
from __future__ import annotations

import dataclasses
import inspect
import json

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

import minillm  # noqa: E402
from minillm.config import ModelConfig  # noqa: E402
from minillm.model import Transformer  # noqa: E402
from minillm.weights import read_config, save_checkpoint  # noqa: E402

TOL = 1e-4
STEPS = 12
TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=112, num_hidden_layers=2,
            num_attention_heads=4, max_position_embeddings=128)


pytestmark = pytest.mark.usefixtures("one_thread")   # fixture in conftest.py


def rope_kwargs(config_cls, theta: float) -> dict:
    """transformers 5.x takes `rope_parameters`, 4.x takes a top-level `rope_theta`."""
    if "rope_parameters" in inspect.signature(config_cls.__init__).parameters:
        return {"rope_parameters": {"rope_type": "default", "rope_theta": theta}}
    return {"rope_theta": theta}


def randomize_(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Random values for every parameter, norm weights around 1 and non-zero biases included."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():      # a tied lm_head is listed once
            noise = torch.randn(p.shape, generator=g)
            p.copy_(1.0 + 0.3 * noise if "norm" in name else 0.1 * noise)
    return model


def build_hf(config_cls, model_cls, seed: int = 0, **overrides):
    config = config_cls(**{**TINY, **overrides})
    if "head_dim" in overrides and getattr(config, "head_dim", None) != overrides["head_dim"]:
        pytest.skip(f"{config_cls.__name__} in this transformers version ignores head_dim")
    torch.manual_seed(seed)
    return randomize_(model_cls(config), seed).eval()


def random_ids(vocab_size: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab_size, (2, 17), generator=torch.Generator().manual_seed(seed))


def hf_logits(hf, ids):
    return hf(ids, use_cache=False).logits


def greedy(logits_fn, ids, steps: int = STEPS) -> torch.Tensor:
    """Append the last position's argmax `steps` times, re-running the full prefix each time."""
    for _ in range(steps):
        next_ids = logits_fn(ids)[:, -1].argmax(-1, keepdim=True)
        ids = torch.cat([ids, next_ids], dim=1)
    return ids


@torch.no_grad()
def assert_same_model(hf, ours, ids):
    expected, got = hf_logits(hf, ids), ours(ids)
    assert got.shape == expected.shape
    diff = (got - expected).abs().max().item()
    assert diff < TOL, f"max |logit diff| = {diff:.3g}"
    hf_tokens = greedy(lambda x: hf_logits(hf, x), ids)
    our_tokens = greedy(ours, ids)
    assert torch.equal(our_tokens, hf_tokens), f"greedy diverged:\n{our_tokens}\n{hf_tokens}"


# (config class, model class, config overrides, fields our parsed ModelConfig must have)
CASES = [
    pytest.param(LlamaConfig, LlamaForCausalLM, {}, {"n_kv_heads": 4, "tie_embeddings": False},
                 id="llama-mha"),
    pytest.param(LlamaConfig, LlamaForCausalLM, {"num_key_value_heads": 2}, {"n_kv_heads": 2},
                 id="llama-gqa"),
    pytest.param(LlamaConfig, LlamaForCausalLM, {"num_key_value_heads": 1}, {"n_kv_heads": 1},
                 id="llama-mqa"),
    pytest.param(LlamaConfig, LlamaForCausalLM,
                 {"num_key_value_heads": 2, "tie_word_embeddings": True},
                 {"tie_embeddings": True}, id="llama-tied"),
    pytest.param(Qwen2Config, Qwen2ForCausalLM, {"num_key_value_heads": 2},
                 {"qkv_bias": True, "o_bias": False}, id="qwen2-qkv-bias"),
    pytest.param(LlamaConfig, LlamaForCausalLM, rope_kwargs(LlamaConfig, 500000.0),
                 {"rope_theta": 500000.0}, id="llama-rope-theta"),
    pytest.param(LlamaConfig, LlamaForCausalLM,
                 {"num_key_value_heads": 2, "attention_bias": True},
                 {"qkv_bias": True, "o_bias": True}, id="llama-attention-bias"),
    pytest.param(LlamaConfig, LlamaForCausalLM, {"mlp_bias": True}, {"mlp_bias": True},
                 id="llama-mlp-bias"),
    pytest.param(LlamaConfig, LlamaForCausalLM, {"num_key_value_heads": 2, "head_dim": 32},
                 {"head_dim": 32}, id="llama-head-dim"),
    pytest.param(MistralConfig, MistralForCausalLM,
                 {"num_key_value_heads": 2, "sliding_window": None}, {"n_kv_heads": 2},
                 id="mistral-no-window"),
]


@pytest.mark.parametrize("config_cls, model_cls, overrides, expect", CASES)
def test_hf_checkpoint_parity(tmp_path, config_cls, model_cls, overrides, expect):
    hf = build_hf(config_cls, model_cls, **overrides)
    hf.save_pretrained(tmp_path, safe_serialization=True)
    ours = minillm.load(tmp_path)
    for field, value in expect.items():
        assert getattr(ours.config, field) == value, field
    assert_same_model(hf, ours, random_ids(hf.config.vocab_size))


def test_rope_theta_is_actually_tested(tmp_path):
    """The rope case would fail if the loader dropped rope_theta: the two thetas disagree."""
    hf = build_hf(LlamaConfig, LlamaForCausalLM, **rope_kwargs(LlamaConfig, 500000.0))
    hf.save_pretrained(tmp_path, safe_serialization=True)
    ours = minillm.load(tmp_path)
    wrong = Transformer(dataclasses.replace(ours.config, rope_theta=10000.0)).eval()
    wrong.load_state_dict(ours.state_dict())
    ids = random_ids(hf.config.vocab_size)
    with torch.no_grad():
        assert (wrong(ids) - hf_logits(hf, ids)).abs().max() > 100 * TOL


def test_sharded_hf_checkpoint(tmp_path):
    hf = build_hf(LlamaConfig, LlamaForCausalLM, num_key_value_heads=2)
    hf.save_pretrained(tmp_path, safe_serialization=True, max_shard_size="20KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    shards = set(index["weight_map"].values())
    assert len(shards) > 1 and not (tmp_path / "model.safetensors").exists()
    assert all((tmp_path / shard).is_file() for shard in shards)
    assert_same_model(hf, minillm.load(tmp_path), random_ids(hf.config.vocab_size))


# --- the other direction: our checkpoints in transformers ------------------------------------

OURS = [
    pytest.param(dict(), id="tied-mha"),
    pytest.param(dict(n_kv_heads=2, tie_embeddings=False), id="untied-gqa"),
    pytest.param(dict(n_kv_heads=1, qkv_bias=True, o_bias=True, mlp_bias=True), id="biases-mqa"),
    pytest.param(dict(n_kv_heads=2, head_dim=32, rope_theta=500000.0), id="head-dim-rope"),
]


@pytest.mark.parametrize("overrides", OURS)
def test_our_checkpoint_loads_in_transformers(tmp_path, overrides):
    config = ModelConfig(vocab_size=256, dim=64, n_layers=2, n_heads=4, hidden_dim=112,
                         max_seq_len=128, **overrides)
    torch.manual_seed(0)
    ours = randomize_(Transformer(config), seed=1).eval()
    save_checkpoint(ours, tmp_path)
    hf, info = AutoModelForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert not info["mismatched_keys"], info
    assert hf.dtype == torch.float32
    assert hf.config.tie_word_embeddings == config.tie_embeddings
    assert_same_model(hf.eval(), ours, random_ids(config.vocab_size))


# --- ModelConfig.from_hf on hand-written config dicts ---------------------------------------

LLAMA3_SHAPE = {"model_type": "llama", "vocab_size": 128256, "hidden_size": 4096,
                "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
                "num_key_value_heads": 8, "max_position_embeddings": 8192, "rms_norm_eps": 1e-5,
                "hidden_act": "silu", "tie_word_embeddings": False}


def test_from_hf_reads_both_rope_layouts():
    v4 = {**LLAMA3_SHAPE, "rope_theta": 500000.0, "rope_scaling": None}
    v5 = {**LLAMA3_SHAPE, "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}}
    a, b = ModelConfig.from_hf(v4), ModelConfig.from_hf(v5)
    assert a == b
    assert a.rope_theta == 500000.0 and a.n_kv_heads == 8 and a.head_dim == 128
    assert a.norm_eps == 1e-5 and a.tie_embeddings is False
    # 4.x also spelled a no-op scaling as {"rope_type": "default"} (or "type")
    assert ModelConfig.from_hf({**v4, "rope_scaling": {"rope_type": "default"}}) == a
    assert ModelConfig.from_hf({**v4, "rope_scaling": {"type": "default"}}) == a


def test_from_hf_defaults():
    minimal = {"vocab_size": 100, "hidden_size": 64, "intermediate_size": 96,
               "num_hidden_layers": 2, "num_attention_heads": 4}
    c = ModelConfig.from_hf(minimal)          # no model_type: Llama
    assert (c.n_kv_heads, c.head_dim, c.rope_theta) == (4, 16, 10000.0)
    assert c.tie_embeddings is False          # HF Llama/Qwen2/Mistral default to untied
    assert not (c.qkv_bias or c.o_bias or c.mlp_bias)
    # explicit nulls, as some config.json files have them
    assert ModelConfig.from_hf({**minimal, "num_key_value_heads": None, "head_dim": None}) == c


def test_from_hf_qwen2_and_attention_bias():
    base = {"vocab_size": 100, "hidden_size": 64, "intermediate_size": 96,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}
    qwen = ModelConfig.from_hf({**base, "model_type": "qwen2", "rope_theta": 1e6,
                                "use_sliding_window": False, "sliding_window": 131072})
    assert qwen.qkv_bias and not qwen.o_bias and qwen.rope_theta == 1e6
    llama = ModelConfig.from_hf({**base, "model_type": "llama", "attention_bias": True})
    assert llama.qkv_bias and llama.o_bias


@pytest.mark.parametrize("config", [
    ModelConfig(vocab_size=100, dim=64, n_layers=2, n_heads=4, hidden_dim=96),
    ModelConfig(vocab_size=100, dim=64, n_layers=2, n_heads=4, n_kv_heads=1, hidden_dim=96,
                head_dim=32, rope_theta=500000.0, norm_eps=1e-6, qkv_bias=True, o_bias=True,
                mlp_bias=True, tie_embeddings=False),
], ids=["default", "everything-set"])
def test_to_hf_round_trips(config):
    assert ModelConfig.from_hf(config.to_hf()) == config


def test_installed_transformers_config_parses(tmp_path):
    """Whatever layout the installed transformers writes, from_hf reads the same numbers."""
    hf_config = LlamaConfig(**TINY, num_key_value_heads=2, **rope_kwargs(LlamaConfig, 250000.0))
    hf_config.save_pretrained(tmp_path)
    config, raw = read_config(tmp_path)
    assert (config.dim, config.n_kv_heads, config.rope_theta) == (64, 2, 250000.0)
    assert ("rope_parameters" in raw) or ("rope_theta" in raw)
