"""Build every slide deck into one self-contained, offline HTML file.

    python -m slides.build                      # every deck -> build/slides/<deck>.html
    python -m slides.build 01_roofline          # one deck
    python -m slides.build --out /tmp/s --pdf   # elsewhere, plus a PDF per deck (needs chromium)

A deck is `slides/NN_topic.md` (one per lab, same name as the lab): Markdown, with

    ---                              a line holding only --- separates two slides
    <!-- class: title -->            first line of a slide: CSS classes for it (title, center, ...)
    ## Heading                       the slide's title (the first heading of the slide)
    ![caption](fig:roofline)         on a line of its own: figure `roofline()` of slides/figures/
                                     (a matplotlib Figure -> embedded PNG, or an HTML string)
    $$ \\frac{S T}{S + T} $$          display math, rendered by matplotlib's mathtext to a PNG
    |||                              a line holding only |||: what follows goes to a right column
    ???                              a line holding only ???: speaker notes follow (press n)

Plain Markdown otherwise (tables, lists, code, **bold**; write inline math in Unicode: B·T, S²).
The output has no external reference at all: CSS (theme.css) and keyboard navigation (deck.js)
are inlined, images are base64 PNG, links to http(s) URLs are refused at build time. Keys:
→ / space / PageDown next, ← / PageUp previous, Home / End, n notes; slide k is `deck.html#k`.
Printing (or `--pdf`) gives one page per slide.

Adding the deck of a new lab: write `slides/NN_topic.md`, add its figure functions in a module
`slides/figures/labNN_topic.py`; `make slides` and the tests pick it up.
"""
from __future__ import annotations

import argparse
import html
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import markdown

from slides.mathrender import BuildError, data_uri, figure_png, math_html, png_size

SLIDES_DIR = Path(__file__).resolve().parent
REPO = SLIDES_DIR.parent
DEFAULT_OUT = REPO / "build" / "slides"
DECK_RE = re.compile(r"^\d\d_[A-Za-z0-9_]+$")
MD_EXTENSIONS = ["tables", "fenced_code", "sane_lists", "attr_list"]
CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")

_FIG_LINE = re.compile(r"^!\[(?P<caption>[^\]]*)\]\(fig:(?P<name>[A-Za-z_][A-Za-z0-9_]*)\)\s*$")
_CLASS_LINE = re.compile(r"^<!--\s*class:\s*(?P<classes>[A-Za-z0-9_\- ]+?)\s*-->\s*$")
_EXTERNAL = re.compile(r"""(?:\b(?:src|href|action|poster|data)\s*=\s*["']?\s*(?:https?:)?//)"""
                       r"""|(?:url\(\s*["']?\s*(?:https?:)?//)|(?:@import)""", re.I)
_PLACEHOLDER = "MINILLMBLOCK{}X"


@dataclass
class Slide:
    number: int                 # 1-based
    source: str                 # the Markdown of the slide (without class line and notes)
    title: str
    classes: list[str] = field(default_factory=list)
    notes: str = ""
    line: int = 1               # first line of the slide in the deck file

    @property
    def figures(self) -> list[str]:
        return [m.group("name") for m in map(_FIG_LINE.match, self.source.splitlines()) if m]


@dataclass
class Deck:
    name: str
    path: Path
    title: str
    slides: list[Slide]


# --- parsing ------------------------------------------------------------------------------------
def find_decks(names: list[str] | None = None, slides_dir: Path = SLIDES_DIR) -> list[Path]:
    """slides/NN_topic.md for the given deck names (all, sorted, by default)."""
    found = {p.stem: p for p in sorted(slides_dir.glob("*.md")) if DECK_RE.match(p.stem)}
    if not names:
        return list(found.values())
    missing = [n for n in names if n not in found]
    if missing:
        raise BuildError(f"no deck {missing} in {slides_dir}; decks: {sorted(found)}")
    return [found[n] for n in names]


def _split_slides(text: str) -> list[tuple[int, str]]:
    """(first line number, source) per slide; `---` inside ``` fences does not split."""
    chunks, cur, start, fenced = [], [], 1, False
    for i, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if line.strip() == "---" and not fenced:
            chunks.append((start, "\n".join(cur)))
            cur, start = [], i + 1
        else:
            cur.append(line)
    chunks.append((start, "\n".join(cur)))
    return [(n, c.strip("\n")) for n, c in chunks if c.strip()]


def _title_of(source: str) -> str:
    for line in source.splitlines():
        m = re.match(r"^#{1,3}\s+(.*?)\s*#*\s*$", line)
        if m:
            return m.group(1)
    return ""


