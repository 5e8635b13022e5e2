"""Source: a Hugging Face checkpoint directory (``config.json``, ``*.safetensors``,
``tokenizer.json``), its linear layers quantized as they are read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import numpy as np

from ..._packed import PackedWeight, pack_weight
from .. import archs
from ..archs.base import LINEARS, layer_linears  # noqa: F401  (LINEARS: gptq's)
from ..config import ModelConfig
from ..runtime.embedding import EmbeddingFile
from ..source import trim_heap
from ..options import Options
from ..source import progress
from . import gemma4, gpt_oss
from .safetensors_file import Checkpoint, to_float32
from ..source import Source, slim_rows, stop_ids
from ..runtime.tokenizer import Tokenizer

KIND = "huggingface"
EMBEDDING = "model.embed_tokens.weight"
_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}


def is_checkpoint(d: Path) -> bool:
    return (d / "config.json").is_file()


def read_config(d: Path) -> ModelConfig:
    try:
        hf = json.loads((d / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{d / 'config.json'}: cannot read ({e})") from None
    return ModelConfig.from_hf(hf, str(d / "config.json"))


def read(d: Path, opts: Options, progress_bar: bool = True, bar_leave: bool = False) -> Source:
    """The checkpoint's tensors, quantized per ``opts`` (bits, group_size, symmetric, slim_vocab)."""
    cfg, tokenizer, ckpt, embedding, rows = open_checkpoint(d, opts)
    tensors = _tensors(ckpt, cfg, opts, rows, progress_bar, bar_leave)
    return Source(KIND, d, cfg, tokenizer, embedding, tensors,
                  {"bits": opts.bits, "group_size": opts.group_size, "symmetric": opts.symmetric,
                   **({"method": "rtn"} if opts.bits else {})},
                  per_layer_embedding=gemma4.per_layer_table(ckpt, cfg))


def open_checkpoint(d: Path, opts: Options) -> tuple:
    """(config, tokenizer, Checkpoint, EmbeddingFile, lm head rows kept or None) of a checkpoint;
    no weight is read yet."""
    cfg = read_config(d)
    tokenizer = Tokenizer.from_dir(d, extra_stop_ids=stop_ids(cfg.eos_token_id))
    ckpt = Checkpoint(d)
    st = ckpt.file(EMBEDDING)
    offset, dtype, shape = ckpt.location(EMBEDDING)
    if dtype not in _DTYPES or tuple(shape) != (cfg.vocab_size, cfg.hidden_size):
        raise ValueError(f"{d}: embedding is {dtype} {shape}, expected float [{cfg.vocab_size}, {cfg.hidden_size}]")
    embedding = EmbeddingFile(st.path, offset, cfg.vocab_size, cfg.hidden_size, _DTYPES[dtype])
    return cfg, tokenizer, ckpt, embedding, slim_rows(opts.slim_vocab, cfg, tokenizer)


def _tensors(ckpt: Checkpoint, cfg: ModelConfig, opts: Options, rows: Optional[np.ndarray],
             progress_bar: bool, bar_leave: bool) -> dict:
    """Our named tensors from a HF checkpoint: fused projections, quantized per ``opts``."""
    def quantize(w):
        if opts.bits is None or isinstance(w, PackedWeight):  # (MXFP4 experts: packed as stored)
            return w
        return pack_weight(w, bits=opts.bits, group_size=opts.group_size, symmetric=opts.symmetric)

    out = {}
    bar = progress(cfg.num_layers + 1, "quantizing" if opts.bits else "loading", progress_bar, leave=bar_leave)
    for i in range(cfg.num_layers):
        layer = layer_tensors(ckpt, cfg, i, packed=opts.bits is not None)
        for n in layer_linears(cfg, i):
            layer[f"layers.{i}.{n}"] = quantize(layer[f"layers.{i}.{n}"])
        out.update(layer)
        del layer
        trim_heap()
        bar.update(1)
    head = head_tensors(ckpt, cfg, rows)
    head["lm_head"] = quantize(head["lm_head"])
    if "ple_model_proj" in head:
        head["ple_model_proj"] = quantize(head["ple_model_proj"])
    out.update(head)
    bar.update(1)
    bar.close()
    return out


