"""Where each routed expert's weights are in a model file, and how one is read into an expert
cache's slot (``experts.ExpertCache``): ``read_job(layer, expert, gate_up, down)`` gives the reads
and what to run once they are done; ``read_bytes`` is what one expert reads, ``expert_bytes``
what its slot holds.

A converted file (``ExpertFile``) stores each expert's gate_up right before its down
(``layers.N.experts.E.*``), packed as the kernels read them: one ``preadv`` of one contiguous range
(a gap between the two, if any, is read into a scratch buffer).

A GGUF file (``GGUFExpertFile``, llama.cpp's Qwen3-MoE / OLMoE files) stacks a layer's experts:
``blk.N.ffn_{gate,up,down}_exps`` hold [experts, rows, k] blocks, each expert's slice contiguous.
An expert is three reads into a staging buffer; the reader thread that finishes each moves its
codes into the slot's packed weights (Q4_0 / Q8_0: ``_core.pack_gguf_rows``; the block formats,
Q4_K, Q6_K, MXFP4, ...: ``_core.pack_block_rows``; the bytes the in-memory load packs, so the
logits equal ``llm.load(path)``'s bit for bit). The types may differ from layer to layer (a
Q4_K_M file's downs are Q6_K in some layers, Q4_K in the others): a slot's buffers hold the
largest, and each layer's experts are computed with that layer's geometry over them. Staging
buffers are few (``staging``: a layer's experts for one token); a read waits for one to be free.

Every file: ``kinds`` the distinct (gate_up, down) geometries, ``kind(layer)`` a layer's,
``expert_bytes`` a slot's bytes, ``read_bytes_of(layer)`` / ``expert_bytes_of(layer)`` what one
of the layer's experts reads and holds.
"""

from __future__ import annotations

import queue

import numpy as np

from ... import _core, blocks
from ..._ops import core_handle
from . import layout as flash_layout

PARTS = ("gate_up", "down")
MAX_GAP = 4096   # a gap between an expert's gate_up and down read along rather than a second read
GGUF_BITS = {"Q4_0": 4, "Q8_0": 8}   # the GGUF expert types whose codes move into our layouts


class _Kinds:
    """A file's kinds of layer: ``kinds`` the distinct (gate_up, down) geometries, ``_kind`` each
    layer's index into them, ``_read`` what one of a layer's experts reads."""

    def _add_layer(self, geoms: tuple) -> None:
        """The next layer's (gate_up, down) geometries: a kind of its own, or one seen before."""
        if geoms not in self.kinds:
            self.kinds.append(geoms)
        self._kind.append(self.kinds.index(geoms))

    def kind(self, layer: int) -> int:
        return self._kind[layer]

    def read_bytes_of(self, layer: int) -> int:
        return self._read[layer]

    def expert_bytes_of(self, layer: int) -> int:
        gu, d = self.kinds[self._kind[layer]]
        return gu.nbytes + d.nbytes


class ExpertFile(_Kinds):
    """Where each (layer, expert)'s gate_up and down are in a converted model file, and their geometry
    (one per layer: a layer's experts alike, the layers' kinds may differ)."""

    def __init__(self, path, entries: dict, cfg, file_size: int):
        self.path, self.L, self.E = str(path), cfg.num_layers, cfg.num_experts
        self.names, self.ranges, self.kinds, self._kind = set(), {}, [], []
        gaps = set()
        for i in range(self.L):
            geoms = set()
            for e in range(self.E):
                ents = []
                for p in PARTS:
                    n = f"layers.{i}.experts.{e}.{p}"
                    if n not in entries or entries[n].get("kind", "packed") != "packed":
                        raise ValueError(f"{path}: no packed expert weight {n!r} "
                                         "(memory='flash' needs quantized expert weights)")
                    self.names.add(n)
                    ents.append(entries[n])
                try:
                    g = tuple(flash_layout.Geometry.of_entry(x) for x in ents)
                except ValueError as err:
                    raise ValueError(f"{path}: layer {i} expert {e}: {err}") from None
                geoms.add(g)
                (gs, gn), (ds, dn) = ((x["start"], x["nbytes"]) for x in ents)
                if max(gs + gn, ds + dn) > file_size:
                    raise ValueError(f"{path}: layer {i} expert {e} ends at byte {max(gs + gn, ds + dn)}, past the "
                                     f"end of the file ({file_size} bytes): the file is truncated")
                if (g[0].nbytes, g[1].nbytes) != (gn, dn):
                    raise ValueError(f"{path}: expert sizes do not match their geometry")
                self.ranges[i, e] = (gs, ds)
                gaps.add(ds - gs - gn)
            if len(geoms) != 1:
                raise ValueError(f"{path}: layer {i}'s experts are quantized differently; memory='flash' reads "
                                 "one geometry a layer")
            self._add_layer(geoms.pop())
        flash_layout.check_readable([g for kind in self.kinds for g in kind], self.path)
        self.gate_up_bytes = max(g.nbytes for g, _ in self.kinds)
        self.down_bytes = max(d.nbytes for _, d in self.kinds)
        self.expert_bytes = self.gate_up_bytes + self.down_bytes   # a slot: the largest of each
        self._read = [self.expert_bytes_of(i) for i in range(self.L)]
        self.read_bytes = round(sum(self._read) / self.L)          # an expert's read, over the layers
        self.staging_bytes = 0
        self.gap = gaps.pop() if len(gaps) == 1 and 0 <= min(gaps or {0}) <= MAX_GAP else None
        self.scratch = np.empty(self.gap or 0, np.uint8)   # the gap's bytes land here (not kept)
        self.max_read = max(self._read) + self.gap if self.gap is not None else max(self.gate_up_bytes, self.down_bytes)

    def reads(self, layer: int, expert: int, gate_up: np.ndarray, down: np.ndarray) -> list:
        gs, ds = self.ranges[layer, expert]
        gu, dn = self.kinds[self._kind[layer]]
        gate_up, down = gate_up[:gu.nbytes], down[:dn.nbytes]   # the slot's buffers hold the largest kind
        if self.gap is None:   # apart in the file: two reads
            return [(gs, [memoryview(gate_up)]), (ds, [memoryview(down)])]
        mid = [memoryview(self.scratch)] if self.gap else []
        return [(gs, [memoryview(gate_up), *mid, memoryview(down)])]

    def read_job(self, layer: int, expert: int, gate_up: np.ndarray, down: np.ndarray) -> tuple:
        return self.reads(layer, expert, gate_up, down), None


