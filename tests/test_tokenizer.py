"""Byte-level BPE: any Unicode string round-trips; the shipped tokenizer compresses English."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minillm
from minillm.tokenizer import EOS, Tokenizer
from minillm.train import TOKENIZER_FILE


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_file(TOKENIZER_FILE)


def test_vocab_and_eos(tok):
    assert 2000 <= tok.vocab_size <= 4096
    assert tok.eos_id is not None and tok.decode([tok.eos_id]) == EOS


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_round_trip_any_unicode(tok, text):
    ids = tok.encode(text)
    assert all(0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == text


@pytest.mark.parametrize("text", ["", " ", "\n\n", "🤖 naïve café — ∑x²", "\x00\x01\uffff",
                                  "To be, or not to be", "a" * 1000, f"x{EOS}y"])
def test_round_trip_edge_cases(tok, text):
    assert tok.decode(tok.encode(text)) == text


def test_english_compresses(tok):
    text = "To be, or not to be, that is the question: Whether 'tis nobler in the mind to suffer"
    assert len(tok.encode(text)) < len(text) / 2.5


def test_bad_input(tok, tmp_path):
    with pytest.raises(TypeError):
        tok.encode(b"bytes")
    with pytest.raises(ValueError, match="out of range"):
        tok.decode([tok.vocab_size])
    with pytest.raises(FileNotFoundError):
        Tokenizer.from_file(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="cannot read tokenizer"):
        Tokenizer.from_file(tmp_path / "bad.json")


def test_shipped_models_share_the_tokenizer():
    a, b = minillm.load_tokenizer("target"), minillm.load_tokenizer("draft")
    text = "Now is the winter of our discontent"
    assert a.encode(text) == b.encode(text) and a.vocab_size == b.vocab_size


def test_the_first_ids_of_a_split_come_from_a_prefix_of_its_text(tok):
    """load_tokens(max_tokens=n) encodes only a prefix of the text (a held-out perplexity reads
    ~1k of the split's 79k ids): its ids are the whole split's first n, wherever n falls."""
    from minillm.data import load_tokens
    full = load_tokens(tok, "val")
    for n in (2, 129, 513, 1024, 1025, 4096, 9000, len(full) - 1, len(full), len(full) + 3):
        assert load_tokens(tok, "val", n).tolist() == full[:n].tolist(), n
