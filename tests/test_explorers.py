"""The explorers (minillm/explorers/: napkin, speculative, serving) and the measured-roofline
helpers of roofline.py.

The explorer must show exactly what `minillm.roofline.napkin` says for the model, GPU and
workload its controls describe, redraw when a control moves, and turn impossible shapes into a
message instead of an exception."""
from __future__ import annotations

import dataclasses
import math
import re
import time

import pytest

pytest.importorskip("ipywidgets")

from minillm import roofline as rf  # noqa: E402
from minillm.explorers import (  # noqa: E402
    ERROR_CLASS,
    PLOT_CLASS,
    READOUT_CLASS,
    NapkinExplorer,
    napkin_explorer,
    plot_batches,
)


@pytest.fixture(scope="module")
def ex() -> NapkinExplorer:
    return napkin_explorer()


def reset(ex: NapkinExplorer):
    ex.set(model="llama-2-7b", gpu="a100")                       # force a resync of all fields
    ex.set(model="llama-2-13b", gpu="h100", batch=64, seq_len=1000, bytes_per_param=2.0, gpus=1)
    assert ex.state["error"] is None


def expected_row(ex, **over):
    c = ex.controls
    args = dict(model=c["model"].value, hw=c["gpu"].value, batch=c["batch"].value,
                seq_len=c["seq_len"].value, kv_heads=c["n_kv_heads"].value,
                bytes_per_param=c["bytes_per_param"].value) | over
    return rf.napkin(**args)


def plotted_png(ex) -> str:
    (out,) = ex.plot.outputs
    return out["data"]["image/png"]


# ---- structure: what a browser test relies on ------------------------------------------------

def test_widget_structure_and_stable_names(ex):
    import ipywidgets as widgets
    assert isinstance(ex, widgets.VBox)
    assert READOUT_CLASS in ex.readout._dom_classes and isinstance(ex.readout, widgets.HTML)
    assert PLOT_CLASS in ex.plot._dom_classes and isinstance(ex.plot, widgets.Output)
    descriptions = {name: w.description for name, w in ex.controls.items()}
    assert descriptions["batch"] == "batch B" and descriptions["seq_len"] == "seq len S"
    assert descriptions["n_kv_heads"] == "K (KV heads)" and descriptions["memory_gb"] == "HBM (GB)"
    assert len(set(descriptions.values())) == len(descriptions)          # unique labels
    assert set(ex.controls["model"].options) >= {"llama-2-13b", "llama-2-7b", "custom"}
    assert set(ex.controls["gpu"].options) >= {"h100", "a100", "h200", "custom"}


def test_starts_on_the_lecture_row(ex):
    reset(ex)
    row = ex.state["row"]
    assert row == expected_row(ex) | {"model": "llama-2-13b"}
    assert row["latency_s"] == pytest.approx(23.42e-3, rel=1e-3)           # the lecture's B = 64
    assert "23.42 ms" in ex.readout.value and "2732.6 tok/s" in ex.readout.value
    assert "fits" in ex.readout.value and "NOT" not in ex.readout.value
    assert "B = 65" in ex.readout.value                                      # largest batch


# ---- readouts follow the controls exactly ------------------------------------------------------

@pytest.mark.parametrize("control, value", [
    ("batch", 1), ("batch", 256), ("seq_len", 4096), ("n_kv_heads", 8), ("bytes_per_param", 1.0),
    ("gpu", "a100"), ("gpu", "h200"), ("model", "llama-3-8b"), ("model", "minillm-target"),
])
def test_changing_a_control_changes_readout_like_napkin(ex, control, value):
    reset(ex)
    before_html, before_png = ex.readout.value, plotted_png(ex)
    ex.controls[control].value = value
    row = ex.state["row"]
    expected = expected_row(ex)
    for key in ("params", "param_bytes", "kv_bytes_per_seq", "memory_bytes", "latency_s",
                "throughput_tok_s", "fits", "kv_heads"):
        assert row[key] == expected[key], key
    assert ex.readout.value != before_html
    assert plotted_png(ex) != before_png
    assert f"{row['latency_s'] * 1e3:.2f} ms" in ex.readout.value
    assert f"{row['throughput_tok_s']:.1f} tok/s" in ex.readout.value
    assert f"{row['memory_bytes'] / 1e9:.1f} GB" in ex.readout.value
    assert ("does NOT fit" in ex.readout.value) == (not row["fits"])


