"""The harmony format of GPT-OSS's replies, read token by token.

A reply (after the prompt's ``<|start|>assistant``) is a series of messages
``[<|start|>ROLE][ to=RECIPIENT]<|channel|>CHANNEL[ to=RECIPIENT][ <|constrain|>TYPE]<|message|>TEXT``,
each closed by ``<|end|>`` (another message follows), ``<|call|>`` (a tool call: the reply stops
for its result) or ``<|return|>`` (the reply's end). Channels: ``analysis`` is the model's
reasoning, ``final`` the answer, ``commentary`` a tool call (``to=functions.NAME``, the text its
arguments) or, with no recipient, a preamble meant for the user. The structure lives in special
tokens, which decoded text drops: so the reply is split by ids, each message's text decoded on
its own."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from .stream_decoder import StreamDecoder

TOKENS = ("start", "channel", "message", "end", "call", "return", "constrain")
LOOSE_HEADER = 64  # header tokens without <|channel|> / <|message|>: the model is not writing harmony


@dataclass(frozen=True)
class Harmony:
    """A tokenizer's harmony token ids."""

    name = "harmony"
    start: int
    channel: int
    message: int
    end: int
    call: int
    ret: int
    constrain: int

    @classmethod
    def of(cls, hf, template: Optional[str]) -> Optional["Harmony"]:
        """The ids if ``template`` writes harmony and ``hf`` (a ``tokenizers.Tokenizer``) has them all."""
        if not template or "<|channel|>" not in template:
            return None
        ids = [hf.token_to_id(f"<|{name}|>") for name in TOKENS]
        return None if None in ids else cls(*ids)

    def stop_ids(self, ids) -> set:
        """A reply's stop tokens: <|end|> closes a message, not the reply; <|call|> and <|return|> end it."""
        return (set(ids) - {self.end}) | {self.call, self.ret}

    def parser(self, tokenizer, functions: Optional[set] = None) -> "ReplyParser":
        return ReplyParser(tokenizer, self, functions)


@dataclass
class Part:
    """A piece of a reply: ``kind`` "reasoning", "content", "call" (a tool call begins: ``text`` is
    the function's name) or "arguments" (of the call begun last)."""

    kind: str
    text: str


class ReplyParser:
    """A reply's token ids, pushed one at a time, into Parts. ``functions``: the names a call may
    go to (others, and every call when None, are the model's reasoning: nothing runs them)."""

    def __init__(self, tokenizer, harmony: Harmony, functions: Optional[set] = None):
        self.tok, self.h, self.functions = tokenizer, harmony, functions
        self.header: list = []  # this message's header: ordinary ids and the <|channel|> / <|constrain|> ids
        self.state = "header"   # the prompt ends with "<|start|>assistant"
        self.sink, self.decoder = "content", None

    def push(self, token: int) -> list:
        h = self.h
        if self.state == "body":
            if token in (h.end, h.call, h.ret):
                parts = self._text(self.decoder.flush())
                self.state, self.decoder = "between", None
                return parts
            if token in (h.start, h.channel, h.message, h.constrain):  # misplaced structure: skipped
                return []
            return self._text(self.decoder.push(token))
        if self.state == "between":
            if token == h.start or token == h.channel:  # (a message may leave its role out)
                self.state, self.header = "header", [token] if token == h.channel else []
                return []
            if token in (h.end, h.call, h.ret, h.message, h.constrain):
                return []
            return self._open("content", [token])  # text outside any message: shown
        if token == h.message:  # the header is complete
            return self._open(*self._route())
        if token in (h.end, h.call, h.ret):  # a header with no text
            self.state, self.header = "between", []
            return []
        if token == h.start:
            self.header = []
            return []
        self.header.append(token)
        if len(self.header) > LOOSE_HEADER and h.channel not in self.header:
            return self._open("content", [t for t in self.header if t != h.constrain])
        return []

    def flush(self) -> list:
        """The parts held back, at the reply's end (a cut-off message's last characters; text
        that never became a message's header)."""
        if self.state == "body":
            parts, self.state = self._text(self.decoder.flush()), "between"
            return parts
        if self.state == "header" and self.header and self.h.channel not in self.header:
            text = self.tok.decode([t for t in self.header if t != self.h.constrain])
            self.header, self.state = [], "between"
            return [Part("content", text)] if text else []
        return []

    def _route(self) -> tuple:
        """(sink, first ids) of the message whose header is complete."""
        h = self.h
        at = self.header.index(h.channel) if h.channel in self.header else len(self.header)
        role = self.tok.decode(self.header[:at])
        rest = self.header[at + 1:]
        rest = rest[:rest.index(h.constrain)] if h.constrain in rest else rest
        channel_text = self.tok.decode(rest)
        channel = channel_text.split()[0] if channel_text.split() else None
        to = re.search(r"to=(\S+)", role + " " + channel_text)
        recipient = to.group(1) if to else None
        self.header = []
        if recipient is not None:
            name = recipient[len("functions."):] if recipient.startswith("functions.") else None
            if name and self.functions is not None and name in self.functions:
                return "call", [], name
            return "reasoning", []
        if channel in ("final", "commentary") or at == 0 and channel is None:
            return "content", []
        return "reasoning", []  # analysis, or a channel harmony does not have

    def _open(self, sink: str, ids: list, name: Optional[str] = None) -> list:
        self.state, self.header = "body", []
        self.sink = "arguments" if sink == "call" else sink
        self.decoder = StreamDecoder(self.tok)
        parts = [Part("call", name)] if sink == "call" else []
        for t in ids:
            parts += self._text(self.decoder.push(t))
        return parts

    def _text(self, text: str) -> list:
        return [Part(self.sink, text)] if text else []


def parse(tokenizer, fmt, ids, functions: Optional[set] = None) -> dict:
    """A whole reply of a reply format (``Harmony``, ``gemma4_reply.Gemma4Replies``): {"reasoning": str,
    "content": str, "calls": [(name, arguments)]}."""
    parser = fmt.parser(tokenizer, functions)
    parts = [p for t in ids for p in parser.push(int(t))] + parser.flush()
    return assemble(parts)


def assemble(parts: list) -> dict:
    out = {"reasoning": "", "content": "", "calls": []}
    for p in parts:
        if p.kind == "call":
            out["calls"].append([p.text, ""])
        elif p.kind == "arguments":
            out["calls"][-1][1] += p.text
        else:
            out[p.kind] += p.text
    out["calls"] = [tuple(c) for c in out["calls"]]
    return out
