"""Lab 08's sentences that state a figure agree with what the cells beside them print.

The notebook's own cells run in this process with the solutions' code: the setup (the three
checkpoints' shapes), the scores, the width-against-depth losses of part 2 and the table of
part 4 (held-out loss, KL, 1 - TV and greedy acceptance: no timing, so exact on any machine).
Their figures are matched against the text and the model answers that quote them; the
arithmetic of part 2 and Q1, and the figures quoted from benchmarks/RESULTS.md, the model card
and the checkpoints' train_log.json are checked against their sources. Two `slow` tests run
what costs most: part 2's timing and part 3's short run (its curves are exact; its duration is
held to the text's bound beside a competing load).
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

REPO = Path(__file__).resolve().parent.parent
NB = LabNotebook("08_pruning_distillation")
_by_id = NB.by_id
_starting = NB.starting
RESULTS = (REPO / "benchmarks" / "RESULTS.md").read_text()


@pytest.fixture(scope="module")
def lab08():
    """Setup, solutions, scores, the layer losses, part 2's losses and part 4's table."""
    matplotlib.use("Agg")
    threads = torch.get_num_threads()
    ns: dict = {}
    printed = {"setup": _run(ns, _by_id("08_setup"), "08_setup")}
    for gid in ("08_head_scores", "08_other_scores", "08_calib", "08_scores", "08_prune",
                "08_kd_loss", "08_distill_step"):
        _run(ns, _by_id(gid), gid)
    ns["plt"].show = lambda *a, **k: ns["plt"].close("all")
    _run(ns, "drop_loss = pruning.layer_drop_loss(target, CALIB[:2])", "drop_loss")
    printed["width_depth"] = _run(ns, _starting("depth_keep = pruning.choose("), "part 2")
    run_cell = _starting("log_d = train_log(DISTILLED)")
    _run(ns, run_cell[:run_cell.index("STEPS, EVAL_EVERY")], "pruned_only")   # no short run
    ns["log_s"] = ns["train_log"]("draft")
    printed["table"] = _run(ns, _starting("PROMPTS = ["), "part 4")    # the target's loss: part 2's
    yield ns, printed
    torch.set_num_threads(threads)


def test_the_setup_prints_the_shapes_the_text_names(lab08):
    ns, printed = lab08
    setup = printed["setup"]
    assert re.search(r"target: 12\.19M parameters, 6 layers x 384", setup), setup
    assert re.search(r"draft:  1\.33M parameters, 4 layers x 128", setup), setup
    assert re.search(r"draft-distilled:  1\.52M parameters, 2 layers x 192", setup), setup
    src = _by_id("08_setup")
    assert "# 12.2M parameters: 6 layers x 384" in src and "# 1.3M: 4 layers x 128" in src
    assert f"# {len(ns['train_ids']) / 1e6:.1f}M tokens" in src
    q3 = _flat(_by_id("08_q3"))
    assert "`draft-distilled` (2 layers × 192, 1.52M parameters)" in q3
    assert "`draft` (4 layers × 128, 1.33M)" in q3


def test_part_2_arithmetic_and_its_losses(lab08):
    ns, printed = lab08
    c = ns["target"].config
    per_layer = 4 * c.dim * c.n_heads * c.head_dim + 3 * c.dim * c.hidden_dim
    half = 4 * c.dim * 3 * c.head_dim + 3 * c.dim * 512
    md = _flat(_by_id("08_md_width_depth"))

    def tex(x: int) -> str:                                        # 884{,}736
        return f"{x:,}".replace(",", "{,}")

    assert f"= {tex(half)}$, half of the full layer's ${tex(per_layer)}$" in md
    assert 2 * half == per_layer
    assert f"(the embedding, {c.vocab_size * c.dim / 1e6:.2f}M, stays)" in md
    params = {k: float(v) for k, v in re.findall(r"(\S+): +([\d.]+)M parameters", printed["width_depth"])}
    width, depth = ns["width_model"].num_params(), ns["depth_model"].num_params()
    assert abs(width - depth) / depth < 1e-3, "the candidates differ by less than 0.1 %"
    losses = {name: l for name, l in ns["losses"].items()}
    q4 = _flat(_by_id("08_q4"))
    assert f"At equal parameters ({depth / 1e6:.2f}M)" in q4, (params, q4[:200])
    w, d, t = (losses["width: 3 heads, MLP 512"], losses["depth: 3 of 6 layers"], losses["target"])
    assert f"{w:.2f} against {d:.2f} on the development machine (the target: {t:.2f})" in q4, \
        (w, d, t)
    assert w < d


def test_q2_quotes_the_part_4_table(lab08):
    ns, _ = lab08
    table = ns["table"]
    rows = ("pruned only", "pruned + distilled", "from scratch")
    kl = ", ".join(f"{table[r]['kl']:.2f}" for r in rows)
    tv = ", ".join(f"{table[r]['overlap']:.2f}" for r in rows)
    alpha = ", ".join(f"{table[r]['alpha']:.2f}" for r in rows)
    q2 = _flat(_by_id("08_q2"))
    assert f"KL = {kl} and 1 − TV = {tv}" in q2, (kl, tv)
    assert f"the greedy α was {alpha}" in q2, alpha
    k = table["pruned + distilled"]["kl"]
    assert f"$1 - \\sqrt{{{k:.2f}/2}} = {1 - (k / 2) ** 0.5:.2f}$" in q2


def test_q1_quotes_the_checkpoints_and_their_logs(lab08):
    ns, _ = lab08
    table, log_d, log_s = ns["table"], ns["log_d"], ns["log_s"]
    q1 = _flat(_by_id("08_q1"))
    dist, scratch = table["pruned + distilled"], table["from scratch"]
    assert f"reached a held-out loss of {dist['loss']:.3f} on the lab's 8,192 tokens (perplexity " \
           f"{dist['ppl']:.1f};" in q1, (dist["loss"], dist["ppl"])
    assert f"reached {scratch['loss']:.3f} ({scratch['ppl']:.1f};" in q1
    assert f"after {log_d['train_tokens_seen'] / 1e6:.2f}M training tokens plus " \
           f"{log_d['calibration']['tokens'] / 1e3:.0f}k calibration tokens" in q1
    assert f"after {log_s['train_tokens_seen'] / 1e6:.2f}M tokens" in q1
    run = _flat(_by_id("08_md_run"))
    assert f"distilled for\n{log_d['steps']} steps" in _by_id("08_md_run") or \
        f"distilled for {log_d['steps']} steps of {log_d['batch_size']} windows of " \
        f"{log_d['seq_len']} tokens" in run
    assert f"{log_d['wall_s'] / 60:.0f} and {log_s['wall_s'] / 60:.0f} minutes" in q1
    assert log_d["calibration"]["samples"] == 1024 and "pruned with 1,024" in _by_id("08_md_calib")


def test_the_figures_quoted_from_results_are_there():
    section = RESULTS[RESULTS.index("## Speculative decoding with the distilled draft"):]
    section = _flat(section[:section.index("\n## ")])
    read = _flat(_by_id("08_md_read"))
    assert "brings $c$ down to about 0.11 (`benchmarks/RESULTS.md`" in read
    assert "the draft's step cost c = 0.110 and 0.109 target steps" in section
    row = next(line for line in RESULTS.splitlines() if line.startswith("| v: a pass over k + 1"))
    v = [float(x) for cell in row.strip("|").split("|")[1:6] for x in cell.split("/")]   # k = 1-6
    assert f"($v$ = {min(v):.2f}–{max(v):.2f} target steps for $k$ = 1–6" in read, v


WIDTH_OVER_DEPTH = (1.05, 1.4)     # ms per token, width / depth: Q4 "about 1.1-1.3x", the slides


@pytest.mark.slow
def test_width_over_depth_time_falls_in_the_stated_range(lab08):
    from cpu_load import competing_cpu_load
    ns, _ = lab08
    with competing_cpu_load():
        printed = _run(ns, _starting("from minillm.decode import PackedDecoder"), "part 2 timing")
    ratio = ns["step_ms"]["width"] / ns["step_ms"]["depth"]
    print(f"\n{printed}")
    assert WIDTH_OVER_DEPTH[0] <= ratio <= WIDTH_OVER_DEPTH[1], ratio
    assert "(expect about 1.1–1.3×)" in _flat(_by_id("08_q4"))


def test_q3_cites_the_recorded_c_of_the_scratch_draft():
    section = RESULTS[RESULTS.index("## Speculative decoding (lab 05, CPU)"):]
    section = _flat(section[:section.index("\n## ")])
    assert "one draft step cost c = 0.24–0.27 target" in section
    assert "$c$ = 0.24–0.27: `benchmarks/RESULTS.md`, \"Speculative decoding (lab 05, CPU)\"" in \
        _flat(_by_id("08_q3"))


CARD = (REPO / "minillm" / "assets" / "MODEL_CARD.md").read_text()


def test_q1_whole_split_figures_are_the_model_cards(lab08):
    """Q1's whole-split losses and perplexities are the model card's; its differences, token
    ratio and FLOPs follow from them and from the logs."""
    ns, _ = lab08
    row = {k: re.search(rf"\| {re.escape(k)} \| ([^\n]*)\|\n", CARD).group(1).split(" | ")
           for k in ("held-out loss (nats/token)", "held-out perplexity")}
    (_, d_loss, dd_loss), (_, d_ppl, dd_ppl) = (row["held-out loss (nats/token)"],
                                                [v.strip() for v in row["held-out perplexity"]])
    d_loss, dd_loss = d_loss.strip(), dd_loss.strip()
    q1 = _flat(_by_id("08_q1"))
    assert f"{dd_loss}, perplexity {dd_ppl}, on the whole validation split: " \
           "`minillm/assets/MODEL_CARD.md`" in q1, (dd_loss, dd_ppl)
    assert f"{d_loss}, perplexity {d_ppl}, on the whole split" in q1, (d_loss, d_ppl)
    assert f"{float(dd_loss) - float(d_loss):.3f} nats worse on the whole split" in q1
    table, log_d, log_s = ns["table"], ns["log_d"], ns["log_s"]
    dist, scratch = table["pruned + distilled"], table["from scratch"]
    assert "equal on the lab's tokens" in q1 and f"{dist['loss']:.2f}" == f"{scratch['loss']:.2f}"
    spent = log_d["train_tokens_seen"] + log_d["calibration"]["tokens"]
    assert "for under a third of the tokens" in q1 and spent < log_s["train_tokens_seen"] / 3
    # FLOPs per training token: teacher forward 2 N_t, student forward + backward 6 N_s
    n_t, n_d, n_s = ns["target"].num_params(), ns["distilled"].num_params(), ns["draft"].num_params()
    assert f"about 2 × {n_t / 1e6:.1f}M FLOPs against the student's 6 × {n_d / 1e6:.1f}M" in q1
    per_token = (2 * n_t + 6 * n_d) / (6 * n_d)
    assert "costs about 4× a from-scratch step" in q1 and 3.5 <= per_token <= 4.5, per_token
    flops_d, flops_s = (2 * n_t + 6 * n_d) * log_d["train_tokens_seen"], 6 * n_s * log_s["train_tokens_seen"]
    assert "(≈ 6 × 10¹³ against ≈ 5 × 10¹³)" in q1 and (round(flops_d / 1e13), round(flops_s / 1e13)) == (6, 5)
    V = ns["target"].config.vocab_size
    assert f"$\\log_2 V = {V.bit_length() - 1}$ bits" in q1 and V == 2 ** (V.bit_length() - 1)
    assert f"every one of the {V:,} tokens" in q1


def test_the_texts_shapes_counts_and_grading_terms(lab08):
    """Figures the text states about the lab's own set-up: the calibration set, the neurons per
    layer, the shipped runs' steps and tokens, the plan task's grading, lab 05's c against the
    draft's parameter ratio, and the run-time bound the pipeline test enforces."""
    ns, _ = lab08
    from autograder.labs import lab08 as grading
    c, log_d, log_s = ns["target"].config, ns["log_d"], ns["log_s"]
    assert ns["imp"].tokens == 64 * 128 == 8192
    assert "64 random windows of 128 tokens from the training text (8,192 tokens;" in \
        _flat(_by_id("08_md_calib"))
    assert f"each layer's {c.hidden_dim:,} neuron scores" in _flat(_by_id("08_md_look"))
    compare = _flat(_by_id("08_md_compare"))
    assert f"the same recipe with {log_d['calibration']['samples']:,} calibration samples and " \
           f"{log_d['steps']} distillation steps" in compare
    dc = ns["draft"].config
    assert f"`draft`, a {dc.n_layers} × {dc.dim} model trained on " \
           f"{log_s['train_tokens_seen'] / 1e6:.1f}M tokens" in compare
    plan = _flat(_by_id("08_md_plan"))
    assert f"held-out loss ({grading.PLAN_TOKENS:,} tokens) must be at most " \
           f"{grading.PLAN_MARGIN:g} nats above" in plan
    assert "budget of 70 % of the target's parameters (visible)" in plan and \
        "int(0.7 * target.num_params())" in _by_id("08_plan_test")
    q3 = _flat(_by_id("08_q3"))
    assert f"({c.vocab_size:,} × {ns['distilled'].config.dim} or × {dc.dim})" in q3
    assert "about 1/9 for an 8B draft of a 70B target" in q3 and round(70 / 8) == 9
    pipeline = (REPO / "tests" / "test_pipeline.py").read_text()
    assert "MAX_SECONDS = 180 " in pipeline
    assert "in under three minutes on two CPU cores (`tests/test_pipeline.py` requires it)" in \
        _flat(_by_id("08_intro"))
    slides = _flat((REPO / "slides" / "08_pruning_distillation.md").read_text())
    from slides.figures import lab08_pruning
    assert (lab08_pruning.CALIB_SAMPLES, lab08_pruning.CALIB_LEN) == (16, 128)
    assert "on the shipped target, 16 calibration windows of 128 tokens" in slides
    assert f"within {grading.PLAN_MARGIN:g} nats of the course's plan" in slides


