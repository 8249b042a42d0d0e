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


def side_panel(readout_class: str, plot_class: str) -> tuple[widgets.HTML, widgets.Output]:
    """The readout (HTML, beside the sliders) and the plot (an Output under them) of an explorer
    with a row of sliders, each with the CSS class the tests and the browser check look for."""
    readout = widgets.HTML(layout=widgets.Layout(margin="0 0 0 24px")).add_class(readout_class)
    plot = widgets.Output(layout=widgets.Layout(min_width="680px")).add_class(plot_class)
    return readout, plot
