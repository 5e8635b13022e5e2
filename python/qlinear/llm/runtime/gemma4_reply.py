"""Gemma 4's replies, read by their markers: ``<|channel>thought\\n...<channel|>`` is the model's
reasoning, ``<|tool_call>call:NAME{ARGS}<tool_call|>`` a tool call (its arguments in Gemma's own
syntax: strings between ``<|"|>`` marks, bare keys, JSON's numbers, booleans, lists and
objects otherwise), the rest the answer; the reply stops at ``<|tool_response>`` (a call waits
for its result) or ``<turn|>``. Markers that are special tokens (which decoded text drops) are
put back in the text by id, so one reader serves tokenizers that have them as tokens or as text."""

from __future__ import annotations

import json
import re
from typing import Optional

from .harmony import Part
from .stream_decoder import StreamDecoder

CHANNEL, CHANNEL_END, CALL, CALL_END = "<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>"
QUOTE, RESPONSE, TURN_END = '<|"|>', "<|tool_response>", "<turn|>"
MARKERS = (CHANNEL, CHANNEL_END, CALL, CALL_END, QUOTE, RESPONSE, TURN_END)
CALL_TEXT = re.compile(r"\s*call:([A-Za-z0-9_.-]+)\s*(\{.*\})\s*$", re.S)


class Gemma4Replies:
    """A tokenizer's Gemma 4 markers: those that are single tokens, by id."""

    name = "gemma4"

    def __init__(self, ids: dict):
        self.ids = ids  # marker -> token id

    @classmethod
    def of(cls, hf, template: Optional[str]) -> Optional["Gemma4Replies"]:
        if not template or CALL not in template or CHANNEL not in template:
            return None
        return cls({m: i for m in MARKERS if (i := hf.token_to_id(m)) is not None})

    def stop_ids(self, ids) -> set:
        """A reply also stops at <|tool_response>: its calls' results come next."""
        return set(ids) | ({self.ids[RESPONSE]} if RESPONSE in self.ids else set())

    def parser(self, tokenizer, functions: Optional[set] = None) -> "Gemma4Parser":
        return Gemma4Parser(tokenizer, self, functions)


class Gemma4Parser:
    """A reply's token ids, pushed one at a time, into Parts (runtime.harmony's): reasoning and
    content as they come (text that may be a marker's start held back), each call once it is
    complete. ``functions``: the names a call may go to (a call of another, or one that does not
    parse, stays text)."""

    def __init__(self, tokenizer, fmt: Gemma4Replies, functions: Optional[set] = None):
        self.tok, self.functions = tokenizer, functions
        self.marker_of = {i: m for m, i in fmt.ids.items()}
        self.decoder = StreamDecoder(tokenizer)
        self.buf, self.state = "", "content"

    def push(self, token: int) -> list:
        marker = self.marker_of.get(token)
        if marker is None:
            return self._feed(self.decoder.push(token), end=False)
        text = self.decoder.flush() + marker
        self.decoder = StreamDecoder(self.tok)
        return self._feed(text, end=False)

    def flush(self) -> list:
        return self._feed(self.decoder.flush(), end=True)

    def _feed(self, text: str, end: bool) -> list:
        self.buf += text
        parts: list = []
        while self.buf and self.state != "done":
            if self.state == "name":  # the channel's name, up to its line's end
                at = self.buf.find("\n")
                close = self.buf.find(CHANNEL_END)
                if at < 0 and close < 0 and not end:
                    break
                at = at + 1 if at >= 0 and (close < 0 or at < close) else (close if close >= 0 else len(self.buf))
                self.buf, self.state = self.buf[at:], "thought"
                continue
            if self.state == "call":
                at = self.buf.find(CALL_END)
                if at < 0 and not end:
                    break
                body = self.buf if at < 0 else self.buf[:at]
                self.buf = "" if at < 0 else self.buf[at + len(CALL_END):]
                parts += self._call(body, closed=at >= 0)
                self.state = "content"
                continue
            # (the template closes a thought with "\n<channel|>": that line break is not the reasoning's)
            ends = ("\n" + CHANNEL_END, CHANNEL_END) if self.state == "thought" else (CHANNEL, CALL, RESPONSE, TURN_END)
            found = [(i, m) for m in ends if (i := self.buf.find(m)) >= 0]
            if not found:
                hold = 0 if end else max((k for m in ends for k in range(1, len(m)) if self.buf.endswith(m[:k])),
                                         default=0)
                parts += self._text(self.buf[:len(self.buf) - hold])
                self.buf = self.buf[len(self.buf) - hold:]
                break
            at, marker = min(found)
            parts += self._text(self.buf[:at])
            self.buf = self.buf[at + len(marker):]
            self.state = {CHANNEL: "name", CALL: "call", CHANNEL_END: "content",
                          "\n" + CHANNEL_END: "content"}.get(marker, "done")
        return parts

    def _text(self, text: str) -> list:
        for m in self.marker_of.values():  # a misplaced marker token: dropped, as decoding drops special tokens
            text = text.replace(m, "")
        return [Part("reasoning" if self.state == "thought" else "content", text)] if text else []

    def _call(self, body: str, closed: bool) -> list:
        m = CALL_TEXT.match(body)
        args = None
        if m and self.functions is not None and m.group(1) in self.functions:
            try:
                args, at = _value(m.group(2), 0)
                args = args if at == len(m.group(2)) and isinstance(args, dict) else None
            except (ValueError, IndexError):
                args = None
        if args is None:  # not a call of an offered function: the text as the model wrote it
            return self._text(CALL + body + (CALL_END if closed else ""))
        return [Part("call", m.group(1)), Part("arguments", json.dumps(args, ensure_ascii=False))]


def _value(s: str, i: int) -> tuple:
    """(value, index after it) of Gemma's argument syntax at s[i:]."""
    while s[i] in " \n\t":
        i += 1
    if s.startswith(QUOTE, i):
        j = s.index(QUOTE, i + len(QUOTE))
        return s[i + len(QUOTE):j], j + len(QUOTE)
    if s[i] in "{[":
        close, out, i = ("}" if s[i] == "{" else "]"), ({} if s[i] == "{" else []), i + 1
        while True:
            while s[i] in " \n\t,":
                i += 1
            if s[i] == close:
                return out, i + 1
            if close == "]":
                v, i = _value(s, i)
                out.append(v)
                continue
            if s.startswith(QUOTE, i):
                key, i = _value(s, i)
            else:
                j = s.index(":", i)
                key, i = s[i:j].strip(), j
            if s[i] != ":":
                raise ValueError("a key without a value")
            out[key], i = _value(s, i + 1)
    j = i
    while j < len(s) and s[j] not in ",}]":
        j += 1
    word = s[i:j].strip()
    return (None if word == "None" else json.loads(word)), j  # (the template writes a null as None)

