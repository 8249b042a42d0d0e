"""`minillm serve --replicas 2`: two copies behind one endpoint (minillm/serving/replicas.py),
driven by the official `openai` client like tests/test_server.py drives one server.

One front is shared by the behaviour tests; the last test kills its replicas one by one. Two
more fronts are started only to be stopped: by SIGTERM once serving, and while loading.
"""
import asyncio
import concurrent.futures
import re
import signal
import subprocess
import sys
import time

import httpx
import openai
import pytest
import torch

import minillm
from minillm.generate import generate_naive
from minillm.sampling import SamplingParams
from minillm.serving.openai_api import APIError, Request, chat_prompt

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("replicas")]
MODEL = "target"
CTX = 512


def start_front(*extra) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "minillm", "serve", "--port", "0",
                             "--replicas", "2", "--threads", "2", "--max-num-seqs", "4", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()       # "minillm serve: target on http://...:PORT (...)"
    m = re.search(r"http://[\d.]+:\d+", line)
    if not m:
        proc.kill()
        raise AssertionError(f"the front did not start: {line!r} {proc.stderr.read()}")
    return proc, m.group(0)


def health(url) -> httpx.Response:
    return httpx.get(url + "/health", timeout=10)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"     # a zombie has exited
    except FileNotFoundError:
        return False


def wait_gone(pids, timeout=15.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


def metrics(url) -> dict:
    """{(name, replica): value} of the front's /metrics."""
    text = httpx.get(url + "/metrics", timeout=10).text
    return {(k, int(i)): float(v) for k, i, v in
            re.findall(r'^(minillm_\w+)\{replica="(\d+)"\} ([\d.e+-]+)$', text, re.M)}


def per_replica(m: dict, name: str) -> list[float]:
    return [m[(name, 0)], m[(name, 1)]]


@pytest.fixture(scope="module")
def front():
    proc, url = start_front()
    pids = [r["pid"] for r in health(url).json()["replicas"]]
    try:
        yield proc, url, pids
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=20)
        assert wait_gone(pids) == []


@pytest.fixture(scope="module")
def client(front):
    return openai.OpenAI(base_url=front[1] + "/v1", api_key="none", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def reference():
    """Greedy text of one process on one thread (each replica's share), as `minillm generate`."""
    model, tok = minillm.load(MODEL), minillm.load_tokenizer(MODEL)

    def greedy(prompt: str, n: int) -> str:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            params = SamplingParams(temperature=0, max_new_tokens=n, stop_ids=(tok.eos_id,))
            return tok.decode(generate_naive(model, tok.encode(prompt), params)[0])
        finally:
            torch.set_num_threads(threads)
    return greedy


def test_greedy_completion_and_chat_equal_one_process(client, reference):
    r = client.completions.create(model=MODEL, prompt="ROMEO.\n", max_tokens=32, temperature=0)
    assert r.choices[0].text == reference("ROMEO.\n", 32)
    messages = [{"role": "user", "content": "Who art thou?"}]
    chat = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=24,
                                          temperature=0)
    assert chat.choices[0].message.content == reference(chat_prompt(messages), 24)


def test_streams_pass_through(client):
    kw = dict(model=MODEL, prompt="To be, or not to be", max_tokens=24, temperature=0)
    plain = client.completions.create(**kw).choices[0].text
    chunks = list(client.completions.create(**kw, stream=True,
                                            stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == plain
    assert len(chunks) > 5 and chunks[-1].usage.completion_tokens == 24
    messages = [{"role": "user", "content": "Speak."}]
    chat = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12,
                                          temperature=0)
    deltas = [c.choices[0].delta for c in client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=12, temperature=0, stream=True)]
    assert deltas[0].role == "assistant"
    assert "".join(d.content or "" for d in deltas) == chat.choices[0].message.content


def test_concurrent_requests_are_spread_over_both_replicas(front):
    url = front[1]
    before = metrics(url)

    async def main():
        c = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)
        return await asyncio.gather(*(c.completions.create(
            model=MODEL, prompt="ROMEO.\n", max_tokens=24, temperature=0) for _ in range(4)))

    texts = {r.choices[0].text for r in asyncio.run(main())}
    after = metrics(url)
    routed = [a - b for a, b in zip(per_replica(after, "minillm_replica_requests_routed_total"),
                                    per_replica(before, "minillm_replica_requests_routed_total"))]
    finished = [a - b for a, b in zip(per_replica(after, "minillm_requests_finished_total"),
                                      per_replica(before, "minillm_requests_finished_total"))]
    assert len(texts) == 1                          # both copies answer alike
    assert sum(routed) == 4 and min(routed) >= 1, routed
    assert finished == routed                       # the counter counts what each replica ran
    assert per_replica(after, "minillm_replica_requests_in_flight") == [0, 0]


@pytest.mark.parametrize("kw", [{"max_tokens": 0}, {"temperature": 5}, {"model": "gpt-4"},
                                {"prompt": "ROMEO " * 600}])
