"""Byte-level BPE tokenizer (Hugging Face `tokenizers`), as GPT-2/Llama-3 style models use.

Text is first mapped to bytes, so *any* Unicode string encodes, and decoding the ids gives the
exact string back. BPE then merges frequent byte pairs into tokens; a vocabulary of a few
thousand tokens learned on Shakespeare turns ~4 characters of English into one token.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

from tokenizers import Tokenizer as _HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

EOS = "<|endoftext|>"


class Tokenizer:
    """encode(str) -> list[int], decode(list[int]) -> str, plus the end-of-text id."""

    def __init__(self, tok: _HFTokenizer, eos_token: str | None = EOS):
        self._tok = tok
        self.eos_id = tok.token_to_id(eos_token) if eos_token else None

    # --- construction -----------------------------------------------------------------------
    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int = 4096) -> "Tokenizer":
        tok = _HFTokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS],
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                      show_progress=False)
        tok.train_from_iterator(texts, trainer=trainer)
        return cls(tok)

    @classmethod
    def from_file(cls, path: str | Path) -> "Tokenizer":
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"tokenizer file not found: {path}")
        try:
            tok = _HFTokenizer.from_file(str(path))
        except Exception as e:  # tokenizers raises a bare Exception on bad JSON
            raise ValueError(f"cannot read tokenizer {path}: {e}") from e
        eos = EOS if tok.token_to_id(EOS) is not None else None
        return cls(tok, eos)

    def save(self, path: str | Path) -> None:
        self._tok.save(str(path))

    # --- use --------------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"encode expects a str, got {type(text).__name__}")
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids) -> str:
        ids = [int(i) for i in (ids.tolist() if hasattr(ids, "tolist") else ids)]
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"token ids out of range [0, {self.vocab_size}): {bad[:5]}")
        return self._tok.decode(ids, skip_special_tokens=False)

    def token_strings(self, ids) -> list[str]:
        """Each id decoded on its own (what the model 'sees' as one token)."""
        return [self.decode([i]) for i in ids]

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size}, eos_id={self.eos_id})"
