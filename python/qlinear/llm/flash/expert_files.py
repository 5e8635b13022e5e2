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
Q4_0 / Q8_0 codes into the slot's packed weights (``_core.pack_gguf_rows``: the bytes the
in-memory load packs, so the logits equal ``llm.load(path)``'s bit for bit). Staging buffers are
few (``staging``: a layer's experts for one token); a read waits for one to be free.
"""

from __future__ import annotations

import queue

import numpy as np

from ... import _core
from . import layout as flash_layout

PARTS = ("gate_up", "down")
MAX_GAP = 4096   # a gap between an expert's gate_up and down read along rather than a second read
GGUF_BITS = {"Q4_0": 4, "Q8_0": 8}   # the GGUF expert types whose codes move into our layouts


class ExpertFile:
    """Where each (layer, expert)'s gate_up and down are in a converted model file, and their geometry."""

    def __init__(self, path, entries: dict, cfg, file_size: int):
        self.path, self.L, self.E = str(path), cfg.num_layers, cfg.num_experts
        self.names, geoms, self.ranges = set(), set(), {}
        for i in range(self.L):
            for e in range(self.E):
                ents = []
                for p in PARTS:
                    n = f"layers.{i}.experts.{e}.{p}"
                    if n not in entries or entries[n].get("kind", "packed") != "packed":
                        raise ValueError(f"{path}: no packed expert weight {n!r} "
                                         "(memory='flash' needs quantized expert weights)")
                    self.names.add(n)
                    ents.append(entries[n])
                geoms.add(tuple(flash_layout.Geometry.of_entry(x) for x in ents))
                (gs, gn), (ds, dn) = ((x["start"], x["nbytes"]) for x in ents)
                if max(gs + gn, ds + dn) > file_size:
                    raise ValueError(f"{path}: layer {i} expert {e} ends at byte {max(gs + gn, ds + dn)}, past the "
                                     f"end of the file ({file_size} bytes): the file is truncated")
                self.ranges[i, e] = (gs, ds)
        if len(geoms) != 1:
            raise ValueError(f"{path}: the experts are quantized differently; memory='flash' reads one geometry")
        self.gate_up, self.down = geoms.pop()
        flash_layout.check_readable((self.gate_up, self.down), self.path)
        if any(g.nbytes != n for g, n in zip((self.gate_up, self.down), (gn, dn))):
            raise ValueError(f"{path}: expert sizes do not match their geometry")
        self.expert_bytes = self.read_bytes = self.gate_up.nbytes + self.down.nbytes
        self.staging_bytes = 0
        gaps = {ds - gs - self.gate_up.nbytes for gs, ds in self.ranges.values()}
        self.gap = gaps.pop() if len(gaps) == 1 and 0 <= min(gaps or {0}) <= MAX_GAP else None
        self.scratch = np.empty(self.gap or 0, np.uint8)   # the gap's bytes land here (not kept)
        self.max_read = self.read_bytes + self.gap if self.gap is not None else max(gn, dn)   # one read's bytes

    def reads(self, layer: int, expert: int, gate_up: np.ndarray, down: np.ndarray) -> list:
        gs, ds = self.ranges[layer, expert]
        if self.gap is None:   # apart in the file: two reads
            return [(gs, [memoryview(gate_up)]), (ds, [memoryview(down)])]
        mid = [memoryview(self.scratch)] if self.gap else []
        return [(gs, [memoryview(gate_up), *mid, memoryview(down)])]

    def read_job(self, layer: int, expert: int, gate_up: np.ndarray, down: np.ndarray) -> tuple:
        return self.reads(layer, expert, gate_up, down), None


class GGUFExpertFile:
    """Where each layer's stacked experts are in a GGUF file (``f``: ``gguf.file.GGUFFile``)."""

    def __init__(self, f, cfg, staging: int):
        self.path, self.L, self.E = str(f.path), cfg.num_layers, cfg.num_experts
        H, M = cfg.hidden_size, cfg.moe_intermediate_size
        self.names, self.ranges, types = set(), {}, set()
        for i in range(self.L):
            parts = []
            for part, rows, k in (("gate", M, H), ("up", M, H), ("down", H, M)):
                name = f"blk.{i}.ffn_{part}_exps.weight"
                t = f.tensor(name, (self.E, rows, k))   # checked: present, in the file, of this shape
                kind = t.tensor_type.name
                if kind not in GGUF_BITS:
                    raise ValueError(f"{self.path}: {name} is {kind}; memory='flash' reads Q4_0 or Q8_0 experts "
                                     "(llm.convert the file, then load the converted model with memory='flash')")
                types.add(kind)
                self.names.add(name)
                parts.append((int(t.data_offset), int(t.n_bytes) // self.E, rows))   # an expert's slice
            self.ranges[i] = parts
        if len(types) != 1:
            raise ValueError(f"{self.path}: the experts mix {' and '.join(sorted(types))}; "
                             "memory='flash' reads one type")
        self.type = types.pop()
        bits = GGUF_BITS[self.type]
        layout = _core.native_layout(bits)   # pack_gguf_rows writes this CPU's layout
        self.gate_up = flash_layout.Geometry(2 * M, H, bits, 32, True, layout)
        self.down = flash_layout.Geometry(H, M, bits, 32, True, layout)
        self.expert_bytes = self.gate_up.nbytes + self.down.nbytes
        self.read_bytes = sum(size for _, size, _ in self.ranges[0])
        self.max_read = max(size for _, size, _ in self.ranges[0])   # one read's bytes
        self._staging: queue.SimpleQueue = queue.SimpleQueue()
        for _ in range(staging):
            self._staging.put(np.empty(self.read_bytes, np.uint8))
        self.staging_bytes = staging * self.read_bytes

    def reads(self, layer: int, expert: int, raw: np.ndarray) -> tuple:
        """The reads of the expert's gate, up and down slices into ``raw`` (read_bytes), and the
        three slices' views of it ([rows, bytes per row])."""
        reads, pieces, at = [], [], 0
        for offset, size, rows in self.ranges[layer]:
            reads.append((offset + expert * size, [memoryview(raw[at:at + size])]))
            pieces.append(raw[at:at + size].reshape(rows, -1))
            at += size
        return reads, pieces

    def read_job(self, layer: int, expert: int, gate_up: np.ndarray, down: np.ndarray) -> tuple:
        """Reads of the expert into a staging buffer, each with the move of its slice's codes into
        ``gate_up`` / ``down`` (the slot's packed buffers), and what frees the buffer after them."""
        raw = self._staging.get()   # freed by a reader thread when an earlier expert's move is done
        reads, pieces = self.reads(layer, expert, raw)
        targets = ((self.gate_up, gate_up, 0), (self.gate_up, gate_up, self.gate_up.n // 2), (self.down, down, 0))

        # each slice's codes moved by the worker that read it, as soon as it is read (three moves
        # in parallel, overlapping the other reads: 1.11x decode with random routing against one
        # move of all three after the last read); the staging buffer freed once all are done
        def mover(src, g, buf, row0):
            def move() -> None:
                dst = _core.PackedWeightHandle(buf, g.n, g.k, g.bits, g.group_size, g.symmetric, g.layout)
                _core.pack_gguf_rows(src, self.type, dst, row0)
            return move
        return ([(off, views, mover(src, *t)) for (off, views), src, t in zip(reads, pieces, targets)],
                lambda ok: self._staging.put(raw))
