"""Mixtral: Mistral's attention with a routed MLP in every layer (``block_sparse_moe``): the
router ``gate``, a softmax over ``num_local_experts``, the top ``num_experts_per_tok`` always
renormalized to sum 1, and SwiGLU experts ``experts.E.w1`` (gate), ``w3`` (up), ``w2`` (down),
``intermediate_size`` wide."""

from __future__ import annotations

from .base import ROUTED_LAYER, Arch
from .mistral import features as mistral_features
from .qwen3_moe import expert_fields

EXPERTS = {"router": "block_sparse_moe.gate.weight", "expert": "block_sparse_moe.experts.{e}.",
           "gate": "w1.weight", "up": "w3.weight", "down": "w2.weight"}


def features(hf: dict, where: str) -> dict:
    routed = {"num_experts": hf.get("num_local_experts"), "num_experts_per_tok": hf.get("num_experts_per_tok"),
              "intermediate_size": hf.get("intermediate_size"), "norm_topk_prob": True}
    return {**mistral_features(hf, where), **expert_fields(routed, where, "intermediate_size")}


MIXTRAL = Arch("mixtral", "MixtralForCausalLM", layer=dict(ROUTED_LAYER), features=features, experts=EXPERTS)
