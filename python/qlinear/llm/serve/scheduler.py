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

A sequence may decode speculatively (``runtime.speculative``): its drafter (n-gram lookup, or a
draft model's fork with a KV cache of the sequence's own) proposes tokens, and its rows in the
step are the token last decided and the drafts, at consecutive positions over its caches (the
step runs them in order: each row computes what the one-token step would). Its kept drafts and
the model's own token are emitted one by one, the rejected rows rolled back. The first token
comes from the prefill's logits, as for the others.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Optional

import numpy as np

from ..runtime.step import decode_step
from ..runtime.model import Model
from ..runtime.prefix_cache import PREFILL_CHUNK, PrefixCache
from ..runtime.stats import Stats
from ..runtime.speculative import Speculator
from .logprobs import record
from .sequence import Sequence


class QueueFull(Exception):
    """More requests wait than the queue holds."""


class SchedulerClosed(Exception):
    """The scheduler is stopping or has stopped."""


class Scheduler:
    """Runs sequences on ``model`` in a thread of its own; at most ``max_batch`` decode together,
    at most ``max_queue`` more wait for a place (submit raises QueueFull beyond that). Prompts'
    prefixes are kept in a ``runtime.prefix_cache.PrefixCache`` of ``cache_mb`` MB (0: none)."""

    def __init__(self, model: Model, max_batch: int = 8, max_queue: int = 64, cache_mb: float = 512):
        for name, value, least in (("max_batch", max_batch, 1), ("max_queue", max_queue, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{name} must be an int >= {least}, got {value!r}")
        if model.info.get("memory") == "flash":  # its FFNs stream from disk once per token, not per sequence
            raise ValueError("serving a memory='flash' model is not supported: load it with memory='low' (the default)")
        self.model, self.max_batch, self.max_queue = model, max_batch, max_queue
        self.prefix = PrefixCache(cache_mb)  # used by the scheduler's thread only
        self._warm: deque = deque(maxlen=max_batch)  # next turns' prefixes to prefill (PrefixCache.warm)
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
        # speculative sequences: their verifications (decode_steps), the tokens those decided
        # (step_tokens), the tokens drafted and those kept
        self.speculative = Stats()

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
                while not (self._waiting or self._running or self._warm or self._closing):
                    self._cond.wait()
                if self._closing:
                    break
                gone = [s for s in self._waiting if s.cancelled]
                for seq in gone:
                    self._waiting.remove(seq)
            for seq in gone:
                self._finish(seq, "done", "cancelled")
            try:
                if self._warm:  # before admitting: the conversation's next turn may be on its way
                    self.prefix.warm(self.model, self._warm.popleft())
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
        seq.cache = seq.speculator = None  # the caches' memory (a draft model's too) is unmapped with them
        if kind == "done" and value != "cancelled" and seq.next_turn is not None and self.prefix.budget:
            try:  # queued before the answer ends: the next turn comes after it
                ids = seq.next_turn(seq.tokens[len(seq.ids):])
                if 2 <= len(ids) <= self.model.max_context:
                    self._warm.append(ids)
            except Exception:  # noqa: BLE001  (a template that cannot render it: nothing to warm)
                pass
        self._emit(seq, kind, value)

    def _start(self, seq: Sequence) -> None:
        """Prefill the prompt into a new cache of the sequence's own (after the prefix the prefix
        cache holds, copied into it); its first token."""
        if seq.cancelled:
            return self._finish(seq, "done", "cancelled")
        self._running.append(seq)  # holds its place from now on
        try:
            # room for the prompt and max_tokens: max_tokens ends the sequence before its cache is full
            seq.cache = self.model.new_cache(len(seq.ids) + seq.max_tokens)
            # speculation needs the compiled step: the Python blocks would run a verification's
            # rows one at a time, a forward for every row, drafts rejected included (never faster)
            spec = seq.speculation if self._step is not None else None
            if spec is not None:
                draft = None if spec.draft_model is None else spec.draft_model.fork(len(seq.ids) + seq.max_tokens)
                seq.speculator = Speculator(spec, self.model, seq.sampler, draft)
            start = seq.cached_tokens = self.prefix.restore(seq.cache, seq.ids)
            logits = self.model.prefill_into(seq.cache, seq.ids, start, self.prefix)
            if seq.speculator is not None:
                seq.speculator.start(seq.tokens)  # a draft model prefills the prompt too
        except Exception as e:  # noqa: BLE001  (answered to the request; the server goes on)
            return self._finish(seq, "error", f"{type(e).__name__}: {e}")
        self._accept(seq, logits[0])

    def _decode(self) -> None:
        """One step for every running sequence (one B-row matmul per weight): a token of each plain
        sequence, a verification of each speculative one (its rows: the token last decided and its
        drafts)."""
        seqs = list(self._running)
        try:
            proposals = [self._propose(s) for s in seqs]
            blocks = [[s.next_token] + drafts for s, (drafts, _) in zip(seqs, proposals)]
            starts = [s.cache.length for s in seqs]
            for s, block, start in zip(seqs, blocks, starts):
                if s.speculator is not None:
                    s.cache.guard(start, len(block))
            rows = [(s, t, start + j) for s, block, start in zip(seqs, blocks, starts) for j, t in enumerate(block)]
            if self._step is not None:
                h = np.ascontiguousarray(self.model.embedding([t for _, t, _ in rows]), np.float32)
                t0 = time.perf_counter()
                states = None
                if self.model.cache.has_state:  # a hybrid's recurrent layers: each sequence's states
                    states = [[None if st is None else (st[0], st[1] if len(st) > 1 else None, s.cache.records[i])
                               for i, st in enumerate(s.cache.states)] for s, _, _ in rows]
                logits = self._step.step_batch(h, [p for _, _, p in rows], [s.cache.k for s, _, _ in rows],
                                               [s.cache.v for s, _, _ in rows], [s.cache.capacity for s, _, _ in rows],
                                               states)
            else:  # weights kept in float: one sequence at a time through the blocks
                t0 = time.perf_counter()
                logits = np.concatenate([self.model._forward([t], p, cache=s.cache) for s, t, p in rows])
        except Exception as e:  # noqa: BLE001
            for seq in seqs:
                self._finish(seq, "error", f"{type(e).__name__}: {e}")
            return
        seconds = time.perf_counter() - t0
        self.decode_steps, self.decode_seconds = self.decode_steps + 1, self.decode_seconds + seconds
        first = 0
        for seq, block, start, (drafts, dists) in zip(seqs, blocks, starts, proposals):
            out, first = logits[first:first + len(block)], first + len(block)
            seq.cache.length = start + len(block)
            if seq.speculator is None:
                self.decoded_tokens += 1
                self._accept(seq, out[0])
            else:
                self._verify(seq, out, start, drafts, dists, seconds)

    def _propose(self, seq: Sequence) -> tuple[list, list]:
        """A speculative sequence's drafts and their distributions (none for a plain one): at most
        one fewer than the tokens it may still generate (a verification decides one more), and a
        block no longer than its cache's smallest ring."""
        if seq.speculator is None:
            return [], []
        room = min(seq.max_tokens - seq.generated, seq.cache.max_run) - 1
        return seq.speculator.draft(seq.tokens, [], room)

    def _verify(self, seq: Sequence, logits: np.ndarray, start: int, drafts: list, dists: list,
                seconds: float) -> None:
        """Judge a verification's rows (as speculative.decode does): the kept drafts and the model's
        own token are decided one by one; then the cache keeps the accepted rows."""
        accepted, going = 0, True
        try:
            for j, (kept, row) in enumerate(seq.speculator.verdicts(logits, drafts, dists, [])):
                accepted += kept
                going = self._decided(seq, row, logits[j])  # the j-th row decided the j-th token
                if not going:
                    break
        except Exception as e:  # noqa: BLE001  (e.g. NaN logits: this sequence fails, not the batch)
            going = False
            self._finish(seq, "error", f"{type(e).__name__}: {e}")
        st = self.speculative
        st.decode_steps += 1
        st.step_tokens += 1 + accepted
        st.draft_tokens, st.accepted_tokens = st.draft_tokens + len(drafts), st.accepted_tokens + accepted
        self.decoded_tokens += 1 + accepted
        if going:
            seq.speculator.verified(seq.cache, start, len(drafts), accepted, seq.tokens, seconds)

    def _accept(self, seq: Sequence, logits: np.ndarray) -> None:
        """Sample the next token (as Model.stream_ids does) and decide it."""
        try:
            logits = seq.biased(logits)
            if seq.constraint is not None:  # structured output: a row the grammar allows (masked logits for logprobs)
                row, logits = seq.constraint.sample(seq.sampler, logits, seq.logprobs is not None)
            else:
                row = seq.sampler(logits, ())
        except Exception as e:  # noqa: BLE001  (e.g. NaN logits: this sequence fails, not the batch)
            return self._finish(seq, "error", f"{type(e).__name__}: {e}")
        self._decided(seq, row, logits)

    def _decided(self, seq: Sequence, row: int, logits: np.ndarray) -> bool:
        """A token decided (its lm head row, from ``logits``): a stop token ends the sequence;
        otherwise it is emitted, and the sequence ends at max_tokens. False when the sequence ended."""
        token = self._to_token(row)
        if token in seq.stop_ids:
            self._finish(seq, "done", "stop")
            return False
        if seq.constraint is not None and not seq.constraint.advance(token):
            self._finish(seq, "error", f"structured output: token {token} is off the grammar")
            return False
        seq.generated += 1
        seq.tokens.append(token)
        record(seq, logits, row, self.model.lm_rows)  # its logprobs, if it asked
        self._emit(seq, "token", token)
        if seq.constraint is not None and seq.constraint.done:  # the grammar is complete
            self._finish(seq, "done", "stop")
            return False
        if seq.generated == seq.max_tokens:
            self._finish(seq, "done", "length")
            return False
        seq.next_token = token
        return True
