"""The parts of a decoder block: Linear (on qlinear kernels), RMSNorm, RoPE, grouped-query
attention over a preallocated KV cache, and the SwiGLU MLP. Activations are float32 numpy
arrays [tokens, features]."""

from __future__ import annotations

import math
import mmap
from typing import Optional, Union

import numpy as np

from .. import _core
from .._ops import act_block_size, core_handle, matmul_array
from .._packed import PackedWeight
from .._scheme import DEFAULT_ACT_BLOCK, ActBlock
from .config import ModelConfig


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


def mlp_activation(cfg: ModelConfig):
    return relu_mul if cfg.hidden_act == "relu" else silu_mul


class Rope:
    """Rotary position embedding (rotate-half form, as Qwen2 and Llama), tables precomputed."""

    def __init__(self, cfg: ModelConfig, max_positions: int, inv_freq: Optional[np.ndarray] = None):
        d = cfg.head_dim
        if inv_freq is None:
            inv_freq = 1.0 / (cfg.rope_theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
            inv_freq = _scaled_inv_freq(inv_freq, cfg.rope_scaling)
        elif np.shape(inv_freq) != (d // 2,):
            raise ValueError(f"RoPE frequencies must have shape ({d // 2},), got {np.shape(inv_freq)}")
        inv_freq = np.asarray(inv_freq, np.float64)
        angles = np.arange(max_positions, dtype=np.float64)[:, None] * inv_freq[None, :]
        self.cos = np.cos(angles).astype(np.float32)   # [positions, d/2]
        self.sin = np.sin(angles).astype(np.float32)

    def __call__(self, x: np.ndarray, start: int) -> np.ndarray:
        """x: [tokens, heads, head_dim] at positions start, start+1, ...; rotated in place."""
        n, half = x.shape[0], x.shape[2] // 2
        c = self.cos[start:start + n, None, :]
        s = self.sin[start:start + n, None, :]
        x1, x2 = x[..., :half].copy(), x[..., half:]
        x[..., :half] = x1 * c - x2 * s
        x[..., half:] = x2 * c + x1 * s
        return x


def _scaled_inv_freq(inv_freq: np.ndarray, scaling: Optional[dict]) -> np.ndarray:
    if not scaling:
        return inv_freq
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "linear":
        return inv_freq / scaling["factor"]
    if kind == "llama3":  # long-wavelength components slowed down, a smooth ramp in between
        factor, lo, hi = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        old = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        smooth = np.clip((old / wavelen - lo) / (hi - lo), 0.0, 1.0)
        return np.where(wavelen < old / hi, inv_freq,
                        np.where(wavelen > old / lo, inv_freq / factor,
                                 (1 - smooth) * inv_freq / factor + smooth * inv_freq))
    return inv_freq


def _lazy_zeros(shape) -> np.ndarray:
    """A zero float32 array whose pages become resident only when written, 4 KiB at a time: an
    anonymous mapping with transparent huge pages off (with them, the first position written in
    each head's slab would make 2 MiB resident)."""
    nbytes = int(np.prod(shape)) * 4
    if nbytes == 0:
        return np.zeros(shape, np.float32)
    buf = mmap.mmap(-1, nbytes)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        buf.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(buf, np.float32).reshape(shape)


class KVCache:
    """Keys and values of every layer, preallocated for ``capacity`` positions:
    [layers, kv_heads, capacity, head_dim] float32 each; memory becomes resident as positions
    are filled."""

    def __init__(self, cfg: ModelConfig, capacity: int):
        shape = (cfg.num_layers, cfg.num_kv_heads, capacity, cfg.head_dim)
        self.k = _lazy_zeros(shape)
        self.v = _lazy_zeros(shape)
        self.capacity = capacity
        self.length = 0          # positions filled (the same for every layer after a forward)
        self.ids: list[int] = []  # the tokens those positions hold (for prefix reuse)

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes


class Attention:
    def __init__(self, cfg: ModelConfig, layer: int, qkv: Linear, o: Linear, rope: Rope):
        self.cfg, self.layer, self.qkv, self.o, self.rope = cfg, layer, qkv, o, rope
        self.scale = np.float32(1.0 / math.sqrt(cfg.head_dim))

    def __call__(self, x: np.ndarray, cache: KVCache, start: int) -> np.ndarray:
        cfg = self.cfg
        qkv = self.qkv(x)
        if x.shape[0] == 1:  # decode: RoPE, cache update and attention in one call
            return self.o(_core.attend_one(qkv, self.rope.cos, self.rope.sin, start, cache.k[self.layer],
                                           cache.v[self.layer], cfg.num_heads, float(self.scale)))
        # prefill: RoPE, cache update and causal attention (blocked, online softmax) in one call
        return self.o(_core.attend_prefill(qkv, self.rope.cos, self.rope.sin, start, cache.k[self.layer],
                                           cache.v[self.layer], cfg.num_heads, float(self.scale)))


class Block:
    def __init__(self, cfg: ModelConfig, attention: Attention, gate_up: Linear, down: Linear,
                 input_norm: np.ndarray, post_norm: np.ndarray):
        self.cfg, self.attention, self.gate_up, self.down = cfg, attention, gate_up, down
        self.input_norm, self.post_norm = input_norm, post_norm
        self.act = mlp_activation(cfg)

    def __call__(self, h: np.ndarray, cache: KVCache, start: int) -> np.ndarray:
        eps = self.cfg.rms_norm_eps
        h = h + self.attention(rms_norm(h, self.input_norm, eps), cache, start)
        return h + self.down(self.act(self.gate_up(rms_norm(h, self.post_norm, eps))))


def decode_step(blocks: list, norm: np.ndarray, lm_head: Linear, cache: KVCache):
    """The decode step of the whole model as one compiled call (``_core.DecodeStep``: norms,
    projections, RoPE, attention over ``cache``, MLP and residuals of every block, then the final
    norm and the lm head, without the GIL), or None when a layer's weights are kept in float."""
    linears = [lm_head] + [m for b in blocks for m in (b.attention.qkv, b.attention.o, b.gate_up, b.down)]
    if not blocks or any(not isinstance(m.weight, PackedWeight) for m in linears):
        return None
    if blocks[0].cfg.hidden_act != "silu":  # the compiled step's MLP is SwiGLU
        return None

    def spec(m: Linear):
        return (core_handle(m.weight), m.bias, m.act == "int8", int(m._block))

    cfg, rope = blocks[0].cfg, blocks[0].attention.rope
    layers = [(spec(b.attention.qkv), spec(b.attention.o), spec(b.gate_up), spec(b.down),
               b.input_norm, b.post_norm) for b in blocks]
    return _core.decode_step(layers, norm, spec(lm_head), cache.k, cache.v, rope.cos, rope.sin,
                             cfg.num_heads, cfg.rms_norm_eps, float(blocks[0].attention.scale))
