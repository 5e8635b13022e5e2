"""qlinear-llm serve: an OpenAI-compatible HTTP server with continuous batching.

    qlinear-llm serve MODEL --port 8000 --max-batch 8 --api-key KEY [--speculative ngram]

Endpoints: ``GET /v1/models``, ``POST /v1/chat/completions``, ``POST /v1/completions``
(streaming as server-sent events, or one JSON body), Anthropic's ``POST /v1/messages``
(``anthropic``, over the same generation path: ``engine``), ``GET /health``, ``GET /metrics``
(Prometheus, ``metrics``) and ``GET /openapi.json`` (``openapi``). Concurrent requests
decode together, one B-row matmul per weight per step (``scheduler``); prompts that start
alike reuse the KV rows of their common prefix (``runtime.prefix_cache``); ``response_format``
constrains the tokens to a JSON schema's grammar (``structured``: llguidance's masks), and
``tools`` go through the chat template, the calls parsed back (``tools``, ``tool_formats``);
``protocol`` checks requests and shapes answers; ``app`` is the Starlette app. Needs the
``serve`` extra (starlette, uvicorn, prometheus-client, llguidance).
"""

from __future__ import annotations

import socket
from typing import Optional

from .app import create_app
from .scheduler import QueueFull, Scheduler, SchedulerClosed
from .sequence import Sequence

__all__ = ["create_app", "serve", "Scheduler", "Sequence", "QueueFull", "SchedulerClosed"]


def serve(model, model_name: str, host: str = "127.0.0.1", port: int = 8000, max_batch: int = 8,
          max_queue: int = 64, api_key: Optional[str] = None, sock: Optional[socket.socket] = None,
          log_level: str = "info", speculation=None, cache_mb: float = 512) -> None:
    """Serve ``model`` under ``model_name`` until interrupted (on ``sock`` if given);
    ``speculation``: the requests' default speculative decoding, ``cache_mb``: the prefix
    cache's budget (``create_app``)."""
    import uvicorn

    app = create_app(model, model_name, max_batch=max_batch, max_queue=max_queue, api_key=api_key,
                     speculation=speculation, cache_mb=cache_mb)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5)
    uvicorn.Server(config).run(sockets=None if sock is None else [sock])
