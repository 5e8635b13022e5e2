"""The OpenAI API's request checks and response shapes (chat completions, completions, models),
independent of the HTTP framework: a bad request raises ApiError with its status and message."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Optional, Union

MAX_STOP_STRINGS = 4
SPECULATIVE = ("ngram", "draft", "none")


class ApiError(Exception):
    """An error answered with an OpenAI-style body: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, param: Optional[str] = None, code: Optional[str] = None,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@dataclass
class GenerationRequest:
    """A checked request: what to feed the model and how to sample, stop and answer."""

    chat: bool
    prompt: Union[str, list]          # text, token ids, or chat messages
    stream: bool = False
    include_usage: bool = False       # stream_options.include_usage
    max_tokens: Optional[int] = None  # None: up to the context's end
    temperature: float = 1.0
    top_p: float = 1.0
    seed: Optional[int] = None
    stop: list = field(default_factory=list)
    ignore_eos: bool = False          # vLLM's extension: generate max_tokens whatever comes (benchmarks)
    speculative: Optional[str] = None  # "ngram", "draft", "none" (off); None: the server's default
    logprobs: Optional[int] = None    # each token's logprob with this many alternatives; None: no logprobs
    logit_bias: dict = field(default_factory=dict)  # token id -> added to its logit before sampling
    variables: dict = field(default_factory=dict)   # the chat template's own (reasoning_effort, ...)


def parse_json(raw: bytes) -> dict:
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise ApiError(400, f"the request body is not valid JSON ({e})") from None
    if not isinstance(body, dict):
        raise ApiError(400, f"the request body must be a JSON object, got {type(body).__name__}")
    return body


def _typed(body: dict, name: str, types, what: str, default=None):
    """body[name] if present (and not null) with one of ``types``; bool is not a number here."""
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) and bool not in types or not isinstance(value, types):
        raise ApiError(400, f"'{name}' must be {what}, got {json.dumps(value)[:80]}", param=name)
    return value


def _number(body: dict, name: str, lo: float, hi: float, default: float, lo_open: bool = False) -> float:
    value = float(_typed(body, name, (int, float), "a number", default))
    if not (lo < value if lo_open else lo <= value) or not value <= hi:
        raise ApiError(400, f"'{name}' must be in {'(' if lo_open else '['}{lo}, {hi}], got {value}", param=name)
    return value


def _content_text(content, where: str) -> str:
    """A message's content: a string, or a list of {"type": "text", "text": ...} parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise ApiError(400, f"{where}: only text content parts are supported", param="messages")
            texts.append(part["text"])
        return "".join(texts)
    raise ApiError(400, f"{where}: 'content' must be a string or a list of text parts", param="messages")


def _messages(body: dict) -> list:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' must be a non-empty list", param="messages")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError(400, f"{where} must be an object with a string 'role'", param="messages")
        if m["role"] not in ("system", "developer", "user", "assistant", "tool"):
            raise ApiError(400, f"{where}: unsupported role {m['role']!r}", param="messages")
        if m["role"] == "tool" or m.get("tool_calls") is not None:
            out.append(m)  # checked and shaped for the chat template by tools.request
            continue
        role = "system" if m["role"] == "developer" else m["role"]
        out.append({"role": role, "content": _content_text(m.get("content"), where), **_reasoning(m, where)})
    return out


def _reasoning(m: dict, where: str) -> dict:
    """An assistant message's ``reasoning_content`` (as replies carry it), for templates that
    render it (Qwen3's; GPT-OSS's as ``thinking``)."""
    if (value := m.get("reasoning_content")) is None or m["role"] != "assistant":
        return {}
    if not isinstance(value, str):
        raise ApiError(400, f"{where}: 'reasoning_content' must be a string", param="messages")
    return {"reasoning_content": value}


REASONING_EFFORT = ("none", "minimal", "low", "medium", "high")
RESERVED = ("messages", "tools", "add_generation_prompt", "bos_token", "eos_token",  # the template's inputs we set
            "raise_exception", "strftime_now")


def _variables(body: dict) -> dict:
    """The chat template's own variables: ``chat_template_kwargs`` (as vLLM and llama-server take
    them) and ``reasoning_effort`` (OpenAI's; GPT-OSS's template writes it in its system message)."""
    out = dict(_typed(body, "chat_template_kwargs", (dict,), "an object", {}))
    bad = [k for k in out if not isinstance(k, str) or not k.isidentifier() or k in RESERVED]
    if bad:
        raise ApiError(400, f"'chat_template_kwargs' cannot set {bad[0]!r} (names must be identifiers, not one of "
                            f"{', '.join(RESERVED)})", param="chat_template_kwargs")
    effort = _typed(body, "reasoning_effort", (str,), "a string")
    if effort is not None:
        if effort not in REASONING_EFFORT:
            raise ApiError(400, f"'reasoning_effort' must be one of {', '.join(REASONING_EFFORT)}, got {effort!r}",
                           param="reasoning_effort")
        out["reasoning_effort"] = effort
    return out


def _logit_bias(body: dict, vocab_size: int) -> dict:
    """OpenAI's logit_bias: {token id (a string): bias in [-100, 100]}."""
    bias = _typed(body, "logit_bias", (dict,), "an object of token ids to numbers", {})
    out = {}
    for key, value in bias.items():
        if not (isinstance(key, str) and key.isdigit() and int(key) < vocab_size):
            raise ApiError(400, f"'logit_bias' keys must be token ids below {vocab_size}, got {key!r}",
                           param="logit_bias")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not -100 <= value <= 100:
            raise ApiError(400, f"'logit_bias' values must be numbers in [-100, 100], got {json.dumps(value)[:40]}",
                           param="logit_bias")
        out[int(key)] = float(value)
    return out


