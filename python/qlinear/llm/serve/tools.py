"""Tool calls: a chat request's ``tools`` and ``tool_choice`` checked, rendered by the model's own
chat template (``tools=``, as transformers passes them), and the model's tool-call format parsed
back into OpenAI's ``tool_calls``.

Formats, told apart by the template's text: Qwen's (Hermes') ``<tool_call>{"name": ...,
"arguments": {...}}</tool_call>``, Llama 3's JSON ``{"name": ..., "parameters": {...}}`` (after
``<|python_tag|>``, a special token the decoded text drops), Mistral's ``[TOOL_CALLS][{"name": ...,
"arguments": {...}}]``. ``tool_choice`` "required" or a named function constrains the output to one
call in the format, its arguments to the function's parameters schema (``structured``), so they
always parse; "auto" lets the model choose; "none" keeps the tools in the prompt and parses no
call."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Optional

from .protocol import ApiError, _content_text
from .structured import check_grammar, json_grammar, response_schema
from .tool_formats import (HARMONY, LLAMA3, MISTRAL, QWEN, Format, ToolStream, answer, detect,  # noqa: F401
                           harmony_answer_grammar)

NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def _fail(message: str, param: str = "tools") -> ApiError:
    return ApiError(400, message, param=param)


@dataclass
class ToolPlan:
    """A request's tools (OpenAI's shape), the format its template writes calls in, whether to
    parse calls back (not for "none"), and the grammar that forces a call (None: free)."""

    tools: list
    fmt: "Format"
    parse: bool
    grammar: Optional[str]

    def calls(self, text: str) -> tuple:
        """(content, [{"id", "type", "function": {"name", "arguments"}}]) of a whole answer."""
        names = {t["function"]["name"] for t in self.tools}
        content, calls = self.fmt.parse(text) if self.parse else (text, [])
        calls = [c for c in calls if c[0] in names]
        if not calls:
            return text, []
        return content, [{"id": self.fmt.call_id(), "type": "function",
                          "function": {"name": n, "arguments": a}} for n, a in calls]


# -- the request --------------------------------------------------------------------------------
def _tool(t, i: int) -> dict:
    where = f"tools[{i}]"
    if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(t.get("function"), dict):
        raise _fail(f"{where} must be {{\"type\": \"function\", \"function\": {{...}}}}")
    f = t["function"]
    if not isinstance(f.get("name"), str) or not NAME.match(f["name"]):
        raise _fail(f"{where}.function.name must be 1-64 letters, digits, '_' or '-', got {json.dumps(f.get('name'))}")
    if f.get("description") is not None and not isinstance(f["description"], str):
        raise _fail(f"{where}.function.description must be a string")
    params = f.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(params, dict):
        raise _fail(f"{where}.function.parameters must be a JSON Schema object")
    bad, messages = _validate(params)
    if bad:
        raise _fail(f"{where}.function.parameters: the schema cannot be used: {messages}")
    return {"type": "function", "function": {**{k: v for k, v in f.items() if k in ("name", "description")},
                                             "parameters": params}}


def _validate(params: dict) -> tuple:
    try:
        check_grammar(json_grammar(params, "tools"), "tools")
        return False, ""
    except ApiError as e:
        return True, e.message.split(": ", 2)[-1]


def plan(body: dict, chat: bool, template: Optional[str]) -> Optional[ToolPlan]:
    """The request's tool plan (None without tools); ApiError 400 for malformed tools, an unknown
    function in tool_choice, or a chat template that does not render tools."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if tools is None or tools == []:
        if choice not in (None, "none", "auto"):
            raise _fail("'tool_choice' needs 'tools'", "tool_choice")
        return None
    if not chat:
        raise _fail("'tools' are for /v1/chat/completions")
    if not isinstance(tools, list):
        raise _fail("'tools' must be a list of functions")
    tools = [_tool(t, i) for i, t in enumerate(tools)]
    names = [t["function"]["name"] for t in tools]
    if len(set(names)) < len(names):
        raise _fail(f"'tools' names a function twice: {names}")
    if not isinstance(body.get("parallel_tool_calls", True), bool):
        raise _fail("'parallel_tool_calls' must be a boolean", "parallel_tool_calls")
    fmt = detect(template)
    choice = "auto" if choice is None else choice
    if isinstance(choice, dict):
        fn = choice.get("function") if choice.get("type") == "function" else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if name not in names:
            raise _fail(f"'tool_choice' names the function {json.dumps(name)}, which is not among the tools "
                        f"({', '.join(names)})", "tool_choice")
        return ToolPlan(tools, fmt, True, fmt.grammar([t for t in tools if t["function"]["name"] == name]))
    if choice not in ("auto", "none", "required"):
        raise _fail("'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                    f"\"function\": {{\"name\": ...}}}}, got {json.dumps(choice)[:80]}", "tool_choice")
    return ToolPlan(tools, fmt, choice != "none", fmt.grammar(tools) if choice == "required" else None)


