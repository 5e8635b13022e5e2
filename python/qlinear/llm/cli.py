"""qlinear-llm: generate, chat, bench, convert (and make-test-model) from the command line.

    qlinear-llm generate MODEL_DIR "Once upon a time" -n 64
    qlinear-llm chat MODEL_DIR
    qlinear-llm bench MODEL_DIR --prompt-tokens 64 --decode-tokens 32 --threads 1
    qlinear-llm bench MODEL.gguf --vs llamacpp
    qlinear-llm convert SRC OUT_DIR --bits 4 --group-size 64 [--method gptq --calibration FILE]
    qlinear-llm perplexity MODEL_DIR FILE --window 512 --stride 256
    qlinear-llm serve MODEL_DIR --port 8000 --max-batch 8
    qlinear-llm make-test-model OUT_DIR --arch qwen2 --shape tiny --dtype bfloat16
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from . import predictor_command, serve_command


def _group_size(text: str):
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


def _add_quant_args(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--bits", default="4", choices=["4", "8", "none"], help=f"weight bits {what} (none: float32)")
    p.add_argument("--group-size", type=_group_size, default=64, metavar="{32,64,128,256,channel}",
                   help="k per weight scale, or 'channel' for one scale per output row (default 64)")


def _add_load_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="model: GGUF file, or directory: Hugging Face checkpoint, converted model or MNN export")
    _add_quant_args(p, "when quantizing a checkpoint at load")
    p.add_argument("--act", default="int8", choices=["int8", "float"], help="activations: int8 (W4A8/W8A8) or float")
    p.add_argument("--act-block", default="group", choices=["group", "row"], help="activation scale granularity")
    p.add_argument("--memory", default="low", choices=["low", "normal", "flash"],
                   help="flash: FFN weights read from the converted model file per token")
    p.add_argument("--memory-budget-mb", type=float, default=None, help="memory=flash: refuse to load beyond it; its room holds FFN layers in memory")
    p.add_argument("--predictor", default=None, help="memory=flash, ReLU models: activation predictor file")
    p.add_argument("--sparse-window", type=int, default=5,
                   help="memory=flash with --predictor: tokens a bundle stays in memory after it was active")
    p.add_argument("--no-disk-embedding", action="store_true", help="hold the embedding table in memory")
    p.add_argument("--slim-vocab", action="store_true", help="lm head over the tokenizer's ids only")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--max-context", type=int, default=4096, help="KV cache positions: prompt + generated tokens (default 4096)")
    p.add_argument("--kv-cache", default="float32", choices=["float32", "float16"], help="the KV cache's element type")


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-n", "--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--repetition-penalty", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)


def _load(args):
    from . import load

    bits = None if args.bits == "none" else int(args.bits)
    return load(args.model, bits=bits, group_size=args.group_size,
                act="float" if bits is None else args.act, memory=args.memory,
                disk_embedding=not args.no_disk_embedding, threads=args.threads,
                max_context=args.max_context, slim_vocab=args.slim_vocab, kv_cache=args.kv_cache,
                act_block=None if args.act_block == "row" else "group", progress=sys.stderr.isatty(),
                **({"memory_budget_mb": args.memory_budget_mb, "predictor": args.predictor, "window": args.sparse_window}
                   if args.memory == "flash" else {}))


def _sampling(args) -> dict:
    return dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                repetition_penalty=args.repetition_penalty, seed=args.seed)


def _print_stats(model) -> None:
    s = model.stats
    reused = f" ({s.reused_tokens} reused from the cache)" if s.reused_tokens else ""
    print(f"\n#########\nprompt tokens: {s.prompt_tokens}{reused}  decode tokens: {s.decode_tokens}\n"
          f"prefill speed: {s.prefill_tok_s:.2f} tok/s  decode speed: {s.decode_tok_s:.2f} tok/s\n"
          f"load: {s.load_s:.2f} s  peak RSS: {s.peak_rss_mb:.0f} MB\n#########", file=sys.stderr)


def _note_context_stop(model, max_new_tokens: int) -> None:
    """Say so when generation stopped because the KV cache was full, not at -n or a stop token."""
    s = model.stats
    if s.finish_reason == "length" and s.decode_tokens < max_new_tokens:
        print(f"(stopped after {s.decode_tokens} of {max_new_tokens} tokens: the context is full, "
              f"{model.cache.capacity} positions; --max-context sets it)", file=sys.stderr)


def _print_reply(model, pieces, max_new_tokens: int) -> None:
    """Stream the pieces to stdout, then why generation stopped early (if so) and the figures."""
    for piece in pieces:
        print(piece, end="", flush=True)
    print()
    _note_context_stop(model, max_new_tokens)
    _print_stats(model)


def cmd_generate(args) -> None:
    model = _load(args)
    prompt = [{"role": "user", "content": args.prompt}] if args.chat_template else args.prompt
    _print_reply(model, model.stream(prompt, args.max_new_tokens, **_sampling(args)), args.max_new_tokens)


def cmd_chat(args) -> None:
    model = _load(args)
    if args.system:
        model.history.append({"role": "system", "content": args.system})
    print("(empty line or Ctrl-D to quit; /reset forgets the conversation)", file=sys.stderr)
    while True:
        try:
            line = input("> ")
        except EOFError:
            break
        if not line.strip():
            break
        if line.strip() == "/reset":
            model.reset()
            continue
        _print_reply(model, model.chat(line, args.max_new_tokens, stream=True, **_sampling(args)),
                     args.max_new_tokens)


def cmd_bench(args) -> None:
    from .. import get_num_threads, set_num_threads

    from .benchmark import bench, bench_text, bench_vs_llamacpp, bench_vs_mnn, weight_bits

    if args.vs == "llamacpp" and args.threads is None:
        args.threads = 1  # then 2: llama.cpp's peer figures are per thread count
        thread_counts = [1, 2]
    else:
        thread_counts = [None]
    model = _load(args)
    model.tokenizer.stop_ids = set()  # decode exactly --decode-tokens tokens
    rows = []
    for threads in thread_counts:
        if threads is not None:
            set_num_threads(threads)
        row = bench(model, args.prompt_tokens, args.decode_tokens, args.repeats)
        row.update(threads=get_num_threads(), bits=weight_bits(model),
                   **{k: model.info[k] for k in ("act", "group_size")})
        if args.vs == "mnn":
            row["mnn"] = bench_vs_mnn(args.model, model, row, args.decode_tokens)
        elif args.vs == "llamacpp":
            row["llamacpp"] = bench_vs_llamacpp(args.model, model, row, args.decode_tokens, args.repeats,
                                                args.llamacpp)
        if model.info["memory"] == "flash":
            from .flash_cost import flash_bench
            row["flash"] = flash_bench(model, row, args.decode_tokens)
        rows.append(row)
    if not args.json:
        print("\n\n".join(bench_text(row) + ("\n" + row["flash"]["cost_model"] if "flash" in row else "")
                          for row in rows))
        return
    for row in rows:
        for r in (row, row.get("mnn") or {}, row.get("llamacpp") or {}):
            r.pop("prompt_ids", None)
    print(json.dumps(rows[0] if len(rows) == 1 else rows, indent=2))


def cmd_convert(args) -> None:
    from . import convert

    bits = None if args.bits == "none" else int(args.bits)
    t0 = time.perf_counter()
    gptq = {} if args.method == "rtn" else dict(damp=args.damp, act_order=args.act_order,
                                                calibration_tokens=args.calibration_tokens)
    out = convert(args.src, args.out_dir, bits=bits, group_size=args.group_size, symmetric=args.symmetric,
                  slim_vocab=args.slim_vocab, progress=not args.no_progress, force=args.force, flash=args.flash,
                  method=args.method, calibration=args.calibration, **gptq)
    print(f"wrote {out} in {time.perf_counter() - t0:.1f} s")


def cmd_perplexity(args) -> None:
    from .perplexity import perplexity

    try:
        text = Path(args.file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{args.file}: cannot read it as UTF-8 text ({e})") from None
    args.max_context = max(args.max_context, args.window)
    result = perplexity(_load(args), text, window=args.window, stride=args.stride)
    print(f"{args.model}: {result}")


def cmd_make_test_model(args) -> None:
    from .synthetic import make_checkpoint

    extra = {} if args.vocab_size is None else {"vocab_size": args.vocab_size}
    if args.hidden_act != "silu":
        extra["hidden_act"] = args.hidden_act
    out = make_checkpoint(args.out_dir, args.arch, args.shape, args.seed, dtype=args.dtype,
                          force=args.force, **extra)
    print(out)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="qlinear-llm", description="Run LLMs on qlinear's quantized kernels.")
    sub = p.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="generate text from a prompt, streaming")
    _add_load_args(g)
    g.add_argument("prompt")
    g.add_argument("--chat-template", action="store_true", help="wrap the prompt as a user message")
    _add_sampling_args(g)
    g.set_defaults(run=cmd_generate)

    c = sub.add_parser("chat", help="interactive chat with history")
    _add_load_args(c)
    c.add_argument("--system", default=None, help="system prompt")
    _add_sampling_args(c)
    c.set_defaults(run=cmd_chat)

    b = sub.add_parser("bench", help="prefill and decode speed")
    _add_load_args(b)
    b.add_argument("--prompt-tokens", type=int, default=64)
    b.add_argument("--decode-tokens", type=int, default=32)
    b.add_argument("--repeats", type=int, default=1)
    b.add_argument("--vs", choices=["mnn", "llamacpp"], default=None,
                   help="also run MNN.llm on the same MNN export, or llama.cpp on the same GGUF file "
                        "(threads 1 and 2 unless --threads is given)")
    b.add_argument("--llamacpp", default=None, metavar="DIR",
                   help="bin folder of a llama.cpp build (default: $QLINEAR_LLAMACPP_BIN, ~/.cache/qlinear-llamacpp)")
    b.add_argument("--json", action="store_true")
    b.set_defaults(run=cmd_bench)

    from .gptq import CALIBRATION_TOKENS, DAMP  # noqa: PLC0415  (no torch import: that happens when GPTQ runs)
    from .perplexity import STRIDE, WINDOW  # noqa: PLC0415

    v = sub.add_parser("convert", help="quantize a Hugging Face checkpoint (or GGUF file) into qlinear's model file")
    v.add_argument("src", help="Hugging Face checkpoint directory or GGUF file")
    v.add_argument("out_dir", help="directory to write (model.qlinear + tokenizer files)")
    _add_quant_args(v, "of the converted model")
    v.add_argument("--symmetric", action="store_true", help="symmetric weights (no offsets)")
    v.add_argument("--slim-vocab", action="store_true", help="lm head over the tokenizer's ids only")
    v.add_argument("--force", action="store_true", help="write into OUT_DIR even if it is not empty")
    v.add_argument("--flash", action="store_true", help="store each layer's FFN as neuron bundles (memory=flash)")
    v.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    v.add_argument("--method", default="rtn", choices=["rtn", "gptq"],
                   help="rtn: round to nearest; gptq: error feedback against --calibration (needs torch)")
    v.add_argument("--calibration", default=None, metavar="FILE", help="UTF-8 text for --method gptq")
    v.add_argument("--damp", type=float, default=DAMP, help="GPTQ dampening, fraction of the mean Hessian diagonal")
    v.add_argument("--act-order", action="store_true", help="GPTQ: columns in order of decreasing input energy")
    v.add_argument("--calibration-tokens", type=int, default=CALIBRATION_TOKENS,
                   help="at most this many calibration tokens, taken evenly over the file")
    v.set_defaults(run=cmd_convert)

    x = sub.add_parser("perplexity", help="sliding-window perplexity over a text file, and tok/s")
    _add_load_args(x)
    x.add_argument("file", help="UTF-8 text file")
    x.add_argument("--window", type=int, default=WINDOW, help="tokens per window")
    x.add_argument("--stride", type=int, default=STRIDE, help="tokens between window starts (< window)")
    x.set_defaults(run=cmd_perplexity)

    serve_command.add_parser(sub, _add_load_args, _load)

    from .synthetic import ARCHS, DTYPES, SHAPES  # noqa: PLC0415  (no torch import: that happens in make_checkpoint)

    m = sub.add_parser("make-test-model", help="write a random-initialized checkpoint (needs torch, transformers)")
    m.add_argument("out_dir", help="directory to write (config.json, model.safetensors, tokenizer files)")
    m.add_argument("--arch", default="qwen2", choices=list(ARCHS))
    m.add_argument("--shape", default="tiny", choices=list(SHAPES),
                   help="; ".join(f"{k}: hidden {v['hidden_size']}, {v['num_hidden_layers']} layers, "
                                  f"vocab {v['vocab_size']}" for k, v in SHAPES.items()))
    m.add_argument("--dtype", default="float32", choices=list(DTYPES), help="weights' dtype in the file")
    m.add_argument("--vocab-size", type=int, default=None, help="override the shape's vocabulary size")
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--hidden-act", default="silu", choices=["silu", "relu"], help="MLP activation (relu: llama only)")
    m.add_argument("--force", action="store_true", help="write into OUT_DIR even if it is not empty")
    m.set_defaults(run=cmd_make_test_model)

    predictor_command.add_parser(sub)

    args = p.parse_args(argv)
    try:
        args.run(args)
    except (ValueError, TypeError) as e:
        raise SystemExit(f"qlinear-llm: error: {e}") from None
    except KeyboardInterrupt:
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
