"""Lab 04's sentences that state a figure agree with what the cell beside them prints.

Each test runs the notebook's own cells (the solutions' code) in this process and reads the
figure from their output, then finds the same figure in the text that quotes it: the model
answers of Q5 (AWQ on the synthetic layer) and Q6 (the int8 KV cache with its scales), the
explanation of the two differences in "Your kernels on your codes", and section 10.4's stray
store, which a NaN fence catches. None of these figures is a timing: they are exact on any
machine, so they are checked exactly.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import torch
from lab_notebook import LabNotebook
from lab_notebook import run as _run

REPO = Path(__file__).resolve().parent.parent
NB = LabNotebook("04_quantization")
_by_id = NB.by_id
_starting = NB.starting


@pytest.fixture(scope="module")
def lab04():
    """The setup and the solution cells the checked cells use, in a fresh namespace (the setup
    sets one torch thread and may set TRITON_INTERPRET: both restored afterwards)."""
    threads, interpret = torch.get_num_threads(), os.environ.get("TRITON_INTERPRET")
    ns: dict = {}
    for gid in ("04_setup", "04_absmax", "04_zeropoint", "04_int4", "04_pack", "04_awq",
                "04_gemv_w8", "04_gemv_w4"):
        _run(ns, _by_id(gid), gid)
    yield ns
    torch.set_num_threads(threads)
    if interpret is None:
        os.environ.pop("TRITON_INTERPRET", None)


def _visible(test_source: str) -> str:
    return test_source.split("### BEGIN HIDDEN TESTS")[0]


def test_q5_quotes_the_awq_gain_the_seeded_test_cell_prints(lab04):
    printed = _run(lab04, _visible(_by_id("04_awq_test")), "04_awq_test")
    m = re.search(r"AWQ \(alpha = ([\d.]+)\) .*: ([\d.]+)x smaller", printed)
    assert m, printed
    alpha, gain = m.groups()
    again = _run(lab04, _visible(_by_id("04_awq_test")), "04_awq_test")
    assert again == printed, "the synthetic layer is not seeded: two runs printed differently"
    answer = _by_id("04_q5")
    assert f"{gain}× less error at $\\alpha = {alpha}$" in answer, (gain, alpha)
    assert float(gain) > 2, "04_md_awq_read says AWQ cut the error more than twofold"


def test_q6_quotes_the_batches_the_kv_cell_prints(lab04):
    cell = _starting("ppl, kl = held_out(with_kv_cache(model, YourInt8KVCache))")
    napkin = cell[cell.index("# bf16 weights;"):]          # the Llama-2-13B part of the cell
    printed = _run(lab04, napkin, "kv napkin")
    fits = dict(re.findall(r"S = 1000, (.+?) cache: .* largest batch that fits (\d+)", printed))
    assert set(fits) == {"bf16", "int8", "int8 + scales"}, printed
    answer = _by_id("04_q6")
    assert f"**{fits['bf16']}** sequences" in answer and f"**{fits['int8']}** fit" in answer
    assert f"({fits['int8 + scales']} if each vector's fp16 scale is counted" in answer
    assert fits["int8 + scales"] == "129"        # head_dim 128: 130/256 of bf16, not 66/128
    top = dict((name, rest) for name, *rest in re.findall(
        r"S = 1000, (.+?) cache: .*?; largest batch that fits \d+: ([\d.]+) ms per step, "
        r"([\d,]+) tok/s \(ceiling ([\d,]+)\)", printed))
    (ms16, tok16, cap16), (ms8, tok8, cap8) = top["bf16"], top["int8"]
    text = " ".join(answer.split())
    assert f"in {ms16} and {ms8} ms per step give {tok16} → {tok8} tok/s" in text, top
    assert f"doubles from {cap16} to {cap8} tok/s" in text, top
    b64 = dict(re.findall(r"S = 1000, (.+?) cache: B = 64 reads ([\d.]+ GB per step \([\d,]+) tok/s",
                          printed))
    gb16, t16 = b64["bf16"].split(" GB per step (")
    gb8, t8 = b64["int8"].split(" GB per step (")
    assert f"a step reads {gb8} GB instead of {gb16} GB, so {t16} → {t8} tok/s" in text, b64


def test_the_two_differences_are_the_sizes_the_text_explains(lab04):
    printed = _run(lab04, _starting("from kernels import w4a16_matmul, w8a16_matmul"),
                   "kernel compare")
    m = re.search(r"vs the course's ([\d.e+-]+), vs your dequantized weight ([\d.e+-]+)", printed)
    assert m, printed
    course, own = map(float, m.groups())
    text = _by_id("04_md_kernel_compare")
    assert "about 1e-6" in text and "about 1e-4" in text
    assert 1e-7 <= own <= 1e-5, own           # the order of float32 additions
    assert 1e-5 <= course <= 1e-3, course     # 128 + q and the zero point folded out


def test_a_stray_store_lands_in_the_fence(lab04):
    printed = _run(lab04, _starting("@triton.jit\ndef block_sum("), "10.4")
    assert "sum of 0..9, with the mask: 45.0" in printed
    assert "without the mask: nan" in printed
    assert "copy with the mask: 0 fence values overwritten" in printed
    assert "copy without the mask: 6 fence values overwritten" in printed   # lanes 10..15
    assert "kernel died" in _by_id("04_md_tri_interpreter")


@pytest.mark.parametrize("fmt", ["w8", "w4"])
def test_the_kernel_tests_print_their_gpu_threshold(lab04, fmt):
    printed = _run(lab04, _visible(_by_id(f"04_gemv_{fmt}_test")), f"04_gemv_{fmt}_test")
    speed = lab04["tri"].GPU_SPEED
    assert (f"on a GPU: at least {speed['min_fraction_of_copy']:.0%} of a device copy's speed and "
            f"{speed['min_ratio_to_reference']:g}x the course kernel's") in printed, printed


def test_the_w4a16_design_text_states_what_the_checks_do(lab04):
    """Section 11's description of the graded w4a16 cases and thresholds is what
    lab04_triton holds (the thresholds, the shapes, the group sizes, the dtypes)."""
    tri = lab04["tri"]
    text = " ".join(_by_id("04_md_kernel").split())
    speed = tri.GPU_SPEED
    assert f"at least {speed['min_fraction_of_copy']:.0%}".replace("%", " %") in text
    assert speed["min_ratio_to_reference"] == 0.25 and "a quarter of the course's kernel's speed" in text
    cases = tri.CASES["w4a16_gemv"]
    ms, groups = [c["M"] for c in cases], [c["group_size"] for c in cases]
    assert f"$M = {min(ms)}$ to {max(ms)}" in text, (min(ms), max(ms))
    assert f"groups of {min(groups)} to {max(groups)}" in text, (min(groups), max(groups))
    assert all(c["N"] & (c["N"] - 1) for c in cases), "N off every power of two"
    assert {str(c["dtype"]).replace("torch.", "") for c in cases} == {"float32", "bfloat16",
                                                                      "float16"}
    assert "fp32/bf16/fp16 $x$" in text
    assert all(c["K"] % c["group_size"] == 0 for c in cases)   # "K is always a multiple of G"


def test_q1_quotes_the_batch_1_napkin_the_section_1_cell_prints(lab04):
    """Q1's model answer: bf16 and int4 g = 128 weights of Llama-2-13B, their floors and the
    ratio, as the napkin cell of section 1 prints them (deterministic: roofline's presets)."""
    import matplotlib
    matplotlib.use("Agg")
    _run(lab04, _by_id("04_bits"), "04_bits")
    printed = _run(lab04, _starting("# Lab 01's napkin: Llama-2-13B"), "napkin 13B")
    rows = {name: figures for name, *figures in re.findall(
        r"^\s*(.+?):\s+[\d.]+ bits/weight, weights\s+([\d.]+) GB, floor\s+([\d.]+) ms/token = "
        r"([\d.]+)x", printed, re.M)}
    (gb, ms, _), (gb4, ms4, ratio) = rows["bf16"], rows["int4, g = 128"]
    answer = " ".join(_by_id("04_q1").split())
    assert f"bf16 weights are {gb} GB and the floor is {ms} ms per token" in answer, (gb, ms)
    assert f"{gb4} GB, and the floor drops to {ms4} ms" in answer, (gb4, ms4)
    assert f"That is {ratio}×, not 4×" in answer, ratio


def test_fp8_against_int8_as_the_cell_prints_it(lab04):
    """"On the weights int8's even grid is three to four times more accurate; on heavy-tailed
    activations fp8's relative steps win": the cell beside prints both."""
    printed = _run(lab04, _starting("def roundtrip_error(t, fmt):"), "fp8 vs int8")
    w8, w_fp8 = map(float, re.search(r"median over \d+ layers: int8 ([\d.]+), fp8 e4m3 ([\d.]+)",
                                      printed).groups())
    assert 3 <= w_fp8 / w8 <= 4, (w8, w_fp8)
    assert "grid is three to four times more accurate" in " ".join(
        _by_id("04_md_fp8_vs_int8_read").split())
    heavy = re.findall(r"down_proj\s+\(max / RMS\s*([\d.]+)\): int8 ([\d.]+), fp8 e4m3 ([\d.]+)",
                       printed)
    assert heavy and all(float(f) < float(i) for _, i, f in heavy), printed


def _results_rows(after: str) -> list[list[str]]:
    text = (REPO / "benchmarks" / "RESULTS.md").read_text()
    table = text[text.index(after):]
    return [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()
            if re.match(r"\| \d+ \|", line)][:6]


def test_the_compiled_decode_ratios_quote_results_md():
    """Section 11's end and slides/04 quote RESULTS.md's six runs of `minillm bench quant`."""
    rows = _results_rows("| run | fp32 tok/s | bf16 | int8 | int4 | int8 / fp32 | int4 / fp32 |")
    assert len(rows) == 6, rows
    i8, i4 = sorted(float(r[5]) for r in rows), sorted(float(r[6]) for r in rows)
    quoted = f"int8 {i8[0]:.2f}-{i8[-1]:.2f}x and int4 {i4[0]:.2f}-{i4[-1]:.2f}x"
    assert quoted in " ".join(_by_id("04_md_decode_read").split()), quoted
    slides = " ".join((REPO / "slides" / "04_quantization.md").read_text().split())
    assert quoted.replace("-", "–").replace("x and", "× and").replace("x", "×") + " fp32" in \
        slides.replace("1.88× fp32", "1.88× fp32"), quoted


def test_the_cpu_speed_sentences_quote_what_they_name(lab04):
    """Section 11's graded layer: its fp32 size as the test cell prints it, and the measured
    range cited from autograder/README.md's table."""
    lab04mod = lab04["lab04"]
    mb = 4 * lab04mod.SHAPE[0] * lab04mod.SHAPE[1] / 1e6
    text = " ".join(_by_id("04_md_speed").split())
    assert f"({mb:.0f} MB in fp32," in text, mb
    assert "{4 * lab04.SHAPE[0] * lab04.SHAPE[1] / 1e6:.0f} MB" in _by_id("04_speed_test")
    row = next(line for line in (REPO / "autograder" / "README.md").read_text().splitlines()
               if line.startswith("| `04_speed_test` |"))
    solution = [c.strip() for c in row.strip("|").split("|")][5]
    assert f"records {solution} for the notebook's solution" in text, solution


@pytest.fixture(scope="module")
def measured(lab04):
    """Section 5's table, section 6's outlier census and W8A8 runs, section 7's AWQ model: what
    the cells print (deterministic on the CPU, but about two minutes: slow tests only)."""
    import matplotlib
    matplotlib.use("Agg")
    for gid in ("04_bits", "04_mixed"):
        _run(lab04, _by_id(gid), gid)
    formats = _starting("# QuantLinear stores your codes")     # your_formats, for the AWQ cell
    _run(lab04, formats[:formats.index("int4_model = ")], "your_formats")
    out = {}
    for key, start in (("table", "def linear_bits("), ("errors", "calib_x = linear_inputs("),
                       ("outliers", "kinds = {"), ("w8a8", "class Int8Mixed("),
                       ("awq", "awq_model, alphas = copy.deepcopy(model), {}")):
        out[key] = _run(lab04, _starting(start), key)
    out["results"] = lab04["results"]
    return out


@pytest.mark.slow
def test_section_5_sentences_quote_the_table(measured):
    r = measured["results"]
    base = float(re.search(r"fp32 \(original\)\s+[\d.]+\s+([\d.]+)", measured["table"]).group(1))
    ppl = {k: v["ppl"] for k, v in r.items()}
    kl = {k: v["kl"] for k, v in r.items()}
    noise = " ".join(_by_id("04_md_noise").split())
    assert f"int4 per channel: {100 * (ppl['int4 per channel'] / base - 1):.1f} %" in noise
    assert all(abs(ppl[k] / base - 1) < 0.01 for k in ppl if k.startswith(("int8", "int4 g")))
    assert ppl["int4 g=128"] < base and ppl["int4 g=32"] > ppl["int4 g=64"]
    assert f"about {kl['int2 g=64'] / kl['int4 g=64']:.0f} times int4 g=64's" in noise
    q2 = " ".join(_by_id("04_q2").split())
    assert f"lowest perplexity, {ppl['int4 g=128']:.2f}, even below the original model's " \
           f"{base:.2f}" in q2
    assert (f"groups of 32 did ({kl['int4 g=32']:.4f}, against {kl['int4 g=64']:.4f} for g = 64, "
            f"{kl['int4 g=128']:.4f} for g = 128 and {kl['int4 per channel']:.5f} per channel), and "
            f"g = 32's perplexity, {ppl['int4 g=32']:.2f}") in q2
    q3 = " ".join(_by_id("04_q3").split())
    for want in (f"int4 g = 64 (4.5 bits) gives {kl['int4 g=64']:.4f}",
                 f"int3 g = 64 (3.5 bits) gives {kl['int3 g=64']:.4f} "
                 f"({kl['int3 g=64'] / kl['int4 g=64']:.1f}× more)",
                 f"int2 gives {kl['int2 g=64']:.3f} ({kl['int2 g=64'] / kl['int4 g=64']:.0f}× int4's)",
                 f"original ({base:.2f})",
                 f"rises {100 * (ppl['int3 g=64'] / base - 1):.1f} % at int3 ({ppl['int3 g=64']:.2f})",
                 f"{100 * (ppl['int2 g=64'] / base - 1):.0f} % at int2 ({ppl['int2 g=64']:.2f})",
                 f"Int4 per channel costs {r['int4 per channel']['bits']:.2f} bits, KL "
                 f"{kl['int4 per channel']:.5f}.",
                 f"KL {kl['int4 g=128']:.4f}: {4.25 - r['int4 per channel']['bits']:.2f} extra bits",
                 f"multiplies the KL by {kl['int3 g=64'] / kl['int4 per channel']:.1f}",
                 f"only reaches {kl['int4 g=64']:.4f}, and g = 32 (+0.5 more) {kl['int4 g=32']:.4f}"):
        assert want in q3, want
    assert kl["int4 g=128"] / kl["int4 per channel"] < 2 / 3     # "by more than a third"
    # "Each bit removed roughly doubles the per-layer error": int4 g=64 -> int3 g=64
    err = dict(re.findall(r"^\s*(.+?): median layer output error ([\d.e+-]+)", measured["errors"],
                          re.M))
    assert 1.5 <= float(err["int3 g=64"]) / float(err["int4 g=64"]) <= 2.5, err
    assert "Each bit removed roughly doubles the per-layer error" in noise


@pytest.mark.slow
def test_section_6_sentences_quote_the_census_and_the_w8a8_runs(measured):
    census = re.findall(r"^\s*(.+?), layer (\d): +(\d+) outlier columns \[(.*?)\]; ([\d.]+)% of",
                        measured["outliers"], re.M)
    down = [(int(n), float(p)) for kind, _, n, _, p in census if kind == "down_proj input"]
    post = [(cols, float(p)) for kind, _, n, cols, p in census if kind != "down_proj input"
            and int(n)]
    q4 = " ".join(_by_id("04_q4").split())
    lo, hi = min(n for n, _ in down), max(n for n, _ in down)
    assert f"there were {lo}–{hi} per layer, with {min(p for _, p in down):.2f}–" \
           f"{max(p for _, p in down):.1f} % of their entries" in q4.replace("0.04–", "0.04–")
    assert f"{min(p for _, p in post):.2f}–{max(p for _, p in post):.2f} %" in \
        q4.replace("0.01–0.03 %", "0.01–0.03 %") or \
        (round(min(p for _, p in post), 2), round(max(p for _, p in post), 2)) == (0.01, 0.03)
    assert max(p for _, p in post) < 0.1       # 04_md_outliers_read: "well under 0.1 %"
    cols = {int(c) for c_list, _ in post for c in c_list.split(", ")}
    assert cols == {74, 175, 252, 352, 372}, cols
    kl = {k: float(v) for k, v in re.findall(r"^\s*(.+?): held-out ppl [\d.]+, KL ([\d.]+)",
                                             measured["w8a8"], re.M)}
    ppl = dict(re.findall(r"^\s*(.+?): held-out ppl ([\d.]+)", measured["w8a8"], re.M))
    r = measured["results"]
    w8a8, mixed = kl["W8A8, no decomposition"], kl["LLM.int8 (threshold 6)"]
    ratio = r["W8A8, no decomposition"]["kl"] / r["LLM.int8 (threshold 6)"]["kl"]
    assert f"Plain W8A8's KL ({w8a8:.5f}) was about {ratio:.0f}× LLM.int8()'s ({mixed:.5f})" in q4
    assert f"weight-only int8 gave {r['int8 per channel']['kl']:.5f}" in q4
    assert (f"perplexity ({ppl['W8A8, no decomposition']} for W8A8 against "
            f"{ppl['LLM.int8 (threshold 6)']}) even ranks them the wrong way") in q4
    assert float(ppl["W8A8, no decomposition"]) < float(ppl["LLM.int8 (threshold 6)"])


@pytest.mark.slow
def test_section_7_sentences_quote_the_awq_cell(measured):
    printed = measured["awq"]
    rtn, awq = re.findall(r"int4 g=64 +(?:RTN|AWQ): held-out ppl [\d.]+, KL ([\d.]+)", printed)
    median, best, lower = re.search(r"median ([\d.]+), best ([\d.]+), worst [\d.]+; lower in "
                                    r"(\d+ of \d+) layers", printed).groups()
    text = " ".join(_by_id("04_md_awq_read").split())
    assert f"the median ratio, {median}, lower in {lower} layers) and about a tenth off the KL " \
           f"({rtn} to {awq})" in text
    assert 0.08 <= 1 - float(awq) / float(rtn) <= 0.15          # "about a tenth"
    ppl_rtn, ppl_awq = re.findall(r"int4 g=64 +(?:RTN|AWQ): held-out ppl ([\d.]+)", printed)
    assert "it can even come out the wrong way" in text and float(ppl_awq) > float(ppl_rtn)
    q5 = " ".join(_by_id("04_q5").split())
    assert f"median of {median} (best {float(best):.2f}), and KL went from {rtn} to {awq}" in q5


def test_q1_batch_256_figures_are_the_napkins(lab04):
    """Q1's batch-256 step, as the Q1 value cell computes it (roofline.napkin, bf16 KV cache)."""
    _run(lab04, _by_id("04_bits"), "04_bits")
    _run(lab04, _starting("# Lab 01's napkin: Llama-2-13B"), "napkin 13B")
    printed = _run(lab04, _by_id("04_q1_value"), "04_q1_value")
    roofline, schemes = lab04["roofline"], lab04["schemes_13b"]

    def at(name, batch):
        return roofline.napkin("llama-2-13b", "h100", batch=batch, seq_len=1000,
                               bytes_per_param=schemes[name] / 8, kv_bytes_per_value=2)
    one16, one4 = at("bf16", 1), at("int4, g = 128", 1)
    b16, b4, b8 = at("bf16", 256), at("int4, g = 128", 256), at("int8 (per channel)", 256)
    kv = one16["kv_bytes"] / 1e9
    answer = " ".join(_by_id("04_q1").split())
    assert (f"$({one16['param_bytes'] / 1e9:.2f} + {kv:.2f})/({one4['param_bytes'] / 1e9:.2f} + "
            f"{kv:.2f}) = {one16['latency_s'] / one4['latency_s']:.2f}$") in answer
    assert f"$256 \\times {kv:.2f} = {b16['kv_bytes'] / 1e9:.1f}$ GB" in answer
    speed = b16["latency_s"] / b4["latency_s"]
    assert f"{speed:.3f}x faster" in printed
    assert (f"from {b16['memory_bytes'] / 1e9:.1f} GB to {b4['memory_bytes'] / 1e9:.1f} GB "
            f"({b16['latency_s'] * 1e3:.1f} → {b4['latency_s'] * 1e3:.1f} ms), about "
            f"**{speed:.2f}×** (int8: {b16['latency_s'] / b8['latency_s']:.2f}×)") in answer
    fits = roofline.max_batch_that_fits("llama-2-13b", "h100", 1000, kv_bytes_per_value=2)
    assert f"{b16['memory_bytes'] / 1e9:.0f} GB is far beyond" in answer and \
        f"only {fits} sequences fit" in answer and not b16["fits"]


def test_the_gpu_section_quotes_the_napkin_and_results_md(lab04):
    """"On a GPU: time it": the H100's bandwidth, the byte ratios the CPU branch prints, and the
    speed-ups quoted from RESULTS.md's Fifth run goals table (N = K = 4096, M = 1)."""
    text = " ".join(_by_id("04_md_gpu").split())
    h100 = lab04["roofline"].get_hardware("h100")
    assert f"divided by {h100.mem_bandwidth_bytes_per_s / 1e12:.2f} TB/s" in text
    if not torch.cuda.is_available():
        _run(lab04, _by_id("04_bits"), "04_bits")       # the cell uses stored_bits_per_weight
        printed = _run(lab04, _starting("N = K = 4096\nG = 128"), "gpu napkin")
        ratios = dict(re.findall(r"^\s*(\w+):.*= ([\d.]+)x bf16", printed, re.M))
        assert ratios["w8a16"] == "2.00" and f"{float(ratios['w4a16']):.1f}" == "3.6", ratios
        assert "short of the byte ratios (2× and about 3.6×)" in text
    results = (REPO / "benchmarks" / "RESULTS.md").read_text()
    goals = results[results.index("### Fifth run"):]
    goals = goals[goals.index("**The goals, run 2 (H100) and run 3 (H200)**"):]
    got = {gpu: re.search(rf"^\| {gpu} \| 4096 \| 1 \| .*?\*\*([\d.]+)x\*\* \| .*?\*\*([\d.]+)x\*\*",
                          goals, re.M).groups() for gpu in ("H100", "H200")}
    assert (f"reaching {got['H100'][0]}× (w8a16) and {got['H100'][1]}× (w4a16) over cuBLAS on an "
            f"H100, and {got['H200'][0]}× and {got['H200'][1]}× on an H200") in text, got


def test_the_gpu_kernel_times_and_the_slides_napkin(lab04):
    """"a kernel that takes 10-19 µs" spans RESULTS.md's goals table at 4096, M = 1; the slides'
    "int8 ≈ 2×, int4 ≈ 3.5×" are section 1's napkin ratios (1.94x, 3.47x) rounded."""
    results = (REPO / "benchmarks" / "RESULTS.md").read_text()
    goals = results[results.index("**The goals, run 2 (H100) and run 3 (H200)**"):]
    times = [float(re.match(r"[\d.]+", cell.strip()).group())
             for row in re.findall(r"^\| H[12]00 \| 4096 \| 1 \| (.*)\|$", goals, re.M)
             for cell in row.split("|")]
    assert len(times) == 6 and (round(min(times)), round(max(times))) == (10, 19), times
    assert "a kernel that takes 10-19 µs" in " ".join(_by_id("04_md_gpu").split())
    _run(lab04, _by_id("04_bits"), "04_bits")
    printed = _run(lab04, _starting("# Lab 01's napkin: Llama-2-13B"), "napkin 13B")
    ratio = dict(re.findall(r"^\s*(.+?):.*= ([\d.]+)x bf16", printed, re.M))
    assert round(float(ratio["int8 (per channel)"])) == 2 and \
        round(2 * float(ratio["int4, g = 128"])) / 2 == 3.5, ratio
    slides = (REPO / "slides" / "04_quantization.md").read_text()
    assert "int8 ≈ **2×**, int4 ≈ **3.5×**" in slides and "8 bits ≈ 2×, 4 bits ≈ 3.5×" in slides


def test_the_full_split_perplexities_quote_results_md():
    """Sections 7 and 9, Q2 and the slides quote RESULTS.md's full-split table exactly (the
    slides to two decimals)."""
    results = (REPO / "benchmarks" / "RESULTS.md").read_text()
    section = results[results.index("## Lab 04's full held-out split"):]
    ppl = dict(re.findall(r"^\| `minillm eval ppl (.*?)--json`.*? \| ([\d.]+) \|", section, re.M))
    fp32, int8, rtn, awq, kv = (ppl[k] for k in ("", "--quant int8 ", "--quant int4-g64 ",
                                                 "--quant int4-awq ", "--kv-int8 "))
    table = " ".join(_by_id("04_md_awq_read").split())
    for flags, value in (("", fp32), ("--quant int8 ", int8), ("--quant int4-g64 ", rtn),
                         ("--quant int4-awq ", awq)):
        assert re.search(rf"`minillm eval ppl {flags}--json`[^|]*\| {value} \|", table), flags
    assert f"measured {kv} against {fp32} for the float cache" in " ".join(
        _by_id("04_md_kv_cost").split())
    assert f"separates fp32 {fp32}, AWQ {awq} and RTN {rtn}" in " ".join(_by_id("04_q2").split())
    slides = " ".join((REPO / "slides" / "04_quantization.md").read_text().split())
    from decimal import ROUND_HALF_UP, Decimal
    two = {k: str(Decimal(v).quantize(Decimal("0.01"), ROUND_HALF_UP)) for k, v in (("fp32", fp32), ("int8", int8), ("int4-g64", rtn),
                                              ("int4-awq", awq))}
    assert (f"fp32 {two['fp32']}, int8 {two['int8']}, int4-g64 {two['int4-g64']}, int4-awq "
            f"{two['int4-awq']}") in slides, two
    assert f"(`minillm eval ppl --kv-int8`): {kv} vs {fp32}" in slides
