"""Gemma 4's tensors under our names (``archs.gemma4``): q / k / v fused as the layer has them
(a layer that shares KV: q only; a full layer with ``attention_k_eq_v``: q and k), and the MoE
variant's router and experts with their scalings folded in, so that the experts run as any
routed MLP (``runtime.moe``) on one input:
- the router's input RMSNorm(r) * scale * H^-0.5 (a norm without weight): scale * H^-0.5 folded
  into the router's columns;
- the experts' input RMSNorm(r) * w (pre_feedforward_layernorm_2): w folded into gate_up's columns;
- the routing weights times per_expert_scale[e]: folded into expert e's down rows."""

from __future__ import annotations

import numpy as np

from ..archs.gemma4 import GEMMA4_LAYER
from ..config import ModelConfig
from ..runtime.embedding import EmbeddingFile
from .safetensors_file import Checkpoint

PLE_TABLE = "model.embed_tokens_per_layer.weight"
_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}
_MOE = ("mlp_norm_1", "experts_in_norm", "experts_out_norm")


def _shape(ckpt: Checkpoint, name: str, shape: tuple) -> np.ndarray:
    w = ckpt.float32(name)
    if w.shape != shape:
        raise ValueError(f"{ckpt.directory}: {name} has shape {w.shape}, expected {shape}")
    return w


def layer_tensors(ckpt: Checkpoint, cfg: ModelConfig, i: int) -> dict:
    p, a, out = f"model.layers.{i}.", f"model.layers.{i}.self_attn.", {}
    H, d, kv = cfg.hidden_size, cfg.layer_head_dim(i), cfg.layer_kv_heads_of(i)
    own_kv = cfg.kv_layer(i) == i
    for ours, (name,) in ((k, v) for k, v in GEMMA4_LAYER.items() if k not in ("gate_up", "down", "o")):
        if (ours == "k_norm" and not own_kv) or (ours in _MOE and not cfg.num_experts) or \
                (ours.startswith("ple") and not cfg.per_layer_input_size):
            continue
        out[f"layers.{i}.{ours}"] = ckpt.float32(p + name)
    if out[f"layers.{i}.layer_scalar"].shape != (1,):
        raise ValueError(f"{ckpt.directory}: {p}layer_scalar must hold one number")
    parts = [("q_proj", cfg.num_heads * d)]
    if own_kv:
        parts.append(("k_proj", kv * d))
        if not (cfg.values_from_keys and cfg.window(i) == 0):
            parts.append(("v_proj", kv * d))
    out[f"layers.{i}.qkv"] = np.concatenate([_shape(ckpt, f"{a}{n}.weight", (rows, H)) for n, rows in parts])
    biases = [f"{a}{n}.bias" for n, _ in parts]
    if any(b in ckpt for b in biases):
        out[f"layers.{i}.qkv.bias"] = np.concatenate([ckpt.float32(b) for b in biases])
    out[f"layers.{i}.o"] = _shape(ckpt, a + "o_proj.weight", (H, cfg.num_heads * d))
    I = cfg.mlp_size(i)
    out[f"layers.{i}.gate_up"] = np.concatenate([_shape(ckpt, p + f"mlp.{n}_proj.weight", (I, H)) for n in ("gate", "up")])
    out[f"layers.{i}.down"] = _shape(ckpt, p + "mlp.down_proj.weight", (H, I))
    if cfg.num_experts:
        out.update(_experts(ckpt, cfg, i, p, out.pop(f"layers.{i}.experts_in_norm")))
    return out


def _experts(ckpt: Checkpoint, cfg: ModelConfig, i: int, p: str, in_norm: np.ndarray) -> dict:
    E, H, M = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size
    scale = _shape(ckpt, p + "router.scale", (H,))
    per_expert = _shape(ckpt, p + "router.per_expert_scale", (E,))
    out = {f"layers.{i}.router": _shape(ckpt, p + "router.proj.weight", (E, H)) * (scale * np.float32(H ** -0.5))}
    gate_up = _shape(ckpt, p + "experts.gate_up_proj", (E, 2 * M, H))
    down = _shape(ckpt, p + "experts.down_proj", (E, H, M))
    for e in range(E):
        out[f"layers.{i}.experts.{e}.gate_up"] = np.ascontiguousarray(gate_up[e] * in_norm[None, :])
        out[f"layers.{i}.experts.{e}.down"] = np.ascontiguousarray(down[e] * per_expert[e])
    return out


def model_tensors(ckpt: Checkpoint, cfg: ModelConfig) -> dict:
    """The per-layer embeddings' projection and its norm."""
    if not cfg.per_layer_input_size:
        return {}
    H, LP = cfg.hidden_size, cfg.num_layers * cfg.per_layer_input_size
    return {"ple_model_proj": _shape(ckpt, "model.per_layer_model_projection.weight", (LP, H)),
            "ple_proj_norm": _shape(ckpt, "model.per_layer_projection_norm.weight", (cfg.per_layer_input_size,))}


def per_layer_table(ckpt: Checkpoint, cfg: ModelConfig):
    """Where the per-layer embedding table lies (None without one)."""
    if not cfg.per_layer_input_size:
        return None
    offset, dtype, shape = ckpt.location(PLE_TABLE)
    want = (cfg.per_layer_vocab_size, cfg.num_layers * cfg.per_layer_input_size)
    if dtype not in _DTYPES or tuple(shape) != want:
        raise ValueError(f"{ckpt.directory}: {PLE_TABLE} is {dtype} {shape}, expected float {list(want)}")
    return EmbeddingFile(ckpt.file(PLE_TABLE).path, offset, want[0], want[1], _DTYPES[dtype])
