"""Lab 05's sentences that state a figure agree with what the cells beside them print.

Each test runs the notebook's own cells (the solutions' code) in this process and reads the
figure from what they compute, then finds the same figure in the text that quotes it: the sizes
of the two drafts (05_md_read, Q3, the slides), the chi-square of the swapped residual (Q1), the
acceptance at temperature 0.8 (Q2), prompt lookup's counts on the repetitive and the Hamlet
prompt (Q4), and the arithmetic of Q2, Q3 and part 7's reading. None of these is a timing (the
generations are greedy or seeded): they are exact on any machine, so they are checked exactly.
The timed figures (part 7's bench, prompt lookup's speed-up) are checked as ranges on a busy
machine in tests/test_lab_measurements.py, and the bench's counted α and tokens per pass there
too (it is the bench that counts them).
"""
from __future__ import annotations

from pathlib import Path

import matplotlib
import pytest
import torch
from lab_notebook import LabNotebook
from lab_notebook import flat as _flat
from lab_notebook import run as _run

REPO = Path(__file__).resolve().parent.parent
NB = LabNotebook("05_speculative")
_by_id = NB.by_id
_starting = NB.starting
SLIDES = REPO / "slides" / "05_speculative.md"


@pytest.fixture(scope="module")
def lab05():
    """The setup, the solutions and the cells defining the drafters and the loop, in a fresh
    namespace, plots off (the setup sets one torch thread: restored afterwards)."""
    matplotlib.use("Agg")
    threads = torch.get_num_threads()
    ns: dict = {}
    printed = _run(ns, _by_id("05_setup"), "05_setup")
    for gid in ("05_residual", "05_verify", "05_sample_many", "05_exact_setup", "05_step",
                "05_formula", "05_lookup"):
        _run(ns, _by_id(gid), gid)
    _run(ns, _starting("class ModelDraft:"), "drafters")
    ns["plt"].show = lambda *a, **k: ns["plt"].close("all")
    ns["setup_printed"] = printed
    yield ns
    torch.set_num_threads(threads)


def test_the_draft_sizes_the_text_quotes(lab05):
    import minillm
    printed = lab05["setup_printed"]
    target, draft = lab05["target"], lab05["draft"]
    ratio = draft.num_params() / target.num_params()
    assert f"({ratio:.2f}x)" in printed and f"{ratio:.2f}" == "0.13", printed
    assert "about the parameter ratio (0.13)" in _flat(_by_id("05_md_read"))
    assert round(target.num_params() / draft.num_params()) == 8            # slides: 8x fewer
    assert "α ≈ 0.8 for a draft with 8× fewer parameters" in SLIDES.read_text()
    assert round(4 * target.num_params() / draft.num_params()) == 32       # int8 vs fp32 bytes
    assert "some 30× fewer bytes" in _flat(_by_id("05_md_read"))
    scratch = minillm.load("draft")
    assert round(target.num_params() / scratch.num_params()) == 9
    assert "with 9× fewer parameters than the target" in _by_id("05_q3")
    assert f"{4 * target.num_params() / 1e6:.0f} MB of weights" == "49 MB of weights"
    assert "the 49 MB of weights" in _by_id("05_q3")


def test_q1_quotes_the_chi_square_of_the_histogram_cell(lab05):
    _run(lab05, _starting("def sample_with_residual("), "histogram")
    stat = {name: lab05["chi2_statistic"](torch.bincount(s, minlength=6).float(), lab05["q_toy"])
            for name, s in lab05["variants"].items()}
    answer = _by_id("05_q1")
    assert round(stat["max(0, p - q)"], -5) == 300_000, stat       # "χ² ≈ 300,000"
    assert "$\\chi^2 \\approx 300{,}000$" in answer
    assert round(stat["yours"]) == 1 and "against about 1 for the correct sampler" in answer, stat
    assert round(lab05["crit"]) == 26 and "(threshold 26)" in answer, lab05["crit"]
    # "tokens 3, 4 and 5 of the toy": where the draft is stronger than the target
    p, q = lab05["p_toy"], lab05["q_toy"]
    assert (p > q).nonzero().flatten().tolist() == [3, 4, 5]
    assert "($p$ = 0.20, 0.25, 0.25 against $q$ = 0.12, 0.08, 0.05)" in answer


def test_q2_quotes_the_sampled_acceptance(lab05):
    cell = _starting('prompt = tok.encode("ROMEO.\\n")\nout_t, stats_t')
    printed = _run(lab05, cell, "T = 0.8")
    assert _run(lab05, cell, "T = 0.8") == printed, "the sampled run is not seeded: it printed differently"
    alpha = f"{lab05['stats_t']['alpha']:.2f}"
    assert f"temperature 0.8: alpha = {alpha}" in printed
    assert f"Measured: α = {alpha} at 0.8 against 0.77–0.84 greedy." in _by_id("05_q2"), alpha