def test_a_bad_request_gets_one_servers_error(client, kw):
    body = {"model": MODEL, "prompt": "ROMEO.", "max_tokens": 4, **kw}
    with pytest.raises(APIError) as want:           # what one server's check answers
        Request("completion", body, MODEL, minillm.load_tokenizer(MODEL), CTX, 4)
    with pytest.raises(openai.APIStatusError) as got:
        client.completions.create(**body)
    assert got.value.status_code == want.value.status
    assert got.value.body == want.value.body()["error"]


def test_bad_json_and_models_and_health(front, client):
    url = front[1]
    r = httpx.post(url + "/v1/completions", content=b"{not json",
                   headers={"content-type": "application/json"}, timeout=10)
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    assert [m.id for m in client.models.list()] == [MODEL]
    h = health(url)
    assert h.status_code == 200 and [r["status"] for r in h.json()["replicas"]] == ["ok", "ok"]
    m = metrics(url)
    assert per_replica(m, "minillm_kv_blocks_total") == [4 * CTX // 16] * 2
    assert per_replica(m, "minillm_replica_up") == [1, 1]


def wait_aborted(url, count, timeout=10.0) -> dict:
    """Poll until the replicas have aborted `count` requests in all and hold no KV block."""
    deadline = time.monotonic() + timeout
    while True:
        m = metrics(url)
        if sum(per_replica(m, "minillm_requests_aborted_total")) == count and \
                per_replica(m, "minillm_kv_blocks_used") == [0, 0]:
            return m
        assert time.monotonic() < deadline, m
        time.sleep(0.1)


def test_a_client_that_leaves_aborts_the_replicas_request(front):
    url = front[1]
    aborted = sum(per_replica(metrics(url), "minillm_requests_aborted_total"))
    body = {"model": MODEL, "prompt": "ROMEO.\n", "max_tokens": 400, "temperature": 0,
            "stream": True}
    with httpx.Client(timeout=30) as h:
        with h.stream("POST", url + "/v1/completions", json=body) as r:
            lines = r.iter_lines()
            assert any(next(lines).startswith("data: ") for _ in range(4))
    wait_aborted(url, aborted + 1)      # the front closed the replica's stream
    with pytest.raises(httpx.TimeoutException):         # a plain request given up on
        httpx.post(url + "/v1/completions", json={**body, "stream": False}, timeout=0.5)
    m = wait_aborted(url, aborted + 2)
    assert per_replica(m, "minillm_replica_requests_in_flight") == [0, 0]


def wait_in_flight(url, timeout=10.0) -> int:
    """The replica that has a request in flight, once one has."""
    deadline = time.monotonic() + timeout
    while True:
        busy = per_replica(metrics(url), "minillm_replica_requests_in_flight")
        if any(busy):
            return busy.index(1)
        assert time.monotonic() < deadline, "no request reached a replica"
        time.sleep(0.02)


def test_killed_replicas_the_front_serves_on_then_exits(front, client):
    """Last test of the module: it uses up the shared front. A plain request on the replica
    killed is answered by the other; a stream on the last one ends with an error."""
    proc, url, pids = front
    routed = per_replica(metrics(url), "minillm_replica_requests_routed_total")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        kw = dict(model=MODEL, prompt="ROMEO.\n", max_tokens=200, temperature=0)
        long = pool.submit(client.completions.create, **kw)
        first = wait_in_flight(url)
        subprocess.run(["kill", "-9", str(pids[first])], check=True)
        text = long.result().choices[0].text
    other = 1 - first
    now = per_replica(metrics(url), "minillm_replica_requests_routed_total")
    assert now[first] - routed[first] == 1 and now[other] - routed[other] == 1   # sent again
    assert text == client.completions.create(**kw).choices[0].text and len(text) > 200
    for _ in range(3):          # every request answered, by the replica left
        r = client.completions.create(model=MODEL, prompt="ROMEO.", max_tokens=3)
        assert r.usage.completion_tokens == 3
    h = health(url)
    assert h.status_code == 503
    assert [r["status"] for r in h.json()["replicas"]][first] == "exited"
    up = per_replica(metrics(url), "minillm_replica_up")
    assert up[first] == 0 and up[other] == 1
    stream = client.completions.create(model=MODEL, prompt="ROMEO.\n", max_tokens=300,
                                       temperature=0, stream=True)
    next(stream)
    subprocess.run(["kill", "-9", str(pids[other])], check=True)
    with pytest.raises(openai.APIError, match=f"replica {other} failed while streaming"):
        list(stream)
    try:
        rc = proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("the front kept running with no replica left")
    err = proc.stderr.read()
    assert rc != 0
    assert re.search(rf"replica {first} \(pid {pids[first]}, http://\S+\) exited with code -9; "
                     r"routing to the 1 left", err), err
    assert "every replica has exited" in err


def test_sigterm_stops_the_front_and_every_replica():
    proc, url = start_front()
    pids = [r["pid"] for r in health(url).json()["replicas"]]
    assert all(alive(p) for p in pids)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0
    assert wait_gone(pids, timeout=1) == []
    # stopped while its replicas still load: the same, no orphan
    proc = subprocess.Popen([sys.executable, "-m", "minillm", "serve", "--port", "0",
                             "--replicas", "2", "--threads", "2"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 15
    while len(children := _children(proc.pid)) < 2:
        assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read()
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0
    assert wait_gone(children, timeout=1) == []


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]
