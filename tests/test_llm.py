"""qlinear.llm against transformers on small random Qwen2 / Llama checkpoints built here."""

import json
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from _llm_reference import cosines, transformers_logits  # noqa: E402
from qlinear import llm  # noqa: E402
from qlinear.llm import synthetic  # noqa: E402

# hidden 128 = two weight groups of 64 per row; 4 heads of 32, 2 KV heads (GQA)
SHAPE = dict(hidden_size=128, intermediate_size=352, num_attention_heads=4, num_key_value_heads=2,
             num_hidden_layers=2, vocab_size=1024)


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("llm")
    return {arch: synthetic.make_checkpoint(root / arch, arch=arch, shape="tiny", seed=1, **SHAPE)
            for arch in ("qwen2", "llama")}


@pytest.fixture(scope="session")
def hf_logits(checkpoints):
    """transformers' fp32 logits for a fixed 80-token sequence, per architecture."""
    return transformers_logits(checkpoints)


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_float_weights_match_transformers(checkpoints, hf_logits, arch):
    ids, ref = hf_logits[0], hf_logits[1][arch]
    model = llm.load(checkpoints[arch], bits=None, act="float", progress=False)
    out = model.logits(ids)
    assert np.abs(out - ref).max() <= 1e-4 * np.abs(ref).max()


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("bits, act, act_block, min_cos", [
    (8, "float", "group", 0.999), (8, "int8", "group", 0.999),
    (4, "int8", "group", 0.975), (4, "int8", None, 0.975), (4, "float", "group", 0.975),
])
def test_quantized_logits_stay_close(checkpoints, hf_logits, arch, bits, act, act_block, min_cos):
    ids, ref = hf_logits[0], hf_logits[1][arch]
    model = llm.load(checkpoints[arch], bits=bits, group_size=64, act=act, act_block=act_block, progress=False)
    cos = cosines(model.logits(ids), ref)
    assert cos.mean() >= min_cos, cos.mean()


def test_memory_normal_dequantizes_at_load(checkpoints, hf_logits):
    ids = hf_logits[0][:16]
    low = llm.load(checkpoints["qwen2"], bits=4, act="float", memory="low", progress=False)
    normal = llm.load(checkpoints["qwen2"], bits=4, act="float", memory="normal", progress=False)
    assert isinstance(normal.blocks[0].down.weight, np.ndarray)
    np.testing.assert_allclose(normal.logits(ids), low.logits(ids), rtol=1e-4, atol=1e-4)


def test_decode_with_cache_equals_full_forward(checkpoints):
    """Greedy tokens from the KV-cache path are the argmax of the teacher-forced logits."""
    model = llm.load(checkpoints["qwen2"], bits=4, progress=False)
    prompt = model.tokenizer.encode("def main():\n    return")
    gen = model.generate_ids(prompt, 12, stop_ids=())
    model.tokenizer.stop_ids = set()
    gen = model.generate_ids(prompt, 12)
    assert len(gen) == 12
    full = model.logits(prompt + gen)
    assert list(full[len(prompt) - 1:-1].argmax(1)) == gen


@pytest.mark.parametrize("arch, bits, act, act_block, kv_cache", [
    ("qwen2", 4, "int8", "group", "float32"), ("qwen2", 8, "float", "group", "float32"),
    ("llama", 4, "float", "group", "float32"), ("llama", 8, "int8", None, "float32"),
    ("qwen2", 4, "int8", "group", "float16"), ("llama", 8, "float", "group", "float16")])
def test_compiled_decode_equals_python_path(checkpoints, arch, bits, act, act_block, kv_cache):
    """The decode step as one compiled call gives the logits and cache of the per-layer Python
    path, bit for bit, position after position (qwen2: q/k/v biases; GQA in both), with float32
    and float16 KV caches."""
    model = llm.load(checkpoints[arch], bits=bits, group_size=64, act=act, act_block=act_block, progress=False,
                     kv_cache=kv_cache)
    assert model.cache.k.dtype == np.dtype(kv_cache) and model.info["kv_cache"] == kv_cache
    ids = [int(t) for t in np.random.default_rng(3).integers(0, 1000, 30)]
    runs = []
    for compiled in (True, False):
        model.compiled_decode = compiled
        model.reset()
        model.prefill(ids[:20])
        logits = [model._forward([t], 20 + i) for i, t in enumerate(ids[20:])]
        runs.append((logits, model.cache.k[:, :, :30].copy(), model.cache.v[:, :, :30].copy()))
    assert model._step is not None
    for a, b in zip(runs[0][0], runs[1][0]):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(runs[0][1], runs[1][1])
    np.testing.assert_array_equal(runs[0][2], runs[1][2])


