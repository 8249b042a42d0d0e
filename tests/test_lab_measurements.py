"""The labs' measured cells keep the claims their text makes, run after run, on a busy machine.

Each test executes a lab notebook's own measurement cells (lab 02: cached against naive on
60 tokens, the roof, TTFT against the prompt length, decode against the batch, the step-by-step
trace, the fits and the extrapolated speed-up; lab 05: the speculative bench, its plot and the
timed prompt lookup; lab 00: TTFT and the naive trace; lab 09: decode against the context, the
diffusion sampler's quality and latency) RUNS times in this process, with the solutions' code,
while a busy loop spins on one of the CPU cores
(killed by its pid at the end), and checks every run against the ranges the text states. The
figures of every run are printed (`pytest -s`), so a failure shows the whole spread. About two
minutes on 2 cores; benchmarks/RESULTS.md has a recorded run.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import matplotlib
import pytest
import torch
from cpu_load import competing_cpu_load

REPO = Path(__file__).resolve().parent.parent
RUNS = 2                    # x 4 labs: a few minutes of one worker in `make test`
pytestmark = pytest.mark.slow

# The ranges lab 02's text states (02_md_try, 02_md_ttft, 02_md_batch_read, 02_md_extrapolate,
# the model answers of Q2, Q3 and Q5).
TRY_SPEEDUP = (1.5, 4.0)           # cached / naive CPU time for 60 tokens after "JULIET:\n"
FIXED_IN_TOKENS = (15, 60)         # the TTFT fit's fixed cost a, in units of its per-token cost b
TTFT_SPREAD = 1.0                  # the 5 repeats of a length: (max - min) / median, at most
THROUGHPUT_GROWTH = (6.0, 13.0)    # tokens/s at B = 64 over B = 1 (8.7-9.0x recorded; 11.1x once in CI)
CACHED_STEP_FLAT = 2.0             # the trace's cached steps: 95th percentile / median, at most
CACHED_STEP_OUTLIER = 3.0          # the slowest one / median: "up to about 2x", 2.16x once
SPEEDUP_480 = (7.0, 20.0)          # predicted naive / cached for P = 32, n = 480 (8.6 once; 16.4-16.9 on AVX-512)
CHECK_AGREEMENT = (0.7, 1.3)       # predicted / measured speed-up of the check generation
DECODE_OVER_TTFT1 = (0.8, 1.5)     # Q2: the B = 1 step at context 256 / the 1-token TTFT (1.03-1.11)
STEP_B4_OVER_B1 = 2.0              # Q2, Q3: the step at B = 4 / at B = 1, at most (1.38-1.48 recorded)


def code_cells(lab: str) -> list[tuple[str, str]]:
    nb = json.loads((REPO / "labs" / lab / f"{lab}.ipynb").read_text())
    return [(c["metadata"].get("nbgrader", {}).get("grade_id", ""), "".join(c["source"]))
            for c in nb["cells"] if c["cell_type"] == "code"]


def pick(cells, start: str) -> str:
    found = [src for _, src in cells if src.startswith(start)]
    assert len(found) == 1, f"the lab has {len(found)} code cells starting with {start!r}"
    return found[0]


# the measured cells, in notebook order, by how they start
MEASURED = ['prompt_ids = tok.encode("JULIET:\\n")', "roof = phase_costs.cpu_roofline(",
            "def forward_counts(", "prompt_lengths = [",
            "CONTEXT = 256", "P_TRACE, N_TRACE = ", "# both phases in the same interleaved rounds"]


@pytest.fixture(scope="module")
def lab02_namespace():
    """Lab 02's setup, its solution's cache and loop, the size functions: what the measured
    cells need, run once (the setup sets one torch thread; restored afterwards)."""
    matplotlib.use("Agg")
    threads = torch.get_num_threads()
    cells = code_cells("02_kv_cache")
    ns: dict = {}
    for gid in ("02_setup", "02_cache", "02_generate_cached", "02_kv_bytes"):
        src = next(src for g, src in cells if g == gid)
        exec(compile(src, gid, "exec"), ns)
    ns["plt"].show = lambda *a, **k: ns["plt"].close("all")
    yield cells, ns
    torch.set_num_threads(threads)


def run_measured_cells(cells, ns) -> dict:
    for start in MEASURED:
        exec(compile(pick(cells, start), start, "exec"), ns)
    ttft, napkin = ns["ttft"], ns["ttft_napkin"]
    prefill, decode = ns["prefill_fit"], ns["decode_fit"]
    part6 = ns["phase_costs"].fit_prefill(dict(zip(ns["prompt_lengths"], ttft)),
                                          ns["pair_flops"] / ns["token_flops"])
    n480 = ns["pred"][list(ns["ns"]).index(480)]
    return {"try_speedup": (ns["t2"] - ns["t1"]) / (ns["t1"] - ns["t0"]),
            "ttft_fixed_ms": part6.fixed * 1e3, "ttft_per_token_us": part6.per_token * 1e6,
            "fixed_in_tokens": part6.fixed / part6.per_token,
            "ttft_over_napkin_min": float(min(ttft / napkin)),
            "prefill_gflops": ns["token_flops"] / part6.per_token / 1e9,
            "peak_gflops": ns["peak"] / 1e9,
            "step_over_napkin_min": float(min(ns["step_s"] / ns["step_napkin"])),
            "throughput_growth_1_64": float((64 / ns["step_s"][-1]) / (1 / ns["step_s"][0])),
            "step_growth_1_64": float(ns["step_s"][-1] / ns["step_s"][0]),
            "decode_over_ttft1": float(ns["step_s"][0] / ttft[0]),
            "step_b4_over_b1": float(ns["step_s"][ns["batches"].index(4)] / ns["step_s"][0]),
            "ttft_spread": ns["phase_costs"].spread(ns["ttft_times"]),
            "cached_step_median_ms": float(ns["np"].median(ns["cached_steps"][1:]) * 1e3),
            "cached_step_max_over_median": float(ns["cached_steps"][1:].max()
                                                 / ns["np"].median(ns["cached_steps"][1:])),
            "cached_step_p95_over_median": float(ns["np"].percentile(ns["cached_steps"][1:], 95)
                                                 / ns["np"].median(ns["cached_steps"][1:])),
            "decode_fixed_ms": decode.fixed * 1e3, "decode_per_key_us": decode.per_key * 1e6,
            "naive_fixed_ms": prefill.fixed * 1e3,
            "speedup_480": float(n480[0] / n480[1]),
            "check_predicted": float(ns["pn"] / ns["pc"]),
            "check_measured": float(ns["measured_check"])}


def test_lab02_measurements_hold_with_a_busy_core(lab02_namespace, capsys):
    cells, ns = lab02_namespace
    runs = []
    with competing_cpu_load():
        for _ in range(RUNS):
            t0 = time.perf_counter()
            figures = run_measured_cells(cells, ns)
            figures["wall_s"] = time.perf_counter() - t0
            runs.append(figures)
    with capsys.disabled():
        for i, r in enumerate(runs):
            print(f"\nrun {i}: " + ", ".join(f"{k} {v:.3g}" for k, v in r.items()))
    for i, r in enumerate(runs):
        where = f"run {i} of {RUNS}: {r}"
        # part 6: the TTFT fit has a positive fixed cost worth tens of tokens, and the napkin is a
        # lower bound (measured >= napkin; prefill below the measured peak)
        assert TRY_SPEEDUP[0] <= r["try_speedup"] <= TRY_SPEEDUP[1], where      # part 4
        assert r["ttft_fixed_ms"] > 0 and 100 <= r["ttft_per_token_us"] <= 900, where   # "a few hundred us"
        assert r["ttft_spread"] <= TTFT_SPREAD, where
        assert FIXED_IN_TOKENS[0] <= r["fixed_in_tokens"] <= FIXED_IN_TOKENS[1], where
        assert r["ttft_over_napkin_min"] >= 1 and r["prefill_gflops"] < r["peak_gflops"], where
        assert r["step_over_napkin_min"] >= 1, where
        assert THROUGHPUT_GROWTH[0] <= r["throughput_growth_1_64"] <= THROUGHPUT_GROWTH[1], where
        # the step's growth is 64 / the throughput's: "a step 5-11x longer"
        assert 64 / THROUGHPUT_GROWTH[1] <= r["step_growth_1_64"] <= 64 / THROUGHPUT_GROWTH[0], where
        assert r["cached_step_p95_over_median"] <= CACHED_STEP_FLAT, where
        # Q2 and Q3: a decode step costs about a 1-token prefill; B = 4 costs little more than B = 1
        assert DECODE_OVER_TTFT1[0] <= r["decode_over_ttft1"] <= DECODE_OVER_TTFT1[1], where
        assert r["step_b4_over_b1"] <= STEP_B4_OVER_B1, where
        assert r["cached_step_max_over_median"] <= CACHED_STEP_OUTLIER, where
        # part 7: positive costs, the prediction agrees with the check, and lands in the range
        assert r["decode_fixed_ms"] > 0 and r["decode_per_key_us"] >= 0, where
        lo, hi = CHECK_AGREEMENT
        assert lo <= r["check_predicted"] / r["check_measured"] <= hi, where
        assert SPEEDUP_480[0] <= r["speedup_480"] <= SPEEDUP_480[1], where


# --- lab 05 ---------------------------------------------------------------------------------------
# The ranges lab 05's text states (05_md_measure, 05_md_read).
BEST_SPEEDUP = (1.0, 2.1)          # the best k's measured speed-up on one CPU core
DRAFT_COST = (0.05, 0.2)           # c of the compiled int8 draft: "about 0.1"
V_LARGEST_K = 1.3                  # v at k = 6: "1.67-2.39"
V_GROWTH = 1.2                     # v at k = 6 over v at k = 1: "1.37-1.70 times"
PREDICTED_OVER_MEASURED = (0.95, 1.25)   # "within about 20 %, a little above it, at every k"
LOOKUP_SPEEDUP = (1.0, 2.0)        # prompt lookup, k = 6 (05_q4): "expect 1.0-2.0x" (1.10 once in make test)
# counted, not timed (greedy; the compiled int8 draft): Q2 quotes them, every run must agree
Q2_ALPHA = {1: 0.81, 2: 0.77, 3: 0.84, 4: 0.83, 6: 0.82}
Q2_TOKENS_PER_PASS = {1: 1.78, 2: 2.29, 3: 3.00, 4: 3.43, 6: 4.00}
Q2_FORMULA = {1: 1.78, 2: 2.37, 3: 3.11, 4: 3.45, 6: 3.86}


def lab_namespace(lab: str, grade_ids: tuple):
    """Run a lab's setup and solution cells (by grade id) in a fresh namespace with plots off;
    yields (code cells, namespace) and restores torch's thread count afterwards."""
    matplotlib.use("Agg")
    threads = torch.get_num_threads()
    cells = code_cells(lab)
    ns: dict = {}
    for gid in grade_ids:
        src = next(src for g, src in cells if g == gid)
        exec(compile(src, gid, "exec"), ns)
    ns["plt"].show = lambda *a, **k: ns["plt"].close("all")
    yield cells, ns
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def lab05_namespace():
    yield from lab_namespace("05_speculative", ("05_setup", "05_formula"))


