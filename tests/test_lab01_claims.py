"""Lab 01's sentences that state a figure agree with what the cells beside them print.

The tests run the notebook's own cells (the solutions' code) in this process and read the figures
from their output or their variables, then find the same figures in the text that quotes them:
the accelerator intensities, the lecture's Llama-2-13B table and its reading, the GQA table, the
tensor-parallel reading, the model answers of Q4 and Q5 (napkin figures, exact on any machine),
the deck's table slide. The roofline sweep of part 4 is timed: the ranges that the reading of
the roofline and Q2/Q3's model answers state are checked on a busy machine (`slow`), three runs
beside a busy loop, with lab 00's Q1 bandwidth range (it quotes lab 01's sweep at B = 1).
"""
from __future__ import annotations

import math
import re
from pathlib import Path

import matplotlib
import pytest
import torch
from cpu_load import competing_cpu_load
from lab_notebook import LabNotebook
from lab_notebook import flat as _flat
from lab_notebook import run as _run

REPO = Path(__file__).resolve().parent.parent
NB = LabNotebook("01_roofline")
_by_id = NB.by_id
_starting = NB.starting
SLIDES = REPO / "slides" / "01_roofline.md"
SOLUTIONS = ("01_setup", "01_matmul", "01_accelerator", "01_mlp", "01_attention", "01_shapes",
             "01_params_kv", "01_napkin", "01_max_batch", "01_measured_counts", "01_fit_roofline",
             "01_serve_batched", "01_tensor_parallel")


@pytest.fixture(scope="module")
def lab01():
    """The setup and the solution cells, in a fresh namespace, plots off (the setup sets one
    torch thread: restored afterwards)."""
    matplotlib.use("Agg")
    threads = torch.get_num_threads()
    ns: dict = {}
    printed = {gid: _run(ns, _by_id(gid), gid) for gid in SOLUTIONS}
    ns["plt"].show = lambda *a, **k: ns["plt"].close("all")
    ns["_printed"] = printed
    yield ns
    torch.set_num_threads(threads)


def test_the_intro_quotes_the_intensities_the_cell_prints(lab01):
    printed = lab01["_printed"]["01_accelerator"]
    h100, a100 = re.search(r"H100 ([\d.]+), A100 ([\d.]+)", printed).groups()
    intro = _flat(_by_id("01_intro"))
    assert f"H100 (≈ {round(float(h100))})" in intro and f"A100 (≈ {round(float(a100))})" in intro


def test_the_table_reading_quotes_the_printed_table(lab01):
    printed = _run(lab01, _starting("def show(row, B"), "lecture table")
    rows = {int(b): (float(m), float(lat), float(thr), fits == "fits") for b, m, lat, thr, fits in
            re.findall(r"B = (\d+)\s+memory\s+([\d.]+) GB\s+latency\s+([\d.]+) ms\s+"
                       r"throughput\s+([\d.]+) tok/s\s+(fits|does NOT fit)", printed)}
    assert set(rows) == {1, 64, 256}, printed
    text = _flat(_by_id("01_md_gqa"))
    assert "a token every 8 ms" in text and round(rows[1][1]) == 8
    assert f"throughput × {round(rows[64][2] / rows[1][2])}, latency only × {round(rows[64][1] / rows[1][1])}" in text
    assert f"the step needs {round(rows[256][0])} GB" in text and not rows[256][3]
    assert f"grow {rows[256][2] / rows[64][2]:.2f}× for 4× the batch" in text
    q4 = _flat(_by_id("01_q4"))
    assert f"{rows[64][2]:.0f} at $B = 64$, {rows[256][2]:.0f} at $B = 256$" in q4
    assert f"({round(rows[256][0])} GB)" in q4
    slides = _flat(SLIDES.read_text())
    assert f"about {round(rows[1][1])} ms per token, ~{round(rows[1][2])} tokens/s" in slides
    assert (f"throughput ×~{round(rows[64][2] / rows[1][2])}, latency ×~"
            f"{round(rows[64][1] / rows[1][1])}") in slides
    napkin = lab01["napkin"]
    r1, r256 = (napkin(b, 1000, lab01["LLAMA_2_13B"], lab01["H100"]) for b in (1, 256))
    caches = 256 * r256["kv_bytes_per_seq"] / 1e9
    assert f"the KV caches need {caches:.0f} GB" in slides            # 210, with the weights 236
    assert f"{r256['memory_bytes'] / 1e9:.0f} GB in all" in slides
    assert f"{r1['param_bytes'] / 1e9:.0f} GB of weights" in slides
    # "the 64 KV caches are now twice the weights' bytes"
    assert round(64 * r1["kv_bytes_per_seq"] / r1["param_bytes"]) == 2


