"""llm.convert(method="gptq"): GPTQ block by block on a tiny random checkpoint built here."""

import json

import numpy as np
import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from qlinear import PackedWeight, llm  # noqa: E402
from qlinear._format import load_weights  # noqa: E402
from qlinear.llm.converted import gptq  # noqa: E402
from qlinear.llm.cli import main as cli  # noqa: E402
from qlinear.llm.synthetic import local_text, make_checkpoint  # noqa: E402

# hidden 128: two weight groups of 64 per row; intermediate 352 (not a multiple of 64: a short last group)
SHAPE = dict(hidden_size=128, intermediate_size=352, num_attention_heads=4, num_key_value_heads=2,
             num_hidden_layers=2, vocab_size=1024)
CALIBRATION_TOKENS = 8192  # well above K (hidden 128, intermediate 352): few tokens overfit GPTQ


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("gptq") / "hf", shape="tiny", seed=1, **SHAPE)


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    """A calibration text file and held-out text (other standard-library files)."""
    files = list(local_text(400_000))
    path = tmp_path_factory.mktemp("text") / "calibration.txt"
    path.write_text("".join(files[:-3]), encoding="utf-8")
    return path, "".join(files[-3:])


@pytest.fixture(scope="module")
def converted(ckpt, texts, tmp_path_factory):
    root = tmp_path_factory.mktemp("converted")
    return {m: llm.convert(ckpt, root / m, group_size=64, method=m, progress=False,
                           **({"calibration": texts[0], "calibration_tokens": CALIBRATION_TOKENS}
                              if m == "gptq" else {}))
            for m in ("rtn", "gptq")}


def _cos(a, b):
    return float(np.mean(np.sum(a * b, 1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)))


def test_gptq_file_loads_with_method_and_calibration_in_metadata(converted, texts):
    model = llm.load(converted["gptq"], progress=False)
    assert model.info["method"] == "gptq" and model.info["bits"] == 4 and model.info["group_size"] == 64
    calib = model.info["calibration"]
    assert calib["source"] == "calibration.txt" and calib["tokens"] == CALIBRATION_TOKENS
    assert calib["sequences"] == 16 and len(calib["sha256"]) == 64
    assert model.info["gptq"]["lm_head"] == "gptq" and model.info["gptq"]["damp"] == gptq.DAMP
    _, meta = load_weights(converted["gptq"] / "model.qlinear")
    assert meta["quantization"]["method"] == "gptq"
    assert json.loads(json.dumps(meta["quantization"])) == meta["quantization"]
    assert llm.load(converted["rtn"], progress=False).info["method"] == "rtn"
    ids = model.tokenizer.encode("def main():\n    return")
    assert len(model.generate_ids(ids, 6, stop_ids=())) == 6  # the compiled decode step runs it


def test_same_packed_layouts_as_round_to_nearest(converted):
    """GPTQ changes codes, not formats: every tensor has the RTN file's shape, bits, group and layout."""
    a, _ = load_weights(converted["rtn"] / "model.qlinear")
    b, _ = load_weights(converted["gptq"] / "model.qlinear")
    assert a.keys() == b.keys()
    for name in a:
        if isinstance(a[name], PackedWeight):
            pa, pb = a[name], b[name]
            assert (pb.shape, pb.bits, pb.group_size, pb.layout, pb.symmetric, pb.nbytes) == \
                   (pa.shape, pa.bits, pa.group_size, pa.layout, pa.symmetric, pa.nbytes), name
            assert not np.array_equal(pa.unpack()[0], pb.unpack()[0]), name
        else:
            np.testing.assert_array_equal(np.asarray(a[name]), np.asarray(b[name]))


def _first_layer_inputs(ckpt, ids):
    """The first block's qkv input, computed here from the checkpoint's float tensors."""
    from safetensors.numpy import load_file
    t = load_file(str(ckpt / "model.safetensors"))
    x = t["model.embed_tokens.weight"][ids].astype(np.float64)
    x = x / np.sqrt((x * x).mean(1, keepdims=True) + 1e-6) * t["model.layers.0.input_layernorm.weight"]
    w = np.concatenate([t[f"model.layers.0.self_attn.{n}_proj.weight"] for n in "qkv"])
    return x, w.astype(np.float64)


def test_gptq_lowers_the_layer_reconstruction_error(ckpt, tmp_path):
    """GPTQ minimizes ||X W^T - X Q^T|| on the calibration inputs X: on the first qkv projection
    (its inputs depend on no quantized layer) it must beat round-to-nearest there."""
    ids = [int(i) for i in np.random.default_rng(3).integers(0, SHAPE["vocab_size"], 384)]
    out = llm.convert(ckpt, tmp_path / "g", group_size=64, method="gptq", calibration=ids, progress=False)
    rtn = llm.convert(ckpt, tmp_path / "r", group_size=64, progress=False)
    x, w = _first_layer_inputs(ckpt, ids)
    err = {}
    for name, path in (("gptq", out), ("rtn", rtn)):
        q = load_weights(path / "model.qlinear")[0]["layers.0.qkv"].dequantize().astype(np.float64)
        err[name] = np.linalg.norm(x @ (w - q).T)
    assert err["gptq"] < 0.95 * err["rtn"], err  # measured 0.89 (random embeddings: a near-diagonal X^T X)
    assert llm.load(out, progress=False).info["calibration"]["source"] == "ids"


