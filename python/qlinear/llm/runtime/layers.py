"""The parts of a decoder block: Linear (on qlinear kernels), RMSNorm, RoPE, grouped-query
attention over a preallocated KV cache (a ring of the window's positions for sliding-window
layers; sinks, GPT-OSS's per-head logits in each softmax's denominator), and the gated MLP (SwiGLU / GeGLU), with the options architectures add (``archs``):
query / key head norms, norms of the sub-blocks' outputs, soft-capping. Activations are float32
numpy arrays [tokens, features]."""

from __future__ import annotations

import math
from typing import Optional, Union

import numpy as np

from ... import _core
from ..._ops import act_block_size, matmul_array
from ..._packed import PackedWeight
from ..._scheme import DEFAULT_ACT_BLOCK, ActBlock
from ..config import ModelConfig
from .kv_cache import KVCache


class Linear:
    """y = x @ W.T + b. W is a PackedWeight (int4 / int8: W4A8 / W8A8 kernels, or the
    low-memory float path with act="float") or a float32 array [N, K] (weights kept in float)."""

    __slots__ = ("weight", "bias", "act", "_block", "_wt")

    def __init__(self, weight: Union[PackedWeight, np.ndarray], bias: Optional[np.ndarray] = None,
                 act: str = "int8", act_block: ActBlock = DEFAULT_ACT_BLOCK):
        if act not in ("int8", "float"):
            raise ValueError(f"act must be 'int8' or 'float', got {act!r}")
        self.weight, self.act = weight, act
        self.bias = None if bias is None else np.ascontiguousarray(bias, dtype=np.float32)
        if isinstance(weight, PackedWeight):
            # act_block as qlinear.matmul's: "group", None (per row) or k per scale
            self._block = act_block_size(weight, act_block)
            self._wt = None
        else:
            self._block = 0
            self._wt = np.asarray(weight, dtype=np.float32).T

    @property
    def shape(self) -> tuple:
        return tuple(self.weight.shape)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if self._wt is not None:
            y = x @ self._wt
            if self.bias is not None:
                y += self.bias
            return y
        return matmul_array(x, self.weight, self.bias, None, self.act, self._block)


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) * weight, per row (float32 [tokens, features])."""
    return _core.rms_norm(x, weight, eps)


def silu_mul(gate_up: np.ndarray) -> np.ndarray:
    """SwiGLU: silu(gate) * up, gate and up side by side in one fused projection's output."""
    return _core.silu_mul(gate_up)


def relu_mul(gate_up: np.ndarray) -> np.ndarray:
    """relu(gate) * up (ReLU-family Llama checkpoints, ``hidden_act: relu``)."""
    gate, up = np.split(gate_up, 2, axis=-1)
    return np.maximum(gate, np.float32(0)) * up


def gelu_tanh_mul(gate_up: np.ndarray) -> np.ndarray:
    """GeGLU: gelu_tanh(gate) * up (tanh-approximate GELU, as Gemma's gelu_pytorch_tanh)."""
    return _core.gelu_tanh_mul(gate_up)


GATED_ACTIVATIONS = {"silu": silu_mul, "gelu_tanh": gelu_tanh_mul, "relu": relu_mul}


def mlp_activation(cfg: ModelConfig):
    """The gated MLP's activation of ``cfg``: act(gate) * up over the fused gate_up output (GPT-OSS's
    clamped SwiGLU: the routed experts' own op, moe.h)."""
    if cfg.hidden_act == "clamped_swiglu":
        return lambda gate_up: _core.clamped_swiglu_mul(gate_up, cfg.swiglu_limit, cfg.swiglu_alpha)
    return GATED_ACTIVATIONS[cfg.hidden_act]


class CappedLinear(Linear):
    """A Linear whose outputs are soft-capped, cap * tanh(y / cap) (Gemma 2's lm head)."""

    __slots__ = ("softcap",)

    def __init__(self, *args, softcap: float, **kwargs):
        super().__init__(*args, **kwargs)
        self.softcap = float(softcap)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return _core.softcap(super().__call__(x), self.softcap)


