"""What every explorer shares: widget sizes and drawing a matplotlib figure into an Output."""
from __future__ import annotations

import base64
import io

import ipywidgets as widgets

STYLE = {"description_width": "120px"}
LAYOUT = widgets.Layout(width="300px")
SLIDER_LAYOUT = widgets.Layout(width="420px")


def show_png(output: widgets.Output, fig, text: str) -> bytes:
    """Render `fig` to PNG and make it the only thing `output` shows; returns the PNG bytes.
    Setting `outputs` directly works with or without a running kernel (tests, nbclient)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    png = buf.getvalue()
    output.outputs = ({"output_type": "display_data",
                       "data": {"image/png": base64.b64encode(png).decode("ascii"),
                                "text/plain": text},
                       "metadata": {}},)
    return png
