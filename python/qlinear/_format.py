"""The packed-weight file format: checked, versioned, mmap-able, no pickle.

Layout of a file (little-endian)::

    0   8 bytes   magic b"QLINEAR\\0"
    8   u32       format version (1)
    12  u32       header length H (bytes of UTF-8 JSON)
    16  u32       CRC-32 of the header bytes
    20  12 bytes  zero
    32  H bytes   header JSON: {"tensors": {name: entry}, "metadata": {...}}
    ... zero padding to a multiple of 64: the data section starts here
    data          each tensor's packed bytes at entry["offset"] (relative, 64-aligned)

An entry: shape [N, K], bits, group_size, symmetric, layout, scale_dtype ("float16"), offset,
nbytes, crc32 (of the packed bytes). Loading checks the magic, version, header CRC, every field's
type and range, that the sizes match the geometry and lie inside the file, and (verify=True) the
data CRCs. A file packed for another CPU family's layout is repacked (without re-rounding).
"""

from __future__ import annotations

import json
import mmap
import os
import struct
import zlib
from typing import Any, Mapping, Optional

import numpy as np

from . import _core
from ._packed import PackedWeight, pack_quantized

MAGIC = b"QLINEAR\x00"
VERSION = 1
_PREFIX = struct.Struct("<8sIII12s")  # magic, version, header length, header crc, reserved
_ALIGN = 64
_MAX_HEADER = 64 << 20


def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def save_weights(path, weights: Mapping[str, PackedWeight], metadata: Optional[Mapping[str, Any]] = None) -> None:
    """Write several packed weights (and JSON-able metadata) into one file, atomically."""
    entries, offset = {}, 0
    for name, pw in weights.items():
        if not isinstance(name, str):
            raise TypeError(f"tensor names must be str, got {type(name).__name__}")
        if type(pw) is not PackedWeight:
            raise TypeError(f"{name}: expected a PackedWeight, got {type(pw).__name__}")
        data = pw.buffer
        entries[name] = {
            "shape": list(pw.shape), "bits": pw.bits, "group_size": pw.group_size,
            "symmetric": pw.symmetric, "layout": pw.layout, "scale_dtype": "float16",
            "offset": offset, "nbytes": int(data.nbytes), "crc32": zlib.crc32(data),
        }
        offset = _align(offset + data.nbytes)
    header = json.dumps({"tensors": entries, "metadata": dict(metadata or {})},
                        separators=(",", ":")).encode()
    prefix = _PREFIX.pack(MAGIC, VERSION, len(header), zlib.crc32(header), bytes(12))
    data_start = _align(len(prefix) + len(header))
    tmp = f"{os.fspath(path)}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(prefix + header + b"\0" * (data_start - len(prefix) - len(header)))
            for name, pw in weights.items():
                e = entries[name]
                f.seek(data_start + e["offset"])
                f.write(pw.buffer)
            f.truncate(data_start + offset)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _fail(path, why: str):
    raise ValueError(f"{os.fspath(path)}: not a valid qlinear weight file: {why}")


def _int(entry, key, path, name, lo=0, hi=1 << 62) -> int:
    v = entry.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        _fail(path, f"tensor {name!r}: field {key!r} is {v!r}")
    return v


def load_weights(path, mmap_mode: bool = True, verify: bool = True) -> tuple[dict[str, PackedWeight], dict]:
    """Read a file written by save_weights: ({name: PackedWeight}, metadata).

    With ``mmap_mode`` the packed bytes stay in the page cache (no copy, shared between
    processes); ``verify`` checks every tensor's CRC-32 (reads the whole file once).
    """
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < _PREFIX.size:
            _fail(path, f"{size} bytes is too short")
        magic, version, hlen, hcrc, reserved = _PREFIX.unpack(f.read(_PREFIX.size))
        if magic != MAGIC:
            _fail(path, "bad magic")
        if reserved != bytes(12):
            _fail(path, "reserved bytes are not zero")
        if version != VERSION:
            _fail(path, f"format version {version} is not supported (this qlinear reads {VERSION})")
        if hlen > _MAX_HEADER or _PREFIX.size + hlen > size:
            _fail(path, f"header length {hlen} exceeds the file")
        header_bytes = f.read(hlen)
        if zlib.crc32(header_bytes) != hcrc:
            _fail(path, "header checksum mismatch")
        try:
            header = json.loads(header_bytes)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            _fail(path, f"header is not JSON ({e})")
        if not isinstance(header, dict) or not isinstance(header.get("tensors"), dict):
            _fail(path, "header has no tensor table")
        metadata = header.get("metadata", {})
        if not isinstance(metadata, dict):
            _fail(path, "metadata is not an object")
        data_start = _align(_PREFIX.size + hlen)
        if mmap_mode and size > 0:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        else:
            f.seek(0)
            buf = f.read()
    whole = np.frombuffer(buf, dtype=np.uint8)
    family = _core.family_layout()
    out = {}
    for name, e in header["tensors"].items():
        if not isinstance(e, dict):
            _fail(path, f"tensor {name!r} entry is not an object")
        shape = e.get("shape")
        if (not isinstance(shape, list) or len(shape) != 2
                or not all(isinstance(s, int) and not isinstance(s, bool) and 0 < s < 1 << 31 for s in shape)):
            _fail(path, f"tensor {name!r}: bad shape {shape!r}")
        bits = _int(e, "bits", path, name, 4, 8)
        group_size = _int(e, "group_size", path, name, 1, 1 << 31)
        offset = _int(e, "offset", path, name)
        nbytes = _int(e, "nbytes", path, name)
        crc = _int(e, "crc32", path, name, 0, 0xFFFFFFFF)
        symmetric, layout = e.get("symmetric"), e.get("layout")
        if not isinstance(symmetric, bool) or not isinstance(layout, str) or e.get("scale_dtype") != "float16":
            _fail(path, f"tensor {name!r}: bad symmetric / layout / scale_dtype")
        if offset % _ALIGN or data_start + offset + nbytes > size:
            _fail(path, f"tensor {name!r}: data [{offset}, +{nbytes}) lies outside the file (truncated?)")
        data = whole[data_start + offset: data_start + offset + nbytes]
        if verify and zlib.crc32(data) != crc:
            _fail(path, f"tensor {name!r}: data checksum mismatch (corrupt file)")
        try:  # validates the geometry and that nbytes matches it
            handle = _core.PackedWeightHandle(data, shape[0], shape[1], bits, group_size, symmetric, layout)
        except ValueError as err:
            _fail(path, f"tensor {name!r}: {err}")
        pw = PackedWeight(handle)
        if layout != family:  # packed for another CPU family: move the codes, no re-rounding
            codes, scale, off = pw.unpack()
            pw = pack_quantized(codes, scale, off, bits, group_size, symmetric)
        out[name] = pw
    return out, metadata


def load_weight(path, mmap: bool = True, verify: bool = True) -> PackedWeight:
    """Load a file written by ``PackedWeight.save``."""
    weights, _ = load_weights(path, mmap_mode=mmap, verify=verify)
    if len(weights) != 1:
        raise ValueError(f"{os.fspath(path)} holds {len(weights)} tensors; use qlinear.load_weights")
    return next(iter(weights.values()))
