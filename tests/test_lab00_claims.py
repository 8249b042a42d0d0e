"""Lab 00's sentences that state a figure agree with what the cells beside them print, or with the
place they cite.

The tests run the notebook's own cells (the solutions' code) in this process: the setup (the
model's size and vocabulary), the forward pass on the ROMEO prompt (the top token's probability
Q4 quotes), the work count, Q2's exact value. Q1-Q3's model answers quote the course machine's
timed figures from benchmarks/RESULTS.md ("Lab measurements on a busy machine"): checked here
against that section; Q2's arithmetic on them is checked exactly. The timed figures the cells
print are checked on a busy machine in tests/test_lab_measurements.py (lab 00), and lab 01's
bandwidth range that Q1 quotes in tests/test_lab01_claims.py.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from lab_notebook import LabNotebook
from lab_notebook import flat as _flat
from lab_notebook import run as _run

REPO = Path(__file__).resolve().parent.parent
NB = LabNotebook("00_sampling")
_by_id = NB.by_id
_starting = NB.starting
RESULTS = REPO / "benchmarks" / "RESULTS.md"
SLIDES = REPO / "slides" / "00_sampling.md"
SECTION = "## Lab measurements on a busy machine"


def _results_section() -> str:
    text = RESULTS.read_text()
    start = text.index(SECTION)
    return _flat(text[start:text.index("\n## ", start + 1)])


@pytest.fixture(scope="module")
def lab00():
    threads = torch.get_num_threads()
    ns: dict = {}
    printed = {gid: _run(ns, _by_id(gid), gid) for gid in
               ("00_setup", "00_apply_temperature", "00_top_k_filter", "00_top_p_filter",
                "00_sample_next", "00_naive_work", "00_q2_value")}
    ns["_printed"] = printed
    yield ns
    torch.set_num_threads(threads)


def test_the_model_s_size_and_vocabulary(lab00):
    printed = lab00["_printed"]["00_setup"]
    m = re.search(r"([\d.]+)M parameters, vocabulary of (\d+) tokens", printed)
    params_m, vocab = m.groups()
    assert f"BPE with {vocab} tokens" in _by_id("00_md_tokens")
    try_text = _flat(_by_id("00_md_try"))
    assert f"it has {round(float(params_m))}M parameters" in try_text
    card = (REPO / "minillm" / "assets" / "MODEL_CARD.md").read_text()
    minutes = re.search(r"\| training wall time \| (\d+) min on cpu", card).group(1)
    assert f"({minutes} minutes: minillm/assets/MODEL_CARD.md)" in try_text
    assert 45 <= int(minutes) <= 90, "'about an hour'"
    assert f"{round(float(params_m))}M-parameter model" in SLIDES.read_text()
    q1 = _flat(_by_id("00_q1"))
    n = lab00["model"].num_params()
    assert f"all {params_m}M parameters, about {4 * n / 1e6:.0f} MB in fp32" in q1
    assert f"$2N \\approx {2 * n / 1e6:.0f}$ MFLOP" in q1
    cfg = lab00["cfg"]
    q3 = _flat(_by_id("00_q3"))
    t_star = 2 * cfg.dim + 3 * cfg.hidden_dim // 2
    assert f"($D = {cfg.dim}$, $F = {cfg.hidden_dim}$), $T^* = {2 * cfg.dim} + {3 * cfg.hidden_dim // 2} = {t_star}$" in q3
    assert f"{t_star // cfg.max_seq_len}× its {cfg.max_seq_len}-token context" in q3
    assert "$T^* = 10\\,240 + 20\\,736 = 30\\,976$" in q3 and 2 * 5120 + 3 * 13824 // 2 == 30976


def test_q4_quotes_the_top_token_the_forward_cell_prints(lab00):
    ns = lab00
    _run(ns, _starting("prompt = \"ROMEO:"), "tokens")
    printed = _run(ns, _starting("with torch.no_grad():\n    logits = model("), "forward")
    top_p = re.search(r"\n\s+1\s+\d+\s+([\d.]+)\s+'\\n'", printed).group(1)
    q4 = _flat(_by_id("00_q4"))
    assert f"the model puts {float(top_p):.3f} on `'\\n'`" in q4
    assert "(0.957 ≥ 0.9)" in q4 and f"{float(top_p):.3f}" == "0.957"
    assert f"the last ~{round(100 * (1 - float(top_p)))} %" in q4
    probs = ns["probs"]
    assert int((ns["top_k_filter"](probs.log(), 40) > float("-inf")).sum()) - 1 == 39


def test_q2_is_exact_arithmetic_on_the_cited_fit(lab00):
    section = _results_section()
    assert "TTFT fit a = 5.8-6.0 ms, b = 189-193 us (a = 30-32 tokens of b)" in section
    assert "the 128-token naive generation took 2.39-2.42 s against 2.39-2.43 s predicted" in section
    assert "totals were 0.98, 1.12 and 0.76 times the prediction" in section
    q1, q3 = _flat(_by_id("00_q1")), _flat(_by_id("00_q3"))
    assert "$a$ = 5.8–6.0 ms and $b$ = 189–193 µs" in q1 and "30–32 tokens of $b$" in q1
    assert "generation took 2.39–2.42 s" in q3
    assert "0.76–1.12 times it" in _flat(_by_id("00_md_total"))
    a, b = 5.9e-3, 0.191e-3                   # the middle of the ranges, as Q2 says
    q2 = _flat(_by_id("00_q2"))
    assert "($a \\approx 5.9$ ms, $b \\approx 0.191$ ms per token" in q2
    ntp = lab00["naive_tokens_processed"]
    passes = ntp(300, 200)
    total = 200 * a + passes * b
    assert f"{a * 1e3:.1f} + {300 * b * 1e3:.1f} \\approx {(a + 300 * b) * 1e3:.0f}$ ms" in q2
    assert f"$a + 499b \\approx {(a + 499 * b) * 1e3:.0f}$ ms" in q2
    assert (f"{200 * a:.1f} + {passes * b:.1f} \\approx {total:.1f}$ s, so the throughput is "
            f"$200 / {total:.1f} \\approx {200 / total:.1f}$ tokens/s") in q2
    assert f"(≈ {(a + 300 * b) * 1e3:.0f} ms and ≈ {(a + 499 * b) * 1e3:.0f} ms" in q2
    assert f"(≈ {total:.1f} s and ≈ {200 / total:.1f} tokens/s" in q2
    assert passes == 79_900 and f"{100 * lab00['redundant_fraction']:.1f} %" == "99.4 %"
    assert "= 79\\,900$ token-passes" in q2 and "\\approx 99.4\\,\\%$" in q2


def test_the_speed_test_states_its_threshold():
    from autograder.labs import lab00
    assert f"at least {'twice' if lab00.THRESHOLD == 2 else lab00.THRESHOLD} as long" in _flat(
        _by_id("00_md_speed"))
