"""Gemma 4 checkpoints of random weights, written in numpy as transformers 5 lays them out
(``synthetic.make_checkpoint`` trains their tokenizer and calls ``write``): ``Gemma4ForCausalLM``
(model_type gemma4_text), or with ``multimodal=True`` the published form,
``Gemma4ForConditionalGeneration`` (model_type gemma4: the text model under ``text_config`` and
``model.language_model.``; no vision or audio tower written, none read)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def write(out: Path, fields: dict, token_ids: dict, seed: int = 0, norm_noise: float = 0.0) -> Path:
    """A random Gemma 4: weights N(0, 0.02) (routers N(0, 64): their logits spread as a trained
    router's), norms 1 + N(0, norm_noise) (values' norms have no weight), layer scalars and
    router scales near 1. Fields beyond the shape as E2B's: head_dim = hidden / heads on sliding
    layers and twice that on full ones (``global_head_dim``), 2 sliding : 1 full (the last full),
    per-layer inputs of 16, the last third of the layers sharing KV with double-wide MLPs;
    ``enable_moe_block=True`` adds 8 experts (top 2) beside the dense MLP."""
    from safetensors.numpy import save_file

    multimodal = bool(fields.pop("multimodal", False))
    hidden, heads, n = fields["hidden_size"], fields["num_attention_heads"], fields["num_hidden_layers"]
    d = fields.get("head_dim", hidden // heads)
    cfg = {"model_type": "gemma4_text", "architectures": ["Gemma4ForCausalLM"], "head_dim": d,
           "global_head_dim": 2 * d, "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6,
           "max_position_embeddings": 131072, "tie_word_embeddings": True, "sliding_window": 16,
           "hidden_size_per_layer_input": 16, "num_kv_shared_layers": n // 3, "use_double_wide_mlp": True,
           "attention_k_eq_v": False, "num_global_key_value_heads": None, "final_logit_softcapping": 30.0,
           "enable_moe_block": False, "num_experts": None, "top_k_experts": None, "moe_intermediate_size": None,
           "layer_types": ["sliding_attention" if (i + 1) % 3 and i != n - 1 else "full_attention" for i in range(n)],
           "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                               "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                                  "rope_theta": 1000000.0}},
           **token_ids, "dtype": "float32", **fields}
    if cfg["enable_moe_block"]:
        moe = {"num_experts": 8, "top_k_experts": 2, "moe_intermediate_size": max(16, fields["intermediate_size"] // 4)}
        cfg.update({k: fields.get(k, v) for k, v in moe.items()})
    cfg.setdefault("vocab_size_per_layer_input", cfg["vocab_size"])
    types, P = cfg["layer_types"], cfg["hidden_size_per_layer_input"]
    first_shared = n - cfg["num_kv_shared_layers"]
    rng = np.random.default_rng(seed)

    def rand(*shape, std=0.02):
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def norm(size):
        return 1 + rand(size, std=norm_noise)

    w = {"model.embed_tokens.weight": rand(cfg["vocab_size"], hidden), "model.norm.weight": norm(hidden)}
    if P:
        w["model.embed_tokens_per_layer.weight"] = rand(cfg["vocab_size_per_layer_input"], n * P)
        w["model.per_layer_model_projection.weight"] = rand(n * P, hidden)
        w["model.per_layer_projection_norm.weight"] = norm(P)
    for i in range(n):
        p, a = f"model.layers.{i}.", f"model.layers.{i}.self_attn."
        full = types[i] == "full_attention"
        hd = cfg["global_head_dim"] if full else d
        kv = cfg.get("num_global_key_value_heads") or cfg["num_key_value_heads"] if full and cfg["attention_k_eq_v"] \
            else cfg["num_key_value_heads"]
        # query and key norms of hd^-1/4: unscaled scores then spread as softmax(q.k / sqrt(hd))'s do
        # (with norms of 1 they would be sqrt(hd) times wider, every attention nearly one-hot)
        qk_norm = np.float32(hd ** -0.25)
        w[a + "q_proj.weight"], w[a + "q_norm.weight"] = rand(heads * hd, hidden), norm(hd) * qk_norm
        w[a + "o_proj.weight"] = rand(hidden, heads * hd)
        if i < first_shared:
            w[a + "k_proj.weight"], w[a + "k_norm.weight"] = rand(kv * hd, hidden), norm(hd) * qk_norm
            if not (full and cfg["attention_k_eq_v"]):
                w[a + "v_proj.weight"] = rand(kv * hd, hidden)
        inter = cfg["intermediate_size"] * (2 if cfg["use_double_wide_mlp"] and i >= first_shared else 1)
        w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"] = rand(inter, hidden), rand(inter, hidden)
        w[p + "mlp.down_proj.weight"] = rand(hidden, inter)
        for name in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm"):
            w[p + name + ".weight"] = norm(hidden)
        w[p + "layer_scalar"] = (1 + rand(1, std=0.2)).astype(np.float32)
        if P:
            w[p + "per_layer_input_gate.weight"], w[p + "per_layer_projection.weight"] = rand(P, hidden), rand(hidden, P)
            w[p + "post_per_layer_input_norm.weight"] = norm(hidden)
        if cfg.get("enable_moe_block"):
            E, M = cfg["num_experts"], cfg["moe_intermediate_size"]
            w[p + "router.proj.weight"] = rand(E, hidden, std=8.0)  # (its input is scaled by hidden ** -0.5)
            w[p + "router.scale"], w[p + "router.per_expert_scale"] = norm(hidden), 1 + rand(E, std=0.2)
            w[p + "experts.gate_up_proj"], w[p + "experts.down_proj"] = rand(E, 2 * M, hidden), rand(E, hidden, M)
            for name in ("post_feedforward_layernorm_1", "post_feedforward_layernorm_2", "pre_feedforward_layernorm_2"):
                w[p + name + ".weight"] = norm(hidden)
    if multimodal:
        w = {("model.language_model." + k[len("model."):]): v for k, v in w.items()}
        text = {k: v for k, v in cfg.items() if k not in ("architectures", "dtype")}
        cfg = {"model_type": "gemma4", "architectures": ["Gemma4ForConditionalGeneration"], "text_config": text,
               **token_ids, "tie_word_embeddings": True, "dtype": "float32"}
    save_file(w, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return out
