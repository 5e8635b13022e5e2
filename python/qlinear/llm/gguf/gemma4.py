"""Gemma 4 (dense) as llama.cpp's converter writes it (``gemma4``): per-layer arrays where the
layers differ (``feed_forward_length``: double-wide MLPs; ``attention.head_count_kv``), the full
layers' head size as ``attention.key_length`` and the sliding ones' as ``key_length_swa``, the
full layers' proportional RoPE as a ``rope_freqs`` tensor of divisors (1 for the frequencies that
turn, 1e30 for those that do not), full layers with ``attention_k_eq_v`` without ``attn_v``,
norms stored as they are, the per-layer embeddings as ``per_layer_token_embd`` (read on disk like
the token embedding). The MoE variant's files are refused: their router and experts' scalings
(``ffn_gate_inp.scale``, ``ffn_down_exps.scale``) cannot be folded into codes moved as stored."""

from __future__ import annotations

import numpy as np

from .embedding import embedding_of
from .file import GGUFFile

A = "gemma4."


def config(f: GGUFFile, hf: dict) -> dict:
    """The transformers config fields of a gemma4 file beyond the shared ones."""
    n = hf["num_hidden_layers"]
    if f.meta(A + "expert_count", int):
        raise f.error("Gemma 4 MoE files are not supported (its router's and experts' scales would have to be "
                      "folded into weights kept as stored); its Hugging Face checkpoint is")
    pattern = f.meta(A + "attention.sliding_window_pattern", list, required=True)
    if len(pattern) != n:
        raise f.error(f"metadata {A}attention.sliding_window_pattern has {len(pattern)} entries for {n} layers")
    sliding = [bool(x) for x in pattern]
    types = ["sliding_attention" if s else "full_attention" for s in sliding]
    full = next((i for i, s in enumerate(sliding) if not s), None)
    if full is None:
        raise f.error("a Gemma 4 file needs a full-attention layer")
    d_full, d_swa = f.count(A + "attention.key_length"), f.count(A + "attention.key_length_swa")
    if f.count(A + "attention.value_length", d_full) != d_full or f.count(A + "attention.value_length_swa", d_swa) != d_swa:
        raise f.error("Gemma 4 needs values as wide as keys")
    if f.count(A + "rope.dimension_count_swa", d_swa) != d_swa:
        raise f.error("partial RoPE on Gemma 4's sliding layers is not supported")
    ff = _per_layer(f, A + "feed_forward_length", n)
    kv = _per_layer(f, A + "attention.head_count_kv", n)
    shared = f.meta(A + "attention.shared_kv_layers", int, 0)
    first = n - shared
    out = {"head_dim": d_swa, "global_head_dim": d_full, "intermediate_size": ff[0],
           "num_key_value_heads": kv[next(i for i, s in enumerate(sliding) if s)] if any(sliding) else kv[0],
           "layer_types": types, "sliding_window": f.count(A + "attention.sliding_window"),
           "num_kv_shared_layers": shared, "use_double_wide_mlp": any(x != ff[0] for x in ff),
           "hidden_activation": "gelu_pytorch_tanh",
           "final_logit_softcapping": f.meta(A + "final_logit_softcapping", float),
           "rope_parameters": {"sliding_attention": {"rope_type": "default",
                                                     "rope_theta": f.meta(A + "rope.freq_base_swa", float, 10000.0)},
                               "full_attention": {"rope_type": "proportional", "rope_theta": hf["rope_theta"],
                                                  "partial_rotary_factor": _turning_share(f, d_full)}}}
    if out["use_double_wide_mlp"] and ff != [ff[0]] * first + [2 * ff[0]] * shared:
        raise f.error(f"metadata {A}feed_forward_length {ff}: only the shared-KV layers may be twice as wide")
    full_kv = {kv[i] for i, s in enumerate(sliding) if not s}
    if len(full_kv) != 1 or any(kv[i] != out["num_key_value_heads"] for i, s in enumerate(sliding) if s):
        raise f.error(f"metadata {A}attention.head_count_kv {kv}: one count per layer type expected")
    # full layers without v projections: their values are their keys (attention_k_eq_v)
    k_eq_v = f"blk.{full}.attn_v.weight" not in f.tensors
    if k_eq_v:
        out.update(attention_k_eq_v=True, num_global_key_value_heads=full_kv.pop())
    elif full_kv.pop() != out["num_key_value_heads"]:
        raise f.error("full layers with KV heads of their own need attention_k_eq_v (no attn_v)")
    P = f.meta(A + "embedding_length_per_layer_input", int, 0)
    if P:
        t = f.tensors.get("per_layer_token_embd.weight")
        if t is None or len(t.shape) != 2 or int(t.shape[0]) != n * P:
            raise f.error(f"tensor 'per_layer_token_embd.weight' is missing or not [vocab, {n} x {P}]")
        out.update(hidden_size_per_layer_input=P, vocab_size_per_layer_input=int(t.shape[1]))
    return out


