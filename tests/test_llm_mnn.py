"""MNN LLM exports: reading llmexport's output, and MNN.llm side by side.

Builds a random tiny Qwen2 checkpoint and exports it with llmexport (int4 block 64, int4 block 128,
int8 per channel) once per session; needs MNN, llmexport, transformers and torch.
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("MNN")
pytest.importorskip("transformers")
pytest.importorskip("torch")
pytest.importorskip("safetensors")
import importlib.util  # noqa: E402

if importlib.util.find_spec("llmexport") is None:
    pytest.skip("llmexport is not installed", allow_module_level=True)

from qlinear.llm.mnn import (  # noqa: E402
    MnnExport, QuantizedLinear, export_with_llmexport, read_export)

sys.path.insert(0, str(Path(__file__).parent))
from _llm_reference import compare, forward  # noqa: E402

# hidden 128 and intermediate 384 make block 128 a real choice (llmexport halves a block size
# until it divides K); head_dim 32.
SHAPE = dict(hidden_size=128, intermediate_size=384, num_attention_heads=4, num_key_value_heads=2)
EXPORTS = {"int4-b64": (4, 64), "int4-b128": (4, 128), "int8-channel": (8, 0)}

TEXTS = [
    "hello world",
    "def foo(x):\n    return x + 1\n",
    "  two  spaces\tand a tab\n\n\nnewlines",
    "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n",
    "ünïcødé, 中文, emoji 😀, numbers 1234567890",
    "",
]


@pytest.fixture(scope="session")
def hf_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("mnn_hf") / "hf"
    # A subprocess: transformers and torch stay out of the test process (and its warning filters).
    args = json.dumps({"out": str(out), **SHAPE})
    code = ("import json, sys; from qlinear.llm.synthetic import make_checkpoint; "
            "a = json.loads(sys.argv[1]); out = a.pop('out'); "
            "make_checkpoint(out, arch='qwen2', shape='tiny', **a)")
    subprocess.run([sys.executable, "-c", code, args], check=True, capture_output=True)
    return out


@pytest.fixture(scope="session")
def exports(hf_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("mnn_exports")
    return {name: export_with_llmexport(hf_dir, root / name, bits=bits, block=block)
            for name, (bits, block) in EXPORTS.items()}


@pytest.fixture(scope="session")
def hf_weights(hf_dir):
    from safetensors.numpy import load_file

    return load_file(str(hf_dir / "model.safetensors"))


@pytest.fixture(scope="session")
def hf_config(hf_dir):
    return json.loads((hf_dir / "config.json").read_text())


@pytest.fixture(scope="session")
def read(exports):
    cache = {}

    def get(name) -> MnnExport:
        if name not in cache:
            cache[name] = read_export(exports[name])
        return cache[name]

    return get


@pytest.fixture(scope="session")
def mnn(exports):
    from qlinear.llm.mnn.engine import MnnLlm

    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = MnnLlm(exports[name], threads=1)
        return cache[name]

    return get


def _prompt_ids(export, n):
    import inspect

    text = inspect.getsource(json)
    ids = export.tokenizer.encode(text).ids[:n]
    assert len(ids) == n
    return ids


# -- the reader ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(EXPORTS))
def test_config_in_hf_terms(read, hf_config, name):
    cfg = read(name).config
    for key in ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "rms_norm_eps", "rope_theta", "vocab_size"):
        assert cfg[key] == hf_config[key], key
    assert cfg["head_dim"] == hf_config["hidden_size"] // hf_config["num_attention_heads"]
    assert cfg["attention_bias"] is True and cfg["attention_output_bias"] is False   # Qwen2: q/k/v bias
    assert cfg["tie_word_embeddings"] is False


@pytest.mark.parametrize("name", list(EXPORTS))
def test_linears_match_checkpoint(read, hf_weights, name):
    """Every record dequantizes to the checkpoint's weight within half a quantization step, and
    its codes are the round-half-to-even codes of the block minimum / (max - min) scheme."""
    bits, block = EXPORTS[name]
    export = read(name)
    n_layers = export.config["num_hidden_layers"]
    expected = {f"model.layers.{i}.{p}" for i in range(n_layers)
                for p in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                          "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")} | {"lm_head"}
    assert set(export.linears) == expected
    for name_, q in export.linears.items():
        assert isinstance(q, QuantizedLinear)
        w = hf_weights[name_ + ".weight"]
        n, k = w.shape
        assert q.codes.shape == (n, k) and q.codes.dtype == np.uint8
        assert q.bits == bits and q.codes.max() <= 2 ** bits - 1
        blk = q.group_size or k
        assert blk == (k if block == 0 else min(block, k)), name_
        assert q.scale.shape == q.offset.shape == (n, k // blk)
        wb = w.reshape(n, k // blk, blk).astype(np.float64)
        lo, hi = wb.min(-1), wb.max(-1)
        step = (hi - lo) / (2 ** bits - 1)
        np.testing.assert_allclose(q.offset, lo, rtol=0, atol=1e-6 * np.abs(lo).max())
        np.testing.assert_allclose(q.scale, step, rtol=1e-6)
        codes = np.clip(np.rint((wb - lo[..., None]) / step[..., None]), 0, 2 ** bits - 1)
        assert np.mean(codes.reshape(n, k) == q.codes) > 0.999, name_
        err = np.abs(q.dequantize() - w).reshape(n, k // blk, blk).max(-1)
        assert np.all(err <= step * 0.5001 + 1e-7), name_
        if name_ + ".bias" in hf_weights:
            np.testing.assert_array_equal(q.bias, hf_weights[name_ + ".bias"])
        else:
            assert q.bias is None


def test_norms_and_embedding(read, hf_weights):
    export = read("int4-b64")
    assert set(export.norms) == {f"model.layers.{i}.{n}" for i in range(2)
                                 for n in ("input_layernorm", "post_attention_layernorm")} | {"model.norm"}
    for name, g in export.norms.items():
        np.testing.assert_array_equal(g, hf_weights[name + ".weight"])
    ref = hf_weights["model.embed_tokens.weight"]
    assert export.embedding_shape == ref.shape
    assert export.embedding_path.name == "embeddings_bf16.bin"
    emb = export.embed(np.arange(ref.shape[0]))
    np.testing.assert_allclose(emb, ref, rtol=2 ** -8, atol=0)   # bf16 rounding


def test_tokenizer_encodes_like_mnn(read, mnn):
    export, engine = read("int4-b64"), mnn("int4-b64")
    for text in TEXTS:
        assert export.tokenizer.encode(text).ids == engine.encode(text), text
    ids = export.tokenizer.encode(TEXTS[1]).ids
    assert export.tokenizer.decode(ids) == TEXTS[1]
    assert export.eos_token == "<|im_end|>"
    assert export.stop_token_ids == [export.tokenizer.token_to_id("<|im_end|>")]
    assert "<|im_start|>" in export.chat_template


def test_tokenizer_json_next_to_export_wins(exports, hf_dir, tmp_path):
    d = tmp_path / "exp"
    shutil.copytree(exports["int4-b64"], d)
    shutil.copy(hf_dir / "tokenizer.json", d / "tokenizer.json")
    a, b = read_export(d), read_export(exports["int4-b64"])
    for text in TEXTS:
        assert a.tokenizer.encode(text).ids == b.tokenizer.encode(text).ids


# -- errors --------------------------------------------------------------------------------------
@pytest.fixture
def copy_export(exports, tmp_path):
    d = tmp_path / "exp"
    shutil.copytree(exports["int4-b64"], d, ignore=shutil.ignore_patterns("*.json.bak"))
    return d


@pytest.mark.parametrize("missing", ["config.json", "llm_config.json", "llm.mnn", "llm.mnn.weight",
                                     "embeddings_bf16.bin"])
def test_missing_file_is_named(copy_export, missing):
    (copy_export / missing).unlink()
    with pytest.raises(ValueError, match=missing.replace(".", r"\.")):
        read_export(copy_export)


@pytest.mark.parametrize("victim,keep", [("llm.mnn.weight", 0.5), ("llm.mnn.weight", 0.999),
                                         ("embeddings_bf16.bin", 0.5), ("tokenizer.mtok", 0.5),
                                         ("llm.mnn", 0.5)])
def test_truncated_file_is_named(copy_export, victim, keep):
    path = copy_export / victim
    data = path.read_bytes()
    path.write_bytes(data[:int(len(data) * keep)])
    with pytest.raises(ValueError, match=victim.replace(".", r"\.")):
        read_export(copy_export)


def test_corrupt_weight_record(copy_export):
    path = copy_export / "llm.mnn.weight"
    data = bytearray(path.read_bytes())
    # The first record is the first layer's input norm (256 floats... its size varies): corrupt
    # the header of the q_proj record that follows, its ndim byte.
    export = read_export(copy_export, tokenizer=False)
    q = export.linears["model.layers.0.self_attn.q_proj"]
    assert q.codes.shape == (128, 128)
    offset = 2 * 4 * 128   # gamma + beta of the input norm
    assert data[offset] == 2
    data[offset] = 3
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"llm\.mnn\.weight.*q_proj.*dimensions"):
        read_export(copy_export)


def test_unknown_architecture(copy_export):
    cfg_path = copy_export / "llm_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["model_type"] = "gpt_oss"
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="model_type 'gpt_oss' is not supported"):
        read_export(copy_export)
    del cfg["model_type"]
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="model_type None"):
        read_export(copy_export)
    cfg["model_type"] = "qwen2"
    del cfg["layer_nums"]
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="layer_nums"):
        read_export(copy_export)


def test_not_an_export(tmp_path):
    with pytest.raises(ValueError, match="not a directory"):
        read_export(tmp_path / "nothing")
    with pytest.raises(ValueError, match=r"config\.json"):
        read_export(tmp_path)


def test_export_needs_a_checkpoint(tmp_path):
    with pytest.raises(ValueError, match="not a Hugging Face checkpoint"):
        export_with_llmexport(tmp_path, tmp_path / "out")


# -- side by side with MNN.llm -------------------------------------------------------------------
@pytest.mark.parametrize("name", list(EXPORTS))
def test_reference_forward_matches_mnn_logits(read, mnn, name):
    """Teacher-forced logits over 96 positions: the numpy forward of the records read here vs
    MNN.llm's own forward on the same export (W4A8/W8A8, memory "low")."""
    export = read(name)
    ids = _prompt_ids(export, 96)
    ref = forward(export, ids)
    got = mnn(name).logits(ids)
    assert got.shape == (96, export.config["vocab_size"])
    cos_mean, cos_min, top1 = compare(ref, got)
    assert cos_min >= 0.995 and top1 >= 0.95, (cos_mean, cos_min, top1)
    # MNN's "memory": "low" quantizes activations to int8: the argmax flips only at near ties.
    top2 = np.sort(ref, axis=-1)[:, -2:]
    flips = ref.argmax(-1) != got.argmax(-1)
    noise = np.abs(ref - got).max(-1)
    assert np.all(top2[flips, 1] - top2[flips, 0] <= 2 * noise[flips])


