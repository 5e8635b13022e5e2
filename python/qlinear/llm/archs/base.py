"""The shared part of every architecture: the Llama / Qwen2 block's tensor names and the
features a family may switch on (``ModelConfig`` fields)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

# activations as config.json names them -> ours ("silu": SwiGLU, "gelu_tanh": GeGLU)
ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh"}

# Our per-layer tensor -> the checkpoint's tensors fused along N (under model.layers.{i}.).
# Linear layers' biases are the same names with ".bias".
LLAMA_LAYER = {
    "input_norm": ("input_layernorm.weight",),
    "post_norm": ("post_attention_layernorm.weight",),   # the MLP's input norm
    "qkv": ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
    "o": ("self_attn.o_proj.weight",),
    "gate_up": ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
    "down": ("mlp.down_proj.weight",),
}
LINEARS = ("qkv", "o", "gate_up", "down")
ROUTED_LAYER = {k: v for k, v in LLAMA_LAYER.items() if k not in ("gate_up", "down")}  # the MLP: experts


MIXER_LINEARS = {"attention": ("qkv", "o"), "delta": ("delta_in", "delta_out"), "conv": ("conv_in", "conv_out")}


def layer_linears(cfg, layer: int = 0) -> list:
    """Our names of layer ``layer``'s quantized linears: its token mixer's (attention: qkv, o;
    Gated DeltaNet: delta_in, delta_out; short conv: conv_in, conv_out), then the MLP's: gate_up, down, or with routed experts
    every expert's (``experts.E.gate_up`` / ``experts.E.down``; the router stays float), or both
    (Gemma 4), and Gemma 4's per-layer input gate and projection."""
    mixer = list(MIXER_LINEARS[cfg.mixer(layer)])
    ple = ["ple_gate", "ple_proj"] if cfg.per_layer_input_size else []  # Gemma 4's per-layer input gate
    if not cfg.num_experts:
        return mixer + ["gate_up", "down"] + ple
    shared = ["shared_gate_up", "shared_down"] if cfg.shared_expert_size else []
    dense = ["gate_up", "down"] if cfg.dense_and_experts else []
    return (mixer + dense + [f"experts.{e}.{n}" for e in range(cfg.num_experts) for n in ("gate_up", "down")] + shared
            + ple)
QK_NORMS = {"q_norm": ("self_attn.q_norm.weight",), "k_norm": ("self_attn.k_norm.weight",)}
# where a routed MLP's tensors are (under model.layers.{i}.; "{e}": the expert's index)
QWEN_EXPERTS = {"router": "mlp.gate.weight", "expert": "mlp.experts.{e}.", "gate": "gate_proj.weight",
                "up": "up_proj.weight", "down": "down_proj.weight"}


def activation(hf: dict, where: str, key: str = "hidden_act") -> str:
    name = hf.get(key, "silu")
    if name not in ACTIVATIONS:
        raise ValueError(f"{where}: activation {name!r} is not supported ({', '.join(ACTIVATIONS)})")
    return ACTIVATIONS[name]


def layer_types(hf: dict, n: int, where: str, default: Callable[[int], bool]) -> Optional[tuple]:
    """Per layer "sliding" or "full" (None: no sliding window at all): config.json's
    ``layer_types`` when it has them, else ``default(i)`` (is layer i sliding?) when the config
    has a ``sliding_window``."""
    types = hf.get("layer_types")
    if types is not None:
        names = {"sliding_attention": "sliding", "full_attention": "full"}
        if not isinstance(types, list) or len(types) != n or any(t not in names for t in types):
            raise ValueError(f"{where}: layer_types must list {n} of {', '.join(names)} (got {types!r})")
        out = tuple(names[t] for t in types)
    elif hf.get("sliding_window"):
        out = tuple("sliding" if default(i) else "full" for i in range(n))
    else:
        return None
    if "sliding" in out:
        w = hf.get("sliding_window")
        if isinstance(w, bool) or not isinstance(w, int) or w < 1:
            raise ValueError(f"{where}: sliding layers need a positive sliding_window (got {w!r})")
        return out
    return None


@dataclass(frozen=True)
class Arch:
    model_type: str
    hf_class: str                           # transformers' class of the checkpoint
    layer: dict = field(default_factory=lambda: dict(LLAMA_LAYER))
    norm_offset: float = 0.0                # RMSNorm weights stored as w - 1 (Gemma): added at load
    # config.json -> the ModelConfig fields of this family (beyond the shared shape)
    features: Callable[[dict, str], dict] = lambda hf, where: {}
    attention_bias: Optional[bool] = None   # always (Qwen2) / never; None: config.json's attention_bias
    tie_word_embeddings: bool = False       # the default when config.json leaves it out
    experts: dict = field(default_factory=lambda: dict(QWEN_EXPERTS))  # routed MLPs' tensor names
    # hybrids: each token mixer's tensors (``ModelConfig.mixer``), beside ``layer``'s in every layer
    mixer_layers: dict = field(default_factory=dict)
    raw_norms: tuple = ()                   # norms stored as they are, whatever norm_offset says
    final_norm: str = "model.norm.weight"   # the final norm's tensor (LFM2: model.embedding_norm)
