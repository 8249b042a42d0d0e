"""Tensor parallelism (minillm.parallel, issue 49): real gloo ranks over loopback.

Correctness: rank outputs equal the unsplit model's (MHA, GQA, a KV head shared by ranks, 4
ranks), two all-reduces per layer, each rank's KV cache holds its heads only, and `generate
--tp 2` gives the tokens of TP = 1 (as a command and under torchrun; `serve --tp 2` is driven
by the openai client in tests/test_server.py). Failure: a bad world size is refused before
anything starts; a rank that is killed, hangs or raises ends the run with an error naming it,
within the group's timeout, for `run_ranks` and for a live `serve --tp 2`.
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist

import minillm
from minillm.config import ModelConfig
from minillm.kvcache import KVCache
from minillm.model import Transformer
from minillm.parallel import RankFailure, run_ranks, shard, shard_plan

pytestmark = pytest.mark.xdist_group("parallel")
PROMPT = "HAMLET.\nTo be, or not to be"

CONFIGS = {      # name -> (config, world): MHA, GQA split, one KV head copied on 2 ranks, 4 ranks
    "mha": (dict(n_heads=4, n_kv_heads=4), 2),
    "gqa": (dict(n_heads=4, n_kv_heads=2), 2),
    "kv head shared": (dict(n_heads=4, n_kv_heads=1), 2),
    "4 ranks": (dict(n_heads=8, n_kv_heads=4), 4),
}


def _config(**kw):
    return ModelConfig(vocab_size=96, dim=64, n_layers=2, hidden_dim=128, max_seq_len=64, **kw)


def _full_model(kw, seed):
    torch.manual_seed(seed)
    return Transformer(_config(**kw)).eval()


def _rank_outputs(rank, world, names, seed):
    """On each rank: logits of the split models (no cache, and prefill + decode through a KV
    cache), the number of all-reduces per forward, and this rank's cache size."""
    counted = []
    real = dist.all_reduce

    def counting(t, *a, **k):
        counted.append(t.numel())
        return real(t, *a, **k)
    dist.all_reduce = counting
    out = {}
    for name in names:
        kw, w = CONFIGS[name]
        if w != world:
            continue
        full = _full_model(kw, seed)
        mine = shard(full, rank, world)
        ids = torch.randint(0, 96, (2, 9), generator=torch.Generator().manual_seed(seed))
        with torch.no_grad():
            counted.clear()
            logits = mine(ids)
            n_reduce = len(counted)
            cache = KVCache.for_model(mine, batch_size=2, max_len=16)
            step = torch.cat([mine(ids[:, :8], cache=cache)[:, -1:],
                              mine(ids[:, 8:], cache=cache)], dim=1)
        out[name] = (logits, step, n_reduce, cache.nbytes)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_split_models_compute_what_the_whole_model_computes(world):
    out = run_ranks(_rank_outputs, world, list(CONFIGS), 5)
    checked = 0
    for name, (kw, w) in CONFIGS.items():
        if w != world:
            continue
        full = _full_model(kw, 5)
        ids = torch.randint(0, 96, (2, 9), generator=torch.Generator().manual_seed(5))
        with torch.no_grad():
            want = full(ids)
            cache = KVCache.for_model(full, batch_size=2, max_len=16)
            want_step = torch.cat([full(ids[:, :8], cache=cache)[:, -1:],
                                   full(ids[:, 8:], cache=cache)], dim=1)
        K = full.config.n_kv_heads
        for rank in range(world):
            logits, step, n_reduce, kv_bytes = out[rank][name]
            torch.testing.assert_close(logits, want, rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(step, want_step[:, -2:], rtol=1e-4, atol=1e-5)
            assert n_reduce == 2 * full.config.n_layers, name       # one per block, two a layer
            # a rank holds K/W KV heads, or the one KV head its query heads read (W > K)
            local_k = K // world if K % world == 0 else 1
            assert kv_bytes * K == cache.nbytes * local_k, name
        checked += 1
    assert checked >= 1


def test_world_sizes_that_cannot_split_the_model_are_refused():
    c = minillm.load("target").config               # 6 heads, MLP width 1024
    with pytest.raises(ValueError, match="6 query heads"):
        shard_plan(c, 4, 0)
    with pytest.raises(ValueError, match="MLP width 1024"):
        shard_plan(c, 3, 0)
    with pytest.raises(ValueError, match="positive integer"):
        shard_plan(c, 0, 0)
    with pytest.raises(ValueError, match="KV heads"):
        shard_plan(_config(n_heads=6, n_kv_heads=3, head_dim=16), 2, 0)   # 3 KV heads, 2 ranks
    s = shard_plan(_config(n_heads=4, n_kv_heads=1), 2, 1)
    assert (s.q0, s.q1, s.k0, s.k1) == (2, 4, 0, 1)          # the KV head its queries read


def test_one_rank_is_the_whole_model():
    full = _full_model(dict(n_heads=4, n_kv_heads=2), 1)
    ids = torch.randint(0, 96, (1, 7))
    with torch.no_grad():
        torch.testing.assert_close(shard(full, 0, 1)(ids), full(ids))


def _cli(*args, env=None, timeout=180):
    return subprocess.run([sys.executable, "-m", "minillm", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


@pytest.mark.slow
def test_generate_tp2_gives_the_tokens_of_tp1_as_a_command_and_under_torchrun():
    # sampled here (the same seed on every rank: the same draws); greedy under torchrun below,
    # and through `serve --tp 2` in tests/test_server.py
    args = ["generate", PROMPT, "--max-new-tokens", "24", "--json", "--threads", "1"]
    two = _cli(*args, "--temperature", "0.9", "--top-p", "0.9", "--seed", "4", "--tp", "2")
    assert two.returncode == 0, two.stderr
    assert json.loads(two.stdout)["completion"] == _tp1(0.9, top_p=0.9, seed=4)
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = str(free.getsockname()[1])
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    r = subprocess.run([torchrun, "--nproc-per-node", "2", "--master-port", port, "-m",
                        "minillm", *args, "--temperature", "0"],
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    assert len(lines) == 1 and lines[0]["tp"] == 2                  # rank 0 alone reports
    assert lines[0]["completion"] == _tp1(0)


def _tp1(temperature, **kw):
    """What `minillm generate` prints at TP = 1 (its loop, in this process)."""
    from minillm.generate import generate_naive
    from minillm.sampling import SamplingParams
    tok = minillm.load_tokenizer("target")
    params = SamplingParams(temperature=temperature, max_new_tokens=24, stop_ids=(tok.eos_id,)
                            if tok.eos_id is not None else (), **kw)
    with torch.no_grad():
        return tok.decode(generate_naive(minillm.load("target"), tok.encode(PROMPT), params)[0])


def test_the_cli_refuses_a_bad_world_size_before_starting_ranks():
    for cmd in (["generate", "x"], ["serve", "--port", "0"]):
        r = _cli(*cmd, "--tp", "4", timeout=60)
        assert r.returncode == 2 and "6 query heads" in r.stderr, r.stderr
    r = _cli("generate", "x", "--tp", "0", timeout=60)
    assert r.returncode == 2 and "--tp must be >= 1" in r.stderr


# ---- failures: every rank's fate is known within the timeout ----------------------------------
def _doomed(rank, world, how):
    x = torch.ones(4)
    for step in range(1000):
        if rank == 1 and step == 3:
            if how == "killed":
                os.kill(os.getpid(), signal.SIGKILL)
            elif how == "hangs":
                os.kill(os.getpid(), signal.SIGSTOP)
            else:
                raise ZeroDivisionError("rank 1's own bug")
        dist.all_reduce(x)
        time.sleep(0.01)
    return "finished"


@pytest.mark.slow
@pytest.mark.parametrize("how", ["killed", "hangs", "raises"])
def test_a_rank_that_dies_hangs_or_raises_ends_the_run_with_a_clear_error(how):
    start = time.monotonic()
    with pytest.raises(RankFailure) as e:
        run_ranks(_doomed, 2, how, timeout_s=4)
    took = time.monotonic() - start
    message = str(e.value)
    assert "rank 1" in message and "rank 0" in message, message
    if how == "killed":
        assert "killed or crashed" in message or "gone" in message, message
    elif how == "hangs":
        assert "did not answer within 4 s" in message, message
    else:
        assert "ZeroDivisionError: rank 1's own bug" in message, message
    assert took < 4 + 20, took          # within the timeout (plus starting two interpreters)


def _serve_tp2():
    proc = subprocess.Popen([sys.executable, "-m", "minillm", "serve", "--port", "0",
                             "--threads", "1", "--max-num-seqs", "4", "--tp", "2",
                             "--tp-timeout", "6"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if not re.search(r"http://[\d.]+:\d+", line):
        proc.kill()
        raise AssertionError(proc.stderr.read())
    kids = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True,
                          text=True).stdout.split()
    workers = [int(k) for k in kids if "spawn_main" in open(f"/proc/{k}/cmdline").read()]
    assert len(workers) == 1, kids                  # rank 1
    return proc, workers[0]


def _gone(pid, within_s):
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(") ")[1][0] == "Z":       # exited, not yet reaped
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.slow
@pytest.mark.parametrize("who", ["rank 1 is killed", "rank 0 is killed", "SIGTERM"])
def test_serve_tp2_never_outlives_a_lost_rank(who):
    proc, worker = _serve_tp2()
    try:
        if who == "rank 1 is killed":
            os.kill(worker, signal.SIGKILL)
            # no request needed: the idle server's heartbeat finds the dead rank
            proc.wait(timeout=6 + 15)
            err = proc.stderr.read()
            assert proc.returncode == 1, err
            assert "minillm: error:" in err and "rank 1" in err, err[-2000:]
        elif who == "rank 0 is killed":
            proc.kill()
            assert _gone(worker, 6 + 15), "rank 1 outlived rank 0"
        else:                                       # a clean stop tells rank 1 to return
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=15)
            assert _gone(worker, 10), "rank 1 outlived a stopped server"
    finally:
        for pid in (proc.pid, worker):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.mark.slow
def test_serve_under_torchrun_answers_the_openai_client_with_the_tokens_of_tp1():
    import openai
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = str(free.getsockname()[1])
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    proc = subprocess.Popen([torchrun, "--nproc-per-node", "2", "--master-port", port, "-m",
                             "minillm", "serve", "--port", "0", "--threads", "1",
                             "--max-num-seqs", "4"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        url = re.search(r"http://[\d.]+:\d+", line)
        assert url, proc.stderr.read()[-2000:]
        client = openai.OpenAI(base_url=url.group(0) + "/v1", api_key="none", max_retries=0,
                               timeout=60)
        got = client.completions.create(model="target", prompt=PROMPT, max_tokens=24,
                                        temperature=0).choices[0].text
        assert got == _tp1(0)
        proc.send_signal(signal.SIGTERM)       # torchrun passes it on; rank 0 tells rank 1
        assert proc.wait(timeout=30) is not None
    finally:
        if proc.poll() is None:
            proc.kill()
