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
from _llm_reference import assert_prefix_reuse_equals_fresh  # noqa: E402
from qlinear.llm.runtime.embedding import DiskEmbedding, MemoryEmbedding  # noqa: E402
from qlinear.llm.runtime.speculative import Speculation  # noqa: E402

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
    assert_prefix_reuse_equals_fresh(
        lambda: load(checkpoints["moe"], bits=8, max_context=512), IDS, monkeypatch)


def test_speculative_decoding_gives_greedy_tokens(checkpoints):
    """Prompt-lookup drafts verified and rolled back (the rings, which shared layers hold too,
    restored) give greedy decoding's tokens."""
    model = load(checkpoints["dense"], bits=8)
    model.tokenizer.stop_ids = set()
    prompt = IDS[:30] + IDS[:30]
    plain = model.generate_ids(prompt, 40)
    assert model.generate_ids(prompt, 40, speculative="ngram") == plain


def test_server_batch_equals_single_requests(checkpoints):
    """The server's scheduler over the MoE variant (its sequences run one by one through the
    blocks, each with its own cache): sequences joining and leaving the batch, greedy and sampled,
    speculative or not, each one's tokens those of generate_ids alone."""
    import threading

    pytest.importorskip("starlette")
    from qlinear.llm.runtime.generation import Sampling
    from qlinear.llm.serve import Scheduler, Sequence

    reference, model = load(checkpoints["moe"], bits=4), load(checkpoints["moe"], bits=4)
    reference.tokenizer.stop_ids = model.tokenizer.stop_ids = set()
    jobs = [(IDS[:n], m, {} if i % 2 else {"temperature": 0.9, "seed": i}, None)
            for i, (n, m) in enumerate([(5, 20), (40, 3), (12, 25), (60, 9)])]
    jobs += [(IDS[:30] + IDS[:30], 20, {}, Speculation("ngram", max_draft=4, adaptive=False))]
    scheduler = Scheduler(model, max_batch=3, max_queue=len(jobs))
    results, done = [[] for _ in jobs], threading.Semaphore(0)
    for i, (ids, n, sampling, spec) in enumerate(jobs):
        def on(kind, value, i=i):
            results[i].append(value) if kind == "token" else done.release()
        scheduler.submit(Sequence(ids, n, Sampling(**sampling), on, speculation=spec))
    scheduler.start()
    try:
        for _ in jobs:
            assert done.acquire(timeout=120)
    finally:
        scheduler.stop(30)
    for (ids, n, sampling, _), tokens in zip(jobs, results):
        reference.reset()
        assert tokens == reference.generate_ids(ids, n, **sampling)


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
@pytest.mark.parametrize("form", ["dense", "moe"])
def test_converted_model_equals_the_checkpoint(checkpoints, tmp_path, form):
    """``convert`` keeps the per-layer table beside the embedding (read on disk alike): the
    checkpoint's int8 logits bit for bit."""
    from qlinear.llm.converted.convert import convert

    out = convert(checkpoints[form], tmp_path / "conv", bits=8, progress=False)
    model = load(out, bits=8)
    assert isinstance(model.per_layer.table.inner, DiskEmbedding)
    np.testing.assert_array_equal(model.logits(IDS), load(checkpoints[form], bits=8).logits(IDS))


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