def test_lecture_batch_256_does_not_fit_and_gqa_fixes_it(ex):
    reset(ex)
    ex.controls["batch"].value = 256
    assert not ex.state["row"]["fits"] and "does NOT fit" in ex.readout.value
    assert ex.state["row"]["memory_bytes"] == pytest.approx(235.7e9, rel=1e-3)
    ex.controls["n_kv_heads"].value = 8                                      # the GQA what-if
    assert ex.controls["model"].value == "llama-2-13b"     # K is a what-if, not a new model
    assert ex.state["row"]["fits"] and ex.state["max_batch"] == 349
    assert ex.state["row"]["memory_bytes"] == pytest.approx(64.6e9, rel=1e-3)


def test_plotted_curve_is_the_roofline_curve(ex):
    reset(ex)
    ex.controls["batch"].value = 100
    plot = ex.state["plot"]
    assert plot["batch"] == plot_batches(65, 100)
    assert 1 in plot["batch"] and 100 in plot["batch"] and 65 in plot["batch"]
    for b, lat_ms, thr, fits in zip(plot["batch"], plot["latency_ms"], plot["throughput_tok_s"],
                                    plot["fits"]):
        r = rf.napkin("llama-2-13b", "h100", b, 1000)
        assert lat_ms == pytest.approx(1e3 * r["latency_s"], rel=1e-12)
        assert thr == pytest.approx(r["throughput_tok_s"], rel=1e-12)
        assert fits == r["fits"] == (b <= 65)
    assert plot["current"]["batch"] == 100
    assert plot["current"]["latency_ms"] == pytest.approx(1e3 * ex.state["row"]["latency_s"])
    assert plot["max_throughput_tok_s"] == pytest.approx(3.35e12 / (1000 * 40 * 128 * 40 * 4))


def test_capacity_marker_moves_with_gpu_memory(ex):
    reset(ex)
    cap80 = ex.state["plot"]["capacity"]
    assert cap80["batch"] == 65
    assert cap80["latency_ms"] == pytest.approx(1e3 * rf.napkin("llama-2-13b", "h100", 65, 1000)["latency_s"])
    ex.controls["memory_gb"].value = 160
    assert ex.controls["gpu"].value == "custom"                  # edited figures: a custom GPU
    cap160 = ex.state["plot"]["capacity"]
    bigger = dataclasses.replace(rf.HARDWARE["h100"], name="custom", memory_bytes=160e9)
    assert cap160["batch"] == rf.max_batch_that_fits("llama-2-13b", bigger, 1000) > cap80["batch"]
    assert cap160["latency_ms"] > cap80["latency_ms"]
    assert ex.state["row"]["fits"] and f"B = {cap160['batch']}" in ex.readout.value
    ex.controls["gpu"].value = "h200"                           # preset refills the figures
    assert ex.controls["memory_gb"].value == pytest.approx(141)
    assert ex.state["plot"]["capacity"]["batch"] == rf.max_batch_that_fits("llama-2-13b", "h200", 1000)


def test_custom_model_dims(ex):
    reset(ex)
    ex.controls["dim"].value = 4096
    assert ex.controls["model"].value == "custom"
    cfg = dataclasses.replace(rf.get_model("llama-2-13b"), dim=4096)
    assert ex.state["row"]["params"] == rf.lecture_num_params(cfg)
    assert ex.state["row"]["latency_s"] == rf.napkin(cfg, "h100", 64, 1000)["latency_s"]
    # typing the preset's value back is still the "custom" entry, with the same numbers
    ex.controls["dim"].value = 5120
    assert ex.state["row"]["latency_s"] == rf.napkin("llama-2-13b", "h100", 64, 1000)["latency_s"]


def test_custom_gpu_figures(ex):
    reset(ex)
    c = ex.controls
    c["bandwidth_tb_s"].value, c["memory_gb"].value, c["peak_tflops"].value = 1.0, 48.0, 200.0
    hw = rf.Hardware("custom", 200e12, 1e12, 48e9)
    assert ex.state["row"]["latency_s"] == pytest.approx(rf.napkin("llama-2-13b", hw, 64, 1000)["latency_s"])
    assert ex.state["row"]["accelerator_intensity"] == pytest.approx(200)
    assert "200 FLOPs/byte" in ex.readout.value


# ---- invalid combinations: a message, not a crash -------------------------------------------

