"""The `minillm` command line: in-process through `cli.main` (fast), plus real subprocesses for
the console-script / `python -m minillm` entry points."""
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from minillm.cli import main

RUN = [sys.executable, "-m", "minillm"]


class Result:
    def __init__(self, returncode, stdout, stderr):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


@pytest.fixture
def run(capsys):
    def _run(*args, ok=True):
        try:
            main(list(args))
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        out, err = capsys.readouterr()
        if ok:
            assert code == 0, err
        return Result(code, out, err)
    return _run


def test_generate_prints_prompt_and_continuation(run):
    out = run("generate", "To be, or not", "--max-new-tokens", "12", "--seed", "0").stdout
    assert out.startswith("To be, or not") and len(out) > len("To be, or not") + 5


def test_generate_is_seeded_and_json(run):
    a = json.loads(run("generate", "ROMEO.", "--max-new-tokens", "10", "--seed", "3", "--json").stdout)
    b = json.loads(run("generate", "ROMEO.", "--max-new-tokens", "10", "--seed", "3", "--json").stdout)
    assert a["completion"] == b["completion"] and a["new_tokens"] <= 10
    assert {"model", "prompt", "completion", "prompt_tokens", "new_tokens"} <= set(a)


def test_greedy_top_k_top_p_flags(run):
    run("generate", "Hark", "--max-new-tokens", "5", "--temperature", "0")
    run("generate", "Hark", "--max-new-tokens", "5", "--top-k", "5", "--top-p", "0.9",
        "--model", "draft")


def test_eval_ppl_json_fields(run):
    r = json.loads(run("eval", "ppl", "--model", "draft", "--max-tokens", "2048", "--json").stdout)
    assert r["model"] == "draft" and r["quant"] is None
    assert r["tokens"] == 2047 and r["ppl"] == pytest.approx(math.exp(r["loss"]), rel=1e-9)
    q = json.loads(run("eval", "ppl", "--model", "draft", "--max-tokens", "2048", "--quant",
                       "int4-g32", "--json").stdout)
    assert q["quant"] == "int4-g32" and q["tokens"] == 2047
    assert q["model_bytes"] < 0.7 * r["model_bytes"] and q["ppl"] != r["ppl"]
    assert q["ppl"] < 1.1 * r["ppl"]


def test_eval_kv_variants(run):
    r = json.loads(run("eval", "kv-variants", "--model", "draft", "--max-tokens", "512",
                       "--json").stdout)
    rows = {v["name"]: v for v in r["variants"]}
    base = rows["MHA"]
    assert {"GQA", "MLA", "CLA", "sliding"} <= {v["family"] for v in r["variants"]}
    assert all(v["kv_bytes_per_token"] < base["kv_bytes_per_token"] for n, v in rows.items()
               if n != "MHA")
    assert all(v["ppl"] > 1 for v in rows.values())


def test_napkin_json_reproduces_the_lecture(run):
    r = json.loads(run("napkin", "--model", "llama-2-13b", "--gpu", "h100", "--batch", "1",
                       "--seq-len", "1000", "--json").stdout)
    assert r["latency_s"] == pytest.approx(0.008, rel=0.05)
    assert r["throughput_tok_s"] == pytest.approx(124, rel=0.02)
    for key in ("params", "param_bytes", "kv_bytes_per_seq", "memory_bytes", "fits"):
        assert key in r
    big = json.loads(run("napkin", "--batch", "256", "--json").stdout)
    assert big["fits"] is False
    gqa = json.loads(run("napkin", "--batch", "256", "--kv-heads", "8", "--json").stdout)
    assert gqa["fits"] is True


def test_bench_decode_json_with_hf(run):
    out = json.loads(run("bench", "decode", "--model", "draft", "--prompt-len", "8",
                         "--new-tokens", "12", "--repeats", "1", "--vs-hf", "--dtype", "float32",
                         "--no-fused-step", "--cpu-time", "--json").stdout)
    assert list(out["formats"]) == ["float32"] and out["model"] == "draft"
    r = out["formats"]["float32"]
    assert r["clock"] == "cpu"          # --cpu-time; the naive loop's tokens come from its timed run
    assert 0 < r["bandwidth_fraction"] == r["cached_bandwidth_fraction"]
    assert r["limit_tok_s"] * r["bytes_per_token"] == pytest.approx(r["read_gb_s"] * 1e9)
    for key in ("naive_tok_s", "cached_tok_s", "cached_vs_naive", "hf_tok_s", "cached_vs_hf",
                "cached_loop_tok_s"):
        assert r[key] > 0, key
    assert r["cached_vs_naive"] == pytest.approx(r["cached_tok_s"] / r["naive_tok_s"])
    assert r["cached_vs_hf"] == pytest.approx(r["cached_tok_s"] / r["hf_tok_s"])
    # greedy from the same prompt: every implementation must produce the same tokens
    assert r["naive_matches_cached"] and r["hf_matches_cached"] and r["cached_loop_matches_cached"]
    assert r["new_tokens"] == 12 and r["batch"] == 1


