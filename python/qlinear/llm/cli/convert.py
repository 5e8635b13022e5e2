"""``qlinear-llm convert``: a Hugging Face checkpoint or GGUF file quantized once into qlinear's
model file (round to nearest or GPTQ)."""

from __future__ import annotations

import time

from .common import add_quant_args


def add_parser(sub) -> None:
    from ..converted.gptq import CALIBRATION_TOKENS, DAMP  # (no torch import: that happens when GPTQ runs)

    v = sub.add_parser("convert", help="quantize a Hugging Face checkpoint (or GGUF file) into qlinear's model file")
    v.add_argument("src", help="Hugging Face checkpoint directory or GGUF file")
    v.add_argument("out_dir", help="directory to write (model.qlinear + tokenizer files)")
    add_quant_args(v, "of the converted model")
    v.add_argument("--symmetric", action="store_true", help="symmetric weights (no offsets)")
    v.add_argument("--slim-vocab", action="store_true", help="lm head over the tokenizer's ids only")
    v.add_argument("--force", action="store_true", help="write into OUT_DIR even if it is not empty")
    v.add_argument("--flash", action="store_true", help="store each layer's FFN as neuron bundles (memory=flash)")
    v.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    v.add_argument("--method", default="rtn", choices=["rtn", "gptq"],
                   help="rtn: round to nearest; gptq: error feedback against --calibration (needs torch)")
    v.add_argument("--calibration", default=None, metavar="FILE", help="UTF-8 text for --method gptq and --smooth")
    v.add_argument("--smooth", type=float, default=None, metavar="ALPHA",
                   help="SmoothQuant first: activation outliers moved into the weights (alpha in 0..1, e.g. 0.5)")
    v.add_argument("--damp", type=float, default=DAMP, help="GPTQ dampening, fraction of the mean Hessian diagonal")
    v.add_argument("--act-order", action="store_true", help="GPTQ: columns in order of decreasing input energy")
    v.add_argument("--calibration-tokens", type=int, default=CALIBRATION_TOKENS,
                   help="at most this many calibration tokens, taken evenly over the file")
    v.set_defaults(run=run)


def run(args) -> None:
    from ..converted.convert import convert

    bits = None if args.bits == "none" else int(args.bits)
    t0 = time.perf_counter()
    gptq = {} if args.method == "rtn" else dict(damp=args.damp, act_order=args.act_order,
                                                calibration_tokens=args.calibration_tokens)
    out = convert(args.src, args.out_dir, bits=bits, group_size=args.group_size, symmetric=args.symmetric,
                  slim_vocab=args.slim_vocab, progress=not args.no_progress, force=args.force, flash=args.flash,
                  method=args.method, calibration=args.calibration, smooth=args.smooth, **gptq)
    print(f"wrote {out} in {time.perf_counter() - t0:.1f} s")
