"""``qlinear-llm perplexity``: perplexity of a model over a text file and, with
``--kl-divergence BASE``, the KL divergence of its next-token distributions from a base model's
(a model, loaded unquantized, or a file of ``--save-base``), as ``llama-perplexity`` reports it."""

from __future__ import annotations

from pathlib import Path

from ..perplexity import SCHEMES, STRIDE, WINDOW, perplexity
from .common import add_load_args, load_model


def add_parser(sub) -> None:
    x = sub.add_parser("perplexity", help="perplexity over a text file (and KL divergence from a base), and tok/s")
    add_load_args(x)
    x.add_argument("file", help="UTF-8 text file")
    x.add_argument("--window", type=int, default=WINDOW, help="tokens per window")
    x.add_argument("--stride", type=int, default=STRIDE, help="tokens between window starts (< window)")
    x.add_argument("--scheme", default="sliding", choices=SCHEMES,
                   help="sliding: overlapping windows, every token scored once; chunks: llama-perplexity's "
                        "(non-overlapping windows, the second half of each scored)")
    x.add_argument("--kl-divergence", default=None, metavar="BASE",
                   help="base model (directory or GGUF file, loaded unquantized) or a file of --save-base")
    x.add_argument("--save-base", default=None, metavar="FILE",
                   help="write this model's log-probabilities, to be a later run's --kl-divergence base")
    x.set_defaults(run=run)


def base_of(path: str, max_context: int, threads):
    """A file of --save-base as it is; a model directory or GGUF file loaded unquantized."""
    p = Path(path)
    if p.is_file() and p.suffix != ".gguf":
        return p
    from .. import load

    return load(p, bits=None, act="float", max_context=max_context, threads=threads, progress=False)


def run(args) -> None:
    try:
        text = Path(args.file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{args.file}: cannot read it as UTF-8 text ({e})") from None
    args.max_context = max(args.max_context, args.window)
    base = None if args.kl_divergence is None else base_of(args.kl_divergence, args.max_context, args.threads)
    result = perplexity(load_model(args), text, window=args.window, stride=args.stride, scheme=args.scheme,
                        base=base, save_base=args.save_base)
    print(f"{args.model}: {result}")
