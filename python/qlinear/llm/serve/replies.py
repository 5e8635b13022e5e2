"""Replies in a reply format (GPT-OSS's harmony, Gemma 4's markers: ``runtime.harmony``,
``runtime.gemma4_reply``) in OpenAI's chat shape: the reasoning (harmony's analysis channel,
Gemma 4's thought channel) as ``reasoning_content``, the answer (harmony's final channel and
commentary preambles) as ``content``, calls to offered functions as ``tool_calls``
(``finish_reason`` "tool_calls"); streamed as deltas of the same fields. Stop strings cut the
content only."""

from __future__ import annotations

import uuid
from typing import Optional

from ..runtime.harmony import parse
from .streams import StopStrings


def functions(plan) -> Optional[set]:
    """The names a reply's calls may go to (None: calls are not parsed back)."""
    return {t["function"]["name"] for t in plan.tools} if plan is not None and plan.parse else None


class ReplyText:
    """A sequence's token ids to delta dicts ({"content", "reasoning_content", "tool_calls"}, each
    only when there is some), with TextStream's interface."""

    parsed = True

    def __init__(self, tokenizer, stop: list, plan=None):
        self.parser = tokenizer.replies.parser(tokenizer, functions(plan))
        self.cut, self.calls = StopStrings(stop), 0

    @property
    def stopped(self) -> bool:
        return self.cut.stopped

    def push(self, token: int) -> dict:
        return self._delta(self.parser.push(token), hold_back=True)

    def flush(self) -> dict:
        return self._delta(self.parser.flush(), hold_back=False)

    def _delta(self, parts: list, hold_back: bool) -> dict:
        content, reasoning, calls = "", "", []
        for p in parts:
            if self.cut.stopped:
                break
            if p.kind == "content":
                content += self.cut.push(p.text)
            elif p.kind == "reasoning":
                reasoning += p.text
            elif p.kind == "call":
                calls.append({"index": self.calls, "id": "call_" + uuid.uuid4().hex[:24], "type": "function",
                              "function": {"name": p.text, "arguments": ""}})
                self.calls += 1
            else:
                calls.append({"index": self.calls - 1, "function": {"arguments": p.text}})
        if not hold_back and not self.cut.stopped:
            content += self.cut.push("", hold_back=False)
        return {k: v for k, v in (("content", content), ("reasoning_content", reasoning), ("tool_calls", calls)) if v}


def message(deltas: list) -> dict:
    """The whole reply of a request's deltas: {"content" (None if empty), "reasoning_content",
    "tool_calls"}."""
    content = "".join(d.get("content", "") for d in deltas)
    reasoning = "".join(d.get("reasoning_content", "") for d in deltas)
    calls: list = []
    for d in deltas:
        for c in d.get("tool_calls", ()):
            if "id" in c:
                calls.append({"id": c["id"], "type": "function", "function": dict(c["function"])})
            else:
                calls[c["index"]]["function"]["arguments"] += c["function"]["arguments"]
    return {"content": content or None if calls else content, "reasoning_content": reasoning, "tool_calls": calls}


def template_messages(tokenizer, messages: list) -> list:
    """Messages for a harmony template: an assistant's ``reasoning_content`` as its ``thinking``
    (the template keeps a call's reasoning until the final answer after it). Gemma 4's reads
    ``reasoning_content`` itself."""
    if tokenizer.replies is None or tokenizer.replies.name != "harmony":
        return messages
    out = []
    for m in messages:
        if m.get("role") == "assistant" and m.get("reasoning_content"):
            m = {**m, "thinking": m["reasoning_content"]}
            if m.get("tool_calls") and m.get("content"):  # the template takes one or the other
                m["thinking"], m["content"] = m["content"] + "\n" + m["thinking"], ""
        out.append(m)
    return out


def final_text(tokenizer, ids: list) -> str:
    """A reply's answer (harmony's final channel), as the next turn's prompt carries it."""
    return parse(tokenizer, tokenizer.replies, ids)["content"]
