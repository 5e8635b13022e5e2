"""Qwen2-MoE (Qwen1.5-MoE): Qwen2's attention (q/k/v biases) with a routed MLP in every layer as
Qwen3-MoE's (router ``mlp.gate``, experts ``mlp.experts.E``, ``moe_intermediate_size`` wide,
``norm_topk_prob``) plus a shared expert every token runs (``mlp.shared_expert``,
``shared_expert_intermediate_size`` wide), its output scaled by sigmoid(``mlp.shared_expert_gate``
. x) and added to the routed experts'."""

from __future__ import annotations

from .base import ROUTED_LAYER, Arch
from .llama import qwen_features
from .qwen3_moe import expert_fields




def features(hf: dict, where: str) -> dict:
    for key, ok in (("mlp_only_layers", lambda v: not v), ("decoder_sparse_step", lambda v: v in (None, 1))):
        if not ok(hf.get(key)):
            raise ValueError(f"{where}: {key} {hf[key]!r} (dense layers among the routed ones) is not supported")
    shared = hf.get("shared_expert_intermediate_size")
    if isinstance(shared, bool) or not isinstance(shared, int) or shared < 1:
        raise ValueError(f"{where}: field 'shared_expert_intermediate_size' is missing or invalid ({shared!r})")
    return {**qwen_features(hf, where), **expert_fields(hf, where, "moe_intermediate_size"),
            "shared_expert_size": shared}


QWEN2_MOE = Arch("qwen2_moe", "Qwen2MoeForCausalLM", layer=dict(ROUTED_LAYER), features=features, attention_bias=True)