@pytest.mark.slow    # a whole benchmark run: make test, not make check
def test_bench_decode_times_both_formats_and_names_a_bad_one(run):
    # without the fused step: on a cold Inductor cache (a fresh CI machine) compiling it for both
    # formats is most of a minute; tests/test_bandwidth.py benches the fused step of a tiny model
    out = json.loads(run("bench", "decode", "--model", "draft", "--prompt-len", "4",
                         "--new-tokens", "6", "--repeats", "1", "--no-naive", "--no-fused-step",
                         "--json").stdout)
    assert list(out["formats"]) == ["float32", "bfloat16"]
    for name, r in out["formats"].items():
        assert r["dtype"] == f"torch.{name}" and r["cached_tok_s"] > 0 and r["clock"] == "wall"
        assert "fused_tok_s" not in r
        assert r["bytes_per_token"] > 0 and r["bandwidth_fraction"] > 0
    # bf16 weights: half the bytes of fp32 (the cache too)
    f32, bf16 = out["formats"]["float32"], out["formats"]["bfloat16"]
    assert bf16["bytes_per_token"] == pytest.approx(f32["bytes_per_token"] / 2)
    bad = run("bench", "decode", "--dtype", "float32,int3", "--json", ok=False)
    assert bad.returncode == 2 and "int3" in bad.stderr


@pytest.mark.slow    # a whole benchmark run: make test, not make check
def test_bench_quant_cli_json(run):
    # the packed steps: on a cold Inductor cache (a fresh CI machine) compiling the target in four
    # formats was most of this test's time; tests/test_quant_speed.py checks each compiled step
    out = json.loads(run("bench", "quant", "--step", "packed", "--new-tokens", "8", "--repeats",
                         "1", "--threads", "1", "--json").stdout)
    assert out["step"] == "packed"
    for key in ("fp32_tok_s", "bf16_tok_s", "int8_tok_s", "int4_tok_s", "int8_vs_fp32",
                "int4_vs_fp32", "model_bytes", "tokens_match", "read_gb_s"):
        assert key in out, key
    assert out["model_bytes"]["int8"] == 13_820_160 and out["model_bytes"]["int4"] == 9_127_680
    assert out["prompt_len"] == 32 and out["threads"] == 1


def test_bench_batching_json(run):
    r = json.loads(run("bench", "batching", "--model", "draft", "--requests", "12",
                       "--max-batch", "4", "--json").stdout)
    for key in ("static_tok_s", "continuous_tok_s", "speedup", "static_ttft_p50_s",
                "continuous_ttft_p50_s"):
        assert r[key] > 0, key
    assert r["requests"] == r["completed"] == r["static_completed"] == 12
    assert r["speedup"] == pytest.approx(r["continuous_tok_s"] / r["static_tok_s"])
    assert r["same_outputs"] and r["leaked_blocks"] == 0
    assert r["static_token_slots"] > r["static_useful_tokens"] == r["continuous_tokens_run"]
    p = run("bench", "batching", "--requests", "0", ok=False)
    assert p.returncode == 2 and "num_requests must be >= 1" in p.stderr


def test_bench_serve_json(run):
    """Its own servers on loopback: the rate sweep and the interleaved chunked comparison, every
    request answered over HTTP (tiny settings: a few seconds)."""
    for name in ("fastapi", "uvicorn", "httpx"):
        pytest.importorskip(name)
    r = json.loads(run("bench", "serve", "--model", "draft", "--rates", "20,40", "--requests",
                       "4", "--prompt-len", "8", "--max-tokens", "4", "--long-prompt-len", "40",
                       "--long-every", "2", "--chunk", "16", "--chunk-rate", "20", "--rounds",
                       "2", "--json").stdout)
    assert r["url"] is None and r["threads"] == 1 and r["settings"]["rates"] == [20.0, 40.0]
    assert [x["rate"] for x in r["sweep"]] == [20.0, 40.0]
    for x in r["sweep"]:
        assert x["completed"] == x["requests"] == 4 and x["errors"] == 0, x
        for key in ("throughput_tok_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s",
                    "itl_p99_s"):
            assert x[key] > 0, key
    c = r["chunked"]
    assert (c["rate"], c["rounds"], c["chunk"], c["long_prompt_len"]) == (20.0, 2, 16, 40)
    for name in ("unchunked", "chunked"):
        assert c[name]["completed"] == c[name]["requests"] == 8 and c[name]["errors"] == 0
        assert len(c["runs"][name]) == 2
        for key in ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "itl_p50_s",
                    "itl_p99_s"):
            assert c[name][key] > 0, (name, key)
    assert c["itl_p99_ratio"] == pytest.approx(c["unchunked"]["itl_p99_s"]
                                               / c["chunked"]["itl_p99_s"])
    assert c["tpot_p99_ratio"] == pytest.approx(c["unchunked"]["tpot_p99_s"]
                                                / c["chunked"]["tpot_p99_s"])


