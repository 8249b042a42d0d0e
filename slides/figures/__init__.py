"""Figures for the slide decks, computed by the same `minillm` code the labs use.

A deck refers to a figure by name: `![caption](fig:roofline)` calls `roofline()` (slides/figures/lab01_roofline.py). A figure
function takes no arguments and returns either

  * a matplotlib `Figure` (made with `new_figure`, never pyplot): embedded as a base64 PNG, or
  * a string of HTML (a table, a tokenised prompt, sampled text): inserted as is.

To add figures for a new lab, add a module `labNN_topic.py` here with functions decorated by
`@figure` (slides/figures/common.py) and import it below; the name of the function is the name
used in the deck. Everything is computed on the
CPU in a few seconds: no timing (figures must be reproducible), only counts and napkin math on the
real model, its real logits and the real hardware presets.
"""
# Without a GPU the tracer kernels of the Triton slides run in the interpreter: decide before
# anything (torch's compiler, for one) imports triton.language.
import kernels.interpret  # noqa: F401, E402, I001

# Importing a deck's module registers its figures, in lab order.
from . import (  # noqa: F401, E402
               lab00_sampling,
               lab01_roofline,
               lab02_kv_cache,
               lab03_shrinking_kv,
               lab04_quantization,
               lab05_speculative,
               lab06_continuous_batching,
               lab07_paged_attention,
               lab08_pruning,
               lab09_beyond_attention,
               lab11_sharding,
)
from .common import FIGURES, figure, new_figure, render

__all__ = ["FIGURES", "figure", "new_figure", "render"]
