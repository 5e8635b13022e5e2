"""A request's generation, whichever API it came by (OpenAI's chat and completions, Anthropic's
messages): its prompt rendered (the chat template, with tools) and tokenized, its Sequence
submitted to the scheduler, its tokens read back as text or reply deltas and cut at stop strings.
The APIs' modules check their bodies and shape the answers; this is what they share."""

from __future__ import annotations

import asyncio
import hmac
from dataclasses import dataclass
from typing import AsyncIterator, Optional

import numpy as np

from starlette.requests import Request

from ..runtime.drafters import check_compatible
from ..runtime.generation import Sampling
from ..runtime.model import Model
from ..runtime.speculative import Speculation
from . import protocol, replies, structured, tools
from .protocol import ApiError
from .scheduler import QueueFull, Scheduler, SchedulerClosed
from .sequence import Sequence
from .streams import Mailbox, TextStream


@dataclass
class Job:
    """A submitted request: its checked request, tool plan, sequence, the queue its events come
    by, what turns its tokens into text (``TextStream`` or ``replies.ReplyText``) and its prompt's
    length."""

    req: protocol.GenerationRequest
    plan: Optional[tools.ToolPlan]
    seq: Sequence
    events: asyncio.Queue
    text: object
    prompt_tokens: int


class Engine:
    """The server's side of every generation endpoint: the model, its scheduler and metrics, the
    default speculation, the constraints' grammars and the API key."""

    def __init__(self, model: Model, model_name: str, scheduler: Scheduler, metrics, api_key: Optional[str] = None,
                 speculation: Optional[Speculation] = None):
        if speculation is not None and speculation.draft_model is not None:
            check_compatible(model, speculation.draft_model)
        self.model, self.model_name, self.scheduler, self.metrics = model, model_name, scheduler, metrics
        self.api_key, self.speculation = api_key, speculation
        self.tokenizer, self.max_context = model.tokenizer, model.max_context
        self.grammars = structured.Grammars(self.tokenizer, model.lm_rows)  # response_format's constraints
        self.parsed = self.tokenizer.replies is not None  # a reply format (GPT-OSS's, Gemma 4's): serve.replies
        self.mailbox: Optional[Mailbox] = None  # of the event loop serving the requests

    def check_auth(self, request: Request) -> None:
        """The key as OpenAI's clients send it (Authorization: Bearer KEY) or Anthropic's (x-api-key)."""
        if self.api_key is None:
            return
        given, key = request.headers.get("authorization", ""), self.api_key.encode()
        given = given[7:] if given.startswith("Bearer ") else request.headers.get("x-api-key")
        if given is None or not hmac.compare_digest(given.encode(), key):
            raise ApiError(401, "invalid or missing API key (Authorization: Bearer KEY, or x-api-key: KEY)",
                           code="invalid_api_key", kind="authentication_error")

    def prompt_ids(self, req: protocol.GenerationRequest, plan: Optional[tools.ToolPlan]) -> list:
        tokenizer = self.tokenizer
        if isinstance(req.prompt, str) or req.chat:
            try:
                return tokenizer.prompt_ids(replies.template_messages(tokenizer, req.prompt) if req.chat else req.prompt,
                                            tools=plan and plan.tools, **req.variables)
            except (ValueError, TypeError) as e:
                raise ApiError(400, str(e), param="messages" if req.chat else "prompt") from None
        vocab = self.model.config.vocab_size
        if max(req.prompt) >= vocab:
            raise ApiError(400, f"token id {max(req.prompt)} is outside the vocabulary ({vocab})", param="prompt")
        return req.prompt

    def bias_rows(self, bias: dict) -> Optional[tuple]:
        """A request's logit_bias as (lm head rows, values); tokens the (slimmed) head lacks are never sampled."""
        if not bias:
            return None
        lm_rows = self.model.lm_rows
        row_of = None if lm_rows is None else {int(t): r for r, t in enumerate(lm_rows)}
        pairs = [(t if row_of is None else row_of.get(t), b) for t, b in bias.items()]
        pairs = [(r, b) for r, b in pairs if r is not None]
        return np.array([r for r, _ in pairs], np.intp), np.array([b for _, b in pairs], np.float32)

    def speculation_of(self, req: protocol.GenerationRequest) -> Optional[Speculation]:
        speculation = self.speculation
        if req.speculative is None or (speculation is not None and req.speculative == speculation.method):
            return speculation
        if req.speculative == "none":
            return None
        if req.speculative == "draft":  # the server's default is n-gram lookup or none: no draft model
            raise ApiError(400, "'speculative': \"draft\" needs a server started with a draft model "
                                "(qlinear-llm serve --speculative draft --draft-model PATH)", param="speculative")
        return Speculation(req.speculative, **({} if speculation is None else {"max_draft": speculation.max_draft}))

    def prepare(self, body: dict, req: protocol.GenerationRequest) -> tuple:
        """(the grammar the answer follows or None, the tool plan or None, the prompt's ids) of a
        request (``req``: its parse, its tool messages shaped for the template here)."""
        grammar, plan = tools.request(body, req, self.tokenizer.chat_template,
                                      self.parsed and self.tokenizer.replies.name == "harmony")
        return grammar, plan, self.prompt_ids(req, plan)

    def start(self, request: Request, body: dict, req: protocol.GenerationRequest, top_k: int = 0) -> Job:
        """Check ``body``'s structured output and tools (``req``: its parse), render and tokenize the
        prompt, and submit its sequence; ApiError for a bad request, a full queue or a closing server."""
        tokenizer, chat = self.tokenizer, req.chat
        grammar, plan, ids = self.prepare(body, req)
        spec = self.speculation_of(req)
        wanted = req.max_tokens or 1
        if len(ids) + wanted > self.max_context:
            raise ApiError(400, f"this model's context holds {self.max_context} tokens; the prompt has {len(ids)} "
                                f"and {wanted} more were requested", param="messages" if chat else "prompt",
                           code="context_length_exceeded")
        if self.mailbox is None or self.mailbox.loop is not asyncio.get_running_loop():
            self.mailbox = Mailbox(asyncio.get_running_loop())
        events, box = asyncio.Queue(), self.mailbox
        seq = Sequence(ids, req.max_tokens or self.max_context - len(ids),
                       Sampling(temperature=req.temperature, top_k=top_k, top_p=req.top_p, seed=req.seed),
                       emit=self.metrics.emitter(request, lambda kind, value: box.post(events, (kind, value))),
                       ignore_eos=req.ignore_eos, speculation=spec, logprobs=req.logprobs,
                       constraint=None if grammar is None else self.grammars.constraint(grammar),
                       logit_bias=self.bias_rows(req.logit_bias))
        if chat and plan is None:  # the next turn's prefix, prefilled while the client reads this answer
            answer_of = (lambda g: replies.final_text(tokenizer, g)) if self.parsed else tokenizer.decode
            seq.next_turn = lambda generated, history=req.prompt: tokenizer.encode(tokenizer.apply_chat_template(
                history + [{"role": "assistant", "content": answer_of(generated)}], add_generation_prompt=False,
                **req.variables))
        try:
            self.scheduler.submit(seq)
        except QueueFull as e:
            raise ApiError(429, f"the server is busy: {e}; retry later", code="queue_full",
                           kind="rate_limit_error") from None
        except SchedulerClosed as e:
            raise ApiError(503, str(e), kind="server_error") from None
        text = replies.ReplyText(tokenizer, req.stop, plan) if self.parsed and chat else TextStream(tokenizer, req.stop)
        return Job(req, plan, seq, events, text, len(ids))


async def events_of(job: Job) -> AsyncIterator[tuple]:
    """("token", its text) per token, ("piece", text held back till the end) if any, then
    ("done", finish_reason) or ("error", message). A stop string ends it (and the sequence)."""
    seq, events, text = job.seq, job.events, job.text
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


async def cancel_on_disconnect(request: Request, seq: Sequence) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
    seq.cancel()
