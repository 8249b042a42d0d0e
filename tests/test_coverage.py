"""docs/COVERAGE.md, the map from the seeds' concepts to the labs, must name only things that exist.

The map is a set of markdown tables. A row has three cells: the seed concept, ending with its
source as `(SEED:FIRST-LAST)`; where the course teaches it; and notes. The checks:

* every backticked grade id (a span that is exactly `NN_name`) exists as an nbgrader `grade_id`
  in the notebook its prefix names, labs/NN_*/NN_*.ipynb;
* every slide reference, slides/NN_topic.md "## Title", names a `## ` title of that deck;
* every seed has rows, each seed's rows follow the seed's order, and (when the seed files can be
  found) every cited line lies inside its seed;
* a covered row cites a grade id or a slide; a "not covered" row says why.

Failures name the missing id or title and the row (its line in the map and its concept).
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
MAP = REPO / "docs" / "COVERAGE.md"
SEEDS = ("000", "001", "002", "003")          # lecture, notes, article, notes (DESIGN.md)
NOT_COVERED = "**not covered**"

BACKTICKED = re.compile(r"`([^`\n]+)`")
GRADE_ID = re.compile(r"\d\d_[a-z0-9_]+")
SLIDE_REF = re.compile(r'slides/(\d\d_[a-z0-9_]+)\.md\s+"(##[^"]*)"')
SOURCE = re.compile(r"\((\d{3}):(\d+)(?:-(\d+))?\)\s*$")


@dataclass(frozen=True)
class Row:
    line: int                      # 1-based line of the row in COVERAGE.md
    n_cells: int
    concept: str
    where: str
    notes: str
    seed: str | None
    first: int | None
    last: int | None

    def __str__(self) -> str:
        return f"docs/COVERAGE.md:{self.line}: {self.concept[:110]}"

    @property
    def covered(self) -> bool:
        return not self.where.startswith(NOT_COVERED)


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


@lru_cache(maxsize=1)
def rows() -> tuple[Row, ...]:
    """The rows of every table whose header starts with "seed concept"."""
    out, in_map = [], False
    for i, line in enumerate(MAP.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.startswith("|"):
            in_map = False
            continue
        cells = _cells(line)
        if cells[0].startswith("seed concept"):
            in_map = True
            continue
        if not in_map or set(line.replace("|", "").strip()) <= set("-: "):
            continue
        concept, where, notes = (cells + ["", ""])[:3]
        m = SOURCE.search(concept)
        out.append(Row(i, len(cells), concept, where, notes, m and m.group(1),
                       m and int(m.group(2)), m and int(m.group(3) or m.group(2))))
    return tuple(out)


def sourced_rows() -> list[Row]:
    """The rows that cite a seed (the others fail test_the_map_parses, not the checks below)."""
    return [r for r in rows() if r.seed is not None]


@lru_cache(maxsize=None)
def lab_grade_ids(prefix: str) -> tuple[Path | None, frozenset[str]]:
    """The notebook labs/NN_x/NN_x.ipynb for a two-digit prefix, and its cells' grade ids."""
    books = [p for p in sorted((REPO / "labs").glob(f"{prefix}_*/{prefix}_*.ipynb"))
             if p.stem == p.parent.name]
    if not books:
        return None, frozenset()
    ids = set()
    for book in books:
        for cell in json.loads(book.read_text(encoding="utf-8"))["cells"]:
            gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
            if gid:
                ids.add(gid)
    return books[0], frozenset(ids)


@lru_cache(maxsize=None)
def slide_titles(deck: str) -> frozenset[str] | None:
    path = REPO / "slides" / f"{deck}.md"
    if not path.is_file():
        return None
    return frozenset(line.rstrip() for line in path.read_text(encoding="utf-8").splitlines()
                     if line.startswith("## "))


def grade_ids_in(text: str) -> list[str]:
    return [span for span in BACKTICKED.findall(text) if GRADE_ID.fullmatch(span)]


def seeds_dir() -> Path | None:
    """The seed texts, if this checkout can see them (they live beside DESIGN.md, not here)."""
    candidates = [os.environ.get("MINILLM_SEEDS"), REPO / "shared" / "seeds",
                  REPO.parent / "shared" / "seeds"]
    for c in candidates:
        if c and Path(c).is_dir() and any(Path(c).glob("000_*")):
            return Path(c)
    return None