def test_half_kv_cache_is_close_and_half_the_size(checkpoints):
    """kv_cache="float16": half the cache's bytes, logits within the keys' and values' rounding of
    the float32 cache's; a bad kv_cache is refused."""
    ids = [int(t) for t in np.random.default_rng(5).integers(0, 1000, 40)]
    full, half = (llm.load(checkpoints["qwen2"], act="float", max_context=64, progress=False, kv_cache=kv)
                  for kv in ("float32", "float16"))
    assert half.cache.nbytes * 2 == full.cache.nbytes
    a, b = full.logits(ids), half.logits(ids)
    assert np.abs(a - b).max() < 2e-2 * np.abs(a).max()
    assert float((a * b).sum() / np.linalg.norm(a) / np.linalg.norm(b)) > 0.9999
    with pytest.raises(ValueError, match="kv_cache"):
        llm.load(checkpoints["qwen2"], kv_cache="bfloat16", progress=False)


def test_float_weights_decode_in_python(checkpoints):
    model = llm.load(checkpoints["qwen2"], bits=None, act="float", progress=False)
    model.tokenizer.stop_ids = set()
    gen = model.generate_ids(model.tokenizer.encode("x = 1"), 4)
    assert model._step is None and len(gen) == 4


def test_convert_then_load_gives_the_same_model(checkpoints, tmp_path, hf_logits):
    ids = hf_logits[0][:24]
    direct = llm.load(checkpoints["qwen2"], bits=4, group_size=64, progress=False)
    out = llm.convert(checkpoints["qwen2"], tmp_path / "conv", bits=4, group_size=64, progress=False)
    assert sorted(p.name for p in out.iterdir()) == ["model.qlinear", "tokenizer.json", "tokenizer_config.json"]
    for disk in (True, False):
        conv = llm.load(out, disk_embedding=disk, progress=False)
        assert conv.info["source"] == "qlinear-llm" and conv.info["disk_embedding"] == disk
        np.testing.assert_array_equal(conv.logits(ids), direct.logits(ids))


