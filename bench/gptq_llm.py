"""GPTQ against round-to-nearest in LLM conversion: teacher-forced logits cosine against the float
model and perplexity, on held-out text, at the same bits.

The checkpoint is the random Qwen2.5-0.5B-shaped one of bench/test_llm.py (built there once into
QLINEAR_BENCH_MODELS, default ~/.cache/qlinear-bench; read here, not modified), or --checkpoint.
Texts (all from Python's own standard library, deterministic for a Python version; the synthetic
tokenizer was trained on it):

  calibration   the sources of every 4th top-level stdlib module (sorted names, from the 1st)
  held-out 1    the sources of every 4th module from the 3rd: disjoint files
  held-out 2    docstring sentences (``qlinear.accuracy.docstring_sentences``); the modules they
                come from are left out of both source sets

  validation    the sources of every 4th module from the 2nd: --tune-damp scores GPTQ's dampening
                on it (calibration side; the held-out sets are not read then)

Each (group size, method) is converted (int4, asymmetric) into a temporary folder, loaded (W4A8),
and compared with the float model (``bits=None``) on the held-out tokens: mean per-position cosine
of the logits, top-1 agreement, and perplexity (``llm.perplexity``, windows of --window tokens).
Random weights: the model predicts nothing, its perplexity is near the vocabulary size; what
matters is how far each quantized model moves from the float one.

    python bench/gptq_llm.py                                 # int4 g64 and g128, rtn and gptq
    python bench/gptq_llm.py --checkpoint DIR --groups 64 --eval-tokens 512 --calibration-tokens 1024
    python bench/gptq_llm.py --tune-damp --checkpoint DIR   # GPTQ's dampening on the validation text
"""

from __future__ import annotations

import argparse
import os
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import numpy as np

from qlinear import llm
from qlinear.accuracy import _DOC_MODULES, docstring_sentences

ROOT = Path(os.environ.get("QLINEAR_BENCH_MODELS", Path.home() / ".cache" / "qlinear-bench"))


