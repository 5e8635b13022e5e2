"""Token embedding: a table in memory, or left on disk and read a row at a time (mnn-llm's disk
embedding: a 150k-token vocabulary is ~270 MB in bf16, but a forward needs a few rows). Every
model source records where its table lies in a file (``EmbeddingFile``); ``open`` makes either."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ... import _core
from ..._arrays import bf16_to_float32
from ..pread_file import PreadFile

_DTYPES = {"bfloat16": np.uint16, "float16": np.float16, "float32": np.float32}


def _rows_to_float32(raw: np.ndarray, dtype: str) -> np.ndarray:
    return bf16_to_float32(raw) if dtype == "bfloat16" else raw.astype(np.float32)


@dataclass(frozen=True)
class EmbeddingFile:
    """Where a source's embedding table lies: ``[vocab_size, hidden_size]`` of ``dtype``
    (bfloat16 / float16 / float32) at byte ``offset`` of ``path``."""

    path: str
    offset: int
    vocab_size: int
    hidden_size: int
    dtype: str

    def raw(self) -> np.ndarray:
        """The stored table, memory-mapped read-only (bfloat16 as uint16 bits)."""
        if self.dtype not in _DTYPES:
            raise ValueError(f"embedding dtype must be one of {', '.join(_DTYPES)}, got {self.dtype!r}")
        return np.memmap(self.path, dtype=_DTYPES[self.dtype], mode="r", offset=self.offset,
                         shape=(self.vocab_size, self.hidden_size))

    def open(self, on_disk: bool):
        """A DiskEmbedding reading rows from the file, or the whole table as a MemoryEmbedding."""
        if on_disk:
            return DiskEmbedding(self.path, self.offset, self.vocab_size, self.hidden_size, self.dtype)
        return MemoryEmbedding(_rows_to_float32(np.asarray(self.raw()), self.dtype))


class MemoryEmbedding:
    """The whole table in memory, float32."""

    def __init__(self, table: np.ndarray):
        self.table = np.ascontiguousarray(table, dtype=np.float32)
        self.vocab_size, self.hidden_size = self.table.shape

    def __call__(self, ids: Sequence[int]) -> np.ndarray:
        return self.table[_check_ids(ids, self.vocab_size)]


class DiskEmbedding:
    """Rows read with pread from a file: [vocab, hidden] of bfloat16 / float16 / float32 starting
    at ``offset``. Only the page cache holds the table, never the process."""

    def __init__(self, path, offset: int, vocab_size: int, hidden_size: int, dtype: str = "bfloat16"):
        if dtype not in _DTYPES:
            raise ValueError(f"embedding dtype must be one of {', '.join(_DTYPES)}, got {dtype!r}")
        self.path, self.offset, self.dtype = os.fspath(path), int(offset), dtype
        self.vocab_size, self.hidden_size = int(vocab_size), int(hidden_size)
        self.row_bytes = self.hidden_size * np.dtype(_DTYPES[dtype]).itemsize
        self._file = PreadFile(path)
        size = self._file.size
        if self.offset < 0 or self.offset + self.vocab_size * self.row_bytes > size:
            self._file.close()
            raise ValueError(f"{self.path}: {size} bytes cannot hold a {self.vocab_size}x{self.hidden_size} "
                             f"{dtype} embedding at offset {self.offset} (truncated?)")

    def __call__(self, ids: Sequence[int]) -> np.ndarray:
        ids = _check_ids(ids, self.vocab_size)
        # one native call (pread and the exact widening): numpy's per-call costs dominate a
        # decode step's one row, its caches emptied by the step's weight stream
        fd = self._file.fileno()
        try:
            return _core.file_rows(fd, self.offset, self.vocab_size, self.hidden_size, self.dtype,
                                   ids.astype(np.int64, copy=False))
        except ValueError as e:   # a short read: the file was truncated after it was opened
            raise ValueError(f"{self.path}: {e}") from None

    def close(self) -> None:
        self._file.close()


class ScaledEmbedding:
    """Rows of another embedding times ``scale`` (Gemma: sqrt(hidden_size))."""

    def __init__(self, inner, scale: float):
        self.inner, self.scale = inner, np.float32(scale)

    def __getattr__(self, name):  # vocab_size, hidden_size, table, ... of the inner embedding
        return getattr(self.inner, name)

    def __call__(self, ids: Sequence[int]) -> np.ndarray:
        return self.inner(ids) * self.scale


def embed_scale(hidden_size: int, dtype: str) -> float:
    """sqrt(hidden_size) in the table's dtype, as transformers rounds it before multiplying
    (a bfloat16 checkpoint of hidden 1152: 34.0, not 33.94)."""
    x = np.float32(np.sqrt(hidden_size))
    if dtype == "float16":
        return float(np.float16(x))
    if dtype == "bfloat16":  # round to nearest even on the upper 16 bits
        bits = np.array([x], np.float32).view(np.uint32)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & np.uint32(0xFFFF0000)
        return float(bits.view(np.float32)[0])
    return float(x)


def _check_ids(ids, vocab_size: int) -> np.ndarray:
    arr = np.asarray(ids)
    if arr.ndim != 1 or arr.size == 0 or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError("token ids must be a non-empty 1-D sequence of ints")
    if arr.min() < 0 or arr.max() >= vocab_size:
        raise ValueError(f"token id {int(arr.max() if arr.max() >= vocab_size else arr.min())} is "
                         f"outside the vocabulary [0, {vocab_size})")
    return arr
