"""`minillm serve` driven by the official `openai` client (issue 17).

A real server process is started on a free port (`--port 0`, the URL read from its first line),
talked to over HTTP by `openai.OpenAI` / `openai.AsyncOpenAI` (and raw httpx for what the client
cannot send), and stopped by PID. The request checks and the detokenizer alone:
tests/test_openai_api.py.
"""
import asyncio
import functools
import json
import re
import signal
import subprocess
import sys
import time

import httpx
import openai
import pytest

import minillm
from minillm.serving.openai_api import chat_prompt
from minillm.serving.server import BackgroundServer

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("server")]
MODEL = "target"
CTX = 512


def start_server(*extra) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "minillm", "serve", "--port", "0",
                             "--threads", "1", "--max-num-seqs", "8", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()                # "minillm serve: target on http://...:PORT"
    m = re.search(r"http://[\d.]+:\d+", line)
    if not m:
        proc.kill()
        raise AssertionError(f"the server did not start: {line!r} {proc.stderr.read()}")
    return proc, m.group(0)


def stop_server(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("the server did not stop on SIGTERM")


# "tensor parallel": the same server with the model split over 2 ranks (issue 49): every test
# here then checks that the OpenAI API works unchanged in front of it, with the tokens of TP = 1
SERVERS = {"whole prompts": (), "chunked prefill": ("--max-batched-tokens", "32"),
           "tensor parallel": ("--tp", "2")}


@pytest.fixture(scope="module", params=list(SERVERS))
def server(request):
    extra = SERVERS[request.param]
    proc, url = start_server(*extra)
    try:
        yield url
    finally:
        stop_server(proc)
    assert proc.returncode is not None


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key="none", max_retries=0, timeout=60)


def metrics(url) -> dict:
    text = httpx.get(url + "/metrics", timeout=10).text
    return {k: float(v) for k, v in re.findall(r"^(minillm_\w+) ([\d.e+-]+)$", text, re.M)}


def wait_idle(url, timeout=10.0) -> dict:
    """Poll /metrics until no sequence runs or waits; the last reading."""
    deadline = time.monotonic() + timeout
    while True:
        m = metrics(url)
        if m["minillm_requests_running"] == 0 and m["minillm_requests_waiting"] == 0:
            return m
        if time.monotonic() > deadline:
            raise AssertionError(f"the server did not go idle: {m}")
        time.sleep(0.05)


@functools.lru_cache(maxsize=None)          # the same reference for both servers: run it once
def _cli_generate(prompt, kw: tuple) -> str:
    args = [sys.executable, "-m", "minillm", "generate", prompt, "--json", "--threads", "1"]
    for k, v in kw:
        args += [f"--{k.replace('_', '-')}", str(v)]
    return subprocess.run(args, capture_output=True, text=True, timeout=120, check=True).stdout


def cli_generate(prompt, **kw) -> dict:
    """`minillm generate ... --json` run as a command, its JSON answer."""
    return json.loads(_cli_generate(prompt, tuple(sorted(kw.items()))))


# ---- against a live server -------------------------------------------------------------------
PROMPTS = ["ROMEO.\n", "To be, or not to be, that is the question:\n",
           "KING HENRY.\nOnce more unto the breach, dear friends, once more;"]


def test_greedy_completions_equal_minillm_generate(client):
    for prompt in PROMPTS:
        ref = cli_generate(prompt, temperature=0, max_new_tokens=40)
        r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=40, temperature=0)
        assert r.choices[0].text == ref["completion"], prompt
        assert r.usage.completion_tokens == ref["new_tokens"]
        assert r.usage.prompt_tokens == ref["prompt_tokens"]
        assert r.choices[0].finish_reason == ("length" if ref["new_tokens"] == 40 else "stop")


def test_seeded_sampling_equals_minillm_generate(client):
    ref = cli_generate("ROMEO.\n", temperature=0.9, top_k=40, seed=7, max_new_tokens=30)
    r = client.completions.create(model=MODEL, prompt="ROMEO.\n", max_tokens=30,
                                  temperature=0.9, seed=7, extra_body={"top_k": 40})
    assert r.choices[0].text == ref["completion"]


def test_streamed_text_equals_the_plain_answer(client):
    for kw in ({"temperature": 0}, {"temperature": 1.0, "top_p": 0.9, "seed": 3}):
        plain = client.completions.create(model=MODEL, prompt=PROMPTS[1], max_tokens=48, **kw)
        chunks = list(client.completions.create(model=MODEL, prompt=PROMPTS[1], max_tokens=48,
                                                stream=True,
                                                stream_options={"include_usage": True}, **kw))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        assert text == plain.choices[0].text
        assert len([c for c in chunks if c.choices]) > 5           # it really streamed
        assert chunks[-1].usage.completion_tokens == plain.usage.completion_tokens
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == \
            plain.choices[0].finish_reason