def stdlib_sources(start: int, every: int = 4) -> str:
    """Sources of every ``every``-th top-level standard-library module from ``start`` (sorted),
    without the modules the docstring set reads."""
    skip = {m.split(".")[0] for m in _DOC_MODULES}
    files = [p for p in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")) if p.stem not in skip]
    return "".join(p.read_text(encoding="utf-8", errors="replace") for p in files[start::every])


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sum(a * b, 1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def evaluate(model, sets: dict, window: int, ref: dict = None) -> dict:
    """Per held-out set: logits (in windows of ``window`` tokens, each its own sequence), and the
    cosine / top-1 agreement against ``ref``'s, and perplexity."""
    out = {}
    for name, ids in sets.items():
        logits = np.concatenate([model.logits(ids[s:s + window]) for s in range(0, len(ids), window)])
        r = {"logits": logits, "ppl": llm.perplexity(model, ids, window=window, stride=window // 2)}
        if ref is not None:
            r["cos"] = float(cosines(logits, ref[name]["logits"]).mean())
            r["top1"] = float((logits.argmax(1) == ref[name]["logits"].argmax(1)).mean())
        out[name] = r
    return out


def tune_damp(args, ref_model, calibration: Path, damps) -> None:
    """GPTQ at each dampening, scored on the validation text (logits cosine vs float)."""
    sets = {"validation": np.asarray(ref_model.tokenizer.encode(stdlib_sources(1)), np.int64)[:args.eval_tokens]}
    ref = evaluate(ref_model, sets, args.window)
    print("| weights | damp | validation logits cosine | top-1 | layer rel. error (GPTQ / RTN) |\n|---|---|---|---|---|")
    for g in args.groups:
        for d in damps:
            out = calibration.parent / f"damp{d}-g{g}"
            llm.convert(args.checkpoint, out, bits=4, group_size=g, method="gptq", calibration=calibration,
                        calibration_tokens=args.calibration_tokens, damp=d, act_order=args.act_order, progress=False)
            model = llm.load(out, progress=False)
            r = evaluate(model, sets, args.window, ref)["validation"]
            info = model.info["gptq"]
            print(f"| int4 g{g} | {d} | {r['cos']:.5f} | {r['top1']:.3f} | {info['rel_error']:.5f} / "
                  f"{info['rel_error_rtn']:.5f} |", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", type=Path, default=ROOT / "qwen2.5-0.5b-v4096")
    ap.add_argument("--groups", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--methods", nargs="+", default=["rtn", "gptq"], choices=["rtn", "gptq"])
    ap.add_argument("--eval-tokens", type=int, default=1024, help="held-out tokens per set")
    ap.add_argument("--window", type=int, default=512, help="tokens per evaluation window")
    ap.add_argument("--calibration-tokens", type=int, default=4096)
    ap.add_argument("--damp", type=float, default=None, help="GPTQ dampening (default: llm.convert's)")
    ap.add_argument("--act-order", action="store_true")
    ap.add_argument("--tune-damp", nargs="*", type=float, metavar="DAMP",
                    help="score these dampenings (default 0.003 .. 0.3) on the validation text instead")
    args = ap.parse_args(argv)
    if not (args.checkpoint / "config.json").is_file():
        sys.exit(f"{args.checkpoint}: no checkpoint (python bench/test_llm.py builds it, or "
                 "qlinear-llm make-test-model DIR --shape qwen2.5-0.5b --vocab-size 4096 --dtype bfloat16)")
    work = Path(tempfile.mkdtemp(prefix="gptq-llm-"))
    calibration = work / "calibration.txt"
    calibration.write_text(stdlib_sources(0), encoding="utf-8")
    t0 = time.perf_counter()
    ref_model = llm.load(args.checkpoint, bits=None, act="float", progress=False)
    tok = ref_model.tokenizer
    if args.tune_damp is not None:
        return tune_damp(args, ref_model, calibration, args.tune_damp or [0.003, 0.01, 0.03, 0.1, 0.3])
    sets = {"stdlib sources": np.asarray(tok.encode(stdlib_sources(2)), np.int64)[:args.eval_tokens],
            "docstrings": np.asarray(tok.encode(" ".join(docstring_sentences(1024))), np.int64)[:args.eval_tokens]}
    ref = evaluate(ref_model, sets, args.window)
    del ref_model
    ppls = ", ".join(f"{n} perplexity {r['ppl'].perplexity:.2f}" for n, r in ref.items())
    print(f"float model: {ppls} [{time.perf_counter() - t0:.0f} s]", file=sys.stderr, flush=True)
    gptq = {k: v for k, v in (("damp", args.damp), ("act_order", args.act_order)) if v is not None}
    rows = []
    for g in args.groups:
        for method in args.methods:
            out = work / f"{method}-g{g}"
            t0 = time.perf_counter()
            extra = dict(calibration=calibration, calibration_tokens=args.calibration_tokens, **gptq) \
                if method == "gptq" else {}
            llm.convert(args.checkpoint, out, bits=4, group_size=g, method=method, progress=sys.stderr.isatty(),
                        **extra)
            seconds = time.perf_counter() - t0
            model = llm.load(out, progress=False)
            res = evaluate(model, sets, args.window, ref)
            info = model.info.get("gptq", {})
            rows.append((g, method, seconds, res, info, (out / "model.qlinear").stat().st_size))
            print(f"int4 g{g} {method}: " + ", ".join(f"{n} cos {r['cos']:.5f} ppl {r['ppl'].perplexity:.2f}"
                                                     for n, r in res.items()) + f" [convert {seconds:.0f} s]",
                  file=sys.stderr, flush=True)
            del model
    calib_facts = f"{calibration.name}: {args.calibration_tokens} tokens at most"
    names = list(sets)
    print(f"\n{args.checkpoint.name}: W4A8, held-out {args.eval_tokens} tokens per set, windows of "
          f"{args.window}; calibration {calib_facts}\n")
    print("| weights | method | " + " | ".join(f"{n}: logits cosine | top-1 | perplexity" for n in names)
          + " | layer rel. error (GPTQ / RTN) | convert s |")
    print("|---|---|" + "---|---|---|" * len(names) + "---|---|")
    print("| float | - | " + " | ".join(f"1 | 1 | {ref[n]['ppl'].perplexity:.3f}" for n in names) + " | - | - |")
    for g, method, seconds, res, info, _ in rows:
        err = f"{info['rel_error']:.5f} / {info['rel_error_rtn']:.5f}" if info else "-"
        print(f"| int4 g{g} | {method} | "
              + " | ".join(f"{res[n]['cos']:.5f} | {res[n]['top1']:.3f} | {res[n]['ppl'].perplexity:.3f}" for n in names)
              + f" | {err} | {seconds:.0f} |")
    print(f"\n(converted models in {work}: qlinear-llm bench {work}/gptq-g{args.groups[0]} vs .../rtn-g{args.groups[0]})")


if __name__ == "__main__":
    main()