def test_disk_embedding_equals_memory(checkpoints):
    disk = llm.load(checkpoints["llama"], bits=8, disk_embedding=True, progress=False)
    mem = llm.load(checkpoints["llama"], bits=8, disk_embedding=False, progress=False)
    ids = [0, 5, 1023, 5, 77]
    np.testing.assert_array_equal(disk.embedding(ids), mem.embedding(ids))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        disk.embedding([1024])


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_disk_embedding_rows_are_the_files_widened(tmp_path, dtype):
    """Rows read by one native call (pread, then bfloat16 / float16 widened exactly), at an
    offset into the file; a file truncated after opening is a ValueError naming it."""
    from qlinear import _core
    from qlinear.llm.runtime.embedding import DiskEmbedding

    rng = np.random.default_rng(7)
    table = rng.standard_normal((50, 24)).astype(np.float32) * np.float32(100)
    table[0, :4] = [0.0, -0.0, np.inf, 1e-7]   # 1e-7: a float16 subnormal
    if dtype == "bfloat16":
        stored = (table.view(np.uint32) >> 16).astype(np.uint16)
        want = (stored.astype(np.uint32) << 16).view(np.float32)
    elif dtype == "float16":
        stored = table.astype(np.float16)
        want = stored.astype(np.float32)
    else:
        stored = want = table
    path = tmp_path / "e.bin"
    path.write_bytes(b"x" * 13 + stored.tobytes())
    emb = DiskEmbedding(path, 13, 50, 24, dtype)
    ids = [0, 49, 7, 7, 31]
    got = emb(ids)
    assert got.dtype == np.float32 and got.shape == (5, 24)
    np.testing.assert_array_equal(got.view(np.uint32), np.ascontiguousarray(want[ids]).view(np.uint32))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        emb([50])
    with open(path, "r+b") as f:
        f.truncate(13 + 40 * stored.nbytes // 50)
    assert emb([39]).shape == (1, 24)
    with pytest.raises(ValueError, match=r"e\.bin: short read"):
        emb([45])
    with pytest.raises(ValueError, match="bfloat16, float16 or float32"):
        _core.file_rows(0, 0, 1, 1, "int8", np.zeros(1, np.int64))
    with pytest.raises(TypeError, match="int64"):
        _core.file_rows(0, 0, 1, 1, dtype, np.zeros(1, np.int32))
    emb.close()
    with pytest.raises(ValueError, match="closed"):
        emb([0])


def test_slim_vocab(checkpoints, tmp_path):
    full = llm.load(checkpoints["qwen2"], bits=8, progress=False)
    keep = list(range(0, 1024, 3))
    slim = llm.load(checkpoints["qwen2"], bits=8, slim_vocab=keep, progress=False)
    ids = [3, 9, 27, 81]
    a, b = full.logits(ids), slim.logits(ids)
    np.testing.assert_allclose(b[:, keep], a[:, keep], rtol=1e-5, atol=1e-5)
    assert np.isneginf(np.delete(b, keep, axis=1)).all()
    assert all(t % 3 == 0 for t in slim.generate_ids(ids, 5, stop_ids=()))
    conv = llm.load(llm.convert(checkpoints["qwen2"], tmp_path / "s", bits=8, slim_vocab=keep, progress=False))
    np.testing.assert_array_equal(conv.logits(ids), b)
    full_file = llm.convert(checkpoints["qwen2"], tmp_path / "f", bits=8, progress=False)
    np.testing.assert_array_equal(llm.load(full_file, slim_vocab=keep).logits(ids), b)  # slimmed at load
    with pytest.raises(ValueError, match="slimmed at conversion"):
        llm.load(tmp_path / "s", slim_vocab=keep)


def test_sampling(checkpoints):
    model = llm.load(checkpoints["qwen2"], bits=4, progress=False)
    model.tokenizer.stop_ids = set()
    prompt = [1, 2, 3]
    greedy = model.generate_ids(prompt, 8)
    assert model.generate_ids(prompt, 8, temperature=1.0, top_k=1, seed=3) == greedy
    assert model.generate_ids(prompt, 8, temperature=1.0, top_p=1e-6, seed=3) == greedy
    a = model.generate_ids(prompt, 8, temperature=1.5, seed=11)
    assert a == model.generate_ids(prompt, 8, temperature=1.5, seed=11)
    assert a != greedy  # a random model's distribution is flat: sampling must leave the argmax path
    rep = model.generate_ids(prompt, 16, repetition_penalty=100.0)
    assert len(set(rep)) == len(rep)  # seen tokens pushed far down: no repeats
    assert model.generate_ids(prompt, 0) == []
    stop = greedy[2]
    assert model.generate_ids(prompt, 8, stop_ids=[stop]) == greedy[:greedy.index(stop)]
    assert model.stats.finish_reason == "stop"
    for bad in (dict(temperature=-1), dict(top_p=0), dict(top_k=-2), dict(repetition_penalty=0)):
        with pytest.raises(ValueError):
            model.generate_ids(prompt, 2, **bad)


def test_stream_chat_and_history(checkpoints):
    model = llm.load(checkpoints["qwen2"], bits=4, progress=False)
    msgs = [{"role": "user", "content": "Hello, who are you?"}]
    text = model.generate(msgs, 10)
    assert "".join(model.stream(msgs, 10)) == text
    assert model.stats.prompt_tokens == len(model.tokenizer.prompt_ids(msgs))
    assert model.stats.prefill_tok_s > 0 and model.stats.peak_rss_mb > 0
    reply1 = model.chat("Hello, who are you?", 10)
    assert reply1 == text
    reply2 = model.chat("Tell me more.", 10)
    assert 0 < model.stats.reused_tokens < model.stats.prompt_tokens  # the first turn stayed cached
    assert [m["role"] for m in model.history] == ["user", "assistant", "user", "assistant"]
    fresh = llm.load(checkpoints["qwen2"], bits=4, progress=False)
    assert fresh.generate(model.history[:3], 10) == reply2  # the reused prefix changes nothing
    pieces = list(model.chat("Again?", 5, stream=True))
    assert model.history[-1]["content"] == "".join(pieces)


def test_context_limit_and_bad_input(checkpoints):
    model = llm.load(checkpoints["qwen2"], bits=4, max_context=32, progress=False)
    model.tokenizer.stop_ids = set()
    with pytest.raises(ValueError, match="max_context"):
        model.logits(list(range(40)))
    out = model.generate_ids(list(range(30)), 10)
    assert len(out) == 3 and model.stats.finish_reason == "length"  # positions 30, 31 and the last sample
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model.logits([5, 4096])
    with pytest.raises(ValueError, match="empty"):
        model.generate_ids([], 3)
    with pytest.raises(TypeError):
        model.generate(42)


def test_bad_model_directories(checkpoints, tmp_path):
    src = checkpoints["qwen2"]
    with pytest.raises(ValueError, match="not a model directory"):
        llm.load(tmp_path / "missing")
    d = tmp_path / "gpt2"
    d.mkdir()
    cfg = json.loads((src / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "model_type": "gpt2"}))
    with pytest.raises(ValueError, match="gpt2"):
        llm.load(d)
    (d / "config.json").write_text(json.dumps(cfg))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (d / name).write_bytes((src / name).read_bytes())
    with pytest.raises(ValueError, match="safetensors"):
        llm.load(d)
    data = (src / "model.safetensors").read_bytes()
    for cut in (4, 100, len(data) // 2):
        (d / "model.safetensors").write_bytes(data[:cut])
        with pytest.raises(ValueError, match="not a valid safetensors file"):
            llm.load(d, progress=False)
    with pytest.raises(ValueError, match="act='int8' needs quantized"):
        llm.load(src, bits=None)


def test_converted_file_corruption_is_detected(checkpoints, tmp_path):
    out = llm.convert(checkpoints["llama"], tmp_path / "c", bits=4, progress=False)
    f = out / "model.qlinear"
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0x10
    f.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="checksum"):
        llm.load(out)
    f.write_bytes(bytes(data[: len(data) // 3]))
    with pytest.raises(ValueError, match="not a valid qlinear weight file"):
        llm.load(out)


def test_bench_decode_step_runs(checkpoints):
    """bench/decode_step.py (where a decode step's time goes) on a small model: every line printed."""
    import pathlib
    script = pathlib.Path(__file__).resolve().parents[1] / "bench" / "decode_step.py"
    r = subprocess.run([sys.executable, str(script), str(checkpoints["qwen2"]), "--positions", "8", "--steps", "2",
                        "--rounds", "1"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    for line in ("compiled step", "matmuls alone", "model._forward", "python path", "outside the matmuls"):
        assert line in r.stdout, r.stdout


def test_cli_generate_bench_convert(checkpoints, tmp_path):
    src = str(checkpoints["qwen2"])
    run = lambda *a: subprocess.run([sys.executable, "-m", "qlinear.llm", *a], capture_output=True,  # noqa: E731
                                    text=True, timeout=300)
    r = run("convert", src, str(tmp_path / "c"), "--bits", "8")
    assert r.returncode == 0, r.stderr
    r = run("generate", str(tmp_path / "c"), "def f(x):", "-n", "6", "--chat-template")
    assert r.returncode == 0 and "decode speed" in r.stderr, r.stderr
    r = run("bench", src, "--prompt-tokens", "16", "--decode-tokens", "4", "--json", "--threads", "1")
    assert r.returncode == 0, r.stderr
    row = json.loads(r.stdout)
    assert row["prompt_tokens"] == 16 and row["decode_tokens"] == 4 and row["threads"] == 1
    r = run("generate", str(tmp_path / "nowhere"), "x")
    assert r.returncode != 0 and "not a model directory" in r.stderr
