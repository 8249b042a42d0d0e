"""What every deck's figures share: the registry (`@figure`), the Figure factory, the palette,
the slide style and `render`."""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Callable

import matplotlib

matplotlib.use("Agg")                          # before anything imports pyplot
from matplotlib.figure import Figure  # noqa: E402

FIGURES: dict[str, Callable[[], "Figure | str"]] = {}

# A palette that survives a projector and colour-blind viewers (Okabe-Ito).
BLUE, ORANGE, GREEN, RED, PURPLE, GREY, SKY = ("#0072B2", "#E69F00", "#009E73", "#D55E00",
                                               "#CC79A7", "#777777", "#56B4E9")


def figure(fn: Callable[[], "Figure | str"]) -> Callable[[], "Figure | str"]:
    """Register `fn` as the figure called `fn.__name__`."""
    if fn.__name__ in FIGURES:
        raise ValueError(f"figure {fn.__name__!r} is defined twice")
    FIGURES[fn.__name__] = fn
    return fn


def new_figure(width: float = 10.0, height: float = 4.6, **subplots) -> tuple[Figure, object]:
    """A Figure (object-oriented API: no global pyplot state) and its axes."""
    fig = Figure(figsize=(width, height), dpi=110, layout="constrained")
    axes = fig.subplots(**subplots) if subplots else fig.add_subplot()
    return fig, axes


def style_axes(ax, grid: bool = True):
    ax.spines[["top", "right"]].set_visible(False)
    if grid:
        ax.grid(alpha=0.25)


def html_table(header: list[str], rows: list[list[str]], cls: str = "data") -> str:
    head = "".join(f"<th>{h}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "RESULTS.md"


def recorded_row(section: str, label: str) -> list[str]:
    """The cells after the first one of the table row starting with `label`, in the section of
    benchmarks/RESULTS.md whose `## ` heading starts with `section`: a figure that plots a run
    too slow to repeat for every build plots the run RESULTS.md records, with its command."""
    text = RESULTS.read_text()
    start = text.index(f"\n## {section}")
    end = text.find("\n## ", start + 4)
    rows = [line for line in text[start:end if end > 0 else None].splitlines()
            if line.startswith(f"| {label}")]
    if len(rows) != 1:
        raise ValueError(f"benchmarks/RESULTS.md, {section!r}: {len(rows)} rows start with "
                         f"{label!r}, one expected")
    return [cell.strip() for cell in rows[0].strip().strip("|").split("|")[1:]]


@functools.lru_cache(maxsize=1)
def model_and_tokenizer():
    """The shipped `target` model and its tokenizer, loaded once for every deck."""
    import torch

    import minillm
    torch.set_num_threads(1)
    return minillm.load("target"), minillm.load_tokenizer("target")


def token_label(tok, i: int) -> str:
    """Token `i` as a short printable label (whitespace tokens shown escaped)."""
    s = tok.decode([i])
    return repr(s)[1:-1] if s.strip() else repr(s)


# Larger type than matplotlib's default: a slide is read from the back of a room.
STYLE = {"font.size": 12, "axes.titlesize": 12, "axes.labelsize": 12, "xtick.labelsize": 11,
         "ytick.labelsize": 11, "legend.fontsize": 10, "svg.hashsalt": "minillm"}


def render(name: str) -> "Figure | str":
    """Call the figure function `name` (KeyError with the known names if there is none)."""
    if name not in FIGURES:
        raise KeyError(f"no figure {name!r} in slides/figures/; known: {sorted(FIGURES)}")
    with matplotlib.rc_context(STYLE):
        out = FIGURES[name]()
    if not isinstance(out, (Figure, str)):
        raise TypeError(f"figure {name!r} returned {type(out).__name__}, not a Figure or HTML")
    return out


__all__ = ["FIGURES", "figure", "new_figure", "render", "style_axes", "html_table",
           "model_and_tokenizer", "token_label", "BLUE",
           "ORANGE", "GREEN", "RED", "PURPLE", "GREY", "SKY"]
