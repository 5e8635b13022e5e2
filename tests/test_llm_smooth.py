"""llm.convert(smooth=alpha): SmoothQuant's scales folded into a float checkpoint (converted.smooth)
leave the function it computes unchanged, move activation range into the weights, and are recorded
in the converted file."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
for needed in ("tokenizers", "jinja2", "transformers"):
    pytest.importorskip(needed)

from qlinear import llm  # noqa: E402
from qlinear.llm.converted.smooth import smooth_checkpoint  # noqa: E402
from qlinear.llm.synthetic import local_text, make_checkpoint  # noqa: E402

# grouped-query attention (two query heads per value head: the value rows' scales are shared)
SHAPE = dict(hidden_size=96, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
             num_hidden_layers=3, vocab_size=768)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("smooth") / "hf", shape="tiny", seed=3, norm_noise=0.3, **SHAPE)


@pytest.fixture(scope="module")
def text():
    return "".join(local_text(60_000))


@pytest.fixture(scope="module")
def calibration_ids(ckpt, text):
    return llm.load(ckpt, bits=None, act="float", progress=False).tokenizer.encode(text[:20_000])


@pytest.mark.parametrize("alpha", [0.5, 0.8])
def test_smoothed_checkpoint_computes_the_same_function(ckpt, calibration_ids, text, alpha, tmp_path):
    out = smooth_checkpoint(ckpt, tmp_path / "smoothed", calibration_ids, alpha)
    before = llm.load(ckpt, bits=None, act="float", progress=False)
    after = llm.load(out, bits=None, act="float", progress=False)
    ids = before.tokenizer.encode(text[-3000:])[:200]
    assert after.tokenizer.encode(text[-3000:])[:200] == ids
    a, b = before.logits(ids), after.logits(ids)
    np.testing.assert_allclose(b, a, rtol=0, atol=2e-4 * np.abs(a).max())
    # the weights did change: the first layer's input norm now divides by s
    from safetensors.numpy import load_file
    w0 = load_file(ckpt / "model.safetensors")["model.layers.0.input_layernorm.weight"]
    w1 = load_file(out / "model.safetensors")["model.layers.0.input_layernorm.weight"]
    assert not np.allclose(w0, w1)


def test_smoothing_flattens_the_activation_range(ckpt, calibration_ids, tmp_path):
    """Per-channel activation maxima into q/k/v become more even (alpha = 1 moves them all)."""
    import transformers

    def spread(path):
        model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        seen = []
        hook = model.model.layers[0].self_attn.q_proj.register_forward_pre_hook(
            lambda m, i: seen.append(i[0].reshape(-1, i[0].shape[-1]).abs().amax(0)))
        with torch.no_grad():
            model(torch.tensor(calibration_ids[:256])[None])
        hook.remove()
        m = seen[0].numpy()
        return m.max() / np.median(m)

    out = smooth_checkpoint(ckpt, tmp_path / "s1", calibration_ids[:256], 1.0)
    assert spread(ckpt) > 1.2 and spread(out) < 1.01


def test_convert_with_smooth_records_it(ckpt, text, tmp_path):
    calib = tmp_path / "calibration.txt"
    calib.write_text(text[:20_000], encoding="utf-8")
    out = llm.convert(ckpt, tmp_path / "w8", bits=8, group_size=None, smooth=0.5, calibration=calib, progress=False)
    model = llm.load(out, act_block=None, progress=False)
    assert model.info["smooth"]["alpha"] == 0.5 and model.info["smooth"]["source"] == "calibration.txt"
    assert model.info["method"] == "rtn"
    ref = llm.load(ckpt, bits=None, act="float", progress=False)
    ids = ref.tokenizer.encode(text[-2000:])[:96]
    a, b = ref.logits(ids), model.logits(ids)
    cos = np.sum(a * b, 1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert cos.min() > 0.99


@pytest.mark.parametrize("kwargs, match", [
    (dict(smooth=0.5), "smooth= needs calibration"),
    (dict(smooth=1.5, calibration=[1, 2, 3]), r"must be in \[0, 1\]"),
    (dict(smooth=-0.1, calibration=[1, 2, 3]), r"must be in \[0, 1\]"),
])
def test_bad_arguments(ckpt, tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        llm.convert(ckpt, tmp_path / "out", progress=False, **kwargs)


def test_families_without_the_llama_block_are_refused(tmp_path):
    phi3 = make_checkpoint(tmp_path / "phi3", arch="phi3", shape="tiny")
    with pytest.raises(ValueError, match="SmoothQuant is implemented for"):
        smooth_checkpoint(phi3, tmp_path / "out", [1, 2, 3, 4], 0.5)