# -- GGUF: llama.cpp's gemma4 files -------------------------------------------------------------------
def write_gguf(ckpt, path, linear_type):
    """``ckpt`` (dense) as llama.cpp's converter writes a Gemma 4 file: per-layer MLP widths, the
    full layers' head size as key_length (the sliding ones' as key_length_swa), the proportional
    RoPE as rope_freqs divisors (1, then 1e30), norms as stored, the per-layer table as
    per_layer_token_embd, the linears in ``linear_type`` (F32 or Q8_0; K = 16 projections F32, as
    its converter leaves them); the tokenizer as its 'gemma4' BPE."""
    gguf = pytest.importorskip("gguf")
    from safetensors.numpy import load_file

    T = gguf.GGMLQuantizationType
    cfg = json.loads((ckpt / "config.json").read_text())
    tj = json.loads((ckpt / "tokenizer.json").read_text())
    st = load_file(str(ckpt / "model.safetensors"))
    n, H, d, d_full = cfg["num_hidden_layers"], cfg["hidden_size"], cfg["head_dim"], cfg["global_head_dim"]
    first = n - cfg["num_kv_shared_layers"]
    types = cfg["layer_types"]
    w = gguf.GGUFWriter(str(path), "gemma4")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(H)
    w.add_block_count(n)
    w.add_feed_forward_length([cfg["intermediate_size"] * (2 if i >= first else 1) for i in range(n)])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_rope_freq_base(cfg["rope_parameters"]["full_attention"]["rope_theta"])
    w.add_rope_freq_base_swa(cfg["rope_parameters"]["sliding_attention"]["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_key_length(d_full)
    w.add_value_length(d_full)
    w.add_key_length_swa(d)
    w.add_value_length_swa(d)
    w.add_final_logit_softcapping(cfg["final_logit_softcapping"])
    w.add_sliding_window(cfg["sliding_window"])
    w.add_shared_kv_layers(cfg["num_kv_shared_layers"])
    w.add_embedding_length_per_layer_input(cfg["hidden_size_per_layer_input"])
    w.add_sliding_window_pattern([t == "sliding_attention" for t in types])
    w.add_rope_dimension_count(d_full)
    w.add_rope_dimension_count_swa(d)
    tokens, ttypes = [None] * cfg["vocab_size"], [1] * cfg["vocab_size"]
    for t, i in tj["model"]["vocab"].items():
        tokens[i] = t
        ttypes[i] = 6 if t.startswith("<0x") and len(t) == 6 else 1
    for a in tj["added_tokens"]:
        tokens[a["id"]], ttypes[a["id"]] = a["content"], 3
    for i, t in enumerate(tokens):
        if t is None:
            tokens[i], ttypes[i] = f"[PAD{i}]", 5
    w.add_tokenizer_model("gemma4")
    w.add_token_list(tokens)
    w.add_token_scores([-1000.0] * len(tokens))
    w.add_token_types(ttypes)
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]])
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_eos_token_id(cfg["eos_token_id"])

    def linear(name, a):
        if linear_type == T.F32 or a.shape[1] % 32:
            w.add_tensor(name, np.ascontiguousarray(a, np.float32))
        else:
            w.add_tensor(name, gguf.quants.quantize(np.ascontiguousarray(a, np.float32), linear_type),
                         raw_dtype=linear_type)

    share = cfg["rope_parameters"]["full_attention"]["partial_rotary_factor"]
    turning = int(share * d_full // 2)
    w.add_tensor("rope_freqs.weight", np.array([1.0] * turning + [1e30] * (d_full // 2 - turning), np.float32))
    w.add_tensor("token_embd.weight", st["model.embed_tokens.weight"])
    w.add_tensor("per_layer_token_embd.weight", st["model.embed_tokens_per_layer.weight"])
    linear("per_layer_model_proj.weight", st["model.per_layer_model_projection.weight"])
    w.add_tensor("per_layer_proj_norm.weight", st["model.per_layer_projection_norm.weight"])
    w.add_tensor("output_norm.weight", st["model.norm.weight"])
    norms = {"input_layernorm": "attn_norm", "post_attention_layernorm": "post_attention_norm",
             "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm",
             "post_per_layer_input_norm": "post_norm"}
    for i in range(n):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        for theirs, ours in norms.items():
            w.add_tensor(f"{b}{ours}.weight", st[f"{p}{theirs}.weight"])
        w.add_tensor(b + "layer_output_scale.weight", st[p + "layer_scalar"])
        for proj in ("q", "k", "v", "o"):
            name = f"{p}self_attn.{proj}_proj.weight"
            if name in st:
                linear(f"{b}attn_{'output' if proj == 'o' else proj}.weight", st[name])
        for norm in ("q_norm", "k_norm"):
            if f"{p}self_attn.{norm}.weight" in st:
                w.add_tensor(f"{b}attn_{norm}.weight", st[f"{p}self_attn.{norm}.weight"])
        for proj in ("gate", "up", "down"):
            linear(f"{b}ffn_{proj}.weight", st[f"{p}mlp.{proj}_proj.weight"])
        linear(b + "inp_gate.weight", st[p + "per_layer_input_gate.weight"])
        linear(b + "proj.weight", st[p + "per_layer_projection.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_gguf_file_matches_its_checkpoint(checkpoints, tmp_path):
    """A gemma4 GGUF file (llama.cpp's layout, checked against its converter's output) of the
    dense checkpoint: F32, the checkpoint's config and float logits, its tokenizer's ids; Q8_0,
    the codes moved (nothing re-rounded but what the file keeps in float) and the logits as close
    as the checkpoint's own int8 model's."""
    gguf = pytest.importorskip("gguf")
    T = gguf.GGMLQuantizationType
    ckpt = checkpoints["dense"]
    ref = load(ckpt)
    a = load(write_gguf(ckpt, tmp_path / "f32.gguf", T.F32))
    mine, theirs = a.config.to_dict(), ref.config.to_dict()
    assert mine.pop("rms_norm_eps") == pytest.approx(theirs.pop("rms_norm_eps"))  # (the file's floats: float32)
    assert mine == theirs
    want = ref.logits(IDS)
    np.testing.assert_allclose(a.logits(IDS), want, rtol=0, atol=1e-5 * np.abs(want).max())
    text = "Hello world, this is a test.\n\nNew line: é ☃ <0x41>"
    assert a.tokenizer.encode(text) == ref.tokenizer.encode(text)
    assert a.tokenizer.decode(a.tokenizer.encode(text)) == text
    q8 = load(write_gguf(ckpt, tmp_path / "q8.gguf", T.Q8_0), bits=8)
    assert "blk.4.attn_q.weight (Q8_0)" in q8.info["gguf_moved"] and "blk.4.attn_k.weight (Q8_0)" not in q8.info["gguf_moved"]
    c = cosines(q8.logits(IDS), want)
    assert c.mean() >= 0.998, c.mean()


def test_gguf_moe_files_are_refused(checkpoints, tmp_path):
    path = write_gguf(checkpoints["dense"], tmp_path / "f32.gguf", pytest.importorskip("gguf").GGMLQuantizationType.F32)
    gguf = pytest.importorskip("gguf")
    r = gguf.GGUFReader(str(path))
    w = gguf.GGUFWriter(str(tmp_path / "moe.gguf"), "gemma4")
    for field in r.fields.values():  # the same file with an expert count
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        kind = field.types[0]
        value = field.contents()
        if kind == gguf.GGUFValueType.ARRAY:
            w.add_array(field.name, value)
        else:
            w.add_key_value(field.name, value, kind)
    w.add_expert_count(8)
    for t in r.tensors:
        w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match="MoE"):
        load(tmp_path / "moe.gguf")
