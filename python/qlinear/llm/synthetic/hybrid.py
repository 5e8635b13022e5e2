"""Qwen3.5 (dense and MoE) checkpoints of random weights, written in numpy as transformers 5
saves them (transformers 4.x has no class for them; ``synthetic.make_checkpoint`` trains their
tokenizer and calls ``write``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

# arch -> (model_type, transformers class, fields beyond the shape). A "linear_*" field of
# the shape sets the Gated DeltaNet's heads; by default a shape's heads and head size halved.
HYBRIDS = {
    "qwen3_5": ("qwen3_5_text", "Qwen3_5ForCausalLM", {}),
    "qwen3_5_moe": ("qwen3_5_moe_text", "Qwen3_5MoeForCausalLM", {"num_experts": 8, "num_experts_per_tok": 2}),
}
# the multimodal form of the published checkpoints: the text model under text_config and
# model.language_model. (``multimodal=True``)
MULTIMODAL = {"qwen3_5": ("qwen3_5", "Qwen3_5ForConditionalGeneration"),
              "qwen3_5_moe": ("qwen3_5_moe", "Qwen3_5MoeForConditionalGeneration")}


def write(out: Path, arch: str, fields: dict, token_ids: dict, seed: int = 0, norm_noise: float = 0.0) -> Path:
    """A random Qwen3.5 (dense or MoE) checkpoint, written as transformers 5 saves one (with
    ``multimodal=True`` in the published multimodal form: fields under text_config, tensors under
    model.language_model., an MTP head's tensor beside them). Weights N(0, 0.02), RMSNorm
    weights stored as w - 1 (zero, plus N(0, norm_noise)), the delta rule's A_log and dt_bias as
    transformers initializes them, the conv taps N(0, 0.3)."""
    from safetensors.numpy import save_file

    multimodal = bool(fields.pop("multimodal", False))
    model_type, hf_class, extra = HYBRIDS[arch]
    fields = {**extra, **fields}
    hidden, heads, n = fields["hidden_size"], fields["num_attention_heads"], fields["num_hidden_layers"]
    d = fields.setdefault("head_dim", hidden // heads)
    kv = fields.get("num_key_value_heads", heads)
    fields.setdefault("linear_num_key_heads", max(1, kv))
    fields.setdefault("linear_num_value_heads", heads)
    fields.setdefault("linear_key_head_dim", d // 2)
    fields.setdefault("linear_value_head_dim", d // 2)
    fields.setdefault("linear_conv_kernel_dim", 4)
    every = fields.pop("full_attention_interval", 4)
    fields.setdefault("layer_types", ["full_attention" if (i + 1) % every == 0 else "linear_attention"
                                      for i in range(n)])
    routed = "num_experts" in fields
    if routed:
        fields.setdefault("moe_intermediate_size", fields["intermediate_size"] // 2)
        fields.setdefault("shared_expert_intermediate_size", fields["intermediate_size"])
        fields.pop("intermediate_size")
    factor = fields.pop("partial_rotary_factor", 0.25)
    text = {"model_type": model_type, "architectures": [hf_class], "hidden_act": "silu", "rms_norm_eps": 1e-6,
            "max_position_embeddings": 4096, "tie_word_embeddings": False, "attention_bias": False,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0, "partial_rotary_factor": factor},
            **token_ids, "dtype": "float32", **fields}

    rng = np.random.default_rng(seed)
    np_dtype = np.float32

    def rand(*shape, std=0.02):
        return (rng.standard_normal(shape) * std).astype(np_dtype)

    def norm(m):
        return (rng.standard_normal(m) * norm_noise).astype(np_dtype)

    nk, nv = fields["linear_num_key_heads"], fields["linear_num_value_heads"]
    dk, dv, K = fields["linear_key_head_dim"], fields["linear_value_head_dim"], fields["linear_conv_kernel_dim"]
    w = {"model.embed_tokens.weight": rand(fields["vocab_size"], hidden), "model.norm.weight": norm(hidden),
         "lm_head.weight": rand(fields["vocab_size"], hidden)}
    for i, kind in enumerate(text["layer_types"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"], w[p + "post_attention_layernorm.weight"] = norm(hidden), norm(hidden)
        if kind == "full_attention":
            a = p + "self_attn."
            w[a + "q_proj.weight"] = rand(2 * heads * d, hidden)
            w[a + "k_proj.weight"], w[a + "v_proj.weight"] = rand(kv * d, hidden), rand(kv * d, hidden)
            w[a + "o_proj.weight"] = rand(hidden, heads * d)
            w[a + "q_norm.weight"], w[a + "k_norm.weight"] = norm(d), norm(d)
        else:
            a, conv = p + "linear_attn.", 2 * nk * dk + nv * dv
            w[a + "in_proj_qkv.weight"], w[a + "in_proj_z.weight"] = rand(conv, hidden), rand(nv * dv, hidden)
            w[a + "in_proj_b.weight"], w[a + "in_proj_a.weight"] = rand(nv, hidden), rand(nv, hidden)
            w[a + "conv1d.weight"] = rand(conv, 1, K, std=0.3)
            w[a + "dt_bias"] = np.ones(nv, np_dtype)
            w[a + "A_log"] = np.log(rng.uniform(0.01, 16, nv)).astype(np_dtype)
            w[a + "norm.weight"] = (1 + norm(dv)).astype(np_dtype)  # stored as it is
            w[a + "out_proj.weight"] = rand(hidden, nv * dv)
        m = p + "mlp."
        if routed:
            E, M, S = fields["num_experts"], fields["moe_intermediate_size"], fields["shared_expert_intermediate_size"]
            w[m + "gate.weight"] = rand(E, hidden)
            w[m + "experts.gate_up_proj"], w[m + "experts.down_proj"] = rand(E, 2 * M, hidden), rand(E, hidden, M)
            for name, shape in (("gate_proj", (S, hidden)), ("up_proj", (S, hidden)), ("down_proj", (hidden, S))):
                w[f"{m}shared_expert.{name}.weight"] = rand(*shape)
            w[m + "shared_expert_gate.weight"] = rand(1, hidden)
        else:
            I = fields["intermediate_size"]  # noqa: E741
            w[m + "gate_proj.weight"], w[m + "up_proj.weight"] = rand(I, hidden), rand(I, hidden)
            w[m + "down_proj.weight"] = rand(hidden, I)
    config = text
    if multimodal:
        outer_type, outer_class = MULTIMODAL[arch]
        w = {("model.language_model." + k[len("model."):] if k.startswith("model.") else k): v for k, v in w.items()}
        w["mtp.fc.weight"] = rand(hidden, 2 * hidden)  # the multi-token-prediction head's: not read
        config = {"model_type": outer_type, "architectures": [outer_class], "tie_word_embeddings": False,
                  "text_config": {k: v for k, v in text.items() if k != "architectures"},
                  "vision_config": {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
                                    "out_hidden_size": hidden, "patch_size": 4, "temporal_patch_size": 2}}
    save_file(w, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out
