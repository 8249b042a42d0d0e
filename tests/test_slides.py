"""The slide decks: one per lab, built by `python -m slides.build` into single offline HTML files.

Every deck is built once (into pytest's temporary folder, never build/slides) and checked without
a browser: no external URL anywhere, one <section> per source slide in order, every image a
data: URI holding a real PNG, every figure the deck asks for present. The builder's syntax
(separators, classes, columns, notes, math, errors) is tested on small decks written here.
tests/test_browser.py opens the same built decks in chromium.
"""
from __future__ import annotations

import base64
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
from slides import build as sb  # noqa: E402
from slides import figures  # noqa: E402

DECKS = sb.find_decks()
# one worker builds the decks (conftest.built_decks) and runs these; the other is not left
# waiting on the build's lock
pytestmark = [pytest.mark.xdist_group("slides"), pytest.mark.slow]   # builds every deck: ~90 s
LABS = sorted(p.parent.name for p in (REPO / "labs").glob("[0-9][0-9]_*/[0-9][0-9]_*.ipynb")
              if p.stem == p.parent.name)
EXTERNAL = re.compile(r"""\b(?:src|href|srcset|action|poster)\s*=\s*["']?\s*(?:https?:)?//"""
                      r"""|url\(\s*["']?\s*(?:https?:)?//|@import|<link\b|<script[^>]*\bsrc=""",
                      re.I)


# --- the built decks ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def built(built_decks) -> Path:
    return built_decks


