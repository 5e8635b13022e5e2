"""Quality of quantization on real text: perplexity and KL divergence from the float model of the
trained models/stdlib-qwen2 on its held-out standard-library files (tools/train_models.py), for
qlinear's quantizations and for llama.cpp's GGUF files of the same checkpoint (Q8_0 by its
converter, the others by llama-quantize from its F32 file: every type of GGUF_TYPES), run by
qlinear and by llama.cpp's own `llama-perplexity --kl-divergence` against its F32 file, in one
run, with a per-type table of the two engines' KL divergences side by side.

Both engines cut the text as llama-perplexity does: chunks of 512 tokens, the second half of each
scored (qlinear: `scheme="chunks"`). Bits per weight: over the matmul weights (q/k/v, o, gate/up,
down and the lm head, here tied to the embedding), with their scales.

    python bench/llamacpp_vs.py --build     # llama.cpp's tools, once
    python bench/quality.py [--threads 2] [--types Q4_K_M Q6_K ...] [--gguf-only]

Needs torch and transformers (SmoothQuant, GPTQ), and llama.cpp's tools for its rows (without
them only qlinear's rows are computed).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

import llamacpp_vs as lc  # noqa: E402
import train_models as tm  # noqa: E402

import qlinear  # noqa: E402
from qlinear import llm  # noqa: E402

MODEL = Path(__file__).resolve().parents[1] / "models" / "stdlib-qwen2"
WINDOW = 512
GGUF_BITS = {"F32": 32, "F16": 16, "BF16": 16, "Q8_0": 8.5, "Q4_0": 4.5, "Q4_1": 5.0, "Q5_0": 5.5, "Q5_1": 6.0,
             "Q4_K": 4.5, "Q5_K": 5.5, "Q6_K": 6.5625, "Q3_K": 3.4375, "Q2_K": 2.625, "IQ4_NL": 4.5,
             "IQ4_XS": 4.25, "MXFP4": 4.25}


# llama.cpp's file types of the checkpoint, each run by both engines (llama-quantize from F32).
GGUF_TYPES = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K_S", "Q3_K_M", "Q4_K_S", "Q4_K_M", "Q5_K_S",
              "Q5_K_M", "Q6_K", "IQ4_NL", "IQ4_XS")


def held_out_text() -> str:
    return "\n".join(tm.read(f) for f in tm.split_files()[1])


def calibration_text() -> str:
    """Calibration for GPTQ and SmoothQuant: every 25th training file (never a held-out one)."""
    return "\n".join(tm.read(f) for f in tm.split_files()[0][::25])


def model_bits(model) -> float:
    from qlinear.llm.runtime.layers import Linear
    linears = [model.lm_head] + [m for b in model.blocks for m in (b.attention.qkv, b.attention.o, b.gate_up, b.down)]
    weights = [m.weight for m in linears if isinstance(m, Linear)]
    n = sum(int(np.prod(w.shape)) for w in weights)
    bits = sum(int(np.prod(w.shape)) * (w.bits_per_weight if hasattr(w, "bits_per_weight") else 32) for w in weights)
    return bits / n


def gguf_bits(path: Path) -> float:
    import gguf
    r = gguf.GGUFReader(str(path))
    n = bits = 0
    for t in r.tensors:
        if len(t.shape) == 2 and (t.name.startswith("blk.") or t.name in ("output.weight", "token_embd.weight")):
            if t.name == "token_embd.weight" and any(u.name == "output.weight" for u in r.tensors):
                continue  # untied: the embedding is a lookup table, not a matmul
            count = int(np.prod(t.shape))
            n += count
            bits += count * GGUF_BITS[t.tensor_type.name]
    return bits / n


def gguf_of(quant: str) -> Path:
    """The trained checkpoint as a GGUF file of llama.cpp's own making (cached)."""
    return lc.checkpoint_gguf(MODEL, quant)


