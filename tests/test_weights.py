"""Checkpoints on disk: save/load round trips and clear errors for broken checkpoint directories."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import minillm
from minillm.config import ModelConfig
from minillm.model import Transformer
from minillm.weights import INDEX, WEIGHTS, load_checkpoint, read_state_dict, save_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")   # fixture in conftest.py


def tiny_model(seed: int = 0, **overrides) -> Transformer:
    config = ModelConfig(**{**dict(vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2,
                                   hidden_dim=48, max_seq_len=64), **overrides})
    torch.manual_seed(seed)
    model = Transformer(config).eval()
    with torch.no_grad():                 # norms start at 1: make them matter too
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return model


def saved(path, **overrides):
    save_checkpoint(tiny_model(**overrides), path)
    return path


def edit_config(path, **changes):
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(changes)
    (path / "config.json").write_text(json.dumps(cfg))


def shard(path, n_shards: int = 2):
    """Split path/model.safetensors into n HF-style shards plus model.safetensors.index.json."""
    state = load_file(str(path / WEIGHTS))
    names = sorted(state)
    weight_map = {}
    for i in range(n_shards):
        fname = f"model-{i + 1:05d}-of-{n_shards:05d}.safetensors"
        part = {k: state[k] for k in names[i::n_shards]}
        save_file(part, str(path / fname), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, fname))
    (path / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (path / WEIGHTS).unlink()
    return path


IDS = torch.randint(0, 64, (2, 11), generator=torch.Generator().manual_seed(0))


# --- round trips -------------------------------------------------------------------------------

@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_round_trip_identical_logits(tmp_path, tie):
    model = tiny_model(tie_embeddings=tie)
    save_checkpoint(model, tmp_path)
    loaded = minillm.load(tmp_path)
    assert loaded.config == model.config
    assert not loaded.training
    assert (loaded.lm_head.weight is loaded.embed_tokens.weight) == tie
    with torch.no_grad():
        assert torch.equal(loaded(IDS), model(IDS))


def test_tied_checkpoint_stores_embedding_once(tmp_path):
    keys = set(load_file(str(saved(tmp_path, tie_embeddings=True) / WEIGHTS)))
    assert "model.embed_tokens.weight" in keys and "lm_head.weight" not in keys


def test_sharded_round_trip(tmp_path):
    model = tiny_model(tie_embeddings=False)
    shard(save_checkpoint(model, tmp_path), n_shards=3)
    with torch.no_grad():
        assert torch.equal(load_checkpoint(tmp_path)(IDS), model(IDS))


def test_bf16_checkpoint_loads_as_fp32(tmp_path):
    model = tiny_model(tie_embeddings=False)
    save_checkpoint(model, tmp_path, dtype=torch.bfloat16)
    assert json.loads((tmp_path / "config.json").read_text())["torch_dtype"] == "bfloat16"
    assert all(v.dtype == torch.bfloat16 for v in load_file(str(tmp_path / WEIGHTS)).values())

    loaded = minillm.load(tmp_path)               # default dtype: fp32
    assert all(p.dtype == torch.float32 for p in loaded.parameters())
    for name, p in model.state_dict().items():    # exactly the bf16-rounded weights
        assert torch.equal(loaded.state_dict()[name], p.to(torch.bfloat16).float()), name
    with torch.no_grad():
        torch.testing.assert_close(loaded(IDS), model(IDS), atol=2e-2, rtol=2e-2)


# --- errors ------------------------------------------------------------------------------------

def test_unknown_model_name():
    with pytest.raises(ValueError, match=r"unknown model 'nope': use one of \["):
        minillm.load("nope")


def test_shipped_model_without_files(tmp_path, monkeypatch):
    monkeypatch.setitem(minillm.SHIPPED, "target", tmp_path / "target")
    with pytest.raises(FileNotFoundError, match="shipped model 'target' is missing its files"):
        minillm.load("target")


def test_missing_config_json(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        minillm.load(tmp_path)


def test_config_json_not_json(tmp_path):
    saved(tmp_path)
    (tmp_path / "config.json").write_text("{this is not json")
    with pytest.raises(ValueError, match="corrupt config.json"):
        minillm.load(tmp_path)


def test_config_json_missing_field(tmp_path):
    saved(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    del cfg["hidden_size"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="lacks the field 'hidden_size'"):
        minillm.load(tmp_path)


def test_missing_safetensors(tmp_path):
    (saved(tmp_path) / WEIGHTS).unlink()
    with pytest.raises(FileNotFoundError, match=r"no model\.safetensors"):
        minillm.load(tmp_path)


@pytest.mark.parametrize("garbage", [b"definitely not a safetensors file" * 4, b"abc",
                                     b"\x10\x00\x00\x00\x00\x00\x00\x00{not json here!}"],
                         ids=["huge-header", "too-short", "bad-header-json"])
def test_corrupt_safetensors(tmp_path, garbage):
    (saved(tmp_path) / WEIGHTS).write_bytes(garbage)
    with pytest.raises(ValueError, match=r"corrupt safetensors file .*model\.safetensors"):
        minillm.load(tmp_path)


def test_truncated_safetensors(tmp_path):
    weights = saved(tmp_path) / WEIGHTS
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(ValueError, match="corrupt safetensors file"):
        minillm.load(tmp_path)


def test_shard_listed_in_index_but_missing(tmp_path):
    shard(saved(tmp_path), n_shards=2)
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(FileNotFoundError,
                       match=r"shard model-00002-of-00002\.safetensors listed in .* is missing"):
        minillm.load(tmp_path)


def test_shapes_do_not_match_config(tmp_path):
    edit_config(saved(tmp_path), intermediate_size=40)       # weights were saved with 48
    with pytest.raises(ValueError, match=r"mlp\.\w+_proj\.weight has shape .*config expects"):
        minillm.load(tmp_path)


def test_vocab_does_not_match_config(tmp_path):
    edit_config(saved(tmp_path), vocab_size=100)
    with pytest.raises(ValueError, match=r"embed_tokens\.weight has shape \(64, 32\), "
                                         r"config expects \(100, 32\)"):
        minillm.load(tmp_path)


def test_missing_tensor(tmp_path):
    weights = saved(tmp_path) / WEIGHTS
    state = load_file(str(weights))
    del state["model.layers.1.mlp.up_proj.weight"]
    save_file(state, str(weights))
    with pytest.raises(ValueError, match=r"missing \['layers\.1\.mlp\.up_proj\.weight'\]"):
        minillm.load(tmp_path)


def test_untied_config_without_lm_head(tmp_path):
    edit_config(saved(tmp_path, tie_embeddings=True), tie_word_embeddings=False)
    with pytest.raises(ValueError, match=r"missing \['lm_head\.weight'\]"):
        minillm.load(tmp_path)


def test_unexpected_tensors(tmp_path):
    edit_config(saved(tmp_path), num_hidden_layers=1)        # weights hold two layers
    with pytest.raises(ValueError, match=r"does not match its config: missing \[\], "
                                         r"unexpected \['layers\.1\."):
        minillm.load(tmp_path)


ROPE_SCALING = [
    pytest.param({"rope_theta": 500000.0,           # transformers 4.x layout
                  "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0,
                                   "original_max_position_embeddings": 8192}}, id="4.x-llama3"),
    pytest.param({"rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0,   # 5.x
                                      "factor": 8.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0,
                                      "original_max_position_embeddings": 8192}}, id="5.x-llama3"),
    pytest.param({"rope_scaling": {"type": "linear", "factor": 2.0}}, id="4.x-linear-old-key"),
    pytest.param({"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, id="5.x-yarn"),
]


@pytest.mark.parametrize("rope", ROPE_SCALING)
def test_unsupported_rope_scaling(tmp_path, rope):
    edit_config(saved(tmp_path), **rope)
    with pytest.raises(ValueError, match=r"rope scaling '\w+' is not supported"):
        minillm.load(tmp_path)


@pytest.mark.parametrize("model_type", ["gpt2", "gemma", "mixtral"])
def test_unsupported_model_type(tmp_path, model_type):
    edit_config(saved(tmp_path), model_type=model_type)
    with pytest.raises(ValueError, match=f"unsupported model_type '{model_type}'"):
        minillm.load(tmp_path)


def test_unsupported_activation(tmp_path):
    edit_config(saved(tmp_path), hidden_act="gelu")
    with pytest.raises(ValueError, match="hidden_act 'gelu' is not supported"):
        minillm.load(tmp_path)


def test_read_state_dict_uses_our_names(tmp_path):
    state = read_state_dict(saved(tmp_path, tie_embeddings=False))
    assert "embed_tokens.weight" in state and "lm_head.weight" in state
    assert not any(k.startswith("model.") for k in state)


def test_qwen2_style_model_saves_as_qwen2_and_round_trips(tmp_path):
    torch.manual_seed(3)
    cfg = ModelConfig(vocab_size=50, dim=32, n_layers=1, n_heads=4, n_kv_heads=2, hidden_dim=48,
                      qkv_bias=True, tie_embeddings=False)
    model = Transformer(cfg).eval()
    save_checkpoint(model, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "qwen2"
    back = load_checkpoint(tmp_path)
    assert back.config == cfg
    ids = torch.randint(0, 50, (1, 6))
    with torch.no_grad():
        assert torch.equal(model(ids), back(ids))


def test_corrupt_index_names_the_file(tmp_path):
    torch.manual_seed(0)
    save_checkpoint(Transformer(ModelConfig(vocab_size=20, dim=16, n_layers=1, n_heads=2,
                                            hidden_dim=16)), tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text("{oops")
    with pytest.raises(ValueError, match="index.json"):
        load_checkpoint(tmp_path)
