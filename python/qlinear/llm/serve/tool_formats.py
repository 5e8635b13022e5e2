"""Tool-call formats: how a model family writes a call (Qwen's ``<tool_call>``, Llama 3's JSON,
Mistral's ``[TOOL_CALLS]`` list, GPT-OSS's harmony commentary), parsed back into OpenAI's ``tool_calls``, constrained by a grammar
(``tool_choice`` required / named), and split into OpenAI's streamed deltas."""

from __future__ import annotations

import json
import re
import uuid
from typing import Optional

from .protocol import ApiError
from .structured import JSON_OPTIONS, _llguidance, check_grammar


def _lark(s: str) -> str:
    return json.dumps(s)  # a Lark string literal (JSON's escapes)


def _args(tool: dict) -> str:
    return "%json " + json.dumps({**tool["function"]["parameters"], "x-guidance": JSON_OPTIONS})


class Format:
    """A model family's tool-call text: ``head`` and ``tail`` around each call's JSON object
    (``{key_name: name, key_args: arguments}``), ``opener`` where calls may start (streaming
    holds text back from there)."""

    def __init__(self, name: str, opener: str, head: str, tail: str, key_args: str):
        self.name, self.opener, self.head, self.tail, self.key_args = name, opener, head, tail, key_args

    def call_id(self) -> str:
        """A new call's id; Mistral's templates take 9 letters or digits only (else they raise)."""
        return uuid.uuid4().hex[:9] if self.name == "mistral" else "call_" + uuid.uuid4().hex[:24]

    def grammar(self, tools: list) -> str:
        """One call of one of ``tools``, its arguments valid under the function's parameters."""
        rules = [f"call_{i}: {_lark(self.head + json.dumps({'name': t['function']['name']})[:-1] + ', ')} "
                 f"{_lark(json.dumps(self.key_args) + ': ')} args_{i} {_lark('}' + self.tail)}\n"
                 f"args_{i}: {_args(t)}" for i, t in enumerate(tools)]
        return check_grammar(json_lark("start: " + " | ".join(f"call_{i}" for i in range(len(tools))) + "\n"
                                       + "\n".join(rules)), "tools")

    def parse(self, text: str) -> tuple:
        """(content, [(name, arguments JSON)]) of a model's answer; no calls if none parse."""
        if self.name == "qwen":
            found = list(re.finditer(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", text, re.S))
            objs = [_json(m.group(1)) for m in found]
            content = text[:found[0].start()] if found else text
        else:  # the whole answer is the JSON (the special token before it is not in the text)
            value = _json(text.strip()) if text.strip().startswith(self.opener) else None
            objs, content = value if isinstance(value, list) else [value], ""
        calls = []
        for o in objs:
            if not isinstance(o, dict) or not isinstance(o.get("name"), str):
                return text, []
            args = o.get(self.key_args, o.get("arguments", o.get("parameters", {})))
            if isinstance(args, str):
                args = _json(args)
            if not isinstance(args, dict):
                return text, []
            calls.append((o["name"], json.dumps(args, ensure_ascii=False)))
        return (content if calls else text), calls


def json_lark(lark: str) -> str:
    return _llguidance().LLMatcher.grammar_from_lark(lark)


def _json(s: str):
    try:
        return json.loads(s)
    except ValueError:
        return None


class HarmonyFormat(Format):
    """GPT-OSS's calls: a commentary message ``to=functions.NAME``, its text the arguments; the
    reply is read by channel (``serve.harmony``), so only the grammar is this class's."""

    def grammar(self, tools: list) -> str:
        """One call of one of ``tools`` after the model's reasoning, if it reasons first."""
        calls = [f"call_{i}: <|channel|> {_lark('commentary to=functions.' + t['function']['name'] + ' ')} "
                 f"<|constrain|> \"json\" <|message|> args_{i}\nargs_{i}: {_args(t)}" for i, t in enumerate(tools)]
        return check_grammar(json_lark("start: analysis? (" + " | ".join(f"call_{i}" for i in range(len(tools)))
                                       + ")\n" + HARMONY_ANALYSIS + "\n".join(calls)), "tools")


class Gemma4Format(Format):
    """Gemma 4's calls, ``<|tool_call>call:NAME{ARGS}<tool_call|>`` in its own argument syntax; the
    reply is read by its markers (``runtime.gemma4_reply``). A forced call would need that syntax
    as a grammar of the function's schema: not offered (a clear 400)."""

    def grammar(self, tools: list) -> str:
        raise ApiError(400, "'tool_choice' \"required\" or a named function is not supported for Gemma 4's call "
                            "format; use \"auto\"", param="tool_choice")


# a harmony reply's analysis message, then the next message's header up to its channel
HARMONY_ANALYSIS = 'analysis: <|channel|> "analysis" <|message|> /(?s:.*)/ <|end|> <|start|> "assistant"\n'


def harmony_answer_grammar(schema: dict) -> str:
    """A harmony reply whose answer (the final channel) is JSON under ``schema`` (response_format),
    after the model's reasoning if it reasons first."""
    body = "%json " + json.dumps({**schema, "x-guidance": JSON_OPTIONS})
    return json_lark(f'start: analysis? <|channel|> "final" <|message|> body\n{HARMONY_ANALYSIS}body: {body}')


QWEN = Format("qwen", "<tool_call>", "<tool_call>\n", "\n</tool_call>", "arguments")
HARMONY = HarmonyFormat("harmony", "", "", "", "arguments")
GEMMA4 = Gemma4Format("gemma4", "", "", "", "arguments")
LLAMA3 = Format("llama3", "{", "", "", "parameters")
MISTRAL = Format("mistral", "[", "[", "]", "arguments")


def detect(template: Optional[str]) -> Format:
    if not template or "tools" not in template:
        raise ApiError(400, "this model's chat template does not render tools, so the model cannot be offered any",
                       param="tools")
    if "<|channel|>" in template:
        return HARMONY
    if "<|tool_call>" in template:
        return GEMMA4
    if "[TOOL_CALLS]" in template:
        return MISTRAL
    if "<|python_tag|>" in template or "ipython" in template:
        return LLAMA3
    return QWEN


# -- answers ---------------------------------------------------------------------------------------
def answer(plan: ToolPlan, body: dict) -> dict:
    """A whole chat.completion with its text's calls as ``tool_calls`` (finish_reason "tool_calls")."""
    choice = body["choices"][0]
    content, calls = plan.calls(choice["message"]["content"])
    if calls:
        choice["message"].update(content=content if content.strip() else None, tool_calls=calls)
        choice["finish_reason"] = "tool_calls"
    return body


class ToolStream:
    """A streamed answer's text split into content deltas and tool-call deltas, as OpenAI streams
    them: content goes out as it comes until a call may begin (the format's opener; for the JSON
    formats, an answer that starts with it); a call goes out once its text is complete (Qwen's
    closing tag, or the answer's end), as a delta with its index, id and name, then its arguments."""

    def __init__(self, plan: ToolPlan):
        self.plan, self.fmt = plan, plan.fmt
        self.text, self.sent, self.calling, self.count = "", 0, False, 0

    def push(self, piece: str) -> tuple:
        """(content to send, [tool call deltas]) after ``piece``."""
        self.text += piece
        if not self.calling:
            opener = self.fmt.opener
            if self.fmt.name != "qwen":  # a JSON call is the whole answer
                head = self.text.lstrip()
                if self.sent == 0 and (not head or head.startswith(opener)):
                    self.calling = bool(head)
                    return "", []
                out, self.sent = self.text[self.sent:], len(self.text)
                return out, []
            at = self.text.find(opener, self.sent)
            if at < 0:  # hold back what may be the opener's start
                hold = max((k for k in range(1, len(opener)) if self.text.endswith(opener[:k])), default=0)
                out, self.sent = self.text[self.sent:len(self.text) - hold], len(self.text) - hold
                return out, []
            out, self.sent, self.calling = self.text[self.sent:at], at, True
            return out, self._complete()
        return "", self._complete() if self.fmt.name == "qwen" else []

    def _complete(self, end: bool = False) -> list:
        close = len(self.text) if end else self.text.rfind("</tool_call>") + len("</tool_call>")
        if close <= self.sent:
            return []
        _, calls = self.plan.calls(self.text[self.sent:close])
        if calls:
            self.sent = close
        return self._deltas(calls)

    def _deltas(self, calls: list) -> list:
        out = []
        for c in calls:
            out += [{"index": self.count, "id": c["id"], "type": "function",
                     "function": {"name": c["function"]["name"], "arguments": ""}},
                    {"index": self.count, "function": {"arguments": c["function"]["arguments"]}}]
            self.count += 1
        return out

    def flush(self) -> tuple:
        """(content, [tool call deltas]) at the end: the text held back is content if no call parses."""
        if not self.calling:
            out, self.sent = self.text[self.sent:], len(self.text)
            return out, []
        deltas = self._complete(end=True)
        if deltas or self.sent == len(self.text):
            return "", deltas
        out, self.sent = ("" if self.count else self.text[self.sent:]), len(self.text)
        return out, []
