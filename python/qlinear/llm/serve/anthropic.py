"""Anthropic's Messages API: ``POST /v1/messages`` and ``POST /v1/messages/count_tokens`` over the
server's generation path (``engine``: the chat template with tools, the reply format's reasoning
and calls, the scheduler, stop strings, the prefix cache, the metrics).

The request becomes an OpenAI-shaped chat request (``anthropic_request``); the reply's deltas
(text, reasoning, tool calls: what the OpenAI stream carries) become content blocks, streamed as
Anthropic's events (message_start, a ping, content_block_start / _delta / _stop per block,
message_delta, message_stop). The whole message is those events assembled: both answers come from
the same blocks. Errors have Anthropic's shape: {"type": "error", "error": {"type", "message"}}."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from . import protocol, tools
from .anthropic_request import translate
from .engine import Engine, Job, cancel_on_disconnect, events_of
from .protocol import ApiError

PATH = "/v1/messages"
KINDS = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
         404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error"}


def error_body(exc: ApiError) -> dict:
    kind = KINDS.get(exc.status, "api_error" if exc.status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": exc.message}}


def _event(kind: str, data: dict) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data}, separators=(',', ':'))}\n\n"


def _object(text: str):
    try:
        value = json.loads(text) if text.strip() else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class Blocks:
    """A reply's deltas ({"content", "reasoning_content", "tool_calls"} as the OpenAI stream has
    them) as content blocks (``content``) and the events that build them. A tool_use block's input
    goes out whole when the block ends: a call's arguments that are not a JSON object (possible
    only when the call is not forced) come back as {}."""

    def __init__(self, thinking: bool):
        self.content: list = []
        self.thinking = thinking  # reasoning as thinking blocks (else dropped)
        self.kind = None          # the open block's type
        self.args = ""            # the open tool_use block's arguments so far

    def push(self, delta: dict) -> list:
        out = []
        if self.thinking and delta.get("reasoning_content"):
            out += self._write("thinking", delta["reasoning_content"])
        if delta.get("content"):
            out += self._write("text", delta["content"])
        for call in delta.get("tool_calls") or ():
            if "id" in call:
                out += self.close() + self._open({"type": "tool_use", "id": "toolu_" + uuid.uuid4().hex[:24],
                                                  "name": call["function"]["name"], "input": {}})
            self.args += call["function"].get("arguments") or ""
        return out

    def _open(self, block: dict) -> list:
        self.content.append(block)
        self.kind = block["type"]
        return [("content_block_start", {"index": len(self.content) - 1, "content_block": dict(block)})]

    def _write(self, kind: str, text: str) -> list:
        out = [] if self.kind == kind else self.close() + self._open(
            {"type": kind, kind: "", **({"signature": ""} if kind == "thinking" else {})})
        self.content[-1][kind] += text
        return out + [("content_block_delta", {"index": len(self.content) - 1,
                                               "delta": {"type": f"{kind}_delta", kind: text}})]

    def close(self) -> list:
        if self.kind is None:
            return []
        out, index = [], len(self.content) - 1
        if self.kind == "tool_use":
            self.content[-1]["input"] = value = _object(self.args)
            if value:
                out.append(("content_block_delta", {"index": index, "delta": {
                    "type": "input_json_delta", "partial_json": json.dumps(value, ensure_ascii=False)}}))
            self.args = ""
        self.kind = None
        return out + [("content_block_stop", {"index": index})]


class Message:
    """One request's answer: its events as they come (``events``), then the whole message."""

    def __init__(self, model_name: str, job: Job, thinking: bool):
        self.job, self.model = job, model_name
        self.id = "msg_" + uuid.uuid4().hex[:24]
        self.blocks = Blocks(thinking)
        plan, text = job.plan, job.text
        self.calls = tools.ToolStream(plan) if plan is not None and plan.parse and not text.parsed else None
        self.count, self.stop_reason, self.stop_sequence = 0, None, None

    def usage(self) -> dict:
        """Anthropic's: input_tokens are the prompt's tokens not read from the prefix cache."""
        cached = self.job.seq.cached_tokens
        return {"input_tokens": self.job.prompt_tokens - cached, "output_tokens": self.count,
                "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}

    def whole(self, content: list) -> dict:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": content,
                "stop_reason": self.stop_reason, "stop_sequence": self.stop_sequence, "usage": self.usage()}

    def _delta(self, value) -> dict:
        if self.job.text.parsed:
            return value
        if self.calls is None:
            return {"content": value}
        content, calls = self.calls.push(value)
        return {"content": content, "tool_calls": calls}

    async def events(self) -> AsyncIterator[tuple]:
        """("started", None) once the sequence has begun (its cached tokens known), the content
        blocks' events, then ("done", None), or ("error", message)."""
        started = False
        async for kind, value in events_of(self.job):
            if not started:
                started = True
                yield "started", None
            if kind in ("token", "piece"):
                self.count += kind == "token"
                for e in self.blocks.push(self._delta(value)):
                    yield e
            elif kind == "error":
                yield kind, value
                return
            else:
                if self.calls is not None:  # the text held back: content, or the last call
                    tail, calls = self.calls.flush()
                    for e in self.blocks.push({"content": tail, "tool_calls": calls}):
                        yield e
                for e in self.blocks.close():
                    yield e
                self._finish(value)
                yield "done", None

    def _finish(self, finish: str) -> None:
        cut = self.job.text.cut  # (streams.StopStrings)
        if finish == "length":
            self.stop_reason = "max_tokens"
        elif cut.stopped:
            self.stop_reason, self.stop_sequence = "stop_sequence", cut.matched
        else:
            used = any(b["type"] == "tool_use" for b in self.blocks.content)
            self.stop_reason = "tool_use" if used else "end_turn"

    async def stream(self) -> AsyncIterator[str]:
        try:
            async for kind, value in self.events():
                if kind == "started":
                    yield _event("message_start", {"message": self.whole([])})
                    yield _event("ping", {})
                elif kind == "error":
                    yield _event("error", error_body(ApiError(500, f"generation failed: {value}")))
                elif kind == "done":
                    yield _event("message_delta", {"delta": {"stop_reason": self.stop_reason,
                                                             "stop_sequence": self.stop_sequence},
                                                   "usage": self.usage()})
                    yield _event("message_stop", {})
                else:
                    yield _event(kind, value)
        finally:  # finished, failed or the client went away
            self.job.seq.cancel()


