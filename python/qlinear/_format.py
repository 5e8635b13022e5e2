"""The packed-weight file format: checked, versioned, mmap-able, no pickle.

Layout of a file (little-endian)::

    0   8 bytes   magic b"QLINEAR\\0"
    8   u32       format version (2; version 1 files, without array entries, are read too)
    12  u32       header length H (bytes of UTF-8 JSON)
    16  u32       CRC-32 of the header bytes
    20  12 bytes  zero
    32  H bytes   header JSON: {"tensors": {name: entry}, "metadata": {...}}
    ... zero padding to a multiple of 64: the data section starts here
    data          each tensor's packed bytes at entry["offset"] (relative, 64-aligned)

A packed-weight entry: shape [N, K], bits, group_size, symmetric, layout, scale_dtype
("float16"), offset, nbytes, crc32 (of the packed bytes). A packed entry's "format" is absent or
"affine" for those; a block format's name ("Q4_K", ...: shape and format are its geometry, the
same bytes on every CPU; readers from before the block formats refuse such entries, which lack
"bits", so the version stays 2 and one flipped bit cannot turn it into another readable one); or "parts" with "parts": a list of part entries (shape and format, plus
the affine fields for affine parts), their bytes one after another. An array entry (version 2: the float
tensors a model needs besides its packed weights, e.g. norms and a bf16 embedding table):
kind "array", dtype (float32 / float16 / bfloat16 / int32 / uint8: e.g. FFN neuron bundles), shape (any rank), offset, nbytes,
crc32. Loading checks the magic, version, header CRC, every field's type and range, that the
sizes match the geometry and lie inside the file, and (verify=True) the data CRCs, reading them
with pread so that checking does not make the file resident in the process. A file packed for
another CPU family's layout is repacked (without re-rounding).
"""

from __future__ import annotations

import json
import mmap
import os
import struct
import zlib
from typing import Any, Mapping, NamedTuple, Optional, Union

import numpy as np

from . import _core
from ._arrays import bf16_to_float32
from ._packed import PackedWeight, pack_quantized

MAGIC = b"QLINEAR\x00"
VERSION = 2
_READABLE_VERSIONS = (1, 2)
_PREFIX = struct.Struct("<8sIII12s")  # magic, version, header length, header crc, reserved
_ALIGN = 64
_MAX_HEADER = 64 << 20


def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


class BFloat16Array(NamedTuple):
    """A bfloat16 array, held as its uint16 bit patterns (numpy has no bfloat16)."""

    bits: np.ndarray

    @property
    def shape(self) -> tuple:
        return self.bits.shape

    def to_float32(self) -> np.ndarray:
        return bf16_to_float32(self.bits)


Tensor = Union[PackedWeight, np.ndarray, BFloat16Array]
_ARRAY_DTYPES = {"float32": np.float32, "float16": np.float16, "int32": np.int32, "uint8": np.uint8,
                 "bfloat16": np.uint16}


def _tensor_bytes(name: str, t) -> tuple[dict, np.ndarray]:
    """(header entry without offset, bytes) of one tensor to save."""
    if type(t) is PackedWeight:
        return _packed_entry(t), t.buffer
    if isinstance(t, BFloat16Array):
        dtype, arr = "bfloat16", t.bits
        if not isinstance(arr, np.ndarray) or arr.dtype != np.uint16:
            raise TypeError(f"{name}: BFloat16Array bits must be a uint16 numpy array")
    elif isinstance(t, np.ndarray):
        dtype, arr = str(t.dtype), t
        if dtype not in _ARRAY_DTYPES or dtype == "bfloat16":
            raise TypeError(f"{name}: arrays must be float32, float16, int32 or uint8, got {t.dtype}")
    else:
        raise TypeError(f"{name}: expected a PackedWeight, a numpy array or a BFloat16Array, "
                        f"got {type(t).__name__}")
    arr = np.ascontiguousarray(arr)
    return {"kind": "array", "dtype": dtype, "shape": list(arr.shape)}, arr.reshape(-1).view(np.uint8)


