"""The OpenAI HTTP API's requests and answers, checked and built without any web framework.

`server.py` routes; this file knows what a request may say and what the answer looks like:

    POST /v1/completions       {"model", "prompt", "max_tokens", "temperature", "top_p", "seed",
                                "stop", "n", "stream", "stream_options", "top_k" (extension)}
    POST /v1/chat/completions  {"model", "messages": [{"role", "content"}], ... the same}

A request is checked completely before the engine sees it: a wrong type, a value out of range,
a prompt the model cannot hold or an option this server does not implement gets `APIError`, a
4xx answer in OpenAI's JSON error format that names the problem -- never a silent default.

Chat template. The shipped models learned Shakespeare's plays, where every speech opens with its
speaker's name in capitals and a full stop on a line of its own. A conversation is written as a
play in that format, and the model is asked for the assistant's next speech:

    SYSTEM.                     (only if there is a system message)
    You are a helpful assistant.

    USER.
    Who art thou?

    ASSISTANT.
    <the completion starts here>

Text streaming (`Detokenizer`). Tokens arrive one at a time, but text must not go out before it
is final: a token may end inside a multi-byte UTF-8 character (decoded as U+FFFD until the rest
arrives), and the end of the text may be the start of a stop string that must not be shown. Both
are held back until the next tokens decide.
"""
from __future__ import annotations

import json
import time
import uuid

from ..sampling import SamplingParams

MAX_STOP = 4                                   # OpenAI's limit on stop sequences
CHAT_ROLES = ("system", "user", "assistant")
COMMON = {"model", "max_tokens", "temperature", "top_p", "top_k", "n", "stream",
          "stream_options", "seed", "stop", "user", "presence_penalty", "frequency_penalty",
          "logit_bias", "logprobs"}
COMPLETION_ONLY = {"prompt", "echo", "best_of", "suffix"}
CHAT_ONLY = {"messages", "max_completion_tokens", "top_logprobs"}


