"""A GGUF file's embedding (F16 / BF16 / F32 tables read on disk like a checkpoint's, a quantized
``token_embd`` dequantized a row at a time from the mapped file) and its tokenizer written out
(``llm.convert``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ... import _core
from ..config import ModelConfig
from ..runtime.embedding import EmbeddingFile, MemoryEmbedding, _check_ids
from ..runtime.tokenizer import Tokenizer
from .file import GGUFFile, dequantize

FLOAT_EMBEDDINGS = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}


class _QuantizedEmbedding:
    """A quantized ``token_embd`` [vocab, hidden]: rows dequantized from the mapped file as read."""

    dtype = "float32"   # of ``raw()``

    def __init__(self, f: GGUFFile, t, vocab: int, hidden: int):
        # the tensor (a view of the mapped file) and not the reader: its metadata (tens of
        # thousands of small objects for a vocabulary) is freed once the model is loaded
        self.path, self.t, self.vocab_size, self.hidden_size = f.path, t, vocab, hidden
        self.table = np.asarray(t.data).reshape(vocab, -1)
        # Q4_0 / Q8_0 rows by one native call (the numpy reference costs ~10x more per decode step)
        self._native = t.tensor_type.name if t.tensor_type.name in ("Q4_0", "Q8_0") else None

    def raw(self) -> np.ndarray:
        """The whole table dequantized (for ``llm.convert``)."""
        return dequantize(self.t, self.path)

    def open(self, on_disk: bool):
        if not on_disk:
            return MemoryEmbedding(dequantize(self.t, self.path))
        return self

    def __call__(self, ids) -> np.ndarray:
        ids = _check_ids(ids, self.vocab_size)
        if self._native:
            return _core.gguf_rows(self.table, self._native, ids.astype(np.int64, copy=False))
        from gguf import quants  # noqa: PLC0415

        rows = self.table[ids]
        return np.asarray(quants.dequantize(rows, self.t.tensor_type), np.float32).reshape(len(ids), -1)


def write_tokenizer(tok: Tokenizer, out: Path) -> None:
    """The rebuilt tokenizer as ``tokenizer.json`` + ``tokenizer_config.json`` (for ``llm.convert``)."""
    tok.hf.save(str(out / "tokenizer.json"))
    stop = sorted(tok.stop_ids)
    (out / "tokenizer_config.json").write_text(json.dumps({
        "chat_template": tok.chat_template, "bos_token": tok.bos_token,
        "eos_token": tok.hf.id_to_token(stop[0]) if stop else None}, indent=2))


def embedding_of(f: GGUFFile, cfg: ModelConfig, name: str = "token_embd.weight", shape=None):
    """The table ``name`` ([vocab, width], the token embedding's by default) as an EmbeddingFile,
    or a quantized one's reader."""
    vocab, width = shape or (cfg.vocab_size, cfg.hidden_size)
    t = f.tensor(name, (vocab, width))
    dtype = FLOAT_EMBEDDINGS.get(t.tensor_type.name)
    if dtype is not None:
        return EmbeddingFile(str(f.path), int(t.data_offset), vocab, width, dtype)
    return _QuantizedEmbedding(f, t, vocab, width)