def routes(engine: Engine) -> list:
    """The Messages API's routes over ``engine``."""
    vocab, short_ids = engine.model.config.vocab_size, "[TOOL_CALLS]" in (engine.tokenizer.chat_template or "")

    async def checked(request: Request, counting: bool) -> tuple:
        engine.check_auth(request)
        body = protocol.parse_json(await request.body())
        ask = translate(body, counting, short_ids)
        req = protocol.parse_request(ask.body, True, engine.model_name, vocab)
        req.stop = ask.stop
        return ask, req

    async def messages(request: Request):
        ask, req = await checked(request, counting=False)
        job = engine.start(request, ask.body, req, top_k=ask.top_k)
        message = Message(engine.model_name, job, ask.thinking and engine.parsed)
        if req.stream:
            return StreamingResponse(message.stream(), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        watcher = asyncio.ensure_future(cancel_on_disconnect(request, job.seq))
        try:
            async for kind, value in message.events():
                if kind == "error":
                    raise ApiError(500, f"generation failed: {value}", kind="server_error")
        finally:
            watcher.cancel()
            job.seq.cancel()
        return JSONResponse(message.whole(message.blocks.content))

    async def count_tokens(request: Request):
        ask, req = await checked(request, counting=True)
        return JSONResponse({"input_tokens": len(engine.prepare(ask.body, req)[2])})

    return [Route(PATH, messages, methods=["POST"]), Route(PATH + "/count_tokens", count_tokens, methods=["POST"])]