def test_q4_and_the_gqa_table(lab01):
    printed = _run(lab01, _starting("GQA = LLAMA_2_13B | dict(K=8)\nprint("), "gqa table")
    thr256 = float(re.search(r"B = 256\s+memory\s+([\d.]+) GB.*throughput\s+([\d.]+) tok/s",
                             printed).group(2))
    napkin, mbf = lab01["napkin"], lab01["max_batch_that_fits"]
    m, gqa, h100 = lab01["LLAMA_2_13B"], lab01["GQA"], lab01["H100"]
    kv = napkin(1, 1000, m, h100)["kv_bytes_per_seq"]
    kv8 = napkin(1, 1000, gqa, h100)["kv_bytes_per_seq"]
    q4 = _flat(_by_id("01_q4"))
    assert f"\\approx {round(h100['bandwidth'] / kv, -1):.0f}$ tokens/s" in q4       # 4090
    assert f"({kv8 / 1e6:.0f} MB per sequence)" in q4                                # 164
    assert f"≈ {round(h100['bandwidth'] / kv8, -2):,.0f} tokens/s" in q4             # 20,400
    assert f"from {mbf(1000, m, h100)} to {mbf(1000, gqa, h100)}" in q4               # 65, 349
    assert f"fits ({napkin(256, 1000, gqa, h100)['memory_bytes'] / 1e9:.1f} GB)" in q4
    assert f"at ≈ {round(thr256, -1):,.0f} tokens/s" in q4                           # 13,270


def test_q5_quotes_the_napkin(lab01):
    napkin, mbf = lab01["napkin"], lab01["max_batch_that_fits"]
    m, h100 = lab01["LLAMA_2_13B"], lab01["H100"]
    bf16, int8 = napkin(1, 1000, m, h100), napkin(1, 1000, m, h100, bytes_per_param=1)
    q5 = _flat(_by_id("01_q5"))
    assert f"({bf16['param_bytes'] / 1e9:.1f} → {int8['param_bytes'] / 1e9:.1f} GB)" in q5
    assert f"goes from {bf16['latency_s'] * 1e3:.2f} to {int8['latency_s'] * 1e3:.2f} ms" in q5
    assert f"{bf16['throughput_tok_s']:.0f} → {int8['throughput_tok_s']:.0f} tokens/s" in q5
    b16, b8 = mbf(1000, m, h100), mbf(1000, m, h100, 1)
    assert f"goes from {b16} to {b8} ({b8 / b16:.1f}×)" in q5
    free16, free8 = (h100["memory"] - r["param_bytes"] for r in (bf16, int8))
    assert f"({free16 / 1e9:.0f} → {free8 / 1e9:.0f} GB)" in q5
    # weights int8, cache bf16
    w_only = (int8["param_bytes"] + bf16["kv_bytes_per_seq"]) / h100["bandwidth"]
    assert f"8.0 → {w_only * 1e3:.1f} ms" in q5
    assert f"against {b16} → {int(free8 // bf16['kv_bytes_per_seq'])} sequences" in q5
    gqa = lab01["GQA"]
    long16 = napkin(1, 8192, m, h100)
    long_gqa = napkin(1, 8192, gqa, h100)
    assert f"cache is {long16['kv_bytes_per_seq'] / 1e9:.1f} GB in bf16" in q5
    assert f"only **{mbf(8192, m, h100)}** sequences fit" in q5
    assert f"With $K = 8$ it is {long_gqa['kv_bytes_per_seq'] / 1e9:.2f} GB" in q5
    assert f"shrink to {long_gqa['param_bytes'] / 1e9:.1f} GB" in q5
    assert f"so **{mbf(8192, gqa, h100)}** fit" in q5
    assert f"the counts are {mbf(8192, m, h100, 1)} and {mbf(8192, gqa, h100, 1)}" in q5


