"""A GGUF file (llama.cpp's format) opened with the ``gguf`` package's reader, checked before
use: header, metadata types, tensor types, shapes and byte ranges against the file's size. Every
problem is a ValueError naming the file; nothing is allocated before its size is checked.

Quantized blocks whose layout agrees with ours are unpacked to codes / scales / offsets as they
are stored, and the block formats' rows are taken as they are (``codes``); anything else is
dequantized with ``gguf.quants`` (``dequantize``).
"""

from __future__ import annotations

import dataclasses
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

MAGIC = b"GGUF"
VERSIONS = (2, 3)
_HEADER = struct.Struct("<4sIQQ")            # magic, version, tensor count, metadata count
_MIN_TENSOR_INFO, _MIN_KV = 24, 12           # the smallest records: counts beyond size / these are lies
_MAX_DIM = 1 << 40
# Reader failures on malformed bytes: the gguf package raises whatever numpy / struct give it.
_READ_ERRORS = (ValueError, KeyError, IndexError, TypeError, OverflowError, struct.error,
                UnicodeDecodeError, AttributeError, MemoryError)


@dataclass
class Moved:
    """Stored codes of a block format that is one of our layouts: ``[N, K]`` codes (as we store
    them: q + zero point for symmetric), float16 scale / offset ``[N, K // 32]``."""
    codes: np.ndarray
    scale: np.ndarray
    offset: Optional[np.ndarray]
    bits: int
    symmetric: bool
    rounded: bool = False     # scale / offset were rounded to float16 (Q4_K)
    label: str = ""           # "name (TYPE)" for model.info

    def rows(self, order: np.ndarray) -> "Moved":
        return dataclasses.replace(self, codes=self.codes[order], scale=self.scale[order],
                                   offset=None if self.offset is None else self.offset[order])

    def asymmetric(self) -> Optional["Moved"]:
        """The same weights as an asymmetric layout (offset = -zero_point * scale, exact in
        float16 unless it overflows: then None)."""
        if not self.symmetric:
            return self
        zp = 8 if self.bits == 4 else 128
        with np.errstate(over="ignore"):
            offset = (self.scale.astype(np.float32) * -zp).astype(np.float16)
        if not np.isfinite(offset).all():
            return None
        return dataclasses.replace(self, offset=offset, symmetric=False)


@dataclass
class Blocks:
    """Rows of a tensor in one of the package's block formats (``qlinear.blocks``), as the file
    stores them: ``raw`` uint8 [N, bytes per row] (a view of the mapped file), moved at packing."""
    raw: np.ndarray
    fmt: str
    k: int
    label: str = ""           # "name (TYPE)" for model.info

    def rows(self, order) -> "Blocks":
        return dataclasses.replace(self, raw=self.raw[order])

    @property
    def n(self) -> int:
        return self.raw.shape[0]


class GGUFFile:
    def __init__(self, path):
        self.path = Path(path)
        self.size = self.path.stat().st_size
        with open(self.path, "rb") as f:
            head = f.read(_HEADER.size)
        if len(head) < _HEADER.size:
            raise self.error(f"truncated header ({len(head)} bytes)")
        magic, version, n_tensors, n_kv = _HEADER.unpack(head)
        if magic != MAGIC:
            raise self.error(f"not a GGUF file (magic {magic!r})")
        if version not in VERSIONS:
            raise self.error(f"GGUF version {version} is not supported ({', '.join(map(str, VERSIONS))}; "
                             "big-endian files are not supported either)")
        if n_tensors > self.size // _MIN_TENSOR_INFO or n_kv > self.size // _MIN_KV:
            raise self.error(f"{n_tensors} tensors / {n_kv} metadata entries cannot fit in {self.size} bytes")
        from gguf import GGUFReader  # noqa: PLC0415

        try:
            self.reader = GGUFReader(self.path, "r")
        except _READ_ERRORS as e:
            what = ("a tensor lies outside the file or has an invalid shape (truncated?)" if "reshape" in str(e)
                    else "malformed GGUF file (truncated, or a length beyond the file?)" if isinstance(e, IndexError)
                    else "malformed GGUF file")
            raise self.error(f"{what} ({type(e).__name__}: {str(e)[:200]})") from None
        self.tensors = {}
        for t in self.reader.tensors:
            self._check_tensor(t)
            self.tensors[t.name] = t

    def error(self, msg: str) -> ValueError:
        return ValueError(f"{self.path}: {msg}")

    def drop_pages(self) -> None:
        """Release the pages of the mapped file read so far from this process's resident set
        (they stay in the page cache): the codes moved out of them live in the packed weights,
        and keeping both would hold the model twice at the peak."""
        mm = getattr(self.reader.data, "_mmap", None)
        if mm is not None and hasattr(mmap, "MADV_DONTNEED"):
            mm.madvise(mmap.MADV_DONTNEED)

    def _check_tensor(self, t) -> None:
        from gguf import GGML_QUANT_SIZES  # noqa: PLC0415

        dims = [int(d) for d in t.shape]
        if not dims or any(d <= 0 or d > _MAX_DIM for d in dims):
            raise self.error(f"tensor {t.name!r} has an invalid shape {dims}")
        n = int(np.prod(dims, dtype=object))
        if t.tensor_type not in GGML_QUANT_SIZES:
            raise self.error(f"tensor {t.name!r} has an unsupported type {t.tensor_type.name}")
        block, type_size = GGML_QUANT_SIZES[t.tensor_type]
        if dims[0] % block:
            raise self.error(f"tensor {t.name!r}: rows of {dims[0]} are not whole {t.tensor_type.name} blocks")
        nbytes = n // block * type_size
        if n != t.n_elements or t.data_offset < 0 or t.data_offset + nbytes > self.size or t.data.nbytes != nbytes:
            raise self.error(f"tensor {t.name!r} ({t.tensor_type.name} {dims}) lies outside the file "
                             f"({self.size} bytes; truncated?)")

    # -- metadata -----------------------------------------------------------------------------
    def meta(self, key: str, kind, default=None, required: bool = False):
        """A metadata value of Python type ``kind`` (int, float, str, bool, list, or a tuple of
        them), else ValueError."""
        f = self.reader.get_field(key)
        if f is None:
            if required:
                raise self.error(f"metadata {key!r} is missing")
            return default
        try:
            v = f.contents()
        except _READ_ERRORS as e:
            raise self.error(f"metadata {key!r} is unreadable ({type(e).__name__}: {e})") from None
        if kind is float and isinstance(v, int) and not isinstance(v, bool):
            v = float(v)
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if not isinstance(v, kinds) or (isinstance(v, bool) and bool not in kinds):
            raise self.error(f"metadata {key!r} is a {type(v).__name__}, "
                             f"expected {' or '.join(k.__name__ for k in kinds)}")
        return v

    def count(self, key: str, default=None) -> int:
        v = self.meta(key, int, default, required=default is None)
        if v is None or not 0 < v <= _MAX_DIM:
            raise self.error(f"metadata {key!r} must be a positive count, got {v!r}")
        return v

    # -- tensors ------------------------------------------------------------------------------
    def tensor(self, name: str, shape: tuple):
        """The tensor ``name`` of our (row-major) ``shape``, checked."""
        t = self.tensors.get(name)
        if t is None:
            raise self.error(f"tensor {name!r} is missing")
        if tuple(int(d) for d in reversed(t.shape)) != tuple(shape):
            raise self.error(f"tensor {name!r} has shape {list(reversed([int(d) for d in t.shape]))}, "
                             f"expected {list(shape)}")
        return t

    def dequantize(self, t) -> np.ndarray:
        return dequantize(t, self.path)