def test_chat_uses_the_documented_template(client):
    messages = [{"role": "system", "content": "Thou art a player."},
                {"role": "user", "content": "Who art thou?"}]
    chat = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=24,
                                          temperature=0)
    same = client.completions.create(model=MODEL, prompt=chat_prompt(messages), max_tokens=24,
                                     temperature=0)
    assert chat.choices[0].message.role == "assistant"
    assert chat.choices[0].message.content == same.choices[0].text
    assert chat.usage.prompt_tokens == same.usage.prompt_tokens
    stream = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=24,
                                            temperature=0, stream=True)
    deltas = [c.choices[0].delta for c in stream]
    assert deltas[0].role == "assistant"
    assert "".join(d.content or "" for d in deltas) == chat.choices[0].message.content


def test_stop_strings_cut_the_text_and_free_the_slot(server, client):
    free = client.completions.create(model=MODEL, prompt="ROMEO.\n", max_tokens=60,
                                     temperature=0).choices[0].text
    assert "\n" in free.strip("\n")
    cut = free.index("\n", 1)
    r = client.completions.create(model=MODEL, prompt="ROMEO.\n", max_tokens=60, temperature=0,
                                  stop=["\n"] if cut else ["\n\n"])
    text = "".join(c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt="ROMEO.\n", max_tokens=60, temperature=0, stop=["\n"], stream=True))
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == free[:free.index("\n")] and text == r.choices[0].text
    assert wait_idle(server)["minillm_kv_blocks_used"] == 0


def test_n_samples_are_seeded_and_distinct(client):
    kw = dict(model=MODEL, prompt="ROMEO.\n", max_tokens=20, temperature=1.0, n=3, seed=11)
    a, b = client.completions.create(**kw), client.completions.create(**kw)
    texts = [c.text for c in sorted(a.choices, key=lambda c: c.index)]
    assert texts == [c.text for c in sorted(b.choices, key=lambda c: c.index)]
    assert len(set(texts)) > 1 and [c.index for c in a.choices] == [0, 1, 2]


def test_32_concurrent_streams_all_complete(server):
    async def main():
        aclient = openai.AsyncOpenAI(base_url=server + "/v1", api_key="none", max_retries=0,
                                     timeout=120)

        async def one(i):
            stream = await aclient.completions.create(
                model=MODEL, prompt=PROMPTS[i % 3], max_tokens=12 + i % 5, temperature=0,
                stream=True)
            text, reasons = "", []
            async for c in stream:
                text += c.choices[0].text
                reasons.append(c.choices[0].finish_reason)
            return i, text, reasons[-1]
        return await asyncio.gather(*(one(i) for i in range(32)))

    before = metrics(server)["minillm_requests_finished_total"]
    results = asyncio.run(main())
    assert len(results) == 32 and all(r[2] in ("length", "stop") for r in results)
    by_prompt = {}
    for i, text, _ in results:                 # the same prompt and length: the same text
        by_prompt.setdefault((i % 3, 12 + i % 5), set()).add(text)
    assert all(len(v) == 1 for v in by_prompt.values())
    m = wait_idle(server)
    assert m["minillm_requests_finished_total"] - before == 32
    assert m["minillm_kv_blocks_used"] == 0


def test_a_client_that_disconnects_mid_stream_leaks_no_block(server):
    before = metrics(server)["minillm_requests_aborted_total"]
    body = {"model": MODEL, "prompt": "ROMEO.\n", "max_tokens": 400, "temperature": 0,
            "stream": True}
    with httpx.Client(timeout=30) as h:
        with h.stream("POST", server + "/v1/completions", json=body) as r:
            lines = r.iter_lines()
            got = [next(lines) for _ in range(6)]
            assert any(x.startswith("data: ") for x in got)
            assert metrics(server)["minillm_kv_blocks_used"] > 0
        # leaving the block closes the connection mid-stream
    m = wait_idle(server)
    assert m["minillm_kv_blocks_used"] == 0
    assert m["minillm_requests_aborted_total"] == before + 1
    # a plain (non-streamed) request whose client gives up is aborted too
    with pytest.raises(httpx.TimeoutException):
        httpx.post(server + "/v1/completions", json={**body, "stream": False}, timeout=0.5)
    m = wait_idle(server)
    assert m["minillm_kv_blocks_used"] == 0
    assert m["minillm_requests_aborted_total"] == before + 2


