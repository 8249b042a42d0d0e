"""Lab 08's sentences that state a figure agree with what the cells beside them print.

The notebook's own cells run in this process with the solutions' code: the setup (the three
checkpoints' shapes), the scores, the width-against-depth losses of part 2 and the table of
part 4 (held-out loss, KL, 1 - TV and greedy acceptance: no timing, so exact on any machine).
Their figures are matched against the text and the model answers that quote them; the
arithmetic of part 2 and the figures quoted from benchmarks/RESULTS.md and the checkpoints'
train_log.json are checked against their sources.
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
    for gid in ("08_head_scores", "08_other_scores", "08_calib", "08_scores", "08_prune"):
        _run(ns, _by_id(gid), gid)
    ns["plt"].show = lambda *a, **k: ns["plt"].close("all")
    _run(ns, "drop_loss = pruning.layer_drop_loss(target, CALIB[:2])", "drop_loss")
    printed["width_depth"] = _run(ns, _starting("depth_keep = pruning.choose("), "part 2")
    run_cell = _starting("log_d = train_log(DISTILLED)")
    _run(ns, run_cell[:run_cell.index("STEPS, EVAL_EVERY")], "pruned_only")   # no short run
    ns["log_s"] = ns["train_log"]("draft")
    printed["table"] = _run(ns, _starting("PROMPTS = ["), "part 4")
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