def test_lab05_measurements_hold_with_a_busy_core(lab05_namespace):
    cells, ns = lab05_namespace
    measure, plot = pick(cells, "import json\nimport shlex\nimport subprocess"), pick(cells, "ks = np.array(")
    exec(compile(pick(cells, "class PromptLookupDraft:").split("\nrep = ")[0], "05 lookup", "exec"), ns)
    exec(compile(next(src for g, src in cells if g == "05_lookup"), "05_lookup", "exec"), ns)
    rep = ns["repetitive_prompt"](ns["tok"])
    runs = []
    with competing_cpu_load():
        for _ in range(RUNS):
            exec(compile(measure, "05 measure", "exec"), ns)
            exec(compile(plot, "05 plot", "exec"), ns)
            # part 8's timed prompt lookup, as the cell calls it
            lookup = ns["bench_prompt_lookup"](ns["target"], rep, k=6, new_tokens=96, repeats=2,
                                               cpu_time=True, lookup=ns["prompt_lookup"])
            runs.append((ns["bench"], ns["rows"], lookup))
    for i, (bench, rows, lookup) in enumerate(runs):
        best = max(rows, key=lambda r: r["speedup"])
        print(f"\nlab 05 run {i}: c {bench['c']:.2f}, " + ", ".join(
            f"k={r['k']}: v {r['verify_cost']:.2f} measured {r['speedup']:.2f}x predicted "
            f"{r['predicted_speedup']:.2f}x" for r in rows)
            + f"; prompt lookup {lookup['speedup']:.2f}x (v {lookup['verify_cost']:.2f})")
        where = f"run {i} of {RUNS}: c {bench['c']}, rows {rows}, lookup {lookup}"
        assert {r["k"]: round(r["alpha"], 2) for r in rows} == Q2_ALPHA, where
        assert {r["k"]: round(r["tokens_per_step"], 2) for r in rows} == Q2_TOKENS_PER_PASS, where
        assert {r["k"]: round(r["predicted_tokens_per_step"], 2) for r in rows} == Q2_FORMULA, where
        assert LOOKUP_SPEEDUP[0] <= lookup["speedup"] <= LOOKUP_SPEEDUP[1], where
        assert all(PREDICTED_OVER_MEASURED[0] <= r["predicted_speedup"] / r["speedup"]
                   <= PREDICTED_OVER_MEASURED[1] for r in rows), where
        assert bench["exact_greedy"] and bench["clock"] == "cpu", where
        assert DRAFT_COST[0] <= bench["c"] <= DRAFT_COST[1], where
        assert bench["draft_engine"] == "compiled-int8", where
        # checking is not free: a pass over 7 tokens costs well over a step and clearly more than a
        # pass over 2 (a neighbour that slows the plain steps moves every v down; the growth stays)
        v = {r["k"]: r["verify_cost"] for r in rows}
        assert v[max(v)] > V_LARGEST_K and v[max(v)] > V_GROWTH * v[min(v)], where
        assert all(abs(r["tokens_per_step"] - r["predicted_tokens_per_step"]) < 0.3 for r in rows)
        assert BEST_SPEEDUP[0] <= best["speedup"] <= BEST_SPEEDUP[1], where
        # the formula with the measured c and v beats the lecture's v = 1 at every k
        lecture = ns["expected_speedup"]
        for r in rows:
            with_v = abs(r["predicted_speedup"] - r["speedup"])
            v_is_1 = abs(lecture(r["alpha"], r["k"], bench["c"]) - r["speedup"])
            assert with_v < v_is_1, where


