"""Llama and Qwen2: the shared block itself (SwiGLU MLP, RoPE, grouped-query attention; Qwen2's
q/k/v carry biases). Qwen2 may attend over a sliding window in its upper layers."""

from __future__ import annotations

from .base import Arch, activation, layer_types


def qwen_features(hf: dict, where: str) -> dict:
    """Qwen2 / Qwen3: ``use_sliding_window`` makes layers from ``max_window_layers`` on sliding."""
    n = hf.get("num_hidden_layers", 0)
    first = hf.get("max_window_layers", n)
    types = layer_types(hf if hf.get("use_sliding_window") or hf.get("layer_types") else {}, n, where,
                        lambda i: i >= first)
    return {"hidden_act": activation(hf, where), "layer_types": types,
            "sliding_window": hf.get("sliding_window") if types else None}


def llama_features(hf: dict, where: str) -> dict:
    # ReLU-family Llama checkpoints (ReluLLaMA, ProSparse): sparse activations, for memory="flash"
    act = "relu" if hf.get("hidden_act") == "relu" else activation(hf, where)
    return {"hidden_act": act, "mlp_bias": bool(hf.get("mlp_bias", False))}


QWEN2 = Arch("qwen2", "Qwen2ForCausalLM", features=qwen_features, attention_bias=True)
LLAMA = Arch("llama", "LlamaForCausalLM", features=llama_features)
