"""SmoothQuant for a Hugging Face checkpoint (``llm.convert(..., smooth=alpha)``): activation
outliers moved into the weights by per-channel scales folded into the float model, which then
computes the same function and is quantized as any checkpoint (Xiao et al. 2023).

Each projection's input channels j get ``s_j = max|X_j|^alpha / max|W_j|^(1 - alpha)`` (over the
calibration tokens and the weight's rows): the weight's columns are multiplied by s and the
activation divided by it, at no cost, by folding 1/s into what produces the activation: the
RMSNorm weights before q/k/v and before gate/up, the up projection's rows before down (the gated
product is linear in up), and the value projection's rows before o (the attention output is a
mix of value rows; a key-value head's channels get one scale shared by the query heads reading
it). The lm head is not smoothed (tied to the embedding in most small models). Families with the
Llama block and nothing between those producers and the projections: Llama, Qwen2, Qwen3,
Mistral. Needs torch and transformers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

FAMILIES = ("llama", "qwen2", "qwen3", "mistral")


def smooth_checkpoint(src, out, calibration_ids, alpha: float = 0.5, seq_len: int = 512) -> Path:
    """Write the smoothed float32 checkpoint of ``src`` into ``out`` (the tokenizer files
    copied); ``calibration_ids``: token ids the activation maxima are taken over."""
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415

    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"smooth (SmoothQuant's alpha) must be in [0, 1], got {alpha!r}")
    src, out = Path(src), Path(out)
    model = transformers.AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    if model.config.model_type not in FAMILIES:
        raise ValueError(f"{src}: SmoothQuant is implemented for {', '.join(FAMILIES)}, not {model.config.model_type}")
    ids = np.asarray(calibration_ids, np.int64)
    if ids.ndim != 1 or ids.size < 2:
        raise ValueError("SmoothQuant needs calibration tokens (a 1-D sequence of at least 2 ids)")
    layers = model.model.layers
    amax = {}

    def record(name):
        def hook(module, inputs):
            x = inputs[0].detach().reshape(-1, inputs[0].shape[-1]).abs().amax(0)
            amax[name] = torch.maximum(amax[name], x) if name in amax else x
        return hook

    hooks = []
    for i, layer in enumerate(layers):
        for name, mod in (("qkv", layer.self_attn.q_proj), ("o", layer.self_attn.o_proj),
                          ("gate_up", layer.mlp.gate_proj), ("down", layer.mlp.down_proj)):
            hooks.append(mod.register_forward_pre_hook(record((i, name))))
    with torch.no_grad():
        for s in range(0, len(ids), seq_len):
            model(torch.from_numpy(ids[s:s + seq_len])[None])
    for h in hooks:
        h.remove()

    def scales(x_max, weights):
        w_max = torch.stack([w.abs().amax(0) for w in weights]).amax(0)
        s = x_max.clamp(min=1e-5) ** alpha / w_max.clamp(min=1e-5) ** (1 - alpha)
        return s.clamp(min=1e-4)

    cfg = model.config
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    with torch.no_grad():
        for i, layer in enumerate(layers):
            at, mlp = layer.self_attn, layer.mlp
            qkv = (at.q_proj, at.k_proj, at.v_proj)
            s = scales(amax[(i, "qkv")], [m.weight for m in qkv])
            layer.input_layernorm.weight.div_(s)
            for m in qkv:
                m.weight.mul_(s)
            s = scales(amax[(i, "gate_up")], [mlp.gate_proj.weight, mlp.up_proj.weight])
            layer.post_attention_layernorm.weight.div_(s)
            mlp.gate_proj.weight.mul_(s)
            mlp.up_proj.weight.mul_(s)
            s = scales(amax[(i, "down")], [mlp.down_proj.weight])
            mlp.up_proj.weight.div_(s[:, None])
            mlp.down_proj.weight.mul_(s)
            # o's input channel (head h, d) comes from value row (h // group, d): one scale per kv row
            s = scales(amax[(i, "o")], [at.o_proj.weight]).reshape(heads, head_dim)
            s = s.reshape(kv_heads, heads // kv_heads, head_dim).amax(1)
            at.v_proj.weight.div_(s.reshape(-1)[:, None])
            if at.v_proj.bias is not None:
                at.v_proj.bias.div_(s.reshape(-1))
            at.o_proj.weight.mul_(s[:, None, :].expand(kv_heads, heads // kv_heads, head_dim).reshape(-1))
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    (out / "generation_config.json").unlink(missing_ok=True)
    for f in src.iterdir():
        if f.name.startswith("tokenizer") or f.name == "special_tokens_map.json":
            (out / f.name).write_bytes(f.read_bytes())
    return out