# --- lab 00 ---------------------------------------------------------------------------------------
# The ranges lab 00's text states (00_md_measure, 00_md_total, 00_q1, 00_q3), and that 00_q3 quotes
# TTFT_OFF_THE_LINE (tests/test_lab00_claims.py reads it).
FIXED_IN_TOKENS_00 = (10, 99)      # "a is worth tens of tokens of b"
TOTAL_VS_PREDICTED = (0.7, 1.3)    # the naive generation's total against sum TTFT(P + t): "30 %"
TOTAL_VS_FIRST = 2.0               # total / (n x the first step): "more than twice"
THROUGHPUT_128_VS_16 = 0.7         # tokens/s after 128 over after 16: "under 70 %"
TTFT_OFF_THE_LINE = 0.3            # every TTFT point within 30 % of the fitted line (00_q3)
RUNS_00 = 1                        # one run (~10 s beside the busy loop), as lab 01's sweep: the
# ranges were set over 3 + 1 runs (benchmarks/RESULTS.md); the second run paid for lab 00's
# sampling-recipe task in `make test`


@pytest.fixture(scope="module")
def lab00_namespace():
    yield from lab_namespace("00_sampling", ("00_setup", "00_apply_temperature", "00_top_k_filter",
                                             "00_top_p_filter", "00_sample_next", "00_generate"))


