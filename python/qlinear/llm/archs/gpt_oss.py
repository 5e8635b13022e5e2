"""GPT-OSS: attention with biases on every projection, a learned sink per head (a logit in each
softmax's denominator that weighs no value), sliding windows of ``sliding_window`` on every other
layer (``layer_types``), YaRN RoPE; a routed MLP in every layer: a router with a bias, a softmax
over the top ``num_experts_per_tok`` logits (the same as the softmax over all of them renormalized
over the k), and ``num_local_experts`` experts with biases and the clamped SwiGLU (gate clamped
above, up on both sides at ``swiglu_limit``; (up + 1) * gate * sigmoid(``swiglu_alpha`` * gate)).
The experts are stacked (``mlp.experts.gate_up_proj`` [E, hidden, 2 x width], gate and up
interleaved along the last axis), in float or as MXFP4 (``*_blocks`` / ``*_scales``: read as
stored, ``hf.gpt_oss``)."""

from __future__ import annotations

from .base import ROUTED_LAYER, Arch, layer_types
from .qwen3_moe import expert_fields

LAYER = {**ROUTED_LAYER, "sinks": ("self_attn.sinks",)}
EXPERTS = {"router": "mlp.router.weight", "expert": "mlp.experts.", "form": "gpt_oss"}


def _positive(hf: dict, key: str, default: float, where: str) -> float:
    v = hf.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
        raise ValueError(f"{where}: {key} must be a positive number (got {v!r})")
    return float(v)


def features(hf: dict, where: str) -> dict:
    routed = {"num_experts": hf.get("num_local_experts"), "num_experts_per_tok": hf.get("num_experts_per_tok"),
              "intermediate_size": hf.get("intermediate_size"), "norm_topk_prob": True}
    types = layer_types(hf, hf["num_hidden_layers"], where, lambda i: i % 2 == 0)
    return {**expert_fields(routed, where, "intermediate_size"), "hidden_act": "clamped_swiglu",
            "swiglu_limit": _positive(hf, "swiglu_limit", 7.0, where),
            "swiglu_alpha": _positive(hf, "swiglu_alpha", 1.702, where),
            "attn_sinks": True, "attention_bias": bool(hf.get("attention_bias", True)),
            "layer_types": types, "sliding_window": hf.get("sliding_window") if types else None}


GPT_OSS = Arch("gpt_oss", "GptOssForCausalLM", layer=LAYER, features=features, experts=EXPERTS)
