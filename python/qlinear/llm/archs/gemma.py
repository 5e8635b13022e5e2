"""Gemma 2 and Gemma 3 (text): GeGLU (tanh-approximate GELU), embeddings scaled by
sqrt(hidden), RMSNorm weights stored as w - 1 (``1 + w`` is folded in at load), RMSNorms around
both sub-blocks (input and output of the attention and of the MLP), sliding-window layers
interleaved with global ones, queries scaled by ``query_pre_attn_scalar ** -0.5``.
Gemma 2 soft-caps the attention scores and the final logits; Gemma 3 normalizes query and key
heads (as Qwen3) and gives its sliding layers their own RoPE base (``rope_local_base_freq``,
unscaled)."""

from __future__ import annotations

from .base import LLAMA_LAYER, QK_NORMS, Arch, activation, layer_types

GEMMA_LAYER = {**LLAMA_LAYER,
               "post_norm": ("pre_feedforward_layernorm.weight",),
               "attn_out_norm": ("post_attention_layernorm.weight",),
               "mlp_out_norm": ("post_feedforward_layernorm.weight",)}


def _softcap(hf: dict, key: str, where: str):
    v = hf.get(key)
    if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0):
        raise ValueError(f"{where}: {key} must be a positive number or null (got {v!r})")
    return None if v is None else float(v)


def _common(hf: dict, where: str, sliding) -> dict:
    types = layer_types(hf, hf["num_hidden_layers"], where, sliding)
    scalar = hf.get("query_pre_attn_scalar") or hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]
    return {"hidden_act": activation(hf, where, "hidden_activation" if "hidden_activation" in hf else "hidden_act"),
            "embed_scale": True, "sandwich_norms": True, "attn_scale": float(scalar) ** -0.5,
            "attn_softcap": _softcap(hf, "attn_logit_softcapping", where),
            "final_softcap": _softcap(hf, "final_logit_softcapping", where),
            "layer_types": types, "sliding_window": hf.get("sliding_window") if types else None}


def gemma2_features(hf: dict, where: str) -> dict:
    return _common(hf, where, lambda i: i % 2 == 0)


def gemma3_features(hf: dict, where: str) -> dict:
    if hf.get("use_bidirectional_attention"):
        raise ValueError(f"{where}: use_bidirectional_attention (EmbeddingGemma) is not supported")
    pattern = hf.get("sliding_window_pattern", 6)
    out = _common(hf, where, lambda i: (i + 1) % pattern != 0)
    return {**out, "qk_norm": True, "rope_local_theta": float(hf.get("rope_local_base_freq", 10000.0))}


GEMMA2 = Arch("gemma2", "Gemma2ForCausalLM", layer=GEMMA_LAYER, norm_offset=1.0, features=gemma2_features,
              tie_word_embeddings=True)
GEMMA3 = Arch("gemma3_text", "Gemma3ForCausalLM", layer={**GEMMA_LAYER, **QK_NORMS}, norm_offset=1.0,
              features=gemma3_features, tie_word_embeddings=True)
