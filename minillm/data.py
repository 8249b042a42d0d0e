"""The shipped corpus: Shakespeare's works, split by whole works into train and held-out val.

See data/PROVENANCE.md for where the text comes from and data/build_corpus.py for how it was made.
"""
from __future__ import annotations

import gzip
from functools import lru_cache
from pathlib import Path

import torch

CORPUS_DIR = Path(__file__).resolve().parent.parent / "data" / "shakespeare"
SPLITS = ("train", "val")


@lru_cache(maxsize=None)
def load_text(split: str = "val") -> str:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {SPLITS}")
    path = CORPUS_DIR / f"{split}.txt.gz"
    if not path.is_file():
        raise FileNotFoundError(f"corpus file missing: {path} (rebuild with data/build_corpus.py)")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return f.read()


def load_tokens(tokenizer, split: str = "val") -> torch.Tensor:
    """The whole split as one 1-D tensor of token ids (works separated by <|endoftext|>)."""
    return torch.tensor(tokenizer.encode(load_text(split)), dtype=torch.long)
