"""Gemma 4 (text): Gemma 3's block (GeGLU, sandwich norms, query / key head norms, sliding layers
interleaved with full ones) with
- per-layer attention shapes: full layers' heads wider (``global_head_dim``, 512) and, with
  ``attention_k_eq_v``, fewer KV heads whose values are their keys' projection;
- values RMS-normed per head without a weight, queries unscaled (scale 1);
- proportional RoPE on full layers (the leading ``partial_rotary_factor`` of the frequencies
  turn, over denominators of the whole head), the sliding layers' own base;
- KV sharing: the last ``num_kv_shared_layers`` layers attend over the keys and values of the
  last earlier layer of their type (and may have MLPs twice as wide: ``use_double_wide_mlp``);
- per-layer embeddings (a second table, vocabulary x (layers x P), mixed with a projection of
  the embedding into every block's output through a gate of its own);
- each block's output times a stored scalar; RMSNorm weights stored as they are (not w - 1);
- the MoE variant: a dense MLP and routed experts side by side, each with its own norms.
The published checkpoints are ``Gemma4ForConditionalGeneration`` (model_type ``gemma4``, the
text model under ``text_config`` and ``model.language_model.``); ``Gemma4ForCausalLM``'s are
``gemma4_text``."""

from __future__ import annotations

from .base import Arch, activation

# our per-layer tensor -> the checkpoint's (hf/gemma4.py fuses q / k / v per layer: shared-KV
# layers have only q_proj, full layers with attention_k_eq_v no v_proj)
GEMMA4_LAYER = {
    "input_norm": ("input_layernorm.weight",),
    "attn_out_norm": ("post_attention_layernorm.weight",),
    "post_norm": ("pre_feedforward_layernorm.weight",),
    "mlp_out_norm": ("post_feedforward_layernorm.weight",),
    "q_norm": ("self_attn.q_norm.weight",),
    "k_norm": ("self_attn.k_norm.weight",),
    "o": ("self_attn.o_proj.weight",),
    "gate_up": ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
    "down": ("mlp.down_proj.weight",),
    "ple_gate": ("per_layer_input_gate.weight",),
    "ple_proj": ("per_layer_projection.weight",),
    "ple_norm": ("post_per_layer_input_norm.weight",),
    "layer_scalar": ("layer_scalar",),
    # the MoE variant's
    "mlp_norm_1": ("post_feedforward_layernorm_1.weight",),
    "experts_in_norm": ("pre_feedforward_layernorm_2.weight",),
    "experts_out_norm": ("post_feedforward_layernorm_2.weight",),
}
SLIDING, FULL = "sliding_attention", "full_attention"