def llamacpp_kld(quant: str, text_file: Path, base_file: Path, threads: int) -> dict:
    """llama-perplexity on a GGUF file: F32 writes the base logits, the others read them."""
    exe = lc.tool("llama-perplexity")
    args = [str(exe), "-m", str(gguf_of(quant)), "-f", str(text_file), "-c", str(WINDOW), "-t", str(threads),
            "-b", str(WINDOW), "--kl-divergence-base", str(base_file)]
    if quant != "F32":
        args.append("--kl-divergence")
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"llama-perplexity failed on {quant}: {r.stderr[-2000:]}")
    text = r.stdout + r.stderr
    out = {}
    for key, pat in (("ppl", r"Mean PPL\(Q\)\s*:\s*([\d.]+)"), ("kld", r"Mean\s+KLD:\s*([\d.]+)"),
                     ("kld_median", r"Median\s+KLD:\s*([\d.]+)"), ("kld_p99", r"99\.0%\s+KLD:\s*([\d.]+)"),
                     ("same_top", r"Same top p:\s*([\d.]+)"), ("ppl_f32", r"Final estimate: PPL = ([\d.]+)")):
        m = re.search(pat, text)
        if m:
            out[key] = float(m.group(1))
    want = ("ppl_f32",) if quant == "F32" else ("ppl", "kld", "kld_median", "kld_p99", "same_top")
    if any(k not in out for k in want):
        raise RuntimeError(f"llama-perplexity on {quant}: no {[k for k in want if k not in out]} in its output: {text[-1500:]}")
    if "same_top" in out:
        out["same_top"] /= 100
    return out


