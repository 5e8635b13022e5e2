"""What the commands share: the options that load a model and sample from it, and printing a
reply with the run's figures."""

from __future__ import annotations

import argparse
import sys


def group_size(text: str):
    """--group-size: a positive int (32, 64, 128, 256, or >= K) or 'channel' (one group per row)."""
    if text == "channel":
        return None
    try:
        g = int(text)
    except ValueError:
        g = 0
    if g <= 0:
        raise argparse.ArgumentTypeError(f"expected 32, 64, 128, 256 or 'channel' (per channel), got {text!r}")
    return g


def add_quant_args(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--bits", default="4", choices=["4", "8", "none"], help=f"weight bits {what} (none: float32)")
    p.add_argument("--group-size", type=group_size, default=64, metavar="{32,64,128,256,channel}",
                   help="k per weight scale, or 'channel' for one scale per output row (default 64)")


def add_load_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="model: GGUF file, or directory: Hugging Face checkpoint, converted model or MNN export")
    add_quant_args(p, "when quantizing a checkpoint at load")
    p.add_argument("--act", default="int8", choices=["int8", "float"], help="activations: int8 (W4A8/W8A8) or float")
    p.add_argument("--act-block", default="group", choices=["group", "row"], help="activation scale granularity")
    p.add_argument("--memory", default="low", choices=["low", "normal", "flash"],
                   help="flash: FFN weights read from the converted model file per token (a MoE model's experts on "
                        "demand, also from a GGUF file)")
    p.add_argument("--memory-budget-mb", type=float, default=None, help="memory=flash: refuse to load beyond it; its room holds FFN layers in memory")
    p.add_argument("--predictor", default=None, help="memory=flash, ReLU models: activation predictor file")
    p.add_argument("--sparse-window", type=int, default=5,
                   help="memory=flash with --predictor: tokens a bundle stays in memory after it was active")
    p.add_argument("--no-disk-embedding", action="store_true", help="hold the embedding table in memory")
    p.add_argument("--slim-vocab", action="store_true", help="lm head over the tokenizer's ids only")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--max-context", type=int, default=4096, help="KV cache positions: prompt + generated tokens (default 4096)")
    p.add_argument("--kv-cache", default="float32", choices=["float32", "float16"], help="the KV cache's element type")


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-n", "--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--repetition-penalty", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)


def add_speculative_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--speculative", default=None, choices=["ngram", "draft"],
                   help="speculative decoding: drafts from n-gram lookup in the text so far, or from --draft-model")
    p.add_argument("--draft-model", default=None, metavar="PATH",
                   help="the draft model (same tokenizer), loaded with the model's options")
    p.add_argument("--max-draft", type=int, default=8, help="the longest draft (1..32; shorter when drafts are rejected)")


def speculation(args, model) -> dict:
    """``Model.stream_ids``' speculative options of the command line (the draft model loaded)."""
    if args.speculative is None:
        if args.draft_model is not None:
            raise ValueError("--draft-model goes with --speculative draft")
        return {}
    from ..runtime.speculative import Speculation

    draft = None
    if args.speculative == "draft":
        if args.draft_model is None:
            raise ValueError("--speculative draft needs --draft-model PATH")
        draft = load_model(args, args.draft_model)
    return {"speculative": Speculation(args.speculative, draft, max_draft=args.max_draft)}


def load_model(args, path=None):
    """``llm.load`` with the options of ``add_load_args`` (of another model at ``path``)."""
    from .. import load

    bits = None if args.bits == "none" else int(args.bits)
    return load(args.model if path is None else path, bits=bits, group_size=args.group_size,
                act="float" if bits is None else args.act, memory=args.memory,
                disk_embedding=not args.no_disk_embedding, threads=args.threads,
                max_context=args.max_context, slim_vocab=args.slim_vocab, kv_cache=args.kv_cache,
                act_block=None if args.act_block == "row" else "group", progress=sys.stderr.isatty(),
                **({"memory_budget_mb": args.memory_budget_mb, "predictor": args.predictor, "window": args.sparse_window}
                   if args.memory == "flash" else {}))


def sampling(args) -> dict:
    return dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                repetition_penalty=args.repetition_penalty, seed=args.seed)


def print_stats(model) -> None:
    s = model.stats
    reused = f" ({s.reused_tokens} reused from the cache)" if s.reused_tokens else ""
    print(f"\n#########\nprompt tokens: {s.prompt_tokens}{reused}  decode tokens: {s.decode_tokens}\n"
          f"prefill speed: {s.prefill_tok_s:.2f} tok/s  decode speed: {s.decode_tok_s:.2f} tok/s\n"
          f"load: {s.load_s:.2f} s  peak RSS: {s.peak_rss_mb:.0f} MB\n#########", file=sys.stderr)


def note_context_stop(model, max_new_tokens: int) -> None:
    """Say so when generation stopped because the KV cache was full, not at -n or a stop token."""
    s = model.stats
    if s.finish_reason == "length" and s.decode_tokens < max_new_tokens:
        print(f"(stopped after {s.decode_tokens} of {max_new_tokens} tokens: the context is full, "
              f"{model.cache.capacity} positions; --max-context sets it)", file=sys.stderr)


def print_reply(model, pieces, max_new_tokens: int) -> None:
    """Stream the pieces to stdout, then why generation stopped early (if so) and the figures."""
    for piece in pieces:
        print(piece, end="", flush=True)
    print()
    note_context_stop(model, max_new_tokens)
    print_stats(model)