@pytest.mark.parametrize("control, value, needle", [
    ("n_kv_heads", 7, "does not divide N = 40"),
    ("n_kv_heads", 0, "must be a positive integer"),
    ("head_dim", 127, "head_dim"),
    ("bandwidth_tb_s", 0.0, "mem_bandwidth"),
    ("memory_gb", -1.0, "memory_bytes"),
])
def test_invalid_combinations_show_a_message(ex, control, value, needle):
    reset(ex)
    ex.controls[control].value = value                     # must not raise
    assert ex.state["error"] and needle in ex.state["error"]
    assert ERROR_CLASS in ex.readout.value and "Cannot compute" in ex.readout.value
    assert needle.replace("=", "=") in ex.readout.value or needle in ex.state["error"]
    assert ex.plot.outputs == ()
    reset(ex)                                              # and it recovers
    assert ex.state["error"] is None and len(ex.plot.outputs) == 1


def test_kv_heads_message_lists_valid_choices(ex):
    reset(ex)
    ex.controls["n_kv_heads"].value = 7
    assert "[1, 2, 4, 5, 8, 10, 20, 40]" in ex.readout.value


def test_weights_that_do_not_fit_have_no_capacity_marker(ex):
    reset(ex)
    ex.controls["memory_gb"].value = 10.0                  # 26 GB of bf16 weights
    assert ex.state["max_batch"] == 0 and ex.state["plot"]["capacity"] is None
    assert "weights alone do not fit" in ex.readout.value
    assert not any(ex.state["plot"]["fits"])


def test_constructor_arguments():
    e = napkin_explorer(model="llama-3-8b", gpu="a100", batch=8, seq_len=2048, kv_heads=4,
                        bytes_per_param=1.0)
    r = e.state["row"]
    assert r == rf.napkin("llama-3-8b", "a100", 8, 2048, kv_heads=4, bytes_per_param=1.0) | {"model": "llama-3-8b"}


def test_set_redraws_once_and_rejects_unknown_names(ex):
    reset(ex)
    ex.set(gpu="a100", batch=256, n_kv_heads=8, seq_len=2000)
    assert ex.state["row"] == rf.napkin("llama-2-13b", "a100", 256, 2000, kv_heads=8) | {"model": "llama-2-13b"}
    with pytest.raises(ValueError, match="unknown controls"):
        ex.set(batchsize=3)


def test_plot_batches():
    assert plot_batches(65, 64) == [1, 2, 4, 8, 16, 32, 64, 65, 128, 256]
    assert plot_batches(0, 1) == [1, 2, 4, 8]
    assert plot_batches(10_000, 3) == [1, 2, 3] + [2 ** i for i in range(2, 13)] + [10_000]


# ---- measured-roofline helpers (roofline.py section 5, used by lab 01) ------------------------

def test_matmul_counts_match_the_symbolic_counts():
    flops, nbytes = rf.matmul_flops_and_bytes()
    for b, d, f in [(1, 2048, 2048), (64, 5120, 13824), (3, 7, 5)]:
        shape = {rf.B: b, rf.D: d, rf.F: f}
        assert rf.matmul_counts(b, d, f) == (int(flops.subs(shape)), int(nbytes.subs(shape)))
        assert rf.matmul_counts(b, d, f, bytes_per_value=4)[1] == 2 * int(nbytes.subs(shape))
    with pytest.raises(ValueError, match="batch"):
        rf.matmul_counts(0, 4, 4)


def test_empirical_roofline_is_an_upper_envelope():
    peak, bw = 80e9, 16e9
    intensity = [0.5, 1, 2, 4, 8, 16, 32, 64]
    achieved = [0.9 * rf.roofline_flops_per_s(x, peak, bw) for x in intensity]
    achieved[3] = rf.roofline_flops_per_s(4, peak, bw)      # one point on the slanted roof
    fit = rf.empirical_roofline(intensity, achieved)
    assert fit["bandwidth_bytes_per_s"] == pytest.approx(bw)
    assert fit["peak_flops_per_s"] == pytest.approx(0.9 * peak)
    assert fit["ridge_intensity"] == pytest.approx(0.9 * peak / bw)
    for x, y in zip(intensity, achieved):
        roof = rf.roofline_flops_per_s(x, fit["peak_flops_per_s"], fit["bandwidth_bytes_per_s"])
        assert y <= roof * (1 + 1e-12)
    assert math.isclose(rf.roofline_flops_per_s(1000, 1e12, 1e9), 1e12)
    with pytest.raises(ValueError):
        rf.empirical_roofline([1, 2], [1e9])
    with pytest.raises(ValueError):
        rf.empirical_roofline([0, 2], [1e9, 2e9])