@pytest.mark.parametrize("name", ["int4-b64", "int8-channel"])
def test_reference_forward_is_exact_vs_mnn_float_activations(read, exports, name):
    """With float activations (``"memory": "normal"``, weights dequantized at load) MNN.llm
    computes what the records read here say, to float rounding."""
    from qlinear.llm.mnn.engine import MnnLlm

    export = read(name)
    ids = _prompt_ids(export, 64)
    got = MnnLlm(exports[name], threads=1, config={"memory": "normal", "precision": "high"}).logits(ids)
    cos_mean, cos_min, top1 = compare(forward(export, ids), got)
    assert cos_min >= 0.99999 and top1 == 1.0, (cos_mean, cos_min, top1)


def test_mnn_engine_greedy_and_bench(read, mnn):
    export, engine = read("int4-b64"), mnn("int4-b64")
    ids = _prompt_ids(export, 16)
    toks = engine.greedy(ids, 8)
    assert len(toks) == 8
    # Greedy tokens are the argmax of teacher-forced logits over prompt + generated tokens.
    logits = engine.logits(ids + toks[:-1])
    assert [int(t) for t in logits[len(ids) - 1:].argmax(-1)] == toks
    res = engine.bench(ids, 8)
    assert res["tokens"] == toks
    assert res["prefill_tok_s"] > 0 and res["decode_tok_s"] > 0 and res["n_decode"] == 8


