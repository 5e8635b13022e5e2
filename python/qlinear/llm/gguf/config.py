"""A GGUF file's metadata as a model configuration, with llama.cpp's conventions where its
converter or runtime departs from the Hugging Face config (Gemma's norms and query scale, Phi-3's
sliding window, which llama.cpp does not apply)."""

from __future__ import annotations

import math

from ..config import ModelConfig
from .file import GGUFFile

ARCHS = ("qwen2", "llama", "qwen3", "gemma2", "gemma3", "phi3", "qwen3moe", "olmoe", "qwen35", "qwen35moe", "lfm2",
         "gpt-oss", "gemma4")
# llama.cpp's architecture names where they differ from transformers' model_type
_MODEL_TYPES = {"qwen3moe": "qwen3_moe", "qwen35": "qwen3_5_text", "qwen35moe": "qwen3_5_moe_text",
                "gpt-oss": "gpt_oss", "gemma4": "gemma4_text"}


def read_config(f: GGUFFile) -> ModelConfig:
    arch = f.meta("general.architecture", str, required=True)
    if arch not in ARCHS:
        raise f.error(f"architecture {arch!r} is not supported ({', '.join(ARCHS)})")
    a = arch + "."
    hidden, heads = f.count(a + "embedding_length"), f.count(a + "attention.head_count")
    embd = f.tensors.get("token_embd.weight")
    if embd is None or len(embd.shape) != 2 or int(embd.shape[0]) != hidden:
        raise f.error("tensor 'token_embd.weight' is missing or not [vocab, hidden]")
    g4 = arch == "gemma4"  # (its widths and KV heads per layer: gguf.gemma4)
    hf = {"model_type": _MODEL_TYPES.get(arch, arch), "hidden_size": hidden, "num_attention_heads": heads,
          # (a file of routed experts only may leave the dense width out: Qwen3.5-MoE)
          "intermediate_size": None if g4 else f.count(a + "feed_forward_length",
                                                       f.meta(a + "expert_feed_forward_length", int)),
          "num_hidden_layers": f.count(a + "block_count"),
          "num_key_value_heads": None if g4 else _kv_heads(f, a, heads),
          "head_dim": f.count(a + "attention.key_length", hidden // heads),
          "vocab_size": int(embd.shape[1]),
          "rms_norm_eps": f.meta(a + "attention.layer_norm_rms_epsilon", float, 1e-6),
          "rope_theta": f.meta(a + "rope.freq_base", float, 10000.0),
          "max_position_embeddings": f.count(a + "context_length", 4096),
          "tie_word_embeddings": "output.weight" not in f.tensors,
          "attention_bias": "blk.0.attn_q.bias" in f.tensors,
          "bos_token_id": f.meta("tokenizer.ggml.bos_token_id", int),
          "eos_token_id": f.meta("tokenizer.ggml.eos_token_id", int)}
    if arch in _GEMMA:
        hf.update(_gemma_config(f, hf, arch))
    if arch == "phi3":
        hf.update(_phi3_config(f, hf))
    if arch in ("qwen35", "qwen35moe"):
        hf.update(_qwen35_config(f, hf, arch))
    if arch == "lfm2":
        hf.update(_lfm2_config(f, hf))
    if arch in ("qwen3moe", "olmoe", "qwen35moe", "gpt-oss") or (arch == "llama" and f.meta(a + "expert_count", int)):
        hf.update(_experts_config(f, hf, arch))
    if arch == "gpt-oss":
        hf.update(_gpt_oss_config(f, hf))
    if g4:
        from . import gemma4  # noqa: PLC0415

        hf.update(gemma4.config(f, hf))
    kind = f.meta(a + "rope.scaling.type", str, "none")
    if kind == "linear":
        hf["rope_scaling"] = {"rope_type": "linear", "factor": f.meta(a + "rope.scaling.factor", float, 1.0)}
    elif kind == "yarn":
        hf["rope_scaling"] = _yarn(f, a)
    elif kind != "none":
        raise f.error(f"rope scaling {kind!r} is not supported (none, linear, yarn)")
    return ModelConfig.from_hf(hf, str(f.path))


# llama.cpp's Gemma conventions: (model_type, default sliding pattern, layers of the 27B model)
_GEMMA = {"gemma2": ("gemma2", 2, 46), "gemma3": ("gemma3_text", 6, 62)}


def _gemma_config(f: GGUFFile, hf: dict, arch: str) -> dict:
    """Gemma 2 / Gemma 3 (text) as llama.cpp runs them: norms stored with their 1 added by its
    converter, sliding layers by the file's pattern (else every 2nd / 6th layer global), queries
    scaled by head_dim ** -0.5 (by (hidden / heads) ** -0.5 for the 27B models), not by
    config.json's query_pre_attn_scalar; Gemma 2's soft-caps (llama.cpp's defaults 50 / 30 when
    absent), Gemma 3's sliding layers with their own RoPE base."""
    a, n = arch + ".", hf["num_hidden_layers"]
    model_type, every, layers_27b = _GEMMA[arch]
    out = {"model_type": model_type, "hidden_activation": "gelu_pytorch_tanh",
           "query_pre_attn_scalar": hf["hidden_size"] // hf["num_attention_heads"] if n == layers_27b else hf["head_dim"],
           "final_logit_softcapping": f.meta(a + "final_logit_softcapping", float, 30.0 if arch == "gemma2" else None)}
    if arch == "gemma2":
        out["attn_logit_softcapping"] = f.meta(a + "attn_logit_softcapping", float, 50.0)
        if f.meta(a + "rope.freq_base_swa", float, hf["rope_theta"]) != hf["rope_theta"]:
            raise f.error("a Gemma 2 file with a sliding layers' RoPE base of their own is not supported")
    else:
        out["rope_local_base_freq"] = f.meta(a + "rope.freq_base_swa", float, 10000.0)
    window = f.meta(a + "attention.sliding_window", int, 4096 if arch == "gemma2" else 0)
    if window:
        pattern = f.meta(a + "attention.sliding_window_pattern", (int, list), every)
        sliding = ([bool(x) for x in pattern] if isinstance(pattern, list)
                   else [i % pattern < pattern - 1 for i in range(n)])
        if len(sliding) != n:
            raise f.error(f"metadata {a}attention.sliding_window_pattern has {len(sliding)} entries for {n} layers")
        out.update(sliding_window=window,
                   layer_types=["sliding_attention" if s else "full_attention" for s in sliding])
    return out




def _experts_config(f: GGUFFile, hf: dict, arch: str) -> dict:
    """Routed experts as llama.cpp runs them: Qwen3-MoE renormalizes the top-k weights to sum 1,
    OLMoE does not (unless the file says otherwise: ``expert_weights_norm``); OLMoE's experts
    are ``feed_forward_length`` wide, its head size hidden / heads, q, k and v clamped to
    ``attention.clamp_kqv``. A ``llama`` file with experts is Mixtral (llama.cpp's converter
    writes it so): experts ``feed_forward_length`` wide, their weights always renormalized."""
    a = arch + "."
    out = {"num_experts": f.count(a + "expert_count"), "num_experts_per_tok": f.count(a + "expert_used_count"),
           "norm_topk_prob": f.meta(a + "expert_weights_norm", bool, arch == "qwen3moe")}
    if arch == "llama":
        out = {"model_type": "mixtral", "num_local_experts": out["num_experts"],
               "num_experts_per_tok": out["num_experts_per_tok"]}
    elif arch in ("qwen3moe", "qwen35moe"):
        out["moe_intermediate_size"] = f.count(a + "expert_feed_forward_length")
        if arch == "qwen35moe":
            out["shared_expert_intermediate_size"] = f.count(a + "expert_shared_feed_forward_length")
    else:
        out["clip_qkv"] = f.meta(a + "attention.clamp_kqv", float)
    for name in ("ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"):
        t = f.tensors.get(f"blk.0.{name}.weight")
        if t is None:
            raise f.error(f"tensor 'blk.0.{name}.weight' is missing (a {arch} file has routed experts)")
        count = f.count(a + "expert_count")
        if int(t.shape[-1]) != count:
            raise f.error(f"tensor 'blk.0.{name}.weight' has {int(t.shape[-1])} experts; the metadata says "
                          f"{count} ({a}expert_count)")
    return out


def _yarn(f: GGUFFile, a: str) -> dict:
    """YaRN as ggml runs it: the ramp's ends rounded outwards (floor / ceil: transformers'
    ``truncate``), cos / sin scaled by yarn_attn_factor x (1 + 0.1 ln factor)."""
    factor = f.meta(a + "rope.scaling.factor", float, required=True)
    if f.meta(a + "rope.scaling.yarn_ext_factor", float, 1.0) != 1.0:
        raise f.error("yarn with an extrapolation factor other than 1 is not supported")
    mscale = 1.0 + 0.1 * math.log(factor) if factor > 1 else 1.0
    return {"rope_type": "yarn", "factor": factor, "truncate": True,
            "original_max_position_embeddings": f.count(a + "rope.scaling.original_context_length"),
            "beta_fast": f.meta(a + "rope.scaling.yarn_beta_fast", float, 32.0),
            "beta_slow": f.meta(a + "rope.scaling.yarn_beta_slow", float, 1.0),
            "attention_factor": f.meta(a + "rope.scaling.yarn_attn_factor", float, 1.0) * mscale}


def _gpt_oss_config(f: GGUFFile, hf: dict) -> dict:
    """GPT-OSS as llama.cpp runs it: experts ``expert_feed_forward_length`` wide, sliding layers by
    the file's pattern (else the even ones), the clamped SwiGLU at llama.cpp's fixed 7 / 1.702."""
    a, n = "gpt-oss.", hf["num_hidden_layers"]
    pattern = f.meta(a + "attention.sliding_window_pattern", (int, list), 2)
    sliding = [bool(x) for x in pattern] if isinstance(pattern, list) else [i % pattern < pattern - 1 for i in range(n)]
    if len(sliding) != n:
        raise f.error(f"metadata {a}attention.sliding_window_pattern has {len(sliding)} entries for {n} layers")
    return {"num_local_experts": hf.pop("num_experts"), "intermediate_size": f.count(a + "expert_feed_forward_length"),
            "sliding_window": f.count(a + "attention.sliding_window"), "swiglu_limit": 7.0, "swiglu_alpha": 1.702,
            "layer_types": ["sliding_attention" if s else "full_attention" for s in sliding]}


def _kv_heads(f: GGUFFile, a: str, heads: int) -> int:
    """KV heads: a count, or per layer (LFM2: 0 for its conv layers) the attention layers' one."""
    v = f.meta(a + "attention.head_count_kv", (int, list), heads)
    if isinstance(v, list):
        counts = {int(x) for x in v if int(x) > 0}
        if len(counts) != 1:
            raise f.error(f"metadata {a}attention.head_count_kv lists {sorted(counts)}: one KV head count expected")
        return counts.pop()
    return f.count(a + "attention.head_count_kv", heads)


def _lfm2_config(f: GGUFFile, hf: dict) -> dict:
    """LFM2 as llama.cpp's converter writes it: the conv layers are those of 0 KV heads
    (``attention.head_count_kv`` per layer), their kernel ``shortconv.l_cache``, the MLP's width
    already adjusted (``feed_forward_length``), the final norm ``token_embd_norm``."""
    n = hf["num_hidden_layers"]
    kv = f.meta("lfm2.attention.head_count_kv", (int, list))
    if not isinstance(kv, list) or len(kv) != n:
        raise f.error(f"metadata lfm2.attention.head_count_kv must list {n} layers' KV heads")
    return {"layer_types": ["full_attention" if int(x) > 0 else "conv" for x in kv],
            "conv_L_cache": f.count("lfm2.shortconv.l_cache"), "norm_eps": hf["rms_norm_eps"],
            "block_auto_adjust_ff_dim": False}


def _qwen35_config(f: GGUFFile, hf: dict, arch: str) -> dict:
    """Qwen3.5 as llama.cpp's converter writes it: the recurrent layers listed
    (``attention.recurrent_layers``), the Gated DeltaNet's geometry as ``ssm.*`` (state_size: the
    key head size, group_count: key heads, time_step_rank: value heads, inner_size: all value
    heads' width), the rotary part of each head as ``rope.dimension_count``, value heads "tiled"
    (value head j reads key head j % key heads), norms stored with their 1 added."""
    a, n = arch + ".", hf["num_hidden_layers"]
    recurrent = f.meta(a + "attention.recurrent_layers", list)
    if recurrent is None:
        every = f.count(a + "full_attention_interval", 4)
        recurrent = [(i + 1) % every != 0 for i in range(n)]
    if len(recurrent) != n:
        raise f.error(f"metadata {a}attention.recurrent_layers has {len(recurrent)} entries for {n} layers")
    v_heads, inner = f.count(a + "ssm.time_step_rank"), f.count(a + "ssm.inner_size")
    if inner % v_heads:
        raise f.error(f"metadata {a}ssm.inner_size {inner} is not a multiple of {v_heads} value heads")
    head_dim = hf["head_dim"]
    return {"layer_types": ["linear_attention" if r else "full_attention" for r in recurrent],
            "linear_conv_kernel_dim": f.count(a + "ssm.conv_kernel"),
            "linear_key_head_dim": f.count(a + "ssm.state_size"),
            "linear_num_key_heads": f.count(a + "ssm.group_count"),
            "linear_num_value_heads": v_heads, "linear_value_head_dim": inner // v_heads,
            "partial_rotary_factor": f.count(a + "rope.dimension_count", head_dim) / head_dim,
            "delta_tiled_heads": True}


def _phi3_config(f: GGUFFile, hf: dict) -> dict:
    """Phi-3 as llama.cpp runs it: no sliding window (llama.cpp ignores the file's); LongRoPE
    when the file holds its factor tensors, cos / sin scaled by the file's attention factor (1
    when absent), the long factors past the pretraining length."""
    hd = hf["head_dim"]
    out = {"model_type": "phi3", "hidden_act": "silu"}
    rotary = f.count("phi3.rope.dimension_count", hd)
    if rotary != hd:
        out["partial_rotary_factor"] = rotary / hd  # refused by the architecture, with its name
    names = ("rope_factors_long.weight", "rope_factors_short.weight")
    present = [n for n in names if n in f.tensors]
    if present:
        if len(present) == 1:
            raise f.error(f"LongRoPE needs both {names[0]!r} and {names[1]!r}; the file has only {present[0]!r}")
        long_, short = ([float(x) for x in f.dequantize(f.tensor(n, (hd // 2,)))] for n in names)
        out["original_max_position_embeddings"] = f.count("phi3.rope.scaling.original_context_length",
                                                          hf["max_position_embeddings"])
        out["rope_scaling"] = {"rope_type": "longrope", "long_factor": long_, "short_factor": short,
                               "attention_factor": f.meta("phi3.rope.scaling.attn_factor", float, 1.0)}
    return out