def test_readout_numbers_are_plain_text_parsable(ex):
    reset(ex)
    text = re.sub(r"<[^>]+>", "", ex.readout.value)
    assert re.search(r"latency: 23\.42 ms per token", text)
    assert re.search(r"memory: 78\.5 GB of 80 GB", text)


# ---- lab 05: the speculative-sampling explorer ------------------------------------------------

def test_speculative_explorer_follows_the_formulas():
    from minillm import speculative as spec
    from minillm.explorers import SPEC_PLOT_CLASS, SPEC_READOUT_CLASS, speculative_explorer
    ex = speculative_explorer(alpha=0.7, k=4, c=0.1)
    assert SPEC_READOUT_CLASS in ex.readout._dom_classes and SPEC_PLOT_CLASS in ex.plot._dom_classes
    s = ex.state
    assert s["tokens_per_step"] == pytest.approx((1 - 0.7 ** 5) / 0.3)
    assert s["speedup"] == pytest.approx(s["tokens_per_step"] / (4 * 0.1 + 1))
    assert s["curves"]["k"][0] == 1 and len(s["curves"]["k"]) == ex.controls["k"].max
    assert f"{s['speedup']:.2f}&times;" in ex.readout.value
    before_png, before_html = ex.state["png"], ex.readout.value
    for name, value in [("alpha", 0.9), ("k", 6), ("c", 0.3), ("beta", 0.25)]:
        ex.controls[name].value = value                        # each slider redraws
        assert ex.state["png"] != before_png and ex.readout.value != before_html
        before_png, before_html = ex.state["png"], ex.readout.value
    s = ex.state
    assert s["speedup"] == pytest.approx(spec.expected_speedup(0.9, 6, 0.3, 1 + 0.25 * 6))
    best = max(range(1, ex.controls["k"].max + 1),
               key=lambda k: spec.expected_speedup(0.9, k, 0.3, 1 + 0.25 * k))
    assert s["best_k"] == best and f"<b>{best}</b>" in ex.readout.value


def test_speculative_explorer_set_and_measured_points():
    from minillm.explorers import speculative_explorer
    ex = speculative_explorer(measured={"k": 3, "tokens_per_step": 2.3, "speedup": 1.1})
    assert ex.state["measured"] == [{"k": 3, "tokens_per_step": 2.3, "speedup": 1.1}]
    st = ex.set(alpha=0.0, k=2, c=0.0, beta=0.0)
    assert st["tokens_per_step"] == 1.0 and st["speedup"] == 1.0 and st["best_k"] == 1
    with pytest.raises(ValueError, match="unknown controls"):
        ex.set(gamma=1)
    with pytest.raises(ValueError, match="measured point"):
        speculative_explorer(measured=[{"speedup": 2.0}])
    big = speculative_explorer(k=3, measured=[{"k": 20, "speedup": 1.0}])
    assert big.controls["k"].max == 20                         # the slider reaches every point


def test_speculative_explorer_draws_the_formulas_it_is_given():
    """Lab 05 hands the explorer the student's formulas (the course's are withheld there); what
    they raise or return instead of a number is shown, not raised."""
    from minillm.explorers import speculative_explorer
    from minillm.explorers.speculative import SPEC_ERROR_CLASS
    mine = {"expected_tokens_per_step": lambda alpha, k: 10.0 * k,
            "expected_speedup": lambda alpha, k, c, v: k / v}
    ex = speculative_explorer(alpha=0.5, k=2, c=0.1, max_k=4, formulas=mine)
    assert ex.state["curves"]["tokens_per_step"] == [10.0, 20.0, 30.0, 40.0]
    assert ex.state["tokens_per_step"] == 20.0 and ex.state["speedup"] == 2.0   # v = 1 + 0 k
    assert ex.set(beta=1.0)["speedup"] == pytest.approx(2 / 3) and ex.state["error"] is None

    def unwritten(*args):
        raise NotImplementedError()

    ex = speculative_explorer(formulas=mine | {"expected_speedup": unwritten})
    assert ex.state["error"] == "your expected_speedup raised NotImplementedError: "
    assert SPEC_ERROR_CLASS in ex.readout.value and ex.plot.outputs == ()
    assert ex.set(alpha=0.8)["error"]                       # a slider moved: shown again
    ex = speculative_explorer(formulas=mine | {"expected_tokens_per_step": lambda a, k: None})
    assert "returned None, not a number" in ex.state["error"]
    with pytest.raises(ValueError, match=r"missing or not callable: \['expected_speedup'\]"):
        speculative_explorer(formulas={"expected_tokens_per_step": unwritten})