def qlinear_rows(text: str, base_file: Path, threads: int, tmp: Path, types=GGUF_TYPES, gguf_only=False) -> list:
    qlinear.set_num_threads(threads)
    calib = tmp / "calibration.txt"
    calib.write_text(calibration_text())
    base = llm.load(MODEL, bits=None, act="float", max_context=WINDOW, progress=False)
    ref = llm.perplexity(base, text, WINDOW, scheme="chunks", save_base=base_file)
    rows = [("float (bf16 checkpoint, float32 arithmetic)", ref, 32.0)]

    def converted(name, **kw):
        out = tmp / name
        if not out.exists():
            llm.convert(MODEL, out, progress=False, calibration=str(calib) if kw.get("method") == "gptq"
                        or "smooth" in kw else None, **kw)
        return out

    configs = [
        ("W8A8 g64", MODEL, dict(bits=8, group_size=64)),
        ("W8A8 per channel, activation scale per row", MODEL, dict(bits=8, group_size=None, act_block=None)),
        ("W8A8 per channel, per row + SmoothQuant 0.5", lambda: converted("w8-smooth", bits=8, group_size=None, smooth=0.5),
         dict(act_block=None)),
        ("W4A8 g32 round to nearest", MODEL, dict(bits=4, group_size=32)),
        ("W4A8 g64 round to nearest", MODEL, dict(bits=4, group_size=64)),
        ("W4A8 g128 round to nearest", MODEL, dict(bits=4, group_size=128)),
        ("W4A8 g64 + SmoothQuant 0.5", lambda: converted("w4g64-smooth", bits=4, group_size=64, smooth=0.5), {}),
        ("W4A8 g32 + GPTQ", lambda: converted("w4g32-gptq", bits=4, group_size=32, method="gptq"), {}),
        ("W4A8 g32 symmetric + GPTQ", lambda: converted("w4g32s-gptq", bits=4, group_size=32, symmetric=True,
                                                        method="gptq"), {}),
        ("W4A8 g64 + GPTQ", lambda: converted("w4g64-gptq", bits=4, group_size=64, method="gptq"), {}),
        ("W4A8 g64 + GPTQ, act order", lambda: converted("w4g64-gptq-ao", bits=4, group_size=64, method="gptq",
                                                          act_order=True), {}),
        ("W4A8 g128 + GPTQ", lambda: converted("w4g128-gptq", bits=4, group_size=128, method="gptq"), {}),
        ("int4@fp32 g64 (float activations)", MODEL, dict(bits=4, group_size=64, act="float")),
        ("float weights, float16 KV cache", MODEL, dict(bits=None, act="float", kv_cache="float16")),
        ("W4A8 g64 + GPTQ, float16 KV cache", lambda: converted("w4g64-gptq", bits=4, group_size=64, method="gptq"),
         dict(kv_cache="float16")),
    ]
    if gguf_only:
        configs = []
    configs += [(f"GGUF {q} (llama.cpp's file, codes moved)", lambda q=q: gguf_of(q), {}) for q in types]
    for name, src, kw in configs:
        try:
            path = src() if callable(src) else src
        except (subprocess.CalledProcessError, FileNotFoundError) as e:
            print(f"{name}: skipped ({e})", file=sys.stderr)
            continue
        model = llm.load(path, max_context=WINDOW, progress=False, **kw)
        res = llm.perplexity(model, text, WINDOW, scheme="chunks", base=base_file)
        rows.append((name, res, model_bits(model)))
        print(f"{name}: {res}", file=sys.stderr, flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--types", nargs="+", default=list(GGUF_TYPES), help="llama.cpp file types to run")
    ap.add_argument("--gguf-only", action="store_true", help="only the GGUF files (no qlinear quantizations)")
    a = ap.parse_args()
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    with tempfile.TemporaryDirectory(prefix="qlinear-quality-") as d:
        tmp = Path(d)
        text = held_out_text()
        text_file = tmp / "held_out.txt"
        text_file.write_text(text)
        rows = qlinear_rows(text, tmp / "qlinear-base.qlw", a.threads, tmp, a.types, a.gguf_only)
        peers = {}
        if lc.tool("llama-perplexity").exists():
            for q in ("F32", *a.types):
                peers[q] = llamacpp_kld(q, text_file, tmp / "llamacpp-base.kld", a.threads)
                print(f"llama.cpp {q}: {peers[q]}", file=sys.stderr, flush=True)
    tokens = rows[0][1].tokens
    print(f"\nmodels/stdlib-qwen2 on its held-out files: {tokens} scored tokens (chunks of {WINDOW}, second halves); "
          f"CPU {cpu}, qlinear level {qlinear.cpu_info()['active_isa']}, {a.threads} threads\n")
    print("| configuration | bits / weight | perplexity | KLD mean | KLD median | KLD 99% | same top token |")
    print("|---|---|---|---|---|---|---|")
    for name, res, bits in rows:
        d = res.divergence
        kld = ("—", "—", "—", "—") if d is None else (f"{d.mean:.3g}", f"{d.median:.3g}", f"{d.p99:.3g}",
                                                       f"{100 * d.top1_agreement:.2f}%")
        print(f"| qlinear {name} | {bits:.3f} | {res.perplexity:.3f} | " + " | ".join(kld) + " |")
    for q, r in peers.items():
        bits = gguf_bits(gguf_of(q))
        if q == "F32":
            print(f"| llama.cpp F32 (its base) | {bits:.3f} | {r.get('ppl_f32', float('nan')):.3f} | — | — | — | — |")
        else:
            print(f"| llama.cpp {q} (llama-perplexity) | {bits:.3f} | {r.get('ppl', float('nan')):.3f} | "
                  f"{r.get('kld', float('nan')):.3g} | {r.get('kld_median', float('nan')):.3g} | "
                  f"{r.get('kld_p99', float('nan')):.3g} | {100 * r.get('same_top', float('nan')):.2f}% |")
    if len(peers) > 1:
        ours = {name.split()[1]: res for name, res, _ in rows if name.startswith("GGUF ")}
        print("\nKL divergence from each engine's own float run, the same file, per type")
        print("| file type | bits / weight | qlinear KLD | llama.cpp KLD | qlinear / llama.cpp | "
              "qlinear same top | llama.cpp same top |")
        print("|---|---|---|---|---|---|---|")
        for q, r in peers.items():
            if q == "F32" or q not in ours or ours[q].divergence is None:
                continue
            d = ours[q].divergence
            print(f"| {q} | {gguf_bits(gguf_of(q)):.3f} | {d.mean:.4g} | {r['kld']:.4g} | {d.mean / r['kld']:.3f} | "
                  f"{100 * d.top1_agreement:.2f}% | {100 * r['same_top']:.2f}% |")
    unigram = np.exp(json.loads((MODEL / "training_log.json").read_text())["unigram_held_out_loss"])
    print(f"\nunigram baseline (training-token frequencies, add-one): perplexity {unigram:.1f}")


if __name__ == "__main__":
    main()
