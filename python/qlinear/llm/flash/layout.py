"""Where a layer's FFN weights sit in a model file, and the bundled ("flash") layout.

The packed layout (``csrc/qlinear/core/layout.h``) stores a weight [N, K] as panels of 8 rows over
the whole K, each panel a sequence of storage blocks (the weight group: 64 k by default). So
FFN neuron i's gate row and up row live in panels i // 8 and (I + i) // 8 of gate_up, and its
down column in block i // block of *every* panel of down (a column's int4 codes share bytes
with its neighbours, its scale with the whole block). The smallest unit that is whole in every
one of the three is a *bundle* of ``block`` neurons (down's storage block): gate_up's panels of
those neurons' gate rows and up rows, and down's block of those k in each of its panels.

A bundled file stores each layer's bundles one after the other (tensor
``layers.N.ffn_bundles``, uint8) instead of ``layers.N.gate_up`` and ``layers.N.down``: one
bundle is one contiguous read, and the whole layer one sequential read. The bytes are the very
bytes of the two packed weights, only moved: reading a layer back gives the same packed weights
(the same logits, bit for bit).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ... import _core
from ..._packed import PackedWeight

NR = 8   # rows per panel (nr8_kr4)

BUNDLES = "ffn_bundles"
FLASH_META = "flash"


class _Panels:
    """Panels of 8 rows over the whole K, each ``nblocks`` storage blocks of ``block`` k and
    ``block_bytes`` bytes (a subclass gives those two)."""

    @property
    def nblocks(self) -> int:
        return -(-self.k // self.block)

    @property
    def panel_bytes(self) -> int:
        return self.nblocks * self.block_bytes

    @property
    def npanels(self) -> int:
        return -(-self.n // NR)

    @property
    def nbytes(self) -> int:
        return self.npanels * self.panel_bytes


@dataclass(frozen=True)
class Geometry(_Panels):
    """A packed weight's byte geometry (as ``make_geometry`` in layout.cc)."""

    n: int
    k: int
    bits: int
    group_size: int
    symmetric: bool
    layout: str = "nr8_kr4"

    @property
    def block(self) -> int:
        if self.group_size < self.k:
            return self.group_size
        return min(-(-self.k // 32) * 32, 256)

    @property
    def block_bytes(self) -> int:
        return NR * self.block * self.bits // 8 + NR * 2 * (1 if self.symmetric else 2)

    @classmethod
    def of_entry(cls, e: dict) -> "Geometry | BlockGeometry":
        n, k = e["shape"]
        fmt = e.get("format", "affine")
        if fmt == "parts":
            raise ValueError("a weight of parts (rows in different formats): memory='flash' reads weights of one format")
        if fmt != "affine":
            return BlockGeometry(int(n), int(k), str(fmt))
        return cls(int(n), int(k), int(e["bits"]), int(e["group_size"]), bool(e["symmetric"]), e["layout"])

    def to_entry(self) -> dict:
        return {"shape": [self.n, self.k], "bits": self.bits, "group_size": self.group_size,
                "symmetric": self.symmetric, "layout": self.layout}


@dataclass(frozen=True)
class BlockGeometry(_Panels):
    """A block-format weight's byte geometry (``qlinear.blocks``; make_block_geometry in
    block_format.cc): panels of 8 rows, each a sequence of storage blocks (one super-block of the
    8 rows: 8 x the file's bytes per super-block), the same bytes on every CPU."""

    n: int
    k: int
    format: str

    @property
    def _f(self):
        from ... import blocks  # noqa: PLC0415
        return blocks.block_format(self.format)

    @property
    def block(self) -> int:
        return self._f.super

    @property
    def block_bytes(self) -> int:
        return NR * self._f.file_bytes

    def to_entry(self) -> dict:
        return {"shape": [self.n, self.k], "format": self.format}


def geometry_of(pw: PackedWeight) -> "Geometry | BlockGeometry":
    if pw.format == "parts":
        raise ValueError("a weight of parts (rows in different formats): memory='flash' reads weights of one format")
    if pw.format != "affine":
        return BlockGeometry(*pw.shape, pw.format)
    return Geometry(*pw.shape, pw.bits, pw.group_size, pw.symmetric, pw.layout)


def check_readable(geoms, where: str) -> None:
    """Flash reads packed bytes into the kernels as the file has them: the running level's kernels
    must read their layout (its own, or on the i8mm level the dotprod level's as well): int8 codes
    are stored flipped on ARM, and the i8mm level keeps 8 k of a row together."""
    for g in geoms:
        if isinstance(g, BlockGeometry):   # one layout on every CPU
            continue
        if not _core.reads_layout(g.layout, g.bits):
            want = _core.native_layout(g.bits)
            raise ValueError(f"{where}: its int{g.bits} weights are packed as {g.layout!r}, this CPU's kernels read "
                             f"{want!r}; memory='flash' reads the file's bytes as they are: load it with "
                             "memory='ram' (which moves the codes) or convert the model on this machine")


class FFNLayout:
    """The bundles of one FFN layer: gate_up [2I, H] and down [H, I] packed weights."""

    def __init__(self, gate_up: Geometry, down: Geometry):
        H, I = down.n, down.k
        if (gate_up.n, gate_up.k) != (2 * I, H):
            raise ValueError(f"gate_up {gate_up.n}x{gate_up.k} does not match down {down.n}x{down.k}")
        if I % NR:
            raise ValueError(f"intermediate size {I} is not a multiple of {NR}: gate and up rows share panels")
        self.gate_up, self.down, self.hidden, self.intermediate = gate_up, down, H, I
        self.neurons = down.block                      # neurons per bundle
        self.count = down.nblocks                      # bundles per layer
        sizes = [self.bundle_size(b) for b in range(self.count)]
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)  # of each bundle in a layer
        self.nbytes = int(self.offsets[-1])

    def neurons_of(self, b: int) -> int:
        return min(self.neurons, self.intermediate - b * self.neurons)

    def rows_bytes(self, b: int) -> int:
        """Bytes of a bundle's gate panels (and as many of up panels)."""
        return self.neurons_of(b) // NR * self.gate_up.panel_bytes

    def bundle_size(self, b: int) -> int:
        return 2 * self.rows_bytes(b) + self.down.npanels * self.down.block_bytes

    # -- views of packed buffers, in a bundle's byte order ------------------------------------
    def _down_blocks(self, down: np.ndarray) -> np.ndarray:
        return down.reshape(self.down.npanels, self.down.nblocks, self.down.block_bytes)

    def bundle_views(self, gate_up: np.ndarray, down: np.ndarray, b: int) -> list:
        """The pieces of packed buffers (uint8, writable or not) that bundle b's bytes are, in
        order: its gate panels, its up panels, its block of each down panel."""
        p, rb = b * self.neurons // NR * self.gate_up.panel_bytes, self.rows_bytes(b)
        up = self.intermediate // NR * self.gate_up.panel_bytes + p
        blocks = self._down_blocks(down)
        return [gate_up[p:p + rb], gate_up[up:up + rb]] + [blocks[i, b] for i in range(self.down.npanels)]

    def _full_parts(self, gate_up: np.ndarray, down: np.ndarray, bundles: np.ndarray) -> tuple:
        """Views [full bundles, bytes] of the gate, up and down parts of the bundles that hold
        ``neurons`` neurons (all but maybe the last), in the packed buffers and in the bundles."""
        full = self.intermediate // self.neurons
        rb = self.rows_bytes(0) if full else 0
        gate = gate_up[:full * rb].reshape(full, rb)
        half = self.intermediate // NR * self.gate_up.panel_bytes
        up = gate_up[half:half + full * rb].reshape(full, rb)
        dn = self._down_blocks(down)[:, :full].transpose(1, 0, 2)
        b = bundles[:int(self.offsets[full])].reshape(full, -1)
        return full, (gate, b[:, :rb]), (up, b[:, rb:2 * rb]), (dn, b[:, 2 * rb:].reshape(dn.shape))

    def bundle(self, gate_up: np.ndarray, down: np.ndarray) -> np.ndarray:
        """The layer's bundled bytes from its two packed buffers."""
        out = np.empty(self.nbytes, np.uint8)
        full, *parts = self._full_parts(gate_up, down, out)
        for src, dst in parts:
            dst[...] = src
        for b in range(full, self.count):
            np.concatenate([v.reshape(-1) for v in self.bundle_views(gate_up, down, b)],
                           out=out[self.offsets[b]:self.offsets[b + 1]])
        return out

    def unbundle(self, bundles: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The two packed buffers from a layer's bundled bytes."""
        gate_up = np.empty(self.gate_up.nbytes, np.uint8)
        down = np.empty(self.down.nbytes, np.uint8)
        full, *parts = self._full_parts(gate_up, down, bundles)
        for dst, src in parts:
            dst[...] = src
        for b in range(full, self.count):
            pos = int(self.offsets[b])
            for v in self.bundle_views(gate_up, down, b):
                v.reshape(-1)[:] = bundles[pos:pos + v.size]
                pos += v.size
        return gate_up, down


def ffn_last(tensors: dict, num_layers: int) -> dict:
    """``tensors`` in the order of a converted file: the FFN weights (gate_up, down) after all
    the rest, layer after layer, so that ``memory="flash"`` reads them as one run of the file."""
    ffn = [f"layers.{i}.{part}" for i in range(num_layers) for part in ("gate_up", "down")]
    ffn = [n for n in ffn if n in tensors]
    last = set(ffn)
    rest = {n: t for n, t in tensors.items() if n not in last}
    return {**rest, **{n: tensors[n] for n in ffn}}


def bundle_file_tensors(tensors: dict, num_layers: int) -> dict:
    """The tensors of a bundled file: each layer's gate_up and down replaced by its bundles; the
    metadata entry (gate_up / down geometry) goes under ``FLASH_META``."""
    out = dict(tensors)
    meta = None
    for i in range(num_layers):
        gu, down = out.pop(f"layers.{i}.gate_up"), out.pop(f"layers.{i}.down")
        if not all(isinstance(w, PackedWeight) for w in (gu, down)):
            raise ValueError("the flash layout needs quantized FFN weights (bits 4 or 8, or a block format)")
        gg, dg = geometry_of(gu), geometry_of(down)
        if meta is not None and (meta["gate_up"], meta["down"]) != (gg.to_entry(), dg.to_entry()):
            raise ValueError(f"layer {i}'s FFN is quantized unlike layer 0's: the flash layout needs one geometry")
        layout = FFNLayout(gg, dg)
        out[f"layers.{i}.{BUNDLES}"] = layout.bundle(np.asarray(gu.buffer), np.asarray(down.buffer))
        meta = {"gate_up": gg.to_entry(), "down": dg.to_entry(), "bundle_neurons": layout.neurons}
    return out, meta


def layout_of_meta(meta: dict, where: str) -> FFNLayout:
    try:
        return FFNLayout(Geometry.of_entry(meta["gate_up"]), Geometry.of_entry(meta["down"]))
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{where}: bad flash layout metadata ({e})") from None


def unbundle_file_tensors(tensors: dict, meta: dict, num_layers: int, where: str) -> None:
    """Put a bundled file's FFN bundles back into gate_up / down packed weights (in memory)."""
    layout = layout_of_meta(meta, where)
    for i in range(num_layers):
        bundles = tensors.pop(f"layers.{i}.{BUNDLES}", None)
        if bundles is None or bundles.dtype != np.uint8 or bundles.shape != (layout.nbytes,):
            raise ValueError(f"{where}: layer {i}'s FFN bundles are missing or of the wrong size")
        for name, geom, buf in zip(("gate_up", "down"), (layout.gate_up, layout.down), layout.unbundle(bundles)):
            tensors[f"layers.{i}.{name}"] = packed(buf, geom)


def packed(buf: np.ndarray, g: "Geometry | BlockGeometry") -> PackedWeight:
    """A PackedWeight over the first ``g.nbytes`` of ``buf`` (the packed bytes, not copied)."""
    buf = buf[:g.nbytes]
    if isinstance(g, BlockGeometry):
        return PackedWeight(_core.PackedWeightHandle(buf, g.n, g.k, g.format))
    return PackedWeight(_core.PackedWeightHandle(buf, g.n, g.k, g.bits, g.group_size, g.symmetric, g.layout))


def copy_resident(t):
    """A tensor copied out of the file mapping into process memory."""
    if isinstance(t, PackedWeight):
        return packed(np.array(t.buffer), geometry_of(t))
    if isinstance(t, np.ndarray):
        return np.array(t)
    return t