class GGUFExpertFile(_Kinds):
    """Where each layer's stacked experts are in a GGUF file (``f``: ``gguf.file.GGUFFile``)."""

    def __init__(self, f, cfg, staging: int):
        self.path, self.L, self.E = str(f.path), cfg.num_layers, cfg.num_experts
        H, M = cfg.hidden_size, cfg.moe_intermediate_size
        self.names, self.ranges, self.kinds, self._kind, self._read = set(), {}, [], [], []
        for i in range(self.L):
            parts, types = [], []
            for part, rows, k in (("gate", M, H), ("up", M, H), ("down", H, M)):
                name = f"blk.{i}.ffn_{part}_exps.weight"
                t = f.tensor(name, (self.E, rows, k))   # checked: present, in the file, of this shape
                kind = t.tensor_type.name
                if kind not in GGUF_BITS and kind not in blocks.FORMATS:
                    raise ValueError(f"{self.path}: {name} is {kind}; memory='flash' reads experts of "
                                     f"{', '.join([*GGUF_BITS, *blocks.FORMATS])} (llm.convert the file, then "
                                     "load the converted model with memory='flash')")
                types.append(kind)
                self.names.add(name)
                parts.append((int(t.data_offset), int(t.n_bytes) // self.E, rows))   # an expert's slice
            if types[0] != types[1]:
                raise ValueError(f"{self.path}: layer {i}'s expert gate is {types[0]} and its up {types[1]}; "
                                 "memory='flash' reads the two in one type (they are one fused weight)")
            self._add_layer((self._geometry(types[0], 2 * M, H), self._geometry(types[2], H, M)))
            self._read.append(sum(size for _, size, _ in parts))
            self.ranges[i] = parts
        self.gate_up_bytes = max(g.nbytes for g, _ in self.kinds)
        self.down_bytes = max(d.nbytes for _, d in self.kinds)
        self.expert_bytes = self.gate_up_bytes + self.down_bytes   # a slot: the largest of each
        self.read_bytes = round(sum(self._read) / self.L)          # an expert's read, over the layers
        self.max_read = max(size for i in range(self.L) for _, size, _ in self.ranges[i])   # one read's bytes
        self.max_expert_read = max(self._read)                     # a staging buffer's bytes
        self._staging: queue.SimpleQueue = queue.SimpleQueue()
        for _ in range(staging):
            self._staging.put(np.empty(self.max_expert_read, np.uint8))
        self.staging_bytes = staging * self.max_expert_read

    @staticmethod
    def _geometry(kind: str, n: int, k: int):
        if kind in blocks.FORMATS:
            return flash_layout.BlockGeometry(n, k, kind)
        bits = GGUF_BITS[kind]
        return flash_layout.Geometry(n, k, bits, 32, True, _core.native_layout(bits))   # pack_gguf_rows's layout

    def reads(self, layer: int, expert: int, raw: np.ndarray) -> tuple:
        """The reads of the expert's gate, up and down slices into ``raw`` (a staging buffer),
        and the three slices' views of it ([rows, bytes per row])."""
        reads, pieces, at = [], [], 0
        for offset, size, rows in self.ranges[layer]:
            reads.append((offset + expert * size, [memoryview(raw[at:at + size])]))
            pieces.append(raw[at:at + size].reshape(rows, -1))
            at += size
        return reads, pieces

    def read_job(self, layer: int, expert: int, gate_up: np.ndarray, down: np.ndarray) -> tuple:
        """Reads of the expert into a staging buffer, each with the move of its slice's codes into
        ``gate_up`` / ``down`` (the slot's packed buffers, in the layer's geometry), and what frees
        the buffer after them."""
        raw = self._staging.get()   # freed by a reader thread when an earlier expert's move is done
        reads, pieces = self.reads(layer, expert, raw)
        gu, dn = self.kinds[self._kind[layer]]
        targets = ((gu, gate_up, 0), (gu, gate_up, gu.n // 2), (dn, down, 0))

        # each slice's codes moved by the worker that read it, as soon as it is read (three moves
        # in parallel, overlapping the other reads: 1.11x decode with random routing against one
        # move of all three after the last read); the staging buffer freed once all are done
        def mover(src, g, buf, row0):
            def move() -> None:
                dst = core_handle(flash_layout.packed(buf, g))
                if isinstance(g, flash_layout.BlockGeometry):
                    _core.pack_block_rows(src, dst, row0)
                else:
                    _core.pack_gguf_rows(src, "Q4_0" if g.bits == 4 else "Q8_0", dst, row0)
            return move
        return ([(off, views, mover(src, *t)) for (off, views), src, t in zip(reads, pieces, targets)],
                lambda ok: self._staging.put(raw))
