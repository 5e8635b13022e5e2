"""PackedWeight: a weight quantized and packed for this CPU's kernels."""

from __future__ import annotations

from typing import Optional

import numpy as np

from . import _core
from ._arrays import optional_positive_int, weight_to_numpy
from ._scheme import GROUP_SIZES, group_of


class PackedWeight:
    """A weight ``[N, K]`` quantized to int4 / int8 and packed in the layout of this CPU's kernels.

    The packed bytes hold, per panel of ``nr`` output rows and per block of k, the codes followed
    by float16 scales (and float16 offsets for asymmetric weights): see ``layout``.
    """

    __slots__ = ("_h", "__weakref__")

    def __init__(self, handle: "_core.PackedWeightHandle"):
        if not isinstance(handle, _core.PackedWeightHandle):
            raise TypeError("use qlinear.pack_weight(...) or qlinear.load_weight(...) to make a PackedWeight")
        self._h = handle

    # -- description -----------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, int]:
        return (self._h.n, self._h.k)

    @property
    def bits(self) -> int:
        """Code bits (4 or 8; a block format's 4, 5 or 6)."""
        return self._h.bits

    @property
    def format(self) -> str:
        """"affine" (int4 / int8 with float16 scales and offsets) or a block format's GGUF name
        ("Q4_K", "Q6_K", "IQ4_XS", "MXFP4", ...: ``qlinear.blocks``)."""
        return self._h.format

    @property
    def group_size(self) -> int:
        """k per scale; equals K for per-channel weights."""
        return self._h.group_size

    @property
    def per_channel(self) -> bool:
        return self._h.group_size >= self._h.k

    @property
    def symmetric(self) -> bool:
        return self._h.symmetric

    @property
    def layout(self) -> str:
        return self._h.layout

    @property
    def scale_dtype(self) -> np.dtype:
        return np.dtype(np.float16)

    @property
    def nbytes(self) -> int:
        """Bytes of packed codes, scales and offsets (what a GEMV reads)."""
        return self._h.nbytes

    @property
    def bits_per_weight(self) -> float:
        """Stored bits per weight, scales and offsets (and padding) included."""
        n, k = self.shape
        return self._h.nbytes * 8 / (n * k)

    @property
    def buffer(self) -> np.ndarray:
        """The packed bytes (read-only view)."""
        b = np.frombuffer(self._h.buffer, dtype=np.uint8)
        return b

    def __repr__(self) -> str:
        if self.format == "parts":
            return (f"PackedWeight(shape={self.shape}, parts {[p.format for p in self.parts]}, "
                    f"{self.bits_per_weight:.3f} bits/weight)")
        if self.format != "affine":
            return (f"PackedWeight(shape={self.shape}, {self.format}, "
                    f"layout={self.layout!r}, {self.bits_per_weight:.3f} bits/weight)")
        kind = "per-channel" if self.per_channel else f"group {self.group_size}"
        sym = "symmetric" if self.symmetric else "asymmetric"
        return (f"PackedWeight(shape={self.shape}, int{self.bits}, {kind}, {sym}, "
                f"layout={self.layout!r}, {self.bits_per_weight:.3f} bits/weight)")

    # -- contents --------------------------------------------------------------------------
    def unpack(self) -> tuple[np.ndarray, np.ndarray, Optional[np.ndarray]]:
        """(codes uint8 [N, K], scale float16 [N, G], offset float16 [N, G] or None).

        Codes are as stored: q for asymmetric weights, q + zero_point (8 / 128) for symmetric.
        A block-format weight unpacks to its file rows instead: ``unpack_blocks``.
        """
        return _core.unpack(self._h)

    @property
    def parts(self) -> list:
        """A weight of parts (``stack_weights``): its parts, each a PackedWeight (copies); else []."""
        return [PackedWeight(h) for h in _core.weight_parts(self._h)]

    def unpack_blocks(self) -> np.ndarray:
        """A block-format weight's rows as the file stores them (uint8 [N, bytes per row])."""
        return _core.unpack_blocks(self._h)

    def copy_to(self, out: np.ndarray) -> "PackedWeight":
        """This weight over ``out`` (a writable uint8 array of ``nbytes``), its bytes copied there."""
        out[:] = self.buffer
        h = self._h
        if h.format == "parts":
            return PackedWeight(_core.parts_handle(out, [p._spec() for p in self.parts]))
        if h.format != "affine":
            return PackedWeight(_core.PackedWeightHandle(out, h.n, h.k, h.format))
        return PackedWeight(_core.PackedWeightHandle(out, h.n, h.k, h.bits, h.group_size, h.symmetric, h.layout))

    def _spec(self) -> tuple:
        """This (plain) weight's geometry as a part spec of ``_core.parts_handle``."""
        h = self._h
        if h.format != "affine":
            return (h.format, h.n, h.k)
        return ("affine", h.n, h.k, h.bits, h.group_size, h.symmetric, h.layout)

    def dequantize(self, dtype=np.float32) -> np.ndarray:
        """The weights the kernels really use, ``[N, K]`` (float32 arithmetic)."""
        if self.format == "parts":
            return np.concatenate([p.dequantize(dtype) for p in self.parts])
        if self.format != "affine":
            from . import blocks
            return blocks.dequantize(self.unpack_blocks(), self.format, self.shape[1]).astype(dtype)
        from .reference import QuantizedWeight, dequantize_weight
        codes, scale, offset = self.unpack()
        qw = QuantizedWeight(codes, scale, offset, self.bits, self.group_size, self.symmetric)
        return dequantize_weight(qw, np.dtype(dtype))