class _Page(HTMLParser):
    """Sections (slides) with their data attributes, and every <img> with its attributes."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.sections: list[dict] = []
        self.images: list[dict] = []
        self.figures: list[str] = []
        self._depth = 0
        self._text: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "section" and "slide" in (a.get("class") or "").split():
            self.sections.append({**a, "text": ""})
            self._text = []
        if tag == "img":
            self.images.append({**a, "slide": len(self.sections)})
        if tag == "figure" and a.get("data-figure"):
            self.figures.append(a["data-figure"])

    def handle_data(self, data):
        if self.sections:
            self.sections[-1]["text"] += data


def _page(path: Path) -> _Page:
    p = _Page()
    p.feed(path.read_text(encoding="utf-8"))
    return p


def test_every_lab_has_a_deck():
    decks = {p.stem for p in DECKS}
    missing = [lab for lab in LABS if lab not in decks]
    assert not missing, f"labs without slides/<lab>.md: {missing} (see slides/build.py)"
    assert {"00_sampling", "01_roofline"} <= decks


@pytest.mark.parametrize("deck", [p.stem for p in DECKS])
def test_deck_is_one_offline_html_file(deck, built):
    html = (built / f"{deck}.html").read_text(encoding="utf-8")
    bad = [m.group(0) for m in EXTERNAL.finditer(html)]
    assert not bad, f"{deck}: external references {bad[:5]}"
    for m in re.finditer(r"""\b(?:src|href)\s*=\s*["']([^"']*)""", html):
        assert m.group(1).startswith(("data:image/png;base64,", "#")), \
            f"{deck}: src/href to something that is not embedded: {m.group(1)[:80]}"
    assert "<style>" in html and "window.deck" in html, "CSS and navigation are inlined"


@pytest.mark.parametrize("deck", [p.stem for p in DECKS])
def test_every_slide_is_a_section_in_order(deck, built):
    source = sb.parse_deck(sb.find_decks([deck])[0])
    page = _page(built / f"{deck}.html")
    assert len(page.sections) == len(source.slides) >= 5
    for i, (sec, slide) in enumerate(zip(page.sections, source.slides), 1):
        assert sec["id"] == f"slide-{i}" and sec["data-slide"] == str(i)
        assert sec["data-title"] == re.sub(r"[*_`]", "", slide.title)
        assert len(sec["text"].split()) >= 3, f"{deck} slide {i} is empty"
        assert f"{i} / {len(source.slides)}" in sec["text"], "slide number in the footer"
    assert source.title.startswith(f"Lab {deck[:2]}")


@pytest.mark.parametrize("deck", [p.stem for p in DECKS])
def test_images_are_embedded_pngs(deck, built):
    source = sb.parse_deck(sb.find_decks([deck])[0])
    page = _page(built / f"{deck}.html")
    assert page.images, f"{deck} has no image"
    for img in page.images:
        src = img["src"]
        assert src.startswith("data:image/png;base64,"), src[:60]
        png = base64.b64decode(src.split(",", 1)[1], validate=True)
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR"
        w, h = sb.png_size(png)
        assert w >= 10 and h >= 10
        if "width" in img:
            assert (int(img["width"]), int(img["height"])) == (w, h)
        assert img.get("alt"), "every image has alt text"
    wanted = [f for s in source.slides for f in s.figures]
    assert sorted(page.figures) == sorted(wanted), "every fig: directive is rendered, once"
    assert any(i.get("data-figure") for i in page.images), f"{deck}: no matplotlib figure"


def test_every_figure_a_deck_uses_exists():
    used = {f for p in DECKS for s in sb.parse_deck(p).slides for f in s.figures}
    assert used <= set(figures.FIGURES), f"unknown figures: {sorted(used - set(figures.FIGURES))}"
    unused = set(figures.FIGURES) - used
    assert not unused, f"figures no deck uses (delete them or use them): {sorted(unused)}"


# --- the builder's syntax, on small decks -------------------------------------------------------
def _deck(tmp_path: Path, text: str, name: str = "98_demo") -> sb.Deck:
    path = tmp_path / f"{name}.md"
    path.write_text(text, encoding="utf-8")
    return sb.parse_deck(path)


DEMO = """<!-- class: title -->
# Lab 98 — Demo

Intro with **bold**.

???
Speaker notes here.

---
## Code keeps its separators

```text
---
not a new slide
```

---
<!-- class: wide-left -->
## Two columns

Left text.

|||

![The chips](fig:hardware_table)

---
## Math

$$ \\frac{S T}{S + T} $$
"""


def test_parse_splits_slides_classes_notes_and_fences(tmp_path):
    deck = _deck(tmp_path, DEMO)
    assert [s.title for s in deck.slides] == ["Lab 98 — Demo", "Code keeps its separators",
                                              "Two columns", "Math"]
    assert deck.title == "Lab 98 — Demo"
    assert deck.slides[0].classes == ["title"] and deck.slides[0].notes == "Speaker notes here."
    assert "not a new slide" in deck.slides[1].source
    assert deck.slides[2].classes == ["wide-left"] and deck.slides[2].figures == ["hardware_table"]
    assert [s.line for s in deck.slides] == [1, 10, 18, 28]


def test_render_columns_notes_math_and_html_figures(tmp_path):
    html = sb.render_deck(_deck(tmp_path, DEMO))
    page = _Page()
    page.feed(html)
    assert len(page.sections) == 4
    assert page.sections[0]["class"] == "slide title"
    assert '<aside class="notes">' in html and "Speaker notes here." in html
    assert '<div class="cols"><div class="col">' in html
    assert html.index("Two columns</h2>") < html.index('<div class="cols">'), "title above columns"
    assert '<figure class="fig fig-html" data-figure="hardware_table">' in html
    assert "295" in html, "the H100's accelerator intensity, from minillm.roofline"
    assert len(page.images) == 1 and page.images[0]["alt"] == r"\frac{S T}{S + T}"
    assert re.search(r"height:\d+\.\d\dem", page.images[0]["style"])


@pytest.mark.parametrize("text, message", [
    ("## A\n[paper](https://arxiv.org/abs/1)\n", "external reference"),
    ("## A\n<img src='http://example.com/x.png'>\n", "external reference"),
    ("just text, no heading\n", "has no heading"),
    ("## A\n![x](fig:no_such_figure)\n", "no figure 'no_such_figure'"),
    ("## A\nsee ![x](fig:roofline) inline\n", "line of its own"),
    ("## A\nl\n|||\nm\n|||\nr\n", "more than one |||"),
    ("## A\n$$ \\frac{1}{2\n", "unclosed $$"),
])
def test_build_errors_name_the_problem(tmp_path, text, message):
    with pytest.raises(sb.BuildError, match=re.escape(message)):
        sb.render_deck(_deck(tmp_path, text))


def test_cli_builds_a_deck_folder_and_reports_errors(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "97_tiny.md").write_text("# Lab 97\n\nhello\n\n---\n## Two\n\n- a\n- b\n")
    (src / "notes.md").write_text("# not a deck: no NN_ prefix\n")
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "slides.build", "--slides-dir", str(src), "--out", str(out)]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["97_tiny.html"]
    assert "2 slides" in r.stdout
    (src / "96_bad.md").write_text("## x\n[a](http://example.com)\n")
    r = subprocess.run(cmd + ["96_bad"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "external reference" in r.stderr
    r = subprocess.run(cmd + ["42_missing"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "no deck ['42_missing']" in r.stderr


def test_pdf_has_one_page_per_slide(tmp_path):
    chromium = sb.find_chromium()
    if not chromium:
        pytest.skip("chromium not installed: apt-get install chromium to print slides to PDF")
    deck = _deck(tmp_path, "# Lab 95\n\none\n\n---\n## Two\n\ntwo\n\n---\n## Three\n\nthree\n",
                 "95_pdf")
    html_path = tmp_path / "95_pdf.html"
    html_path.write_text(sb.render_deck(deck), encoding="utf-8")
    pdf = sb.print_pdf(html_path, tmp_path / "95_pdf.pdf", chromium)
    data = pdf.read_bytes()
    assert data[:5] == b"%PDF-"
    assert len(re.findall(rb"/Type\s*/Page\b", data)) == 3