def test_q2_arithmetic_of_the_never_judged_drafts(lab05):
    answer = _by_id("05_q2")
    # k = 6, 4.00 tokens per pass: 3.0 accepted of 6 proposed, accepted / proposed = 0.5
    assert "At k = 6 about 3.0 of 6 proposed drafts are accepted per step" in answer
    assert f"{lab05['expected_tokens_per_step'](0.5, 6):.2f}" == "1.98"
    assert "The formula at 0.5 predicts 1.98 tokens per pass against 4.00 measured." in answer


def test_q3_and_part_7_arithmetic(lab05):
    speedup, tokens = lab05["expected_speedup"], lab05["expected_tokens_per_step"]
    answer = _flat(_by_id("05_q3"))
    v = dict(zip((1, 2, 3, 4, 6), (1.54, 1.77, 1.93, 2.09, 2.28)))     # the run Q3 quotes
    assert "was 1.54, 1.77, 1.93, 2.09, 2.28 for k = 1, 2, 3, 4, 6" in answer
    assert "adds $v - 1$ = " + ", ".join(f"{v[k] - 1:.2f}" for k in v) in answer
    assert "adds $kc$ = " + ", ".join(f"{k * 0.11:.2f}" for k in v) in answer
    # the line v = 1.4 + 0.15 k at alpha 0.83: a free draft, c = 0.11, and v = 1, at k = 4
    assert f"{tokens(0.83, 4):.2f}" == "3.57" and round(speedup(0.83, 4, 0.0, 2.0), 1) == 1.8
    assert "a free draft (c = 0) reaches only about 1.8× by the formula at k = 4 (3.57 tokens" in answer
    assert f"{speedup(0.83, 4, 0.11, 2.0):.2f}" == "1.46" and "c = 0.11 gives 1.46×" in answer
    assert round(speedup(0.83, 4, 0.11), 1) == 2.5 and "would give about 2.5× (k = 4)" in answer
    assert "1.42× predicted, 1.25× measured" in answer and 0.10 < 1.42 / 1.25 - 1 < 0.15
    # the roofline figures
    assert (1 + 1) / 2 == 1 and (6 + 1) / 2 == 3.5 and "≈ 1–3.5 FLOP/byte" in answer
    assert round(989 / 3.35) == 295 and round(26 / 3.35, 1) == 7.8
    assert "≈ 295 FLOP/byte" in answer and "(about 7.8 ms)" in answer
    # part 7's reading: the same alpha (0.81-0.83 in the bench) and c = 0.1, with v = 1
    for alpha in (0.81, 0.82, 0.83):
        assert all(2.3 <= round(speedup(alpha, k, 0.1), 1) <= 2.7 for k in (3, 4, 6)), alpha
    assert "would give about 2.3–2.6× at $k$ = 3–6" in _flat(_by_id("05_md_read"))


def test_q4_quotes_prompt_lookups_counts(lab05):
    import autograder as ag
    from minillm.bench.speculative import repetitive_prompt
    cell = _starting("class PromptLookupDraft:")
    counting = cell[:cell.index("# your prompt_lookup drafting for the course's loop")]
    printed = _run(lab05, counting, "lookup, counted")
    stats = lab05["stats_l"]
    assert "same as greedy: True; 39 target calls for 96 tokens" in printed, printed
    assert f"{stats['alpha']:.2f}" == "0.73" and f"{stats['tokens_per_step']:.2f}" == "2.53"
    answer = _flat(_by_id("05_q4"))
    assert "reached α = 0.73 and 2.53 tokens per pass. That is 39 target calls for 96 tokens" in answer
    assert repetitive_prompt(lab05["tok"]) == lab05["rep"]
    # "rerun part 8 with `hamlet`": the Hamlet prompt, the same loop and drafter, counted
    hamlet = lab05["tok"].encode(lab05["lab05"].PROMPT)
    drafter = lab05["PromptLookupDraft"]()
    unmatched, last = 0, 0
    propose = drafter.propose

    def counting_propose(context, k):
        nonlocal unmatched, last
        tokens, p = propose(context, k)
        unmatched += k > 0 and not tokens         # a lookup that found no n-gram
        last += k == 0                            # the budget's end: nothing left to draft
        return tokens, p
    drafter.propose = counting_propose
    with ag.WorkCounter(lab05["target"]) as work:
        _, st = lab05["speculative_decode"](lab05["target"], drafter, hamlet, 6, 96)
    assert f"{st['alpha']:.2f}" == "0.31" and f"{st['tokens_per_step']:.2f}" == "1.23", st
    assert st["steps"] == 78 and work.calls == 79, (st, work.calls)
    assert (unmatched, last) == (36, 1), (unmatched, last)
    assert ("α ≈ 0.31 and 1.23 tokens per pass (78 passes). In 37 of the 78 steps nothing was "
            "drafted: in 36 no n-gram matched, and the last had no token left to draft.") in answer
