"""GGUF files (llama.cpp's format) written here from the synthetic checkpoints with gguf's own
writer: logits against numpy float math on the file's dequantized weights, codes moved exactly,
the rebuilt tokenizer, W4A8 generation, hostile files."""

import json
import math
import os
import struct

import numpy as np
import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")
pytest.importorskip("torch")
pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

from gguf import GGMLQuantizationType as T  # noqa: E402
from gguf import quants  # noqa: E402

import qlinear  # noqa: E402
from qlinear import blocks  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402

from _llm_reference import forward  # noqa: E402
from qlinear import llm  # noqa: E402
from qlinear.llm import synthetic  # noqa: E402

SHAPE = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2,
             num_hidden_layers=2, vocab_size=1024)


def q4_k(w):
    """A small Q4_K encoder of the documented block layout (ggml's k-quants): per 256 values,
    d, dmin (f16), 8 x (6-bit scale, 6-bit min) packed in 12 bytes, 128 bytes of 4-bit q."""
    n, k = w.shape
    x = w.reshape(n, k // 256, 8, 32).astype(np.float32)
    lo, hi = np.minimum(x.min(-1), 0), x.max(-1)
    scale, mn = (hi - lo) / 15, -lo
    d = (scale.max(-1) / 63).astype(np.float16)
    dmin = (mn.max(-1) / 63).astype(np.float16)
    df, dmf = d.astype(np.float32)[..., None], dmin.astype(np.float32)[..., None]
    sc = np.clip(np.rint(scale / np.where(df > 0, df, 1)), 0, 63).astype(np.uint8)
    m = np.clip(np.rint(mn / np.where(dmf > 0, dmf, 1)), 0, 63).astype(np.uint8)
    eff_s, eff_m = (df * sc)[..., None], (dmf * m)[..., None]
    q = np.clip(np.rint((x + eff_m) / np.where(eff_s > 0, eff_s, 1)), 0, 15).astype(np.uint8)
    scales = np.zeros((n, k // 256, 12), np.uint8)
    scales[..., 0:4] = (sc[..., :4] & 63) | ((sc[..., 4:] >> 4) << 6)
    scales[..., 4:8] = (m[..., :4] & 63) | ((m[..., 4:] >> 4) << 6)
    scales[..., 8:12] = (sc[..., 4:] & 15) | ((m[..., 4:] & 15) << 4)
    q = q.reshape(n, k // 256, 4, 2, 32)
    qs = q[..., 0, :] | (q[..., 1, :] << 4)
    out = np.concatenate([d[..., None].view(np.uint8), dmin[..., None].view(np.uint8), scales,
                          qs.reshape(n, k // 256, 128)], axis=-1)
    return out.reshape(n, -1)


def encode(w, qtype):
    """File blocks of a float weight: gguf's quantizer where it has one, else the package's
    (qlinear.blocks; the tests read the files back with gguf's own dequantize)."""
    if qtype == T.Q4_K:
        return q4_k(w.reshape(-1, w.shape[-1])).reshape(*w.shape[:-1], -1)
    if qtype.name in ("Q2_K", "Q3_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS", "MXFP4"):
        return blocks.quantize(w.reshape(-1, w.shape[-1]), qtype.name).reshape(*w.shape[:-1], -1)  # experts: 3-D
    return quants.quantize(w, qtype)


def permute(w, heads):
    """llama.cpp's converter's Q/K row order for Llama."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(ckpt, path, qtype, embd=T.F16, types=None, pre="gpt-2", spm=None):
    """``ckpt`` (a synthetic checkpoint) as a GGUF file: linears in ``qtype`` (``types`` overrides
    per GGUF name), norms / biases F32, embedding ``embd``."""
    cfg = json.loads((ckpt / "config.json").read_text())
    tj = json.loads((ckpt / "tokenizer.json").read_text())
    st = load_file(str(ckpt / "model.safetensors"))
    arch = {"gemma3_text": "gemma3", "qwen3_moe": "qwen3moe", "mixtral": "llama", "qwen3_5_text": "qwen35"}.get(
        cfg["model_type"], cfg["model_type"])
    w = gguf.GGUFWriter(str(path), arch)
    if arch == "lfm2":  # as llama.cpp's converter writes it: KV heads per layer (0: a conv layer)
        w.add_shortconv_l_cache(cfg["conv_L_cache"])
        cfg["num_key_value_heads"] = [cfg["num_key_value_heads"] if t != "conv" else 0 for t in cfg["layer_types"]]
        cfg["rms_norm_eps"] = cfg["norm_eps"]
    if arch == "qwen35":
        st = _qwen35_tensors(w, cfg, st)
    experts = cfg.get("num_experts") or cfg.get("num_local_experts", 0)
    if experts:  # as llama.cpp's converter writes them (Qwen3-MoE, OLMoE, Mixtral as llama)
        w.add_expert_count(experts)
        w.add_expert_used_count(cfg["num_experts_per_tok"])
        if arch == "qwen3moe":
            w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
        if cfg.get("clip_qkv"):
            w.add_clamp_kqv(cfg["clip_qkv"])
    if arch == "gemma3":  # as llama.cpp's converter writes it
        w.add_sliding_window(cfg["sliding_window"])
        w.add_uint32("gemma3.attention.sliding_window_pattern", 3)
        w.add_float32("gemma3.rope.freq_base_swa", cfg["rope_local_base_freq"])
    if arch == "gemma2":
        w.add_sliding_window(cfg["sliding_window"])
        w.add_attn_logit_softcapping(cfg["attn_logit_softcapping"])
        w.add_final_logit_softcapping(cfg["final_logit_softcapping"])
    if arch == "phi3":  # as llama.cpp's converter writes it
        hd = cfg["hidden_size"] // cfg["num_attention_heads"]
        w.add_rope_dimension_count(int(hd * cfg.get("partial_rotary_factor", 1.0)))
        w.add_sliding_window(cfg.get("sliding_window") or 0)
        rs = cfg.get("rope_scaling")
        if rs:
            orig = cfg["original_max_position_embeddings"]
            scale = cfg["max_position_embeddings"] / orig
            w.add_rope_scaling_orig_ctx_len(orig)
            w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(orig)) if scale > 1 else 1.0)
            w.add_tensor("rope_factors_long.weight", np.array(rs["long_factor"], np.float32))
            w.add_tensor("rope_factors_short.weight", np.array(rs["short_factor"], np.float32))
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(cfg["rope_theta"])
    if "head_dim" in cfg:
        w.add_key_length(cfg["head_dim"])
        w.add_value_length(cfg["head_dim"])
    vocab = tj["model"]["vocab"]
    tokens = [None] * cfg["vocab_size"]
    for t, i in vocab.items():
        tokens[i] = t
    ttypes = [1] * len(tokens)
    for a in tj["added_tokens"]:
        tokens[a["id"]], ttypes[a["id"]] = a["content"], 3
    for i, t in enumerate(tokens):
        if t is None:
            tokens[i], ttypes[i] = f"[PAD{i}]", 5
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    if spm is None:
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(pre)
        w.add_token_merges(merges)
    else:  # a SentencePiece model of the same vocabulary size
        n = spm.get_piece_size()
        tokens = [spm.id_to_piece(i) for i in range(n)]
        ttypes = [3 if spm.is_control(i) else 2 if spm.is_unknown(i) else 6 if spm.is_byte(i) else 1
                  for i in range(n)]
        w.add_tokenizer_model("llama")
        w.add_token_scores([spm.get_score(i) for i in range(n)])
    w.add_token_list(tokens)
    w.add_token_types(ttypes)
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_eos_token_id(cfg["eos_token_id"])
    w.add_chat_template(synthetic.CHATML_TEMPLATE)
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
             "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
             "self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "ffn_up"}  # Phi-3's fused ones
    if arch == "qwen35":  # the post-attention norm is the MLP's input norm
        names.update({"post_attention_layernorm": "post_attention_norm", **_QWEN35_NAMES})
    if arch == "lfm2":
        names.update({"operator_norm": "attn_norm", "ffn_norm": "ffn_norm", "feed_forward.w1": "ffn_gate",
                      "feed_forward.w3": "ffn_up", "feed_forward.w2": "ffn_down", "self_attn.out_proj": "attn_output",
                      "self_attn.q_layernorm": "attn_q_norm", "self_attn.k_layernorm": "attn_k_norm",
                      "conv.in_proj": "shortconv.in_proj", "conv.out_proj": "shortconv.out_proj",
                      "conv.conv": "shortconv.conv"})
    if arch in ("gemma2", "gemma3"):  # four norms a block
        names.update({"pre_feedforward_layernorm": "ffn_norm", "post_attention_layernorm": "post_attention_norm",
                      "post_feedforward_layernorm": "post_ffw_norm"})
    types = types or {}
    st = _stack_experts(st, experts)
    names.update({"mlp.gate": "ffn_gate_inp", "mlp.gate_exps": "ffn_gate_exps", "mlp.up_exps": "ffn_up_exps",
                  "mlp.down_exps": "ffn_down_exps"})
    for name, a in st.items():
        a = np.ascontiguousarray(a, np.float32)
        if name == "model.embed_tokens.weight":
            g, t = "token_embd.weight", embd
        elif name == "model.norm.weight":
            g, t = "output_norm.weight", T.F32
        elif name == "model.embedding_norm.weight":  # LFM2's final norm
            g, t = "token_embd_norm.weight", T.F32
        elif name == "lm_head.weight":
            g, t = "output.weight", qtype
        else:
            _, _, i, rest = name.split(".", 3)
            mod, kind = rest.rsplit(".", 1)
            g = f"blk.{i}.{names[mod]}.{kind}"
            g = g.removesuffix(".weight") if g.endswith("ssm_a.weight") else g  # llama.cpp's name for it
            if mod == "conv.conv":  # [hidden, 1, kernel] -> [hidden, kernel], as the converter squeezes it
                a = a.reshape(a.shape[0], -1)
            t = T.F32 if a.ndim == 1 or mod in ("mlp.gate", "linear_attn.conv1d", "conv.conv") else qtype  # routers F32
            if arch == "llama" and mod in ("self_attn.q_proj", "self_attn.k_proj"):
                a = permute(a, heads if mod == "self_attn.q_proj" else kv)
        if arch in ("gemma2", "gemma3", "qwen35") and name.endswith("norm.weight") and "linear_attn" not in name:
            a = a + 1  # Gemma / Qwen3.5 store RMSNorm weights as w - 1; llama.cpp's converter adds the 1
        t = types.get(g, t)
        data = a if t == T.F32 else a.astype(np.float16) if t == T.F16 else encode(a, t)
        w.add_tensor(g, data, raw_dtype=None if t in (T.F32, T.F16) else t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


_QWEN35_NAMES = {"linear_attn.in_proj_qkv": "attn_qkv", "linear_attn.in_proj_z": "attn_gate",
                 "linear_attn.in_proj_b": "ssm_beta", "linear_attn.in_proj_a": "ssm_alpha",
                 "linear_attn.out_proj": "ssm_out", "linear_attn.norm": "ssm_norm",
                 "linear_attn.conv1d": "ssm_conv1d", "linear_attn": "ssm_a", "linear_attn.dt": "ssm_dt"}


def _qwen35_tensors(w, cfg: dict, st: dict) -> dict:
    """Qwen3.5's metadata and tensors as llama.cpp's converter writes them: the delta layers'
    geometry as ssm.*, the recurrent layers listed, value heads reordered from grouped (by key
    head) to tiled, A_log as ssm_a = -exp(A_log), the conv [channels, kernel]."""
    nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv, r = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"], nv // nk
    w.add_ssm_conv_kernel(cfg["linear_conv_kernel_dim"])
    w.add_ssm_state_size(dk)
    w.add_ssm_group_count(nk)
    w.add_ssm_time_step_rank(nv)
    w.add_ssm_inner_size(dv * nv)
    w.add_array("qwen35.attention.recurrent_layers", [t == "linear_attention" for t in cfg["layer_types"]])
    w.add_uint32("qwen35.full_attention_interval", 4)
    w.add_rope_dimension_count(int(cfg["head_dim"] * cfg["rope_parameters"]["partial_rotary_factor"]))
    cfg["rope_theta"] = cfg["rope_parameters"]["rope_theta"]

    def tiled(a, head, axis=0):  # [nk, r, head] -> [r, nk, head] along ``axis``
        a = np.moveaxis(a, axis, 0)
        a = a.reshape(nk, r, head, *a.shape[1:]).swapaxes(0, 1).reshape(a.shape)
        return np.moveaxis(a, 0, axis)

    out = {}
    for name, a in st.items():
        if ".linear_attn." not in name:
            out[name] = a
            continue
        p = name.rsplit(".linear_attn.", 1)[0] + ".linear_attn."
        rest = name[len(p):]
        if rest == "in_proj_qkv.weight":
            a = np.concatenate([a[:2 * nk * dk], tiled(a[2 * nk * dk:], dv)])
        elif rest == "in_proj_z.weight":
            a = tiled(a, dv)
        elif rest in ("in_proj_a.weight", "in_proj_b.weight"):
            a = tiled(a, 1)
        elif rest == "A_log":
            name, a = p + "weight", -np.exp(tiled(a, 1))
        elif rest == "dt_bias":
            name, a = p + "dt.bias", tiled(a, 1)
        elif rest == "conv1d.weight":
            a = a.reshape(a.shape[0], -1)
            a = np.concatenate([a[:2 * nk * dk], tiled(a[2 * nk * dk:], dv)])
        elif rest == "out_proj.weight":
            a = tiled(a, dv, axis=1)
        out[name] = a
    return out


def _stack_experts(st: dict, experts: int) -> dict:
    """Each layer's experts' gate / up / down weights as the [experts, rows, k] tensors of a
    GGUF file (``mlp.gate_exps`` ...)."""
    if not experts:
        return st
    mixtral = any(".block_sparse_moe." in k for k in st)  # w1 / w3 / w2: gate / up / down
    prefix, names = ("block_sparse_moe.", {"gate": "w1", "up": "w3", "down": "w2"}) if mixtral else \
        ("mlp.", {p: p + "_proj" for p in ("gate", "up", "down")})
    out = {k.replace("block_sparse_moe.gate.", "mlp.gate."): v for k, v in st.items() if ".experts." not in k}
    layers = {k.split(".")[2] for k in st if ".experts." in k}
    for i in layers:
        for part, theirs in names.items():
            out[f"model.layers.{i}.mlp.{part}_exps.weight"] = np.stack(
                [st[f"model.layers.{i}.{prefix}experts.{e}.{theirs}.weight"] for e in range(experts)])
    return out


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf-ckpt")
    return {arch: synthetic.make_checkpoint(root / arch, arch=arch, shape="tiny", seed=5, **SHAPE)
            for arch in ("qwen2", "llama")}


@pytest.fixture(scope="module")
def files(checkpoints, tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf")
    out = {}
    for arch, ckpt in checkpoints.items():
        for qt in (T.Q8_0, T.Q4_0, T.Q4_K):
            out[arch, qt.name] = write_gguf(ckpt, root / f"{arch}-{qt.name}.gguf", qt)
    return out


class _Lin:
    def __init__(self, w, bias=None):
        self.w, self.bias = w, bias

    def dequantize(self):
        return self.w


class _Export:
    """The file's dequantized weights in Hugging Face order, for tests/_llm_reference.forward."""

    def __init__(self, path):
        r = gguf.GGUFReader(str(path))
        t = {x.name: np.asarray(quants.dequantize(x.data, x.tensor_type), np.float32).reshape(
            tuple(int(d) for d in reversed(x.shape))) for x in r.tensors}
        f = {k: r.get_field(k).contents() for k in r.fields if not k.startswith("GGUF.")}
        arch = f["general.architecture"]
        heads, kv = f[arch + ".attention.head_count"], f[arch + ".attention.head_count_kv"]
        hd = f[arch + ".embedding_length"] // heads
        self.config = {"num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": hd,
                       "rms_norm_eps": f[arch + ".attention.layer_norm_rms_epsilon"],
                       "num_hidden_layers": f[arch + ".block_count"]}
        self.rope_inv_freq = 1.0 / (f[arch + ".rope.freq_base"] ** (np.arange(0, hd, 2) / hd))

        def unperm(x, h):  # inverse of permute
            if arch != "llama":
                return x
            return x.reshape(h, x.shape[0] // h // 2, 2, *x.shape[1:]).swapaxes(1, 2).reshape(x.shape)

        self.table = t["token_embd.weight"]
        self.norms = {"model.norm": t["output_norm.weight"]}
        self.linears = {"lm_head": _Lin(t["output.weight"])}
        hf = {"attn_q": ("self_attn.q_proj", heads), "attn_k": ("self_attn.k_proj", kv),
              "attn_v": ("self_attn.v_proj", None), "attn_output": ("self_attn.o_proj", None),
              "ffn_gate": ("mlp.gate_proj", None), "ffn_up": ("mlp.up_proj", None),
              "ffn_down": ("mlp.down_proj", None)}
        for i in range(self.config["num_hidden_layers"]):
            p, b = f"model.layers.{i}.", f"blk.{i}."
            self.norms[p + "input_layernorm"] = t[b + "attn_norm.weight"]
            self.norms[p + "post_attention_layernorm"] = t[b + "ffn_norm.weight"]
            for g, (name, h) in hf.items():
                bias = t.get(b + g + ".bias")
                w = t[b + g + ".weight"]
                if h:
                    w, bias = unperm(w, h), None if bias is None else unperm(bias, h)
                self.linears[p + name] = _Lin(w, bias)

    def embed(self, ids):
        return self.table[ids]


def cosines(a, b):
    return np.sum(a * b, 1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


IDS = [int(t) for t in np.random.default_rng(11).integers(0, 1000, 48)]


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_K"])
def test_float_logits_match_the_files_weights(files, arch, qtype):
    path = files[arch, qtype]
    model = llm.load(path, act="float", progress=False)
    assert model.info["source"] == "gguf" and model.info["gguf_requantized"] == []
    ref = forward(_Export(path), IDS)
    cos = cosines(model.logits(IDS).astype(np.float64), ref)
    assert cos.min() >= 0.9999, cos.min()


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_K"])
def test_codes_are_moved_exactly(files, qtype):
    path = files["qwen2", qtype]
    model = llm.load(path, progress=False)
    r = gguf.GGUFReader(str(path))
    t = next(x for x in r.tensors if x.name == "blk.1.ffn_down.weight")
    want = np.asarray(quants.dequantize(t.data, t.tensor_type), np.float32).reshape(256, 512)
    pw = model.blocks[1].down.weight
    assert pw.group_size == (256 if qtype == "Q4_K" else 32) and pw.bits == (8 if qtype == "Q8_0" else 4)
    blk = np.asarray(t.data).reshape(256, 512 // (256 if qtype == "Q4_K" else 32), -1)
    if qtype == "Q4_K":  # a block format: the file's bytes, as they are
        assert pw.format == "Q4_K" and pw.bits_per_weight == 4.5
        np.testing.assert_array_equal(pw.unpack_blocks(), np.asarray(t.data).reshape(256, -1))
        np.testing.assert_array_equal(pw.dequantize(), want)
        return
    codes, scale, offset = pw.unpack()
    assert offset is None and pw.symmetric
    d = blk[..., :2].copy().view(np.float16)[..., 0]
    np.testing.assert_array_equal(scale, d)
    if qtype == "Q4_0":
        qs = blk[..., 2:]
        np.testing.assert_array_equal(codes.reshape(256, -1, 32), np.concatenate([qs & 15, qs >> 4], -1))
    else:
        np.testing.assert_array_equal(codes.reshape(256, -1, 32).astype(np.int16) - 128,
                                      blk[..., 2:].view(np.int8))
    np.testing.assert_array_equal(pw.dequantize(), want)


@pytest.mark.parametrize("qtype", [T.F32, T.Q8_0])
def test_lfm2_file_matches_its_checkpoint(tmp_path, qtype):
    """An LFM2 file as llama.cpp's converter writes it (conv layers by their 0 KV heads, the conv
    taps [hidden, kernel], the final norm token_embd_norm): the checkpoint's logits in float; Q8_0's
    codes moved, computing the file's weights."""
    ckpt = synthetic.make_checkpoint(tmp_path / "ckpt", "lfm2", seed=2, norm_noise=0.1, hidden_size=128,
                                     intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
                                     num_hidden_layers=5, vocab_size=512, tie_word_embeddings=False)
    path = write_gguf(ckpt, tmp_path / f"lfm2-{qtype.name}.gguf", qtype, embd=T.F32)
    ids = [int(t) for t in np.random.default_rng(3).integers(0, 500, 100)]
    if qtype == T.F32:
        ours = llm.load(path, bits=None, act="float", max_context=128, progress=False)
        assert ours.config.mixers == ("conv", "attention", "conv", "attention", "conv")
        ref = llm.load(ckpt, bits=None, act="float", max_context=128, progress=False).logits(ids)
        np.testing.assert_allclose(ours.logits(ids), ref, rtol=0, atol=1e-5 * np.abs(ref).max())
        return
    model = llm.load(path, act="float", max_context=128, progress=False)
    assert model.info["gguf_requantized"] == []
    ref = llm.load(path, bits=None, act="float", max_context=128, progress=False).logits(ids)
    np.testing.assert_allclose(model.logits(ids), ref, rtol=0, atol=1e-4 * np.abs(ref).max())


@pytest.mark.parametrize("qtype", [T.F32, T.Q8_0, T.Q4_0])
def test_qwen35_file_matches_its_checkpoint(tmp_path, qtype):
    """A Qwen3.5 file as llama.cpp's converter writes it (tiled value heads, ssm_a, norms + 1):
    in float, the checkpoint's logits (to float32 rounding); quantized, the codes moved (nothing
    re-rounded) computing the file's weights as gguf dequantizes them. (Against llama.cpp on
    its own converter's files: docs/benchmarks.md.)"""
    ckpt = synthetic.make_checkpoint(tmp_path / "ckpt", "qwen3_5", seed=2, norm_noise=0.1, hidden_size=128,
                                     intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
                                     num_hidden_layers=4, vocab_size=512, linear_value_head_dim=32)
    # (value heads of 32: the tiled order moves whole groups of 32 along ssm_out's k)
    path = write_gguf(ckpt, tmp_path / f"q35-{qtype.name}.gguf", qtype, embd=T.F32)
    ids = [int(t) for t in np.random.default_rng(3).integers(0, 500, 100)]
    if qtype == T.F32:
        ours = llm.load(path, bits=None, act="float", max_context=128, progress=False)
        ref = llm.load(ckpt, bits=None, act="float", max_context=128, progress=False).logits(ids)
        assert ours.config.delta_tiled_heads
        np.testing.assert_allclose(ours.logits(ids), ref, rtol=0, atol=1e-5 * np.abs(ref).max())
        return
    model = llm.load(path, act="float", max_context=128, progress=False)
    assert model.info["gguf_requantized"] == []
    got = model.logits(ids)
    # the file's weights dequantized by gguf (bits=None): the same function, to float32 rounding
    ref = llm.load(path, bits=None, act="float", max_context=128, progress=False).logits(ids)
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-4 * np.abs(ref).max())
    if qtype == T.Q8_0:
        float_ref = llm.load(ckpt, bits=None, act="float", max_context=128, progress=False).logits(ids)
        assert cosines(got, float_ref).mean() > 0.999


def test_other_types_are_requantized_and_listed(checkpoints, tmp_path):
    """Float tensors among quantized ones (llama-quantize keeps a tensor float where its types do
    not fit) are quantized at int8 at least and listed; a fused weight whose tensors the file
    stores in different types is a weight of parts, each moved in its own format."""
    path = write_gguf(checkpoints["qwen2"], tmp_path / "mixed.gguf", T.Q4_0, embd=T.Q8_0,
                      types={"blk.0.attn_v.weight": T.F16, "blk.1.ffn_down.weight": T.F32,
                             "blk.1.attn_k.weight": T.Q8_0, "blk.0.ffn_gate.weight": T.Q4_K})
    model = llm.load(path, act="float", progress=False)
    req = model.info["gguf_requantized"]
    assert sorted(req) == ["blk.0.attn_v.weight (F16 -> int8 group 64)", "blk.1.ffn_down.weight (F32 -> int8 group 64)"], req
    for name in ("blk.0.ffn_up.weight (Q4_0)", "blk.0.ffn_gate.weight (Q4_K)", "blk.1.attn_k.weight (Q8_0)",
                 "blk.1.attn_q.weight (Q4_0)"):
        assert name in model.info["gguf_moved"], model.info["gguf_moved"]
    gu = model.blocks[0].gate_up.weight
    assert gu.format == "parts" and [p.format for p in gu.parts] == ["Q4_K", "affine"]
    ex = _Export(path).linears
    np.testing.assert_array_equal(gu.dequantize()[512:], ex["model.layers.0.mlp.up_proj"].w)
    np.testing.assert_array_equal(gu.dequantize()[:512], ex["model.layers.0.mlp.gate_proj"].w)
    assert [p.bits for p in model.blocks[1].attention.qkv.weight.parts] == [4, 8, 4]
    assert model.info["embedding"] == "Q8_0"
    cos = cosines(model.logits(IDS).astype(np.float64), forward(_Export(path), IDS))
    assert cos.mean() >= 0.98, cos.mean()
    mem = llm.load(path, act="float", disk_embedding=False, progress=False)
    np.testing.assert_allclose(mem.logits(IDS[:8]), model.logits(IDS[:8]), rtol=1e-5, atol=1e-5)


BLOCK_TYPES = ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q5_0", "Q4_1", "Q5_1", "IQ4_NL", "IQ4_XS", "MXFP4"]


@pytest.mark.parametrize("qtype", BLOCK_TYPES)
def test_block_format_files_load_with_nothing_requantized(checkpoints, tmp_path, qtype):
    """Every linear of a block format is moved as the file stores it: nothing re-quantized, the
    file's bits per weight, the file's dequantized weights (gguf's own dequantize) computed with
    float activations to float rounding, and with int8 activations close to them."""
    qt = getattr(T, qtype)
    path = write_gguf(checkpoints["qwen2"], tmp_path / f"{qtype}.gguf", qt)
    model = llm.load(path, progress=False)
    assert model.info["gguf_requantized"] == []
    assert f"blk.1.ffn_down.weight ({qtype})" in model.info["gguf_moved"]
    r = gguf.GGUFReader(str(path))
    for x in r.tensors:
        if x.name == "blk.1.attn_q.weight":
            file_bpw = x.n_bytes * 8 / x.n_elements
    qkv = model.blocks[1].attention.qkv.weight
    assert qkv.format == qtype and qkv.bits_per_weight == pytest.approx(file_bpw)
    ex = _Export(path)
    np.testing.assert_array_equal(qkv.dequantize()[:256], ex.linears["model.layers.1.self_attn.q_proj"].w)
    ref = forward(ex, IDS)
    fl = llm.load(path, act="float", progress=False)
    assert cosines(fl.logits(IDS).astype(np.float64), ref).min() >= 0.9999
    cos = cosines(model.logits(IDS).astype(np.float64), ref)
    assert cos.min() >= 0.995, cos.min()


def test_q4_k_m_mix_loads_as_the_file_stores_it(checkpoints, tmp_path):
    """A Q4_K_M file's mix (Q4_K with Q6_K for v, down and the output; Q5_0 where llama.cpp
    falls back): each tensor in its own format, fused weights as parts; logits as the file's."""
    types = {"blk.0.attn_v.weight": T.Q6_K, "blk.1.ffn_down.weight": T.Q6_K, "output.weight": T.Q6_K,
             "blk.0.attn_k.weight": T.Q5_0}
    path = write_gguf(checkpoints["qwen2"], tmp_path / "qkm.gguf", T.Q4_K, types=types)
    model = llm.load(path, progress=False)
    assert model.info["gguf_requantized"] == []
    assert [p.format for p in model.blocks[0].attention.qkv.weight.parts] == ["Q4_K", "Q5_0", "Q6_K"]
    assert model.blocks[1].attention.qkv.weight.format == "Q4_K"
    assert model.blocks[1].down.weight.format == "Q6_K"
    ref = forward(_Export(path), IDS)
    cos = cosines(model.logits(IDS).astype(np.float64), ref)
    assert cos.min() >= 0.995, cos.min()
    ids = model.tokenizer.encode("def main():")
    assert model.generate_ids(ids, 6) == model.generate_ids(ids, 6)


# Where a block's scale (and its minimum's, for the formats with one) sits in the file's block.
SCALE_AT = {"Q4_0": 0, "Q8_0": 0, "Q5_0": 0, "Q4_1": 0, "Q5_1": 0, "Q2_K": 80, "Q3_K": 108, "Q4_K": 0, "Q5_K": 0,
            "Q6_K": 208, "IQ4_NL": 0, "IQ4_XS": 0, "MXFP4": 0}
MIN_AT = {"Q4_1": 2, "Q5_1": 2, "Q2_K": 82, "Q4_K": 2, "Q5_K": 2}
CORRUPT_SCALES = [(q, where, v) for q in SCALE_AT for where, v in
                  ([("scale", "nan"), ("scale", "inf")] if q != "MXFP4" else [("scale", "nan")])
                  + ([("min", "inf")] if q in MIN_AT else [])]


@pytest.mark.parametrize("qtype,where,value", CORRUPT_SCALES)
def test_block_format_with_a_nan_or_infinite_scale_is_refused(checkpoints, tmp_path, qtype, where, value):
    """A block whose scale or minimum is NaN / Inf (a corrupt file) is refused at load; MXFP4's
    E8M0 scale has no infinity, its NaN is 0xFF."""
    good = write_gguf(checkpoints["qwen2"], tmp_path / "good.gguf", getattr(T, qtype))
    r = gguf.GGUFReader(str(good))
    t = next(x for x in r.tensors if x.name == "blk.1.ffn_up.weight")
    data = bytearray(good.read_bytes())
    fb = blocks.FORMATS[qtype].file_bytes if qtype in blocks.FORMATS else {"Q4_0": 18, "Q8_0": 34}[qtype]
    at = int(t.data_offset) + 3 * fb + (SCALE_AT if where == "scale" else MIN_AT)[qtype]   # the fourth block
    if qtype == "MXFP4":
        data[at] = 0xFF
    else:
        data[at:at + 2] = np.array([np.nan if value == "nan" else np.inf], np.float16).tobytes()
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="NaN or infinite"):
        llm.load(bad, progress=False)


@pytest.mark.parametrize("qtype", list(SCALE_AT))
@pytest.mark.parametrize("case", ["truncated mid-block", "row not whole blocks", "rows of another size"])
def test_block_format_files_of_wrong_sizes_are_refused(checkpoints, tmp_path, qtype, case):
    """Each type's tensors whose bytes do not make whole blocks of the stated shape: the file cut
    inside the last tensor's blocks, a row length that is not a whole number of blocks, a shape
    whose byte count is not the tensor's; a ValueError naming the file, never a crash."""
    good = write_gguf(checkpoints["qwen2"], tmp_path / "good.gguf", getattr(T, qtype))
    data = bytearray(good.read_bytes())
    name = b"blk.1.ffn_down.weight"
    i = data.index(name) + len(name)        # n_dims (u32), dims (u64 x 2), type (u32), offset (u64)
    ne0, ne1 = struct.unpack("<QQ", data[i + 4:i + 20])
    if case == "truncated mid-block":
        data = data[:len(data) - 7]
    elif case == "row not whole blocks":
        data[i + 4:i + 12] = struct.pack("<Q", ne0 - 16)
    else:
        data[i + 4:i + 20] = struct.pack("<QQ", ne0 * 2, ne1)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="bad.gguf"):
        llm.load(bad, progress=False)


def test_pack_blocks_errors():
    w = np.random.default_rng(0).standard_normal((8, 256)).astype(np.float32)
    raw = blocks.quantize(w, "Q4_K")
    with pytest.raises(ValueError, match="unknown block format"):
        qlinear.pack_blocks(raw, "Q3_Z", (8, 256))
    with pytest.raises(ValueError, match="needs file rows of shape"):
        qlinear.pack_blocks(raw[:, :-1], "Q4_K", (8, 256))
    with pytest.raises(ValueError, match="needs file rows of shape"):
        qlinear.pack_blocks(raw, "Q6_K", (8, 256))
    with pytest.raises(TypeError, match="uint8"):
        qlinear.pack_blocks(raw.astype(np.int16), "Q4_K", (8, 256))
    with pytest.raises(ValueError, match="shape must be"):
        qlinear.pack_blocks(raw, "Q4_K", (8, 0))


def test_types_above_4_bits_are_moved_at_bits_4(checkpoints, tmp_path):
    """Q5_0 / Q5_1 weights in a Q4_0 file keep their own format with bits=4 (they used to be
    re-quantized to int8)."""
    path = write_gguf(checkpoints["qwen2"], tmp_path / "q5.gguf", T.Q4_0,
                      types={"blk.0.attn_q.weight": T.Q5_0, "blk.0.attn_k.weight": T.Q5_0,
                             "blk.0.attn_v.weight": T.Q5_0, "blk.1.ffn_down.weight": T.Q5_1})
    model = llm.load(path, bits=4, act="float", progress=False)
    assert model.info["gguf_requantized"] == []
    assert model.blocks[0].attention.qkv.weight.format == "Q5_0" and model.blocks[1].down.weight.format == "Q5_1"
    assert model.blocks[0].gate_up.weight.bits == 4  # the file's Q4_0 codes, moved
    cos = cosines(model.logits(IDS).astype(np.float64), forward(_Export(path), IDS))
    assert cos.min() >= 0.9999, cos.min()


@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q8_0])
def test_quantized_embedding_rows_equal_ggufs_dequantize(checkpoints, tmp_path, qtype):
    """Q4_0 / Q8_0 embedding rows come from one native call: the bits of gguf's own dequantize,
    extreme scales (subnormal, the largest float16, negative zero) and every code included."""
    from qlinear import _core

    rng = np.random.default_rng(3)
    table = encode(rng.standard_normal((40, 96)).astype(np.float32), qtype)   # 3 blocks per row
    nb, block = 3, table.shape[1] // 3
    scales = np.array([2.0 ** -24, 65504.0, -0.0, -3.5], np.float16).view(np.uint8).reshape(4, 2)
    for r in range(4):
        table[r, [b * block for b in range(nb)]] = scales[r, 0]
        table[r, [b * block + 1 for b in range(nb)]] = scales[r, 1]
    table[4, 2:block] = np.arange(block - 2, dtype=np.uint8) * (256 // (block - 2))   # codes across the range
    ids = np.array([0, 1, 2, 3, 4, 39, 4, 17], np.int64)
    got = _core.gguf_rows(table, qtype.name, ids)
    want = quants.dequantize(table[ids], qtype).astype(np.float32)
    assert got.shape == want.shape == (len(ids), 96)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))

    path = write_gguf(checkpoints["qwen2"], tmp_path / "e.gguf", T.Q8_0, embd=qtype)
    model = llm.load(path, act="float", progress=False)
    assert model.info["embedding"] == qtype.name
    reader = gguf.GGUFReader(str(path))
    raw = next(t for t in reader.tensors if t.name == "token_embd.weight")
    rows = [0, 5, SHAPE["vocab_size"] - 1]
    np.testing.assert_array_equal(model.embedding(rows), quants.dequantize(np.asarray(raw.data)[rows], qtype))

    with pytest.raises(ValueError, match="Q4_K"):
        _core.gguf_rows(table, "Q4_K", ids)
    with pytest.raises(TypeError, match="uint8"):
        _core.gguf_rows(table.astype(np.float32), qtype.name, ids)
    with pytest.raises(ValueError, match="whole number"):
        _core.gguf_rows(np.ascontiguousarray(table[:, :-1]), qtype.name, ids)
    with pytest.raises(ValueError, match="outside"):
        _core.gguf_rows(table, qtype.name, np.array([40], np.int64))
    with pytest.raises(ValueError, match="outside"):
        _core.gguf_rows(table, qtype.name, np.array([-1], np.int64))
    with pytest.raises(TypeError, match="int64"):
        _core.gguf_rows(table, qtype.name, ids.astype(np.int32))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model.embedding([SHAPE["vocab_size"]])


@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q8_0])
def test_pack_gguf_rows_equal_packing_the_moved_codes(qtype):
    """GGUF rows moved straight into a packed weight (flash reads of stacked experts), one call
    per row range at any offset (odd, inside a panel): the bytes pack_quantized makes of the codes
    and scales decoded here from the blocks' documented layout (Q4_0: d, then byte j's low nibble
    is value j, its high nibble value j + 16, code q; Q8_0: d, then int8 q, code q + 128)."""
    from qlinear import _core

    rng = np.random.default_rng(7)
    bits, size = (4, 18) if qtype == T.Q4_0 else (8, 34)
    for n, k, cuts in ((1, 32, [0]), (13, 96, [0, 5, 11]), (40, 64, [0, 8, 17, 39]), (9, 288, [0, 1])):
        raw = encode(rng.standard_normal((n, k)).astype(np.float32) * 3, qtype).reshape(n, k // 32, size)
        raw[0, 0, :2] = np.array([65504.0], np.float16).view(np.uint8)   # the largest scale, moved as is
        d = raw[..., :2].copy().view(np.float16)[..., 0]
        q = raw[..., 2:]
        codes = np.concatenate([q & 15, q >> 4], -1) if bits == 4 else q ^ 0x80
        for layout in ("nr8_kr4", "nr8_kr4_s8", "nr8_kr8_s8"):   # x86's, ARM's, ARM i8mm's (int4: nr8_kr8)
            want = _core.pack_quantized(codes.reshape(n, k), d, None, bits, 32, True, layout)
            buf = np.full(want.nbytes, 0, np.uint8)
            dst = _core.PackedWeightHandle(buf, n, k, bits, 32, True, layout)
            flat = raw.reshape(n, -1)
            for a, b in zip(cuts, cuts[1:] + [n]):
                _core.pack_gguf_rows(np.ascontiguousarray(flat[a:b]), qtype.name, dst, a)
            np.testing.assert_array_equal(buf, np.frombuffer(want.buffer, np.uint8))

    def small(bits=bits, group=32, symmetric=True, writeable=True):   # an empty [8, 64] packed weight
        nbytes = (64 // group) * (8 * group * bits // 8 + 16 * (1 if symmetric else 2))   # blocks of one panel
        buf = np.zeros(nbytes, np.uint8)
        buf.flags.writeable = writeable
        return _core.PackedWeightHandle(buf, 8, 64, bits, group, symmetric, "nr8_kr4")

    flat = encode(rng.standard_normal((8, 64)).astype(np.float32), qtype)
    dst = _core.PackedWeightHandle(np.zeros(want.nbytes, np.uint8), 9, 288, bits, 32, True, "nr8_kr4")
    with pytest.raises(ValueError, match="Q4_0 or Q8_0"):
        _core.pack_gguf_rows(flat, "Q4_K", small())
    with pytest.raises(TypeError, match="uint8"):
        _core.pack_gguf_rows(flat.astype(np.int16), qtype.name, small())
    with pytest.raises(ValueError, match="group 32"):
        _core.pack_gguf_rows(flat, qtype.name, small(group=64))
    with pytest.raises(ValueError, match="group 32"):
        _core.pack_gguf_rows(flat, qtype.name, small(symmetric=False))
    with pytest.raises(ValueError, match="group 32"):
        _core.pack_gguf_rows(flat, qtype.name, small(bits=12 - bits))
    with pytest.raises(ValueError, match="blocks of"):
        _core.pack_gguf_rows(flat, qtype.name, dst)   # rows of 64 values into a weight of K 288
    with pytest.raises(ValueError, match="outside the weight's 8"):
        _core.pack_gguf_rows(flat, qtype.name, small(), 1)
    with pytest.raises(ValueError, match="read-only"):
        _core.pack_gguf_rows(flat, qtype.name, small(writeable=False))


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_w4a8_generation_runs(files, arch):
    model = llm.load(files[arch, "Q4_0"], progress=False)
    assert model.info["act"] == "int8"
    out = model.generate_ids(model.tokenizer.encode("def main():"), 8)
    assert 1 <= len(out) <= 8


def _mapped_kb(path) -> int:
    """Resident KB of this process's mappings of ``path`` (/proc/self/smaps)."""
    total, current = 0, None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if head and not head[0].endswith(":"):
                current = head[-1] if len(head) >= 6 else None
            elif head and head[0] == "Rss:" and current == str(path):
                total += int(head[1])
    return total


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="needs Linux /proc/self/smaps")
def test_loading_leaves_no_pages_of_the_file_resident(checkpoints, tmp_path):
    """The codes moved out of the mapped file live in the packed weights: the file's pages are
    released as layers are repacked (else the peak would hold the model twice), and no view of
    the mapping survives in the model. (A quantized embedding keeps the file mapped.)"""
    path = write_gguf(checkpoints["qwen2"], tmp_path / "m.gguf", T.Q4_0, embd=T.Q8_0)
    model = llm.load(path, progress=False)
    file_kb = os.path.getsize(path) // 1024
    assert file_kb > 512
    assert _mapped_kb(path) < file_kb // 4, (_mapped_kb(path), file_kb)  # metadata and the last reads
    model.generate_ids([1, 2, 3], 2)  # embedding rows are read from the mapping as needed
    assert _mapped_kb(path) < file_kb // 4, (_mapped_kb(path), file_kb)
    assert model.info["disk_embedding"]
    assert not llm.load(path, progress=False, disk_embedding=False).info["disk_embedding"]


TEXTS = ["def main():\n    return 0", "<|im_start|>user\nhi<|im_end|>\n", "naïve café — 日本語 ✓",
         "emoji 😀🎉 and \t tabs  and   spaces", "<|endoftext|>x<|im_end|>"]


def test_tokenizer_round_trips(files, checkpoints):
    from tokenizers import Tokenizer as HFTokenizer

    model = llm.load(files["qwen2", "Q4_0"], progress=False)
    orig = HFTokenizer.from_file(str(checkpoints["qwen2"] / "tokenizer.json"))
    tok = model.tokenizer
    for text in TEXTS:
        ids = tok.encode(text)
        assert ids == orig.encode(text, add_special_tokens=False).ids, text
        assert tok.hf.decode(ids, skip_special_tokens=False) == text
    assert tok.hf.token_to_id("<|im_end|>") in tok.stop_ids
    assert "<|im_start|>assistant" in tok.apply_chat_template([{"role": "user", "content": "hi"}])


@pytest.mark.parametrize("pre", ["qwen2", "llama-bpe", "something-else"])
def test_named_pre_tokenizers_round_trip(checkpoints, tmp_path, pre):
    path = write_gguf(checkpoints["qwen2"], tmp_path / "t.gguf", T.Q8_0, pre=pre)
    model = llm.load(path, progress=False)
    for text in TEXTS + ["numbers 1234567 and 12"]:
        assert model.tokenizer.hf.decode(model.tokenizer.encode(text), skip_special_tokens=False) == text
    assert ("unknown" in model.info["tokenizer"]) == (pre == "something-else")
    if pre == "qwen2":  # one digit per pre-token
        ids = model.tokenizer.encode("12345")
        assert len(ids) == 5


def test_cli_generates_from_a_gguf_file(files):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "qlinear.llm", "generate", str(files["llama", "Q4_K"]),
                        "def main", "-n", "4"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "decode speed" in r.stdout + r.stderr


@pytest.mark.parametrize("embd", [T.F16, T.Q8_0])
def test_convert_keeps_the_files_codes(checkpoints, tmp_path, embd):
    path = write_gguf(checkpoints["llama"], tmp_path / "m.gguf", T.Q4_K, embd=embd)
    direct = llm.load(path, progress=False)
    conv = llm.load(llm.convert(path, tmp_path / "conv", progress=False), progress=False)
    a, b = direct.blocks[1].attention.qkv.weight, conv.blocks[1].attention.qkv.weight
    assert a.format == b.format == "Q4_K"
    np.testing.assert_array_equal(a.buffer, b.buffer)
    np.testing.assert_allclose(conv.logits(IDS[:8]), direct.logits(IDS[:8]), rtol=1e-4, atol=1e-4)
    assert conv.tokenizer.encode(TEXTS[1]) == direct.tokenizer.encode(TEXTS[1])
    assert conv.tokenizer.stop_ids == direct.tokenizer.stop_ids


def test_sentencepiece_tokenizer_encodes_like_sentencepiece(checkpoints, tmp_path):
    spm_lib = pytest.importorskip("sentencepiece")
    text = "\n".join(synthetic.local_text(200_000)) + "\n" + "\n".join(TEXTS) * 20
    (tmp_path / "corpus.txt").write_text(text, encoding="utf-8")
    spm_lib.SentencePieceTrainer.train(
        input=str(tmp_path / "corpus.txt"), model_prefix=str(tmp_path / "sp"), vocab_size=1024,
        model_type="bpe", byte_fallback=True, normalization_rule_name="identity",
        remove_extra_whitespaces=False, split_digits=True, character_coverage=0.9995, minloglevel=2)
    sp = spm_lib.SentencePieceProcessor(model_file=str(tmp_path / "sp.model"))
    model = llm.load(write_gguf(checkpoints["llama"], tmp_path / "spm.gguf", T.Q8_0, spm=sp), progress=False)
    assert "SentencePiece" in model.info["tokenizer"]
    for t in TEXTS[:1] + TEXTS[2:4] + ["  two spaces, a tab\t and\nnew lines", "ǅ rare ☃ bytes 𝄞"]:
        assert model.tokenizer.encode(t) == sp.encode(t), t
        assert model.tokenizer.decode(model.tokenizer.encode(t)) == t


# -- hostile files -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def good(files):
    return files["qwen2", "Q4_0"].read_bytes()


def _tensor_info_offset(data, name):
    i = data.index(name.encode())
    return i - 8  # the uint64 name length


def _mutations(good):
    out = {"truncated header": good[:10], "truncated data": good[: len(good) - 1000],
           "wrong magic": b"GGUX" + good[4:], "version 1": good[:4] + struct.pack("<I", 1) + good[8:],
           "version 99": good[:4] + struct.pack("<I", 99) + good[8:],
           "absurd counts": good[:8] + struct.pack("<QQ", 1 << 60, 1 << 60) + good[24:]}
    name = b"blk.1.ffn_down.weight"
    i = good.index(name) + len(name)        # n_dims (u32), dims (u64 x 2), type (u32), offset (u64)
    b = bytearray(good)
    b[i + 24:i + 32] = struct.pack("<Q", 1 << 50)
    out["offset outside"] = bytes(b)
    b = bytearray(good)
    b[i + 4:i + 20] = struct.pack("<QQ", 1 << 62, 1 << 62)
    out["overflowing shape"] = bytes(b)
    b = bytearray(good)
    b[i + 20:i + 24] = struct.pack("<I", 250)
    out["unknown type"] = bytes(b)
    b = bytearray(good)
    b[i + 4:i + 20] = struct.pack("<QQ", 256, 512)   # the same size, transposed
    out["wrong shape"] = bytes(b)
    k = good.index(b"tokenizer.ggml.tokens") + len(b"tokenizer.ggml.tokens")   # type, item type, count
    b = bytearray(good)
    b[k + 8:k + 16] = struct.pack("<Q", 1 << 61)
    out["absurd array length"] = bytes(b)
    b = bytearray(good)
    b[i - 6:i] = b"xx_dow"                  # renames the tensor: ffn_down goes missing
    out["missing tensor"] = bytes(b)
    k = good.index(b"qwen2.block_count") + len(b"qwen2.block_count")
    b = bytearray(good)
    b[k:k + 4] = struct.pack("<I", 6)       # the value's type: float32 instead of uint32
    out["bad metadata type"] = bytes(b)
    b = bytearray(good)
    b[k:k + 4] = struct.pack("<I", 77)
    out["unknown metadata type"] = bytes(b)
    return out


@pytest.mark.parametrize("case", ["truncated header", "truncated data", "wrong magic", "version 1", "version 99",
                                  "absurd counts", "offset outside", "overflowing shape", "unknown type",
                                  "missing tensor", "bad metadata type", "unknown metadata type",
                                  "wrong shape", "absurd array length"])
def test_hostile_files_raise_value_error(good, tmp_path, case):
    import tracemalloc

    path = tmp_path / "bad.gguf"
    path.write_bytes(_mutations(good)[case])
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match="bad.gguf"):
            llm.load(path, progress=False)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, peak   # no allocation sized by the file's claims (the file is ~1.4 MB)


# -- llama.cpp as a peer (qlinear-llm bench FILE.gguf --vs llamacpp) ------------------------------
# llama.cpp itself is built by bench/llamacpp_vs.py, not here: a stand-in llama-bench checks the
# plumbing (its JSON, the CPU path from its log, its peak RSS read from the kernel).
_FAKE_LLAMA_BENCH = '''#!{python}
import json, sys
a = sys.argv
p, n, t = (int(a[a.index(f) + 1]) for f in ("-p", "-n", "-t"))
ballast = bytearray(80 << 20)  # resident: every page written
for i in range(0, len(ballast), 4096):
    ballast[i] = 1
sys.stderr.write("load_tensors:   CPU_REPACK model buffer size = 1.00 MiB\\n"
                 "repack: repack tensor blk.0.attn_q.weight with q4_0_8x8\\n"
                 "repack: repack tensor blk.0.ffn_up.weight with q4_0_8x8\\n")
row = {{"backends": "CPU", "model_type": "qwen2 Q4_0", "build_commit": "x", "n_threads": t}}
print(json.dumps([dict(row, n_prompt=p, n_gen=0, avg_ts=100.0 * t), dict(row, n_prompt=0, n_gen=n, avg_ts=50.0 * t)]))
'''


def test_bench_vs_llamacpp_reports_both_engines(files, tmp_path):
    import subprocess
    import sys

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "llama-bench"
    tool.write_text(_FAKE_LLAMA_BENCH.format(python=sys.executable))
    tool.chmod(0o755)
    r = subprocess.run([sys.executable, "-m", "qlinear.llm", "bench", str(files["qwen2", "Q4_0"]), "--vs", "llamacpp",
                        "--llamacpp", str(bin_dir), "--prompt-tokens", "8", "--decode-tokens", "3", "--json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert [row["threads"] for row in rows] == [1, 2]       # threads 1 and 2 by default
    for row in rows:
        peer, t = row["llamacpp"], row["threads"]
        assert (peer["prefill_tok_s"], peer["decode_tok_s"]) == (100.0 * t, 50.0 * t)
        assert peer["cpu_path"] == "CPU; repacked q4_0_8x8 (2 tensors)"
        assert 80 <= peer["peak_rss_mb"] < 400, peer["peak_rss_mb"]   # the child's own peak
        assert row["decode_tokens"] == 3 and row["bits"] == "4"
    text = subprocess.run([sys.executable, "-m", "qlinear.llm", "bench", str(files["qwen2", "Q4_0"]), "--vs",
                           "llamacpp", "--llamacpp", str(bin_dir), "--prompt-tokens", "8", "--decode-tokens", "3",
                           "--threads", "1"], capture_output=True, text=True, timeout=300)
    assert text.returncode == 0, text.stderr
    assert "ratio qlinear/llama.cpp: prefill" in text.stdout and "threads 2" not in text.stdout


def test_bench_vs_llamacpp_errors(files, checkpoints, tmp_path):
    import subprocess
    import sys

    from qlinear.llm.peers import llamacpp

    with pytest.raises(ValueError, match="llama-bench was not found in .*nowhere"):
        llamacpp.find_tool("llama-bench", str(tmp_path / "nowhere"))
    run = lambda *a: subprocess.run([sys.executable, "-m", "qlinear.llm", "bench", *a, "--prompt-tokens", "4",  # noqa: E731
                                     "--decode-tokens", "1", "--threads", "1"], capture_output=True, text=True, timeout=300)
    r = run(str(files["qwen2", "Q4_0"]), "--vs", "llamacpp", "--llamacpp", str(tmp_path / "nowhere"))
    assert r.returncode != 0 and "llama-bench was not found" in r.stderr and "Traceback" not in r.stderr
    r = run(str(checkpoints["qwen2"]), "--vs", "llamacpp", "--llamacpp", str(tmp_path))
    assert r.returncode != 0 and "--vs llamacpp needs a GGUF file" in r.stderr


def test_gemma3_file_matches_its_checkpoint(tmp_path):
    """Gemma 3 text (four norms a block stored with their 1 added, q / k norms, GeGLU, sliding
    layers with their own RoPE base, every 3rd layer global as the file's pattern says): the
    checkpoint's logits, through the ring caches past the window. llama.cpp scales queries by
    head_dim ** -0.5 (not by query_pre_attn_scalar), so the checkpoint is made with the two equal."""
    ckpt = synthetic.make_checkpoint(tmp_path / "g3", arch="gemma3", seed=3, norm_noise=0.1,
                                     **{**SHAPE, "num_hidden_layers": 4}, head_dim=64, query_pre_attn_scalar=64,
                                     sliding_window=8, layer_types=["sliding_attention", "sliding_attention",
                                                                    "full_attention", "sliding_attention"])
    path = write_gguf(ckpt, tmp_path / "g3.gguf", T.F32, embd=T.F32)
    ids = list(range(5, 45))
    a = llm.load(path, bits=None, act="float", max_context=64, progress=False)
    assert a.config.arch == "gemma3_text" and a.config.layer_types == ("sliding", "sliding", "full", "sliding")
    b = llm.load(ckpt, bits=None, act="float", max_context=64, progress=False)
    ref = b.logits(ids)
    np.testing.assert_allclose(a.logits(ids), ref, rtol=0, atol=1e-5 * np.abs(ref).max())
    q8 = llm.load(write_gguf(ckpt, tmp_path / "g3-q8.gguf", T.Q8_0), bits=8, progress=False, max_context=64)
    assert q8.blocks[0].gate_up.weight.bits == 8 and cosines(q8.logits(ids), ref).mean() >= 0.999


def test_gemma2_file_matches_its_checkpoint(tmp_path):
    """Gemma 2 (four norms a block stored with their 1 added, GeGLU, soft-capped attention scores
    and logits, every 2nd layer sliding): the checkpoint's logits past the window."""
    ckpt = synthetic.make_checkpoint(tmp_path / "g2", arch="gemma2", seed=3, norm_noise=0.1,
                                     **{**SHAPE, "num_hidden_layers": 4}, head_dim=64, query_pre_attn_scalar=64,
                                     sliding_window=8, attn_logit_softcapping=5.0, final_logit_softcapping=3.0)
    path = write_gguf(ckpt, tmp_path / "g2.gguf", T.F32, embd=T.F32)
    ids = list(range(5, 45))
    a = llm.load(path, bits=None, act="float", max_context=64, progress=False)
    assert a.config.arch == "gemma2" and a.config.layer_types == ("sliding", "full") * 2
    assert (a.config.attn_softcap, a.config.final_softcap) == (5.0, 3.0)
    ref = llm.load(ckpt, bits=None, act="float", max_context=64, progress=False).logits(ids)
    np.testing.assert_allclose(a.logits(ids), ref, rtol=0, atol=1e-5 * np.abs(ref).max())


def test_qwen3_file_matches_its_checkpoint(tmp_path):
    """Qwen3 (per-head q / k norms): a GGUF file of F32 tensors gives the checkpoint's logits."""
    ckpt = synthetic.make_checkpoint(tmp_path / "q3", arch="qwen3", seed=3, norm_noise=0.1, **SHAPE)
    path = write_gguf(ckpt, tmp_path / "q3.gguf", T.F32, embd=T.F32)
    ids = list(range(5, 45))
    a = llm.load(path, bits=None, act="float", max_context=64, progress=False)
    assert a.config.qk_norm and a.config.arch == "qwen3"
    b = llm.load(ckpt, bits=None, act="float", max_context=64, progress=False)
    ref = b.logits(ids)
    np.testing.assert_allclose(a.logits(ids), ref, rtol=0, atol=1e-5 * np.abs(ref).max())


def _phi3_checkpoint(out, **overrides):
    return synthetic.make_checkpoint(out, arch="phi3", seed=3, norm_noise=0.1,
                                     **{**SHAPE, "num_hidden_layers": 3}, **overrides)


@pytest.mark.parametrize("longrope", [False, True])
def test_phi3_file_matches_its_checkpoint(tmp_path, longrope):
    """Phi-3 (q / k / v and gate / up fused in the file, as llama.cpp's converter writes them;
    LongRoPE's factors as tensors, its attention factor as metadata): the checkpoint's logits,
    with the long factors when the context passes the pretraining length. Quantized files move
    the fused tensors' codes."""
    extra = {}
    if longrope:
        half = SHAPE["hidden_size"] // SHAPE["num_attention_heads"] // 2
        rng = np.random.default_rng(0)
        extra = {"max_position_embeddings": 256, "original_max_position_embeddings": 32,
                 "rope_scaling": {"type": "longrope", "short_factor": (1 + rng.random(half)).tolist(),
                                  "long_factor": (1 + 4 * rng.random(half)).tolist()}}
    ckpt = _phi3_checkpoint(tmp_path / "phi3", **extra)
    path = write_gguf(ckpt, tmp_path / "phi3.gguf", T.F32, embd=T.F32)
    ids = list(range(5, 45))
    for context in (32, 128) if longrope else (64,):
        a = llm.load(path, bits=None, act="float", max_context=context, progress=False)
        assert a.config.arch == "phi3" and (a.config.rope_scaling is not None) == longrope
        ref = llm.load(ckpt, bits=None, act="float", max_context=context, progress=False).logits(ids[:context])
        np.testing.assert_allclose(a.logits(ids[:context]), ref, rtol=0, atol=1e-5 * np.abs(ref).max())
    q4 = llm.load(write_gguf(ckpt, tmp_path / "phi3-q4.gguf", T.Q4_0), progress=False, max_context=64)
    assert any("attn_qkv" in m for m in q4.info["gguf_moved"]) and any("ffn_up" in m for m in q4.info["gguf_moved"])
    assert cosines(q4.logits(ids), ref).mean() >= 0.96


def test_phi3_file_runs_without_its_sliding_window(tmp_path):
    """llama.cpp does not apply Phi-3's sliding window (it warns and attends over the whole
    context): a file is read the same way, so its logits past the window are those of the same
    weights without one."""
    windowed = _phi3_checkpoint(tmp_path / "a", sliding_window=8)
    plain = _phi3_checkpoint(tmp_path / "b")  # the same seed: the same weights
    a = llm.load(write_gguf(windowed, tmp_path / "phi3.gguf", T.F32, embd=T.F32), bits=None, act="float",
                 max_context=64, progress=False)
    assert a.config.sliding_window is None
    ids = list(range(5, 45))
    ref = llm.load(plain, bits=None, act="float", max_context=64, progress=False).logits(ids)
    np.testing.assert_allclose(a.logits(ids), ref, rtol=0, atol=1e-5 * np.abs(ref).max())
    with_window = llm.load(windowed, bits=None, act="float", max_context=64, progress=False)
    assert with_window.config.sliding_window == 8 and not np.allclose(with_window.logits(ids), ref, atol=1e-3)


def test_phi3_files_it_cannot_run_are_refused(tmp_path):
    """RoPE on part of each head (Phi-4-mini) and half of LongRoPE's factors: clear errors."""
    ckpt = _phi3_checkpoint(tmp_path / "phi3")
    path = write_gguf(ckpt, tmp_path / "p.gguf", T.F32, embd=T.F32)
    data = bytearray(path.read_bytes())
    key = b"phi3.rope.dimension_count"
    at = data.index(key) + len(key) + 4  # the key, its value type (uint32), the value
    struct.pack_into("<I", data, at, struct.unpack_from("<I", data, at)[0] // 2)
    partial = tmp_path / "partial.gguf"
    partial.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="partial_rotary_factor"):
        llm.load(partial, progress=False)
    half = tmp_path / "half.gguf"
    long_ckpt = _phi3_checkpoint(tmp_path / "long", max_position_embeddings=256, original_max_position_embeddings=32,
                                 rope_scaling={"type": "longrope", "short_factor": [1.0] * 32, "long_factor": [2.0] * 32})
    data = write_gguf(long_ckpt, tmp_path / "l.gguf", T.F32, embd=T.F32).read_bytes()
    half.write_bytes(data.replace(b"rope_factors_short.weight", b"rope_factors_shorx.weight"))
    with pytest.raises(ValueError, match="LongRoPE needs both"):
        llm.load(half, progress=False)


@pytest.mark.parametrize("arch", ["qwen3_moe", "olmoe", "mixtral"])
def test_moe_file_matches_its_checkpoint(tmp_path, arch):
    """Routed experts in llama.cpp's layout (qwen3moe, olmoe: the router ``ffn_gate_inp``, the
    experts stacked in ``ffn_{gate,up,down}_exps``): a file of F32 tensors gives the checkpoint's
    logits; Q4_0 / Q8_0 and block-format experts (Q4_K with Q6_K downs, MXFP4, Q2_K) are moved,
    not re-rounded: the packed model computes what the file's dequantized weights do."""
    extra = {"clip_qkv": 0.3} if arch == "olmoe" else {}
    experts = {"num_local_experts" if arch == "mixtral" else "num_experts": 8}
    ckpt = synthetic.make_checkpoint(tmp_path / arch, arch=arch, seed=3, norm_noise=0.1, num_experts_per_tok=2,
                                     **experts, **SHAPE, **extra)
    ids = list(range(5, 45))
    ref = llm.load(ckpt, bits=None, act="float", max_context=64, progress=False).logits(ids)
    a = llm.load(write_gguf(ckpt, tmp_path / "f32.gguf", T.F32, embd=T.F32), bits=None, act="float",
                 max_context=64, progress=False)
    assert (a.config.arch, a.config.num_experts, a.config.experts_per_token) == (arch, 8, 2)
    assert a.config.norm_topk_prob == (arch != "olmoe") and a.config.clip_qkv == pytest.approx(extra.get("clip_qkv"))
    np.testing.assert_allclose(a.logits(ids), ref, rtol=0, atol=1e-5 * np.abs(ref).max())
    for qtype, bits in ((T.Q4_0, 4), (T.Q8_0, 8)):
        path = write_gguf(ckpt, tmp_path / f"{qtype.name}.gguf", qtype, embd=T.F32)
        floats = llm.load(path, bits=None, act="float", max_context=64, progress=False).logits(ids)
        packed = llm.load(path, bits=bits, act="float", max_context=64, progress=False)
        moved = packed.info["gguf_moved"]
        assert f"blk.1.ffn_down_exps.weight ({qtype.name})" in moved and not packed.info["gguf_requantized"]
        assert packed.blocks[1].experts[7][0].weight.bits == bits
        np.testing.assert_allclose(packed.logits(ids), floats, rtol=0, atol=2e-4 * np.abs(floats).max())
        assert len(packed.generate_ids(packed.tokenizer.encode("def main():"), 4)) == 4
    for qtype, types in ((T.Q4_K, {"blk.0.ffn_down_exps.weight": T.Q6_K}), (T.MXFP4, {}), (T.Q2_K, {})):
        path = write_gguf(ckpt, tmp_path / f"{qtype.name}.gguf", qtype, embd=T.F32, types=types)
        floats = llm.load(path, bits=None, act="float", max_context=64, progress=False).logits(ids)
        packed = llm.load(path, act="float", max_context=64, progress=False)
        assert not packed.info["gguf_requantized"]
        assert f"blk.1.ffn_down_exps.weight ({qtype.name})" in packed.info["gguf_moved"]
        assert packed.blocks[1].experts[7][0].weight.format == qtype.name
        if types:
            assert packed.blocks[0].experts[3][1].weight.format == "Q6_K"
        np.testing.assert_allclose(packed.logits(ids), floats, rtol=0, atol=2e-4 * np.abs(floats).max())
        # int8 activations: close, but where the router's top-2 is a near-tie the quantized input
        # may pick another expert, so a position or two move further
        cos = cosines(llm.load(path, max_context=64, progress=False).logits(ids).astype(np.float64),
                      floats.astype(np.float64))
        assert np.median(cos) >= 0.999 and cos.min() >= 0.95, (qtype.name, np.sort(cos)[:4])


def test_moe_file_with_a_wrong_expert_count_is_refused(tmp_path):
    ckpt = synthetic.make_checkpoint(tmp_path / "m", arch="qwen3_moe", seed=1, num_experts=4,
                                     num_experts_per_tok=2, **SHAPE)
    path = write_gguf(ckpt, tmp_path / "m.gguf", T.Q8_0)
    data = bytearray(path.read_bytes())
    key = b"qwen3moe.expert_count"
    at = data.index(key) + len(key) + 4  # the value after its type
    data[at:at + 4] = struct.pack("<I", 6)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="has 4 experts; the metadata says 6"):
        llm.load(bad, progress=False)
    data[at:at + 4] = struct.pack("<I", 4)
    key = b"qwen3moe.expert_used_count"
    at = data.index(key) + len(key) + 4
    data[at:at + 4] = struct.pack("<I", 5)
    bad.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="exceeds num_experts"):
        llm.load(bad, progress=False)
