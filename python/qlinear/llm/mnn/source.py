"""Source: an MNN LLM export (``llm.mnn``, ``llm.mnn.weight``, ``embeddings_bf16.bin``,
``tokenizer.mtok``; see ``qlinear.llm.mnn``). Its int4 / int8 records are repacked into our
layout as they are (no re-rounding), its bf16 embedding file is the embedding (with tied
embeddings: the lm head's records, dequantized per row), its tokenizer is turned into a
``tokenizers`` one. The model computes what MNN's engine computes on the export, which for Gemma
differs from the checkpoint (see ``qlinear.llm.mnn.features``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from ..._packed import PackedWeight, pack_quantized
from ..._scheme import GROUP_SIZES
from ..config import ModelConfig
from ..runtime.embedding import EmbeddingFile
from ..source import trim_heap
from ..options import Options
from ..source import progress
from ..source import Source
from ..runtime.tokenizer import Tokenizer

KIND = "mnn"
SUPPORTED = ("qwen2", "llama", "qwen3", "mistral", "gemma2", "gemma3_text")
NORMS = {"input_norm": "input_layernorm", "post_norm": "post_attention_layernorm"}
GEMMA_NORMS = {"input_norm": "input_layernorm", "post_norm": "pre_feedforward_layernorm",
               "attn_out_norm": "post_attention_layernorm", "mlp_out_norm": "post_feedforward_layernorm"}


def is_export(d: Path) -> bool:
    return (d / "llm.mnn").is_file() or (d / "llm_config.json").is_file()


def _weight(parts: list, what: str, fallbacks: list):
    """One PackedWeight from MNN weight records stacked along N (q/k/v, gate/up), their codes
    moved as they are: MNN's w = offset + scale * code (fp32 per group) is our asymmetric scheme
    with fp16 scale / offset. A group size our layouts lack (llmexport halves the block until it
    divides K, e.g. 16) or a scale outside fp16 keeps the layer in float32: MNN's dequantized
    weights exactly."""
    from .weights import QuantizedLinear  # noqa: PLC0415

    if all(isinstance(p, QuantizedLinear) for p in parts):
        bits, group = parts[0].bits, parts[0].group_size
        if all(p.bits == bits and p.group_size == group for p in parts) and group in (None, *GROUP_SIZES):
            scale = np.concatenate([p.scale for p in parts]).astype(np.float16)
            offset = np.concatenate([p.offset for p in parts]).astype(np.float16)
            if np.isfinite(scale).all() and np.isfinite(offset).all():
                codes = np.concatenate([p.codes for p in parts])
                return pack_quantized(codes, scale, offset, bits, group, symmetric=False)
    fallbacks.append(what)
    return np.concatenate([p.dequantize() if isinstance(p, QuantizedLinear) else np.asarray(p, np.float32)
                           for p in parts])


def _bias(recs):
    bs = [getattr(r, "bias", None) for r in recs]
    if all(b is None for b in bs):
        return None
    return np.concatenate([np.zeros(r.shape[0], np.float32) if b is None else b for r, b in zip(recs, bs)])


def read(d: Path, opts: Options, progress_bar: bool = True) -> Source:
    """The export's records, repacked one layer at a time."""
    from .export import read_export  # noqa: PLC0415  (MNN's converter: only when needed)

    if opts.slim_vocab not in (False, None):
        raise ValueError("slim_vocab is not supported for MNN exports")
    export = read_export(d)
    cfg = ModelConfig.from_hf(export.config, str(d / "llm_config.json"))
    if cfg.arch not in SUPPORTED:  # the graph is read as their block's
        raise ValueError(f"{d}: MNN exports of {cfg.arch!r} models are not supported ({', '.join(SUPPORTED)})")
    # Gemma 3's sliding layers rotate with the graph's one RoPE too, not the checkpoint's local base
    cfg = dataclasses.replace(cfg, rope_local_theta=None)
    norm_names = GEMMA_NORMS if cfg.sandwich_norms else NORMS
    lin, fallbacks, tensors = export.linears, [], {}
    bar = progress(cfg.num_layers + 1, "repacking", progress_bar)
    for i in range(cfg.num_layers):
        a, m = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        groups = {"qkv": [a + "q_proj", a + "k_proj", a + "v_proj"], "o": [a + "o_proj"],
                  "gate_up": [m + "gate_proj", m + "up_proj"], "down": [m + "down_proj"]}
        for ours, names in groups.items():
            recs = [lin[n] for n in names]  # read from the file now, dropped once packed
            tensors[f"layers.{i}.{ours}"] = _weight(recs, f"layers.{i}.{ours}", fallbacks)
            b = _bias(recs)
            if b is not None:
                tensors[f"layers.{i}.{ours}.bias"] = b
        for ours, theirs in norm_names.items():  # Gemma's gammas: 1 + w already
            tensors[f"layers.{i}.{ours}"] = export.norms[f"model.layers.{i}.{theirs}"]
        if cfg.qk_norm:  # Qwen3, Gemma 3
            tensors[f"layers.{i}.q_norm"] = export.norms[f"model.layers.{i}.self_attn.q_norm"]
            tensors[f"layers.{i}.k_norm"] = export.norms[f"model.layers.{i}.self_attn.k_norm"]
        trim_heap()
        bar.update(1)
    tensors["norm"] = export.norms["model.norm"]
    head = lin["lm_head"]
    tensors["lm_head"] = _weight([head], "lm_head", fallbacks)
    if getattr(head, "bias", None) is not None:
        tensors["lm_head.bias"] = head.bias
    bar.update(1)
    bar.close()
    tokenizer = Tokenizer(export.tokenizer, chat_template=export.chat_template, bos_token=export.bos_token)
    tokenizer.stop_ids |= set(export.stop_token_ids)
    vocab, hidden = export.embedding_shape
    embedding = export.tied_embedding or EmbeddingFile(str(export.embedding_path), 0, vocab, hidden, "bfloat16")
    bits = {w.bits for w in tensors.values() if isinstance(w, PackedWeight)}
    quantization = {"bits": bits.pop() if len(bits) == 1 else None, "group_size": None, "symmetric": False}
    return Source(KIND, d, cfg, tokenizer, embedding, tensors, quantization,
                  info={"float_layers": fallbacks}, rope_inv_freq=export.rope_inv_freq)
