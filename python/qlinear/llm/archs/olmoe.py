"""OLMoE: Qwen3-MoE's routed MLP (router ``mlp.gate``, experts ``mlp.experts.E.gate_proj /
up_proj / down_proj``, the same tensor names) with its own attention: the q / k RMSNorms span the
whole projection (q: heads x head_dim values, k: kv_heads x head_dim), applied before the split
into heads and RoPE, then q, k, v optionally clamped to [-clip_qkv, clip_qkv]. The experts are
``intermediate_size`` wide (there is no moe_intermediate_size); head_dim is hidden / heads."""

from __future__ import annotations

from .base import Arch, activation
from .qwen3_moe import LAYER, expert_fields


def features(hf: dict, where: str) -> dict:
    hidden, heads = hf.get("hidden_size"), hf.get("num_attention_heads")
    # transformers derives head_dim from hidden / heads and ignores a head_dim field: one that
    # disagrees would size our norms and caches otherwise
    if hf.get("head_dim") and isinstance(hidden, int) and isinstance(heads, int) and heads and \
            hf["head_dim"] != hidden // heads:
        raise ValueError(f"{where}: head_dim {hf['head_dim']} differs from hidden_size / num_attention_heads "
                         f"({hidden // heads}), which OLMoE uses")
    clip = hf.get("clip_qkv")
    if clip is not None and (isinstance(clip, bool) or not isinstance(clip, (int, float)) or clip <= 0):
        raise ValueError(f"{where}: clip_qkv must be a positive number or null (got {clip!r})")
    return {"hidden_act": activation(hf, where), "qk_norm": True, "qk_norm_whole": True,
            "clip_qkv": None if clip is None else float(clip), **expert_fields(hf, where, "intermediate_size")}


OLMOE = Arch("olmoe", "OlmoeForCausalLM", layer=dict(LAYER), features=features)
