"""Math and figures as embedded PNGs: what a deck's $$...$$ blocks and figures become, offline.

`slides/build.py` renders decks with these, and figure functions that show a derivation
(slides/figures/) call `math_html` themselves.
"""
from __future__ import annotations

import base64
import html
import io


class BuildError(ValueError):
    """A deck that cannot be built (its message names the deck, slide and problem)."""


# --- PNG embedding ----------------------------------------------------------------------------------
def png_size(png: bytes) -> tuple[int, int]:
    if png[:8] != b"\x89PNG\r\n\x1a\n":
        raise BuildError("not a PNG")
    return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")


def figure_png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()


def math_png(tex: str, dpi: int = 200) -> bytes:
    from matplotlib import mathtext
    from matplotlib.font_manager import FontProperties
    buf = io.BytesIO()
    try:
        mathtext.math_to_image(f"${tex}$", buf, prop=FontProperties(size=12), dpi=dpi,
                               format="png", color="#1d2433")
    except ValueError as e:
        raise BuildError(f"mathtext cannot render $${tex}$$: {e}") from None
    return buf.getvalue()


def data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def math_html(tex: str) -> str:
    """Display math as an embedded PNG, sized in em (mathtext at 12 pt, 200 dpi: 33.3 px per
    em) so that it scales with the slide like the text around it."""
    png = math_png(tex)
    _, h = png_size(png)
    return (f'<div class="math"><img src="{data_uri(png)}" alt="{html.escape(tex, True)}" '
            f'style="height:{h / (12 * 200 / 72):.2f}em"></div>')
