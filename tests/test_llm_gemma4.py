"""Gemma 4 (dense and MoE) on small random checkpoints written here (``synthetic``): logits
against transformers 5.x (skipped without it, failed so with QLINEAR_REQUIRE_TRANSFORMERS5=1),
the published multimodal form read as the text-only one, quantized logits, decode through the
cache past the rings' wrap, shared-KV layers holding their source's rows, prefix reuse and
speculative rollback, per-layer embeddings on disk == resident (and the memory that saves), and
what a hostile config gets."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("safetensors")

from qlinear import llm  # noqa: E402
from qlinear.llm import synthetic  # noqa: E402
from qlinear.llm.runtime import prefix_cache  # noqa: E402
from qlinear.llm.runtime.embedding import DiskEmbedding, MemoryEmbedding  # noqa: E402

# 6 layers: sliding, sliding, full, sliding | sliding, full sharing the KV of layers 3 and 2 (MLPs
# twice as wide there); sliding layers' heads of 64 over 16 positions (rings the prompts wrap),
# full layers' of 128 (proportional RoPE: a quarter of the frequencies turn); per-layer inputs of 16
SHAPE = dict(hidden_size=256, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
             num_hidden_layers=6, vocab_size=1024)
FORMS = {"dense": {}, "moe": {"enable_moe_block": True, "attention_k_eq_v": True, "num_global_key_value_heads": 1},
         "dense_multimodal": {"multimodal": True}}
IDS = [int(t) for t in np.random.default_rng(7).integers(0, 1000, 150)]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("gemma4")
    return {name: synthetic.make_checkpoint(root / name, "gemma4", seed=0, norm_noise=0.1, **SHAPE, **extra)
            for name, extra in FORMS.items()}


def load(path, **kw):
    """Float weights and activations by default; W8A8 / W4A8 with ``bits``."""
    kw = {"bits": None, "max_context": 256, "progress": False, **kw}
    return llm.load(path, **{"act": "float" if kw["bits"] is None else "int8", **kw})


def cosines(a, b):
    return np.sum(a * b, 1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


@pytest.mark.parametrize("form", ["dense", "moe"])
def test_float_path_matches_transformers(checkpoints, transformers5, form):
    torch, transformers = transformers5
    model = transformers.AutoModelForCausalLM.from_pretrained(checkpoints[form], dtype=torch.float32).eval()
    assert type(model).__name__ == "Gemma4ForCausalLM"
    with torch.no_grad():
        ref = model(torch.tensor([IDS])).logits[0].numpy()
    out = load(checkpoints[form]).logits(IDS)
    assert np.abs(out - ref).max() <= 1e-4 * np.abs(ref).max()


def test_multimodal_form_reads_its_text_model(checkpoints):
    """Gemma4ForConditionalGeneration's layout (text_config, model.language_model.): the text-only
    checkpoint's logits bit for bit (the same seed wrote the same weights)."""
    model = load(checkpoints["dense_multimodal"])
    assert model.config.arch == "gemma4_text" and model.config.per_layer_input_size == 16
    np.testing.assert_array_equal(model.logits(IDS), load(checkpoints["dense"]).logits(IDS))


def test_config_shapes(checkpoints):
    cfg = load(checkpoints["moe"]).config
    assert cfg.layer_types == ("sliding", "sliding", "full", "sliding", "sliding", "full")
    assert cfg.layer_head_dims == (64, 64, 128, 64, 64, 128) and cfg.layer_kv_heads == (2, 2, 1, 2, 2, 1)
    assert cfg.kv_layers == (0, 1, 2, 3, 3, 2)
    assert [cfg.mlp_size(i) for i in range(6)] == [256] * 4 + [512] * 2
    assert cfg.values_from_keys and cfg.num_experts == 8 and cfg.dense_and_experts


# int8 weights and activations (W8A8) against the float path, on these random checkpoints: dense
# 0.9992 on average (0.9968 at worst); the MoE variant 0.99 (0.82 at worst): each of its sublayers'
# outputs is RMS-normed before it is added (a rounding error enters the residual at full scale),
# and a rounding that moves a router's top-2 at one position reaches the later ones through attention.
@pytest.mark.parametrize("form, mean, worst", [("dense", 0.999, 0.995), ("moe", 0.985, 0.75)])
def test_quantized_logits_stay_close(checkpoints, form, mean, worst):
    ref = load(checkpoints[form]).logits(IDS)
    c = cosines(load(checkpoints[form], bits=8).logits(IDS), ref)
    assert c.mean() >= mean and c.min() >= worst, (c.mean(), c.min())


@pytest.mark.parametrize("form", ["dense", "moe"])
@pytest.mark.parametrize("kv_cache", ["float32", "float16"])
def test_decode_equals_full_forward(checkpoints, form, kv_cache):
    """Greedy tokens through the cache (20-token prompt, 30 steps: past the 16-position rings; the
    prefill runs only its last position through the shared-KV layers) are the teacher-forced
    logits' argmax but at near-ties: a ring's prefill and the decode step sum in different orders
    (a few 1e-6), which the MoE variant's int8 experts may round into 1e-2 (each of its sublayers'
    outputs is RMS-normed; seed 0 has one such position, its top two 0.002 apart)."""
    model = load(checkpoints[form], bits=4, kv_cache=kv_cache)
    model.tokenizer.stop_ids = set()
    gen = model.generate_ids(IDS[:20], 30)
    full = model.logits(IDS[:20] + gen)[19:-1]
    top2 = np.sort(full, 1)[:, -2:]
    differ = full.argmax(-1) != np.array(gen)
    assert differ.sum() <= 1 and (top2[differ, 1] - top2[differ, 0] < 0.01).all(), np.nonzero(differ)