# --- the checks -----------------------------------------------------------------------------------
def test_the_map_parses():
    assert MAP.is_file(), "docs/COVERAGE.md is missing"
    assert len(rows()) >= 100, f"only {len(rows())} rows: is a table header misspelt?"
    bad = [f"{r}  ({r.n_cells} cells: want concept | where | notes, no '|' inside a cell)"
           for r in rows() if r.n_cells != 3 or not r.concept or not r.where]
    bad += [f"{r}  (no source: end the concept with (SEED:FIRST-LAST))" for r in rows()
            if r.seed is None]
    assert not bad, "malformed rows:\n" + "\n".join(bad)


def test_every_grade_id_exists_in_its_lab():
    missing = []
    for r in rows():
        for gid in grade_ids_in(f"{r.concept} {r.where} {r.notes}"):
            book, ids = lab_grade_ids(gid[:2])
            if book is None:
                missing.append(f"`{gid}`: there is no lab labs/{gid[:2]}_*  <- {r}")
            elif gid not in ids:
                missing.append(f"`{gid}` is not a grade_id of {book.relative_to(REPO)}  <- {r}")
    # grade ids in the prose around the tables (the intro's examples) must exist too
    text = MAP.read_text(encoding="utf-8").splitlines()
    table_lines = {r.line for r in rows()}
    for i, line in enumerate(text, start=1):
        if i in table_lines:
            continue
        for gid in grade_ids_in(line):
            book, ids = lab_grade_ids(gid[:2])
            if book is None or gid not in ids:
                missing.append(f"`{gid}` does not exist  <- docs/COVERAGE.md:{i}")
    assert not missing, "grade ids named in the map but not in the labs:\n" + "\n".join(missing)


def test_every_slide_reference_names_a_slide():
    missing = []
    for r in rows():
        for deck, title in SLIDE_REF.findall(f"{r.where} {r.notes}"):
            titles = slide_titles(deck)
            if titles is None:
                missing.append(f"slides/{deck}.md does not exist  <- {r}")
            elif title.rstrip() not in titles:
                missing.append(f'slides/{deck}.md has no slide "{title}"  <- {r}')
    assert not missing, "slide references that do not resolve:\n" + "\n".join(missing)


def test_every_seed_has_rows_in_seed_order():
    by_seed: dict[str, list[Row]] = {}
    for r in sourced_rows():
        by_seed.setdefault(r.seed, []).append(r)
    assert not set(by_seed) - set(SEEDS), f"rows cite unknown seeds: {set(by_seed) - set(SEEDS)}"
    for seed in SEEDS:
        assert by_seed.get(seed), f"seed {seed} has no row in docs/COVERAGE.md"
    disorder = [f"{b}  (line {b.first} comes after line {a.first} of seed {b.seed})"
                for seed_rows in by_seed.values() for a, b in zip(seed_rows, seed_rows[1:])
                if b.first < a.first]
    bad_ranges = [str(r) for r in sourced_rows() if r.last < r.first]
    assert not disorder, "rows out of the seed's order:\n" + "\n".join(disorder)
    assert not bad_ranges, "line ranges that end before they start:\n" + "\n".join(bad_ranges)


def test_cited_lines_lie_inside_the_seeds():
    folder = seeds_dir()
    if folder is None:
        pytest.skip("seed texts not found (set MINILLM_SEEDS to their folder to check lines)")
    lengths = {}
    for seed in SEEDS:
        files = sorted(folder.glob(f"{seed}_*"))
        assert files, f"no seed file {seed}_* in {folder}"
        lengths[seed] = len(files[0].read_text(encoding="utf-8").splitlines())
    outside = [f"{r}  (seed {r.seed} has {lengths[r.seed]} lines)" for r in sourced_rows()
               if r.seed in lengths and r.last > lengths[r.seed]]
    assert not outside, "cited lines past the end of their seed:\n" + "\n".join(outside)


def test_rows_say_where_or_why_not():
    unsupported = [str(r) for r in rows()
                   if r.covered and not grade_ids_in(r.where) and not SLIDE_REF.search(r.where)]
    assert not unsupported, ("covered rows that cite no grade id or slide:\n"
                             + "\n".join(unsupported))
    no_reason = [str(r) for r in rows() if not r.covered
                 and len(r.where[len(NOT_COVERED):].strip(" :—-")) < 12]
    assert not no_reason, "'not covered' rows without a reason:\n" + "\n".join(no_reason)
