"""The KV cache: every layer's keys and values, preallocated, lazily resident; sliding-window
layers as rings; a hybrid's recurrent layers' fixed-size states; and the rollback of positions a
speculative run computed but did not keep."""

from __future__ import annotations

import mmap

import numpy as np

from ..config import ModelConfig


def _lazy_zeros(shape, dtype=np.float32) -> np.ndarray:
    """A zero array whose pages become resident only when written, 4 KiB at a time: an
    anonymous mapping with transparent huge pages off (with them, the first position written in
    each head's slab would make 2 MiB resident)."""
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    if nbytes == 0:
        return np.zeros(shape, dtype)
    buf = mmap.mmap(-1, nbytes)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        buf.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(buf, dtype).reshape(shape)


class KVCache:
    RECORD_ROWS = 64  # a recurrent layer's input rows kept: the longest guarded run

    """Keys and values of every layer, preallocated for ``capacity`` positions, float32 (or
    float16: ``dtype``) [kv_heads, positions, head_dim] per layer; memory becomes resident as
    positions are filled.
    A sliding-window layer holds only its window's positions, as a ring (``windows[i]``: its
    size, 0 for a layer that holds them all). ``k`` / ``v``: one [layers, ...] array when every
    layer holds ``capacity`` positions, else a list of the layers' arrays."""

    def __init__(self, cfg: ModelConfig, capacity: int, dtype=np.float32):
        # a recurrent layer (Gated DeltaNet) holds no rows: its state, float32 whatever dtype
        caps = [0 if cfg.mixer(i) != "attention" else min(capacity, cfg.window(i) or capacity)
                for i in range(cfg.num_layers)]
        self.states = [None] * cfg.num_layers  # per recurrent layer: [conv inputs, state]
        # per recurrent layer: its input rows by position (row p % RECORD_ROWS), which a rollback
        # replays; the layers themselves (Model.new_cache sets them: the replay's code)
        self.records, self.mixers = [None] * cfg.num_layers, {}
        if cfg.has_state:
            from .delta_net import GatedDeltaNet  # noqa: PLC0415
            from .short_conv import ShortConv  # noqa: PLC0415

            kinds = {"delta": GatedDeltaNet, "conv": ShortConv}
            for i in range(cfg.num_layers):
                kind = kinds.get(cfg.mixer(i))
                if kind is not None:
                    self.states[i] = [np.zeros(s, np.float32) for s in kind.state_shapes(cfg)]
                    self.records[i] = np.zeros((self.RECORD_ROWS, kind.width(cfg)), np.float32)
        self._state_saved = None  # (start, the states there) of a guarded run
        self.replayable = True    # the guarded run's rows were one-token steps (recorded)
        self.snapshot = None  # (position, states) a prefill kept: where a next prompt may resume
        self.windows = [c if c < capacity else 0 for c in caps]
        shapes = [(cfg.layer_kv_heads_of(i), c, cfg.layer_head_dim(i)) for i, c in enumerate(caps)]
        self.kv_layers = [cfg.kv_layer(i) for i in range(cfg.num_layers)]  # whose rows each layer holds
        self.shared_rows: dict = {}  # layer -> its keys and values of the running forward, for layers sharing them
        if len(set(shapes)) == 1 and cfg.kv_layers is None:
            self.k, self.v = (_lazy_zeros((cfg.num_layers, *shapes[0]), dtype) for _ in "kv")
        else:
            self.k, self.v = [], []
            for i, shape in enumerate(shapes):
                # a layer that shares another's keys and values holds that layer's arrays (it
                # writes the rows that layer wrote, the same bits, so that it runs as any layer)
                j = cfg.kv_layer(i)
                self.k.append(self.k[j] if j != i else _lazy_zeros(shape, dtype))
                self.v.append(self.v[j] if j != i else _lazy_zeros(shape, dtype))
        self.capacity = capacity
        self.length = 0          # positions filled (the same for every layer after a forward)
        self.ids: list[int] = []  # the tokens those positions hold (for prefix reuse)
        self.prefilled = 0       # leading positions a prefill computed (runtime.prefix_cache: reusable)
        self._saved: list = []   # ring slots a guarded run overwrites: (layer, position, k, v)

    @property
    def nbytes(self) -> int:
        rows = (sum(a.nbytes for a in {id(a): a for a in (*self.k, *self.v)}.values()) if isinstance(self.k, list)
                else self.k.nbytes + self.v.nbytes)
        return rows + sum(a.nbytes for st in self.states if st is not None for a in st)

    @property
    def has_state(self) -> bool:
        """Some layer holds a recurrent state: it resumes only where the cache is (or from 0)."""
        return any(st is not None for st in self.states)

    def keep_snapshot(self) -> None:
        """Keep the states at the cache's end (a prefill's, at a multiple of the delta rule's
        chunk): a prompt that departs from this one after here resumes here."""
        self.snapshot = (self.length, [None if st is None else [a.copy() for a in st] for st in self.states])

    def resume_at_snapshot(self) -> int:
        """Set the states to the snapshot's; its position."""
        position, kept = self.snapshot
        for st, before in zip(self.states, kept):
            if st is not None:
                for a, b in zip(st, before):
                    a[:] = b
        return position

    def reset_states(self) -> None:
        for st in self.states:
            if st is not None:
                for a in st:
                    a.fill(0)

    @property
    def max_run(self) -> int:
        """The most positions one guarded run may hold: the smallest ring's size (a longer run
        writes a slot twice, and a rollback between the two writes could not restore the first)."""
        return min([w for w in self.windows if w] or [self.capacity] + ([self.RECORD_ROWS] if self.has_state else []))

    def guard(self, start: int, count: int) -> None:
        """Before running ``count`` positions from ``start`` that may be rolled back (speculative
        drafts and verifications): keep what they overwrite in the sliding-window rings (the
        positions ``window`` before them, still in the window of the positions kept)."""
        if count > self.max_run:
            raise ValueError(f"a guarded run of {count} positions exceeds the smallest sliding window or the "
                             f"recurrent layers' record ({self.max_run})")
        self._saved = []
        if self.has_state:  # the states before the run (its rows are recorded as they run)
            self._state_saved = (start, [None if st is None else [a.copy() for a in st] for st in self.states])
            self.replayable = True
        for i, w in enumerate(self.windows):
            for pos in range(max(start, w), start + count) if w else ():
                slot = pos % w
                self._saved.append((i, pos, self.k[i][:, slot].copy(), self.v[i][:, slot].copy()))

    def rollback(self, length: int) -> None:
        """Keep the first ``length`` positions: the later ones are forgotten and the ring slots
        they took (since the last ``guard``) get back what they held."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot roll back to {length} positions: the cache holds {self.length}")
        if self.has_state and length != self.length:
            self._roll_states_back(length)
        if self.snapshot is not None and self.snapshot[0] > length:
            self.snapshot = None
        for i, pos, k, v in self._saved:
            if pos >= length:
                slot = pos % self.windows[i]
                self.k[i][:, slot], self.v[i][:, slot] = k, v
        self.forget_saved()
        self.length, self.ids, self.prefilled = length, self.ids[:length], min(self.prefilled, length)

    def _roll_states_back(self, length: int) -> None:
        """The recurrent states at ``length``: zero at 0; else those before the last guarded run
        (which must cover ``length``) with its first rows replayed."""
        if length == 0:
            self.reset_states()
            return
        if self._state_saved is None or not self._state_saved[0] <= length or not self.replayable:
            raise ValueError(f"cannot roll a recurrent state back to position {length}: the cache holds "
                             f"{self.length} and no guarded run of one-token steps covers it")
        start, saved = self._state_saved
        for st, before in zip(self.states, saved):
            if st is not None:
                for a, b in zip(st, before):
                    a[:] = b
        for i, layer in self.mixers.items():  # the kept positions' recorded rows, through the same code
            rows = self.records[i]
            for p in range(start, length):
                layer.mix(rows[p % self.RECORD_ROWS][None], *self.states[i], p)

    def forget_saved(self) -> None:
        """Drop what the last ``guard`` kept (the positions it covered are being rewritten)."""
        self._saved = []
        self._state_saved = None
