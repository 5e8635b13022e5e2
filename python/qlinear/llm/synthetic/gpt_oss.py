"""GPT-OSS checkpoints of random weights, written in numpy as the published ones are laid out
(``synthetic.make_checkpoint`` trains their tokenizer and calls ``write``): the experts stacked,
gate and up interleaved, in MXFP4 (``*_blocks`` / ``*_scales`` and a ``quantization_config``, as
OpenAI ships them) or, with ``mxfp4=False``, in float as transformers saves a model it made."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

# The harmony format's special tokens (o200k_harmony's, in its order) and a chat template of its
# shape: turns "<|start|>{role}<|message|>{content}<|end|>", the assistant's final answers on the
# "final" channel, a reply ending at <|return|>.
HARMONY_SPECIAL = ("<|startoftext|>", "<|endoftext|>", "<|return|>", "<|constrain|>", "<|channel|>", "<|start|>",
                   "<|end|>", "<|message|>", "<|call|>")
HARMONY_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'assistant' %}"
    "{{ '<|start|>assistant<|channel|>final<|message|>' + message['content'] + '<|end|>' }}"
    "{% else %}{{ '<|start|>' + message['role'] + '<|message|>' + message['content'] + '<|end|>' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start|>assistant' }}{% endif %}")
FP4 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], np.float32)  # e2m1


def write(out: Path, fields: dict, token_ids: dict, seed: int = 0, norm_noise: float = 0.0) -> Path:
    """A random GPT-OSS checkpoint: weights N(0, 0.02) (the router's N(0, 0.1), its logits spread as a
    trained router's are, not all near-ties), biases N(0, 0.02), sinks N(0, 1), norms 1
    + N(0, norm_noise); MXFP4 experts of random codes with exponents 2^-10 .. 2^-7 (values of
    the weights' size). Fields beyond the shape as GPT-OSS-20B's (yarn RoPE, sliding window 128
    on even layers), the experts as wide as the shape's MLP (down to a multiple of 32)."""
    from safetensors.numpy import save_file

    mxfp4 = bool(fields.pop("mxfp4", True))
    fields["intermediate_size"] = max(32, fields["intermediate_size"] // 32 * 32)  # MXFP4: K a multiple of 32
    hidden, heads, n = fields["hidden_size"], fields["num_attention_heads"], fields["num_hidden_layers"]
    fields = {"num_local_experts": 8, "num_experts_per_tok": 2, "head_dim": hidden // heads,
              "sliding_window": 128, "swiglu_limit": 7.0, **fields}
    d, kv, E, M = fields["head_dim"], fields.get("num_key_value_heads", heads), fields["num_local_experts"], \
        fields["intermediate_size"]
    config = {"model_type": "gpt_oss", "architectures": ["GptOssForCausalLM"], "hidden_act": "silu",
              "rms_norm_eps": 1e-5, "max_position_embeddings": 131072, "tie_word_embeddings": False,
              "attention_bias": True, "experts_per_token": fields["num_experts_per_tok"],
              "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)],
              "rope_parameters": {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
                                  "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 4096},
              **token_ids, "dtype": "float32", **fields}
    rng = np.random.default_rng(seed)

    def rand(*shape, std=0.02):
        return (rng.standard_normal(shape) * std).astype(np.float32)

    w = {"model.embed_tokens.weight": rand(fields["vocab_size"], hidden),
         "model.norm.weight": 1 + rand(hidden, std=norm_noise), "lm_head.weight": rand(fields["vocab_size"], hidden)}
    for i in range(n):
        p, a, m = f"model.layers.{i}.", f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        w[p + "input_layernorm.weight"] = 1 + rand(hidden, std=norm_noise)
        w[p + "post_attention_layernorm.weight"] = 1 + rand(hidden, std=norm_noise)
        for name, rows in (("q_proj", heads * d), ("k_proj", kv * d), ("v_proj", kv * d)):
            w[a + name + ".weight"], w[a + name + ".bias"] = rand(rows, hidden), rand(rows)
        w[a + "o_proj.weight"], w[a + "o_proj.bias"] = rand(hidden, heads * d), rand(hidden)
        w[a + "sinks"] = rand(heads, std=1.0)
        w[m + "router.weight"], w[m + "router.bias"] = rand(E, hidden, std=0.1), rand(E)  # logits spread ~1
        w[m + "experts.gate_up_proj_bias"], w[m + "experts.down_proj_bias"] = rand(E, 2 * M), rand(E, hidden)
        if mxfp4:
            for name, (rows, k) in (("gate_up_proj", (2 * M, hidden)), ("down_proj", (hidden, M))):
                codes = rng.integers(0, 16, (E, rows, k // 32, 32), dtype=np.uint8)
                w[m + f"experts.{name}_blocks"] = codes[..., 0::2] | (codes[..., 1::2] << 4)
                w[m + f"experts.{name}_scales"] = rng.integers(117, 121, (E, rows, k // 32), dtype=np.uint8)
        else:
            w[m + "experts.gate_up_proj"], w[m + "experts.down_proj"] = rand(E, hidden, 2 * M), rand(E, M, hidden)
    if mxfp4:
        config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
            "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    save_file(w, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def dequantized(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """The float values [..., N, K] of MXFP4 ``blocks`` [..., N, K / 32, 16] and ``scales``
    [..., N, K / 32], as transformers dequantizes them (low nibble first, 2^(scale - 127))."""
    codes = np.stack([blocks & 15, blocks >> 4], -1).reshape(*blocks.shape[:-1], 32)
    v = FP4[codes] * np.ldexp(np.float32(1), scales.astype(np.int32) - 127)[..., None]
    return v.reshape(*blocks.shape[:-2], -1).astype(np.float32)