class APIError(Exception):
    """A request the server refuses: HTTP status + OpenAI's error object."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, type_: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = (
            status, message, param, code, type_)

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


MAX_BODY = 1 << 20          # bytes: far more than a 512-token context's prompt can use


def parse_json(raw: bytes) -> dict:
    if len(raw) > MAX_BODY:
        raise APIError(413, f"the request body is {len(raw)} bytes, over the {MAX_BODY}-byte "
                       f"limit", code="request_too_large")
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise APIError(400, f"the request body is not valid JSON: {e}", code="invalid_json")
    if not isinstance(body, dict):
        raise APIError(400, f"the request body must be a JSON object, got "
                       f"{type(body).__name__}", code="invalid_json")
    return body


# ---- field checks -----------------------------------------------------------------------------
def _number(body, key, default, lo, hi, lo_open=False):
    v = body.get(key, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise APIError(400, f"{key} must be a number, got {json.dumps(v)}", key)
    if not (lo < v if lo_open else lo <= v) or v > hi:
        lo_s = f"> {lo}" if lo_open else f">= {lo}"
        raise APIError(400, f"{key} must be {lo_s} and <= {hi}, got {v}", key)
    return float(v)


def _int(body, key, default, lo, hi=None):
    v = body.get(key, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int):
        raise APIError(400, f"{key} must be an integer, got {json.dumps(v)}", key)
    if v < lo or (hi is not None and v > hi):
        raise APIError(400, f"{key} must be in {lo}..{'' if hi is None else hi}, got {v}", key)
    return v


def _unsupported(body, key, ok) -> None:
    if key in body and not ok(body[key]):
        raise APIError(400, f"{key}={json.dumps(body[key])} is not supported by this server",
                       key, code="unsupported")


def _stop_strings(body) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise APIError(400, "stop must be a non-empty string or a list of them", "stop")
    if len(stops) > MAX_STOP:
        raise APIError(400, f"stop takes at most {MAX_STOP} strings, got {len(stops)}", "stop")
    return stops


class Request:
    """A checked request: token-id prompts, sampling parameters, how to answer."""

    def __init__(self, kind: str, body: dict, served: str, tokenizer, max_seq_len: int,
                 max_n: int):
        if kind not in ("completion", "chat"):
            raise ValueError(f"kind must be 'completion' or 'chat', got {kind!r}")
        self.kind = kind
        allowed = COMMON | (COMPLETION_ONLY if kind == "completion" else CHAT_ONLY)
        extra = sorted(set(body) - allowed)
        if extra:
            raise APIError(400, f"unrecognized request argument(s): {', '.join(extra)}",
                           extra[0])
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise APIError(400, "model is required (a string): GET /v1/models lists it", "model")
        if model != served:
            raise APIError(404, f"the model {model!r} does not exist: this server serves "
                           f"{served!r}", "model", code="model_not_found")
        self.model = model
        for key in ("presence_penalty", "frequency_penalty"):
            _unsupported(body, key, lambda v: v in (None, 0))
        _unsupported(body, "logit_bias", lambda v: v in (None, {}))
        _unsupported(body, "logprobs", lambda v: v in (None, False, 0))
        _unsupported(body, "echo", lambda v: v in (None, False))
        _unsupported(body, "suffix", lambda v: v is None)
        _unsupported(body, "top_logprobs", lambda v: v in (None, 0))
        if not isinstance(body.get("user", ""), str):
            raise APIError(400, "user must be a string", "user")

        self.stream = body.get("stream", False)
        if self.stream is None:
            self.stream = False
        if not isinstance(self.stream, bool):
            raise APIError(400, "stream must be true or false", "stream")
        opts = body.get("stream_options")
        self.include_usage = False
        if opts is not None:
            if not self.stream:
                raise APIError(400, "stream_options is only allowed with stream: true",
                               "stream_options")
            if not isinstance(opts, dict) or set(opts) - {"include_usage"}:
                raise APIError(400, "stream_options takes only include_usage",
                               "stream_options")
            self.include_usage = bool(opts.get("include_usage", False))

        self.n = _int(body, "n", 1, 1, max_n)
        _unsupported(body, "best_of", lambda v: v is None or v == self.n)
        self.stops = _stop_strings(body)
        temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
        top_p = _number(body, "top_p", 1.0, 0.0, 1.0, lo_open=True)
        top_k = _int(body, "top_k", 0, -1)
        seed = _int(body, "seed", None, -2**63)
        if seed is not None:
            seed %= 2**63                        # torch seeds are non-negative 64-bit ints

        if kind == "completion":
            self.prompts = self._completion_prompts(body.get("prompt"), tokenizer)
            default_max = 16                     # OpenAI's default for completions
        else:
            self.prompts = [tokenizer.encode(chat_prompt(body.get("messages")))]
            default_max = None                   # the rest of the context
            if "max_tokens" in body and "max_completion_tokens" in body:
                raise APIError(400, "give max_tokens or max_completion_tokens, not both",
                               "max_completion_tokens")
            if "max_completion_tokens" in body:
                body = {**body, "max_tokens": body["max_completion_tokens"]}
        vocab = tokenizer.vocab_size
        for ids in self.prompts:
            if not ids:
                raise APIError(400, "the prompt is empty: need at least one token", "prompt")
            if min(ids) < 0 or max(ids) >= vocab:
                raise APIError(400, f"token ids must be in [0, {vocab})", "prompt")
        longest = max(len(p) for p in self.prompts)
        if longest >= max_seq_len:
            raise APIError(400, f"this model's context is {max_seq_len} tokens, but the prompt "
                           f"has {longest}: no room to generate", "prompt",
                           code="context_length_exceeded")
        max_tokens = _int(body, "max_tokens", default_max, 1)
        if max_tokens is None:
            max_tokens = max_seq_len - longest
        if longest + max_tokens > max_seq_len:
            raise APIError(400, f"this model's context is {max_seq_len} tokens, but the prompt "
                           f"({longest}) + max_tokens ({max_tokens}) = {longest + max_tokens}",
                           "max_tokens", code="context_length_exceeded")
        eos = tokenizer.eos_id
        self.params = SamplingParams(temperature=temperature, top_p=top_p,
                                     top_k=max(top_k, 0), max_new_tokens=max_tokens, seed=seed,
                                     stop_ids=() if eos is None else (eos,))

    @staticmethod
    def _completion_prompts(prompt, tokenizer) -> list[list[int]]:
        """prompt: a string, a list of token ids, or a list of either (one choice group each)."""
        def is_ids(x):
            return isinstance(x, list) and x and all(
                isinstance(t, int) and not isinstance(t, bool) for t in x)
        if isinstance(prompt, str):
            return [tokenizer.encode(prompt)]
        if is_ids(prompt):
            return [list(prompt)]
        if isinstance(prompt, list) and prompt and all(isinstance(p, str) or is_ids(p)
                                                       for p in prompt):
            return [tokenizer.encode(p) if isinstance(p, str) else list(p) for p in prompt]
        raise APIError(400, "prompt must be a string, a list of token ids, or a non-empty list "
                       "of those", "prompt")


def chat_prompt(messages) -> str:
    """The conversation as a play script, ending with the assistant's cue (see the docstring)."""
    if not isinstance(messages, list) or not messages:
        raise APIError(400, "messages must be a non-empty list of {role, content}", "messages")
    parts = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in CHAT_ROLES:
            raise APIError(400, f"messages[{i}] needs a role in {CHAT_ROLES}", "messages")
        content = m.get("content")
        if isinstance(content, list):           # [{"type": "text", "text": ...}, ...]
            if not all(isinstance(c, dict) and c.get("type") == "text"
                       and isinstance(c.get("text"), str) for c in content):
                raise APIError(400, f"messages[{i}].content: only text parts are supported",
                               "messages")
            content = "".join(c["text"] for c in content)
        if not isinstance(content, str):
            raise APIError(400, f"messages[{i}].content must be a string", "messages")
        parts.append(f"{m['role'].upper()}.\n{content}\n\n")
    return "".join(parts) + "ASSISTANT.\n"