def test_mnn_bench_in_subprocess(exports, read):
    from qlinear.llm.mnn.engine import bench_in_subprocess

    ids = _prompt_ids(read("int4-b64"), 8)
    res = bench_in_subprocess(exports["int4-b64"], ids, 4, threads=1)
    assert len(res["tokens"]) == 4 and res["peak_rss_mb"] > 0


# -- qlinear.llm on MNN exports ------------------------------------------------------------------
@pytest.mark.parametrize("name", list(EXPORTS))
@pytest.mark.parametrize("act_block", ["group", None])
def test_qlinear_runs_exports_like_mnn(exports, read, mnn, name, act_block):
    """qlinear.llm.load(export): the records repacked without re-rounding, W4A8 / W8A8 on our
    kernels; teacher-forced logits vs MNN.llm's over 256 positions (over fewer, a handful of
    near-ties of this random model decide the top-1 figure: MNN's own W4A8 agrees with its float
    mode on ~96% of positions)."""
    from qlinear import llm

    model = llm.load(exports[name], act_block=act_block, progress=False)
    assert model.info["source"] == "mnn" and model.info["float_layers"] == []
    assert model.info["disk_embedding"]
    export = read(name)
    ids = _prompt_ids(export, 256)
    cos_mean, cos_min, top1 = compare(model.logits(ids), mnn(name).logits(ids))
    assert cos_mean >= 0.995 and top1 >= 0.95, (cos_mean, cos_min, top1)
    # and against the exact float forward of the records: only fp16 scales and int8 activations differ
    cos_mean, _, _ = compare(model.logits(ids), forward(export, ids))
    assert cos_mean >= 0.999