def test_the_tensor_parallel_reading_quotes_the_printed_rows(lab01):
    printed = _run(lab01, _starting("# Four H100s, Llama-2-13B"), "tensor parallel")
    rows = {int(b): tuple(map(float, r)) for b, *r in re.findall(
        r"B = +(\d+): copies +([\d.]+) ms .*split, NVLink +([\d.]+) ms \(all-reduces ([\d.]+)\)"
        r" \| split, PCIe +([\d.]+) ms \(all-reduces ([\d.]+)\)", printed)}
    copies, nv, nv_comm, pcie, pcie_comm = rows[1]
    text = _flat(_by_id("01_md_tensor_parallel_read"))
    assert f"drops from {copies:.0f} ms to about {nv:.1f} ms" in text
    assert f"costing {nv_comm:.1f} ms of it" in text
    _, _, _, pcie256, comm256 = rows[256]
    assert f"({comm256:.1f} of {pcie256:.1f} ms)" in text
    assert 0.2 <= comm256 / pcie256 <= 0.3                       # "about a quarter"


# --- the timed sweep of part 4 ---------------------------------------------------------------------
RUNS = 1                       # ~9 s a run (the cell's 7 rounds); the ranges below: 5 runs
# The ranges the text states (01_md_roofline_read, 01_q2, 01_q3; 00_q1 quotes the bandwidth).
# Five runs on the 2-core AMD EPYC, load average 10-12 (2026-11-29): peak 100.9-105.0 GFLOP/s,
# bandwidth 19.9-24.0 GB/s, ridge 4.3-5.1; measured / predicted B = 2..8 0.45-0.76 (B = 8
# 0.46-0.49), B = 256..1024 0.95-1.00 (benchmarks/RESULTS.md).
RIDGE = (3.0, 7.0)             # fitted ridge, FLOPs/byte (fp32, one core)
PEAK_GFLOPS = (80.0, 130.0)    # highest FLOP/s of the sweep
BANDWIDTH_GBS = (15.0, 30.0)   # highest bytes/s of the sweep (B = 1 in every run so far)
LOWEST_AMONG = (4, 8, 16)      # the batch with the lowest measured / predicted is one of these
LOWEST_AT_MOST = 0.75          # and that ratio is at most this (B = 2 reached 0.92 once: make test)
B8_ABOUT_HALF = (0.3, 0.7)     # B = 8: "about half"
LARGE_B_NEAR = 0.75            # B = 256..1024: at least this


