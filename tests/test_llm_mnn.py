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
    from qlinear.llm.peers.mnn_llm import MnnLlm

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
    from qlinear.llm.peers.mnn_llm import MnnLlm

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
    from qlinear.llm.peers.mnn_llm import bench_in_subprocess

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


# Per family: the synthetic config's changes (sliding windows that 256 positions pass; a logits
# soft-cap that bites on a random model's small logits) ...
FAMILY = {"gemma2": dict(sliding_window=64, final_logit_softcapping=0.5),
          "gemma3": dict(sliding_window=64, layer_types=["sliding_attention", "full_attention"])}
# ... and what its export drops, as config.json changes that make the checkpoint compute what MNN
# computes: Gemma 2's export records no sliding window and MNN's attention has no soft-cap;
# Gemma 3's export rotates every layer with the global RoPE base.
EXPORT_DROPS = {"gemma2": lambda c: dict(layer_types=["full_attention"] * c["num_hidden_layers"],
                                         attn_logit_softcapping=None),
                "gemma3": lambda c: dict(rope_local_base_freq=c["rope_theta"])}


@pytest.fixture(scope="session")
def family_exports(tmp_path_factory):
    """Exports of other families, made on first use: {(arch, bits): (checkpoint, export)} (int4
    block 32, int8 per channel)."""
    made = {}

    def get(arch, bits=4):
        if (arch, bits) not in made:
            root = tmp_path_factory.mktemp(f"mnn_{arch}")
            hf = next((h for (a, _), (h, _) in made.items() if a == arch), None)
            if hf is None:
                hf = root / "hf"
                args = json.dumps({"out": str(hf), "arch": arch, **SHAPE, **FAMILY.get(arch, {})})
                code = ("import json, sys; from qlinear.llm.synthetic import make_checkpoint; "
                        "a = json.loads(sys.argv[1]); out = a.pop('out'); "
                        "make_checkpoint(out, shape='tiny', norm_noise=0.1, **a)")
                subprocess.run([sys.executable, "-c", code, args], check=True, capture_output=True)
            made[arch, bits] = hf, export_with_llmexport(hf, root / f"int{bits}", bits=bits, block=32 if bits == 4 else 0)
        return made[arch, bits]

    return get


def _as_exported(hf, out, arch):
    """The checkpoint with what its export drops dropped (EXPORT_DROPS)."""
    shutil.copytree(hf, out)
    cfg = json.loads((out / "config.json").read_text())
    drops = EXPORT_DROPS.get(arch)
    (out / "config.json").write_text(json.dumps({**cfg, **(drops(cfg) if drops else {})}))
    return out


@pytest.mark.parametrize("arch,bits", [("qwen3", 4), ("mistral", 4), ("gemma2", 4), ("gemma2", 8),
                                       ("gemma3", 4), ("gemma3", 8)])
