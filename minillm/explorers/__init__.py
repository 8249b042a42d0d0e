"""Interactive explorers (ipywidgets): one file per explorer, each the widget itself (a VBox)
with `controls`, `readout`, `plot` and `state` for scripts and tests.

    from minillm.explorers import napkin_explorer       # lab 01/02: the roofline napkin math
    from minillm.explorers import speculative_explorer  # lab 05: speculative speed-up
    from minillm.explorers import serve_explorer        # lab 06: a live server under load

napkin.py, speculative.py, serving.py; display.py holds what they share.
"""
from .display import show_png
from .napkin import (
                     BYTES_PER_PARAM,
                     CUSTOM,
                     DIM_FIELDS,
                     ERROR_CLASS,
                     PLOT_CLASS,
                     READOUT_CLASS,
                     NapkinExplorer,
                     napkin_explorer,
                     plot_batches,
)
from .serving import (
                     SERVE_ERROR_CLASS,
                     SERVE_PLOT_CLASS,
                     SERVE_READOUT_CLASS,
                     ServeExplorer,
                     serve_explorer,
)
from .speculative import (
                     SPEC_PLOT_CLASS,
                     SPEC_READOUT_CLASS,
                     SpeculativeExplorer,
                     speculative_explorer,
)

__all__ = ["show_png", "BYTES_PER_PARAM", "CUSTOM", "DIM_FIELDS", "ERROR_CLASS", "PLOT_CLASS",
           "READOUT_CLASS", "NapkinExplorer", "napkin_explorer", "plot_batches",
           "SERVE_ERROR_CLASS", "SERVE_PLOT_CLASS", "SERVE_READOUT_CLASS", "ServeExplorer",
           "serve_explorer", "SPEC_PLOT_CLASS", "SPEC_READOUT_CLASS", "SpeculativeExplorer",
           "speculative_explorer"]