def _packed_entry(t: PackedWeight) -> dict:
    if t.format == "parts":
        return {"shape": list(t.shape), "format": "parts", "parts": [_packed_entry(p) for p in t.parts]}
    if t.format != "affine":
        return {"shape": list(t.shape), "format": t.format}
    return {"shape": list(t.shape), "bits": t.bits, "group_size": t.group_size,
            "symmetric": t.symmetric, "layout": t.layout, "scale_dtype": "float16"}


def _shape(e, path, name) -> list:
    shape = e.get("shape")
    if (not isinstance(shape, list) or len(shape) != 2
            or not all(isinstance(s, int) and not isinstance(s, bool) and 0 < s < 1 << 31 for s in shape)):
        _fail(path, f"tensor {name!r}: bad shape {shape!r}")
    return shape


def _affine_spec(e, path, name) -> tuple:
    shape = _shape(e, path, name)
    bits = _int(e, "bits", path, name, 4, 8)
    group_size = _int(e, "group_size", path, name, 1, 1 << 31)
    symmetric, layout = e.get("symmetric"), e.get("layout")
    if not isinstance(symmetric, bool) or not isinstance(layout, str) or e.get("scale_dtype") != "float16":
        _fail(path, f"tensor {name!r}: bad symmetric / layout / scale_dtype")
    return ("affine", shape[0], shape[1], bits, group_size, symmetric, layout)


def _part_spec(e, path, name) -> tuple:
    if not isinstance(e, dict):
        _fail(path, f"tensor {name!r}: a part is not an object")
    fmt = e.get("format", "affine")
    if fmt == "affine":
        return _affine_spec(e, path, name)
    from .blocks import FORMATS  # noqa: PLC0415
    if fmt not in FORMATS:
        _fail(path, f"tensor {name!r}: unknown format {fmt!r}")
    shape = _shape(e, path, name)
    return (fmt, shape[0], shape[1])


def _load_packed(path, name: str, e: dict, data: np.ndarray) -> PackedWeight:
    fmt = e.get("format", "affine")
    try:  # validates the geometry and that nbytes matches it
        if fmt == "parts":
            parts = e.get("parts")
            if not isinstance(parts, list) or not 1 <= len(parts) <= 64:
                _fail(path, f"tensor {name!r}: bad parts")
            specs = [_part_spec(p, path, name) for p in parts]
            if sum(s[1] for s in specs) != _shape(e, path, name)[0]:
                _fail(path, f"tensor {name!r}: its parts' rows do not add up to its shape")
            pw = PackedWeight(_core.parts_handle(data, specs))
            if any(s[0] == "affine" and s[6] != _core.native_layout(s[3]) for s in specs):
                from ._packed import stack_weights  # noqa: PLC0415
                pw = stack_weights([_native(p) for p in pw.parts])
            return pw
        spec = _part_spec(e, path, name)
        if spec[0] != "affine":
            return PackedWeight(_core.PackedWeightHandle(data, spec[1], spec[2], spec[0]))
        return _native(PackedWeight(_core.PackedWeightHandle(data, *spec[1:])))
    except ValueError as err:
        if os.fspath(path) in str(err):
            raise
        _fail(path, f"tensor {name!r}: {err}")


def _native(pw: PackedWeight) -> PackedWeight:
    """An affine weight packed for another CPU family's layout, its codes moved into this one's
    (int8 codes are stored flipped on ARM, docs/kernels.md); no re-rounding."""
    if pw.format != "affine" or pw.layout == _core.native_layout(pw.bits):
        return pw
    codes, scale, off = pw.unpack()
    return pack_quantized(codes, scale, off, pw.bits, None if pw.per_channel else pw.group_size, pw.symmetric)


