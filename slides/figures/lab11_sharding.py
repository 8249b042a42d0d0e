"""Figures for the deck of lab 11: sharding (slides/11_sharding.md).

Napkin math only (minillm.roofline.tensor_parallel_napkin, lab 01's formula): no timing. The
deck's measured statements are the lab's ranges, in the text."""
from __future__ import annotations

from matplotlib.figure import Figure

from .common import BLUE, GREY, ORANGE, figure, new_figure, style_axes


@figure
def tp_step_split() -> Figure:
    """Llama-2-13B at batch 1 on H100s (NVLink, alpha = 5 us): the step's memory time and its
    all-reduces against the number of GPUs."""
    from minillm import roofline
    gpus = [1, 2, 4, 8]
    rows = [roofline.tensor_parallel_napkin("llama-2-13b", "h100", batch=1, seq_len=4096, gpus=g,
                                            link="nvlink-h100", allreduce_latency_s=5e-6)
            for g in gpus]
    fig, ax = new_figure(8.5, 3.8)
    x = range(len(gpus))
    mem = [r["memory_time_s"] * 1e3 for r in rows]
    comm = [r["comm_s"] * 1e3 for r in rows]
    ax.bar(x, mem, color=BLUE, label="reading 1/G of the weights and cache")
    ax.bar(x, comm, bottom=mem, color=ORANGE, label="2L all-reduces (alpha = 5 us each)")
    for i, (m, c) in enumerate(zip(mem, comm)):
        ax.text(i, m + c + 0.1, f"{m + c:.2f} ms", ha="center", fontsize=9, color=GREY)
    ax.set_xticks(list(x), [f"G = {g}" for g in gpus])
    ax.set_ylabel("ms per decode step")
    ax.set_title("Llama-2-13B, batch 1, 4,096 tokens, H100s over NVLink (lab 01's napkin)")
    ax.legend(frameon=False, fontsize=9)
    style_axes(ax)
    return fig