def pack_weight(w, bits: int = 4, group_size: Optional[int] = 64,
                symmetric: bool = False, format: Optional[str] = None) -> PackedWeight:
    """Quantize ``w`` ``[N, K]`` (numpy or torch; float32 / float16 / bfloat16; a nested list
    of floats is converted with ``np.asarray``) and pack it (``qlinear.save_weight`` writes it).

    ``group_size``: 32, 64, 128 or 256 consecutive k per scale, or None (or >= K) for one scale
    per output row. ``symmetric=False`` (the default, as mnn-llm) stores a float16 offset per
    group besides the scale.

    ``format``: a block format instead ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q5_0", "Q4_1",
    "Q5_1", "IQ4_NL", "IQ4_XS", "MXFP4": ``qlinear.blocks``): quantized by the package's rounding into the format's
    file blocks, then packed (``bits``, ``group_size`` and ``symmetric`` are the format's).
    """
    if format is not None:
        from . import blocks
        fmt = blocks.block_format(format)
        arr = weight_to_numpy(w)
        if arr.ndim != 2:
            raise ValueError(f"weight must have shape [N, K], got shape {arr.shape}")
        return pack_blocks(blocks.quantize(arr, fmt), fmt.name, arr.shape)
    bits, group_size = _check_params(bits, group_size, symmetric)
    arr = weight_to_numpy(w)
    if arr.ndim != 2:
        raise ValueError(f"weight must have shape [N, K], got shape {arr.shape}")
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(f"weight must be non-empty, got shape {arr.shape}")
    gs = arr.shape[1] if group_size is None else group_size
    return PackedWeight(_core.quantize_and_pack(arr, bits, gs, bool(symmetric)))


def pack_blocks(raw, format: str, shape) -> PackedWeight:
    """A block-format weight of ``shape`` [N, K] from its file rows (uint8 [N, bytes per row], as
    a GGUF file stores the tensor): codes and constants moved into this CPU's layout, nothing
    rounded. Rows whose scales are NaN or infinite are refused."""
    from . import blocks
    fmt = blocks.block_format(format)
    if not (isinstance(shape, (tuple, list)) and len(shape) == 2 and all(isinstance(v, (int, np.integer)) and v > 0 for v in shape)):
        raise ValueError(f"shape must be [N, K] of positive ints, got {shape!r}")
    n, k = int(shape[0]), int(shape[1])
    raw = np.asarray(raw)
    if raw.dtype != np.uint8:
        raise TypeError(f"file rows must be uint8, got {raw.dtype}")
    if raw.ndim == 1:
        raw = raw.reshape(n, -1) if raw.size % n == 0 else raw[None]
    want = (n, blocks.row_bytes(fmt, k))
    if raw.shape != want:
        raise ValueError(f"{fmt.name} weight of shape {(n, k)} needs file rows of shape {want}, got {raw.shape}")
    return PackedWeight(_core.pack_blocks(np.ascontiguousarray(raw), fmt.name, n, k))


def stack_weights(parts) -> PackedWeight:
    """Weights of the same K stacked by rows as one weight (a "weight of parts": its parts may be
    of different formats, e.g. a fused q / k / v whose tensors a file stores in different types);
    ``matmul`` runs each part's kernels into its columns of y. Bytes are copied."""
    parts = list(parts)
    if not parts or not all(isinstance(p, PackedWeight) for p in parts):
        raise TypeError("stack_weights takes a non-empty list of PackedWeights")
    ks = {p.shape[1] for p in parts}
    if len(ks) != 1:
        raise ValueError(f"parts of one weight need the same K, got {sorted(ks)}")
    if len(parts) == 1:
        return parts[0]
    return PackedWeight(_core.concat_weights([p._h for p in parts]))


def pack_quantized(codes, scale, offset, bits: int, group_size: Optional[int],
                   symmetric: bool, layout: str = "") -> PackedWeight:
    """Pack weights that are already quantized (stored codes, float16 scales / offsets), without
    rounding them again: for files of another layout and for other engines' exports."""
    bits, group_size = _check_params(bits, group_size, symmetric)
    codes = np.ascontiguousarray(codes)
    if codes.ndim != 2:
        raise ValueError(f"codes must have shape [N, K], got shape {codes.shape}")
    n, k = codes.shape
    gs = k if group_size is None else group_size
    scale = np.asarray(scale)
    if gs >= k or gs in GROUP_SIZES:  # (other group sizes: the core names the problem)
        want = (n, -(-k // group_of(k, gs)))
        for name, a in (("scale", scale), ("offset", offset)):
            if isinstance(a, np.ndarray) and a.shape != want:
                raise ValueError(f"{name} has the wrong shape {a.shape}: expected {want} "
                                 f"(one per row and group of {group_of(k, gs)} k)")
    return PackedWeight(_core.pack_quantized(codes, scale, offset, bits, gs, bool(symmetric), layout))


def _check_params(bits, group_size, symmetric):
    if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)):
        raise TypeError(f"bits must be an int (4 or 8), got {type(bits).__name__}")
    if bits not in (4, 8):
        raise ValueError(f"bits must be 4 or 8, got {bits}")
    group_size = optional_positive_int(group_size, "group_size")
    if not isinstance(symmetric, (bool, np.bool_)):
        raise TypeError(f"symmetric must be a bool, got {type(symmetric).__name__}")
    return int(bits), group_size
