"""The layers of llama.cpp's hybrid files under our names: Qwen3.5's Gated DeltaNet and gated
attention (``qwen35`` / ``qwen35moe``), LFM2's short convolutions (``lfm2``). ``w``: the source's
weight reader (``source._Weights``: codes moved, float tensors as the options say)."""

from __future__ import annotations

import numpy as np

from ..config import ModelConfig


def delta_tensors(w, cfg: ModelConfig, b: str, o: str) -> dict:
    """A Gated DeltaNet layer of a qwen35 file: its projections fused in our order (the conv
    channels ``attn_qkv``, the output gate ``attn_gate``, ``ssm_beta``, ``ssm_alpha``), its value
    heads left in the file's tiled order (``delta_tiled_heads``), the decay's rate ``ssm_a`` =
    -exp(A_log) as stored."""
    H, C, nv = cfg.hidden_size, cfg.delta_conv_dim, cfg.delta_v_heads
    vd = nv * cfg.delta_v_dim
    return {o + "delta_in": w.fused(o + "delta_in", [(b + "attn_qkv.weight", (C, H), None),
                                                     (b + "attn_gate.weight", (vd, H), None),
                                                     (b + "ssm_beta.weight", (nv, H), None),
                                                     (b + "ssm_alpha.weight", (nv, H), None)]),
            o + "delta_out": w.fused(o + "delta_out", [(b + "ssm_out.weight", (H, vd), None)]),
            o + "conv": np.array(w.f.dequantize(w.f.tensor(b + "ssm_conv1d.weight", (C, cfg.conv_kernel)))
                                 ).reshape(C, 1, cfg.conv_kernel),
            o + "dt_bias": w.vector(b + "ssm_dt.bias", nv), o + "ssm_a": w.vector(b + "ssm_a", nv),
            o + "delta_norm": w.vector(b + "ssm_norm.weight", cfg.delta_v_dim)}


def gated_attention_tensors(w, cfg: ModelConfig, b: str, o: str) -> dict:
    """Qwen3.5's attention of a qwen35 file: ``attn_q`` interleaves each head's query and output
    gate (as the checkpoint's q_proj); ours is [q, k, v, gate], q / k and their norms in the
    partial rotary's order (``layers.rotary_order``)."""
    from ..runtime.layers import rotary_order  # noqa: PLC0415

    H, heads, kv, d = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    order = rotary_order(d, cfg.rotary_dim)
    q_rows = (np.arange(heads)[:, None] * 2 * d + order).reshape(-1)
    gate_rows = (np.arange(heads)[:, None] * 2 * d + d + np.arange(d)).reshape(-1)
    k_rows = (np.arange(kv)[:, None] * d + order).reshape(-1)
    q = (b + "attn_q.weight", (2 * cfg.q_size, H), None)
    parts = [w._part(*q, rows=q_rows), w._part(b + "attn_k.weight", (cfg.kv_size, H), None, rows=k_rows),
             w._part(b + "attn_v.weight", (cfg.kv_size, H), None), w._part(*q, rows=gate_rows)]
    return {o + "qkv": w._fuse(o + "qkv", parts, [b + "attn_q.weight", b + "attn_k.weight", b + "attn_v.weight",
                                                  b + "attn_q.weight (gate)"]),
            o + "o": w.fused(o + "o", [(b + "attn_output.weight", (H, cfg.q_size), None)]),
            o + "q_norm": w.vector(b + "attn_q_norm.weight", d)[order],
            o + "k_norm": w.vector(b + "attn_k_norm.weight", d)[order]}


def short_conv_tensors(w, cfg: ModelConfig, b: str, o: str) -> dict:
    """An LFM2 conv layer: ``shortconv.in_proj`` (B, C, x), ``shortconv.out_proj`` and the taps
    ``shortconv.conv`` [hidden, kernel] (the converter squeezes the checkpoint's [hidden, 1, kernel])."""
    H, K = cfg.hidden_size, cfg.conv_kernel
    return {o + "conv_in": w.fused(o + "conv_in", [(b + "shortconv.in_proj.weight", (3 * H, H), None)]),
            o + "conv_out": w.fused(o + "conv_out", [(b + "shortconv.out_proj.weight", (H, H), None)]),
            o + "conv": np.array(w.f.dequantize(w.f.tensor(b + "shortconv.conv.weight", (H, K)))).reshape(H, 1, K)}
