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


def load_tokens(tokenizer, split: str = "val", max_tokens: int | None = None) -> torch.Tensor:
    """The whole split as one 1-D tensor of token ids (works separated by <|endoftext|>), or its
    first `max_tokens` ids.

    With `max_tokens`, only a prefix of the text is encoded, long enough that its ids run
    `_MARGIN` past `max_tokens`: byte-level BPE encodes each pre-token (a word, a run of spaces or
    of punctuation, a special token) on its own, and a pre-token ends where the text around it
    says, one character of look-ahead at most; so every id before the prefix's last pre-token
    is the whole split's. (The split is 231k characters; a held-out perplexity reads ~1k ids.)
    """
    text = load_text(split)
    if max_tokens is not None:
        chars = 8 * max_tokens + 1024                   # ~4 characters a token on this corpus
        while chars < len(text):
            ids = tokenizer.encode(text[:chars])
            if len(ids) >= max_tokens + _MARGIN:
                return torch.tensor(ids[:max_tokens], dtype=torch.long)
            chars *= 2
    ids = tokenizer.encode(text)
    return torch.tensor(ids if max_tokens is None else ids[:max_tokens], dtype=torch.long)


_MARGIN = 64        # ids past max_tokens that a prefix must encode to (the last ones may differ)
