"""The shape of a decoder-only model, read from a Hugging Face ``config.json``: the shared
geometry, and the features its architecture switches on (see ``archs``)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Optional

from . import archs

ROPE_TYPES = ("default", "llama3", "linear", "longrope", "yarn")


@dataclass(frozen=True)
class ModelConfig:
    arch: str                      # config.json's model_type (a key of archs.ARCHS)
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool           # q/k/v projections carry a bias (Qwen2 always)
    mlp_bias: bool = False
    rope_scaling: Optional[dict] = None
    bos_token_id: Optional[int] = None
    eos_token_id: Optional[Any] = None   # int or list of ints
    # -- architecture features (the defaults are Qwen2's / Llama's block) --
    # MLP: "silu" (SwiGLU), "gelu_tanh" (GeGLU), "relu" (ReLU Llama) or "clamped_swiglu" (GPT-OSS:
    # gate clamped above and up on both sides at swiglu_limit, (up + 1) * gate * sigmoid(swiglu_alpha * gate))
    hidden_act: str = "silu"
    qk_norm: bool = False                  # RMSNorm of each query / key head before RoPE
    qk_norm_whole: bool = False            # ... of the whole q / k projection instead (OLMoE)
    clip_qkv: Optional[float] = None       # q, k, v clamped to [-c, c] after those norms (OLMoE)
    sandwich_norms: bool = False           # RMSNorm of the attention's / MLP's output too
    embed_scale: bool = False              # embeddings times sqrt(hidden_size)
    attn_scale: Optional[float] = None     # queries' scale (None: head_dim ** -0.5)
    attn_softcap: Optional[float] = None   # attention scores soft-capped: c * tanh(s / c)
    final_softcap: Optional[float] = None  # logits soft-capped
    layer_types: Optional[tuple] = None    # "sliding" / "full" per layer (None: all full)
    sliding_window: Optional[int] = None   # positions a sliding layer sees, its own included
    rope_local_theta: Optional[float] = None  # sliding layers' own RoPE base, unscaled (Gemma 3)
    attn_sinks: bool = False               # a learned logit per head in each softmax's denominator (GPT-OSS)
    swiglu_limit: float = 0.0
    swiglu_alpha: float = 1.702
    # routed experts (Qwen3-MoE, OLMoE, Mixtral, Qwen2-MoE): every layer's MLP is num_experts SwiGLU experts of
    # moe_intermediate_size, a token runs the experts_per_token its router ranks highest
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    shared_expert_size: int = 0            # a shared expert every token runs, gated (Qwen2-MoE)
    # hybrids: the token mixer per layer, "attention", "delta" (Qwen3.5's Gated DeltaNet: a causal
    # depthwise conv over q / k / v, then the gated delta rule over a state of delta_k_dim x
    # delta_v_dim per value head) or "conv" (LFM2's short convolution, gated); None: attention
    # everywhere
    mixers: Optional[tuple] = None
    attn_output_gate: bool = False         # attention's output times sigmoid(gate), the gate a q-sized projection
    rotary_dim: int = 0                    # partial rotary: the leading rotary_dim of each head rotate (0: all)
    delta_k_heads: int = 0
    delta_v_heads: int = 0
    delta_k_dim: int = 0
    delta_v_dim: int = 0
    conv_kernel: int = 0                   # the delta / conv layers' causal conv width
    # value head j reads key head j % key heads (llama.cpp's files: value heads "tiled"); else
    # j // (value heads / key heads), Hugging Face's grouping
    delta_tiled_heads: bool = False
    # -- Gemma 4 --
    # per-layer attention shapes (full layers' heads wider, fewer KV heads); None: head_dim and
    # num_kv_heads everywhere
    layer_head_dims: Optional[tuple] = None
    layer_kv_heads: Optional[tuple] = None
    # layer i attends over the keys and values of layer kv_layers[i]: itself, or the last earlier
    # layer of its type that computes its own (KV sharing: no k / v projections of its own)
    kv_layers: Optional[tuple] = None
    values_from_keys: bool = False        # full layers' values are their keys' projection (attention_k_eq_v)
    value_norm: bool = False              # values RMS-normed per head, without a weight
    rope_proportion: float = 0.0          # full layers' proportional RoPE: this share of the frequencies turn
    per_layer_input_size: int = 0         # per-layer embeddings: this many features per layer and token
    per_layer_vocab_size: int = 0
    layer_scalar: bool = False            # each block's output times a stored scalar
    double_wide_mlp: bool = False         # the layers that share KV have MLPs twice as wide
    dense_and_experts: bool = False       # the routed experts run beside a dense MLP, not instead of it

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def layer_head_dim(self, layer: int) -> int:
        return self.head_dim if self.layer_head_dims is None else self.layer_head_dims[layer]

    def layer_kv_heads_of(self, layer: int) -> int:
        return self.num_kv_heads if self.layer_kv_heads is None else self.layer_kv_heads[layer]

    def kv_layer(self, layer: int) -> int:
        """The layer whose keys and values layer ``layer`` attends over (itself, unless shared)."""
        return layer if self.kv_layers is None else self.kv_layers[layer]

    def mlp_size(self, layer: int) -> int:
        """Layer ``layer``'s dense MLP width."""
        wide = self.double_wide_mlp and self.kv_layer(layer) != layer
        return self.intermediate_size * (2 if wide else 1)

    def mixer(self, layer: int) -> str:
        """Layer ``layer``'s token mixer: "attention", "delta" or "conv"."""
        return "attention" if self.mixers is None else self.mixers[layer]

    @property
    def has_state(self) -> bool:
        """Some layer carries a recurrent state (not KV rows) from position to position."""
        return self.mixers is not None and any(m != "attention" for m in self.mixers)

    @property
    def delta_conv_dim(self) -> int:
        """Channels of a delta layer's conv: q, k and v side by side."""
        return 2 * self.delta_k_heads * self.delta_k_dim + self.delta_v_heads * self.delta_v_dim

    def window(self, layer: int) -> int:
        """Positions layer ``layer`` attends over (0: all before it)."""
        if self.layer_types is None or self.layer_types[layer] != "sliding":
            return 0
        return int(self.sliding_window)

    @classmethod
    def from_hf(cls, hf: dict, where: str = "config.json") -> "ModelConfig":
        """From a transformers config dict; unknown architectures raise ValueError naming it."""
        def need(key, kind=int):
            v = hf.get(key)
            if isinstance(v, bool) or not isinstance(v, kind) or (kind is int and v <= 0):
                raise ValueError(f"{where}: field {key!r} is missing or invalid ({v!r})")
            return v

        hf = archs.text_part(hf, where)  # a multimodal checkpoint's text model
        arch = archs.get(hf.get("model_type"), where)
        hidden, heads, layers = need("hidden_size"), need("num_attention_heads"), need("num_hidden_layers")
        kv_heads = hf.get("num_key_value_heads") or heads
        head_dim = hf.get("head_dim") or hidden // heads
        if heads % kv_heads:
            raise ValueError(f"{where}: {heads} attention heads are not a multiple of {kv_heads} KV heads")
        # transformers 5 writes RoPE settings as one "rope_parameters" object
        rope = hf.get("rope_parameters") if isinstance(hf.get("rope_parameters"), dict) else {}
        theta = hf.get("rope_theta", rope.get("rope_theta", 10000.0))
        scaling = hf.get("rope_scaling")
        if scaling is None and rope.get("rope_type", "default") != "default":
            scaling = rope
        max_positions = int(hf.get("max_position_embeddings", 4096))
        if scaling is not None:
            kind = scaling.get("rope_type", scaling.get("type", "default"))
            kind = "longrope" if kind == "su" else kind  # Phi-3's first name for it
            if kind not in ROPE_TYPES:
                raise ValueError(f"{where}: rope scaling {kind!r} is not supported ({', '.join(ROPE_TYPES)})")
            if kind == "longrope":
                scaling = _longrope(scaling, hf, max_positions, head_dim, where)
            if kind == "yarn":
                scaling = _yarn(scaling, hf, max_positions, where)
        features = arch.features(hf, where)
        bias = arch.attention_bias if arch.attention_bias is not None else bool(hf.get("attention_bias", False))
        return cls(**{**dict(
            arch=arch.model_type, hidden_size=hidden,
            # a routed model without dense layers may leave the dense width out (Qwen3.5-MoE)
            intermediate_size=(features["moe_intermediate_size"] if "intermediate_size" not in hf
                               and features.get("num_experts") else need("intermediate_size")),
            num_layers=layers, num_heads=heads, num_kv_heads=int(kv_heads),
            head_dim=int(head_dim), vocab_size=need("vocab_size"),
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            rope_theta=float(theta),
            max_position_embeddings=max_positions,
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", arch.tie_word_embeddings)),
            attention_bias=bias, rope_scaling=scaling,
            bos_token_id=hf.get("bos_token_id"), eos_token_id=hf.get("eos_token_id")),
            **features})  # (a family's features may also say how it names shared fields: LFM2's norm_eps)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict, where: str = "model config") -> "ModelConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        missing = {f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING} - set(d)
        if missing or not set(d) <= names:
            raise ValueError(f"{where}: bad model config (missing {sorted(missing)}, "
                             f"unknown {sorted(set(d) - names)})")
        for key in ("layer_types", "mixers", "layer_head_dims", "layer_kv_heads", "kv_layers"):  # lists in JSON
            if d.get(key) is not None:
                d = {**d, key: tuple(d[key])}
        return cls(**d)


