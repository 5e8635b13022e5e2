"""Anthropic's Messages requests (POST /v1/messages) checked and mapped onto the OpenAI-shaped chat
request the server runs (``protocol``, ``tools``): the system prompt as a first system message,
text blocks as the message's text, an assistant's ``tool_use`` blocks as its ``tool_calls`` (the
input as the arguments' JSON), ``thinking`` blocks as its ``reasoning_content``, a user's
``tool_result`` blocks as ``tool`` messages (``tool_call_id``: the ``tool_use_id``) before its
text; ``tools`` as functions (``input_schema``: the parameters), ``tool_choice`` auto / any / tool
/ none as "auto" / "required" / the named function / "none". Images, documents and server tools
are refused with a 400 naming them."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from .protocol import ApiError
from .tools import NAME

MAX_STOP_SEQUENCES = 16
THINKING = ("enabled", "disabled", "adaptive", "between_tools")
CHOICES = {"auto": "auto", "any": "required", "none": "none"}  # and "tool": the named function


def _fail(message: str, param: str = "messages") -> ApiError:
    return ApiError(400, message, param=param)


@dataclass
class MessagesRequest:
    """A checked Messages request: the chat body the server runs, and what that body cannot say."""

    body: dict
    stop: list           # stop_sequences
    top_k: int           # 0: off
    thinking: bool       # a reply format's reasoning comes back as thinking blocks


def translate(body: dict, counting: bool = False, short_ids: bool = False) -> MessagesRequest:
    """The chat request of a Messages body; ApiError 400 naming what is wrong. ``counting``: a
    count_tokens body (no max_tokens); ``short_ids``: tool_use ids as the 9 letters and digits
    Mistral's templates take (the same id always the same)."""
    max_tokens = body.get("max_tokens")
    if not counting and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        got = "" if max_tokens is None else f", got {json.dumps(max_tokens)[:40]}"
        raise _fail(f"'max_tokens' is required: an integer >= 1{got}", "max_tokens")
    temperature = body.get("temperature")
    if temperature is not None and (isinstance(temperature, bool) or not isinstance(temperature, (int, float))
                                    or not 0 <= temperature <= 1):
        raise _fail(f"'temperature' must be a number in [0, 1], got {json.dumps(temperature)[:40]}", "temperature")
    top_k = body.get("top_k")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0):
        raise _fail(f"'top_k' must be an integer >= 0, got {json.dumps(top_k)[:40]}", "top_k")
    if not isinstance(body.get("metadata", {}), (dict, type(None))):
        raise _fail("'metadata' must be an object", "metadata")
    ids = _short_id if short_ids else (lambda i: i)
    messages = _system(body.get("system")) + _messages(body.get("messages"), ids)
    chat = {"model": body.get("model"), "messages": messages, "max_tokens": None if counting else max_tokens,
            "temperature": temperature, "top_p": body.get("top_p"), "stream": body.get("stream")}
    tools = _tools(body.get("tools"))
    if tools is not None:
        chat["tools"] = tools
    chat.update(_tool_choice(body.get("tool_choice")))
    chat.update(_output_format(body.get("output_config")))
    return MessagesRequest(chat, _stop(body.get("stop_sequences")), top_k or 0, _thinking(body.get("thinking")))


def _short_id(call_id: str) -> str:
    return hashlib.sha256(call_id.encode()).hexdigest()[:9]


def _stop(stop) -> list:
    stop = [] if stop is None else stop
    if not isinstance(stop, list) or len(stop) > MAX_STOP_SEQUENCES or not all(isinstance(s, str) and s for s in stop):
        raise _fail(f"'stop_sequences' must be a list of at most {MAX_STOP_SEQUENCES} non-empty strings",
                    "stop_sequences")
    return stop


def _thinking(thinking) -> bool:
    if thinking is None:
        return True
    if not isinstance(thinking, dict) or thinking.get("type") not in THINKING:
        raise _fail(f"'thinking' must be an object with 'type' one of {', '.join(THINKING)}", "thinking")
    budget = thinking.get("budget_tokens")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 0):
        raise _fail("'thinking.budget_tokens' must be an integer >= 0", "thinking")
    return thinking["type"] != "disabled"


