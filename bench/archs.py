"""Decode speed of each architecture beside Qwen2's at one geometry (Qwen2.5-0.5B's: hidden 896,
24 layers, 14 heads / 2 KV heads, intermediate 4864; a 4096-token vocabulary so that the lm head
does not dominate). Random checkpoints made here (cached in --dir), W4A8 group 64.

    python bench/archs.py --threads 1 --decode-tokens 64
    python bench/archs.py --archs qwen2 gemma3 --decode-tokens 16      # a short check

The architectures' own head_dim (64 here), sliding windows of 512 positions (Gemma 3's) for the
families that have them; the prompt (--prompt-tokens) plus decode runs past that window when
they add up to more than 512.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def main(argv=None) -> None:
    from qlinear import llm
    from qlinear.llm import synthetic
    from qlinear.llm.benchmark import bench

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--archs", nargs="+", default=list(synthetic.ARCHS))
    ap.add_argument("--dir", default="/tmp/qlinear-bench-archs")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    shape = dict(synthetic.SHAPES["qwen2.5-0.5b"], vocab_size=4096)
    windows = {"mistral": 512, "gemma2": 512, "gemma3": 512, "phi3": 512}
    print(f"{'arch':10s} {'decode tok/s':>12s} {'prefill tok/s':>13s}  features")
    for arch in args.archs:
        path = Path(args.dir) / arch
        if not (path / "config.json").is_file():
            extra = {"sliding_window": windows[arch]} if arch in windows else {}
            synthetic.make_checkpoint(path, arch=arch, seed=0, force=True, **shape, **extra)
        model = llm.load(path, bits=4, group_size=64, threads=args.threads, progress=False,
                         max_context=args.prompt_tokens + args.decode_tokens + 8)
        row = bench(model, args.prompt_tokens, args.decode_tokens, args.repeats)
        c = model.config
        feats = [f for f, on in (("qk_norm", c.qk_norm), ("sandwich_norms", c.sandwich_norms),
                                 (c.hidden_act, c.hidden_act != "silu"), ("softcap", c.attn_softcap),
                                 (f"window {c.sliding_window}", c.layer_types)) if on]
        print(f"{arch:10s} {row['decode_tok_s']:12.1f} {row['prefill_tok_s']:13.1f}  {', '.join(feats)}", flush=True)


if __name__ == "__main__":
    main()
