"""The server's Prometheus metrics (GET /metrics), in a registry of the app's own (several apps
may share a process): the scheduler's figures read when scraped (queue depth, running sequences,
decode steps and their seconds, speculative drafted and accepted tokens, the prefix cache's
lookups, hits, cached tokens and bytes), and what the HTTP side
counts as it goes (tokens generated, time to first token, requests by endpoint and status)."""

from __future__ import annotations

import time
from typing import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response

ARRIVAL = "qlinear.arrival"  # the scope's key: when the request came in (time.perf_counter())
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class SchedulerFigures:
    """A collector of the scheduler's own counters and queue lengths, as they are at the scrape."""

    def __init__(self, scheduler):
        self.scheduler = scheduler

    def collect(self):
        s, spec = self.scheduler, self.scheduler.speculative
        yield GaugeMetricFamily("qlinear_waiting_sequences", "Requests waiting for a place in the batch "
                                "(queue depth).", value=s.waiting)
        yield GaugeMetricFamily("qlinear_running_sequences", "Sequences in the batch.", value=s.running)
        for name, doc, value in (
                ("qlinear_decode_steps", "Decode steps run.", s.decode_steps),
                ("qlinear_decode_seconds", "Seconds spent in the decode steps themselves.", s.decode_seconds),
                ("qlinear_speculative_draft_tokens", "Tokens drafted by speculative decoding.", spec.draft_tokens),
                ("qlinear_speculative_accepted_tokens", "Drafted tokens the model kept.", spec.accepted_tokens),
                ("qlinear_prefix_cache_lookups", "Prompts looked up in the prefix cache.", s.prefix.lookups),
                ("qlinear_prefix_cache_hits", "Prompts that reused a cached prefix.", s.prefix.hits),
                ("qlinear_prompt_tokens", "Prompt tokens of the requests started.", s.prefix.prompt_tokens),
                ("qlinear_prefix_cache_cached_tokens", "Prompt tokens whose KV rows came from the prefix cache.",
                 s.prefix.cached_tokens),
                ("qlinear_prefix_cache_evicted_blocks", "Prefix cache blocks evicted (least recently used).",
                 s.prefix.evicted_blocks)):
            yield CounterMetricFamily(name, doc, value=value)
        yield GaugeMetricFamily("qlinear_prefix_cache_bytes", "Bytes of KV rows the prefix cache holds.",
                                value=s.prefix.nbytes)


class Metrics:
    """One app's metrics; ``middleware()`` counts its requests and notes their arrival."""

    def __init__(self, scheduler):
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(SchedulerFigures(scheduler))
        self.tokens = Counter("qlinear_generated_tokens", "Tokens generated (sent to the requests).",
                              registry=self.registry)
        self.ttft = Histogram("qlinear_time_to_first_token_seconds", "From a request's arrival to its first "
                              "token.", buckets=TTFT_BUCKETS, registry=self.registry)
        self.requests = Counter("qlinear_requests", "HTTP requests answered, by endpoint and status.",
                                ["endpoint", "status"], registry=self.registry)

    def emitter(self, request: Request, emit: Callable[[str, object], None]) -> Callable[[str, object], None]:
        """A sequence's ``emit`` (called on the scheduler's thread) that also counts its tokens and
        times its first one from the request's arrival."""
        arrival, first = request.scope.get(ARRIVAL, time.perf_counter()), True

        def on(kind: str, value) -> None:
            nonlocal first
            if kind == "token":
                self.tokens.inc()
                if first:
                    first = False
                    self.ttft.observe(time.perf_counter() - arrival)
            emit(kind, value)
        return on

    def response(self) -> Response:
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)

    def middleware(self) -> Middleware:
        return Middleware(RequestCounter, metrics=self)


class RequestCounter:
    """ASGI middleware: each HTTP request counted by its route's path ("other" for none: the
    label's values stay few) and the status it was answered with (500 if it failed unanswered)."""

    def __init__(self, app, metrics: Metrics):
        self.app, self.metrics = app, metrics
        self.paths = None  # the app's routes' paths, once known

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        scope[ARRIVAL] = time.perf_counter()
        if self.paths is None:
            self.paths = {getattr(r, "path", None) for r in getattr(scope.get("app"), "routes", ())}
        endpoint = scope["path"] if scope["path"] in self.paths else "other"
        status = None

        async def sending(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                self.metrics.requests.labels(endpoint, str(status)).inc()
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except BaseException:
            if status is None:
                self.metrics.requests.labels(endpoint, "500").inc()
            raise
