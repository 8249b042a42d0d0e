"""Checkpoints on disk: safetensors weights + config.json + tokenizer.json, in Hugging Face layout.

Our own checkpoints are written exactly like a Hugging Face Llama checkpoint (``model.`` prefixed
parameter names, a Llama ``config.json``), so one loader reads ours, local Hugging Face Llama /
Qwen2 / Mistral directories (single file or sharded with ``model.safetensors.index.json``), and
``transformers`` can read ours.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from .config import ModelConfig
from .model import Transformer

WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"


def _to_ours(name: str) -> str:
    return name[len("model."):] if name.startswith("model.") else name


def _to_hf(name: str) -> str:
    return name if name.startswith("lm_head.") else "model." + name


def read_config(path: str | Path) -> tuple[ModelConfig, dict]:
    path = Path(path)
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise FileNotFoundError(f"no config.json in checkpoint directory {path}")
    try:
        hf = json.loads(cfg_file.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"corrupt config.json in {path}: {e}") from e
    try:
        return ModelConfig.from_hf(hf), hf
    except KeyError as e:
        raise ValueError(f"config.json in {path} lacks the field {e}") from e


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint directory, keyed by our parameter names."""
    path = Path(path)
    if (path / INDEX).is_file():
        try:
            files = sorted(set(json.loads((path / INDEX).read_text())["weight_map"].values()))
        except (json.JSONDecodeError, KeyError, AttributeError, TypeError) as e:
            raise ValueError(f"corrupt {INDEX} in {path} (need a 'weight_map'): {e}") from e
    elif (path / WEIGHTS).is_file():
        files = [WEIGHTS]
    else:
        found = sorted(p.name for p in path.glob("*.safetensors"))
        if not found:
            raise FileNotFoundError(f"no {WEIGHTS} (or sharded {INDEX}) in {path}")
        files = found
    state = {}
    for f in files:
        if not (path / f).is_file():
            raise FileNotFoundError(f"shard {f} listed in {INDEX} is missing from {path}")
        try:
            part = load_file(str(path / f))
        except (SafetensorError, OSError) as e:
            raise ValueError(f"corrupt safetensors file {path / f}: {e}") from e
        state.update({_to_ours(k): v for k, v in part.items()})
    return state


def load_checkpoint(path: str | Path, dtype: torch.dtype = torch.float32,
                    device: str | torch.device = "cpu") -> Transformer:
    """Build the model described by ``path/config.json`` and load its weights (eval mode)."""
    config, _ = read_config(path)
    state = read_state_dict(path)
    state = {k: v for k, v in state.items() if "rotary_emb" not in k}   # old HF buffers
    if config.tie_embeddings:
        state.pop("lm_head.weight", None)
    model = Transformer(config)
    expected = model.state_dict()
    if config.tie_embeddings:
        expected = {k: v for k, v in expected.items() if k != "lm_head.weight"}
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise ValueError(f"checkpoint {path} does not match its config: missing {missing[:6]}"
                         f"{'...' if len(missing) > 6 else ''}, unexpected {unexpected[:6]}")
    for k, v in state.items():
        if v.shape != expected[k].shape:
            raise ValueError(f"checkpoint {path}: {k} has shape {tuple(v.shape)}, "
                             f"config expects {tuple(expected[k].shape)}")
    model.load_state_dict({k: v.to(dtype) for k, v in state.items()}, strict=False)
    return model.to(device=device, dtype=dtype).eval()


def save_checkpoint(model: Transformer, path: str | Path, tokenizer=None,
                    dtype: torch.dtype | None = None, extra: dict | None = None) -> Path:
    """Write model.safetensors + config.json (+ tokenizer.json) in Hugging Face Llama layout."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    state = {}
    for k, v in model.state_dict().items():
        if model.config.tie_embeddings and k == "lm_head.weight":
            continue
        v = v.detach().cpu()
        state[_to_hf(k)] = (v.to(dtype) if dtype is not None else v).contiguous()
    save_file(state, str(path / WEIGHTS), metadata={"format": "pt"})
    cfg = model.config.to_hf()
    cfg["torch_dtype"] = str(dtype or next(model.parameters()).dtype).replace("torch.", "")
    if tokenizer is not None:
        tokenizer.save(path / "tokenizer.json")
        if tokenizer.eos_id is not None:
            cfg["eos_token_id"] = cfg["bos_token_id"] = tokenizer.eos_id
    if extra:
        cfg["minillm"] = extra
    (path / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return path
