"""LFM2 (Liquid AI): a hybrid of short causal convolutions and attention. A ``conv`` layer
projects its input to B, C and x (``conv.in_proj``, 3 x hidden), convolves B * x per channel over
the last ``conv_L_cache`` positions (``conv.conv``, depthwise, no activation) and projects
C * that out (``conv.out_proj``); a ``full_attention`` layer is grouped-query attention with
q / k head norms (``q_layernorm`` / ``k_layernorm``) and ``out_proj``. Every layer's input norm is
``operator_norm``, its MLP (SwiGLU ``w1`` / ``w3`` / ``w2``) takes ``ffn_norm``'s; the final norm
is ``embedding_norm``. The MLP's width is ``intermediate_size`` adjusted as transformers does
(``block_auto_adjust_ff_dim``: 2/3 of it, times ``block_ffn_dim_multiplier``, rounded up to
``block_multiple_of``); embeddings are tied by default (``tie_embedding``)."""

from __future__ import annotations

from .base import Arch, activation

MIXERS = {"conv": "conv", "full_attention": "attention"}
COMMON = {"input_norm": ("operator_norm.weight",), "post_norm": ("ffn_norm.weight",),
          "gate_up": ("feed_forward.w1.weight", "feed_forward.w3.weight"), "down": ("feed_forward.w2.weight",)}
ATTENTION = {"qkv": ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
             "o": ("self_attn.out_proj.weight",),
             "q_norm": ("self_attn.q_layernorm.weight",), "k_norm": ("self_attn.k_layernorm.weight",)}
CONV = {"conv_in": ("conv.in_proj.weight",), "conv_out": ("conv.out_proj.weight",),
        "conv": ("conv.conv.weight",)}  # [hidden, 1, kernel]


def _mlp_width(hf: dict, where: str) -> int:
    width = hf.get("block_ff_dim", hf.get("intermediate_size"))
    if isinstance(width, bool) or not isinstance(width, int) or width < 1:
        raise ValueError(f"{where}: field 'intermediate_size' is missing or invalid ({width!r})")
    if hf.get("block_auto_adjust_ff_dim", True):
        width = int(2 * width / 3)
        multiplier = hf.get("block_ffn_dim_multiplier", 1.0)
        if multiplier is not None:
            multiple = hf.get("block_multiple_of", 256)
            width = multiple * ((int(multiplier * width) + multiple - 1) // multiple)
    return width


def features(hf: dict, where: str) -> dict:
    n = hf["num_hidden_layers"]
    types = hf.get("layer_types")
    if types is None:
        full = hf.get("full_attn_idxs")
        full = list(range(n)) if full is None else full
        types = ["full_attention" if i in full else "conv" for i in range(n)]
    if not isinstance(types, list) or len(types) != n or any(t not in MIXERS for t in types):
        raise ValueError(f"{where}: layer_types must list {n} of {', '.join(MIXERS)} (got {types!r})")
    if hf.get("conv_bias"):
        raise ValueError(f"{where}: conv_bias (biases on the short convolutions) is not supported")
    kernel = hf.get("conv_L_cache", 3)
    if isinstance(kernel, bool) or not isinstance(kernel, int) or not 2 <= kernel <= 16:
        raise ValueError(f"{where}: conv_L_cache must be an int in 2..16 (got {kernel!r})")
    eps = hf.get("norm_eps", 1e-5)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
        raise ValueError(f"{where}: norm_eps must be a positive number (got {eps!r})")
    return {"hidden_act": activation(hf, where) if "hidden_act" in hf else "silu", "qk_norm": True,
            "mixers": tuple(MIXERS[t] for t in types), "conv_kernel": kernel,
            "intermediate_size": _mlp_width(hf, where), "rms_norm_eps": float(eps),
            "tie_word_embeddings": bool(hf.get("tie_embedding", hf.get("tie_word_embeddings", True)))}


LFM2 = Arch("lfm2", "Lfm2ForCausalLM", layer=dict(COMMON), features=features,
            mixer_layers={"attention": ATTENTION, "conv": CONV}, tie_word_embeddings=True,
            final_norm="model.embedding_norm.weight")