# ---- text out ---------------------------------------------------------------------------------
class Detokenizer:
    """Token ids in, final text out: holds back an unfinished UTF-8 character and any tail that
    could still become a stop string; cuts the text at the first stop string."""

    def __init__(self, tokenizer, stops: list[str]):
        self.tok, self.stops = tokenizer, stops
        self.ids: list[int] = []
        self.sent = 0                  # characters of the text already handed out
        self.stopped = False           # a stop string was found: the text is final

    def _text(self) -> str:
        return self.tok.decode(self.ids)

    def add(self, ids: list[int]) -> str:
        """Take new token ids; return the text that is now final (maybe "")."""
        if self.stopped:
            return ""
        self.ids.extend(ids)
        text = self._text()
        cut = min((i for i in (text.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            return self._take(text, cut)
        safe = len(text)
        while safe > self.sent and text[safe - 1] == "\ufffd":
            safe -= 1                  # maybe half a character: wait for the next token
        for s in self.stops:           # the longest tail that starts a stop string
            for k in range(min(len(s) - 1, safe - self.sent), 0, -1):
                if text[safe - k:safe] == s[:k]:
                    safe -= k
                    break
        return self._take(text, safe)

    def finish(self) -> str:
        """The sample ended: whatever was held back is final now."""
        return "" if self.stopped else self._take(self._text(), None)

    def _take(self, text: str, end: int | None) -> str:
        out = text[self.sent:end]
        self.sent += len(out)
        return out


# ---- answers ----------------------------------------------------------------------------------
def new_id(kind: str) -> str:
    return ("cmpl-" if kind == "completion" else "chatcmpl-") + uuid.uuid4().hex[:24]


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def choice(kind: str, index: int, text: str, finish_reason, *, delta: bool = False,
           first: bool = False) -> dict:
    if kind == "completion":
        return {"index": index, "text": text, "logprobs": None, "finish_reason": finish_reason}
    if not delta:
        return {"index": index, "message": {"role": "assistant", "content": text},
                "logprobs": None, "finish_reason": finish_reason}
    d = {"role": "assistant", "content": text} if first else ({"content": text} if text else {})
    return {"index": index, "delta": d, "logprobs": None, "finish_reason": finish_reason}


def envelope(kind: str, rid: str, model: str, choices: list, *, chunk: bool,
             usage_: dict | None = None) -> dict:
    obj = {"completion": ("text_completion", "text_completion"),
           "chat": ("chat.completion", "chat.completion.chunk")}[kind][chunk]
    out = {"id": rid, "object": obj, "created": int(time.time()), "model": model,
           "choices": choices}
    if usage_ is not None or not chunk:
        out["usage"] = usage_
    return out
