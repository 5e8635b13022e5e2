"""Qwen3-MoE decode and prefill: qlinear (the compiled decode step with its routed MLPs; and, for
reference, the previous path: the Python blocks with the routed MLP in numpy, one qlinear matmul
per expert) against llama.cpp, at 1 and 2 threads, in interleaved rounds: each round runs every
engine at every thread count (qlinear's one loaded model with its thread count switched), so
that the machine's drift between minutes moves the thread counts' figures alike and the ratio 2
threads / 1 is taken round by round.

The model: a synthetic Qwen3-MoE with Qwen2.5-0.5B's attention (hidden 896, 14 query heads, 2 KV
heads, 24 layers), 32 experts of width 608 per layer, the top 4 of them per token (weights
renormalized), vocabulary 4096: 1.3B weights, ~0.2B of them read per token. Its checkpoint is
written once (bfloat16, ~2.6 GB) into $QLINEAR_BENCH_MODELS (default ~/.cache/qlinear-bench).

llama.cpp (built by `python bench/llamacpp_vs.py --build`) runs `llama-bench` on the Q4_0 GGUF file
its converter and llama-quantize make of that checkpoint, and qlinear runs the same file (Q4_0's
codes moved into symmetric int4 group 32, W4A8). Without llama.cpp's tools qlinear runs the
checkpoint converted with `llm.convert(bits=4, group_size=32, symmetric=True)` and the table has
qlinear's figures only. Each round also times qlinear's GEMV on one 72 MB weight at every thread
count: the memory bandwidth decode can use, whose 2 threads / 1 bounds decode's.

    python bench/moe.py [--threads 1 2] [--rounds 3] [--prompt 64] [--decode 32] [--ik DIR]

``--ik DIR``: ik_llama.cpp's bin folder (bench/README.md: how to build it): its llama-bench runs the
same file too, with and without ``-rtr 1``, in the same rounds.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llamacpp_vs  # noqa: E402

ROOT = Path(os.environ.get("QLINEAR_BENCH_MODELS", Path.home() / ".cache" / "qlinear-bench"))
NAME = "qwen3moe-0.5b-e32k4-v4096"
SHAPE = dict(hidden_size=896, num_attention_heads=14, num_key_value_heads=2, num_hidden_layers=24, vocab_size=4096,
             intermediate_size=1216, moe_intermediate_size=608, num_experts=32, num_experts_per_tok=4,
             norm_topk_prob=True)


def checkpoint() -> Path:
    hf = ROOT / NAME
    if not (hf / "model.safetensors").is_file() and not (hf / "model.safetensors.index.json").is_file():
        from qlinear.llm import synthetic
        synthetic.make_checkpoint(hf, arch="qwen3_moe", shape="qwen2.5-0.5b", dtype="bfloat16", tokenizer_vocab=4096,
                                  norm_noise=0.1, force=True, **SHAPE)
    return hf


def converted() -> Path:
    out = ROOT / f"{NAME}-q4g32"
    if not (out / "model.qlinear").is_file():
        from qlinear import llm
        llm.convert(checkpoint(), out, bits=4, group_size=32, symmetric=True, progress=False, force=True)
    return out


class Qlinear(llamacpp_vs.Qlinear):
    """qlinear's prefill and decode tok/s on one model (compiled: the decode step and the compiled
    routed MLP; else the Python blocks with the routed MLP in numpy)."""

    def __init__(self, path: Path, threads: int, prompt: int, decode: int, compiled: bool = True):
        super().__init__(path, threads, prompt, decode)
        self.model.compiled_decode = compiled
        if not compiled:
            for b in self.model.blocks:
                b.core_moe = None


class Stream:
    """qlinear's GEMV (W4A8) on one 72 MB int4 weight on huge pages, as the model's are: the
    weight bytes per second a decode step's matmuls can reach at a thread count on this machine,
    so the ceiling of decode's 2 threads / 1 where decode is bound by memory."""

    def __init__(self):
        import qlinear
        from qlinear.llm import weight_region
        rng = np.random.default_rng(0)
        w = {"w": qlinear.pack_weight(rng.standard_normal((16384, 8192), dtype=np.float32), bits=4, group_size=32,
                                      symmetric=True)}
        weight_region.place(w)
        self.w, self.x = w["w"], rng.standard_normal(8192).astype(np.float32)

    def speed(self, threads: int) -> float:
        import qlinear
        qlinear.set_num_threads(threads)
        times = []
        for _ in range(8):
            t0 = time.perf_counter()
            qlinear.matmul_w4a8(self.x, self.w)
            times.append(time.perf_counter() - t0)
        return self.w.nbytes / float(np.median(times)) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--no-python", action="store_true", help="skip the previous path (the Python blocks)")
    ap.add_argument("--ik", type=Path, default=None,
                    help="ik_llama.cpp's bin folder (its llama-bench): run it too, with and without -rtr 1")
    a = ap.parse_args()
    lv = llamacpp_vs
    import qlinear
    from qlinear.llm.peers import llamacpp

    have_llamacpp = all(lv.tool(t).exists() for t in ("llama-bench", "llama-quantize"))
    gguf = lv.checkpoint_gguf(checkpoint(), "Q4_0", pre="qwen2") if have_llamacpp else None
    path = gguf or converted()
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    print(f"{cpu}, qlinear level {qlinear.cpu_info()['active_isa']}; synthetic Qwen3-MoE (24 layers, 32 experts "
          f"of 608, top 4, hidden 896, vocab 4096); {a.prompt}-token prompt, {a.decode} decoded tokens; "
          f"medians (best) of {a.rounds} interleaved rounds, tok/s")
    print(f"both engines on {gguf.name} (qlinear: W4A8)" if gguf else
          "qlinear: int4 g32 W4A8 (the checkpoint converted); llama.cpp: not built (python bench/llamacpp_vs.py --build)")
    peers = {"llama.cpp": (lv.BUILD / "bin", ())} if gguf else {}
    if gguf and a.ik is not None:
        if not (a.ik / "llama-bench").is_file():
            sys.exit(f"--ik {a.ik}: no llama-bench there (build ik_llama.cpp: bench/README.md)")
        peers.update({"ik": (a.ik, ()), "ik -rtr": (a.ik, ("-rtr", "1"))})
    ik = "ik" in peers
    print("| phase | threads | qlinear | qlinear, previous path (numpy MoE) | llama.cpp |"
          + (" ik | ik -rtr |" if ik else "") + " qlinear / llama.cpp |" + (" qlinear / best ik |" if ik else ""))
    print("|---" * (6 + (3 if ik else 0)) + "|")
    engines = {"qlinear": Qlinear(path, a.threads[0], a.prompt, a.decode)}
    if not a.no_python:
        engines["python"] = Qlinear(path, a.threads[0], a.prompt, a.decode, compiled=False)
    stream = Stream()
    streamed = {t: [] for t in a.threads}
    runs = {(name, t): [] for t in a.threads for name in [*engines, *peers]}
    for t in a.threads:
        for e in engines.values():
            e.threads = t
            e.speed()  # warm-up: builds the decode step, maps the weights
    for _ in range(a.rounds):
        for t in a.threads:
            streamed[t].append(stream.speed(t))
            for name, e in engines.items():
                e.threads = t
                runs[name, t].append(e.speed())
            for name, (where, extra) in peers.items():
                r = llamacpp.bench(gguf, a.prompt, a.decode, t, 1, where=str(where), extra_args=extra)
                runs[name, t].append({"prefill": r["prefill_tok_s"], "decode": r["decode_tok_s"]})
    results = {}
    for t in a.threads:
        for phase in ("prefill", "decode"):
            v = {name: [r[phase] for r in runs[name, u]] for name, u in runs if u == t}
            med = {name: float(np.median(x)) for name, x in v.items()}
            results[phase, t] = v
            cell = {name: f"{med[name]:.1f} ({max(v[name]):.1f})" for name in v}
            ratio = f"{med['qlinear'] / med['llama.cpp']:.2f}x" if "llama.cpp" in med else "-"
            iks = f" {cell['ik']} | {cell['ik -rtr']} |" if ik else ""
            best = f" {med['qlinear'] / max(med['ik'], med['ik -rtr']):.2f}x |" if ik else ""
            print(f"| {phase} | {t} | {cell['qlinear']} | {cell.get('python', '-')} | {cell.get('llama.cpp', '-')} |{iks} "
                  f"{ratio} |{best}", flush=True)
    if len(a.threads) > 1:
        lo, hi = min(a.threads), max(a.threads)

        def per_round(phase):
            r = [h / l for h, l in zip(results[phase, hi]["qlinear"], results[phase, lo]["qlinear"])]
            return f"{phase} {np.median(r):.2f}x (rounds: {' '.join(f'{x:.2f}' for x in r)})"
        print(f"\nqlinear {hi} threads / {lo}, median of the rounds' ratios: "
              + ", ".join(per_round(phase) for phase in ("prefill", "decode")))
        bw = [h / l for h, l in zip(streamed[hi], streamed[lo])]
        print(f"memory bound: qlinear's GEMV on a 72 MB weight reads {np.median(streamed[lo]):.1f} GB/s at {lo} "
              f"thread(s), {np.median(streamed[hi]):.1f} at {hi}: {np.median(bw):.2f}x (rounds: "
              f"{' '.join(f'{x:.2f}' for x in bw)}), the ceiling of decode's {hi} threads / {lo} on this machine")


if __name__ == "__main__":
    main()