def _longrope(scaling: dict, hf: dict, max_positions: int, head_dim: int, where: str) -> dict:
    """LongRoPE (Phi-3): per-frequency divisors, short ones within the pretraining length and long
    ones past it, and cos / sin scaled by an attention factor. Completed with the pretraining
    length (config.json keeps it beside rope_scaling) and that factor, as transformers derives it."""
    original = hf.get("original_max_position_embeddings") or scaling.get("original_max_position_embeddings")
    for key in ("short_factor", "long_factor"):
        v = scaling.get(key)
        if not isinstance(v, list) or len(v) != head_dim // 2:
            raise ValueError(f"{where}: longrope {key} must list {head_dim // 2} numbers")
    if original:
        factor = max_positions / original
    else:
        original, factor = max_positions, scaling.get("factor", 1.0)
    attention = scaling.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    return {**scaling, "rope_type": "longrope", "original_max_position_embeddings": int(original),
            "attention_factor": float(attention)}


def _yarn(scaling: dict, hf: dict, max_positions: int, where: str) -> dict:
    """YaRN (GPT-OSS): frequencies between the interpolated (divided by ``factor``) and the
    original ones along a ramp over the dimensions whose rotations within the pretraining length
    fall between ``beta_slow`` and ``beta_fast``, and cos / sin scaled by an attention factor.
    Completed as transformers completes it (the factor from the lengths when absent, the
    attention factor 0.1 ln(factor) + 1 or the mscale ratio)."""
    original = scaling.get("original_max_position_embeddings") or hf.get("original_max_position_embeddings")
    if isinstance(original, bool) or not isinstance(original, int) or original < 1:
        raise ValueError(f"{where}: yarn needs original_max_position_embeddings (got {original!r})")
    factor = scaling.get("factor")
    factor = max_positions / original if factor is None else factor
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor > 0:
        raise ValueError(f"{where}: yarn factor must be a positive number (got {factor!r})")

    def mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = scaling.get("attention_factor")
    if attention is None:
        m, m_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
        attention = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
    return {**scaling, "rope_type": "yarn", "factor": float(factor), "original_max_position_embeddings": original,
            "attention_factor": float(attention), "beta_fast": float(scaling.get("beta_fast") or 32),
            "beta_slow": float(scaling.get("beta_slow") or 1), "truncate": bool(scaling.get("truncate", True))}