# ---- lab 06: the serving explorer over a live server ------------------------------------------

@pytest.fixture(scope="module")
def live():
    """A BackgroundServer on the shipped target model, validation-text token ids, and one
    explorer over them (calibrated once: bursts of 1, 2, 4, 8)."""
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    pytest.importorskip("httpx")
    import minillm
    import minillm.data
    from minillm.explorers import serve_explorer
    from minillm.serving.server import BackgroundServer
    model, tok = minillm.load("target"), minillm.load_tokenizer("target")
    ids = minillm.data.load_tokens(tok, "val").tolist()
    srv = BackgroundServer(model, tok, "target", max_num_seqs=8)
    try:
        ex = serve_explorer(srv, ids, rate=8, max_batch=4, max_batch_slider=8)
        yield srv, ids, ex
    finally:
        srv.stop()


def _ms(x):
    return f"{1e3 * x:.1f}"


def test_serve_explorer_measures_and_follows_the_rate(live):
    from minillm.explorers import SERVE_PLOT_CLASS, SERVE_READOUT_CLASS
    srv, _ids, ex = live
    assert SERVE_READOUT_CLASS in ex.readout._dom_classes
    assert SERVE_PLOT_CLASS in ex.plot._dom_classes
    assert list(ex.controls) == ["rate", "max_batch"]          # the browser test moves the first
    assert all(not w.continuous_update for w in ex.controls.values())
    cal = ex.calibration
    assert cal["batches"][0] == 1 and all(t > 0 for t in cal["step_s"]) and cal["ttft0_s"] > 0
    if ex.state["rate"] != 8.0:
        ex.set(rate=8, max_batch=4)
    first, html_before, png_before = ex.state["measured"], ex.readout.value, ex.state["png"]
    assert ex.state["error"] is None
    assert first["completed"] == first["requests"] == ex.num_requests and first["errors"] == 0
    assert first["output_tokens"] == ex.num_requests * ex.max_tokens
    for key in ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s"):
        assert _ms(first[key]) in ex.readout.value, key
    assert f"{first['throughput_tok_s']:.1f}" in ex.readout.value
    assert ex.state["napkin"] == ex.predict(8.0, 4)
    assert f"{ex.state['napkin']['throughput_tok_s']:.1f}" in ex.readout.value

    ex.controls["rate"].value = 16                               # a slider move measures again
    second = ex.state["measured"]
    assert ex.state["rate"] == 16.0 and second["rate"] == 16.0
    assert second["completed"] == second["requests"] == ex.num_requests
    assert ex.readout.value != html_before and ex.state["png"] != png_before
    assert _ms(second["ttft_p50_s"]) in ex.readout.value
    assert f"{second['throughput_tok_s']:.1f}" in ex.readout.value
    assert ex.history[-2:] == [first, second]
    # the napkin: more offered load, more predicted throughput, never above the capacity
    p8, p16 = ex.predict(8.0, 4), ex.predict(16.0, 4)
    assert p8["throughput_tok_s"] < p16["throughput_tok_s"] <= p16["capacity_tok_s"] * 1.000001
    assert p16["capacity_tok_s"] == pytest.approx(4 / ex.step_time(4))
    assert srv.engine_loop.alive


def test_serve_explorer_max_batch_reaches_the_engine(live):
    srv, _ids, ex = live
    engine = srv.engine_loop.engine
    i0 = len(engine.steps)
    st = ex.set(rate=16, max_batch=2)
    assert st["error"] is None and engine.scheduler.max_num_seqs == 2
    assert srv.engine_loop.stats()["max_num_seqs"] == 2
    assert st["measured"]["completed"] == ex.num_requests
    assert max(len(s.runs) for s in engine.steps[i0:]) <= 2      # never more than 2 in a step
    assert st["napkin"]["saturated"] and st["napkin"]["batch"] == 2
    srv.engine_loop.set_max_num_seqs(3)                          # the loop's own setter
    deadline = time.monotonic() + 5
    while engine.scheduler.max_num_seqs != 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.scheduler.max_num_seqs == 3
    with pytest.raises(ValueError, match="max_num_seqs"):
        srv.engine_loop.set_max_num_seqs(0)


