"""The compiled decode step of a model's blocks (``_core.DecodeStep``): what each block hands it
(packed weights, norms, RoPE tables, its cache's rows or a recurrent layer's states), or None when
a block needs what the step lacks."""

from __future__ import annotations

from ... import _core
from ..._ops import core_handle
from ..._packed import PackedWeight
from .delta_net import GatedDeltaNet
from .kv_cache import KVCache
from .layers import Attention, GatedAttention, Linear
from .short_conv import ShortConv


def decode_step(blocks: list, norm: np.ndarray, lm_head: Linear, cache: KVCache):
    """The decode step of the whole model as one compiled call (``_core.DecodeStep``: norms,
    projections, RoPE, attention over ``cache``, MLP and residuals of every block, then the final
    norm and the lm head, without the GIL), or None when a layer's weights are kept in float or the
    model needs what the step lacks (routed experts kept in float, whole-projection q / k norms,
    q/k/v clamps). Routed experts (and a shared expert) run as their blocks' ``step_moe`` (the compiled
    routed MLP the blocks run too)."""
    moes = [getattr(b, "step_moe", None) for b in blocks]
    if not blocks or any(b.gate_up is None and m is None for b, m in zip(blocks, moes)):
        return None
    cfg = blocks[0].cfg
    if cfg.qk_norm_whole or cfg.clip_qkv is not None:  # the compiled step: per-head norms, no clamp
        return None
    stateful = (GatedDeltaNet, ShortConv)
    if any(type(b.attention) not in (Attention, GatedAttention, *stateful) for b in blocks):
        return None
    if all(isinstance(b.attention, stateful) for b in blocks):  # the step needs an attention layer
        return None
    mixers = [(b.attention.proj, b.attention.out) if isinstance(b.attention, stateful)
              else (b.attention.qkv, b.attention.o) for b in blocks]
    mlps = [m for b in blocks if b.gate_up is not None for m in (b.gate_up, b.down)]
    linears = [lm_head] + [m for pair in mixers for m in pair] + mlps
    if any(not isinstance(m.weight, PackedWeight) for m in linears):
        return None
    if cfg.hidden_act not in ("silu", "gelu_tanh") and mlps:  # the compiled step's MLPs: SwiGLU, GeGLU
        return None

    def spec(m: Linear):
        return (core_handle(m.weight), m.bias, m.act == "int8", int(m._block))

    first = next(b.attention for b in blocks if isinstance(b.attention, Attention))
    dense = [(None, None) if moe is not None else (spec(b.gate_up), spec(b.down)) for b, moe in zip(blocks, moes)]

    def mixer(i: int, b) -> tuple:  # (its caches, cos, sin; its options)
        a = b.attention
        if isinstance(a, ShortConv):
            return (None, None, None, None), {"short_conv": {
                "conv": a.conv, "conv_state": cache.states[i][0], "record": cache.records[i]}}
        if isinstance(a, GatedDeltaNet):
            conv_state, state = cache.states[i]
            return (None, None, None, None), {"delta": {
                "geometry": a.geometry(), "conv": a.conv, "dt_bias": a.dt_bias, "ssm_a": a.neg_a, "norm": a.norm,
                "conv_state": conv_state, "state": state, "record": cache.records[i]}}
        return (cache.k[i], cache.v[i], a.rope.cos, a.rope.sin), {
            "q_norm": a.q_norm, "k_norm": a.k_norm, "sinks": a.sinks, "gate": isinstance(a, GatedAttention)}

    layers = []
    for i, (b, moe) in enumerate(zip(blocks, moes)):
        tables, options = mixer(i, b)
        layers.append((spec(mixers[i][0]), spec(mixers[i][1]), *dense[i], b.input_norm, b.post_norm, *tables,
                       {**options, "attn_out_norm": b.attn_out_norm, "mlp_out_norm": b.mlp_out_norm, "moe": moe}))
    return _core.decode_step(layers, norm, spec(lm_head), cfg.num_heads, cfg.rms_norm_eps, float(first.scale),
                             gelu=cfg.hidden_act == "gelu_tanh", attn_softcap=first.softcap,
                             final_softcap=getattr(lm_head, "softcap", 0.0), context=cache.capacity)