@pytest.mark.slow
def test_the_sweep_keeps_the_ranges_the_text_states(lab01):
    sweep, fit = _starting("D_MEASURE = F_MEASURE = 2048"), _starting("peak, bandwidth = fit_roofline(")
    runs = []
    with competing_cpu_load():
        for _ in range(RUNS):
            _run(lab01, sweep, "sweep")
            _run(lab01, fit, "fit")
            ratio = {b: y / p for b, y, p in zip(lab01["BATCHES"], lab01["achieved"],
                                                 lab01["predicted"])}
            by_b = dict(zip(lab01["BATCHES"], zip(lab01["achieved"], lab01["intensity"])))
            runs.append({"peak": lab01["peak"] / 1e9, "bandwidth": lab01["bandwidth"] / 1e9,
                         "ridge": lab01["ridge"], "ratio": ratio,
                         "peak_at": max(by_b, key=lambda b: by_b[b][0]),
                         "bandwidth_at": max(by_b, key=lambda b: by_b[b][0] / by_b[b][1])})
    for i, r in enumerate(runs):
        print(f"\nlab 01 sweep run {i}: peak {r['peak']:.1f} GFLOP/s, bandwidth "
              f"{r['bandwidth']:.1f} GB/s, ridge {r['ridge']:.2f}, measured / predicted "
              + " ".join(f"{b}:{v:.2f}" for b, v in r["ratio"].items()))
        where = f"run {i} of {RUNS}: {r}"
        assert RIDGE[0] <= r["ridge"] <= RIDGE[1], where
        assert PEAK_GFLOPS[0] <= r["peak"] <= PEAK_GFLOPS[1], where
        assert BANDWIDTH_GBS[0] <= r["bandwidth"] <= BANDWIDTH_GBS[1], where
        lowest = min(r["ratio"], key=r["ratio"].get)
        assert lowest in LOWEST_AMONG and r["ratio"][lowest] <= LOWEST_AT_MOST, where
        assert B8_ABOUT_HALF[0] <= r["ratio"][8] <= B8_ABOUT_HALF[1], where
        assert min(r["ratio"][b] for b in (256, 512, 1024)) >= LARGE_B_NEAR, where
        # Q2 / Q3: B = 1 sets the bandwidth, one of B = 256-1024 the peak
        assert r["bandwidth_at"] == 1 and r["peak_at"] in (256, 512, 1024), where
    q2, q3 = _flat(_by_id("01_q2")), _flat(_by_id("01_q3"))
    assert f"about {RIDGE[0]:g}–{RIDGE[1]:g} FLOPs/byte" in q2
    assert f"{PEAK_GFLOPS[0]:g}–{PEAK_GFLOPS[1]:g} GFLOP/s" in q2
    assert f"{BANDWIDTH_GBS[0]:g}–{BANDWIDTH_GBS[1]:g} GB/s" in q2
    lowest = (f"the lowest point was one of $B = {LOWEST_AMONG[0]}$–{LOWEST_AMONG[-1]}, at most "
              f"{LOWEST_AT_MOST:g} of the prediction")
    assert f"{lowest} ($B = 8$ about half" in q3
    assert f"{lowest}, and $B = 8$ about half" in _flat(_by_id("01_md_roofline_read"))
    assert f"at least {LARGE_B_NEAR:g} of it" in q3
    assert "the peak came only at $B = 256$–1024" in q2
    assert "$B = 1$ and the point with the highest FLOP/s (one of $B = 256$–1024) sit on the roofline" in q3
    assert (f"{BANDWIDTH_GBS[0]:g}–{BANDWIDTH_GBS[1]:g} GB/s that lab 01's sweep measures"
            in _flat(LabNotebook("00_sampling").by_id("00_q1")))


def test_q1_and_the_batching_citation(lab01):
    napkin, mbf = lab01["napkin"], lab01["max_batch_that_fits"]
    m, h100 = lab01["LLAMA_2_13B"], lab01["H100"]
    kv = napkin(1, 1000, m, h100)["kv_bytes_per_seq"]
    q1 = _flat(_by_id("01_q1"))
    assert f"{kv / 1e9:.2f} GB per 1000-token Llama-2-13B sequence, {mbf(1000, m, h100)} sequences" in q1
    results = _flat((REPO / "benchmarks" / "RESULTS.md").read_text())
    assert "`stack(xs) @ W` 8.75-9.39" in results and "reference 1.95-3.18 (median 2.17)" in results
    text = _flat(_by_id("01_md_batching"))
    assert "1.95–3.18× on the course's 2-core AMD EPYC" in text and "8.75–9.39× on an older core" in text
    assert '"Speed-check ranges under the earlier grading designs"' in text


