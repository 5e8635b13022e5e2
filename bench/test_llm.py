"""Whole-model speed of qlinear.llm: prefill (64-token prompt) and decode tok/s on a random
Qwen2.5-0.5B-shaped model (hidden 896, 24 layers, 14 heads, 2 KV heads, intermediate 4864),
int4 group 64 W4A8, at 1 and 2 threads.

The model is built once (needs torch + transformers) into QLINEAR_BENCH_MODELS (default
~/.cache/qlinear-bench). Its vocabulary is 4096 by default, as the MNN.llm reference figure in
the design notes; QLINEAR_BENCH_VOCAB=151936 gives Qwen2.5's own (its lm head is then ~27% of a
decode step's weight bytes).

    pytest bench/test_llm.py --benchmark-only
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tokenizers")

import qlinear  # noqa: E402
from qlinear import llm  # noqa: E402

PROMPT_TOKENS, DECODE_TOKENS = 64, 32
VOCAB = int(os.environ.get("QLINEAR_BENCH_VOCAB", "4096"))


@pytest.fixture(scope="module")
def model_dir():
    root = Path(os.environ.get("QLINEAR_BENCH_MODELS", Path.home() / ".cache" / "qlinear-bench"))
    hf = root / f"qwen2.5-0.5b-v{VOCAB}"
    out = root / f"qwen2.5-0.5b-v{VOCAB}-int4g64"
    if not (out / "model.qlinear").is_file():
        if not (hf / "model.safetensors").is_file():
            pytest.importorskip("torch")
            pytest.importorskip("transformers")
            from qlinear.llm import synthetic
            synthetic.make_checkpoint(hf, shape="qwen2.5-0.5b", vocab_size=VOCAB, dtype="bfloat16",
                                      tokenizer_vocab=min(VOCAB, 4096))
        llm.convert(hf, out, bits=4, group_size=64, progress=False)
    return out


@pytest.fixture(scope="module")
def model(model_dir):
    m = llm.load(model_dir, max_context=PROMPT_TOKENS + DECODE_TOKENS + 8, progress=False)
    m.tokenizer.stop_ids = set()  # always decode DECODE_TOKENS tokens
    return m


def prompt(model) -> list[int]:
    hi = min(model.tokenizer.vocab_size, model.config.vocab_size)
    return [int(t) for t in np.random.default_rng(0).integers(0, hi, PROMPT_TOKENS)]


@pytest.mark.parametrize("threads", [1, 2])
def test_prefill(benchmark, model, threads):
    qlinear.set_num_threads(threads)
    ids = prompt(model)

    def run():
        model.reset()
        model.prefill(ids)

    benchmark.pedantic(run, rounds=5, warmup_rounds=1)
    benchmark.extra_info.update(engine="qlinear", threads=threads, tokens=PROMPT_TOKENS,
                                tok_s=PROMPT_TOKENS / benchmark.stats.stats.min)


@pytest.mark.parametrize("threads", [1, 2])
def test_decode(benchmark, model, threads):
    qlinear.set_num_threads(threads)
    ids = prompt(model)

    def setup():
        model.reset()
        model.prefill(ids)
        return (), {}

    def run():
        token = ids[-1]
        for _ in range(DECODE_TOKENS):
            token = int(np.argmax(model._forward([token], model.cache.length)[0]))

    benchmark.pedantic(run, setup=setup, rounds=5, warmup_rounds=1)
    benchmark.extra_info.update(engine="qlinear", threads=threads, tokens=DECODE_TOKENS,
                                tok_s=DECODE_TOKENS / benchmark.stats.stats.min)