def test_lab00_measurements_hold_with_a_busy_core(lab00_namespace):
    cells, ns = lab00_namespace
    ttft_cell, trace_cell = pick(cells, "lengths = [1, 16, 32"), pick(cells, "P, n = 8, 128")
    runs = []
    with competing_cpu_load():
        for _ in range(RUNS_00):
            exec(compile(ttft_cell, "00 ttft", "exec"), ns)
            exec(compile(trace_cell, "00 trace", "exec"), ns)
            runs.append({"a_ms": ns["a"] * 1e3, "b_us": ns["b"] * 1e6, "a_in_b": ns["a"] / ns["b"],
                         "total_s": float(ns["cum_s"][-1]), "predicted_s": float(ns["predicted"][-1]),
                         "first_ms": ns["step_s"][0] * 1e3, "last_ms": ns["step_s"][-1] * 1e3,
                         "total_over_first": float(ns["cum_s"][-1] / (len(ns["step_s"]) * ns["step_s"][0])),
                         "throughput_128_over_16": float((128 / ns["cum_s"][127]) / (16 / ns["cum_s"][15])),
                         "off_the_line": max(abs(t - (ns["a"] + ns["b"] * S)) / t
                                             for S, t in zip(ns["lengths"], ns["ttft"]))})
    for i, r in enumerate(runs):
        print(f"\nlab 00 run {i}: " + ", ".join(f"{k} {v:.3g}" for k, v in r.items()))
        where = f"run {i} of {RUNS_00}: {r}"
        assert r["a_ms"] > 0 and r["b_us"] > 0, where
        assert FIXED_IN_TOKENS_00[0] <= r["a_in_b"] <= FIXED_IN_TOKENS_00[1], where
        lo, hi = TOTAL_VS_PREDICTED
        assert lo <= r["total_s"] / r["predicted_s"] <= hi, where
        assert r["last_ms"] > 2 * r["first_ms"], where          # the steps grow with the length
        assert r["total_over_first"] > TOTAL_VS_FIRST, where
        assert r["throughput_128_over_16"] < THROUGHPUT_128_VS_16, where
        assert r["off_the_line"] <= TTFT_OFF_THE_LINE, where