def test_the_arithmetic_sentences(lab01):
    """Sentences that do arithmetic on the lab's figures (no cell prints them): checked here."""
    napkin, tp = lab01["napkin"], lab01["tensor_parallel"]
    m, h100 = lab01["LLAMA_2_13B"], lab01["H100"]
    gqa = m | dict(K=8)
    r1 = napkin(1, 1000, m, h100)
    weights_gb, kv_gb = round(r1["param_bytes"] / 1e9), round(r1["kv_bytes_per_seq"] / 1e9, 2)
    shrink = m["K"] / gqa["K"]
    # 01_md_accelerator: at B = 1 (intensity ~1) an H100's compute units idle > 99 % of the time
    assert "sit idle more than 99 % of the time" in _flat(_by_id("01_md_accelerator"))
    assert 1 - 1 / lab01["h100_intensity"] > 0.99
    gqa_text, q4 = _flat(_by_id("01_md_gqa")), _flat(_by_id("01_q4"))
    assert f"the whole {weights_gb} GB of weights" in gqa_text and weights_gb == 26
    assert f"every sequence adds {kv_gb} GB of KV cache" in gqa_text and kv_gb == 0.82
    assert f"a {shrink:.0f}× smaller cache" in gqa_text and shrink == 5
    assert f"{weights_gb} GB weight read" in q4 and f"({kv_gb} GB at" in q4
    assert f"shrinks the cache {shrink:.0f}×" in q4 and f"the limit rises {shrink:.0f}×" in q4
    # the timed matmul: W is 2048 x 2048 fp32; at B = 1 its intensity is about 1/2
    flops, nbytes = lab01["matmul_counts"](1, 2048, 2048, 4)
    mb = 2048 * 2048 * 4 / 1e6
    for gid in ("01_md_measure", "01_md_batching", "01_q2", "01_q3"):
        assert f"{mb:.1f} MB" in _flat(_by_id(gid)) and "16 MB" not in _flat(_by_id(gid)), gid
    assert "intensity about ½ (fp32: 2 FLOPs per 4-byte weight)" in _flat(_by_id("01_md_roofline_read"))
    assert round(flops / nbytes, 2) == 0.5
    # Q2: the H100 against one core, at the middle of the ranges the sweep test checks
    q2 = _flat(_by_id("01_q2"))
    assert "$989/3.35 \\approx 295.2$: $B = 296$" in q2 and f"{989 / 3.35:.1f}" == "295.2"
    assert "roughly 10,000× the FLOP/s" in q2 and "~100 GFLOP/s" in q2
    assert round(989e12 / 100e9, -3) == 10_000
    assert "only about 150× its bandwidth (3.35 TB/s against ~22 GB/s)" in q2
    assert round(3.35e12 / 22e9, -1) == 150
    assert "$B \\approx 6$–14" in q2 and "about 3–7 FLOPs/byte" in q2     # fp32: B ~ 2 x ridge
    # the split at batch 1: 8 ways (40 heads divide evenly, 16 would not) and its all-reduces
    r8 = tp(1, 1000, m, h100, 8, 450e9, allreduce_latency_s=5e-6)
    assert m["N"] % 8 == 0 and m["N"] % 16
    assert (f"splitting 8 ways (the 40 heads must divide evenly) gives {r8['latency_s'] * 1e3:.1f} ms, "
            f"still {r8['comm_s'] * 1e3:.1f} ms of it all-reduces") in _flat(_by_id("01_md_tensor_parallel_read"))
    # the explorer cell's "(the lecture's table: 23.42 ms)"
    assert f"(the lecture's table: {napkin(64, 1000, m, h100)['latency_s'] * 1e3:.2f} ms)" in \
        _starting("from minillm.explorers import napkin_explorer")
    # the deck: ~1/295, B >~ 295, 26 GB of weights, 0.8 GB per sequence, 5x smaller with K = 8
    slides = _flat(SLIDES.read_text())
    assert f"~1/{lab01['h100_intensity']:.0f} of the chip's compute" in slides
    assert f"just reading {weights_gb} GB of weights" in slides
    assert f"**{r1['kv_bytes_per_seq'] / 1e9:.1f} GB** per 1000-token" in slides
    assert f"shrink it {shrink:.0f}×" in slides