def _prompt(body: dict):
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one prompt
    if isinstance(prompt, str) and prompt:
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                                   for t in prompt):
        return prompt
    raise ApiError(400, "'prompt' must be a non-empty string or list of token ids (one prompt)", param="prompt")


def _speculative(body: dict) -> Optional[str]:
    """'speculative': absent, the server's default (None); null or "none", off; "ngram" or "draft"."""
    if "speculative" not in body:
        return None
    value = "none" if body["speculative"] is None else body["speculative"]
    if not isinstance(value, str) or value not in SPECULATIVE:
        raise ApiError(400, "'speculative' must be \"ngram\", \"draft\", \"none\" or null, got "
                            f"{json.dumps(value)[:80]}", param="speculative")
    return value


def _seed(body: dict) -> Optional[int]:
    """OpenAI's seed: a signed 64-bit integer."""
    value = _typed(body, "seed", (int,), "an integer")
    if value is not None and not -2**63 <= value < 2**63:
        raise ApiError(400, f"'seed' must be a 64-bit integer, got {value}", param="seed")
    return value


def _count(body: dict, name: str, hi: int) -> Optional[int]:
    value = _typed(body, name, (int,), f"an integer in [0, {hi}]")
    if value is not None and not 0 <= value <= hi:
        raise ApiError(400, f"'{name}' must be in [0, {hi}], got {value}", param=name)
    return value


def _logprobs(body: dict, chat: bool) -> Optional[int]:
    """How many alternatives each token's logprob lists (None: no logprobs): chat's 'logprobs'
    (a boolean) and 'top_logprobs' (0..20, with 'logprobs': true only); completions' 'logprobs' (0..5)."""
    if not chat:
        return _count(body, "logprobs", 5)
    on, top = _typed(body, "logprobs", (bool,), "a boolean", False), _count(body, "top_logprobs", 20)
    if top is not None and not on:
        raise ApiError(400, "'top_logprobs' needs 'logprobs': true", param="top_logprobs")
    return (top or 0) if on else None