def test_logits_closer_to_float_than_round_to_nearest(ckpt, converted, texts):
    """Held-out text (not in the calibration file), teacher-forced logits against float weights."""
    ref = llm.load(ckpt, bits=None, act="float", progress=False)
    ids = ref.tokenizer.encode(texts[1])[:256]
    want = ref.logits(ids)
    cos = {m: _cos(llm.load(p, progress=False).logits(ids), want) for m, p in converted.items()}
    assert cos["gptq"] > cos["rtn"], cos


def test_deterministic(ckpt, converted, texts, tmp_path):
    again = llm.convert(ckpt, tmp_path / "again", group_size=64, method="gptq", calibration=texts[0],
                        calibration_tokens=CALIBRATION_TOKENS, progress=False)
    assert (again / "model.qlinear").read_bytes() == (converted["gptq"] / "model.qlinear").read_bytes()


def test_act_order_symmetric_and_cli(ckpt, texts, tmp_path, capsys):
    cli(["convert", str(ckpt), str(tmp_path / "ao"), "--method", "gptq", "--calibration", str(texts[0]),
         "--act-order", "--symmetric", "--group-size", "128", "--damp", "0.05", "--calibration-tokens", "256",
         "--no-progress"])
    assert "wrote" in capsys.readouterr().out
    model = llm.load(tmp_path / "ao", progress=False)
    assert model.info["gptq"]["act_order"] is True and model.info["gptq"]["damp"] == 0.05
    assert model.info["calibration"]["tokens"] == 256
    assert model.blocks[0].down.weight.symmetric and model.blocks[0].down.weight.group_size == 128
    assert np.isfinite(model.logits(model.tokenizer.encode(texts[1])[:32])).all()


def test_calibration_sequences_spread_over_the_text():
    cs = gptq.calibration_set(np.arange(1000), None, 1000, max_tokens=300, seq_len=100)
    assert [len(s) for s in cs.sequences] == [100, 100, 100]
    assert [int(s[0]) for s in cs.sequences] == [0, 400, 900]  # chunks 0, 4 (4.5 rounded to even), 9
    assert cs.facts()["tokens"] == 300 and cs.facts()["seq_len"] == 100
    short = gptq.calibration_set(list(range(7)), None, 50, max_tokens=300, seq_len=4)
    assert [list(s) for s in short.sequences] == [[0, 1, 2, 3], [4, 5, 6]]


@pytest.mark.parametrize("kwargs, match", [
    (dict(method="gptq"), "needs calibration"),
    (dict(method="awq", calibration=[1, 2]), "method must be one of"),
    (dict(calibration=[1, 2]), "applies to method='gptq' or smooth= only"),
    (dict(method="gptq", calibration="/nonexistent/calibration.txt"), "does not exist"),
    (dict(method="gptq", calibration=[]), "empty"),
    (dict(method="gptq", calibration=[5, 99999]), r"must lie in \[0, 1024\)"),
    (dict(method="gptq", calibration=[1, 2], damp=0.0), "damp must be a positive number"),
    (dict(method="gptq", calibration=[1, 2], bits=None), "bits must be 4 or 8"),
    (dict(method="gptq", calibration=[1, 2], calibration_tokens=0), "calibration_tokens must be a positive int"),
])
def test_bad_arguments(ckpt, tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        llm.convert(ckpt, tmp_path / "out", progress=False, **kwargs)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_bad_calibration_files(ckpt, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(ValueError, match="is empty"):
        llm.convert(ckpt, tmp_path / "a", method="gptq", calibration=empty, progress=False)
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"\xff\xfe\x00\x80" * 10)
    with pytest.raises(ValueError, match="UTF-8"):
        llm.convert(ckpt, tmp_path / "b", method="gptq", calibration=binary, progress=False)
    with pytest.raises(TypeError, match="1-D sequence of ints"):
        llm.convert(ckpt, tmp_path / "c", method="gptq", calibration=[0.5, 1.5], progress=False)
    with pytest.raises(TypeError, match="text file's path or a sequence"):
        llm.convert(ckpt, tmp_path / "d", method="gptq", calibration=42, progress=False)
    with pytest.raises(SystemExit, match="does not exist"):
        cli(["convert", str(ckpt), str(tmp_path / "e"), "--method", "gptq", "--calibration",
             str(tmp_path / "missing.txt"), "--no-progress"])
    with pytest.raises(SystemExit, match="needs calibration"):
        cli(["convert", str(ckpt), str(tmp_path / "f"), "--method", "gptq", "--no-progress"])
