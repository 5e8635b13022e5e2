"""GPT-OSS on small random checkpoints written here (``synthetic``, MXFP4 experts as the published
checkpoints store them): logits against transformers 5.x (which dequantizes the MXFP4 file
itself; skipped without it, failed so with QLINEAR_REQUIRE_TRANSFORMERS5=1), the MXFP4 experts
kept as stored, the attention sinks in the kernels against numpy, the compiled step against the
Python blocks, prefix reuse, and what a hostile file gets."""

import json
import shutil

import numpy as np
import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("safetensors")

from _llm_reference import assert_compiled_step_equals_python, assert_prefix_reuse_equals_fresh  # noqa: E402
from qlinear import _core, llm  # noqa: E402
from qlinear.llm import synthetic  # noqa: E402
from qlinear.llm.synthetic import gpt_oss as synthetic_gpt_oss  # noqa: E402

# layers 0 and 2 slide over 16 positions (rings the 150-token prompt wraps), 1 and 3 attend to all
SHAPE = dict(hidden_size=128, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
             num_hidden_layers=4, vocab_size=1024, sliding_window=16)
IDS = [int(t) for t in np.random.default_rng(7).integers(0, 1000, 150)]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpt_oss")
    return {"mxfp4": synthetic.make_checkpoint(root / "mxfp4", "gpt_oss", seed=0, norm_noise=0.1, **SHAPE),
            "float": synthetic.make_checkpoint(root / "float", "gpt_oss", seed=1, norm_noise=0.1, mxfp4=False,
                                               **SHAPE)}