def layer_tensors(ckpt: Checkpoint, cfg: ModelConfig, i: int, packed: bool = False) -> dict:
    """Block ``i``'s tensors under our names, float32, nothing quantized (but GPT-OSS's MXFP4
    experts, PackedWeights as stored when ``packed``): the architecture's
    tensors (a hybrid's: its token mixer's too) fused along N (q/k/v, gate/up) with their biases,
    its norms (Gemma's and Qwen3.5's ``w - 1`` stored norms with the 1 added back) and vectors."""
    if cfg.arch == "gemma4_text":  # per-layer attention shapes, shared KV, folded scalings
        return gemma4.layer_tensors(ckpt, cfg, i)
    arch = archs.get(cfg.arch)
    p, out = f"model.layers.{i}.", {}
    linears = set(layer_linears(cfg, i))
    for ours, names in {**arch.layer, **arch.mixer_layers.get(cfg.mixer(i), {})}.items():
        names = [p + n for n in names]
        if ours not in linears:
            raw = ours in arch.raw_norms or not ours.endswith("norm")
            out[f"layers.{i}.{ours}"] = ckpt.float32(names[0]) if raw else _norm(ckpt, arch, names[0])
            continue
        out[f"layers.{i}.{ours}"] = _fused(ckpt, names)
        biases = [n[:-len("weight")] + "bias" for n in names]
        present = [b in ckpt for b in biases]
        if all(present):
            out[f"layers.{i}.{ours}.bias"] = _fused(ckpt, biases)
        elif any(present):
            raise ValueError(f"{ckpt.directory}: layer {i} has biases on some of {', '.join(names)} only")
    if cfg.num_experts:  # the router, float (and its bias); each expert's gate / up fused, and its down
        names = arch.experts
        out[f"layers.{i}.router"] = ckpt.float32(p + names["router"])
        bias = p + names["router"][:-len("weight")] + "bias"
        if bias in ckpt:
            out[f"layers.{i}.router.bias"] = ckpt.float32(bias)
        if names.get("form") == "gpt_oss":
            out.update(gpt_oss.experts(ckpt, cfg, i, p, packed))
        else:
            out.update(_experts(ckpt, cfg, i, p, names))
    if cfg.shared_expert_size:  # Qwen2-MoE: the shared expert and its gate (a [1, hidden] row, float)
        x = p + "mlp.shared_expert."
        out[f"layers.{i}.shared_gate_up"] = _fused(ckpt, [x + "gate_proj.weight", x + "up_proj.weight"])
        out[f"layers.{i}.shared_down"] = ckpt.float32(x + "down_proj.weight")
        out[f"layers.{i}.shared_gate"] = ckpt.float32(p + "mlp.shared_expert_gate.weight").reshape(-1)
    if cfg.attn_output_gate and cfg.mixer(i) == "attention":
        gated_attention_tensors(cfg, i, out)
    if f"layers.{i}.a_log" in out:  # the decay's rate as the runtime takes it: A = -exp(A_log)
        out[f"layers.{i}.ssm_a"] = -np.exp(out.pop(f"layers.{i}.a_log"))
    return out