def parse_request(body: dict, chat: bool, model_name: str, vocab_size: int = 2**31) -> GenerationRequest:
    """Check a /v1/chat/completions (chat=True) or /v1/completions body."""
    model = body.get("model")
    if not isinstance(model, str):
        raise ApiError(400, "'model' must be a string", param="model")
    if model != model_name:
        raise ApiError(404, f"the model '{model}' does not exist; this server serves '{model_name}'",
                       param="model", code="model_not_found")
    prompt = _messages(body) if chat else _prompt(body)
    n = _typed(body, "n", (int,), "an integer", 1)
    if n != 1:
        raise ApiError(400, f"'n' must be 1 (one choice per request), got {n}", param="n")
    for name in ("presence_penalty", "frequency_penalty"):
        if _number(body, name, -2.0, 2.0, 0.0) != 0.0:
            raise ApiError(400, f"'{name}' is not supported (only 0)", param=name)
    if _typed(body, "echo", (bool,), "a boolean", False):
        raise ApiError(400, "'echo' is not supported", param="echo")
    if _typed(body, "suffix", (str,), "a string"):
        raise ApiError(400, "'suffix' is not supported", param="suffix")
    names = ("max_completion_tokens", "max_tokens") if chat else ("max_tokens",)
    max_tokens = None
    for name in names:
        value = _typed(body, name, (int,), "an integer")
        if value is not None and value <= 0:
            raise ApiError(400, f"'{name}' must be >= 1, got {value}", param=name)
        max_tokens = value if max_tokens is None else max_tokens
    stop = body.get("stop")
    stop = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or len(stop) > MAX_STOP_STRINGS or not all(isinstance(s, str) and s for s in stop):
        raise ApiError(400, f"'stop' must be a string or a list of at most {MAX_STOP_STRINGS} non-empty strings",
                       param="stop")
    options = _typed(body, "stream_options", (dict,), "an object", {})
    return GenerationRequest(
        chat=chat, prompt=prompt, stream=_typed(body, "stream", (bool,), "a boolean", False),
        include_usage=_typed(options, "include_usage", (bool,), "a boolean", False),
        max_tokens=max_tokens, temperature=_number(body, "temperature", 0.0, 2.0, 1.0),
        top_p=_number(body, "top_p", 0.0, 1.0, 1.0, lo_open=True), seed=_seed(body),
        stop=stop, ignore_eos=_typed(body, "ignore_eos", (bool,), "a boolean", False),
        speculative=_speculative(body), logprobs=_logprobs(body, chat), logit_bias=_logit_bias(body, vocab_size),
        variables=_variables(body) if chat else {})


# -- responses ----------------------------------------------------------------------------------
class Answer:
    """The pieces of one request's answer, in the chat or the completions shape."""

    def __init__(self, chat: bool, model: str):
        self.chat, self.model = chat, model
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())

    def _envelope(self, obj: str, choices: list) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices}

    def complete(self, text: Optional[str], finish_reason: str, usage: dict, logprobs: Optional[dict] = None,
                 reasoning: Optional[str] = None, tool_calls: Optional[list] = None) -> dict:
        if self.chat:
            message = {"role": "assistant", "content": text}
            if reasoning is not None:  # a reasoning model's thoughts (as llama-server and vLLM name them)
                message["reasoning_content"] = reasoning
            if tool_calls:
                message["tool_calls"] = tool_calls
            choice = {"index": 0, "message": message, "logprobs": logprobs, "finish_reason": finish_reason}
            return {**self._envelope("chat.completion", [choice]), "usage": usage}
        choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
        return {**self._envelope("text_completion", [choice]), "usage": usage}

    def chunk(self, text: Optional[str], finish_reason: Optional[str] = None, first: bool = False,
              logprobs: Optional[dict] = None, tool_calls: Optional[list] = None,
              reasoning: Optional[str] = None) -> dict:
        if self.chat:
            delta = {} if text is None else {"content": text}
            if reasoning:
                delta["reasoning_content"] = reasoning
            if tool_calls:  # tools.ToolStream's deltas
                delta["tool_calls"] = tool_calls
            if first:
                delta = {"role": "assistant", **delta}
            choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
            return self._envelope("chat.completion.chunk", [choice])
        choice = {"index": 0, "text": text or "", "logprobs": logprobs, "finish_reason": finish_reason}
        return self._envelope("text_completion", [choice])

    def usage_chunk(self, usage: dict) -> dict:
        return {**self._envelope("chat.completion.chunk" if self.chat else "text_completion", []), "usage": usage}


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    """As OpenAI reports it; cached_tokens: the prompt's tokens whose KV rows were reused."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def models_list(model_name: str, created: int) -> dict:
    return {"object": "list", "data": [{"id": model_name, "object": "model", "created": created,
                                        "owned_by": "qlinear"}]}