def save_weights(path, weights: Mapping[str, Tensor], metadata: Optional[Mapping[str, Any]] = None) -> None:
    """Write several tensors -- packed weights, and plain arrays a model needs beside them --
    with JSON-able metadata into one file, atomically."""
    entries, blobs, offset = {}, {}, 0
    for name, t in weights.items():
        if not isinstance(name, str):
            raise TypeError(f"tensor names must be str, got {type(name).__name__}")
        entry, data = _tensor_bytes(name, t)
        entries[name] = {**entry, "offset": offset, "nbytes": int(data.nbytes), "crc32": zlib.crc32(data)}
        blobs[name] = data
        offset = _align(offset + data.nbytes)
    header = json.dumps({"tensors": entries, "metadata": dict(metadata or {})},
                        separators=(",", ":")).encode()
    prefix = _PREFIX.pack(MAGIC, VERSION, len(header), zlib.crc32(header), bytes(12))
    data_start = _align(len(prefix) + len(header))
    tmp = f"{os.fspath(path)}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(prefix + header + b"\0" * (data_start - len(prefix) - len(header)))
            for name, data in blobs.items():
                f.seek(data_start + entries[name]["offset"])
                f.write(data)
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


def _crc_of_range(fd: int, start: int, nbytes: int) -> int:
    """CRC-32 of a file range, read with pread into one small buffer: the page cache holds the
    data, the process does not (checking a mapped range would make it all resident)."""
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    crc, pos, end = 0, start, start + nbytes
    while pos < end:
        n = os.preadv(fd, [view[:min(len(buf), end - pos)]], pos)
        if n <= 0:
            break
        crc = zlib.crc32(view[:n], crc)
        pos += n
    return crc


def _read_header(f, path) -> tuple[int, int, dict, int]:
    """(file size, version, header, data start) of an open file, every field checked."""
    size = os.fstat(f.fileno()).st_size
    if size < _PREFIX.size:
        _fail(path, f"{size} bytes is too short")
    magic, version, hlen, hcrc, reserved = _PREFIX.unpack(f.read(_PREFIX.size))
    if magic != MAGIC:
        _fail(path, "bad magic")
    if reserved != bytes(12):
        _fail(path, "reserved bytes are not zero")
    if version not in _READABLE_VERSIONS:
        _fail(path, f"format version {version} is not supported (this qlinear reads "
                    f"{', '.join(map(str, _READABLE_VERSIONS))})")
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
    if not isinstance(header.get("metadata", {}), dict):
        _fail(path, "metadata is not an object")
    return size, version, header, _align(_PREFIX.size + hlen)


def array_location(path, name: str) -> tuple[int, str, tuple]:
    """(byte offset in the file, dtype, shape) of an array tensor: for readers that pread rows
    (a disk embedding) instead of mapping the file."""
    with open(path, "rb") as f:
        _, _, header, data_start = _read_header(f, path)
    e = header["tensors"].get(name)
    if not isinstance(e, dict) or e.get("kind") != "array":
        _fail(path, f"no array tensor {name!r}")
    return data_start + _int(e, "offset", path, name), e.get("dtype"), tuple(e.get("shape"))


def tensor_entries(path) -> tuple[dict[str, dict], dict]:
    """({name: header entry with "start", the absolute byte offset in the file}, metadata) of a
    file, its header checked, no tensor data read: for readers that pread tensors themselves."""
    with open(path, "rb") as f:
        size, _, header, data_start = _read_header(f, path)
    out = {}
    for name, e in header["tensors"].items():
        if not isinstance(e, dict):
            _fail(path, f"tensor {name!r} entry is not an object")
        start = data_start + _int(e, "offset", path, name)
        if start + _int(e, "nbytes", path, name) > size:
            _fail(path, f"tensor {name!r}: data lies outside the file (truncated?)")
        out[name] = {**e, "start": start}
    return out, header.get("metadata", {})


