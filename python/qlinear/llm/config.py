"""The shape of a decoder-only model, read from a Hugging Face ``config.json``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional

ARCHITECTURES = {"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM"}
ROPE_TYPES = ("default", "llama3", "linear")


@dataclass(frozen=True)
class ModelConfig:
    arch: str                      # "qwen2" or "llama"
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
    hidden_act: str = "silu"             # the MLP's gate activation: "silu" (SwiGLU), or "relu" (Llama)

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @classmethod
    def from_hf(cls, hf: dict, where: str = "config.json") -> "ModelConfig":
        """From a transformers config dict; unknown architectures raise ValueError naming it."""
        def need(key, kind=int):
            v = hf.get(key)
            if isinstance(v, bool) or not isinstance(v, kind) or (kind is int and v <= 0):
                raise ValueError(f"{where}: field {key!r} is missing or invalid ({v!r})")
            return v

        model_type = hf.get("model_type")
        if model_type not in ARCHITECTURES:
            raise ValueError(f"{where}: model_type {model_type!r} is not supported "
                             f"(supported: {', '.join(ARCHITECTURES)})")
        hidden, heads = need("hidden_size"), need("num_attention_heads")
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
        if scaling is not None:
            kind = scaling.get("rope_type", scaling.get("type", "default"))
            if kind not in ROPE_TYPES:
                raise ValueError(f"{where}: rope scaling {kind!r} is not supported ({', '.join(ROPE_TYPES)})")
        hidden_act = hf.get("hidden_act", "silu")
        if hidden_act != "silu" and not (hidden_act == "relu" and model_type == "llama"):
            raise ValueError(f"{where}: activation {hidden_act!r} is not supported (silu; relu for llama)")
        return cls(
            arch=model_type, hidden_size=hidden, intermediate_size=need("intermediate_size"),
            num_layers=need("num_hidden_layers"), num_heads=heads, num_kv_heads=int(kv_heads),
            head_dim=int(head_dim), vocab_size=need("vocab_size"),
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            rope_theta=float(theta),
            max_position_embeddings=int(hf.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            attention_bias=model_type == "qwen2" or bool(hf.get("attention_bias", False)),
            mlp_bias=bool(hf.get("mlp_bias", False)), rope_scaling=scaling,
            bos_token_id=hf.get("bos_token_id"), eos_token_id=hf.get("eos_token_id"),
            hidden_act=hidden_act,
        )

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict, where: str = "model config") -> "ModelConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        missing = {f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING} - set(d)
        if missing or not set(d) <= names:
            raise ValueError(f"{where}: bad model config (missing {sorted(missing)}, "
                             f"unknown {sorted(set(d) - names)})")
        return cls(**d)