def cosines(a, b):
    return np.sum(a * b, 1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


@pytest.mark.parametrize("form", ["mxfp4", "float"])
def test_float_path_matches_transformers(checkpoints, transformers5, form):
    """Sinks, YaRN, biases, the clamped SwiGLU, the top-k softmax and the sliding rings against
    transformers' GptOssForCausalLM, which reads the MXFP4 file with its own dequantization."""
    torch, transformers = transformers5
    model = transformers.AutoModelForCausalLM.from_pretrained(checkpoints[form], dtype=torch.float32).eval()
    with torch.no_grad():
        ref = model(torch.tensor([IDS])).logits[0].numpy()
    out = llm.load(checkpoints[form], bits=None, act="float", max_context=256, progress=False).logits(IDS)
    assert np.abs(out - ref).max() <= 1e-4 * np.abs(ref).max()


def test_mxfp4_experts_are_kept_as_stored(checkpoints):
    """Quantized or not, the MXFP4 experts hold the file's values: packed in the MXFP4 block
    format (4.25 bits a weight), their dequantization the numpy decoding of the blocks, gate and
    up as our halves of the interleaved rows."""
    from safetensors.numpy import load_file

    w = load_file(str(checkpoints["mxfp4"] / "model.safetensors"))
    M = 96
    model = llm.load(checkpoints["mxfp4"], bits=8, max_context=64, progress=False)
    for layer in (0, 3):
        x = f"model.layers.{layer}.mlp.experts."
        gate_up = synthetic_gpt_oss.dequantized(w[x + "gate_up_proj_blocks"], w[x + "gate_up_proj_scales"])
        down = synthetic_gpt_oss.dequantized(w[x + "down_proj_blocks"], w[x + "down_proj_scales"])
        for e in (0, 7):
            g, d = model.blocks[layer].experts[e]
            assert g.weight.format == "MXFP4" and d.weight.format == "MXFP4"
            np.testing.assert_array_equal(g.weight.dequantize(), np.concatenate([gate_up[e][0::2], gate_up[e][1::2]]))
            np.testing.assert_array_equal(d.weight.dequantize(), down[e])
            b = w[x + "gate_up_proj_bias"][e]
            np.testing.assert_array_equal(g.bias, np.concatenate([b[0::2], b[1::2]]))
            assert g.bias.shape == (2 * M,)


def routed_logits(model, ids):
    """(logits of ids, per position the smallest margin over the layers between the k-th and the
    (k+1)-th router logit: how near its routing was to a tie)."""
    margins = []
    for b in model.blocks:
        def route(x, b=b, route=b.route):
            logits = np.sort(x @ b._router_w.T + b.router.bias, 1)[:, ::-1]
            margins.append(logits[:, b.cfg.experts_per_token - 1] - logits[:, b.cfg.experts_per_token])
            return route(x)
        b.route = route
    return model.logits(ids), np.min(margins, 0)


@pytest.mark.parametrize("form", ["mxfp4", "float"])
def test_quantized_logits_stay_close(checkpoints, form):
    """int8 attention and lm head (W8A8) beside the MXFP4 experts (W4A8 on their codes), or the
    float file's experts in int8, against the float path: cosine >= 0.999 on average at the
    positions whose routing is no near-tie (every layer's k-th router logit 0.03 above the next:
    about 3 positions in 4 here; elsewhere int8 rounding may switch an expert). On seeds 0-3:
    0.9998-0.9999 there, 0.9984-0.9996 over all positions."""
    ref, margin = routed_logits(llm.load(checkpoints[form], bits=None, act="float", max_context=256,
                                         progress=False), IDS)
    model = llm.load(checkpoints[form], bits=8, max_context=256, progress=False)
    c = cosines(model.logits(IDS), ref)
    clear = margin > 0.03
    assert clear.mean() > 0.6
    assert c[clear].mean() >= 0.999 and c.mean() >= 0.998


@pytest.mark.parametrize("kv_cache", ["float32", "float16"])
def test_compiled_step_equals_the_python_blocks(checkpoints, kv_cache):
    """The compiled decode step (sinks in its attention, the experts' clamped SwiGLU and biases)
    gives the Python blocks' logits and KV rows bit for bit, one token at a time past the rings'
    wrap and as a speculative verification's block."""
    assert_compiled_step_equals_python(
        lambda: llm.load(checkpoints["mxfp4"], bits=8, max_context=256, kv_cache=kv_cache, progress=False), IDS, 4)


def test_decode_equals_full_forward(checkpoints):
    model = llm.load(checkpoints["mxfp4"], bits=8, max_context=256, progress=False)
    model.tokenizer.stop_ids = set()
    gen = model.generate_ids(IDS[:20], 30)
    full = model.logits(IDS[:20] + gen)
    assert full[19:-1].argmax(-1).tolist() == gen


def test_prefix_reuse_equals_fresh(checkpoints, monkeypatch):
    """Prefill cut into forwards anywhere (the rings wrapped between cuts) and a prefix restored
    from the store give one pass's logits bit for bit."""
    assert_prefix_reuse_equals_fresh(
        lambda: llm.load(checkpoints["mxfp4"], bits=8, max_context=512, progress=False), IDS, monkeypatch)


def test_converted_model_equals_the_checkpoint(checkpoints, tmp_path):
    from qlinear.llm.converted.convert import convert

    out = convert(checkpoints["mxfp4"], tmp_path / "converted", bits=8, progress=False)
    a = llm.load(out, max_context=256, progress=False).logits(IDS)
    b = llm.load(checkpoints["mxfp4"], bits=8, max_context=256, progress=False).logits(IDS)
    np.testing.assert_array_equal(a, b)


# -- the kernels against numpy -----------------------------------------------------------------------
def attention_reference(q, k, v, sinks, window):
    """q [n, heads, d] at positions start.. over k / v [positions, kv, d] (the last n rows are
    q's own): each head's softmax with its sink as one more logit weighing nothing."""
    n, heads, d = q.shape
    total, group = k.shape[0], heads // k.shape[1]
    out = np.zeros((n, heads, d))
    for r in range(n):
        p = total - n + r
        lo = max(0, p - window + 1) if window else 0
        for h in range(heads):
            s = k[lo:p + 1, h // group].astype(np.float64) @ q[r, h].astype(np.float64) / np.sqrt(d)
            m = max(s.max(), sinks[h])
            e = np.exp(s - m)
            out[r, h] = e @ v[lo:p + 1, h // group] / (e.sum() + np.exp(sinks[h] - m))
    return out


@pytest.mark.parametrize("kv_dtype", [np.float32, np.float16])
@pytest.mark.parametrize("window", [0, 24])
@pytest.mark.parametrize("heads, kv, d", [(4, 2, 64), (6, 3, 40), (2, 1, 128)])
def test_sinks_in_attention_kernels(kv_dtype, window, heads, kv, d):
    """attend_prefill (100 rows from position 0: several key blocks, windowed or not) and
    attend_one (the next position), RoPE at frequency 0, against numpy; sinks of both signs,
    large ones included (a head that attends to almost nothing)."""
    rng = np.random.default_rng(heads * d + window)
    n, cap = 100, 128
    sinks = np.array([3.0, -2.0, 0.5, 12.0, -30.0, 1.0][:heads], np.float32)
    qkv = rng.standard_normal((n + 1, (heads + 2 * kv) * d)).astype(np.float32)
    cos, sin = np.ones((cap, d // 2), np.float32), np.zeros((cap, d // 2), np.float32)
    k_cache, v_cache = np.zeros((kv, cap, d), kv_dtype), np.zeros((kv, cap, d), kv_dtype)
    out = _core.attend_prefill(qkv[:n], cos, sin, 0, k_cache, v_cache, heads, d ** -0.5, window=window, sinks=sinks)
    q = qkv[:, :heads * d].reshape(n + 1, heads, d)
    k = qkv[:, heads * d:(heads + kv) * d].reshape(n + 1, kv, d).astype(kv_dtype).astype(np.float32)
    v = qkv[:, (heads + kv) * d:].reshape(n + 1, kv, d).astype(kv_dtype).astype(np.float32)
    ref = attention_reference(q[:n], k[:n], v[:n], sinks, window)
    np.testing.assert_allclose(out.reshape(n, heads, d), ref, rtol=0, atol=2e-5 * np.abs(ref).max() + 1e-6)
    if window:  # a decode step's window is its ring: a cache of `window` rows
        ring_k, ring_v = np.zeros((kv, window, d), kv_dtype), np.zeros((kv, window, d), kv_dtype)
        slots = np.arange(n - window + 1, n) % window
        ring_k[:, slots], ring_v[:, slots] = k_cache[:, n - window + 1:n], v_cache[:, n - window + 1:n]
        k_cache, v_cache = ring_k, ring_v
    one = _core.attend_one(qkv[n:], cos, sin, n, k_cache, v_cache, heads, d ** -0.5, window=window, sinks=sinks)
    ref = attention_reference(q[n:], k, v, sinks, window)
    np.testing.assert_allclose(one.reshape(1, heads, d), ref, rtol=0, atol=2e-5 * np.abs(ref).max() + 1e-6)


def test_sinks_are_checked():
    qkv = np.zeros((1, 4 * 16), np.float32)
    cos, sin = np.ones((8, 8), np.float32), np.zeros((8, 8), np.float32)
    k, v = np.zeros((1, 8, 16), np.float32), np.zeros((1, 8, 16), np.float32)
    for bad in (np.zeros(3, np.float32), np.array([0, np.nan], np.float32), np.array([0, np.inf], np.float32)):
        with pytest.raises(ValueError, match="sinks"):
            _core.attend_one(qkv, cos, sin, 0, k, v, 2, 0.25, sinks=bad)


def test_clamped_swiglu_against_numpy():
    rng = np.random.default_rng(0)
    gu = (rng.standard_normal((5, 2 * 37)) * 6).astype(np.float32)
    gate, up = np.minimum(gu[:, :37], 7.0), np.clip(gu[:, 37:], -7.0, 7.0)
    ref = (up + 1) * gate / (1 + np.exp(-1.702 * gate))
    np.testing.assert_allclose(_core.clamped_swiglu_mul(gu, 7.0, 1.702), ref, rtol=1e-6, atol=1e-6)


# -- hostile files -------------------------------------------------------------------------------------
def _edit(src, dst, config=None, drop=(), replace=None):
    from safetensors.numpy import load_file, save_file

    shutil.copytree(src, dst)
    if config:
        cfg = json.loads((dst / "config.json").read_text())
        (dst / "config.json").write_text(json.dumps({**cfg, **config}))
    w = load_file(str(dst / "model.safetensors"))
    for name in drop:
        del w[name]
    for name, value in (replace or {}).items():
        w[name] = value(w[name])
    save_file(w, str(dst / "model.safetensors"))
    return dst


X = "model.layers.1.mlp.experts."
HOSTILE = {
    "scales of the wrong shape": (dict(replace={X + "down_proj_scales": lambda a: a[:, :, :1].copy()}), "down_proj_scales"),
    "scales missing": (dict(drop=[X + "gate_up_proj_scales"]), "gate_up_proj_scales"),
    "blocks of floats": (dict(replace={X + "down_proj_blocks": lambda a: a.astype(np.float32)}), "down_proj_blocks"),
    "no expert bias": (dict(drop=[X + "down_proj_bias"]), "down_proj_bias"),
    "infinite sink": (dict(replace={"model.layers.2.self_attn.sinks": lambda a: np.full_like(a, np.inf)}), "sinks"),
    "infinite exponent": (dict(replace={X + "down_proj_scales": lambda a: np.full_like(a, 255)}), "NaN or infinite"),
    "yarn without its length": (dict(config={"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e5,
                                                                 "factor": 4.0}}), "original_max_position_embeddings"),
    "bad swiglu_limit": (dict(config={"swiglu_limit": -1}), "swiglu_limit"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_files_are_refused(checkpoints, tmp_path, case):
    edit, match = HOSTILE[case]
    path = _edit(checkpoints["mxfp4"], tmp_path / "bad", **edit)
    with pytest.raises(ValueError, match=match):
        llm.load(path, bits=8, max_context=64, progress=False)


# -- GGUF: llama.cpp's gpt-oss files -------------------------------------------------------------------
def write_gguf(ckpt, path, linear_type):
    """``ckpt`` as llama.cpp's converter writes a GPT-OSS file: the MXFP4 experts' blocks moved as
    they are (gate and up split, codes j and j + 16 in one byte after the exponent byte), the
    other linears in ``linear_type`` (F32 or Q8_0), norms, biases, sinks and router F32."""
    gguf = pytest.importorskip("gguf")
    from safetensors.numpy import load_file

    T = gguf.GGMLQuantizationType
    cfg = json.loads((ckpt / "config.json").read_text())
    tj = json.loads((ckpt / "tokenizer.json").read_text())
    st = load_file(str(ckpt / "model.safetensors"))
    rope = cfg["rope_parameters"]
    w = gguf.GGUFWriter(str(path), "gpt-oss")
    for add, v in ((w.add_context_length, cfg["max_position_embeddings"]), (w.add_embedding_length, cfg["hidden_size"]),
                   (w.add_block_count, cfg["num_hidden_layers"]), (w.add_feed_forward_length, cfg["intermediate_size"]),
                   (w.add_head_count, cfg["num_attention_heads"]), (w.add_head_count_kv, cfg["num_key_value_heads"]),
                   (w.add_layer_norm_rms_eps, cfg["rms_norm_eps"]), (w.add_rope_freq_base, rope["rope_theta"]),
                   (w.add_key_length, cfg["head_dim"]), (w.add_value_length, cfg["head_dim"]),
                   (w.add_expert_count, cfg["num_local_experts"]), (w.add_expert_used_count, cfg["num_experts_per_tok"]),
                   (w.add_expert_feed_forward_length, cfg["intermediate_size"]),
                   (w.add_sliding_window, cfg["sliding_window"]), (w.add_rope_scaling_factor, rope["factor"]),
                   (w.add_rope_scaling_orig_ctx_len, rope["original_max_position_embeddings"]),
                   (w.add_rope_scaling_yarn_beta_fast, rope["beta_fast"]),
                   (w.add_rope_scaling_yarn_beta_slow, rope["beta_slow"])):
        add(v)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    tokens, types = [None] * cfg["vocab_size"], [1] * cfg["vocab_size"]
    for t, i in tj["model"]["vocab"].items():
        tokens[i] = t
    for a in tj["added_tokens"]:
        tokens[a["id"]], types[a["id"]] = a["content"], 3
    for i, t in enumerate(tokens):
        if t is None:
            tokens[i], types[i] = f"[PAD{i}]", 5
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]])
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_eos_token_id(cfg["eos_token_id"])

    def linear(name, a):
        if linear_type == T.F32:
            w.add_tensor(name, np.ascontiguousarray(a, np.float32))
        else:
            w.add_tensor(name, gguf.quants.quantize(np.ascontiguousarray(a, np.float32), linear_type),
                         raw_dtype=linear_type)

    def mxfp4(name, blocks, scales):  # [E, N, K / 32, 16] + [E, N, K / 32] -> [E, N, K / 32 * 17]
        codes = np.stack([blocks & 15, blocks >> 4], -1).reshape(*blocks.shape[:-1], 32)
        rows = np.concatenate([scales[..., None], codes[..., :16] | (codes[..., 16:] << 4)], -1)
        w.add_tensor(name, np.ascontiguousarray(rows.reshape(*rows.shape[:2], -1)), raw_dtype=T.MXFP4)

    w.add_tensor("token_embd.weight", st["model.embed_tokens.weight"])
    w.add_tensor("output_norm.weight", st["model.norm.weight"])
    linear("output.weight", st["lm_head.weight"])
    names = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output"}
    for i in range(cfg["num_hidden_layers"]):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", st[p + "input_layernorm.weight"])
        w.add_tensor(b + "post_attention_norm.weight", st[p + "post_attention_layernorm.weight"])
        for theirs, ours in names.items():
            linear(f"{b}{ours}.weight", st[f"{p}self_attn.{theirs}.weight"])
            w.add_tensor(f"{b}{ours}.bias", st[f"{p}self_attn.{theirs}.bias"])
        w.add_tensor(b + "attn_sinks.weight", st[p + "self_attn.sinks"])
        w.add_tensor(b + "ffn_gate_inp.weight", st[p + "mlp.router.weight"])
        w.add_tensor(b + "ffn_gate_inp.bias", st[p + "mlp.router.bias"])
        x = p + "mlp.experts."
        gu_b, gu_s = st[x + "gate_up_proj_blocks"], st[x + "gate_up_proj_scales"]
        mxfp4(b + "ffn_gate_exps.weight", gu_b[:, 0::2], gu_s[:, 0::2])
        mxfp4(b + "ffn_up_exps.weight", gu_b[:, 1::2], gu_s[:, 1::2])
        mxfp4(b + "ffn_down_exps.weight", st[x + "down_proj_blocks"], st[x + "down_proj_scales"])
        bias = st[x + "gate_up_proj_bias"]
        w.add_tensor(b + "ffn_gate_exps.bias", np.ascontiguousarray(bias[:, 0::2]))
        w.add_tensor(b + "ffn_up_exps.bias", np.ascontiguousarray(bias[:, 1::2]))
        w.add_tensor(b + "ffn_down_exps.bias", st[x + "down_proj_bias"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_gguf_file_matches_its_checkpoint(tmp_path):
    """A gpt-oss GGUF file (llama.cpp's layout) of the checkpoint, its other linears F32: the
    checkpoint's float logits (the file's RoPE is ggml's YaRN, whose ramp ends are rounded out:
    the checkpoint says so too here); with Q8_0 beside the experts, the MXFP4 blocks are moved
    (the packed experts' values are the checkpoint's, nothing requantized) and the logits stay
    as close as the checkpoint's int8 model's."""
    gguf = pytest.importorskip("gguf")
    T = gguf.GGMLQuantizationType
    rope = {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
            "truncate": True, "original_max_position_embeddings": 4096}
    ckpt = synthetic.make_checkpoint(tmp_path / "ckpt", "gpt_oss", seed=2, norm_noise=0.1, rope_parameters=rope, **SHAPE)
    ref = llm.load(ckpt, bits=None, act="float", max_context=256, progress=False)
    a = llm.load(write_gguf(ckpt, tmp_path / "f32.gguf", T.F32), bits=None, act="float", max_context=256,
                 progress=False)
    mine, theirs = a.config.to_dict(), ref.config.to_dict()
    assert mine.pop("rms_norm_eps") == pytest.approx(theirs.pop("rms_norm_eps"))  # (the file's floats: float32)
    theirs["rope_scaling"].pop("rope_theta")  # (transformers 5 keeps the base among the RoPE parameters)
    assert mine.pop("rope_scaling") == pytest.approx(theirs.pop("rope_scaling"))
    assert mine == theirs
    want = ref.logits(IDS)
    np.testing.assert_allclose(a.logits(IDS), want, rtol=0, atol=1e-5 * np.abs(want).max())
    packed = llm.load(write_gguf(ckpt, tmp_path / "q8.gguf", T.Q8_0), max_context=256, progress=False)
    assert not packed.info["gguf_requantized"]
    assert "blk.3.ffn_down_exps.weight (MXFP4)" in packed.info["gguf_moved"]
    mine = llm.load(ckpt, bits=8, max_context=256, progress=False)
    for (g, d), (g2, d2) in zip(packed.blocks[3].experts, mine.blocks[3].experts):
        np.testing.assert_array_equal(g.weight.dequantize(), g2.weight.dequantize())
        np.testing.assert_array_equal(d.bias, d2.bias)
    c = cosines(packed.logits(IDS), want)
    assert c.mean() >= 0.998 and np.median(c) >= 0.9995


@pytest.mark.parametrize("form", ["gguf", "converted"])
@pytest.mark.parametrize("slots", [None, 1, 3])
def test_flash_experts_with_biases_equal_the_in_memory_load(checkpoints, tmp_path, form, slots):
    """memory='flash' on GPT-OSS: MXFP4 experts read from a GGUF file (or a converted model) into
    slots, each run with its own biases (resident) and the clamped SwiGLU: the in-memory load's
    logits and generated tokens bit for bit, whatever the cache's size (one slot: fewer than a
    token's experts)."""
    from qlinear.llm.converted.convert import convert
    from qlinear.llm.flash.loader import load_flash
    from qlinear.llm.options import Options

    if form == "gguf":
        gguf = pytest.importorskip("gguf")
        path = write_gguf(checkpoints["mxfp4"], tmp_path / "q8.gguf", gguf.GGMLQuantizationType.Q8_0)
    else:
        path = convert(checkpoints["mxfp4"], tmp_path / "converted", bits=8, progress=False)
    ref = llm.load(path, max_context=256, progress=False)
    want, want_gen = ref.logits(IDS), ref.generate_ids(IDS[:6], 10)
    m = load_flash(path, Options(memory="flash").check(), 256, expert_slots=slots)
    try:
        assert m.info["flash_experts"] and all(b.expert_biases is not None and b.core_experts is not None
                                               for b in m.blocks)
        np.testing.assert_array_equal(m.logits(IDS), want)
        m.reset()
        assert m.generate_ids(IDS[:6], 10) == want_gen
        assert m.flash.stats["misses"] > 0
    finally:
        m.close()