def test_qlinear_export_codes_are_moved_not_rounded(exports, read):
    from qlinear import llm

    model = llm.load(exports["int4-b64"], progress=False)
    rec = read("int4-b64").linears["model.layers.1.mlp.down_proj"]
    codes, scale, offset = model.blocks[1].down.weight.unpack()
    np.testing.assert_array_equal(codes, rec.codes)
    np.testing.assert_array_equal(scale, rec.scale.astype(np.float16))
    np.testing.assert_array_equal(offset, rec.offset.astype(np.float16))


def test_qlinear_chat_and_cli_bench_vs_mnn(exports, read):
    from qlinear import llm

    model = llm.load(exports["int4-b128"], progress=False)
    assert isinstance(model.chat("hello", 4), str) and len(model.history) == 2
    r = subprocess.run([sys.executable, "-m", "qlinear.llm", "bench", str(exports["int4-b128"]), "--vs", "mnn",
                        "--prompt-tokens", "16", "--decode-tokens", "8", "--threads", "1", "--json"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    row = json.loads(r.stdout)
    assert row["mnn"]["prefill_tok_s"] > 0 and row["decode_tokens"] == 8
    assert 0 <= row["mnn"]["agree_tokens"] <= row["mnn"]["compared_tokens"] == 8


@pytest.fixture(scope="session")
def family_exports(tmp_path_factory):
    """Exports of other families, made on first use: {arch: (checkpoint, int4 block 32 export)}."""
    made = {}

    def get(arch):
        if arch not in made:
            root = tmp_path_factory.mktemp(f"mnn_{arch}")
            args = json.dumps({"out": str(root / "hf"), "arch": arch, **SHAPE})
            code = ("import json, sys; from qlinear.llm.synthetic import make_checkpoint; "
                    "a = json.loads(sys.argv[1]); out = a.pop('out'); "
                    "make_checkpoint(out, shape='tiny', norm_noise=0.1, **a)")
            subprocess.run([sys.executable, "-c", code, args], check=True, capture_output=True)
            made[arch] = root / "hf", export_with_llmexport(root / "hf", root / "int4-b32", bits=4, block=32)
        return made[arch]

    return get


@pytest.mark.parametrize("arch", ["qwen3", "mistral"])
def test_other_family_exports_run_like_mnn_and_their_checkpoint(family_exports, arch):
    """Qwen3 (per-head q / k RMSNorms in the graph, head_dim values each) and Mistral (Llama's
    block; llmexport records no sliding window and MNN attends over the whole context, as we do
    then): read, run W4A8 on our kernels; logits against MNN.llm's on the same export and
    against the checkpoint in float."""
    from qlinear import llm
    from qlinear.llm.mnn.engine import MnnLlm

    hf, export_dir = family_exports(arch)
    export = read_export(export_dir)
    model = llm.load(export_dir, progress=False, max_context=300)
    assert model.config.arch == arch and model.config.qk_norm == (arch == "qwen3")
    if arch == "qwen3":
        assert export.norms["model.layers.0.self_attn.q_norm"].shape == (export.config["head_dim"],)
    ids = _prompt_ids(export, 256)
    ours = model.logits(ids)
    cos_mean, _, top1 = compare(ours, MnnLlm(export_dir, threads=1).logits(ids))
    assert cos_mean >= 0.995 and top1 >= 0.9, (cos_mean, top1)
    ref = llm.load(hf, bits=None, act="float", progress=False, max_context=300).logits(ids)
    cos_mean, _, _ = compare(ours, ref)
    assert cos_mean >= 0.98, cos_mean
