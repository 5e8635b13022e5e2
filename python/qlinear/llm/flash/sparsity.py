"""Activation sparsity for memory="flash" (ReLU-family models: ``hidden_act: relu``): a
per-layer low-rank predictor says which FFN neurons will be active (gate > 0) from the MLP's
input, and only the bundles holding them are read (``flash.layout``); bundles active in the
last ``window`` tokens stay in memory (``Window``), so a token reads only the newly active ones.

The predictor of a layer is x -> (x @ A) @ B > threshold, A [hidden, rank], B [rank, I]: the
reduced-rank least-squares fit of the gate's pre-activations on calibration inputs, the
threshold set for a target recall on them. ``train`` fits it (numpy), ``save`` / ``load`` keep it
in a qlinear weight file (``qlinear-llm train-predictor``).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..._format import load_weights, save_weights
from ..runtime.layers import rms_norm

PREDICTOR_FORMAT = "qlinear-flash-predictor"


# -- calibration and training -----------------------------------------------------------------
def collect(model, sequences: Sequence[Sequence[int]]) -> list:
    """Per layer: (MLP inputs [tokens, hidden], gate pre-activations [tokens, I]) over the
    sequences, run block by block (a normal-mode model of a ReLU checkpoint)."""
    cfg = model.config
    xs = [[] for _ in model.blocks]
    gs = [[] for _ in model.blocks]
    for ids in sequences:
        model.reset()
        h = model.embedding(list(ids))
        for i, b in enumerate(model.blocks):
            eps = cfg.rms_norm_eps
            h = h + b.attention(rms_norm(h, b.input_norm, eps), model.cache, 0)
            x = rms_norm(h, b.post_norm, eps)
            gate_up = b.gate_up(x)
            xs[i].append(x)
            gs[i].append(gate_up[:, :cfg.intermediate_size].copy())
            h = h + b.down(b.act(gate_up))
    model.reset()
    return [(np.concatenate(x), np.concatenate(g)) for x, g in zip(xs, gs)]


def fit_layer(x: np.ndarray, gate: np.ndarray, rank: int, recall: float = 0.99) -> tuple:
    """(A, B, threshold): reduced-rank regression of gate on x, the threshold the largest that
    keeps ``recall`` of the active (gate > 0) calibration neurons."""
    x64, g64 = x.astype(np.float64), gate.astype(np.float64)
    w, *_ = np.linalg.lstsq(x64, g64, rcond=None)          # [H, I]
    _, _, vt = np.linalg.svd(x64 @ w, full_matrices=False)
    v = vt[:rank].T                                         # [I, r]
    a, b = (w @ v).astype(np.float32), v.T.astype(np.float32)
    scores = (x @ a) @ b
    active = gate > 0
    threshold = np.quantile(scores[active], 1.0 - recall) if active.any() else 0.0
    return a, b, np.float32(threshold)


def train(model, sequences, rank: int = 32, recall: float = 0.99) -> list:
    if model.config.hidden_act != "relu":
        raise ValueError(f"an activation predictor needs a ReLU model (hidden_act relu), not {model.config.hidden_act!r}")
    return [fit_layer(x, g, rank, recall) for x, g in collect(model, sequences)]


def evaluate(predictors: list, data: list) -> dict:
    """Recall and precision of the predicted-active neurons, the true sparsity (held-out data
    from ``collect``)."""
    tp = fp = fn = total = 0
    for (a, b, t), (x, g) in zip(predictors, data):
        pred, act = ((x @ a) @ b) > t, g > 0
        tp += int((pred & act).sum())
        fp += int((pred & ~act).sum())
        fn += int((~pred & act).sum())
        total += act.size
    return {"recall": tp / max(tp + fn, 1), "precision": tp / max(tp + fp, 1),
            "sparsity": 1 - (tp + fn) / max(total, 1), "predicted_active": (tp + fp) / max(total, 1)}


def save(path, predictors: list) -> None:
    tensors = {}
    for i, (a, b, t) in enumerate(predictors):
        tensors[f"layers.{i}.a"], tensors[f"layers.{i}.b"] = a, b
        tensors[f"layers.{i}.threshold"] = np.array([t], np.float32)
    save_weights(path, tensors, {"format": PREDICTOR_FORMAT, "layers": len(predictors)})


def load(path, cfg) -> list:
    tensors, meta = load_weights(path, mmap_mode=False)
    if meta.get("format") != PREDICTOR_FORMAT or meta.get("layers") != cfg.num_layers:
        raise ValueError(f"{path}: not an activation predictor of a {cfg.num_layers}-layer model")
    out = []
    for i in range(cfg.num_layers):
        a, b, t = (tensors.get(f"layers.{i}.{n}") for n in ("a", "b", "threshold"))
        if a is None or a.shape[0] != cfg.hidden_size or b.shape != (a.shape[1], cfg.intermediate_size):
            raise ValueError(f"{path}: layer {i}'s predictor is missing or of the wrong shape")
        out.append((np.asarray(a), np.asarray(b), np.float32(t[0])))
    return out


# -- the window: bundles kept in memory --------------------------------------------------------
class Window:
    """Slots of a preallocated per-layer matrix: bundle ids at slots 0..count-1, added at the
    end, removed by moving the last slot into the hole (``move(src, dst)`` copies a slot's
    data), an index from bundle id to slot, and the token each was last active at."""

    def __init__(self, capacity: int, move=None):
        self.ids = np.full(capacity, -1, np.int64)
        self.last = np.zeros(capacity, np.int64)
        self.slot: dict = {}
        self.count = 0
        self.move = move

    def add(self, bundle: int, now: int) -> int:
        if self.count == len(self.ids):
            raise ValueError("the window is full")
        s = self.count
        self.ids[s], self.last[s] = bundle, now
        self.slot[bundle] = s
        self.count += 1
        return s

    def remove(self, bundle: int) -> None:
        s, last = self.slot.pop(bundle), self.count - 1
        if s != last:
            moved = int(self.ids[last])
            self.ids[s], self.last[s] = moved, self.last[last]
            self.slot[moved] = s
            if self.move is not None:
                self.move(last, s)
        self.ids[last] = -1
        self.count = last

    def touch(self, bundles, now: int) -> list:
        """Mark ``bundles`` active at token ``now``; returns [(bundle, slot)] of those not held
        (added: their data must be read)."""
        new = []
        for b in bundles:
            s = self.slot.get(int(b))
            if s is None:
                new.append((int(b), self.add(int(b), now)))
            else:
                self.last[s] = now
        return new

    def evict(self, now: int, keep: int) -> None:
        """Remove the bundles not active in the last ``keep`` tokens (at token ``now``)."""
        for s in range(self.count - 1, -1, -1):
            if now - self.last[s] >= keep:
                self.remove(int(self.ids[s]))


# -- the sparse FFN of memory="flash" -----------------------------------------------------------
class SparseSetup:
    """The predictors and windows of a flash model whose FFN reads follow the predictor."""

    def __init__(self, predictor, ffn, cfg, window: int):
        if cfg.hidden_act != "relu":
            raise ValueError(f"a predictor needs a ReLU model (hidden_act relu), not {cfg.hidden_act!r}")
        if not ffn.bundled:
            raise ValueError(f"{ffn.path}: reading predicted neurons needs the flash layout (qlinear-llm convert --flash)")
        lay = ffn.layout
        if lay.intermediate % lay.neurons or lay.down.group_size >= lay.down.k:
            raise ValueError("reading predicted neurons needs whole bundles: a grouped down projection "
                             "whose group divides the intermediate size")
        if cfg.mlp_bias:
            raise ValueError("reading predicted neurons does not support MLP biases")
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"window must be an int >= 1, got {window!r}")
        self.predictors = predictor if isinstance(predictor, list) else load(predictor, cfg)
        self.ffn, self.cfg, self.window = ffn, cfg, window
        per_layer = lay.nbytes   # capacity: every bundle (pages become resident as slots fill)
        self.nbytes = cfg.num_layers * per_layer + lay.nbytes + sum(a.nbytes + b.nbytes for a, b, _ in self.predictors)

    def ffns(self, reader, blocks, act_block) -> list:
        staging = np.zeros(self.ffn.layout.nbytes, np.uint8)
        return [SparseFFN(self, reader, i, b.gate_up.act, act_block, staging) for i, b in enumerate(blocks)]


class SparseFFN:
    """One layer's MLP over the bundles held in its window, predicted-active ones read first."""

    def __init__(self, setup: SparseSetup, reader, layer: int, act: str, act_block, staging: np.ndarray):
        from . import layout as flash_layout
        lay = setup.ffn.layout
        self.setup, self.reader, self.layer, self.lay, self.staging = setup, reader, layer, lay, staging
        self.a, self.b, self.threshold = setup.predictors[layer]
        C, B, rb = lay.count, lay.neurons, lay.rows_bytes(0)
        self.rb, self.start = rb, setup.ffn.starts[layer][0]
        self.gu = _lazy_bytes(C * 2 * rb).reshape(C, 2 * rb)
        self.dn = _lazy_bytes(lay.down.npanels * C * lay.down.block_bytes).reshape(lay.down.npanels, C, lay.down.block_bytes)
        g, d = lay.gate_up, lay.down
        self._gu_geom = lambda c: flash_layout.Geometry(2 * B * c, g.k, g.bits, g.group_size, g.symmetric, g.layout)  # noqa: E731
        self._packed = flash_layout.packed
        from ..runtime.layers import Linear
        self._linear = lambda w: Linear(w, None, act, act_block)  # noqa: E731
        self.down = Linear(flash_layout.packed(self.dn.reshape(-1), flash_layout.Geometry(
            d.n, B * C, d.bits, d.group_size, d.symmetric, d.layout)), None, act, act_block)
        self.window = Window(C, self._move)
        self.now = 0
        self.held_bundles = 0   # bundles held, summed over forwards (for the figures)

    def _move(self, src: int, dst: int) -> None:
        self.gu[dst] = self.gu[src]
        self.dn[:, dst] = self.dn[:, src]

    def _read(self, new: list) -> None:
        """Read the bundles ``new`` [(bundle, slot)] (adjacent bundles in one read) into their slots."""
        lay, offs = self.lay, self.lay.offsets
        new.sort()
        reads, run = [], []
        for b, s in new:
            if run and run[-1][0] + 1 != b:
                reads.append(run)
                run = []
            run.append((b, s))
        if run:
            reads.append(run)
        job = self.reader.submit([(self.start + int(offs[r[0][0]]),
                                   [memoryview(self.staging[offs[r[0][0]]:offs[r[-1][0] + 1]])]) for r in reads])
        job.wait()
        for b, s in new:
            part = self.staging[offs[b]:offs[b + 1]]
            self.gu[s] = part[:2 * self.rb]
            self.dn[:, s] = part[2 * self.rb:].reshape(lay.down.npanels, lay.down.block_bytes)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        B = self.lay.neurons
        active = ((x @ self.a) @ self.b) > self.threshold                  # [tokens, I]
        bundles = np.flatnonzero(active.reshape(len(x), -1, B).any(axis=(0, 2)))
        self.now += 1
        self.window.evict(self.now, self.setup.window)
        new = self.window.touch(bundles, self.now)
        if new:
            self.reader.check_unchanged()
            self._read(new)
        c = self.window.count
        self.held_bundles += c
        out = np.zeros((len(x), self.lay.count * B), np.float32)
        if c:
            gu = self._linear(self._packed(self.gu[:c].reshape(-1), self._gu_geom(c)))(x)
            g, u = np.split(gu.reshape(len(x), c, 2, B), 2, axis=2)
            out[:, :c * B] = (np.maximum(g, np.float32(0)) * u).reshape(len(x), c * B)
        return self.down(out)


def _lazy_bytes(n: int) -> np.ndarray:
    """Zero bytes whose pages become resident only when written."""
    import mmap
    return np.frombuffer(mmap.mmap(-1, max(n, 1)), np.uint8)[:n]
