"""The OpenAI API layer without a server: request checks, the chat template, the detokenizer
that streams text (minillm/serving/openai_api.py). The live server: tests/test_server.py."""
import pytest

import minillm
from minillm.serving.openai_api import APIError, Detokenizer, Request, chat_prompt

MODEL = "target"
CTX = 512


@pytest.fixture(scope="module")
def tok():
    return minillm.load_tokenizer(MODEL)


def check(body, tok, kind="completion"):
    return Request(kind, {"model": MODEL, **body}, MODEL, tok, CTX, 8)


def test_request_checks(tok):
    r = check({"prompt": "ROMEO.", "top_k": -1, "seed": -3}, tok)
    assert r.params.top_k == 0 and r.params.max_new_tokens == 16 and r.params.seed >= 0
    assert r.params.stop_ids == (tok.eos_id,)
    chat = check({"messages": [{"role": "user", "content": "Hi"}]}, tok, "chat")
    assert chat.params.max_new_tokens == CTX - len(chat.prompts[0])   # the rest of the context
    assert len(check({"prompt": ["a", [5, 6]], "n": 2}, tok).prompts) == 2
    for body in ({"prompt": "x", "stream_options": {"include_usage": True}},
                 {"prompt": "x", "temperature": "hot"}, {"prompt": "x", "n": True},
                 {"prompt": {"a": 1}}, {"prompt": "x", "best_of": 3}):
        with pytest.raises(APIError) as e:
            check(body, tok)
        assert e.value.status == 400 and e.value.message


def test_chat_prompt_is_a_play_script():
    assert chat_prompt([{"role": "system", "content": "Be brief."},
                        {"role": "user", "content": [{"type": "text", "text": "Hi"}]}]) == \
        "SYSTEM.\nBe brief.\n\nUSER.\nHi\n\nASSISTANT.\n"
    with pytest.raises(APIError, match="role"):
        chat_prompt([{"role": "narrator", "content": "x"}])


def test_detokenizer_holds_back_stop_prefixes_and_half_characters(tok):
    ids = tok.encode("I am the king. Good night")
    d = Detokenizer(tok, ["king."])
    out = "".join(d.add([i]) for i in ids)
    assert d.stopped and out == "I am the "
    d = Detokenizer(tok, ["night!"])
    out = "".join(d.add([i]) for i in ids)
    assert not d.stopped and out == "I am the king. Good "          # "night" may start it
    assert out + d.finish() == "I am the king. Good night"
    ids = tok.encode("é€")                                          # bytes split over tokens
    d = Detokenizer(tok, [])
    pieces = [d.add([i]) for i in ids]
    assert all("\ufffd" not in p for p in pieces) and "".join(pieces) + d.finish() == "é€"


def test_bodies_are_checked_before_anything_reads_them():
    from minillm.serving.openai_api import MAX_BODY, parse_json
    assert parse_json(b'{"a": 1}') == {"a": 1}
    for raw, status, match in ((b"x" * (MAX_BODY + 1), 413, "limit"),
                               (b"\xff\xfe{", 400, "not valid JSON"), (b"3", 400, "object")):
        with pytest.raises(APIError) as e:
            parse_json(raw)
        assert e.value.status == status and match in e.value.message
