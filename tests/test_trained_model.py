"""What random weights cannot show, on the model trained on the standard library (models/):
the float model learned its text; GPTQ's KL divergence from the float model is below round-to-
nearest's; W8A8's below W4A8's; the float16 KV cache's small and bounded; W8A8's greedy text is
the float model's for most of a paragraph; the trained files load from the Hugging Face
checkpoint, the converted file and llama.cpp's GGUF files with the same tokens."""

import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")

from qlinear import llm  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "models"
MODEL = MODELS / "stdlib-qwen2"
sys.path.insert(0, str(ROOT / "tools"))
import train_models  # noqa: E402

WINDOW = 256


@pytest.fixture(scope="module")
def held_out_ids():
    """About 5,000 tokens of the held-out files (never trained on)."""
    model = llm.load(MODEL, bits=None, act="float", progress=False)
    text = "\n".join(train_models.read(f) for f in ("textwrap.py", "heapq.py"))
    return model.tokenizer.encode(text)[:5120]


@pytest.fixture(scope="module")
def base(held_out_ids):
    return llm.load(MODEL, bits=None, act="float", max_context=WINDOW, progress=False)


def kld(model, base, ids) -> float:
    return llm.perplexity(model, ids, WINDOW, scheme="chunks", base=base).divergence.mean


def test_the_float_model_learned_its_text(base, held_out_ids):
    """Held-out perplexity far below the vocabulary (4,096) and a unigram model's."""
    import json
    ppl = llm.perplexity(base, held_out_ids, WINDOW, scheme="chunks").perplexity
    unigram = np.exp(json.loads((MODEL / "training_log.json").read_text())["unigram_held_out_loss"])
    assert ppl < unigram / 4 and ppl < 4096 / 20


def test_gptq_below_round_to_nearest_and_w8a8_below_w4a8(base, held_out_ids, tmp_path):
    pytest.importorskip("torch")
    calib = tmp_path / "calibration.txt"
    calib.write_text("\n".join(train_models.read(f) for f in train_models.split_files()[0][::80]))
    gptq = llm.convert(MODEL, tmp_path / "gptq", bits=4, group_size=64, method="gptq", calibration=str(calib),
                       calibration_tokens=4096, progress=False)
    k_gptq = kld(llm.load(gptq, max_context=WINDOW, progress=False), base, held_out_ids)
    k_rtn = kld(llm.load(MODEL, bits=4, group_size=64, max_context=WINDOW, progress=False), base, held_out_ids)
    k_w8 = kld(llm.load(MODEL, bits=8, group_size=64, max_context=WINDOW, progress=False), base, held_out_ids)
    assert k_gptq < 0.9 * k_rtn
    assert k_w8 < k_rtn / 10


def test_float16_kv_cache_divergence_is_small(base, held_out_ids):
    half = llm.load(MODEL, bits=None, act="float", kv_cache="float16", max_context=WINDOW, progress=False)
    k = kld(half, base, held_out_ids)
    assert 0 < k < 1e-4  # rounding keys and values to half moves the distributions, barely


GREEDY_PROMPTS = (
    'def dedent(text):\n    """Remove any common leading whitespace from every line',
    'class TextWrapper:\n    """\n    Object for wrapping/filling text.',
    'def nlargest(n, iterable, key=None):\n    """Find the n largest elements in a dataset.',
    'import re\n\n\ndef split(s, comments=False, posix=True):\n    """Split the string *s* using shell-like syntax."""\n',
)


def test_w8a8_greedy_text_is_the_float_models(base):
    """64 greedy tokens from each prompt: W8A8 writes the float model's text for at least half of
    each, and where they part, the float model's two leading logits were closer than the models'
    logits differ there (a near-tie that rounding decides, not a weight that went wrong)."""
    w8 = llm.load(MODEL, bits=8, group_size=64, progress=False)
    kept = []
    for text in GREEDY_PROMPTS:
        prompt = base.tokenizer.encode(text)
        want = base.generate_ids(prompt, 64, stop_ids=())
        got = w8.generate_ids(prompt, 64, stop_ids=())
        same = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), len(want))
        kept.append(same)
        assert same >= 32, (same, base.tokenizer.decode(want), base.tokenizer.decode(got))
        if same < len(want):
            ref, q = base.logits(prompt + want[:same])[-1], w8.logits(prompt + want[:same])[-1]
            top2 = np.sort(ref)[-2:]
            assert top2[1] - top2[0] < np.abs(ref - q).max(), (same, top2, np.abs(ref - q).max())
    assert sum(kept) >= 0.7 * 64 * len(GREEDY_PROMPTS), kept


@pytest.mark.parametrize("gguf", ["stdlib-qwen2-Q8_0.gguf", "stdlib-qwen2-Q4_0.gguf"])
def test_trained_files_load_from_every_source_with_one_tokenizer(held_out_ids, gguf, tmp_path):
    """The checkpoint, its conversion and llama.cpp's GGUF files (its converter and llama-quantize)
    encode text alike and predict alike."""
    pytest.importorskip("gguf")
    text = train_models.read("string.py")[:4000] + " ünïcode ✓ 12345 <|im_end|>"
    hf = llm.load(MODEL, bits=8, max_context=WINDOW, progress=False)
    converted = llm.load(llm.convert(MODEL, tmp_path / "q8", bits=8, progress=False), max_context=WINDOW,
                         progress=False)
    from_gguf = llm.load(MODELS / "gguf" / gguf, max_context=WINDOW, progress=False)
    want = hf.tokenizer.encode(text)
    assert converted.tokenizer.encode(text) == want == from_gguf.tokenizer.encode(text)
    assert from_gguf.tokenizer.decode(want) == hf.tokenizer.decode(want)
    np.testing.assert_array_equal(converted.logits(want[:64]), hf.logits(want[:64]))
    base = llm.load(MODEL, bits=None, act="float", max_context=WINDOW, progress=False)
    assert kld(from_gguf, base, held_out_ids[:2048]) < (0.002 if "Q8_0" in gguf else 0.05)
