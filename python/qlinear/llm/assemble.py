"""Assembling a Model from a Source (whatever the source): layers built from our named tensors,
the embedding opened on disk or in memory, the options applied."""

from __future__ import annotations

from typing import Callable

import numpy as np

from .. import _core
from .._packed import PackedWeight
from .config import ModelConfig
from .runtime.embedding import MemoryEmbedding, ScaledEmbedding, embed_scale
from .runtime.layers import Attention, Block, CappedLinear, GatedAttention, Linear, Rope
from .runtime.model import Model
from .options import Options
from .source import Source


def ropes(cfg: ModelConfig, max_context: int, inv_freq=None) -> tuple:
    """(the RoPE of the model, the sliding layers' own: Gemma 3; else the same)."""
    rope = Rope(cfg, max_context, inv_freq)
    return rope, Rope(cfg, max_context, local=True) if cfg.rope_local_theta is not None else rope


def token_mixer(cfg: ModelConfig, i: int, linear: Callable, vector: Callable, rope: Rope):
    """Layer ``i``'s attention (gated: Qwen3.5) or, in a hybrid, its Gated DeltaNet (Qwen3.5) or
    short convolution (LFM2)."""
    H, d, p = cfg.hidden_size, cfg.head_dim, f"layers.{i}."
    if cfg.mixer(i) == "delta":
        from .runtime.delta_net import GatedDeltaNet  # noqa: PLC0415

        C, vd, nv = cfg.delta_conv_dim, cfg.delta_v_heads * cfg.delta_v_dim, cfg.delta_v_heads
        return GatedDeltaNet(cfg, i, linear(p + "delta_in", (C + vd + 2 * nv, H)), linear(p + "delta_out", (H, vd)),
                             vector(p + "conv", (C, 1, cfg.conv_kernel)), vector(p + "dt_bias", nv),
                             vector(p + "ssm_a", nv), vector(p + "delta_norm", cfg.delta_v_dim))
    if cfg.mixer(i) == "conv":
        from .runtime.short_conv import ShortConv  # noqa: PLC0415

        return ShortConv(cfg, i, linear(p + "conv_in", (3 * H, H)), linear(p + "conv_out", (H, H)),
                         vector(p + "conv", (H, 1, cfg.conv_kernel)))
    if cfg.qk_norm_whole:  # OLMoE: one norm over all heads of q, one over all of k
        qk = (vector(p + "q_norm", cfg.q_size), vector(p + "k_norm", cfg.kv_size))
    else:
        qk = (vector(p + "q_norm", d), vector(p + "k_norm", d)) if cfg.qk_norm else ()
    gate = cfg.q_size if cfg.attn_output_gate else 0
    kind = GatedAttention if gate else Attention
    qk = qk or (None, None)
    sinks = vector(p + "sinks", cfg.num_heads) if cfg.attn_sinks else None
    return kind(cfg, i, linear(p + "qkv", (cfg.q_size + 2 * cfg.kv_size + gate, H)), linear(p + "o", (H, cfg.q_size)),
                rope, *qk, sinks=sinks)


def make_block(cfg: ModelConfig, i: int, linear: Callable, vector: Callable, rope: Rope, local_rope: Rope) -> Block:
    """Block ``i`` of ``cfg``'s architecture from our named tensors: ``linear(name, shape)`` and
    ``vector(name, n)`` give its layers and norms."""
    H, I, p = cfg.hidden_size, cfg.intermediate_size, f"layers.{i}."
    attn = token_mixer(cfg, i, linear, vector, local_rope if cfg.window(i) else rope)
    if cfg.num_experts:  # routed experts (Qwen3-MoE, OLMoE)
        from .runtime.moe import MoeBlock  # noqa: PLC0415

        M = cfg.moe_intermediate_size
        experts = [(linear(f"{p}experts.{e}.gate_up", (2 * M, H)), linear(f"{p}experts.{e}.down", (H, M)))
                   for e in range(cfg.num_experts)]
        parts = (cfg, attn, linear(p + "router", (cfg.num_experts, H)), experts,
                 vector(p + "input_norm", H), vector(p + "post_norm", H))
        if cfg.shared_expert_size:  # Qwen2-MoE
            from .runtime.moe_shared import SharedExpertMoeBlock  # noqa: PLC0415

            S = cfg.shared_expert_size
            return SharedExpertMoeBlock(*parts, shared=(linear(p + "shared_gate_up", (2 * S, H)),
                                                        linear(p + "shared_down", (H, S))),
                                        shared_gate=vector(p + "shared_gate", H))
        return MoeBlock(*parts)
    out_norms = (vector(p + "attn_out_norm", H), vector(p + "mlp_out_norm", H)) if cfg.sandwich_norms else ()
    return Block(cfg, attn, linear(p + "gate_up", (2 * I, H)), linear(p + "down", (H, I)),
                 vector(p + "input_norm", H), vector(p + "post_norm", H), *out_norms)