def _per_layer(f: GGUFFile, key: str, n: int) -> list:
    v = f.meta(key, (int, list), required=True)
    v = [int(x) for x in v] if isinstance(v, list) else [int(v)] * n
    if len(v) != n or min(v) < 1:
        raise f.error(f"metadata {key!r} must be a positive count or {n} of them (got {v!r})")
    return v


def _turning_share(f: GGUFFile, d: int) -> float:
    """The share of a full layer's frequencies that turn: ``rope_freqs`` divisors of 1, then 1e30."""
    factors = np.asarray(f.dequantize(f.tensor("rope_freqs.weight", (d // 2,))), np.float64)
    turning = int(np.sum(factors == 1.0))
    if not (factors[:turning] == 1.0).all() or not (factors[turning:] >= 1e29).all() or not turning:
        raise f.error("rope_freqs of a Gemma 4 file must be 1 for the turning frequencies, then 1e30")
    return 2 * turning / d


NORMS = {"input_norm": "attn_norm", "attn_out_norm": "post_attention_norm", "post_norm": "ffn_norm",
         "mlp_out_norm": "post_ffw_norm", "ple_norm": "post_norm"}


def layer_tensors(w, cfg, i: int) -> dict:
    """Layer ``i``'s tensors under our names (``w``: gguf.source's weight reader)."""
    b, o, H = f"blk.{i}.", f"layers.{i}.", cfg.hidden_size
    d, kv, heads = cfg.layer_head_dim(i), cfg.layer_kv_heads_of(i), cfg.num_heads
    own = cfg.kv_layer(i) == i
    qkv = [(b + "attn_q.weight", (heads * d, H), None)]
    if own:
        qkv.append((b + "attn_k.weight", (kv * d, H), None))
        if not (cfg.values_from_keys and not cfg.window(i)):
            qkv.append((b + "attn_v.weight", (kv * d, H), None))
    I = cfg.mlp_size(i)
    out = {o + "qkv": w.fused(o + "qkv", qkv),
           o + "o": w.fused(o + "o", [(b + "attn_output.weight", (H, heads * d), None)]),
           o + "gate_up": w.fused(o + "gate_up", [(b + "ffn_gate.weight", (I, H), None),
                                                  (b + "ffn_up.weight", (I, H), None)]),
           o + "down": w.fused(o + "down", [(b + "ffn_down.weight", (H, I), None)]),
           o + "q_norm": w.vector(b + "attn_q_norm.weight", d),
           o + "layer_scalar": w.vector(b + "layer_output_scale.weight", 1)}
    if own:
        out[o + "k_norm"] = w.vector(b + "attn_k_norm.weight", d)
    for ours, theirs in NORMS.items():
        if ours != "ple_norm" or cfg.per_layer_input_size:
            out[o + ours] = w.vector(b + theirs + ".weight", H)
    if cfg.per_layer_input_size:
        P = cfg.per_layer_input_size
        out[o + "ple_gate"] = w.fused(o + "ple_gate", [(b + "inp_gate.weight", (P, H), None)])
        out[o + "ple_proj"] = w.fused(o + "ple_proj", [(b + "proj.weight", (H, P), None)])
    return out


def model_tensors(w, cfg) -> dict:
    if not cfg.per_layer_input_size:
        return {}
    P, H = cfg.per_layer_input_size, cfg.hidden_size
    return {"ple_model_proj": w.fused("ple_model_proj", [("per_layer_model_proj.weight", (cfg.num_layers * P, H), None)]),
            "ple_proj_norm": w.vector("per_layer_proj_norm.weight", P)}


def per_layer_table(f: GGUFFile, cfg):
    """The per-layer embedding table (None without one), read on disk like the token embedding."""
    if not cfg.per_layer_input_size:
        return None
    return embedding_of(f, cfg, "per_layer_token_embd.weight",
                        (cfg.per_layer_vocab_size, cfg.num_layers * cfg.per_layer_input_size))
