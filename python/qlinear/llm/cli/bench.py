"""``qlinear-llm bench``: prefill and decode speed of a loaded model, with MNN.llm on the same
export or llama.cpp on the same GGUF file beside it (``--vs``)."""

from __future__ import annotations

import json
from pathlib import Path

from .common import add_load_args, add_speculative_args, load_model, speculation


def add_parser(sub) -> None:
    b = sub.add_parser("bench", help="prefill and decode speed")
    add_load_args(b)
    b.add_argument("--prompt-tokens", type=int, default=64)
    b.add_argument("--decode-tokens", type=int, default=32)
    b.add_argument("--repeats", type=int, default=1)
    b.add_argument("--vs", choices=["mnn", "llamacpp"], default=None,
                   help="also run MNN.llm on the same MNN export, or llama.cpp on the same GGUF file "
                        "(threads 1 and 2 unless --threads is given)")
    b.add_argument("--llamacpp", default=None, metavar="DIR",
                   help="bin folder of a llama.cpp build (default: $QLINEAR_LLAMACPP_BIN, ~/.cache/qlinear-llamacpp)")
    b.add_argument("--prompt-file", default=None, metavar="FILE",
                   help="the prompt: the first --prompt-tokens tokens of this UTF-8 text (default: random ids)")
    add_speculative_args(b)
    b.add_argument("--json", action="store_true")
    b.set_defaults(run=run)


def run(args) -> None:
    from ... import get_num_threads, set_num_threads
    from ..benchmark import bench, bench_text, bench_vs_llamacpp, bench_vs_mnn, weight_bits

    if args.vs == "llamacpp" and args.threads is None:
        args.threads = 1  # then 2: llama.cpp's peer figures are per thread count
        thread_counts = [1, 2]
    else:
        thread_counts = [None]
    model = load_model(args)
    model.tokenizer.stop_ids = set()  # decode exactly --decode-tokens tokens
    spec = speculation(args, model)
    prompt = None
    if args.prompt_file is not None:
        try:
            prompt = model.tokenizer.encode(Path(args.prompt_file).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"{args.prompt_file}: cannot read it as UTF-8 text ({e})") from None
    rows = []
    for threads in thread_counts:
        if threads is not None:
            set_num_threads(threads)
        row = bench(model, args.prompt_tokens, args.decode_tokens, args.repeats, prompt, **spec)
        row.update(threads=get_num_threads(), bits=weight_bits(model),
                   **{k: model.info[k] for k in ("act", "group_size")})
        if args.vs == "mnn":
            row["mnn"] = bench_vs_mnn(args.model, model, row, args.decode_tokens)
        elif args.vs == "llamacpp":
            row["llamacpp"] = bench_vs_llamacpp(args.model, model, row, args.decode_tokens, args.repeats,
                                                args.llamacpp)
        if model.info["memory"] == "flash":
            from ..flash.cost import flash_bench
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