def test_bench_serve_names_an_unreachable_url_and_bad_options(run):
    pytest.importorskip("httpx")
    p = run("bench", "serve", "--url", "http://127.0.0.1:1", ok=False)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "cannot reach a minillm server at http://127.0.0.1:1" in p.stderr
    for args, message in ((["--rates", "2,x"], "--rates takes a comma-separated list"),
                          (["--rates", "0"], "request rates > 0"),
                          (["--requests", "0"], "--requests must be >= 1"),
                          (["--chunk", "0"], "--chunk must be >= 1"),
                          (["--chunk", "8"], "--chunk 8 must be >= --max-num-seqs 16"),
                          (["--url", "localhost:8000"], "--url must start with http://"),
                          (["--max-tokens", "600"], "context of 512 tokens")):
        p = run("bench", "serve", "--model", "draft", *args, ok=False)
        assert p.returncode == 2 and message in p.stderr, (args, p.stderr)


@pytest.mark.parametrize("args, message", [
    (["bench", "decode", "--prompt-len", "500", "--new-tokens", "100"], "context"),
    (["bench", "decode", "--new-tokens", "0"], ">= 1"),
    (["bench", "quant", "--new-tokens", "1"], "new_tokens must be >= 2"),
    (["bench", "quant", "--model", "draft"], "mlp.down_proj (352 -> 128)"),
    (["generate", "Hi", "--temperature", "-1"], "temperature"),
    (["generate", "Hi", "--top-p", "0"], "top_p"),
    (["generate", "Hi", "--top-k", "-2"], "top_k"),
    (["generate", "Hi", "--model", "no-such-model"], "unknown model"),
    (["generate", "Hi", "--max-new-tokens", "5000"], "context"),
    (["generate", "", "--max-new-tokens", "5"], "empty"),
    (["eval", "ppl", "--model", "/nonexistent/dir"], "unknown model"),
    (["napkin", "--model", "gpt-17"], "unknown model"),
    (["eval", "ppl", "--quant", "int5"], "invalid choice"),
    (["eval", "ppl", "--model", "draft", "--quant", "int4-g64"], "mlp.down_proj (352 -> 128)"),
    (["napkin", "--kv-heads", "7"], "kv_heads"),
    (["serve", "--replicas", "0"], "--replicas must be >= 1, got 0"),
])
def test_bad_input_exits_2_with_a_clear_message(run, args, message):
    p = run(*args, ok=False)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert message in p.stderr and "Traceback" not in p.stderr


def test_console_script_and_python_dash_m():
    exe = Path(sys.executable).with_name("minillm")
    assert exe.exists(), "the minillm console script is not installed"
    p = subprocess.run([str(exe), "generate", "Hark", "--max-new-tokens", "4", "--model", "draft"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and p.stdout.startswith("Hark"), p.stderr
    p = subprocess.run(RUN + ["napkin", "--model", "nope"], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 2 and "unknown model" in p.stderr


def test_every_model_command_shares_model_json_and_threads(run):
    """One parent parser: --model/--json/--threads parse the same way on every command that
    runs a model; napkin (a preset, not a model) shares --json."""
    from minillm.cli import build_parser
    p = build_parser()
    for cmd in (["generate", "x"], ["eval", "ppl"], ["eval", "kv-variants"], ["bench", "decode"],
                ["bench", "quant"], ["bench", "speculative"], ["bench", "batching"],
                ["bench", "serve"]):
        a = p.parse_args(cmd + ["--model", "draft", "--json", "--threads", "2"])
        assert (a.model, a.json, a.threads) == ("draft", True, 2), cmd
    assert p.parse_args(["bench", "batching"]).threads is None      # cmd_bench_batching: 1
    assert p.parse_args(["bench", "decode"]).threads is None
    assert p.parse_args(["napkin", "--json"]).json is True
    r = run("generate", "To be", "--threads", "0", "--model", "draft", ok=False)
    assert "--threads must be >= 1" in r.stderr
