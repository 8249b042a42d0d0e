"""minillm: a tiny LLM inference stack, built lab by lab.

    import minillm
    model = minillm.load("target")            # shipped Shakespeare model (or a checkpoint dir)
    tok = minillm.load_tokenizer("target")
    logits = model(torch.tensor([tok.encode("To be, or not")]))   # [1, T, vocab]
"""
from __future__ import annotations

from pathlib import Path

import torch

from .config import ModelConfig
from .model import Transformer
from .tokenizer import Tokenizer

__version__ = "0.1.0"

ASSETS = Path(__file__).resolve().parent / "assets"
SHIPPED = {"target": ASSETS / "target", "draft": ASSETS / "draft",
           "draft-distilled": ASSETS / "draft-distilled",
           "hybrid": ASSETS / "hybrid", "diffusion": ASSETS / "diffusion"}      # lab 09


def resolve(name_or_path: str | Path) -> Path:
    """A shipped model name ('target', 'draft', 'draft-distilled', 'hybrid', 'diffusion') or a
    checkpoint directory -> its directory."""
    if isinstance(name_or_path, str) and name_or_path in SHIPPED:
        path = SHIPPED[name_or_path]
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"shipped model {name_or_path!r} is missing its files in {path}")
        return path
    path = Path(name_or_path)
    if path.is_dir():
        return path
    raise ValueError(f"unknown model {str(name_or_path)!r}: use one of {sorted(SHIPPED)} "
                     "or a local checkpoint directory (config.json + *.safetensors)")


def load(name_or_path: str | Path = "target", dtype: torch.dtype = torch.float32,
         device: str | torch.device = "cpu") -> Transformer:
    """An eval-mode `Transformer` for a shipped name or a local checkpoint directory
    (ours or a Hugging Face Llama/Qwen2 one)."""
    from .weights import load_checkpoint
    return load_checkpoint(resolve(name_or_path), dtype=dtype, device=device)


def load_tokenizer(name_or_path: str | Path = "target") -> Tokenizer:
    path = resolve(name_or_path) / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"no tokenizer.json in {path.parent}")
    return Tokenizer.from_file(path)


__all__ = ["ModelConfig", "Transformer", "Tokenizer", "load", "load_tokenizer", "SHIPPED"]
