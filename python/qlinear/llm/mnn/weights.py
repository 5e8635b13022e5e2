"""The weight records of ``llm.mnn.weight``, read with pread (checked, never re-rounded).

For each quantized linear, at its offset: a header (``uint8`` ndim = 2, ``int16`` [N, K]
(``int32`` when ``quanParameter.shapeInt32``), then an ``int8`` code map of 2^bits + 1 bytes),
the codes (``N*K*bits/8`` bytes, row-major; int4 two per byte, high nibble first), then the
block parameters in fp32 (asymmetric: ``[zero, scale]`` per block, row-major
``[N, n_blocks, 2]``; symmetric: ``scale`` per block), then the fp32 bias (``N`` values) if any.
MNN computes ``w = (code - 2^(bits-1)) * scale + zero`` (int4: code - 8, int8: code - 128), so
``offset = zero - 2^(bits-1) * scale`` gives ``w = offset + scale * code``: qlinear's asymmetric
scheme, an MNN block being a group (``offset`` the group minimum, ``scale = (max - min) /
(2^bits - 1)``, codes rounded half to even). fp16 linears (``quanParameter.type == 3``) hold
``N*K`` halves.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Tuple, Union

import numpy as np

from ..pread_file import PreadFile


@dataclass
class QuantizedLinear:
    """One quantized linear layer of an export, as stored (codes are not re-rounded), in
    qlinear's vocabulary (an MNN block is a group).

    ``w[n, k] = offset[n, j] + scale[n, j] * codes[n, k]`` with ``j = k // group_size`` (K when
    ``group_size`` is None: one group per row, per channel).
    """

    codes: np.ndarray           # uint8 [N, K], 0 .. 2^bits - 1
    scale: np.ndarray           # float32 [N, n_groups]
    offset: np.ndarray          # float32 [N, n_groups]
    bits: int
    group_size: Optional[int]   # None: one group spans the whole row
    bias: Optional[np.ndarray] = None   # float32 [N]
    symmetric: bool = False     # exported symmetric: offset == -2^(bits-1) * scale

    @property
    def shape(self) -> Tuple[int, int]:
        return tuple(self.codes.shape)

    @property
    def n_groups(self) -> int:
        return self.scale.shape[1]

    def dequantize(self) -> np.ndarray:
        """float32 [N, K], computed as MNN does (``offset + scale * code`` in float32)."""
        n, k = self.codes.shape
        g = self.group_size or k
        scale = np.repeat(self.scale, g, axis=1)[:, :k]
        offset = np.repeat(self.offset, g, axis=1)[:, :k]
        return (offset + scale * self.codes.astype(np.float32)).astype(np.float32)


Linear = Union[QuantizedLinear, np.ndarray]


class WeightFile:
    """Bounded reads from ``llm.mnn.weight``, with errors naming the file and the record. Reads
    go through pread, not a mapping: the page cache holds the file, the process only what it
    keeps (a model is repacked layer by layer without the export becoming resident)."""

    def __init__(self, path: Path):
        if not path.is_file():
            raise ValueError(f"{path}: missing (the weights)")
        self.path = path
        self._file = PreadFile(path)
        self.size = self._file.size

    def bytes(self, offset: int, length: int, what: str) -> np.ndarray:
        if offset < 0 or length < 0 or offset + length > self.size:
            raise ValueError(f"{self.path}: truncated or corrupt: {what} needs bytes "
                             f"[{offset}, {offset + length}) but the file has {self.size}")
        try:
            data = self._file.read(offset, length)
        except ValueError:
            raise ValueError(f"{self.path}: short read of {what} (file changed while reading?)") from None
        return np.frombuffer(data, dtype=np.uint8)

    def floats(self, offset: int, length: int, what: str) -> np.ndarray:
        if length % 4:
            raise ValueError(f"{self.path}: {what}: {length} bytes is not a whole number of float32")
        return np.array(self.bytes(offset, length, what)).view(np.float32)


def _unpack_codes(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    if bits == 8:
        return np.array(packed[:count], dtype=np.uint8)
    out = np.empty(2 * packed.size, dtype=np.uint8)  # two codes per byte, high nibble first
    np.right_shift(packed, 4, out=out[0::2])
    np.bitwise_and(packed, 0x0F, out=out[1::2])
    return out[:count]


def read_linear(wf: WeightFile, op: dict, payload: bool = True) -> Linear:
    """One linear's record; ``payload=False`` checks the record (header, code map, sizes)
    without reading its codes and block parameters, and returns None."""
    name = op.get("name", "?")
    main = op.get("main") or {}
    common = main.get("common") or {}
    n, k = int(common.get("outputCount", 0)), int(common.get("inputCount", 0))
    ext = main.get("external")
    if not ext or len(ext) < 4:
        raise ValueError(f"{wf.path}: op {name}: no external weight record in the graph")
    if common.get("kernelX", 1) != 1 or common.get("kernelY", 1) != 1 or common.get("group", 1) != 1:
        raise ValueError(f"op {name}: a convolution that is not a linear layer (kernel/group != 1)")
    offset, w_len, a_len, b_len = (int(x) for x in ext[:4])
    quan = main.get("quanParameter") or {}
    qtype = quan.get("type")
    what = f"linear {name} [{n}x{k}]"
    bias = None
    if b_len:
        if b_len != 4 * n:
            raise ValueError(f"{wf.path}: {what}: bias of {b_len} bytes, expected {4 * n}")
        bias = wf.floats(offset + w_len + a_len, b_len, f"{what} bias").copy()
    if qtype == 3:   # fp16 weights
        if w_len != 2 * n * k or a_len:
            raise ValueError(f"{wf.path}: {what}: fp16 record of {w_len} bytes, expected {2 * n * k}")
        if offset + w_len > wf.size:
            raise ValueError(f"{wf.path}: truncated or corrupt: {what} lies beyond the end of the file")
        if not payload:
            return None
        w = np.array(wf.bytes(offset, w_len, what)).view(np.float16).astype(np.float32).reshape(n, k)
        return w if bias is None else _FloatLinear(w, bias)
    if qtype != 1:
        raise ValueError(f"{what}: unsupported weight storage (quanParameter.type={qtype!r}; "
                         "supported: 1 = quantized, 3 = fp16)")
    bits = int(quan.get("aMaxOrBits", 0))
    if bits not in (4, 8):
        raise ValueError(f"{what}: {bits}-bit weights are not supported (4 or 8)")
    if quan.get("useInt32") or quan.get("has_scaleInt"):
        raise ValueError(f"{what}: integer scales are not supported")
    if str(quan.get("scaleStorage", "FP32")).upper() not in ("FP32", "0"):
        raise ValueError(f"{what}: scale storage {quan.get('scaleStorage')!r} is not supported (FP32)")
    asym = int(quan.get("aMin", 0)) != 0
    # Header: ndim, dims, code map.
    dtype = np.int32 if quan.get("shapeInt32") else np.int16
    ndim = int(wf.bytes(offset, 1, f"{what} header")[0])
    if ndim != 2:
        raise ValueError(f"{wf.path}: {what}: header says {ndim} dimensions, expected 2")
    dsize = np.dtype(dtype).itemsize
    dims = np.array(wf.bytes(offset + 1, 2 * dsize, f"{what} header")).view(dtype).tolist()
    if dims != [n, k]:
        raise ValueError(f"{wf.path}: {what}: header shape {dims} does not match the graph's [{n}, {k}]")
    map_len = 1 + (1 << bits)
    header = 1 + 2 * dsize + map_len
    cmap = np.array(wf.bytes(offset + 1 + 2 * dsize, map_len, f"{what} code map")).view(np.int8)
    half = 1 << (bits - 1)
    expected_map = np.arange(-half, half, dtype=np.int8)
    if not np.array_equal(cmap[1:], expected_map):
        raise ValueError(f"{wf.path}: {what}: unexpected code map (not -{half}..{half - 1})")
    code_bytes = (n * k * bits + 7) // 8
    if w_len != header + code_bytes:
        raise ValueError(f"{wf.path}: {what}: weight record of {w_len} bytes, expected "
                         f"{header + code_bytes} for {bits}-bit codes")
    per_block = 2 if asym else 1
    if a_len % (4 * per_block * n):
        raise ValueError(f"{wf.path}: {what}: {a_len} bytes of block parameters do not divide "
                         f"into {n} rows")
    n_blocks = a_len // (4 * per_block * n)
    if n_blocks < 1 or k % n_blocks:
        raise ValueError(f"{wf.path}: {what}: {n_blocks} blocks do not divide K={k}")
    if offset + w_len + a_len > wf.size:
        raise ValueError(f"{wf.path}: truncated or corrupt: {what} needs bytes [{offset}, "
                         f"{offset + w_len + a_len}) but the file has {wf.size}")
    if not payload:
        return None
    codes = _unpack_codes(wf.bytes(offset + header, code_bytes, f"{what} codes"), bits, n * k)
    codes = codes.reshape(n, k)
    alpha = wf.floats(offset + w_len, a_len, f"{what} block parameters").reshape(n, n_blocks, per_block)
    if asym:
        zero, scale = alpha[..., 0], alpha[..., 1]
    else:
        scale = alpha[..., 0]
        zero = np.zeros_like(scale)
    scale = np.ascontiguousarray(scale, dtype=np.float32)
    group_offset = (zero - np.float32(half) * scale).astype(np.float32)
    return QuantizedLinear(codes=codes, scale=scale, offset=group_offset, bits=bits,
                           group_size=None if n_blocks == 1 else k // n_blocks,
                           bias=bias, symmetric=not asym)


class Linears(Mapping):
    """name -> the linear's record, read from the weight file on each access (so that a model
    can be repacked one layer at a time); every record was checked when the export was read."""

    def __init__(self, wf: WeightFile, ops: Dict[str, dict]):
        self._wf, self._ops = wf, ops

    def __getitem__(self, name: str) -> Linear:
        return read_linear(self._wf, self._ops[name])

    def __iter__(self):
        return iter(self._ops)

    def __len__(self) -> int:
        return len(self._ops)


class _FloatLinear(np.ndarray):
    """A float32 weight array carrying a ``bias`` attribute (fp16 records with a bias)."""

    def __new__(cls, w, bias):
        obj = np.asarray(w, dtype=np.float32).view(cls)
        obj.bias = bias
        return obj

    def __array_finalize__(self, obj):
        self.bias = getattr(obj, "bias", None)
