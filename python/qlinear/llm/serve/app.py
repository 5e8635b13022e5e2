"""The HTTP side: a Starlette app with the OpenAI endpoints (and Anthropic's Messages:
``anthropic``) over a Scheduler.

Requests are checked and tokenized on the event loop, then handed to the scheduler's thread;
its tokens come back through an asyncio queue per request and leave as one JSON body or as
server-sent events. A client that disconnects cancels its sequence."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import threading
import time
from typing import AsyncIterator, Optional

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from ..runtime.model import Model
from ..runtime.speculative import Speculation
from . import anthropic, metrics as prometheus, openapi, protocol, replies, tools
from .engine import Engine, cancel_on_disconnect, events_of
from .logprobs import LogprobFormat
from .protocol import ApiError
from .scheduler import Scheduler


def _yield_to_decode(niceness: int = 5) -> None:
    """Lower this thread's (the event loop's) priority below the decode threads', started before
    it: on a CPU the step saturates, the HTTP work of streaming clients (~0.12 ms of CPU per token
    sent, Zen 4) then waits for the step's gaps rather than slowing it (8 clients on 2 cores: 506-533
    -> 540-565 tok/s). Linux sets priorities per thread; elsewhere this would apply to the whole
    process, so it is left alone there."""
    if sys.platform.startswith("linux") and hasattr(os, "setpriority"):
        tid = threading.get_native_id()
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + niceness))


def _sse(obj) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


def create_app(model: Model, model_name: str, max_batch: int = 8, max_queue: int = 64,
               api_key: Optional[str] = None, speculation: Optional[Speculation] = None,
               cache_mb: float = 512) -> Starlette:
    """The server's ASGI app; its lifespan starts and stops the scheduler thread. ``speculation``:
    every request's speculative decoding unless the request says otherwise (its ``speculative``
    field); its draft model, if any, serves the requests that ask for "draft". ``cache_mb``: the
    prefix cache's budget (prompts' KV rows kept for the requests that start alike; 0: none)."""
    scheduler = Scheduler(model, max_batch=max_batch, max_queue=max_queue, cache_mb=cache_mb)
    metrics = prometheus.Metrics(scheduler)
    engine = Engine(model, model_name, scheduler, metrics, api_key, speculation)
    check_auth, tokenizer, created = engine.check_auth, model.tokenizer, int(time.time())

    async def generate(request: Request, chat: bool):
        check_auth(request)
        body = protocol.parse_json(await request.body())
        job = engine.start(request, body, protocol.parse_request(body, chat, model_name, model.config.vocab_size))
        req, seq, text, plan = job.req, job.seq, job.text, job.plan
        answer = protocol.Answer(chat, model_name)
        logprobs = None if req.logprobs is None else LogprobFormat(tokenizer, chat)
        if req.stream:
            return StreamingResponse(stream(job, answer, logprobs), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        watcher = asyncio.ensure_future(cancel_on_disconnect(request, seq))
        try:
            pieces, count, finish = [], 0, None
            async for kind, value in events_of(job):
                if kind in ("token", "piece"):
                    count += kind == "token"
                    pieces.append(value)
                elif kind == "error":
                    raise ApiError(500, f"generation failed: {value}", kind="server_error")
                else:
                    finish = value
        finally:
            watcher.cancel()
            seq.cancel()
        use = protocol.usage(job.prompt_tokens, count, seq.cached_tokens)
        entries = logprobs and logprobs(seq.entries[:count])
        if text.parsed:
            reply = replies.message(pieces)
            finish = "tool_calls" if reply["tool_calls"] and finish == "stop" else finish
            return JSONResponse(answer.complete(reply["content"], finish, use, entries, reply["reasoning_content"],
                                                reply["tool_calls"]))
        whole = answer.complete("".join(pieces), finish, use, entries)
        return JSONResponse(whole if plan is None or not plan.parse else tools.answer(plan, whole))

    async def stream(job, answer, logprobs) -> AsyncIterator[str]:
        seq, text, req, plan = job.seq, job.text, job.req, job.plan
        count = sent = 0  # the tokens seen, and those whose logprobs went out (a chunk carries those before it)
        calls = tools.ToolStream(plan) if plan is not None and plan.parse and not text.parsed else None
        called = False  # a parsed reply's tool call went out

        def part():
            nonlocal sent
            entries, sent = seq.entries[sent:count], count
            return logprobs(entries) if logprobs and entries else None

        try:
            if req.chat:
                yield _sse(answer.chunk("", first=True))
            async for kind, value in events_of(job):
                if kind in ("token", "piece") and text.parsed:
                    count += kind == "token"
                    called |= "tool_calls" in value
                    if value:
                        yield _sse(answer.chunk(value.get("content"), logprobs=part(), tool_calls=value.get("tool_calls"),
                                                reasoning=value.get("reasoning_content")))
                elif kind in ("token", "piece"):
                    count += kind == "token"
                    value, deltas = (value, None) if calls is None else calls.push(value)
                    if value or deltas:
                        yield _sse(answer.chunk(value or None, logprobs=part(), tool_calls=deltas))
                elif kind == "error":
                    yield _sse(ApiError(500, f"generation failed: {value}", kind="server_error").body())
                else:
                    if calls is not None:  # the text held back: content, or the last calls
                        tail, deltas = calls.flush()
                        if tail or deltas:
                            yield _sse(answer.chunk(tail or None, tool_calls=deltas))
                        value = "tool_calls" if calls.count else value
                    value = "tool_calls" if called and value == "stop" else value
                    yield _sse(answer.chunk(None, finish_reason=value, logprobs=part()))
                    if req.include_usage:
                        yield _sse(answer.usage_chunk(protocol.usage(job.prompt_tokens, count, seq.cached_tokens)))
            yield "data: [DONE]\n\n"
        finally:  # finished, failed or the client went away
            seq.cancel()

    async def chat_completions(request: Request):
        return await generate(request, chat=True)

    async def completions(request: Request):
        return await generate(request, chat=False)

    async def models(request: Request):
        check_auth(request)
        return JSONResponse(protocol.models_list(model_name, created))

    async def documents(request: Request):  # /metrics and /openapi.json: the key as for /v1/models
        check_auth(request)
        return metrics.response() if request.url.path == "/metrics" else JSONResponse(openapi.document(model_name))

    async def health(request: Request):
        spec = scheduler.speculative  # speculative sequences' figures
        return JSONResponse({"status": "ok", "model": model_name, "running": scheduler.running,
                             "waiting": scheduler.waiting, "decode_steps": scheduler.decode_steps,
                             "decoded_tokens": scheduler.decoded_tokens,
                             "decode_seconds": round(scheduler.decode_seconds, 6),
                             "prefix_cache": scheduler.prefix.figures(),
                             "speculative": {"draft_tokens": spec.draft_tokens, "accepted_tokens": spec.accepted_tokens,
                                             "acceptance_rate": round(spec.acceptance_rate, 4),
                                             "verifications": spec.decode_steps,
                                             "tokens_per_step": round(spec.tokens_per_step, 4)}})

    async def api_error(request: Request, exc: ApiError, headers=None):  # Anthropic's shape on its routes
        body = anthropic.error_body(exc) if request.url.path.startswith(anthropic.PATH) else exc.body()
        return JSONResponse(body, status_code=exc.status, headers=headers)

    async def http_error(request: Request, exc: HTTPException):  # its headers kept (a 405's Allow)
        return await api_error(request, ApiError(exc.status_code, exc.detail), exc.headers)

    async def server_error(request: Request, exc: Exception):
        return await api_error(request, ApiError(500, f"{type(exc).__name__}: {exc}", kind="server_error"))

    @contextlib.asynccontextmanager
    async def lifespan(app):
        scheduler.start()
        _yield_to_decode()
        try:
            yield
        finally:
            await asyncio.get_running_loop().run_in_executor(None, scheduler.stop)

    app = Starlette(routes=[
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        *[Route(path, documents, methods=["GET"]) for path in ("/metrics", "/openapi.json")],
        *anthropic.routes(engine),
    ], exception_handlers={ApiError: api_error, HTTPException: http_error, Exception: server_error},
        lifespan=lifespan, middleware=[metrics.middleware()])
    app.state.scheduler = scheduler
    return app
