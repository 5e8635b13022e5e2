"""Phi-3 (and Phi-3.5 / Phi-4-mini's config family): Llama's block with q/k/v fused in one
``qkv_proj`` and gate/up in one ``gate_up_proj`` in the checkpoint (already our fused layout:
q, k, v and gate, up stacked along N), LongRoPE ("su") scaling with short / long factors, and a
sliding window over every layer when the config sets one."""

from __future__ import annotations

from .base import LLAMA_LAYER, Arch, activation, layer_types


def features(hf: dict, where: str) -> dict:
    if hf.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError(f"{where}: partial_rotary_factor {hf['partial_rotary_factor']} (RoPE on part of each "
                         "head, Phi-4-mini) is not supported")
    types = layer_types({k: v for k, v in hf.items() if k != "layer_types"}, hf["num_hidden_layers"], where,
                        lambda i: True)
    return {"hidden_act": activation(hf, where), "layer_types": types,
            "sliding_window": hf.get("sliding_window") if types else None}


PHI3 = Arch("phi3", "Phi3ForCausalLM",
            layer={**LLAMA_LAYER, "qkv": ("self_attn.qkv_proj.weight",), "gate_up": ("mlp.gate_up_proj.weight",)},
            features=features)