def dequantize(t, path) -> np.ndarray:
    """Tensor ``t`` of the file at ``path`` in float32, shaped as ours (rows last-dimension-major)."""
    from gguf import quants  # noqa: PLC0415

    try:
        w = quants.dequantize(np.asarray(t.data), t.tensor_type)
    except (NotImplementedError, quants.QuantError) as e:
        raise ValueError(f"{path}: tensor {t.name!r}: {t.tensor_type.name} cannot be dequantized ({e})") from None
    shape = tuple(int(d) for d in reversed(t.shape))
    return np.ascontiguousarray(np.asarray(w, np.float32).reshape(shape))


def codes(t, rows_k: Optional[tuple] = None):
    """A 2-D Q4_0 / Q8_0 tensor's codes moved into our group-32 layouts (Moved), a tensor of a
    block format (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q5_0, Q4_1, Q5_1, IQ4_NL, IQ4_XS, MXFP4) as its rows (Blocks),
    else None; ``rows_k``: a tensor of more dimensions seen as [rows, k] (k its innermost dimension)."""
    from qlinear import blocks  # noqa: PLC0415
    from gguf import GGMLQuantizationType as T  # noqa: PLC0415

    if rows_k is not None:
        n, k = rows_k
        if k != int(t.shape[0]) or n * k != int(t.n_elements):
            raise ValueError(f"tensor {t.name!r} of shape {[int(d) for d in t.shape]} is not [{n}, {k}]")
    elif len(t.shape) != 2:
        return None
    else:
        k, n = (int(d) for d in t.shape)
    raw = np.asarray(t.data).reshape(n, -1)
    if t.tensor_type.name in blocks.FORMATS:
        fmt = blocks.FORMATS[t.tensor_type.name]
        if k % fmt.super or raw.shape[1] != blocks.row_bytes(fmt, k):
            raise ValueError(f"tensor {t.name!r}: {fmt.name} rows of {k} values cannot be {raw.shape[1]} bytes")
        return Blocks(raw, fmt.name, k)
    if t.tensor_type == T.Q4_0:        # 18 bytes: d (f16), 16 bytes: q 0..15 (low nibbles first); w = d (q - 8)
        b = raw.reshape(n, k // 32, 18)
        qs = b[..., 2:]
        c = np.concatenate([qs & 15, qs >> 4], axis=-1).reshape(n, k)
        return Moved(c, _scales(t, b), None, 4, True)
    if t.tensor_type == T.Q8_0:        # 34 bytes: d (f16), 32 int8 q; w = d q: our code q + 128
        b = raw.reshape(n, k // 32, 34)
        q = b[..., 2:].view(np.int8).astype(np.int16) + 128
        return Moved(q.astype(np.uint8).reshape(n, k), _scales(t, b), None, 8, True)
    return None


def _scales(t, b: np.ndarray) -> np.ndarray:
    """The blocks' float16 scales (their first two bytes); a corrupt file's NaN / Inf refused."""
    d = _f16(b[..., :2])
    if not np.isfinite(d).all():
        row, blk = (int(v[0]) for v in np.nonzero(~np.isfinite(d)))
        raise ValueError(f"tensor {t.name!r}: block {blk} of row {row} has a scale that is NaN or infinite")
    return d


def _f16(two_bytes: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(two_bytes).view(np.float16)[..., 0]