def test_part_5_cites_the_run_to_run_spread_results_records():
    section = RESULTS[RESULTS.index("## Speculative decoding with the distilled draft"):]
    section = section[:section.index("\n## ", 5)]
    runs = [[float(x) for x in re.findall(r"([\d.]+)×", line)] for line in section.splitlines()
            if line.startswith(("| speed-up vs the target alone, run 1", "| speed-up, run 2"))]
    assert len(runs) == 2 and len(runs[0]) == len(runs[1]) == 6, runs
    spread = max(abs(a - b) for a, b in zip(*runs))
    assert f"differ by up to {spread:.2f}× in `benchmarks/RESULTS.md`, \"Speculative decoding " \
           "with the distilled draft\"" in _flat(_by_id("08_md_spec"))


SHORT_RUN_CPU_S = 30                 # 08_md_run: "under half a minute on a core of its own"


@pytest.mark.slow
def test_the_short_run_prints_what_q1_quotes_and_fits_its_time(lab08):
    """Part 3's two short runs (seeded: the curves are exact on any machine), beside a competing
    load: their curves are the ones Q1 quotes, and the cell's CPU time (one thread: what it takes
    on a core of its own) is under half a minute."""
    import time

    from cpu_load import competing_cpu_load
    ns, _ = lab08
    with competing_cpu_load():
        t0, c0 = time.perf_counter(), time.process_time()
        printed = _run(ns, _starting("log_d = train_log(DISTILLED)"), "part 3 short run")
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(f"\n{printed}({cpu:.1f} s CPU, {wall:.1f} s wall)")
    steps, every = ns["STEPS"], ns["EVAL_EVERY"]
    d, n = ns["curves"]["distill"], ns["curves"]["next-token"]
    assert d[0] == n[0] and [s for s, _ in d] == list(range(0, steps + 1, every))
    q1 = _flat(_by_id("08_q1"))
    assert f"{steps} steps on the same {steps * 4 * 128 / 1e3:.0f}k tokens took the distilled copy " \
           f"from {d[0][1]:.2f} to {d[-1][1]:.2f} and the next-token copy to {n[-1][1]:.2f}" in q1, \
        (d, n)
    run = _flat(_by_id("08_md_run"))
    assert f"for {steps} steps on the **same batches** (4 windows of 128 tokens)" in run
    assert f"measured every {every} steps. This takes under half a minute on a core of its own." in run
    assert cpu < SHORT_RUN_CPU_S, cpu


def test_part_2_and_5_compare_c_with_the_recorded_ratios():
    """"lab 05 found the draft's c far above its parameter ratio": c = 0.24-0.27 (RESULTS.md)
    against the model card's 0.109x; `draft-distilled` has fewer layers than `draft`'s four."""
    assert "`draft` has 0.109× the target's parameters." in CARD
    assert "lab 05 found the draft's\n$c$ far above its parameter ratio" in _by_id("08_md_latency") \
        and 0.24 > 2 * 0.109
    assert "| layers × dim (heads / KV heads) | 6 × 384 (6 / 6) | 4 × 128 (4 / 4) | 2 × 192 (3 / 3) |" \
        in CARD
    assert "`draft-distilled` has fewer layers than `draft`'s four" in _flat(_by_id("08_md_spec"))