def test_other_family_exports_run_like_mnn_and_their_checkpoint(family_exports, tmp_path, arch, bits):
    """Qwen3 (per-head q / k RMSNorms in the graph, head_dim values each), Mistral (Llama's
    block; llmexport records no sliding window and MNN attends over the whole context, as we do
    then), Gemma 2 / 3 (tied embeddings: the lm head's records; the embedding scale and the logits'
    soft-cap in the graph; norms stored as 1 + w; Gemma 3: [full, sliding] masks gathered per
    layer): read, run W4A8 / W8A8 on our kernels; logits against MNN.llm's on the same export and
    against the checkpoint in float, less what the export drops (EXPORT_DROPS). On these random
    Gemmas int4 block 32 costs ~0.03 of cosine against the float checkpoint (our own int4 of the
    checkpoint: 0.975-0.978; the export's embedding, tied, is int4 too): MNN's engine on the export
    scores as we do."""
    from qlinear import llm
    from qlinear.llm.peers.mnn_llm import MnnLlm

    hf, export_dir = family_exports(arch, bits)
    export = read_export(export_dir)
    model = llm.load(export_dir, progress=False, max_context=300)
    cfg = model.config
    assert cfg.arch == {"gemma3": "gemma3_text"}.get(arch, arch) and cfg.qk_norm == (arch in ("qwen3", "gemma3"))
    if arch in ("qwen3", "gemma3"):
        assert export.norms["model.layers.0.self_attn.q_norm"].shape == (export.config["head_dim"],)
    if arch.startswith("gemma"):
        assert export.tied_embedding is not None and not (export_dir / "embeddings_bf16.bin").exists()
        assert cfg.embed_scale and cfg.attn_scale == 256 ** -0.5 and cfg.attn_softcap is None
        assert cfg.final_softcap == FAMILY[arch].get("final_logit_softcapping")
        assert cfg.layer_types == (None if arch == "gemma2" else ("sliding", "full"))
        assert cfg.rope_local_theta is None and cfg.window(0) == (0 if arch == "gemma2" else 64)
    ids = _prompt_ids(export, 256)
    ours = model.logits(ids)
    theirs = MnnLlm(export_dir, threads=1).logits(ids)
    cos_mean, _, top1 = compare(ours, theirs)
    assert cos_mean >= 0.995 and top1 >= 0.9, (cos_mean, top1)
    ref = llm.load(_as_exported(hf, tmp_path / "hf", arch), bits=None, act="float", progress=False,
                   max_context=300).logits(ids)
    cos_mean, mnn_mean = compare(ours, ref)[0], compare(theirs, ref)[0]
    assert cos_mean >= (0.95 if export.tied_embedding and bits == 4 else 0.98), (cos_mean, mnn_mean)
    assert cos_mean >= mnn_mean - 0.005, (cos_mean, mnn_mean)


def test_gemma_tied_embedding_is_the_lm_head(family_exports):
    """Without embeddings_bf16.bin, the embedding rows are the lm head's records (int4 / int8),
    dequantized row by row as MNN's engine does; a model loads them on disk or in memory alike."""
    from qlinear import llm

    for bits in (4, 8):
        _, export_dir = family_exports("gemma3", bits)
        export = read_export(export_dir)
        head = export.linears["lm_head"].dequantize()
        ids = [0, 5, 1023, 5]
        np.testing.assert_array_equal(export.embed(ids), head[ids])
        np.testing.assert_array_equal(export.tied_embedding.raw(), head)
        with pytest.raises(ValueError, match="lm head's quantized records"):
            export.embedding()
    on_disk, in_memory = (llm.load(export_dir, progress=False, disk_embedding=d, max_context=64) for d in (True, False))
    ids = _prompt_ids(export, 16)
    np.testing.assert_array_equal(on_disk.logits(ids), in_memory.logits(ids))
    assert on_disk.info["disk_embedding"] and not in_memory.info["disk_embedding"]


def test_gemma_exports_refused_for_what_they_cannot_express(family_exports, tmp_path):
    _, export_dir = family_exports("gemma3", 8)

    def edited(**changes):
        d = tmp_path / f"exp{len(list(tmp_path.iterdir()))}"
        shutil.copytree(export_dir, d)
        cfg = json.loads((d / "llm_config.json").read_text())
        (d / "llm_config.json").write_text(json.dumps({**cfg, **changes}))
        return d

    with pytest.raises(ValueError, match="vision model is not supported.*'gemma3_text'"):
        read_export(edited(model_type="gemma3"))   # Gemma3ForConditionalGeneration's export
    with pytest.raises(ValueError, match="attention_type 'mix' without a positive sliding_window"):
        read_export(edited(sliding_window=None))
    with pytest.raises(ValueError, match="tie_embeddings .* do not describe the lm head's records"):
        tie = json.loads((export_dir / "llm_config.json").read_text())["tie_embeddings"]
        read_export(edited(tie_embeddings=[tie[0] + 1] + tie[1:]))
