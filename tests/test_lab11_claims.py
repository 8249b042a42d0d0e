"""Lab 11's sentences that state a figure agree with what the cells beside them print.

The napkin figures (part 1, Q1, Q3, the slides) are exact on any machine and checked exactly. The
measurements of parts 3 and 4 run here as the notebook runs them (the solution's split, 2 forked
gloo ranks); their text states ranges recorded on the busy 2-core development machine and, for
any machine, the qualitative verdicts (TP = 2 loses at the shipped width, napkin and measurement
alike; the speed-up rises with the width; the measured crossover within 2x of the napkin's),
which are checked here.
"""
from __future__ import annotations

import re
from pathlib import Path

import matplotlib
import pytest
import torch
from lab_notebook import LabNotebook
from lab_notebook import flat as _flat
from lab_notebook import run as _run

from minillm import roofline

matplotlib.use("Agg")
REPO = Path(__file__).resolve().parent.parent
NB = LabNotebook("11_sharding")
_by_id = NB.by_id
SLIDES = REPO / "slides" / "11_sharding.md"


@pytest.fixture(scope="module")
def lab11():
    """The setup, the napkin, the solution's split and both measurements, run in one namespace
    (the setup sets one torch thread: restored afterwards)."""
    import matplotlib.pyplot as plt
    threads = torch.get_num_threads()
    ns: dict = {}
    _run(ns, _by_id("11_setup"), "11_setup")
    ns["napkin_printed"] = _run(ns, NB.starting("# lab 01's napkin"), "11_napkin")
    _run(ns, _by_id("11_shard_block"), "11_shard_block")
    ns["allreduce_printed"] = _run(ns, NB.starting("W = 2"), "11_allreduce")
    ns["step_printed"] = _run(ns, NB.starting("WIDTHS"), "11_step")
    plt.close("all")
    yield ns
    torch.set_num_threads(threads)


def _range(text: str, before: str) -> tuple[float, float]:
    """The first 'a–b' range after `before` in `text`."""
    m = re.search(re.escape(before) + r"[^0-9]*?([0-9.]+)–([0-9.]+)", text)
    assert m, f"no range after {before!r}"
    return float(m.group(1)), float(m.group(2))


def test_the_llama_napkin_the_text_quotes(lab11):
    rows = {G: roofline.tensor_parallel_napkin("llama-2-13b", "h100", batch=1, seq_len=4096, gpus=G,
                                               link="nvlink-h100", allreduce_latency_s=5e-6)
            for G in (1, 2, 8)}
    printed = lab11["napkin_printed"]
    for G, r in rows.items():
        assert f"G = {G}: step {r['latency_s'] * 1e3:5.2f} ms" in printed
    q1 = _flat(_by_id("11_q1"))
    for G, quoted in [(1, "8.8 ms"), (2, "4.8 ms"), (8, "1.5 ms")]:
        assert f"{rows[G]['latency_s'] * 1e3:.1f} ms" == quoted and quoted in q1
    assert f"{rows[8]['comm_s'] * 1e3:.1f} ms of the {rows[8]['latency_s'] * 1e3:.1f} ms" in q1
    assert f"{rows[1]['memory_per_gpu_bytes'] / 1e9:.1f} GB with one 4,096-token" in q1
    big = roofline.tensor_parallel_napkin("llama-2-13b", "h100", batch=256, seq_len=1000, gpus=1)
    weights = big["single"]["param_bytes"]
    assert f"1,000 tokens it needs {big['memory_per_gpu_bytes'] / 1e9:.0f} GB" in q1
    assert f"1,000 tokens it needs {big['memory_per_gpu_bytes'] / 1e9:.0f} GB" in _flat(SLIDES.read_text())
    why = _flat(_by_id("11_md_why"))
    assert f"{weights / 1e9:.0f} GB of weights" in why
    assert f"KV cache adds about {round((big['memory_per_gpu_bytes'] - weights) / 1e10) * 10} GB" in why


def test_the_nvlink_answer_figures():
    q3 = _flat(_by_id("11_q3"))
    import minillm
    target_mb = minillm.load("target").num_params() * 2 / 1e6
    assert f"about {target_mb:.0f} MB" in q3
    llama = roofline.get_model("llama-2-13b")
    per_seq = 2 * (2 - 1) / 2 * llama.dim * 2                   # bytes of one sequence's all-reduce, G = 2
    nvlink_b, pcie_b = 5e-6 * 450e9 / per_seq, 5e-6 * 60e9 / per_seq
    assert 200 <= nvlink_b <= 240 and "about 220 sequences" in q3
    assert 25 <= pcie_b <= 35 and "at about 30" in q3
    assert f"2 \\cdot {llama.n_layers} = {2 * llama.n_layers}$ all-reduces" in q3


def test_the_fitted_alpha_lies_in_the_range_the_text_gives(lab11):
    lo, hi = _range(_flat(_by_id("11_md_allreduce_read")), "the fitted $\\alpha$ came out at")
    alpha_ms = lab11["alpha"] * 1e3
    assert lo <= alpha_ms <= hi, f"fitted alpha {alpha_ms:.3f} ms, the text says {lo}-{hi} ms"
    assert f"{lo}–{hi} ms fitted in every run" in SLIDES.read_text()
    # "the fit follows most points within 2x"
    ratios = [r["median_s"] / lab11["tp"].predicted_all_reduce(r["bytes"], lab11["fit"])
              for r in lab11["ar_rows"]]
    assert sum(0.5 <= x <= 2.0 for x in ratios) > len(ratios) / 2, ratios
    assert "The fit follows most points within 2×" in _flat(_by_id("11_md_allreduce_read"))


def test_tp2_loses_at_the_shipped_width_napkin_and_measurement(lab11):
    r = lab11["rows"][384]
    napkin, measured = r["napkin1"] / r["napkin2"], r["t1"] / r["t2"]
    text = _flat(_by_id("11_md_step_read"))
    lo, hi = _range(text, "the napkin's speed-up at D = 384 was")
    assert lo <= napkin <= hi, f"napkin speed-up at 384: {napkin:.2f}x, text {lo}-{hi}"
    assert napkin < 1 and measured < 1, f"TP = 2 at D = 384: napkin {napkin:.2f}x, measured {measured:.2f}x"
    assert "below 1 both" in text


def test_the_speedup_rises_and_the_crossovers_agree_within_2x(lab11):
    rows = lab11["rows"]
    assert rows[2048]["t1"] / rows[2048]["t2"] > rows[384]["t1"] / rows[384]["t2"]
    napkin, measured = lab11["cross_napkin"], lab11["cross_measured"]
    text = _flat(_by_id("11_md_step_read"))
    lo, hi = (float(x.replace(",", "")) for x in
              re.search(r"napkin put the crossover at D = ([0-9,]+)–([0-9,]+)", text).groups())
    assert napkin is not None and lo <= napkin <= hi, \
        f"the napkin's crossover D = {napkin}, the text says {lo:.0f}-{hi:.0f}"
    assert f"at D = {lo:,.0f}–{hi:,.0f} here" in _flat(_by_id("11_q2"))
    assert measured is not None and 0.5 <= measured / napkin <= 2.0, \
        f"measured crossover {measured}, napkin {napkin}: the text says within 2x"
    assert "within a factor of 2" in text