@pytest.mark.parametrize("kw, status, match", [
    ({"model": "gpt-4"}, 404, "does not exist"),
    ({"temperature": 5}, 400, "temperature"),
    ({"top_p": 0}, 400, "top_p"),
    ({"max_tokens": 0}, 400, "max_tokens"),
    ({"n": 99}, 400, "n must be"),
    ({"prompt": "ROMEO " * 600}, 400, "context"),
    ({"max_tokens": CTX}, 400, "context"),
    ({"prompt": [5, 99999]}, 400, "token ids"),
    ({"prompt": ""}, 400, "empty"),
    ({"stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    ({"logprobs": 3}, 400, "not supported"),
    ({"extra_body": {"top_k": -5}}, 400, "top_k"),
    ({"extra_body": {"bogus": 1}}, 400, "unrecognized"),
])
def test_bad_requests_get_openai_errors(server, client, kw, status, match):
    args = {"model": MODEL, "prompt": "ROMEO.", "max_tokens": 4, **kw}
    with pytest.raises(openai.APIStatusError) as e:
        client.completions.create(**args)
    assert e.value.status_code == status
    err = e.value.body
    assert match in err["message"] and err["type"] == "invalid_request_error"
    if match == "context":
        assert err["code"] == "context_length_exceeded"


def test_bad_bodies_and_a_healthy_server_after_them(server, client):
    for body, match in ((b"{not json", "not valid JSON"), (b"[1, 2]", "JSON object"),
                        (b"", "not valid JSON")):
        r = httpx.post(server + "/v1/completions", content=body,
                       headers={"content-type": "application/json"}, timeout=10)
        assert r.status_code == 400 and match in r.json()["error"]["message"]
    r = httpx.post(server + "/v1/chat/completions", json={"model": MODEL, "messages": []},
                   timeout=10)
    assert r.status_code == 400 and "messages" in r.json()["error"]["message"]
    assert httpx.get(server + "/health", timeout=10).json() == {"status": "ok"}
    m = wait_idle(server)
    assert m["minillm_kv_blocks_used"] == 0                 # no stuck slot
    r = client.completions.create(model=MODEL, prompt="ROMEO.", max_tokens=3, temperature=0)
    assert r.usage.completion_tokens == 3


def test_models_and_metrics(server, client):
    assert [m.id for m in client.models.list()] == [MODEL]
    client.completions.create(model=MODEL, prompt="ROMEO.", max_tokens=5, temperature=0)
    text = httpx.get(server + "/metrics", timeout=10).text
    for name in ("minillm_requests_running", "minillm_requests_waiting",
                 "minillm_kv_blocks_used", "minillm_time_to_first_token_seconds_bucket",
                 "minillm_time_per_output_token_seconds_count"):
        assert f"\n{name}" in "\n" + text, name
    m = metrics(server)
    assert m["minillm_time_to_first_token_seconds_count"] >= 1
    assert m["minillm_kv_blocks_total"] == 8 * CTX // 16


def test_a_background_server_refuses_what_its_kv_cache_cannot_hold():
    """The in-process server (the lab 06 notebook's) with a tiny KV cache: a request that could
    never fit is a 400 naming --kv-blocks, and a small one still runs."""
    model, tok = minillm.load(MODEL), minillm.load_tokenizer(MODEL)
    with BackgroundServer(model, tok, MODEL, max_num_seqs=2, kv_blocks=4) as srv:
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)
        with pytest.raises(openai.BadRequestError, match="kv-blocks"):
            c.completions.create(model=MODEL, prompt="ROMEO.", max_tokens=100)
        r = c.completions.create(model=MODEL, prompt="ROMEO.", max_tokens=8, temperature=0)
        assert r.usage.completion_tokens == 8
        assert srv.engine_loop.engine.sequences == {}       # answered requests are forgotten
        srv.engine_loop.set_max_num_seqs(1)
        with pytest.raises(openai.BadRequestError, match="n must be"):
            c.completions.create(model=MODEL, prompt="ROMEO.", max_tokens=4, n=2)
    assert not srv.engine_loop.alive


def test_a_request_the_engine_refuses_after_the_check_is_a_400():
    """The server checks n against the loop's limit; if the engine's own limit is lower by the
    time the request reaches it (the explorer's slider moved), the engine's refusal is the
    client's 400 naming the limit, not a server error."""
    model, tok = minillm.load(MODEL), minillm.load_tokenizer(MODEL)
    with BackgroundServer(model, tok, MODEL, max_num_seqs=2) as srv:
        srv.engine_loop.engine.scheduler.max_num_seqs = 1    # the engine's limit, not the loop's
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)
        with pytest.raises(openai.BadRequestError, match=r"max_num_seqs \(1\), got 2"):
            c.completions.create(model=MODEL, prompt="ROMEO.", max_tokens=4, n=2)
        for stream in (False, True):          # and the server still answers
            r = c.completions.create(model=MODEL, prompt="ROMEO.", max_tokens=3, stream=stream)
            if stream:
                r = list(r)
            assert r