def parse_deck(path: Path) -> Deck:
    path = Path(path)
    slides = []
    for number, (line, chunk) in enumerate(_split_slides(path.read_text(encoding="utf-8")), 1):
        lines = chunk.splitlines()
        classes = []
        m = _CLASS_LINE.match(lines[0]) if lines else None
        if m:
            classes, lines = m.group("classes").split(), lines[1:]
        body, notes = lines, []
        if "???" in (x.strip() for x in lines):
            k = [x.strip() for x in lines].index("???")
            body, notes = lines[:k], lines[k + 1:]
        source = "\n".join(body).strip("\n")
        title = _title_of(source)
        if not title:
            raise BuildError(f"{path.name}:{line}: slide {number} has no heading (# or ##)")
        slides.append(Slide(number, source, title, classes, "\n".join(notes).strip(), line))
    if not slides:
        raise BuildError(f"{path.name}: no slides")
    return Deck(path.stem, path, _plain(slides[0].title), slides)


def _plain(md_inline: str) -> str:
    return re.sub(r"[*_`]", "", md_inline)


class Renderer:
    """Markdown + figure/math directives -> HTML. Figures are computed once per name."""

    def __init__(self):
        self._figures: dict[str, tuple[str, float]] = {}   # name -> (html, seconds)
        self._md = markdown.Markdown(extensions=MD_EXTENSIONS, output_format="html")

    @property
    def timings(self) -> dict[str, float]:
        return {k: v[1] for k, v in self._figures.items()}

    def figure(self, name: str, caption: str) -> str:
        if name not in self._figures:
            from matplotlib.figure import Figure

            from slides import figures
            t0 = time.perf_counter()
            try:
                out = figures.render(name)
            except KeyError as e:
                raise BuildError(str(e.args[0])) from None
            if isinstance(out, Figure):
                png = figure_png(out)
                w, h = png_size(png)
                inner = (f'<img class="plot" src="{data_uri(png)}" width="{w}" height="{h}" '
                         f'alt="{{alt}}" data-figure="{name}">')
                kind = "png"
            else:
                inner, kind = out, "html"
            self._figures[name] = (f'<figure class="fig fig-{kind}" data-figure="{name}">'
                                   f"{inner}{{caption}}</figure>", time.perf_counter() - t0)
        tpl = self._figures[name][0]
        cap = self._inline(caption)
        return (tpl.replace("{alt}", html.escape(_plain(caption) or name, quote=True))
                .replace("{caption}", f"<figcaption>{cap}</figcaption>" if caption else ""))

    def _inline(self, text: str) -> str:
        self._md.reset()
        out = self._md.convert(text)
        return re.sub(r"^<p>(.*)</p>$", r"\1", out, flags=re.S)

    def math(self, tex: str) -> str:
        return math_html(tex)

    def markdown(self, source: str) -> str:
        """Markdown with `fig:` lines and `$$` blocks replaced by their HTML."""
        blocks: list[str] = []
        out_lines: list[str] = []
        lines = source.splitlines()
        i, fenced = 0, False
        while i < len(lines):
            line = lines[i]
            if line.lstrip().startswith("```"):
                fenced = not fenced
            m = None if fenced else _FIG_LINE.match(line.strip())
            if m:
                blocks.append(self.figure(m.group("name"), m.group("caption")))
                out_lines += ["", _PLACEHOLDER.format(len(blocks) - 1), ""]
            elif not fenced and line.strip().startswith("$$"):
                buf = line.strip()[2:]
                while not buf.rstrip().endswith("$$"):
                    i += 1
                    if i == len(lines):
                        raise BuildError("unclosed $$ block")
                    buf += " " + lines[i].strip()
                blocks.append(self.math(buf.rstrip()[:-2].strip()))
                out_lines += ["", _PLACEHOLDER.format(len(blocks) - 1), ""]
            elif not fenced and "fig:" in line and re.search(r"\]\(fig:", line):
                raise BuildError(f"a fig: image must stand on a line of its own: {line.strip()!r}")
            else:
                out_lines.append(line)
            i += 1
        self._md.reset()
        body = self._md.convert("\n".join(out_lines))
        for k, block in enumerate(blocks):
            body = body.replace(f"<p>{_PLACEHOLDER.format(k)}</p>", block)
        return body

    def slide(self, deck: Deck, slide: Slide) -> str:
        try:
            parts = re.split(r"^\s*\|\|\|\s*$", slide.source, flags=re.M)
            if len(parts) > 2:
                raise BuildError("more than one ||| line (it splits a slide into two columns)")
            if len(parts) == 2:
                head, left = _split_heading(parts[0])
                body = (self.markdown(head) + '<div class="cols"><div class="col">'
                        + self.markdown(left) + '</div><div class="col">'
                        + self.markdown(parts[1]) + "</div></div>")
            else:
                body = self.markdown(slide.source)
        except BuildError as e:
            raise BuildError(f"{deck.path.name}:{slide.line}: slide {slide.number}: {e}") from None
        classes = " ".join(["slide"] + slide.classes)
        notes = (f'<aside class="notes">{self.markdown(slide.notes)}</aside>'
                 if slide.notes else "")
        return (f'<section class="{classes}" id="slide-{slide.number}" '
                f'data-slide="{slide.number}" '
                f'data-title="{html.escape(_plain(slide.title), True)}">'
                f'<div class="content">{body}</div>{notes}'
                f'<footer><span>{html.escape(deck.title)}</span>'
                f'<span class="num">{slide.number} / {len(deck.slides)}</span></footer></section>')


