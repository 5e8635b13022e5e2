"""The HTTP side: a Starlette app with the OpenAI endpoints over a Scheduler.

Requests are checked and tokenized on the event loop, then handed to the scheduler's thread;
its tokens come back through an asyncio queue per request and leave as one JSON body or as
server-sent events. A client that disconnects cancels its sequence."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import os
import sys
import threading
import time
from typing import AsyncIterator, Optional

import numpy as np

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from ..runtime.drafters import check_compatible
from ..runtime.generation import Sampling
from ..runtime.model import Model
from ..runtime.speculative import Speculation
from . import metrics as prometheus, openapi, protocol, replies, structured, tools
from .logprobs import LogprobFormat
from .protocol import ApiError
from .scheduler import QueueFull, Scheduler, SchedulerClosed
from .sequence import Sequence
from .streams import Mailbox, TextStream


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
    if speculation is not None and speculation.draft_model is not None:
        check_compatible(model, speculation.draft_model)
    tokenizer, max_context = model.tokenizer, model.max_context
    grammars = structured.Grammars(tokenizer, model.lm_rows)  # response_format's constraints
    created = int(time.time())
    parsed = tokenizer.replies is not None  # replies in a reply format (GPT-OSS's, Gemma 4's): serve.replies
    mailbox: Optional[Mailbox] = None  # of the event loop serving the requests

    def check_auth(request: Request) -> None:
        if api_key is None:
            return
        given = request.headers.get("authorization", "")
        if not (given.startswith("Bearer ") and hmac.compare_digest(given[7:].encode(), api_key.encode())):
            raise ApiError(401, "invalid or missing API key (Authorization: Bearer KEY)",
                           code="invalid_api_key", kind="authentication_error")

    def prompt_ids(req: protocol.GenerationRequest, plan: Optional[tools.ToolPlan]) -> list:
        if isinstance(req.prompt, str) or req.chat:
            try:
                return tokenizer.prompt_ids(replies.template_messages(tokenizer, req.prompt) if req.chat else req.prompt,
                                            tools=plan and plan.tools, **req.variables)
            except (ValueError, TypeError) as e:
                raise ApiError(400, str(e), param="messages" if req.chat else "prompt") from None
        if max(req.prompt) >= model.config.vocab_size:
            raise ApiError(400, f"token id {max(req.prompt)} is outside the vocabulary "
                                f"({model.config.vocab_size})", param="prompt")
        return req.prompt

    def bias_rows(bias: dict) -> Optional[tuple]:
        """A request's logit_bias as (lm head rows, values); tokens the (slimmed) head lacks are never sampled."""
        if not bias:
            return None
        row_of = None if model.lm_rows is None else {int(t): r for r, t in enumerate(model.lm_rows)}
        pairs = [(t if row_of is None else row_of.get(t), b) for t, b in bias.items()]
        pairs = [(r, b) for r, b in pairs if r is not None]
        return np.array([r for r, _ in pairs], np.intp), np.array([b for _, b in pairs], np.float32)

    def speculation_of(req: protocol.GenerationRequest) -> Optional[Speculation]:
        if req.speculative is None or (speculation is not None and req.speculative == speculation.method):
            return speculation
        if req.speculative == "none":
            return None
        if req.speculative == "draft":  # the server's default is n-gram lookup or none: no draft model
            raise ApiError(400, "'speculative': \"draft\" needs a server started with a draft model "
                                "(qlinear-llm serve --speculative draft --draft-model PATH)", param="speculative")
        return Speculation(req.speculative, **({} if speculation is None else {"max_draft": speculation.max_draft}))

    async def generate(request: Request, chat: bool):
        check_auth(request)
        body = protocol.parse_json(await request.body())
        req = protocol.parse_request(body, chat, model_name, model.config.vocab_size)
        grammar, plan = tools.request(body, req, tokenizer.chat_template,
                                      parsed and tokenizer.replies.name == "harmony")  # structured output, tool calls
        spec = speculation_of(req)
        ids = prompt_ids(req, plan)
        wanted = req.max_tokens or 1
        if len(ids) + wanted > max_context:
            raise ApiError(400, f"this model's context holds {max_context} tokens; the prompt has {len(ids)} "
                                f"and {wanted} more were requested", param="messages" if chat else "prompt",
                           code="context_length_exceeded")
        nonlocal mailbox
        if mailbox is None or mailbox.loop is not asyncio.get_running_loop():
            mailbox = Mailbox(asyncio.get_running_loop())
        events, box = asyncio.Queue(), mailbox
        seq = Sequence(ids, req.max_tokens or max_context - len(ids),
                       Sampling(temperature=req.temperature, top_p=req.top_p, seed=req.seed),
                       emit=metrics.emitter(request, lambda kind, value: box.post(events, (kind, value))),
                       ignore_eos=req.ignore_eos, speculation=spec, logprobs=req.logprobs,
                       constraint=None if grammar is None else grammars.constraint(grammar),
                       logit_bias=bias_rows(req.logit_bias))
        if chat and plan is None:  # the next turn's prefix, prefilled while the client reads this answer
            answer_of = (lambda g: replies.final_text(tokenizer, g)) if parsed else tokenizer.decode
            seq.next_turn = lambda generated, history=req.prompt: tokenizer.encode(tokenizer.apply_chat_template(
                history + [{"role": "assistant", "content": answer_of(generated)}], add_generation_prompt=False,
                **req.variables))
        try:
            scheduler.submit(seq)
        except QueueFull as e:
            raise ApiError(429, f"the server is busy: {e}; retry later", code="queue_full",
                           kind="rate_limit_error") from None
        except SchedulerClosed as e:
            raise ApiError(503, str(e), kind="server_error") from None
        answer = protocol.Answer(chat, model_name)
        text = replies.ReplyText(tokenizer, req.stop, plan) if parsed and chat else TextStream(tokenizer, req.stop)
        logprobs = None if req.logprobs is None else LogprobFormat(tokenizer, chat)
        if req.stream:
            return StreamingResponse(stream(seq, events, text, answer, req, len(ids), logprobs, plan),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        watcher = asyncio.ensure_future(cancel_on_disconnect(request, seq))
        try:
            pieces, count, finish = [], 0, None
            async for kind, value in events_of(seq, events, text):
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
        use, entries = protocol.usage(len(ids), count, seq.cached_tokens), logprobs and logprobs(seq.entries[:count])
        if text.parsed:
            reply = replies.message(pieces)
            finish = "tool_calls" if reply["tool_calls"] and finish == "stop" else finish
            return JSONResponse(answer.complete(reply["content"], finish, use, entries, reply["reasoning_content"],
                                                reply["tool_calls"]))
        whole = answer.complete("".join(pieces), finish, use, entries)
        return JSONResponse(whole if plan is None or not plan.parse else tools.answer(plan, whole))

    async def events_of(seq: Sequence, events: asyncio.Queue, text: TextStream) -> AsyncIterator[tuple]:
        """("token", its text) per token, ("piece", text held back till the end) if any, then
        ("done", finish_reason) or ("error", message). A stop string ends it (and the sequence)."""
        while True:
            kind, value = await events.get()
            if kind == "token":
                yield kind, text.push(value)
                if text.stopped:
                    seq.cancel()
                    yield "done", "stop"
                    return
                continue
            if kind == "done":
                tail = text.flush()
                if tail:
                    yield "piece", tail
                value = "stop" if text.stopped else value
                if value == "cancelled":  # by the scheduler: it is stopping
                    kind, value = "error", "cancelled: the server is shutting down"
            yield kind, value
            return

    async def stream(seq, events, text, answer, req, prompt_tokens, logprobs, plan) -> AsyncIterator[str]:
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
            async for kind, value in events_of(seq, events, text):
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
                        yield _sse(answer.usage_chunk(protocol.usage(prompt_tokens, count, seq.cached_tokens)))
            yield "data: [DONE]\n\n"
        finally:  # finished, failed or the client went away
            seq.cancel()

    async def cancel_on_disconnect(request: Request, seq: Sequence) -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
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

    async def api_error(request: Request, exc: ApiError):
        return JSONResponse(exc.body(), status_code=exc.status)

    async def http_error(request: Request, exc: HTTPException):  # its headers kept (a 405's Allow)
        return JSONResponse(ApiError(exc.status_code, exc.detail).body(), status_code=exc.status_code,
                            headers=exc.headers)

    async def server_error(request: Request, exc: Exception):
        return JSONResponse(ApiError(500, f"{type(exc).__name__}: {exc}", kind="server_error").body(), status_code=500)

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
    ], exception_handlers={ApiError: api_error, HTTPException: http_error, Exception: server_error},
        lifespan=lifespan, middleware=[metrics.middleware()])
    app.state.scheduler = scheduler
    return app