def build_model(source: Source, opts: Options, max_context: int) -> Model:
    """A Model from ``source``; of ``opts``: act, act_block, memory, disk_embedding."""
    if isinstance(max_context, bool) or not isinstance(max_context, int) or max_context < 1:
        raise ValueError(f"max_context must be a positive int, got {max_context!r}")
    cfg, tensors = source.config, source.tensors
    max_context = min(max_context, cfg.max_position_embeddings)
    quantized = any(isinstance(w, PackedWeight) for w in tensors.values())
    act = opts.act if quantized else "float"

    def need(name):
        if name not in tensors:
            raise ValueError(f"model has no tensor {name!r}")
        return tensors[name]

    def linear(name, shape, cls=Linear, **extra):
        w = need(name)
        if tuple(w.shape) != shape:
            raise ValueError(f"tensor {name!r} has shape {tuple(w.shape)}, expected {shape}")
        if isinstance(w, PackedWeight) and opts.memory == "normal" and act == "float":
            w = w.dequantize()
        bias = tensors.get(name + ".bias")
        if bias is not None:
            bias = np.asarray(bias, np.float32)
            if bias.shape != (shape[0],):
                raise ValueError(f"tensor {name + '.bias'!r} has shape {bias.shape}, expected ({shape[0]},)")
        if not isinstance(w, PackedWeight):
            return cls(np.asarray(w, np.float32), bias, act="float", **extra)
        return cls(w, bias, act=act, act_block=opts.act_block, **extra)

    def vector(name, n):  # n: a length, or a shape
        v = np.array(need(name), dtype=np.float32)
        shape = tuple(n) if isinstance(n, tuple) else (n,)
        if v.shape != shape:
            raise ValueError(f"tensor {name!r} has shape {v.shape}, expected {shape}")
        return v

    H = cfg.hidden_size
    if cfg.arch == "gemma4_text":  # per-layer attention shapes, shared KV, per-layer inputs
        from .runtime import gemma4  # noqa: PLC0415

        blocks = gemma4.make_blocks(cfg, linear, vector, max_context)
    else:
        rope, local_rope = ropes(cfg, max_context, source.rope_inv_freq)
        blocks = [make_block(cfg, i, linear, vector, rope, local_rope) for i in range(cfg.num_layers)]
    rows = tensors.get("lm_rows")
    rows = None if rows is None else np.asarray(rows, np.int64)
    head_shape = (cfg.vocab_size if rows is None else len(rows), H)
    lm_head = (linear("lm_head", head_shape, CappedLinear, softcap=cfg.final_softcap) if cfg.final_softcap
               else linear("lm_head", head_shape))
    norm = vector("norm", H)
    embedding = source.embedding.open(on_disk=opts.disk_embedding)
    on_disk = not isinstance(embedding, MemoryEmbedding)  # rows read from the file as needed
    if cfg.embed_scale:
        embedding = ScaledEmbedding(embedding, embed_scale(H, source.embedding.dtype))
    info = {"source": source.kind, "path": str(source.path), **source.info,
            "bits": source.quantization.get("bits"), "group_size": source.quantization.get("group_size"),
            "act": act, "memory": opts.memory, "disk_embedding": on_disk, "kv_cache": opts.kv_cache,
            "threads": _core.get_num_threads()}
    model = Model(cfg, source.tokenizer, embedding, blocks, norm, lm_head, rows, max_context, info,
                  kv_cache=opts.kv_cache, per_layer=per_layer_inputs(source, opts, linear, vector))
    if model.per_layer is not None:
        model.resources.append(model.per_layer)
    return model


def per_layer_inputs(source: Source, opts: Options, linear: Callable, vector: Callable):
    """Gemma 4's per-layer inputs (None without them): the table on disk unless
    ``disk_embedding=False``, like the embedding's."""
    cfg = source.config
    if not cfg.per_layer_input_size:
        return None
    table = source.per_layer_embedding
    if table is None:
        raise ValueError(f"{source.path}: the model has per-layer inputs, and its source no per-layer embedding table")
    from .runtime.gemma4 import PerLayerInputs  # noqa: PLC0415

    P = cfg.per_layer_input_size
    rows = ScaledEmbedding(table.open(on_disk=opts.disk_embedding), embed_scale(P, table.dtype))
    return PerLayerInputs(cfg, rows, linear("ple_model_proj", (cfg.num_layers * P, cfg.hidden_size)),
                          vector("ple_proj_norm", P))
