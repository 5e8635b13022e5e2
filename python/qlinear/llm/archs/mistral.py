"""Mistral: Llama's block; every layer attends over a sliding window of ``sliding_window``
positions when the config sets one (Mistral 7B v0.1; later versions set null)."""

from __future__ import annotations

from .base import Arch, activation, layer_types


def features(hf: dict, where: str) -> dict:
    types = layer_types({k: v for k, v in hf.items() if k != "layer_types"}, hf["num_hidden_layers"], where,
                        lambda i: True)
    return {"hidden_act": activation(hf, where), "layer_types": types,
            "sliding_window": hf.get("sliding_window") if types else None}


MISTRAL = Arch("mistral", "MistralForCausalLM", features=features)
