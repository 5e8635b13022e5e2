"""Source: a Hugging Face checkpoint directory (``config.json``, ``*.safetensors``,
``tokenizer.json``), its linear layers quantized as they are read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import numpy as np

from .._packed import pack_weight
from . import archs
from .archs.base import LINEARS
from .config import ModelConfig
from .embedding import EmbeddingFile
from .heap import trim_heap
from .options import Options
from .progress import progress
from .safetensors_file import Checkpoint, to_float32
from .source import Source, slim_rows, stop_ids
from .tokenizer import Tokenizer

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
    cfg = read_config(d)
    tokenizer = Tokenizer.from_dir(d, extra_stop_ids=stop_ids(cfg.eos_token_id))
    ckpt = Checkpoint(d)
    st = ckpt.file(EMBEDDING)
    offset, dtype, shape = st.location(EMBEDDING)
    if dtype not in _DTYPES or tuple(shape) != (cfg.vocab_size, cfg.hidden_size):
        raise ValueError(f"{d}: embedding is {dtype} {shape}, expected float [{cfg.vocab_size}, {cfg.hidden_size}]")
    embedding = EmbeddingFile(st.path, offset, cfg.vocab_size, cfg.hidden_size, _DTYPES[dtype])
    rows = slim_rows(opts.slim_vocab, cfg, tokenizer)
    tensors = _tensors(ckpt, cfg, opts, rows, progress_bar, bar_leave)
    return Source(KIND, d, cfg, tokenizer, embedding, tensors,
                  {"bits": opts.bits, "group_size": opts.group_size, "symmetric": opts.symmetric})


def _tensors(ckpt: Checkpoint, cfg: ModelConfig, opts: Options, rows: Optional[np.ndarray],
             progress_bar: bool, bar_leave: bool) -> dict:
    """Our named tensors from a HF checkpoint: fused projections, quantized per ``opts``."""
    def f32(name):
        return ckpt.float32(name)

    def quantize(w):
        if opts.bits is None:
            return w
        return pack_weight(w, bits=opts.bits, group_size=opts.group_size, symmetric=opts.symmetric)

    arch = archs.get(cfg.arch)

    def norm(name):  # Gemma stores RMSNorm weights as w - 1
        return f32(name) + np.float32(arch.norm_offset) if arch.norm_offset else f32(name)

    def fused(names):
        return np.concatenate([f32(n) for n in names]) if len(names) > 1 else f32(names[0])

    out = {}
    bar = progress(cfg.num_layers + 1, "quantizing" if opts.bits else "loading", progress_bar, leave=bar_leave)
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        for ours, names in arch.layer.items():
            names = [p + n for n in names]
            if ours not in LINEARS:
                out[f"layers.{i}.{ours}"] = norm(names[0])
                continue
            out[f"layers.{i}.{ours}"] = quantize(fused(names))
            biases = [n[:-len("weight")] + "bias" for n in names]
            present = [b in ckpt for b in biases]
            if all(present):
                out[f"layers.{i}.{ours}.bias"] = fused(biases)
            elif any(present):
                raise ValueError(f"{ckpt.directory}: layer {i} has biases on some of {', '.join(names)} only")
        trim_heap()
        bar.update(1)
    out["norm"] = norm("model.norm.weight")
    head = EMBEDDING if cfg.tie_word_embeddings or "lm_head.weight" not in ckpt else "lm_head.weight"
    if rows is None:
        w = f32(head)
    else:  # only the kept rows are widened
        raw, dtype = ckpt.raw(head)
        w = to_float32(raw[rows], dtype)
    out["lm_head"] = quantize(w)
    if rows is not None:
        out["lm_rows"] = rows
    bar.update(1)
    bar.close()
    return out