def test_serve_explorer_errors_are_messages(live):
    from minillm.explorers import SERVE_ERROR_CLASS, serve_explorer
    from minillm.serving.server import BackgroundServer
    srv, ids, _ex = live
    ex = serve_explorer(None, ids)                               # no server: a message
    assert "no server" in ex.state["error"] and SERVE_ERROR_CLASS in ex.readout.value
    assert ex.plot.outputs == ()
    assert "must lie in" in ex.set(rate=0)["error"] and "rate" in ex.readout.value
    assert "whole number" in ex.set(max_batch=2.5)["error"]
    with pytest.raises(ValueError, match="unknown controls"):
        ex.set(batch=3)
    short = serve_explorer(srv, [1, 2, 3])                       # too little text for prompts
    assert "at least" in short.state["error"] and short.plot.outputs == ()
    stopped = BackgroundServer(srv.engine_loop.engine.model, None, "target", max_num_seqs=1)
    stopped.stop()
    ex = serve_explorer(stopped, ids)
    assert "has stopped" in ex.state["error"] and SERVE_ERROR_CLASS in ex.readout.value


def test_gpus_control_splits_the_model_as_tensor_parallel_napkin(ex):
    reset(ex)
    st = ex.set(model="llama-2-13b", gpu="h100", batch=256, seq_len=1000, gpus=4,
                link="pcie", allreduce_us=5.0)
    want = rf.tensor_parallel_napkin("llama-2-13b", "h100", 256, 1000, 4, "pcie",
                                     allreduce_latency_s=5e-6)
    assert st["error"] is None
    assert st["row"]["latency_s"] == pytest.approx(want["latency_s"])
    assert st["row"]["fits"] and st["max_batch"] == want["max_batch"]
    text = re.sub("<[^>]+>", " ", st["readout_text"])
    assert "per GPU" in text and "all-reduces" in text and "4 copies instead" in text
    assert st["plot"]["current"]["latency_ms"] == pytest.approx(1e3 * want["latency_s"])
    back = ex.set(gpus=1)
    assert back["row"]["latency_s"] == pytest.approx(
        rf.napkin("llama-2-13b", "h100", 256, 1000)["latency_s"])
    assert "copies" not in back["readout_text"]


def test_gpus_that_do_not_divide_the_heads_show_a_message(ex):
    reset(ex)
    st = ex.set(gpus=16)
    assert st["error"] and "divide N = 40" in st["error"]
    reset(ex)


# ---- lab 01: the explorer on the student's own functions (the course's are withheld there) ----

def lecture_formulas() -> dict:
    """Lab 01's four functions as its solution writes them (the lecture's notation)."""
    def num_params(D, F, N, K, H, L, V):
        return 2 * V * D + L * (2 * D * N * H + 2 * D * K * H + 3 * D * F)

    def napkin(B, S, model, gpu, bytes_per_param=2):
        params = num_params(**model)
        kv = S * model["K"] * model["H"] * model["L"] * 2 * bytes_per_param
        memory = B * kv + params * bytes_per_param
        latency = memory / gpu["bandwidth"]
        return {"params": params, "param_bytes": params * bytes_per_param,
                "kv_bytes_per_seq": kv, "memory_bytes": memory, "latency_s": latency,
                "throughput_tok_s": B / latency, "fits": memory <= gpu["memory"]}

    def tensor_parallel(B, S, model, gpu, G, link_bandwidth, allreduce_latency_s=0.0,
                        bytes_per_param=2):
        per_gpu = napkin(B, S, model, gpu, bytes_per_param)["memory_bytes"] / G
        comm = 2 * model["L"] * (2 * (G - 1) / G * B * model["D"] * 2 / link_bandwidth
                                 + allreduce_latency_s) if G > 1 else 0.0
        latency = per_gpu / gpu["bandwidth"] + comm
        return {"memory_per_gpu_bytes": per_gpu, "comm_s": comm, "latency_s": latency,
                "throughput_tok_s": B / latency, "fits": per_gpu <= gpu["memory"]}

    def max_batch_that_fits(S, model, gpu, bytes_per_param=2):
        one = napkin(1, S, model, gpu, bytes_per_param)
        return max(0, math.floor((gpu["memory"] - one["param_bytes"]) / one["kv_bytes_per_seq"]))

    return dict(napkin=napkin, tensor_parallel=tensor_parallel,
                max_batch_that_fits=max_batch_that_fits,
                accelerator_intensity=lambda flops_per_s, bytes_per_s: flops_per_s / bytes_per_s)