def request(body: dict, req, template: Optional[str], harmony: bool = False) -> tuple:
    """(the grammar the answer follows or None, the tool plan or None) of a request's
    ``response_format``, ``tools`` and ``tool_choice``; its tool messages and assistant tool calls
    (in ``req.prompt``, as protocol left them) checked and shaped for the chat template.
    ``harmony``: the model replies in harmony (response_format then shapes its final channel)."""
    if req.chat:
        req.prompt = [message(m, f"messages[{i}]", req.prompt[:i]) if m["role"] == "tool" or "tool_calls" in m
                      else m for i, m in enumerate(req.prompt)]
    schema = response_schema(body)
    if schema is None:
        grammar = None
    else:
        grammar = harmony_answer_grammar(schema) if harmony and req.chat else json_grammar(schema)
    tools = plan(body, req.chat, template)
    if tools is not None and tools.grammar is not None:
        if grammar is not None:
            raise _fail("'response_format' cannot be combined with a 'tool_choice' that forces a call",
                        "response_format")
        grammar = tools.grammar
    return grammar, tools


def message(m: dict, where: str, earlier: list) -> dict:
    """A ``tool`` message, or an assistant message with ``tool_calls``, as chat templates take
    them (arguments as objects); ``earlier``: the messages before it (a tool message answers a
    call made in one of them)."""
    if m["role"] == "tool":
        call = m.get("tool_call_id")
        if not isinstance(call, str) or not call:
            raise _fail(f"{where}: a 'tool' message needs the 'tool_call_id' of the call it answers", "messages")
        made = {c["id"]: c["function"]["name"] for e in earlier for c in e.get("tool_calls") or ()}
        if call not in made:
            raise _fail(f"{where}: 'tool_call_id' {json.dumps(call)} answers no tool call of an earlier "
                        "assistant message", "messages")
        return {"role": "tool", "tool_call_id": call, "name": made[call],
                "content": _content_text(m.get("content"), where)}
    if m["role"] != "assistant" or not isinstance(m["tool_calls"], list) or not m["tool_calls"]:
        raise _fail(f"{where}: 'tool_calls' must be a non-empty list, on an assistant message", "messages")
    calls = []
    for j, c in enumerate(m["tool_calls"]):
        w = f"{where}.tool_calls[{j}]"
        f = c.get("function") if isinstance(c, dict) else None
        if not isinstance(f, dict) or not isinstance(c.get("id"), str) or not isinstance(f.get("name"), str) \
                or c.get("type", "function") != "function":
            raise _fail(f"{w} must be {{\"id\", \"type\": \"function\", \"function\": {{\"name\", \"arguments\"}}}}",
                        "messages")
        try:
            args = json.loads(f.get("arguments") or "{}")
        except (TypeError, ValueError):
            args = None
        if not isinstance(args, dict):
            raise _fail(f"{w}.function.arguments must be a JSON object in a string", "messages")
        calls.append({"id": c["id"], "type": "function", "function": {"name": f["name"], "arguments": args}})
    content, reasoning = m.get("content"), m.get("reasoning_content")
    if reasoning is not None and not isinstance(reasoning, str):
        raise _fail(f"{where}: 'reasoning_content' must be a string", "messages")
    return {"role": "assistant", "content": "" if content is None else _content_text(content, where),
            "tool_calls": calls, **({} if reasoning is None else {"reasoning_content": reasoning})}
