"""Continuous batching: one thread owns the model and runs its sequences together.

Each loop of the scheduler admits waiting requests (up to a budget of prompt tokens; each
prompt's prefill runs as a chunk of its own, into the sequence's own KV cache), drops the
cancelled sequences (their caches are freed), and runs one decode step for every running
sequence: ``DecodeStep.step_batch``, the single-sequence step's code over B rows, one B-row
matmul per weight, attention per sequence over its own caches (allocated as Model allocates its
own: sliding-window layers hold rings) at its own position. Every row's logits are bit-identical
to the single-sequence decode step's (the kernels compute each row of a GEMM as the one-row GEMV;
norms, attention and sampling are per row), so a sequence's tokens do not depend on what else is
in the batch, and greedy output equals Model.stream_ids'.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable, Optional, Sequence as Seq

import numpy as np

from ..runtime.generation import Sampler, Sampling
from ..runtime.kv_cache import KVCache
from ..runtime.layers import decode_step
from ..runtime.model import PREFILL_CHUNK, Model


class QueueFull(Exception):
    """More requests wait than the queue holds."""


class SchedulerClosed(Exception):
    """The scheduler is stopping or has stopped."""


class Sequence:
    """One request's generation. ``emit(kind, value)`` is called from the scheduler thread:
    ("token", id) per generated token, then ("done", "stop" | "length" | "cancelled") or
    ("error", message)."""

    def __init__(self, ids: Seq[int], max_tokens: int, sampling: Sampling, emit: Callable[[str, object], None],
                 ignore_eos: bool = False):
        if not len(ids):
            raise ValueError("the prompt is empty")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        self.ids = [int(i) for i in ids]
        self.max_tokens = max_tokens
        self.sampler = Sampler(sampling)
        self.stop_ids = set(sampling.stop_ids)
        self.ignore_eos = ignore_eos  # the model's stop tokens do not end it
        self.emit = emit
        self.cancelled = False
        self.cache: Optional[KVCache] = None
        self.generated = 0
        self.next_token: Optional[int] = None

    def cancel(self) -> None:
        """Stop generating (from any thread): the scheduler frees the sequence at its next step."""
        self.cancelled = True


class Scheduler:
    """Runs sequences on ``model`` in a thread of its own; at most ``max_batch`` decode together,
    at most ``max_queue`` more wait for a place (submit raises QueueFull beyond that)."""

    def __init__(self, model: Model, max_batch: int = 8, max_queue: int = 64):
        for name, value, least in (("max_batch", max_batch, 1), ("max_queue", max_queue, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{name} must be an int >= {least}, got {value!r}")
        if model.info.get("memory") == "flash":  # its FFNs stream from disk once per token, not per sequence
            raise ValueError("serving a memory='flash' model is not supported: load it with memory='low' (the default)")
        self.model, self.max_batch, self.max_queue = model, max_batch, max_queue
        # the model's own step, in a DecodeStep of the scheduler's (its buffers): None when it
        # does not compile (float weights), then sequences run one by one through the blocks
        self._step = decode_step(model.blocks, model.norm, model.lm_head, model.cache) if model.compiled_decode else None
        self._to_token = (lambda i: i) if model.lm_rows is None else (lambda i: int(model.lm_rows[i]))
        self._stop_ids = set(model.tokenizer.stop_ids)
        self._waiting: deque = deque()
        self._running: list = []
        self._cond = threading.Condition()
        self._closing = False
        self._thread: Optional[threading.Thread] = None
        self.decode_steps = 0     # figures for /health and benchmarks
        self.decoded_tokens = 0
        self.decode_seconds = 0.0  # in the decode steps themselves (not the HTTP side, not prefills)

    # -- control (any thread) ----------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="qlinear-serve-scheduler", daemon=True)
            self._thread.start()

    def stop(self, timeout: Optional[float] = None) -> None:
        """Finish every sequence as cancelled and end the thread."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    def submit(self, seq: Sequence) -> None:
        with self._cond:
            if self._closing:
                raise SchedulerClosed("the server is shutting down")
            if len(self._running) + len(self._waiting) >= self.max_batch + self.max_queue:
                raise QueueFull(f"{self.max_batch} requests are running and {self.max_queue} waiting already")
            if not seq.ignore_eos:
                seq.stop_ids |= self._stop_ids
            self._waiting.append(seq)
            self._cond.notify()

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    # -- the thread ----------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                while not (self._waiting or self._running or self._closing):
                    self._cond.wait()
                if self._closing:
                    break
                gone = [s for s in self._waiting if s.cancelled]
                for seq in gone:
                    self._waiting.remove(seq)
            for seq in gone:
                self._finish(seq, "done", "cancelled")
            try:
                self._admit()
                for seq in [s for s in self._running if s.cancelled]:
                    self._finish(seq, "done", "cancelled")
                if self._running:
                    self._decode()
            except Exception as e:  # noqa: BLE001  (a fault of the step itself: answer, go on serving)
                for seq in list(self._running):
                    self._finish(seq, "error", f"{type(e).__name__}: {e}")
        with self._cond:
            left = list(self._running) + list(self._waiting)
        for seq in left:
            self._finish(seq, "done", "cancelled")

    def _admit(self) -> None:
        """Start waiting sequences while there is room, up to PREFILL_CHUNK prompt tokens (at least
        one sequence) between two decode steps: the running ones wait for those prefills."""
        budget = PREFILL_CHUNK
        while budget > 0:
            with self._cond:
                if not self._waiting or len(self._running) >= self.max_batch:
                    return
                seq = self._waiting.popleft()
            budget -= len(seq.ids)
            self._start(seq)

    def _emit(self, seq: Sequence, kind: str, value) -> None:
        try:
            seq.emit(kind, value)
        except Exception:  # the listener is gone (its event loop closed): nobody to answer
            seq.cancel()

    def _finish(self, seq: Sequence, kind: str, value) -> None:
        if seq in self._running:
            self._running.remove(seq)
        seq.cache = None  # the cache's memory is unmapped with it
        self._emit(seq, kind, value)

    def _start(self, seq: Sequence) -> None:
        """Prefill the prompt into a new cache of the sequence's own; its first token."""
        if seq.cancelled:
            return self._finish(seq, "done", "cancelled")
        self._running.append(seq)  # holds its place from now on
        try:
            seq.cache = self.model.new_cache(len(seq.ids) + seq.max_tokens)
            logits = None
            for s in range(0, len(seq.ids), PREFILL_CHUNK):
                logits = self.model._forward(seq.ids[s:s + PREFILL_CHUNK], s, cache=seq.cache)
        except Exception as e:  # noqa: BLE001  (answered to the request; the server goes on)
            return self._finish(seq, "error", f"{type(e).__name__}: {e}")
        self._accept(seq, logits[0])

    def _decode(self) -> None:
        """One token for every running sequence (one B-row matmul per weight)."""
        rows = list(self._running)
        tokens = [s.next_token for s in rows]
        positions = [s.cache.length for s in rows]
        try:
            if self._step is not None:
                h = np.ascontiguousarray(self.model.embedding(tokens), np.float32)
                t0 = time.perf_counter()
                logits = self._step.step_batch(h, positions, [s.cache.k for s in rows], [s.cache.v for s in rows],
                                               [s.cache.capacity for s in rows])
            else:  # weights kept in float: one sequence at a time through the blocks
                t0 = time.perf_counter()
                logits = np.concatenate([self.model._forward([t], p, cache=s.cache)
                                         for s, t, p in zip(rows, tokens, positions)])
        except Exception as e:  # noqa: BLE001
            for seq in rows:
                self._finish(seq, "error", f"{type(e).__name__}: {e}")
            return
        self.decode_steps += 1
        self.decoded_tokens += len(rows)
        self.decode_seconds += time.perf_counter() - t0
        for seq, row, t, p in zip(rows, logits, tokens, positions):
            seq.cache.length = p + 1
            self._accept(seq, row)

    def _accept(self, seq: Sequence, logits: np.ndarray) -> None:
        """Sample the next token (as Model.stream_ids does): a stop token ends the sequence;
        otherwise it is emitted, and the sequence ends at max_tokens or a full cache."""
        try:
            token = self._to_token(seq.sampler(logits, ()))
        except Exception as e:  # noqa: BLE001  (e.g. NaN logits: this sequence fails, not the batch)
            return self._finish(seq, "error", f"{type(e).__name__}: {e}")
        if token in seq.stop_ids:
            return self._finish(seq, "done", "stop")
        seq.generated += 1
        self._emit(seq, "token", token)
        if seq.generated == seq.max_tokens or seq.cache.length + 1 > seq.cache.capacity:
            return self._finish(seq, "done", "length")
        seq.next_token = token
