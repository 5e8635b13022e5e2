"""``qlinear-llm perplexity``: sliding-window perplexity of a model over a text file."""

from __future__ import annotations

from pathlib import Path

from ..perplexity import STRIDE, WINDOW, perplexity
from .common import add_load_args, load_model


def add_parser(sub) -> None:
    x = sub.add_parser("perplexity", help="sliding-window perplexity over a text file, and tok/s")
    add_load_args(x)
    x.add_argument("file", help="UTF-8 text file")
    x.add_argument("--window", type=int, default=WINDOW, help="tokens per window")
    x.add_argument("--stride", type=int, default=STRIDE, help="tokens between window starts (< window)")
    x.set_defaults(run=run)


def run(args) -> None:
    try:
        text = Path(args.file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{args.file}: cannot read it as UTF-8 text ({e})") from None
    args.max_context = max(args.max_context, args.window)
    result = perplexity(load_model(args), text, window=args.window, stride=args.stride)
    print(f"{args.model}: {result}")