def _split_heading(text: str) -> tuple[str, str]:
    """(the heading line and anything before it, the rest) so columns start under the title."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("#"):
            return "\n".join(lines[:i + 1]), "\n".join(lines[i + 1:])
    return "", text


def render_deck(deck: Deck, renderer: Renderer | None = None) -> str:
    renderer = renderer or Renderer()
    css = (SLIDES_DIR / "theme.css").read_text(encoding="utf-8")
    js = (SLIDES_DIR / "deck.js").read_text(encoding="utf-8")
    sections = "\n".join(renderer.slide(deck, s) for s in deck.slides)
    page = f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="minillm slides/build.py">
<title>{html.escape(deck.title)}</title>
<style>
{css}
</style>
</head>
<body data-deck="{deck.name}">
<main class="deck">
{sections}
</main>
<div class="progress"><div></div></div>
<script>
{js}
</script>
</body>
</html>
"""
    bad = _EXTERNAL.search(page)
    if bad:
        start = max(0, bad.start() - 60)
        raise BuildError(f"{deck.path.name}: external reference (the decks must work offline): "
                         f"...{page[start:bad.end() + 60]}...")
    return page


def find_chromium() -> str | None:
    for c in (os.environ.get("CHROMIUM"), *CHROMIUM_CANDIDATES):
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return c
    return shutil.which("chromium") or shutil.which("chromium-browser")


def print_pdf(html_path: Path, pdf_path: Path, chromium: str | None = None,
              timeout: float = 120) -> Path:
    """One page per slide, printed by headless chromium (offline: it only reads the file)."""
    chromium = chromium or find_chromium()
    if not chromium:
        raise BuildError("--pdf needs chromium (apt-get install chromium)")
    with tempfile.TemporaryDirectory(prefix="slides-chromium-") as profile:
        cmd = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               f"--user-data-dir={profile}", "--no-pdf-header-footer",
               "--virtual-time-budget=5000", f"--print-to-pdf={pdf_path}",
               Path(html_path).resolve().as_uri()]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0 or not Path(pdf_path).is_file():
        raise BuildError(f"chromium --print-to-pdf failed ({r.returncode}):\n{r.stderr[-2000:]}")
    return Path(pdf_path)


def build(names: list[str] | None = None, out_dir: Path = DEFAULT_OUT, pdf: bool = False,
          quiet: bool = False, slides_dir: Path = SLIDES_DIR) -> list[Path]:
    """Build the decks (all by default) into out_dir/<deck>.html; returns the HTML paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    renderer = Renderer()
    written = []
    for path in find_decks(names, Path(slides_dir)):
        t0 = time.perf_counter()
        deck = parse_deck(path)
        page = render_deck(deck, renderer)
        target = out_dir / f"{deck.name}.html"
        tmp = target.with_suffix(".html.tmp")
        tmp.write_text(page, encoding="utf-8")
        tmp.replace(target)
        written.append(target)
        msg = (f"{target} ({len(deck.slides)} slides, {len(page) / 1e6:.1f} MB, "
               f"{time.perf_counter() - t0:.1f} s)")
        if pdf:
            msg += f", {print_pdf(target, target.with_suffix('.pdf'))}"
        if not quiet:
            print(msg)
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m slides.build", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("decks", nargs="*", help="deck names such as 00_sampling (default: all)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory")
    ap.add_argument("--pdf", action="store_true", help="also print each deck to PDF (chromium)")
    ap.add_argument("--slides-dir", type=Path, default=SLIDES_DIR,
                    help="where the NN_topic.md decks are (default: this folder)")
    args = ap.parse_args(argv)
    try:
        build(args.decks or None, args.out, pdf=args.pdf, slides_dir=args.slides_dir)
    except BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))     # `python slides/build.py` works too
    sys.exit(main())
