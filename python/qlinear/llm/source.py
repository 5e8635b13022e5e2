"""What every model source (a Hugging Face checkpoint, a converted qlinear model, an MNN export)
returns, and the helpers they share. ``assemble.build_model`` turns a Source into a Model.

Tensor names (ours, whatever the source): ``layers.{i}.qkv`` (q/k/v fused along N),
``layers.{i}.o``, ``layers.{i}.gate_up`` (gate/up fused), ``layers.{i}.down`` (each a
PackedWeight or a float32 [N, K] array, with an optional ``.bias``), ``layers.{i}.input_norm``,
``layers.{i}.post_norm``, ``norm``, ``lm_head`` and, with vocabulary slimming, ``lm_rows``.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np

from .._packed import PackedWeight, pack_quantized
from .config import ModelConfig
from .runtime.embedding import EmbeddingFile
from .runtime.tokenizer import Tokenizer


@dataclass
class Source:
    kind: str                       # "huggingface", "qlinear-llm", "mnn": model.info["source"]
    path: Path
    config: ModelConfig
    tokenizer: Tokenizer
    embedding: EmbeddingFile        # the table's place in a file (read on disk or loaded)
    tensors: dict                   # our names -> PackedWeight / float32 arrays (see above)
    quantization: dict              # {"bits", "group_size", "symmetric"} of the weights as held
    info: dict = field(default_factory=dict)   # source-specific additions to model.info
    rope_inv_freq: Optional[np.ndarray] = None  # when the source stores RoPE's frequencies
    per_layer_embedding: Optional[EmbeddingFile] = None  # Gemma 4's per-layer embedding table


def stop_ids(x) -> list[int]:
    """A config's ``eos_token_id`` (an int, a list or None) as a list."""
    if x is None:
        return []
    return [int(i) for i in (x if isinstance(x, (list, tuple)) else [x])]


def slim_rows(slim: Union[bool, Sequence[int], None], cfg: ModelConfig,
              tokenizer: Tokenizer) -> Optional[np.ndarray]:
    """Vocabulary slimming: the lm head rows to keep (None: all). True keeps the ids the
    tokenizer can produce, when the model's vocabulary is larger."""
    if slim is False or slim is None:
        return None
    if slim is True:
        n = tokenizer.vocab_size
        return np.arange(n, dtype=np.int32) if n < cfg.vocab_size else None
    rows = np.unique(np.asarray(list(slim), dtype=np.int64))
    if rows.size == 0 or rows[0] < 0 or rows[-1] >= cfg.vocab_size:
        raise ValueError(f"slim_vocab ids must lie in [0, {cfg.vocab_size})")
    return rows.astype(np.int32)


def select_rows(w, rows: np.ndarray):
    """Rows of a weight (packed: codes moved, not re-rounded)."""
    if not isinstance(w, PackedWeight):
        return np.asarray(w, np.float32)[rows]
    if w.format == "parts":
        raise ValueError("rows of a weight of parts are not selected")
    if w.format != "affine":
        from ..._packed import pack_blocks  # noqa: PLC0415
        return pack_blocks(w.unpack_blocks()[rows], w.format, (len(rows), w.shape[1]))
    codes, scale, offset = w.unpack()
    return pack_quantized(codes[rows], scale[rows], None if offset is None else offset[rows],
                          w.bits, None if w.per_channel else w.group_size, w.symmetric)


# -- loading a model layer by layer: freed heap memory given back, a progress bar --

_malloc_trim = None


def trim_heap() -> None:
    """glibc's malloc_trim(0): loading makes a layer's transient arrays, and glibc keeps freed
    heap memory by default (its mmap threshold grows after the first large free), so without
    this the peak RSS of a load grows by the sum of the leftovers. A no-op elsewhere."""
    global _malloc_trim
    if _malloc_trim is None:
        try:
            _malloc_trim = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _malloc_trim = False
    if _malloc_trim:
        _malloc_trim(0)


class _Quiet:
    def update(self, n: int = 1) -> None:
        pass

    def set_description(self, desc: str) -> None:
        pass

    def close(self) -> None:
        pass


def progress(total: int, desc: str, enabled: bool, unit: str = "layer", leave: bool = False):
    """A bar of ``total`` steps on stderr, or an object with the same methods doing nothing."""
    if not enabled:
        return _Quiet()
    try:
        from tqdm.auto import tqdm  # noqa: PLC0415
    except ImportError:
        return _Quiet()
    return tqdm(total=total, desc=desc, unit=unit, leave=leave)