def _int(v, what: str, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{where}: {what} must be a positive int (got {v!r})")
    return v


def _layer_types(hf: dict, n: int, where: str) -> list:
    types = hf.get("layer_types")
    if types is None:  # 5 sliding : 1 full
        types = [SLIDING if (i + 1) % 6 else FULL for i in range(n)]
    if not isinstance(types, list) or len(types) != n or any(t not in (SLIDING, FULL) for t in types):
        raise ValueError(f"{where}: layer_types must list {n} of {SLIDING}, {FULL} (got {types!r})")
    return types[:-1] + [FULL]  # the last layer attends to everything (as transformers forces it)


def _shapes(hf: dict, types: list, where: str) -> tuple:
    """(head dims, KV heads) per layer: full layers' from ``per_layer_config`` (transformers 5
    writes it) or ``global_head_dim`` / ``num_global_key_value_heads`` (the published configs)."""
    d, kv = _int(hf.get("head_dim", 256), "head_dim", where), _int(hf.get("num_key_value_heads"), "num_key_value_heads",
                                                                   where)
    per = hf.get("per_layer_config")
    if per is None:
        wide = {"head_dim": hf.get("global_head_dim", 512)}
        if hf.get("attention_k_eq_v") and hf.get("num_global_key_value_heads") is not None:
            wide["num_key_value_heads"] = hf["num_global_key_value_heads"]
        per = {str(i): wide for i, t in enumerate(types) if t == FULL}
    if not isinstance(per, dict):
        raise ValueError(f"{where}: per_layer_config must be an object (got {per!r})")
    dims, heads = [d] * len(types), [kv] * len(types)
    for key, over in per.items():
        if not str(key).isdigit() or int(key) >= len(types) or not isinstance(over, dict) or \
                set(over) - {"head_dim", "num_key_value_heads"}:
            raise ValueError(f"{where}: per_layer_config entry {key!r}: {over!r} is not supported (a layer "
                             "index -> head_dim / num_key_value_heads)")
        i = int(key)
        dims[i] = _int(over.get("head_dim", d), "a layer's head_dim", where)
        heads[i] = _int(over.get("num_key_value_heads", kv), "a layer's num_key_value_heads", where)
    q_heads = hf.get("num_attention_heads")
    for i, (hd, h) in enumerate(zip(dims, heads)):
        if hd % 2 or hd > 512 or (isinstance(q_heads, int) and q_heads % h):
            raise ValueError(f"{where}: layer {i}'s head_dim {hd} (even, <= 512) or its {h} KV heads "
                             f"(dividing {q_heads} heads) is not supported")
    return tuple(dims), tuple(heads)


def _kv_layers(hf: dict, types: list, where: str):
    n, shared = len(types), hf.get("num_kv_shared_layers") or 0
    if isinstance(shared, bool) or not isinstance(shared, int) or not 0 <= shared < n:
        raise ValueError(f"{where}: num_kv_shared_layers must be an int in 0..{n - 1} (got {shared!r})")
    if not shared:
        return None
    first = n - shared
    out = list(range(first))
    for i in range(first, n):
        own = [j for j in range(first) if types[j] == types[i]]
        if not own:
            raise ValueError(f"{where}: layer {i} shares the KV of a {types[i]} layer, and none of the first "
                             f"{first} is one")
        out.append(own[-1])
    return tuple(out)


def _rope(hf: dict, where: str) -> dict:
    params = hf.get("rope_parameters") or {}
    if not isinstance(params, dict):
        raise ValueError(f"{where}: rope_parameters must be an object")
    local = {"rope_type": "default", "rope_theta": 10000.0, **(params.get(SLIDING) or {})}
    full = {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6, **(params.get(FULL) or {})}
    if local["rope_type"] != "default" or full["rope_type"] not in ("default", "proportional") or \
            float(full.get("factor", 1.0)) != 1.0:
        raise ValueError(f"{where}: Gemma 4 RoPE {params!r} is not supported (sliding: default; full: default "
                         "or proportional, no factor)")
    share = float(full.get("partial_rotary_factor", 1.0)) if full["rope_type"] == "proportional" else 1.0
    if not 0.0 < share <= 1.0:
        raise ValueError(f"{where}: partial_rotary_factor must be in (0, 1] (got {share})")
    return {"rope_theta": float(full["rope_theta"]), "rope_local_theta": float(local["rope_theta"]),
            "rope_proportion": share, "rope_scaling": None}


def gemma4_features(hf: dict, where: str) -> dict:
    if hf.get("use_bidirectional_attention"):
        raise ValueError(f"{where}: use_bidirectional_attention is not supported")
    n = _int(hf.get("num_hidden_layers"), "num_hidden_layers", where)
    types = _layer_types(hf, n, where)
    dims, heads = _shapes(hf, types, where)
    softcap = hf.get("final_logit_softcapping")
    if softcap is not None and (isinstance(softcap, bool) or not isinstance(softcap, (int, float)) or softcap <= 0):
        raise ValueError(f"{where}: final_logit_softcapping must be a positive number or null (got {softcap!r})")
    P = hf.get("hidden_size_per_layer_input") or 0
    out = {"hidden_act": activation(hf, where, "hidden_activation"), "embed_scale": True, "sandwich_norms": True,
           "qk_norm": True, "attn_scale": 1.0, "final_softcap": None if softcap is None else float(softcap),
           "layer_types": tuple("sliding" if t == SLIDING else "full" for t in types),
           "sliding_window": _int(hf.get("sliding_window", 512), "sliding_window", where),
           "head_dim": _int(hf.get("head_dim", 256), "head_dim", where),
           "layer_head_dims": dims, "layer_kv_heads": heads, "kv_layers": _kv_layers(hf, types, where),
           "values_from_keys": bool(hf.get("attention_k_eq_v")), "value_norm": True,
           "per_layer_input_size": _int(P, "hidden_size_per_layer_input", where) if P else 0,
           "per_layer_vocab_size": (_int(hf.get("vocab_size_per_layer_input", hf.get("vocab_size")),
                                         "vocab_size_per_layer_input", where) if P else 0),
           "layer_scalar": True, "double_wide_mlp": bool(hf.get("use_double_wide_mlp")), **_rope(hf, where)}
    if hf.get("enable_moe_block"):
        E = _int(hf.get("num_experts"), "num_experts", where)
        out.update(num_experts=E, experts_per_token=_int(hf.get("top_k_experts"), "top_k_experts", where),
                   moe_intermediate_size=_int(hf.get("moe_intermediate_size"), "moe_intermediate_size", where),
                   norm_topk_prob=True, dense_and_experts=True)
    return out


GEMMA4 = Arch("gemma4_text", "Gemma4ForCausalLM", layer=GEMMA4_LAYER, features=gemma4_features,
              tie_word_embeddings=True)
MULTIMODAL = {"gemma4": "gemma4_text"}
