"""qlinear-llm: generate, chat, bench, convert (and make-test-model) from the command line.

    qlinear-llm generate MODEL_DIR "Once upon a time" -n 64
    qlinear-llm chat MODEL_DIR
    qlinear-llm bench MODEL_DIR --prompt-tokens 64 --decode-tokens 32 --threads 1
    qlinear-llm convert HF_DIR OUT_DIR --bits 4 --group-size 64
    qlinear-llm make-test-model OUT_DIR --arch qwen2 --shape tiny
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def _add_load_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="model directory: Hugging Face checkpoint, converted model or MNN export")
    p.add_argument("--bits", default="4", choices=["4", "8", "none"], help="weight bits when quantizing at load")
    p.add_argument("--group-size", type=int, default=64, help="weight group size (0: per channel)")
    p.add_argument("--act", default="int8", choices=["int8", "float"], help="activations: int8 (W4A8/W8A8) or float")
    p.add_argument("--act-block", default="group", choices=["group", "row"], help="activation scale granularity")
    p.add_argument("--memory", default="low", choices=["low", "normal"])
    p.add_argument("--no-disk-embedding", action="store_true", help="hold the embedding table in memory")
    p.add_argument("--slim-vocab", action="store_true", help="lm head over the tokenizer's ids only")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--max-context", type=int, default=4096)


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
    return load(args.model, bits=bits, group_size=args.group_size or None,
                act="float" if bits is None else args.act, memory=args.memory,
                disk_embedding=not args.no_disk_embedding, threads=args.threads,
                max_context=args.max_context, slim_vocab=args.slim_vocab,
                act_block=None if args.act_block == "row" else "group", progress=sys.stderr.isatty())


def _sampling(args) -> dict:
    return dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                repetition_penalty=args.repetition_penalty, seed=args.seed)


def _print_stats(model) -> None:
    s = model.stats
    reused = f" ({s.reused_tokens} reused from the cache)" if s.reused_tokens else ""
    print(f"\n#########\nprompt tokens: {s.prompt_tokens}{reused}  decode tokens: {s.decode_tokens}\n"
          f"prefill speed: {s.prefill_tok_s:.2f} tok/s  decode speed: {s.decode_tok_s:.2f} tok/s\n"
          f"load: {s.load_s:.2f} s  peak RSS: {s.peak_rss_mb:.0f} MB\n#########", file=sys.stderr)


def cmd_generate(args) -> None:
    model = _load(args)
    prompt = [{"role": "user", "content": args.prompt}] if args.chat_template else args.prompt
    for piece in model.stream(prompt, args.max_new_tokens, **_sampling(args)):
        print(piece, end="", flush=True)
    print()
    _print_stats(model)


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
        for piece in model.chat(line, args.max_new_tokens, stream=True, **_sampling(args)):
            print(piece, end="", flush=True)
        print()
        _print_stats(model)


def bench(model, prompt_tokens: int = 64, decode_tokens: int = 32, repeats: int = 1) -> dict:
    """Prefill ``prompt_tokens`` (ids drawn from the tokenizer's vocabulary, deterministic) and
    decode ``decode_tokens`` greedily; the best of ``repeats`` runs. Decode speed counts the
    one-token forwards (the first token comes from the prefill)."""
    import numpy as np

    rng = np.random.default_rng(0)
    hi = min(model.tokenizer.vocab_size, model.config.vocab_size)
    ids = [int(t) for t in rng.integers(0, hi, prompt_tokens)]
    best = None
    for _ in range(repeats):
        model.reset()
        tokens = model.generate_ids(ids, decode_tokens + 1, stop_ids=())
        s = model.stats
        row = {"prompt_tokens": s.prompt_tokens, "prefill_tok_s": s.prefill_tok_s,
               "decode_tokens": s.decode_steps, "decode_tok_s": s.decode_tok_s,
               "prompt_ids": ids, "tokens": tokens}
        if best is None or row["decode_tok_s"] > best["decode_tok_s"]:
            best = row
    best["peak_rss_mb"] = model.stats.peak_rss_mb
    best["load_s"] = model.stats.load_s
    return best


def cmd_bench(args) -> None:
    from .. import get_num_threads

    model = _load(args)
    model.tokenizer.stop_ids = set()  # decode exactly --decode-tokens tokens
    row = bench(model, args.prompt_tokens, args.decode_tokens, args.repeats)
    row.update(threads=get_num_threads(), **{k: model.info[k] for k in ("bits", "act", "group_size")})
    if args.vs == "mnn":
        row["mnn"] = _bench_mnn(args, model, row)
    if not args.json:
        print(_bench_text(row))
        return
    for r in (row, row.get("mnn") or {}):
        r.pop("prompt_ids", None)
    print(json.dumps(row, indent=2))


def _bench_text(row: dict) -> str:
    lines = [f"threads {row['threads']}  bits {row['bits']}  act {row['act']}",
             f"prefill {row['prompt_tokens']} tokens: {row['prefill_tok_s']:.1f} tok/s",
             f"decode {row['decode_tokens']} tokens: {row['decode_tok_s']:.1f} tok/s",
             f"load {row['load_s']:.2f} s, peak RSS {row['peak_rss_mb']:.0f} MB"]
    mnn = row.get("mnn")
    if mnn:
        lines += [f"MNN.llm prefill {mnn['prefill_tok_s']:.1f} tok/s, decode {mnn['decode_tok_s']:.1f} tok/s, "
                  f"peak RSS {mnn.get('peak_rss_mb', float('nan')):.0f} MB",
                  f"ratio qlinear/MNN: prefill {row['prefill_tok_s'] / mnn['prefill_tok_s']:.2f}x, "
                  f"decode {row['decode_tok_s'] / mnn['decode_tok_s']:.2f}x",
                  f"greedy tokens agree: the first {mnn['agree_tokens']} of {mnn['compared_tokens']}"]
    return "\n".join(lines)


def _bench_mnn(args, model, row) -> dict:
    """The same prompt through MNN.llm (a fresh process: its peak RSS is its own), greedy."""
    if model.info.get("source") != "mnn":
        raise ValueError("--vs mnn needs an MNN export directory (llm.mnn, llm.mnn.weight, ...)")
    from .mnn.engine import bench_in_subprocess

    mnn = bench_in_subprocess(args.model, row["prompt_ids"], args.decode_tokens, threads=row["threads"])
    ours, theirs = row["tokens"], mnn.get("tokens", [])
    agree = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
    mnn["agree_tokens"], mnn["compared_tokens"] = agree, min(len(ours), len(theirs))
    return mnn


def cmd_convert(args) -> None:
    from . import convert

    bits = None if args.bits == "none" else int(args.bits)
    t0 = time.perf_counter()
    out = convert(args.src, args.out, bits=bits, group_size=args.group_size or None,
                  slim_vocab=args.slim_vocab, progress=sys.stderr.isatty())
    print(f"wrote {out} in {time.perf_counter() - t0:.1f} s")


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
    b.add_argument("--vs", choices=["mnn"], default=None, help="also run MNN.llm on the same MNN export")
    b.add_argument("--json", action="store_true")
    b.set_defaults(run=cmd_bench)

    v = sub.add_parser("convert", help="quantize a Hugging Face checkpoint into qlinear's model file")
    v.add_argument("src")
    v.add_argument("out")
    v.add_argument("--bits", default="4", choices=["4", "8", "none"])
    v.add_argument("--group-size", type=int, default=64)
    v.add_argument("--slim-vocab", action="store_true")
    v.set_defaults(run=cmd_convert)

    m = sub.add_parser("make-test-model", help="write a random-initialized checkpoint (needs torch, transformers)")
    m.add_argument("out")
    m.add_argument("--arch", default="qwen2", choices=["qwen2", "llama"])
    m.add_argument("--shape", default="tiny")
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--vocab-size", type=int, default=None)
    m.set_defaults(run=lambda a: __import__("qlinear.llm.synthetic", fromlist=["main"]).main(
        [a.out, "--arch", a.arch, "--shape", a.shape, "--seed", str(a.seed)]
        + ([] if a.vocab_size is None else ["--vocab-size", str(a.vocab_size)])))

    args = p.parse_args(argv)
    try:
        args.run(args)
    except (ValueError, TypeError) as e:
        raise SystemExit(f"qlinear-llm: error: {e}") from None
    except KeyboardInterrupt:
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