# --- lab 09 ---------------------------------------------------------------------------------------
# The ranges lab 09's text states (09_md_measure_read, 09_md_diffusion_read).
TARGET_GROWTH = (1.6, 4.0)         # the target's decode step, S = 8192 over S = 256: "1.9-3.1x"
# (2.6-3.1x where the L3 holds the weights, 1.87-2.30x on a 32 MiB L3: benchmarks/RESULTS.md)
HYBRID_GROWTH = (0.9, 2.0)         # the hybrid's: "1.1-1.3x (1.7x once with both cores busy)"
JUDGE_MEDIANS = {64: 262, 32: 315, 16: 519, 8: 1676, 4: 3891}   # counted, not timed: seeded samples


@pytest.fixture(scope="module")
def lab09_namespace():
    yield from lab_namespace("09_beyond_attention", ("09_setup", "09_step", "09_chunked", "09_counts",
                                                     "09_diffusion_sample"))


def test_lab09_measurements_hold_with_a_busy_core(lab09_namespace):
    cells, ns = lab09_namespace
    decode = pick(cells, "CONTEXTS = [256, 1024")
    quality_cell = pick(cells, "PROMPTS = [")
    latency_cell = pick(cells, "# latency of 64 tokens")
    runs = []
    with competing_cpu_load():
        for i in range(RUNS):
            exec(compile(decode, "09 decode", "exec"), ns)
            run = {"growth": dict(ns["growth"])}
            if i == 0:            # sampled with fixed seeds: the judge's figures do not vary
                exec(compile(quality_cell, "09 diffusion quality", "exec"), ns)
                run["quality"] = {s: ns["median"](q) for s, q in ns["quality"].items()}
                run["target_quality"] = sorted(ns["ar"])
            if i < 2:
                exec(compile(latency_cell, "09 diffusion latency", "exec"), ns)
                run["latency"] = dict(ns["latency"])
            runs.append(run)
    for i, r in enumerate(runs):
        print(f"\nlab 09 run {i}: {r}")
        where = f"run {i} of {RUNS}: {r}"
        g = r["growth"]
        assert TARGET_GROWTH[0] <= g["target"] <= TARGET_GROWTH[1], where
        assert HYBRID_GROWTH[0] <= g["hybrid"] <= HYBRID_GROWTH[1], where
        assert g["hybrid"] < g["target"], where
        if "latency" in r:
            lat = r["latency"]
            ar = lat["target, autoregressive"]
            # "slower than the target at 1 and 2 tokens per pass, no faster at 4, faster at 8, 16"
            # (at 4: 1.5x the target's time on an idle core, 0.99x beside the other test worker)
            assert max(lat["diffusion, 8 passes"], lat["diffusion, 4 passes"]) < ar, where
            assert ar < min(lat["diffusion, 64 passes"], lat["diffusion, 32 passes"]), where
            assert 0.8 < lat["diffusion, 16 passes"] / ar < 2.0, where
        if "quality" in r:
            q = r["quality"]          # judge perplexity rises with the tokens per pass
            assert q[64] < q[16] < q[4], where
            # seeded: the medians and the target's range 09_md_diffusion_read quotes, exactly
            assert {s: round(v) for s, v in q.items()} == JUDGE_MEDIANS, where
            assert [round(r["target_quality"][0]), round(r["target_quality"][-1])] == [6, 27], where
