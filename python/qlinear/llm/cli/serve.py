"""``qlinear-llm serve``: its options and its command (the serve extra's packages are imported
when it runs, so the other commands and ``--help`` work without them)."""

from __future__ import annotations

import sys
from pathlib import Path

from .common import add_load_args, add_speculative_args, load_model, speculation


def add_parser(sub) -> None:
    s = sub.add_parser("serve", help="OpenAI-compatible HTTP server (continuous batching)")
    add_load_args(s)
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--max-batch", type=int, default=8, help="sequences decoded together")
    s.add_argument("--max-queue", type=int, default=64, help="requests waiting beyond those (then 429)")
    s.add_argument("--cache-mb", type=float, default=512,
                   help="prefix cache: MB of prompts' KV rows kept for requests that start alike (0: off)")
    s.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY'")
    s.add_argument("--model-name", default=None, help="the model's id in the API (default: MODEL's name)")
    add_speculative_args(s)  # every request's default (a request's "speculative" field overrides it)
    s.set_defaults(run=run)


def run(args) -> None:
    try:
        from ..serve import serve
    except ImportError as e:
        raise SystemExit(f"qlinear-llm serve needs the serve extra (pip install 'qlinear[serve]'): {e}") from None
    model = load_model(args)
    spec = speculation(args, model).get("speculative")
    name = args.model_name or Path(args.model.rstrip("/")).name
    mode = "" if spec is None else f", speculative {spec.method}"
    print(f"serving {name} on http://{args.host}:{args.port}/v1 (max batch {args.max_batch}{mode})", file=sys.stderr)
    serve(model, name, host=args.host, port=args.port, max_batch=args.max_batch, max_queue=args.max_queue,
          api_key=args.api_key, speculation=spec, cache_mb=args.cache_mb)
