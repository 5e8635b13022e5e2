"""Whole-model speed of qlinear.llm, side by side with MNN.llm: prefill (64- and 1024-token prompts)
and decode tok/s (at those contexts) on a random Qwen2.5-0.5B-shaped model (hidden 896, 24 layers, 14 heads, 2 KV heads,
intermediate 4864), int4 group / block 64, W4A8, at 1 and 2 threads.

Engines:
  qlinear          the Hugging Face checkpoint converted to qlinear's model file
  qlinear-on-mnn   qlinear.llm.load on the MNN export of the same checkpoint (int4 block 64)
  mnn              MNN.llm (pip MNN 3.6.1) on that export, its own settings (W4A8, memory low)
The last two need MNN and llmexport (`tests/test_llm_mnn.py` says how they are installed).

Models are built once (needs torch + transformers) into QLINEAR_BENCH_MODELS (default
~/.cache/qlinear-bench). The vocabulary is 4096 by default, as the MNN.llm reference figure in the
design notes; QLINEAR_BENCH_VOCAB=151936 gives Qwen2.5's own.

    pytest bench/test_llm.py --benchmark-only --benchmark-group-by=param:phase
    python bench/test_llm.py [--rounds 8] [--threads 1 2] [--prompt-tokens 64 1024]   # interleaved
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tokenizers")

import qlinear  # noqa: E402
from qlinear import llm  # noqa: E402

PROMPTS, DECODE_TOKENS = (64, 1024), 32
VOCAB = int(os.environ.get("QLINEAR_BENCH_VOCAB", "4096"))
ROOT = Path(os.environ.get("QLINEAR_BENCH_MODELS", Path.home() / ".cache" / "qlinear-bench"))


def _checkpoint() -> Path:
    hf = ROOT / f"qwen2.5-0.5b-v{VOCAB}"
    if not (hf / "model.safetensors").is_file():
        pytest.importorskip("torch")
        pytest.importorskip("transformers")
        from qlinear.llm import synthetic
        synthetic.make_checkpoint(hf, shape="qwen2.5-0.5b", vocab_size=VOCAB, dtype="bfloat16",
                                  tokenizer_vocab=min(VOCAB, 4096))
    return hf


def _export() -> Path:
    pytest.importorskip("MNN")
    from qlinear.llm import mnn
    out = ROOT / f"qwen2.5-0.5b-v{VOCAB}-mnn-int4b64"
    if not (out / "llm.mnn").is_file():
        try:
            mnn.export_with_llmexport(_checkpoint(), out, bits=4, block=64)
        except ImportError as e:
            pytest.skip(str(e))
    return out


class QlinearEngine:
    def __init__(self, path):
        self.model = llm.load(path, max_context=max(PROMPTS) + DECODE_TOKENS + 8, progress=False)

    def prefill(self, ids):
        self.model.reset()
        return int(np.argmax(self.model.prefill(ids)))

    def step(self, token):
        return int(np.argmax(self.model._forward([token], self.model.cache.length)[0]))


class MnnEngine:
    def __init__(self, path, threads):
        from qlinear.llm.peers.mnn_llm import MnnLlm
        self.llm = MnnLlm(path, threads=threads)

    def prefill(self, ids):
        self.llm.reset()
        return int(np.argmax(self.llm._forward(ids)[-1]))

    def step(self, token):
        return int(np.argmax(self.llm._forward([token])[-1]))


_engines = {}


def engine(name: str, threads: int):
    qlinear.set_num_threads(threads)
    key = (name, threads if name == "mnn" else 0)
    if key not in _engines:
        if name == "qlinear":
            conv = ROOT / f"qwen2.5-0.5b-v{VOCAB}-int4g64"
            if not (conv / "model.qlinear").is_file():
                llm.convert(_checkpoint(), conv, bits=4, group_size=64, progress=False)
            _engines[key] = QlinearEngine(conv)
        elif name == "qlinear-on-mnn":
            _engines[key] = QlinearEngine(_export())
        else:
            _engines[key] = MnnEngine(_export(), threads)
    return _engines[key]


def prompt(tokens: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(0).integers(0, min(VOCAB, 4096), tokens)]


ENGINES = ["qlinear", "qlinear-on-mnn", "mnn"]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("name", ENGINES)
@pytest.mark.parametrize("prompt_tokens", PROMPTS)
@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_llm(benchmark, phase, prompt_tokens, name, threads):
    eng = engine(name, threads)
    ids = prompt(prompt_tokens)
    rounds = 5 if prompt_tokens <= 64 else 3
    if phase == "prefill":
        benchmark.pedantic(lambda: eng.prefill(ids), rounds=rounds, warmup_rounds=1)
        tokens = prompt_tokens
    else:
        def run(first):
            token = first
            for _ in range(DECODE_TOKENS):
                token = eng.step(token)

        benchmark.pedantic(run, setup=lambda: ((eng.prefill(ids),), {}), rounds=rounds, warmup_rounds=1)
        tokens = DECODE_TOKENS
    if benchmark.stats:  # None under --benchmark-disable
        benchmark.extra_info.update(engine=name, phase=phase, prompt_tokens=prompt_tokens, threads=threads,
                                    tokens=tokens, tok_s=tokens / benchmark.stats.stats.min)


def main(rounds: int = 8, threads_list=(1, 2), prompts=PROMPTS) -> None:
    """Interleaved rounds: per thread count and prompt length, every engine's prefill then its
    decode in turn, round after round, so that the load of a shared machine falls on all alike.
    Prints medians (and best) in tok/s and the ratios to MNN.llm."""
    import time

    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    print(f"{cpu}, {qlinear.cpu_info()['active_isa']}; Qwen2.5-0.5B-shaped, vocab {VOCAB}, int4 group / block 64, "
          f"W4A8; {DECODE_TOKENS} decoded tokens after the prompt; medians (best) of {rounds} interleaved rounds")
    print("| phase | prompt | threads | " + " | ".join(ENGINES) + " | qlinear / mnn | qlinear-on-mnn / mnn |")
    print("|---|---|---|" + "---|" * (len(ENGINES) + 2))
    for threads in threads_list:
        engines = {name: engine(name, threads) for name in ENGINES}
        for n in prompts:
            ids = prompt(n)
            times = {(name, phase): [] for name in ENGINES for phase in ("prefill", "decode")}
            for r in range(rounds + 1):  # round 0 warms up
                for name, eng in engines.items():
                    qlinear.set_num_threads(threads)
                    t0 = time.perf_counter()
                    token = eng.prefill(ids)
                    t1 = time.perf_counter()
                    for _ in range(DECODE_TOKENS):
                        token = eng.step(token)
                    t2 = time.perf_counter()
                    if r:
                        times[(name, "prefill")].append(n / (t1 - t0))
                        times[(name, "decode")].append(DECODE_TOKENS / (t2 - t1))
            for phase in ("prefill", "decode"):
                med = {e: float(np.median(times[(e, phase)])) for e in ENGINES}
                cells = [f"{med[e]:.1f} ({max(times[(e, phase)]):.1f})" for e in ENGINES]
                print(f"| {phase} | {n} | {threads} | " + " | ".join(cells) +
                      f" | {med['qlinear'] / med['mnn']:.2f}x | {med['qlinear-on-mnn'] / med['mnn']:.2f}x |", flush=True)


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="qlinear.llm and MNN.llm side by side, interleaved rounds")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--prompt-tokens", type=int, nargs="+", default=list(PROMPTS))
    a = ap.parse_args()
    main(a.rounds, tuple(a.threads), tuple(a.prompt_tokens))