def test_lab01_formulas_drive_the_explorer_as_the_course_does():
    """Lab 01 hands the explorer the student's functions: for a model the lecture counts
    (untied head, every layer attends) they show what minillm.roofline shows."""
    mine, course = napkin_explorer(formulas=lecture_formulas()), napkin_explorer()
    keys = ("params", "param_bytes", "kv_bytes_per_seq", "kv_bytes", "memory_bytes", "latency_s",
            "throughput_tok_s", "fits", "max_throughput_tok_s", "accelerator_intensity")
    split = ("memory_per_gpu_bytes", "comm_s", "copies_latency_s", "copies_throughput_tok_s",
             "copies_fit")
    for values in [{}, dict(batch=256, n_kv_heads=8), dict(model="llama-3-8b", seq_len=4096),
                   dict(gpu="a100", bytes_per_param=1.0, memory_gb=30.0),
                   dict(model="llama-2-13b", gpu="h100", batch=256, gpus=4, link="pcie"),
                   dict(gpus=8, n_kv_heads=8, allreduce_us=0.0)]:
        a, b = mine.set(**values), course.set(**values)
        assert a["error"] is None and b["error"] is None, (a["error"], b["error"])
        for key in keys + (split if mine.controls["gpus"].value > 1 else ()):
            assert a["row"][key] == pytest.approx(b["row"][key], rel=1e-9), (values, key)
        assert a["max_batch"] == b["max_batch"] and a["plot"]["batch"] == b["plot"]["batch"]
        assert re.sub(r"\d", "", a["readout_text"]) == re.sub(r"\d", "", b["readout_text"])
    assert mine.set(gpus=16, n_kv_heads=40)["error"].startswith("G = 16 GPUs must divide N = 40")


def test_lab01_formulas_that_fail_show_a_message():
    def unwritten(*args, **kwargs):
        raise NotImplementedError()

    ex = napkin_explorer(formulas=lecture_formulas() | {"napkin": unwritten})
    assert ex.state["error"] == "your napkin raised NotImplementedError: "
    assert ERROR_CLASS in ex.readout.value and ex.plot.outputs == ()
    ex = napkin_explorer(formulas=lecture_formulas() | {"napkin": lambda *a, **k: {}})
    assert "your napkin returned no number under 'params'" in ex.state["error"]
    ex = napkin_explorer(formulas=lecture_formulas() | {
        "tensor_parallel": lambda *a, **k: {"latency_s": 1.0}})
    assert ex.state["error"] is None and "no number" in ex.set(gpus=2)["error"]
    with pytest.raises(ValueError, match=r"missing or not callable: \['tensor_parallel'"):
        napkin_explorer(formulas={"napkin": unwritten, "max_batch_that_fits": unwritten,
                                  "accelerator_intensity": unwritten})


def test_serve_explorer_reads_percentiles_with_the_function_it_is_given(live):
    """Lab 06 hands the serving explorer the student's percentile (the course's is withheld
    there): every p50 and p99, measured and predicted, is that function's; what it raises is
    shown."""
    from minillm.explorers import serve_explorer
    srv, ids, calibrated = live
    seen = []

    def mine(values, p):
        seen.append(type(values))
        return 1.0 + p / 1000

    ex = serve_explorer(None, ids, percentile=mine, max_batch_slider=8)   # no server yet
    ex.server, ex.calibration = srv, calibrated.calibration              # no calibration run
    st = ex.set(rate=16, max_batch=4)
    assert st["error"] is None and set(seen) == {list}
    for key in ("ttft_p50_s", "tpot_p50_s", "itl_p50_s"):
        assert st["measured"][key] == 1.05, key
    assert st["measured"]["ttft_p99_s"] == st["napkin"]["ttft_p99_s"] == 1.099
    assert "1050.0 / 1099.0" in st["readout_text"]

    def unwritten(values, p):
        raise NotImplementedError()

    ex = serve_explorer(None, ids, percentile=unwritten, max_batch_slider=8)
    ex.server, ex.calibration = srv, calibrated.calibration
    assert ex.set(rate=16)["error"] == "ValueError: your percentile raised NotImplementedError: "
    assert srv.engine_loop.alive
