"""Routed experts read from the model file on demand (``memory="flash"`` for MoE models).

Where the experts are in the file (``expert_files``): a converted file stores each expert's
gate_up right before its down (one ``preadv`` an expert); a GGUF file stacks them per layer
(three reads an expert, whose codes are moved into place as they arrive). ``ExpertCache`` holds
N slots, each a preallocated (gate_up, down) pair of packed buffers; an expert not in a slot is
read into a slot that no running expert pins, the one whose expert was needed least often since
load, ties to the most recently used
(``policy="lfu"``, the default; "lru": the least recently used). A trained router's 4 layers x
8 experts, 400 tokens, caches of 4 / 8 / 16: LFU hits 15.7 / 46.7 / 77.9%, LRU 0 / 44.5 / 69.0%
(a cache smaller than the experts a token cycles through is LRU's worst case: each evicted just
before it is needed again); the blocks that run them: ``moe_block``. With ``prefetch="router"``
(``model.flash.experts.prefetch``), after a decode token's block the next layer's router applied
to this residual (its attention not yet added) names experts to read while that layer's
attention runs. Off by default: it raised the hit rate but also the bytes read per token in
every case measured (bench/moe_flash.py, docs/flash.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from . import layout as flash_layout
from .eviction import EvictionOrder
from .expert_files import ExpertFile, GGUFExpertFile
from .reader import FlashReader
from ... import _core
from ..._ops import core_handle
from ..runtime.layers import Linear
from ..runtime.moe import expert_activation

PREFETCH = ("router", "none")
# Reader threads: reads in flight. A token's misses of a layer are read together, a GGUF file's
# expert in three reads (~9 a layer): 8 threads decoded 1.20x 4, 12 1.15x 8 (random routing,
# Zen 5 VM, O_DIRECT, A/B in one process); a converted file's one read an expert: 8 0.95x 4.
EXPERT_READERS = 12
POLICIES = ("lru", "lfu")


@dataclass
class ExpertStats:
    hits: int = 0            # experts a block needed that were in a slot (or being read by a prefetch)
    misses: int = 0          # experts read because a block needed them
    prefetched: int = 0      # experts read ahead (prefetch="router")
    prefetch_used: int = 0   # of those, experts a block then needed
    bytes: int = 0           # expert bytes read (misses and prefetches)

    @property
    def hit_rate(self) -> float:
        return self.hits / (self.hits + self.misses) if self.hits + self.misses else 0.0

    def as_dict(self) -> dict:
        return {**vars(self), "hit_rate": self.hit_rate}


class _Slot:
    def __init__(self, index: int, files: "ExpertFile | GGUFExpertFile", act: str, act_block: int):
        self.index = index
        # buffers of the largest geometry; the Linears of each kind of layer over them
        self.gate_up_buf = np.zeros(files.gate_up_bytes, np.uint8)
        self.down_buf = np.zeros(files.down_bytes, np.uint8)
        self.linears = [(Linear(flash_layout.packed(self.gate_up_buf, g), None, act, act_block),
                         Linear(flash_layout.packed(self.down_buf, d), None, act, act_block)) for g, d in files.kinds]
        self.key: Optional[tuple] = None
        self.job = None
        self.pins = 0
        self.prefetched = False


class ExpertCache:
    """``slots`` experts held in memory, read by ``reader``; ``policy`` picks whom to evict."""

    def __init__(self, reader: FlashReader, files: "ExpertFile | GGUFExpertFile", slots: int, act: str, act_block: int,
                 prefetch: str = "none", policy: str = "lfu"):
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise ValueError(f"expert slots must be an int >= 1, got {slots!r}")
        self.reader, self.files = reader, files
        self.slots = [_Slot(i, files, act, act_block) for i in range(slots)]
        self.where: dict = {}   # key -> slot
        self.free = list(self.slots)
        self.stats = ExpertStats()
        self.prefetch = prefetch
        self.policy = policy
        self.order = EvictionOrder(slots)   # whom to evict (policy)
        self._compiled: dict = {}   # kind of layer -> _core.MoeExperts over the slots (compiled())

    def compiled(self, cfg, layer: int) -> Optional[object]:
        """The compiled routed MLP over the slots for ``layer`` (``_core.MoeExperts``, one for all
        layers of a kind: they run one after another), or None for an activation it lacks (then
        numpy runs the experts)."""
        if cfg.hidden_act not in ("silu", "gelu_tanh", "clamped_swiglu"):
            return None
        kind = self.files.kind(layer)
        if kind not in self._compiled:
            def spec(m: Linear):  # (the experts' biases are given per layer, to begin())
                return (core_handle(m.weight), None, m.act == "int8", int(m._block))
            self._compiled[kind] = _core.moe_experts([(spec(s.linears[kind][0]), spec(s.linears[kind][1]))
                                                      for s in self.slots],
                                                     cfg.num_experts, cfg.experts_per_token, **expert_activation(cfg))
        return self._compiled[kind]

    @property
    def prefetch(self) -> str:
        return self._prefetch

    @prefetch.setter
    def prefetch(self, how: str) -> None:
        if how not in PREFETCH:
            raise ValueError(f"prefetch must be one of {', '.join(PREFETCH)}, got {how!r}")
        self._prefetch = how

    @property
    def nbytes(self) -> int:
        return len(self.slots) * self.files.expert_bytes

    @property
    def policy(self) -> str:
        return self._policy

    @policy.setter
    def policy(self, how: str) -> None:
        """"lru": evict the least recently used; "lfu": the least often needed since load (ties:
        the most recently used: ``eviction.py``), so that a cache smaller than the experts a token cycles through
        keeps the most used ones instead of evicting each just before it is needed again."""
        if how not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {how!r}")
        self._policy = how

    def _victim(self) -> Optional[_Slot]:
        if self.free:
            return self.free.pop()
        key = self.order.victim(self._policy, lambda k: self.where[k].pins > 0)
        return None if key is None else self.where.pop(key)

    def _read(self, key: tuple, prefetch: bool = False) -> Optional[_Slot]:
        slot = self._victim()
        if slot is None:
            return None
        if slot.job is not None:   # an unused prefetch's read may still run into this slot
            slot.job.wait()
        slot.key, slot.prefetched = key, prefetch
        slot.job = self.reader.submit(*self.files.read_job(*key, slot.gate_up_buf, slot.down_buf))
        self.where[key] = slot
        self.order.touch(key)
        self.stats.bytes += self.files.read_bytes_of(key[0])
        return slot

    def request(self, layer: int, experts) -> dict:
        """Pin the experts of ``layer`` that a block is about to run: hits pinned, misses' reads
        started in ascending order while slots are free (the rest in ``get``). -> {expert: slot}"""
        got = {}
        for e in experts:
            key = (layer, int(e))
            self.order.need(key)
            slot = self.where.get(key)
            if slot is not None:
                self.stats.hits += 1
                if slot.prefetched:
                    self.stats.prefetch_used += 1
                    slot.prefetched = False
                self.order.touch(key)
                slot.pins += 1
                got[int(e)] = slot
        for e in experts:
            if int(e) not in got:
                self.stats.misses += 1
                slot = self._read((layer, int(e)))
                if slot is not None:
                    slot.pins += 1
                    got[int(e)] = slot
        return got

    def get(self, layer: int, expert: int, got: dict) -> tuple:
        """(gate_up, down) Linears of an expert ``request`` returned or left for later, its read done."""
        slot = got.get(expert)
        if slot is None:
            slot = self._read((layer, expert))
            if slot is None:
                raise ValueError("expert cache: every slot is pinned")   # request pins at most len(slots)
            slot.pins += 1
            got[expert] = slot
        if slot.job is not None:
            try:
                slot.job.wait()
            except ValueError:
                self._forget(slot)
                raise
            slot.job = None
        return slot.linears[self.files.kind(layer)]

    def release(self, slot: _Slot) -> None:
        slot.pins -= 1

    def _forget(self, slot: _Slot) -> None:
        """A slot whose read failed: emptied (its expert is read again when needed)."""
        self.where.pop(slot.key, None)
        self.order.forget(slot.key)
        slot.key, slot.job, slot.pins = None, None, 0
        self.free.append(slot)

    def drain(self) -> None:
        """Wait for the reads in flight (prefetches a block has not asked for yet)."""
        for slot in self.slots:
            if slot.job is not None:
                slot.job.wait()

    def prefetch_layer(self, layer: int, experts) -> None:
        """Start reading ``layer``'s ``experts`` not in a slot (into unpinned slots only)."""
        for e in experts:
            key = (layer, int(e))
            if key in self.where:
                continue
            if self._read(key, prefetch=True) is None:
                return
            self.stats.prefetched += 1