def _text_of(content, where: str, param: str = "messages") -> str:
    """A string, or a list of text blocks (joined end to end, as chat's text parts are)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _fail(f"{where} must be a string or a list of text blocks", param)
    return "".join(_text(b, f"{where}[{j}]", param) for j, b in enumerate(content))


def _kind(block, where: str, param: str = "messages") -> str:
    if not isinstance(block, dict) or not isinstance(block.get("type"), str):
        raise _fail(f"{where} must be a content block: an object with a string 'type'", param)
    return block["type"]


def _text(block, where: str, param: str = "messages") -> str:
    kind = _kind(block, where, param)
    if kind != "text":
        _unsupported(kind, where, param, "text")
    if not isinstance(block.get("text"), str):
        raise _fail(f"{where}: a text block needs a string 'text'", param)
    return block["text"]


def _unsupported(kind: str, where: str, param: str, takes: str):
    if kind in ("image", "document"):
        raise _fail(f"{where}: {kind} blocks are not supported: this server's models read text only", param)
    raise _fail(f"{where}: a {json.dumps(kind)[:40]} block is not supported here (this takes {takes} blocks)", param)


def _system(system) -> list:
    if system is None:
        return []
    text = _text_of(system, "'system'", "system")
    return [{"role": "system", "content": text}] if text else []


def _messages(messages, ids) -> list:
    if not isinstance(messages, list) or not messages:
        raise _fail("'messages' must be a non-empty list")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise _fail(f"{where} must be an object with a string 'role'")
        if m["role"] not in ("user", "assistant"):
            raise _fail(f"{where}: the role must be \"user\" or \"assistant\", got {json.dumps(m['role'])[:40]}"
                        + (" (the system prompt goes in the top-level 'system')" if m["role"] == "system" else ""))
        content = m.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not isinstance(blocks, list) or not blocks:
            raise _fail(f"{where}: 'content' must be a string or a non-empty list of content blocks")
        out += _user(blocks, where, ids) if m["role"] == "user" else [_assistant(blocks, where, ids)]
    if out[-1]["role"] == "assistant":
        raise _fail(f"messages[{len(messages) - 1}]: the last message must be the user's (continuing a "
                    "prefilled assistant reply is not supported)")
    return out


def _user(blocks: list, where: str, ids) -> list:
    """A user message's tool results as tool messages, its text as a user message after them."""
    out, texts = [], []
    for j, b in enumerate(blocks):
        w = f"{where}.content[{j}]"
        kind = _kind(b, w)
        if kind == "text":
            texts.append(_text(b, w))
        elif kind == "tool_result":
            if not isinstance(b.get("tool_use_id"), str) or not b["tool_use_id"]:
                raise _fail(f"{w}: a tool_result block needs the 'tool_use_id' of the tool_use it answers")
            if not isinstance(b.get("is_error", False), bool):
                raise _fail(f"{w}: 'is_error' must be a boolean")
            result = _text_of(b.get("content", ""), f"{w}.content")
            # the templates have no field for it: the model reads that the call failed
            out.append({"role": "tool", "tool_call_id": ids(b["tool_use_id"]),
                        "content": "Error: " + result if b.get("is_error") else result})
        else:
            _unsupported(kind, w, "messages", "text and tool_result")
    return out + ([{"role": "user", "content": "".join(texts)}] if texts or not out else [])


def _assistant(blocks: list, where: str, ids) -> dict:
    texts, thoughts, calls = [], [], []
    for j, b in enumerate(blocks):
        w = f"{where}.content[{j}]"
        kind = _kind(b, w)
        if kind == "text":
            texts.append(_text(b, w))
        elif kind == "thinking":
            if not isinstance(b.get("thinking"), str):
                raise _fail(f"{w}: a thinking block needs a string 'thinking'")
            thoughts.append(b["thinking"])
        elif kind == "tool_use":
            if not isinstance(b.get("id"), str) or not b["id"] or not isinstance(b.get("name"), str) \
                    or not isinstance(b.get("input"), dict):
                raise _fail(f"{w}: a tool_use block needs a string 'id', a string 'name' and an object 'input'")
            calls.append({"id": ids(b["id"]), "type": "function",
                          "function": {"name": b["name"], "arguments": json.dumps(b["input"], ensure_ascii=False)}})
        elif kind != "redacted_thinking":  # (encrypted by Anthropic's models: nothing to render)
            _unsupported(kind, w, "messages", "text, thinking and tool_use")
    out = {"role": "assistant", "content": "".join(texts)}
    if thoughts:
        out["reasoning_content"] = "".join(thoughts)
    return {**out, "tool_calls": calls} if calls else out


def _tools(tools):
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise _fail("'tools' must be a list of tools", "tools")
    out = []
    for i, t in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(t, dict):
            raise _fail(f"{where} must be an object with 'name' and 'input_schema'", "tools")
        if t.get("type") not in (None, "custom"):
            raise _fail(f"{where}: the tool type {json.dumps(t['type'])[:60]} is not supported (only client tools: "
                        "'name', 'description', 'input_schema')", "tools")
        if not isinstance(t.get("name"), str) or not NAME.match(t["name"]):
            raise _fail(f"{where}.name must be 1-64 letters, digits, '_' or '-', got {json.dumps(t.get('name'))[:80]}",
                        "tools")
        if t.get("description") is not None and not isinstance(t["description"], str):
            raise _fail(f"{where}.description must be a string", "tools")
        schema = t.get("input_schema")
        if not isinstance(schema, dict) or schema.get("type") != "object":
            raise _fail(f"{where}.input_schema must be a JSON Schema object with \"type\": \"object\"", "tools")
        function = {"name": t["name"], "parameters": schema}
        if t.get("description") is not None:
            function["description"] = t["description"]
        out.append({"type": "function", "function": function})
    return out


def _output_format(config) -> dict:
    """output_config.format (a JSON schema the answer follows) as response_format; ``effort`` is
    left to the model."""
    if config is None:
        return {}
    if not isinstance(config, dict):
        raise _fail("'output_config' must be an object", "output_config")
    fmt = config.get("format")
    if fmt is None:
        return {}
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
        raise _fail("'output_config.format' must be {\"type\": \"json_schema\", \"schema\": {...}}", "output_config")
    return {"response_format": {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}}


def _tool_choice(choice) -> dict:
    if choice is None:
        return {}
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind not in (*CHOICES, "tool"):
        raise _fail("'tool_choice' must be {\"type\": \"auto\"}, {\"type\": \"any\"}, {\"type\": \"none\"} or "
                    f"{{\"type\": \"tool\", \"name\": ...}}, got {json.dumps(choice)[:80]}", "tool_choice")
    if not isinstance(choice.get("disable_parallel_tool_use", False), bool):
        raise _fail("'tool_choice.disable_parallel_tool_use' must be a boolean", "tool_choice")
    if kind != "tool":
        return {"tool_choice": CHOICES[kind]}
    if not isinstance(choice.get("name"), str):
        raise _fail("'tool_choice' {\"type\": \"tool\"} needs the tool's 'name'", "tool_choice")
    return {"tool_choice": {"type": "function", "function": {"name": choice["name"]}}}