def check_crc(path, entry: dict) -> None:
    """Check one entry's (from ``tensor_entries``) data CRC-32, read with pread."""
    fd = os.open(os.fspath(path), os.O_RDONLY)
    try:
        if _crc_of_range(fd, entry["start"], entry["nbytes"]) != entry.get("crc32"):
            _fail(path, "data checksum mismatch (corrupt file)")
    finally:
        os.close(fd)


def load_weights(path, mmap_mode: bool = True, verify: bool = True) -> tuple[dict[str, Tensor], dict]:
    """Read a file written by save_weights: ({name: tensor}, metadata); a tensor is a
    PackedWeight, a numpy array or a BFloat16Array, as saved.

    With ``mmap_mode`` the bytes stay in the page cache (no copy, shared between processes;
    arrays are read-only views of the mapping); ``verify`` checks every tensor's CRC-32 (reads
    the whole file once).
    """
    with open(path, "rb") as f:
        size, version, header, data_start = _read_header(f, path)
        metadata = header.get("metadata", {})
        entries = header["tensors"]
        for name, e in entries.items():
            if not isinstance(e, dict):
                _fail(path, f"tensor {name!r} entry is not an object")
            offset = _int(e, "offset", path, name)
            nbytes = _int(e, "nbytes", path, name)
            crc = _int(e, "crc32", path, name, 0, 0xFFFFFFFF)
            if offset % _ALIGN or data_start + offset + nbytes > size:
                _fail(path, f"tensor {name!r}: data [{offset}, +{nbytes}) lies outside the file (truncated?)")
            if verify and _crc_of_range(f.fileno(), data_start + offset, nbytes) != crc:
                _fail(path, f"tensor {name!r}: data checksum mismatch (corrupt file)")
        if mmap_mode and size > 0:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        else:
            f.seek(0)
            buf = f.read()
    whole = np.frombuffer(buf, dtype=np.uint8)
    out = {}
    for name, e in entries.items():
        data = whole[data_start + e["offset"]: data_start + e["offset"] + e["nbytes"]]
        if e.get("kind", "packed") == "array" and version >= 2:
            out[name] = _load_array(path, name, e, data)
            continue
        pw = _load_packed(path, name, e, data)
        out[name] = pw
    return out, metadata


def _load_array(path, name: str, e: dict, data: np.ndarray):
    dtype, shape = e.get("dtype"), e.get("shape")
    if dtype not in _ARRAY_DTYPES:
        _fail(path, f"tensor {name!r}: unknown dtype {dtype!r}")
    if (not isinstance(shape, list) or len(shape) > 8
            or not all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s < 1 << 40 for s in shape)):
        _fail(path, f"tensor {name!r}: bad shape {shape!r}")
    itemsize = np.dtype(_ARRAY_DTYPES[dtype]).itemsize
    if int(np.prod(shape, dtype=object)) * itemsize != data.nbytes:
        _fail(path, f"tensor {name!r}: {data.nbytes} bytes do not hold a {dtype} array of shape {shape}")
    arr = data.view(_ARRAY_DTYPES[dtype]).reshape(shape)
    return BFloat16Array(arr) if dtype == "bfloat16" else arr


def save_weight(path, pw: PackedWeight) -> None:
    """Write one packed weight to a checked, versioned, mmap-able file (``load_weight`` reads it)."""
    if type(pw) is not PackedWeight:
        raise TypeError(f"expected a PackedWeight, got {type(pw).__name__}")
    save_weights(path, {"weight": pw})


def load_weight(path, mmap: bool = True, verify: bool = True) -> PackedWeight:
    """Load a file written by ``save_weight``."""
    weights, _ = load_weights(path, mmap_mode=mmap, verify=verify)
    if len(weights) != 1 or type(next(iter(weights.values()))) is not PackedWeight:
        raise ValueError(f"{os.fspath(path)} holds {len(weights)} tensors; use qlinear.load_weights")
    return next(iter(weights.values()))