def _experts(ckpt: Checkpoint, cfg: ModelConfig, i: int, p: str, names: dict) -> dict:
    """Each expert's gate_up and down: from one tensor per expert and projection, or from the
    experts stacked (transformers 5's form: ``mlp.experts.gate_up_proj`` [E, 2M, H] and
    ``mlp.experts.down_proj`` [E, H, M])."""
    out, E = {}, cfg.num_experts
    stacked = p + names["expert"].split("{e}")[0]  # "mlp.experts."
    if stacked + "gate_up_proj" in ckpt:
        gate_up, down = ckpt.float32(stacked + "gate_up_proj"), ckpt.float32(stacked + "down_proj")
        M, H = cfg.moe_intermediate_size, cfg.hidden_size
        if gate_up.shape != (E, 2 * M, H) or down.shape != (E, H, M):
            raise ValueError(f"{ckpt.directory}: layer {i}'s stacked experts are {gate_up.shape} / {down.shape}, "
                             f"expected {(E, 2 * M, H)} / {(E, H, M)}")
        for e in range(E):
            out[f"layers.{i}.experts.{e}.gate_up"] = np.ascontiguousarray(gate_up[e])
            out[f"layers.{i}.experts.{e}.down"] = np.ascontiguousarray(down[e])
        return out
    for e in range(E):
        x = p + names["expert"].format(e=e)
        out[f"layers.{i}.experts.{e}.gate_up"] = _fused(ckpt, [x + names["gate"], x + names["up"]])
        out[f"layers.{i}.experts.{e}.down"] = ckpt.float32(x + names["down"])
    return out


def gated_attention_tensors(cfg: ModelConfig, i: int, out: dict) -> None:
    """Qwen3.5's attention in our layout, in place: ``q_proj`` interleaves each head's query and
    output gate; ours is [q, k, v, gate] along N, q / k (and their head norms) in the order the
    partial rotary wants (``layers.rotary_order``)."""
    from ..runtime.layers import rotary_order  # noqa: PLC0415

    heads, kv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    order = rotary_order(d, cfg.rotary_dim)
    for suffix in ("", ".bias"):
        key = f"layers.{i}.qkv{suffix}"
        if key not in out:
            continue
        w = out[key]
        rest = w.shape[1:]
        qg = w[:2 * heads * d].reshape(heads, 2, d, *rest)
        k = w[2 * heads * d:2 * heads * d + kv * d].reshape(kv, d, *rest)
        v = w[2 * heads * d + kv * d:]
        if v.shape[0] != kv * d:
            raise ValueError(f"layer {i}: q_proj / k_proj / v_proj give {w.shape[0]} rows, expected "
                             f"{2 * heads * d + 2 * kv * d} (a query and a gate per head)")
        out[key] = np.concatenate([qg[:, 0][:, order].reshape(-1, *rest), k[:, order].reshape(-1, *rest), v,
                                   qg[:, 1].reshape(-1, *rest)])
    for norm in ("q_norm", "k_norm"):
        out[f"layers.{i}.{norm}"] = np.ascontiguousarray(out[f"layers.{i}.{norm}"][order])


def _norm(ckpt: Checkpoint, arch, name: str) -> np.ndarray:  # Gemma stores RMSNorm weights as w - 1
    w = ckpt.float32(name)
    return w + np.float32(arch.norm_offset) if arch.norm_offset else w


def _fused(ckpt: Checkpoint, names: list) -> np.ndarray:
    return np.concatenate([ckpt.float32(n) for n in names]) if len(names) > 1 else ckpt.float32(names[0])


def head_tensors(ckpt: Checkpoint, cfg: ModelConfig, rows: Optional[np.ndarray]) -> dict:
    """The final norm and the lm head (float32; with vocabulary slimming only the kept rows, and
    ``lm_rows``)."""
    arch = archs.get(cfg.arch)
    out = {"norm": _norm(ckpt, arch, arch.final_norm), **(gemma4.model_tensors(ckpt, cfg) if cfg.arch == "gemma4_text"
                                                         else {})}
    head = EMBEDDING if cfg.tie_word_embeddings or "lm_head.weight" not in ckpt else "lm_head.weight"
    if rows is None:
        out["lm_head"] = ckpt.float32(head)
    else:  # only the kept rows are widened
        raw, dtype = ckpt.raw(head)
        out["lm_head"] = to_float32(raw[rows], dtype)
        out["lm_rows"] = rows
    return out
