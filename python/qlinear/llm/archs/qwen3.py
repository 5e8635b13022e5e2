"""Qwen3: Qwen2's block without q/k/v biases, an RMSNorm over each query and key head before
RoPE (``q_norm`` / ``k_norm``, [head_dim]), and ``head_dim`` given explicitly (not hidden /
heads)."""

from __future__ import annotations

from .base import LLAMA_LAYER, QK_NORMS, Arch
from .llama import qwen_features


def features(hf: dict, where: str) -> dict:
    return {**qwen_features(hf, where), "qk_norm": True}


QWEN3 = Arch("qwen3", "Qwen3ForCausalLM", layer={**LLAMA_LAYER, **QK_NORMS}, features=features)
