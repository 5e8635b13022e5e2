"""``qlinear-llm make-test-model``: a random-initialized checkpoint with a locally trained
tokenizer (``synthetic``), for tests and examples without a hub."""

from __future__ import annotations


def add_parser(sub) -> None:
    from ..synthetic import ARCHS, DTYPES, HYBRIDS, SHAPES  # (no torch import: that happens in make_checkpoint)

    m = sub.add_parser("make-test-model", help="write a random-initialized checkpoint (needs torch, transformers)")
    m.add_argument("out_dir", help="directory to write (config.json, model.safetensors, tokenizer files)")
    m.add_argument("--arch", default="qwen2", choices=[*ARCHS, *HYBRIDS])
    m.add_argument("--shape", default="tiny", choices=list(SHAPES),
                   help="; ".join(f"{k}: hidden {v['hidden_size']}, {v['num_hidden_layers']} layers, "
                                  f"vocab {v['vocab_size']}" for k, v in SHAPES.items()))
    m.add_argument("--dtype", default="float32", choices=list(DTYPES), help="weights' dtype in the file")
    m.add_argument("--vocab-size", type=int, default=None, help="override the shape's vocabulary size")
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--hidden-act", default="silu", choices=["silu", "relu"], help="MLP activation (relu: llama only)")
    m.add_argument("--force", action="store_true", help="write into OUT_DIR even if it is not empty")
    m.set_defaults(run=run)


def run(args) -> None:
    from ..synthetic import make_checkpoint

    extra = {} if args.vocab_size is None else {"vocab_size": args.vocab_size}
    if args.hidden_act != "silu":
        extra["hidden_act"] = args.hidden_act
    out = make_checkpoint(args.out_dir, args.arch, args.shape, args.seed, dtype=args.dtype,
                          force=args.force, **extra)
    print(out)
