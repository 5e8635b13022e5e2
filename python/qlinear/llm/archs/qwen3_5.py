"""Qwen3.5 / Qwen3.6 (text): a hybrid. Three of every four layers mix tokens by Gated DeltaNet
(``linear_attn``: q / k / v from one projection through a causal depthwise conv of
``linear_conv_kernel_dim`` and SiLU, q and k L2-normed, a per-head decay ``g = -exp(A_log) *
softplus(a + dt_bias)`` and ``beta = sigmoid(b)``, the delta rule over a recurrent state of
``linear_key_head_dim x linear_value_head_dim`` per value head, its readout RMS-normed per head
and gated by ``silu(z)``); the fourth attends (``full_attention``: q / k head norms, rotary on the
leading ``partial_rotary_factor`` of each 256-wide head, the output times ``sigmoid(gate)``, the
gate interleaved per head with the query in ``q_proj``). RMSNorm weights are stored as w - 1
(the delta readout's gated norm excepted). Qwen3.5-MoE routes every layer's MLP as Qwen3-MoE
(weights always renormalized) beside a gated shared expert as Qwen2-MoE's.

The published checkpoints are the multimodal form (``Qwen3_5ForConditionalGeneration``, model
type ``qwen3_5``): the text model's fields under ``text_config``, its tensors under
``model.language_model.``; ``text_part`` reads that form and the text-only one alike."""

from __future__ import annotations

from .base import LLAMA_LAYER, QK_NORMS, QWEN_EXPERTS, Arch, activation
from .qwen3_moe import expert_fields

MIXERS = {"linear_attention": "delta", "full_attention": "attention"}

# tensors of every layer (norms, MLP) and of each token mixer, under model.layers.{i}.
COMMON = {k: LLAMA_LAYER[k] for k in ("input_norm", "post_norm", "gate_up", "down")}
ATTENTION = {"qkv": LLAMA_LAYER["qkv"], "o": LLAMA_LAYER["o"], **QK_NORMS}
DELTA = {
    # one projection of the layer's input: conv channels (q, k, v), the output gate z, beta's and
    # the decay's logits
    "delta_in": ("linear_attn.in_proj_qkv.weight", "linear_attn.in_proj_z.weight",
                 "linear_attn.in_proj_b.weight", "linear_attn.in_proj_a.weight"),
    "delta_out": ("linear_attn.out_proj.weight",),
    "conv": ("linear_attn.conv1d.weight",),          # [channels, 1, kernel]
    "dt_bias": ("linear_attn.dt_bias",),
    "a_log": ("linear_attn.A_log",),
    "delta_norm": ("linear_attn.norm.weight",),      # stored as it is (no w - 1)
}

def _positive(hf: dict, key: str, where: str, default=None) -> int:
    v = hf.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{where}: field {key!r} is missing or invalid ({v!r})")
    return v


def features(hf: dict, where: str) -> dict:
    n = hf["num_hidden_layers"]
    types = hf.get("layer_types")
    if types is None:  # transformers' default: every full_attention_interval-th layer attends
        every = _positive(hf, "full_attention_interval", where, 4)
        types = ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(n)]
    if not isinstance(types, list) or len(types) != n or any(t not in MIXERS for t in types):
        raise ValueError(f"{where}: layer_types must list {n} of {', '.join(MIXERS)} (got {types!r})")
    head_dim = _positive(hf, "head_dim", where, 256)
    rope = hf.get("rope_parameters") if isinstance(hf.get("rope_parameters"), dict) else {}
    factor = hf.get("partial_rotary_factor", rope.get("partial_rotary_factor", 0.25))
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor <= 1:
        raise ValueError(f"{where}: partial_rotary_factor must be in (0, 1] (got {factor!r})")
    rotary = int(head_dim * factor)
    if rotary < 2 or rotary % 2:
        raise ValueError(f"{where}: partial_rotary_factor {factor} gives {rotary} rotary dims of {head_dim}: "
                         "not an even number >= 2")
    out = {"hidden_act": activation(hf, where), "qk_norm": True, "attn_output_gate": True,
           "rotary_dim": 0 if rotary == head_dim else rotary,
           "mixers": tuple(MIXERS[t] for t in types), "conv_kernel": _positive(hf, "linear_conv_kernel_dim", where, 4),
           "delta_tiled_heads": bool(hf.get("delta_tiled_heads", False))}  # (GGUF files: gguf.config)
    for key, ours in (("linear_num_key_heads", "delta_k_heads"), ("linear_num_value_heads", "delta_v_heads"),
                      ("linear_key_head_dim", "delta_k_dim"), ("linear_value_head_dim", "delta_v_dim")):
        out[ours] = _positive(hf, key, where, 16 if "heads" in key else 128)
    if out["delta_v_heads"] % out["delta_k_heads"]:
        raise ValueError(f"{where}: {out['delta_v_heads']} linear value heads are not a multiple of "
                         f"{out['delta_k_heads']} key heads")
    return out


def moe_features(hf: dict, where: str) -> dict:
    shared = _positive(hf, "shared_expert_intermediate_size", where)
    return {**features(hf, where), **expert_fields(hf, where, "moe_intermediate_size"), "norm_topk_prob": True,
            "shared_expert_size": shared}


QWEN3_5 = Arch("qwen3_5_text", "Qwen3_5ForCausalLM", layer=dict(COMMON), norm_offset=1.0, features=features,
               mixer_layers={"attention": ATTENTION, "delta": DELTA}, raw_norms=("delta_norm",))
QWEN3_5_MOE = Arch("qwen3_5_moe_text", "Qwen3_5MoeForCausalLM", layer={k: COMMON[k] for k in ("input_norm", "post_norm")},
                   norm_offset=1.0, features=moe_features, mixer_layers={"attention": ATTENTION, "delta": DELTA},
                   raw_norms=("delta_norm",), experts=dict(QWEN_EXPERTS))

# the multimodal checkpoints' model types -> their text model's
MULTIMODAL = {"qwen3_5": "qwen3_5_text", "qwen3_5_moe": "qwen3_5_moe_text"}