class Rope:
    """Rotary position embedding (rotate-half form, as Qwen2 and Llama), tables precomputed.
    ``local``: the sliding layers' RoPE of an architecture that gives them their own base
    (``rope_local_theta``, unscaled)."""

    def __init__(self, cfg: ModelConfig, max_positions: int, inv_freq: Optional[np.ndarray] = None,
                 local: bool = False, head_dim: int = 0):
        d = head_dim or cfg.head_dim
        factor = 1.0
        if inv_freq is None:
            theta = cfg.rope_local_theta if local else cfg.rope_theta
            r = cfg.rotary_dim or d  # partial rotary: the rest at frequency 0 (see rotary_order)
            inv_freq = 1.0 / (theta ** (np.arange(0, r, 2, dtype=np.float64) / r))
            inv_freq, factor = _scaled_inv_freq(inv_freq, None if local else cfg.rope_scaling, max_positions,
                                                theta, r)
            inv_freq = np.concatenate([inv_freq, np.zeros((d - r) // 2)])
        elif np.shape(inv_freq) != (d // 2,):
            raise ValueError(f"RoPE frequencies must have shape ({d // 2},), got {np.shape(inv_freq)}")
        inv_freq = np.asarray(inv_freq, np.float64)
        angles = np.arange(max_positions, dtype=np.float64)[:, None] * inv_freq[None, :]
        self.cos = (np.cos(angles) * factor).astype(np.float32)   # [positions, d/2]
        self.sin = (np.sin(angles) * factor).astype(np.float32)

    def __call__(self, x: np.ndarray, start: int) -> np.ndarray:
        """x: [tokens, heads, head_dim] at positions start, start+1, ...; rotated in place."""
        n, half = x.shape[0], x.shape[2] // 2
        c = self.cos[start:start + n, None, :]
        s = self.sin[start:start + n, None, :]
        x1, x2 = x[..., :half].copy(), x[..., half:]
        x[..., :half] = x1 * c - x2 * s
        x[..., half:] = x2 * c + x1 * s
        return x


def _scaled_inv_freq(inv_freq: np.ndarray, scaling: Optional[dict], max_positions: int, theta: float = 0.0,
                     dim: int = 0):
    """(frequencies, factor of cos / sin) under ``scaling`` (of a RoPE of base ``theta`` over
    ``dim`` dimensions)."""
    if not scaling:
        return inv_freq, 1.0
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "linear":
        return inv_freq / scaling["factor"], 1.0
    if kind == "longrope":  # the long factors when the context may pass the pretraining length
        long = max_positions > scaling["original_max_position_embeddings"]
        ext = np.asarray(scaling["long_factor" if long else "short_factor"], np.float64)
        return inv_freq / ext, scaling["attention_factor"]
    if kind == "yarn":
        return _yarn_inv_freq(inv_freq, scaling, theta, dim), scaling["attention_factor"]
    if kind == "llama3":  # long-wavelength components slowed down, a smooth ramp in between
        factor, lo, hi = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        old = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        smooth = np.clip((old / wavelen - lo) / (hi - lo), 0.0, 1.0)
        return np.where(wavelen < old / hi, inv_freq,
                        np.where(wavelen > old / lo, inv_freq / factor,
                                 (1 - smooth) * inv_freq / factor + smooth * inv_freq)), 1.0
    return inv_freq, 1.0


def _yarn_inv_freq(inv_freq: np.ndarray, scaling: dict, theta: float, dim: int) -> np.ndarray:
    """YaRN's frequencies (config._yarn): the original ones where a dimension turns more than
    beta_fast times within the pretraining length, divided by the factor where it turns fewer
    than beta_slow times, a linear ramp over the dimensions between."""
    old = scaling["original_max_position_embeddings"]

    def dim_of(rotations):  # the dimension that turns `rotations` times over `old` positions
        return dim * math.log(old / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    lo, hi = dim_of(scaling["beta_fast"]), dim_of(scaling["beta_slow"])
    if scaling["truncate"]:
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, dim - 1)
    hi = hi + 0.001 if lo == hi else hi
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - lo) / (hi - lo), 0.0, 1.0)
    keep = 1.0 - ramp  # the share of the original frequency
    return inv_freq / scaling["factor"] * (1.0 - keep) + inv_freq * keep


def _per_head_norm(qkv: np.ndarray, c0: int, c1: int, weight: np.ndarray, eps: float) -> None:
    """RMSNorm of each ``len(weight)``-wide group of columns [c0, c1) of ``qkv``, in place: each
    head (a head_dim weight), or the whole projection (OLMoE's, c1 - c0 wide)."""
    d = weight.shape[0]
    x = np.ascontiguousarray(qkv[:, c0:c1]).reshape(-1, d)
    qkv[:, c0:c1] = rms_norm(x, weight, eps).reshape(qkv.shape[0], c1 - c0)


class Attention:
    def __init__(self, cfg: ModelConfig, layer: int, qkv: Linear, o: Linear, rope: Rope,
                 q_norm: Optional[np.ndarray] = None, k_norm: Optional[np.ndarray] = None,
                 sinks: Optional[np.ndarray] = None):
        self.cfg, self.layer, self.qkv, self.o, self.rope = cfg, layer, qkv, o, rope
        self.q_norm, self.k_norm = q_norm, k_norm
        if sinks is not None:  # one logit per query head (GPT-OSS), in every softmax's denominator
            sinks = np.ascontiguousarray(sinks, np.float32)
            if sinks.shape != (cfg.num_heads,) or not np.isfinite(sinks).all():
                raise ValueError(f"layer {layer}: attention sinks must be {cfg.num_heads} finite numbers")
        self.sinks = sinks
        self.scale = np.float32(cfg.attn_scale if cfg.attn_scale is not None else 1.0 / math.sqrt(cfg.head_dim))
        self.window = cfg.window(layer)
        self.softcap = float(cfg.attn_softcap or 0.0)

    def __call__(self, x: np.ndarray, cache: KVCache, start: int) -> np.ndarray:
        return self.o(self.attend(self.qkv(x), cache, start))

    def attend(self, qkv: np.ndarray, cache: KVCache, start: int) -> np.ndarray:
        """The heads' outputs [tokens, q_size] of projected rows ``qkv`` at positions start..:
        head norms, RoPE, the cache updated, attention over it."""
        cfg = self.cfg
        if self.q_norm is not None:
            _per_head_norm(qkv, 0, cfg.q_size, self.q_norm, cfg.rms_norm_eps)
        if self.k_norm is not None:
            _per_head_norm(qkv, cfg.q_size, cfg.q_size + cfg.kv_size, self.k_norm, cfg.rms_norm_eps)
        if cfg.clip_qkv is not None:  # q, k and v alike, after the norms (OLMoE)
            np.clip(qkv, -cfg.clip_qkv, cfg.clip_qkv, out=qkv)
        k, v, ring = cache.k[self.layer], cache.v[self.layer], cache.windows[self.layer]
        rope, heads, scale = self.rope, cfg.num_heads, float(self.scale)
        if qkv.shape[0] == 1:  # decode: RoPE, cache update and attention in one call
            return _core.attend_one(qkv, rope.cos, rope.sin, start, k, v, heads, scale,
                                    window=ring, softcap=self.softcap, sinks=self.sinks)
        # prefill: RoPE, cache update and causal attention (blocked, online softmax) in one call
        if not ring or start + qkv.shape[0] <= ring:
            return _core.attend_prefill(qkv, rope.cos, rope.sin, start, k, v, heads, scale,
                                        window=self.window, softcap=self.softcap, sinks=self.sinks)
        return _ring_prefill(qkv, rope, start, k, v, heads, scale, ring, self.softcap, self.sinks)


class GatedAttention(Attention):
    """Attention whose heads' outputs are gated before ``o``: times sigmoid(gate), the gate a
    q-sized projection of the same input (Qwen3.5). ``qkv`` projects [q, k, v, gate] along N."""

    def __call__(self, x: np.ndarray, cache: KVCache, start: int) -> np.ndarray:
        cfg = self.cfg
        y = self.qkv(x)
        width = cfg.q_size + 2 * cfg.kv_size
        heads = self.attend(np.ascontiguousarray(y[:, :width]), cache, start)
        return self.o(_core.sigmoid_mul(heads, np.ascontiguousarray(y[:, width:])))  # the decode step's own op


def sigmoid(x: np.ndarray) -> np.ndarray:
    return (1.0 / (1.0 + np.exp(-x))).astype(np.float32, copy=False)


def rotary_order(head_dim: int, rotary_dim: int) -> np.ndarray:
    """The order of a head's dimensions under partial rotary (the leading ``rotary_dim`` rotate
    in rotate-half pairs (j, j + rotary_dim / 2), the rest pass through) that makes it full-width
    rotate-half: pairs (j, j + head_dim / 2), the passing dimensions at frequency 0 (cos 1, sin 0).
    Queries and keys alike reordered (and their head norms), so attention's dot products are the
    same; the RoPE tables carry the zero frequencies (``Rope``). ``new[j] = old[order[j]]``."""
    d, r = head_dim, rotary_dim
    if not r or r == d:
        return np.arange(d)
    if r % 2 or (d - r) % 2 or not 0 < r < d:
        raise ValueError(f"partial rotary of {r} of {d} dimensions: both must be even, {r} < {d}")
    rh, rest = r // 2, (d - r) // 2
    return np.concatenate([np.arange(rh), r + np.arange(rest), rh + np.arange(rh), r + rest + np.arange(rest)])


def _ring_prefill(qkv, rope: Rope, start: int, k: np.ndarray, v: np.ndarray, heads: int, scale: float,
                  window: int, softcap: float, sinks: Optional[np.ndarray] = None) -> np.ndarray:
    """Prefill of a sliding-window layer whose ring (``window`` positions) the prompt wraps:
    attention over a scratch cache of the window before ``start`` (unrolled from the ring) and
    the new positions, then the ring refilled with the last ``window`` of them."""
    n, first = qkv.shape[0], max(0, start - window + 1)  # the first position the new rows see
    # the scratch starts at a multiple of the key block (zeros before the window, weighing
    # nothing) so that its key blocks fall where a full cache's would: a row's sums then do not
    # depend on where the prompt was cut into chunks (cached prefixes are reused exactly)
    base = first // _core.PREFILL_KEY_BLOCK * _core.PREFILL_KEY_BLOCK
    past = start - base
    shape = (k.shape[0], past + n, k.shape[2])
    tk, tv = np.zeros(shape, k.dtype), np.zeros(shape, v.dtype)
    slots = np.arange(first, start) % window
    tk[:, first - base:past], tv[:, first - base:past] = k[:, slots], v[:, slots]
    out = _core.attend_prefill(qkv, rope.cos[base:], rope.sin[base:], past, tk, tv, heads, scale,
                               window=window, softcap=softcap, sinks=sinks)
    keep = min(window, past + n)
    slots = np.arange(start + n - keep, start + n) % window
    k[:, slots], v[:, slots] = tk[:, past + n - keep:], tv[:, past + n - keep:]
    return out


class Block:
    def __init__(self, cfg: ModelConfig, attention: Attention, gate_up: Linear, down: Linear,
                 input_norm: np.ndarray, post_norm: np.ndarray, attn_out_norm: Optional[np.ndarray] = None,
                 mlp_out_norm: Optional[np.ndarray] = None):
        self.cfg, self.attention, self.gate_up, self.down = cfg, attention, gate_up, down
        self.input_norm, self.post_norm = input_norm, post_norm
        self.attn_out_norm, self.mlp_out_norm = attn_out_norm, mlp_out_norm
        self.act = mlp_activation(cfg)

    def __call__(self, h: np.ndarray, cache: KVCache, start: int) -> np.ndarray:
        eps = self.cfg.rms_norm_eps
        h = h + self._out(self.attention(rms_norm(h, self.input_norm, eps), cache, start), self.attn_out_norm)
        return h + self._out(self.mlp(rms_norm(h, self.post_norm, eps)), self.mlp_out_norm)

    def mlp(self, x: np.ndarray) -> np.ndarray:
        return self.down(self.act(self.gate_up(x)))

    def _out(self, y: np.ndarray, norm: Optional[np.ndarray]) -> np.ndarray:
        return y if norm is None else rms_norm(y, norm, self.cfg.rms_norm_eps)
