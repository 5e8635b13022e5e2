"""A checked, mmap-based reader of Hugging Face ``*.safetensors`` files (no torch needed).

Format: u64 little-endian header length H, H bytes of JSON {name: {dtype, shape, data_offsets:
[begin, end]}, "__metadata__": {...}}, then the data. Tensors come back as read-only views of a
memory map (bfloat16 as its uint16 bit patterns), so that opening a checkpoint costs no memory
until a tensor is used. Every field is checked; a truncated or corrupt file raises ValueError.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from pathlib import Path
from typing import Iterator

import numpy as np

from ..._arrays import bf16_to_float32

_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "F64": np.float64,
           "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
           "BOOL": np.bool_}
_MAX_HEADER = 100 << 20


class SafetensorsFile:
    def __init__(self, path):
        self.path = os.fspath(path)
        with open(self.path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < 8:
                self._fail(f"{size} bytes is too short")
            (hlen,) = struct.unpack("<Q", f.read(8))
            if hlen > min(_MAX_HEADER, size - 8):
                self._fail(f"header length {hlen} exceeds the file")
            try:
                header = json.loads(f.read(hlen))
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                self._fail(f"header is not JSON ({e})")
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size > 0 else b""
        if not isinstance(header, dict):
            self._fail("header is not an object")
        self.metadata = header.pop("__metadata__", None) or {}
        self.data_start = 8 + hlen
        self._entries = {}
        for name, e in header.items():
            if not isinstance(e, dict) or e.get("dtype") not in _DTYPES:
                self._fail(f"tensor {name!r}: bad entry or unsupported dtype")
            shape, offs = e.get("shape"), e.get("data_offsets")
            if (not isinstance(shape, list) or not all(type(s) is int and 0 <= s < 1 << 40 for s in shape)
                    or not isinstance(offs, list) or len(offs) != 2
                    or not all(type(o) is int for o in offs) or not 0 <= offs[0] <= offs[1]):
                self._fail(f"tensor {name!r}: bad shape or offsets")
            nbytes = int(np.prod(shape, dtype=object)) * np.dtype(_DTYPES[e["dtype"]]).itemsize
            if offs[1] - offs[0] != nbytes:
                self._fail(f"tensor {name!r}: {offs[1] - offs[0]} bytes for shape {shape} {e['dtype']}")
            if self.data_start + offs[1] > size:
                self._fail(f"tensor {name!r} lies outside the file (truncated?)")
            self._entries[name] = (e["dtype"], tuple(shape), self.data_start + offs[0], nbytes)

    def _fail(self, why: str):
        raise ValueError(f"{self.path}: not a valid safetensors file: {why}")

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def keys(self) -> Iterator[str]:
        return iter(self._entries)

    def dtype(self, name: str) -> str:
        return self._entries[name][0]

    def shape(self, name: str) -> tuple:
        return self._entries[name][1]

    def location(self, name: str) -> tuple[int, str, tuple]:
        """(byte offset in the file, dtype, shape): for readers that pread rows."""
        dtype, shape, start, _ = self._entries[name]
        return start, dtype, shape

    def raw(self, name: str) -> np.ndarray:
        """The stored values, a read-only view of the mapping (bfloat16 as uint16 bits)."""
        dtype, shape, start, nbytes = self._entries[name]
        return np.frombuffer(self._map, dtype=_DTYPES[dtype], count=nbytes // np.dtype(_DTYPES[dtype]).itemsize,
                             offset=start).reshape(shape)

    def float32(self, name: str) -> np.ndarray:
        """The tensor as float32 (a new array); the mapped pages it was read from are released,
        so that reading a whole checkpoint does not leave it resident in the process."""
        out = to_float32(self.raw(name), self.dtype(name))
        self.release(name)
        return out

    def release(self, name: str) -> None:
        _, _, start, nbytes = self._entries[name]
        page = mmap.PAGESIZE
        lo, hi = -(-start // page) * page, (start + nbytes) // page * page
        if hi > lo and hasattr(self._map, "madvise"):
            self._map.madvise(mmap.MADV_DONTNEED, lo, hi - lo)


def to_float32(raw: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "BF16":
        return bf16_to_float32(raw)
    if dtype in ("F32", "F16", "F64"):
        return raw.astype(np.float32)
    raise ValueError(f"expected a float tensor, got {dtype}")


TEXT_PREFIX = "model.language_model."


class Checkpoint:
    """All ``*.safetensors`` files of a checkpoint directory, as one name -> tensor table."""

    def __init__(self, directory):
        self.directory = Path(directory)
        files = sorted(self.directory.glob("*.safetensors"))
        if not files:
            raise ValueError(f"{self.directory}: no *.safetensors files (only safetensors checkpoints "
                             "are read: no pickle-based .bin files)")
        self._where = {}  # name -> (file, the name in that file)
        for path in files:
            st = SafetensorsFile(path)
            for name in st.keys():
                self._where[name] = (st, name)
        # a multimodal checkpoint keeps its text model under model.language_model. (Qwen3.5):
        # read it under model. as a text-only one is (its other towers are not read)
        if TEXT_PREFIX + "embed_tokens.weight" in self._where and "model.embed_tokens.weight" not in self._where:
            for name in [n for n in self._where if n.startswith(TEXT_PREFIX)]:
                self._where["model." + name[len(TEXT_PREFIX):]] = self._where[name]

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def file(self, name: str) -> SafetensorsFile:
        return self._find(name)[0]

    def _find(self, name: str) -> tuple:
        if name not in self._where:
            raise ValueError(f"{self.directory}: checkpoint has no tensor {name!r}")
        return self._where[name]

    def location(self, name: str) -> tuple[int, str, tuple]:
        st, real = self._find(name)
        return st.location(real)

    def raw(self, name: str) -> tuple[np.ndarray, str]:
        st, real = self._find(name)
        return st.raw(real), st.dtype(real)

    def float32(self, name: str) -> np.ndarray:
        st, real = self._find(name)
        return st.float32(real)