def test_the_napkin_questions_arithmetic():
    """Q6 (mixture of experts), Q7 (early exit), Q8 (effective sparsity): exact arithmetic."""
    q6, q7, q8 = (_flat(_by_id(g)) for g in ("01_q6", "01_q7", "01_q8"))
    experts, shared = 0.9 * 47, 0.1 * 47
    per_expert, active = experts / 8, shared + 2 * experts / 8
    assert (f"$0.9 \\times 47 = {experts:.1f}$ B parameters, ${experts:.1f}/8 = {per_expert:.2f}$ B "
            f"per expert") in q6 and f"shared: {shared:.1f} B" in q6
    assert f"$4.7 + 2 \\times 5.29 = {active:.1f}$ B parameters, **{2 * active:.1f} GB**" in q6
    assert f"a dense 13 B reads {2 * 13} GB, a dense 47 B {2 * 47} GB" in q6
    assert "$(6/8)^{64} \\approx 10^{-8}$" in q6 and round(math.log10(0.75 ** 64)) == -8
    assert f"**{2 * 47} GB** per step" in q6
    expected = 0.6 * 0.5 + 0.4 * 1
    assert f"$0.6 \\times 0.5 + 0.4 \\times 1 = {expected:g}$" in q7 and "about 1.4×" in q7
    assert round(1 / expected, 1) == 1.4
    assert "$0.6^{32} \\approx 8 \\times 10^{-8}$" in q7 and round(0.6 ** 32 * 1e8) == 8
    loaded = {b: 1 - 0.97 ** b for b in (1, 16, 128)}
    assert f"**{loaded[1]:.0%}** at $B = 1$".replace("%", " %") in q8
    assert f"$1 - 0.97^{{16}} = 1 - {0.97 ** 16:.2f} =$ **{loaded[16]:.0%}**".replace("%", " %") in q8
    assert f"$1 - 0.97^{{128}} = 1 - {0.97 ** 128:.2f} =$ **{loaded[128]:.0%}**".replace("%", " %") in q8
    assert f"about {1 / 0.03:.0f}-fold ($1/0.03$)" in q8


def test_the_run_time_sentence():
    """The intro's run-time bound is the one the pipeline test enforces on every lab."""
    pipeline = (REPO / "tests" / "test_pipeline.py").read_text()
    assert re.search(r"^MAX_SECONDS = 180 ", pipeline, re.M)
    assert "it runs in under three minutes on two CPU cores (the course's tests check that bound)" in \
        _flat(_by_id("01_intro"))


def test_the_serving_task_states_its_threshold():
    from autograder.labs import lab01 as grading
    share = f"{grading.SERVING_WITHIN:.0%}".replace("%", " %")
    assert f"reaches at least {share} of the best throughput" in _flat(_by_id("01_md_serving"))


def test_the_all_reduce_latency_is_the_one_the_cells_use():
    """The text names α as an assumption, and it is the one the explorer and the tables use."""
    text = _flat(_by_id("01_md_tensor_parallel"))
    assert "assume $\\alpha$ = 5 µs over NVLink, a round figure, not a measurement" in text
    code = (REPO / "labs" / "01_roofline" / "01_roofline.ipynb").read_text()
    assert code.count("allreduce_latency_s=5e-6") >= 4 and "a few microseconds" not in code
