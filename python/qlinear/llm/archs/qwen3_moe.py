"""Qwen3-MoE: Qwen3's attention (per-head q / k norms) with a routed MLP in every layer: a
router (``mlp.gate``, [experts, hidden]) whose softmax ranks the experts, the top
``num_experts_per_tok`` taken (their weights renormalized to sum 1 with ``norm_topk_prob``), and
``num_experts`` SwiGLU experts (``mlp.experts.E.gate_proj / up_proj / down_proj``) of
``moe_intermediate_size``: a token reads and runs only its k experts' weights."""

from __future__ import annotations

from .base import LLAMA_LAYER, QK_NORMS, Arch
from .qwen3 import features as qwen3_features

LAYER = {k: v for k, v in {**LLAMA_LAYER, **QK_NORMS}.items() if k not in ("gate_up", "down")}


def expert_fields(hf: dict, where: str, size_key: str) -> dict:
    """The routed experts' ModelConfig fields: their count, how many a token runs, their width
    (``hf[size_key]``) and norm_topk_prob; missing or invalid values refused."""
    out = {}
    for key, ours in (("num_experts", "num_experts"), ("num_experts_per_tok", "experts_per_token"),
                      (size_key, "moe_intermediate_size")):
        v = hf.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{where}: field {key!r} is missing or invalid ({v!r})")
        out[ours] = v
    if out["experts_per_token"] > out["num_experts"]:
        raise ValueError(f"{where}: num_experts_per_tok {out['experts_per_token']} exceeds num_experts "
                         f"{out['num_experts']}")
    return {**out, "norm_topk_prob": bool(hf.get("norm_topk_prob", False))}


def features(hf: dict, where: str) -> dict:
    if hf.get("mlp_only_layers"):
        raise ValueError(f"{where}: mlp_only_layers {hf['mlp_only_layers']} (dense layers among the routed "
                         "ones) is not supported")
    if hf.get("decoder_sparse_step", 1) != 1:
        raise ValueError(f"{where}: decoder_sparse_step {hf['decoder_sparse_step']} (routed MLPs in some "
                         "layers only) is not supported")
    return {**qwen3_features(hf, where), **expert_fields(hf, where, "moe_intermediate_size")}


QWEN3_MOE = Arch("qwen3_moe", "Qwen3MoeForCausalLM", layer=LAYER, features=features)