def test_shared_layers_hold_their_sources_rows(checkpoints):
    model = load(checkpoints["dense"], bits=8)
    cache = model.cache
    assert cache.k[4] is cache.k[3] and cache.v[5] is cache.v[2] and cache.k[2] is not cache.k[3]
    assert cache.k[2].shape == (2, 256, 128) and cache.k[3].shape == (2, 16, 64)
    unshared = sum(a.nbytes for a in (*cache.k[:4], *cache.v[:4]))
    assert cache.nbytes == unshared


def test_prefix_reuse_equals_fresh(checkpoints, monkeypatch):
    """A prefill cut anywhere (the rings wrapped between cuts) and a prefix restored from the store
    (shared layers' rows kept once) give one pass's logits bit for bit."""
    model = load(checkpoints["moe"], bits=8, max_context=512)
    one = model.logits(IDS)
    for cut in (7, 64, 100):
        monkeypatch.setattr(prefix_cache, "PREFILL_CHUNK", cut)
        np.testing.assert_array_equal(model.logits(IDS), one)
    monkeypatch.undo()
    store = prefix_cache.PrefixCache(64)
    model.prefill_into(model.new_cache(512), IDS[:140], 0, store)
    ids = IDS[:140] + IDS[10:60]
    cache = model.new_cache(512)
    assert store.restore(cache, ids) == 140
    fresh = load(checkpoints["moe"], bits=8, max_context=512)
    np.testing.assert_array_equal(model.prefill_into(cache, ids, 140, store)[0], fresh.prefill(ids))


def test_speculative_decoding_gives_greedy_tokens(checkpoints):
    """Prompt-lookup drafts verified and rolled back (the rings, which shared layers hold too,
    restored) give greedy decoding's tokens."""
    model = load(checkpoints["dense"], bits=8)
    model.tokenizer.stop_ids = set()
    prompt = IDS[:30] + IDS[:30]
    plain = model.generate_ids(prompt, 40)
    assert model.generate_ids(prompt, 40, speculative="ngram") == plain


def test_per_layer_table_on_disk_equals_resident(checkpoints):
    disk, resident = load(checkpoints["moe"], bits=8), load(checkpoints["moe"], bits=8, disk_embedding=False)
    assert isinstance(disk.per_layer.table.inner, DiskEmbedding)
    assert isinstance(resident.per_layer.table.inner, MemoryEmbedding)
    np.testing.assert_array_equal(disk.logits(IDS), resident.logits(IDS))
    disk.close()  # its per-layer table's file too
    with pytest.raises(ValueError, match="closed"):
        disk.per_layer.table([1])


# the peak RSS of this process (VmHWM: getrusage's maxrss would carry the parent's over fork and exec)
_PEAK = "print(next(l for l in open('/proc/self/status') if l.startswith('VmHWM')).split()[1])"
_RSS = """
import sys
from qlinear import llm
model = llm.load(sys.argv[1], bits=4, max_context=64, progress=False, disk_embedding=sys.argv[2] == "disk")
model.generate_ids([5, 6, 7], 4)
""" + _PEAK


def test_per_layer_table_on_disk_halves_peak_memory(tmp_path):
    """A model whose per-layer table (32768 x 6 x 128 in float32: 100 MB) outweighs
    its layers: its peak RSS with the table on disk < 0.5x resident (each in its own process)."""
    path = synthetic.make_checkpoint(tmp_path / "m", "gemma4", hidden_size=64, intermediate_size=64,
                                     num_attention_heads=2, num_key_value_heads=1, num_hidden_layers=6,
                                     vocab_size=32768, tokenizer_vocab=512, hidden_size_per_layer_input=128)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    rss = {how: int(subprocess.run([sys.executable, "-c", _RSS, str(path), how], capture_output=True, text=True,
                                   env=env, check=True, timeout=300).stdout.split()[-1])
           for how in ("disk", "resident")}
    base = int(subprocess.run([sys.executable, "-c", "from qlinear import llm\n" + _PEAK],
                              capture_output=True, text=True, env=env, check=True).stdout.split()[-1])
    assert rss["disk"] - base < 0.5 * (rss["resident"] - base), (rss, base)


def _edit(src, dst, **fields):
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(fields)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.mark.parametrize("fields, message", [
    ({"num_kv_shared_layers": 6}, "num_kv_shared_layers"),
    ({"num_kv_shared_layers": 5}, "shares the KV"),
    ({"per_layer_config": {"2": {"head_dim": 1024}}}, "head_dim"),
    ({"per_layer_config": {"9": {"head_dim": 64}}}, "per_layer_config"),
    ({"per_layer_config": {"2": {"sliding_window": 4}}}, "per_layer_config"),
    ({"rope_parameters": {"sliding_attention": {"rope_type": "yarn", "rope_theta": 1.0}}}, "RoPE"),
    ({"layer_types": ["sliding_attention"] * 3}, "layer_types"),
    ({"use_bidirectional_attention": "all"}, "bidirectional"),
    ({"enable_moe_block": True}, "num_experts"),
    ({"vocab_size_per_layer_input": 77}, "embed_tokens_per_layer"),
])
def test_hostile_configs_are_refused(checkpoints, tmp_path, fields, message):
    path = _edit(checkpoints["dense"], tmp_path / "bad", **fields)
    with pytest.raises(ValueError, match=message):
        load(path)
