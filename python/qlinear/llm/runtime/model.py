"""Model: embedding -> blocks -> final norm -> lm head (last position only), with a KV cache,
generation (stream / generate / chat) and timing figures."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Iterator, Optional, Sequence, Union

import numpy as np

from ..config import ModelConfig
from .drafters import check_compatible
from .generation import Sampler, Sampling
from .stats import Stats
from .kv_cache import KVCache
from .prefix_cache import STATE_ALIGN, PrefixCache, prefill_chunks
from .speculative import Speculation, decode as speculative_decode
from .gemma4 import run_blocks as run_gemma4_blocks
from .layers import Block, Linear, rms_norm
from .step import decode_step
from ..options import KV_DTYPES
from .tokenizer import Messages, StreamDecoder, Tokenizer

@dataclass
class Model:
    config: ModelConfig
    tokenizer: Tokenizer
    embedding: object                  # MemoryEmbedding or DiskEmbedding
    blocks: list[Block]
    norm: np.ndarray
    lm_head: Linear
    lm_rows: Optional[np.ndarray] = None  # vocabulary slimming: the token ids lm_head computes
    max_context: int = 4096
    info: dict = field(default_factory=dict)  # how it was loaded (bits, act, sources, ...)
    stats: Stats = field(default_factory=Stats)
    resources: list = field(default_factory=list, repr=False)  # closed by close(): reader threads, files
    kv_cache: str = "float32"          # the KV cache's element type ("float16": half the memory)
    # prompt prefixes kept across calls (budget 0: only what the model's own cache holds is reused)
    prefix_cache: PrefixCache = field(default_factory=PrefixCache, repr=False)
    per_layer: object = None           # Gemma 4's per-layer inputs (runtime.gemma4.PerLayerInputs)

    # Decode steps run as one compiled call over all blocks (False: block by block in Python,
    # the same operations and results).
    compiled_decode = True

    def __post_init__(self):
        self.cache = self.new_cache(self.max_context)
        self.history: list[dict] = []
        self.reasoning = ""  # a reasoning model's reasoning in its last chat reply (its reply format's)
        self._step, self._step_cache = None, None

    def new_cache(self, capacity: int) -> KVCache:
        """An empty KV cache of ``capacity`` positions, of the model's element type (with a
        hybrid's recurrent states, and its recurrent layers to replay a rollback with)."""
        cache = KVCache(self.config, capacity, KV_DTYPES[self.kv_cache])
        cache.mixers = {i: b.attention for i, b in enumerate(self.blocks) if cache.states[i] is not None}
        return cache

    def fork(self, max_context: Optional[int] = None) -> "Model":
        """This model's weights with a KV cache, compiled step, history and stats of its own (and
        no resources: closing the fork closes nothing of this model's)."""
        twin = replace(self, max_context=min(max_context or self.max_context, self.max_context),
                       stats=Stats(load_s=self.stats.load_s), info=dict(self.info), resources=[],
                       prefix_cache=PrefixCache())
        twin.compiled_decode = self.compiled_decode  # off on the instance for flash models
        return twin

    def close(self) -> None:
        """Stop and close what the model holds open (a flash model's reader threads and file,
        the disk embedding's file); the model cannot run afterwards."""
        while self.resources:
            close = getattr(self.resources.pop(), "close", None)
            if close is not None:
                close()

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- forward ------------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget the KV cache and the chat history."""
        self.cache.rollback(0)
        self.history = []
        self.reasoning = ""

    def _forward(self, ids: Sequence[int], start: int, all_positions: bool = False,
                 cache: Optional[KVCache] = None) -> np.ndarray:
        """Run ``ids`` at positions start.. through the blocks; logits of the last position
        (or of every position), in lm_head's vocabulary (slimmed or not). ``cache``: another
        sequence's KV cache (qlinear.llm.serve) instead of the model's own."""
        cache = self.cache if cache is None else cache
        if start + len(ids) > cache.capacity:
            raise ValueError(f"context of {start + len(ids)} tokens exceeds max_context={cache.capacity}")
        step = self._compiled_step() if len(ids) == 1 and cache is self.cache else None
        if step is not None:
            logits = step.step(np.ascontiguousarray(self.embedding(ids), np.float32), start)
            self.cache.length = start + 1
            self.cache.ids[start:] = list(ids)
            return logits
        h = self.embedding(ids)
        if self.per_layer is not None or self.config.kv_layers is not None:
            h = run_gemma4_blocks(self, ids, h, cache, start, all_positions)
        else:
            for block in self.blocks:
                h = block(h, cache, start)
        cache.length = start + len(ids)
        cache.ids[start:] = list(ids)
        if not all_positions:
            h = h[-1:]
        return self.lm_head(rms_norm(np.ascontiguousarray(h), self.norm, self.config.rms_norm_eps))

    def _compiled_step(self):
        """The compiled decode step over the model's own cache, built once per cache (None: the
        model has none, or ``compiled_decode`` is off)."""
        if not self.compiled_decode:
            return None
        if self._step_cache is not self.cache:
            self._step = decode_step(self.blocks, self.norm, self.lm_head, self.cache)
            self._step_cache = self.cache
        return self._step

    def _full_vocab(self, logits: np.ndarray) -> np.ndarray:
        if self.lm_rows is None:
            return logits
        out = np.full((logits.shape[0], self.config.vocab_size), -np.inf, np.float32)
        out[:, self.lm_rows] = logits
        return out

    def verify(self, ids: Sequence[int], start: int) -> np.ndarray:
        """Logits [len(ids), lm head] of tokens at positions start.. that follow the cache's
        ``start`` positions, each row the bits the one-token decode step gives at its position
        (a speculative verification): the compiled step over rows of this sequence, else one
        token at a time."""
        if start != self.cache.length or start + len(ids) > self.cache.capacity:
            raise ValueError(f"cannot verify {len(ids)} tokens at position {start}: the cache holds "
                             f"{self.cache.length} of {self.cache.capacity}")
        step = self._compiled_step()
        if step is None or len(ids) == 1:
            return np.concatenate([self._forward([t], start + j) for j, t in enumerate(ids)])
        logits = step.step_block(np.ascontiguousarray(self.embedding(list(ids)), np.float32), start)
        self.cache.length = start + len(ids)
        self.cache.ids[start:] = [int(t) for t in ids]
        return logits

    def logits(self, ids: Sequence[int]) -> np.ndarray:
        """Teacher-forced logits [len(ids), vocab] from an empty cache (for tests and
        evaluation; ids slimmed away get -inf)."""
        ids = [int(i) for i in ids]
        self.cache.rollback(0)
        parts = [self._forward(ids[a:b], a, all_positions=True)
                 for a, b in prefill_chunks(0, len(ids), self.cache.has_state)]
        self.cache.prefilled = len(ids)
        return self._full_vocab(np.concatenate(parts))

    def prefill(self, ids: Sequence[int]) -> np.ndarray:
        """Feed a prompt, reusing the longest prefix the cache or ``prefix_cache`` holds (exactly:
        the logits and KV rows of prefilling all of it); returns the last position's logits
        (lm_head's vocabulary)."""
        if not len(ids):
            raise ValueError("the prompt is empty")
        start = self.stats.reused_tokens = self.prefix_cache.restore(self.cache, ids)
        return self.prefill_into(self.cache, ids, start, self.prefix_cache)[0]

    def prefill_into(self, cache: KVCache, ids: Sequence[int], start: int,
                     keep: Optional[PrefixCache] = None) -> np.ndarray:
        """Prefill ``ids[start:]`` into ``cache`` (holding ``ids[:start]`` from a prefill), the
        rows kept in ``keep`` chunk by chunk (a ring still holds a chunk's rows after it); the
        last position's logits [1, lm head]."""
        ids = [int(i) for i in ids]
        for a, b in prefill_chunks(start, len(ids), cache.has_state):
            logits = self._forward(ids[a:b], a, cache=cache)
            cache.prefilled = b
            if cache.has_state and b % STATE_ALIGN == 0:  # where a next prompt may resume
                cache.keep_snapshot()
            if keep is not None:
                keep.store(cache)
        return logits

    # -- generation ---------------------------------------------------------------------------
    def stream_ids(self, ids: Sequence[int], max_new_tokens: int = 128, speculative=None, draft_model=None,
                   **sampling) -> Iterator[int]:
        """Yield generated token ids one at a time (prefill first, then one decode step each).
        ``speculative``: "ngram" (prompt lookup) or "draft" (with ``draft_model``, a smaller
        model of the same tokenizer), or a ``Speculation``: tokens drafted and verified several
        at a time, the same tokens greedy decoding gives (see ``speculative``)."""
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
        spec = Speculation.of(speculative, draft_model)
        if spec is not None and spec.draft_model is not None:
            check_compatible(self, spec.draft_model)
        params = Sampling(**sampling)
        sampler = Sampler(params)
        stop = set(self.tokenizer.stop_ids) | set(params.stop_ids)
        ids = [int(i) for i in ids]
        to_row = None if self.lm_rows is None else {int(t): i for i, t in enumerate(self.lm_rows)}
        rows = lambda seq: seq if to_row is None else [to_row[t] for t in seq if t in to_row]  # noqa: E731
        st = self.stats = Stats(load_s=self.stats.load_s, prompt_tokens=len(ids))
        t0 = time.perf_counter()
        logits = self.prefill(ids)
        st.prefill_s = time.perf_counter() - t0
        context = rows(ids)
        if spec is not None:
            yield from speculative_decode(self, logits, ids, context, max_new_tokens, sampler, stop, spec)
            return
        st.finish_reason = "length"
        for n in range(max_new_tokens):
            t0 = time.perf_counter()
            index = sampler(logits, context)
            token = index if self.lm_rows is None else int(self.lm_rows[index])
            st.decode_s += time.perf_counter() - t0
            if token in stop:
                st.finish_reason = "stop"
                break
            st.decode_tokens += 1
            yield token  # time spent by the consumer is not counted
            if n + 1 == max_new_tokens or self.cache.length + 1 > self.cache.capacity:
                break
            t0 = time.perf_counter()
            context.append(index)
            logits = self._forward([token], self.cache.length)[0]
            st.decode_s += time.perf_counter() - t0
            st.decode_steps += 1
            st.step_tokens += 1

    def stream(self, prompt: Union[str, Messages], max_new_tokens: int = 128, **sampling) -> Iterator[str]:
        """Yield text pieces as they are generated. ``prompt``: a string (used as it is) or a
        list of chat messages (rendered with the model's chat template)."""
        tok = self.tokenizer
        ids = self.stream_ids(tok.prompt_ids(prompt), max_new_tokens, **sampling)
        if tok.replies is not None and not isinstance(prompt, str):  # a chat reply: its answer
            yield from self._answer(ids)
            return
        decoder = StreamDecoder(tok)
        for token in ids:
            piece = decoder.push(token)
            if piece:
                yield piece

    def _answer(self, ids) -> Iterator[str]:
        """The answer of a reply in a reply format (GPT-OSS's harmony: its final channel; Gemma 4's),
        piece by piece; its reasoning kept in ``self.reasoning``."""
        parser, self.reasoning = self.tokenizer.replies.parser(self.tokenizer), ""

        def parts():
            for t in ids:
                yield from parser.push(t)
            yield from parser.flush()  # once the reply has ended

        for part in parts():
            if part.kind == "content":
                yield part.text
            elif part.kind == "reasoning":
                self.reasoning += part.text

    def generate(self, prompt: Union[str, Messages], max_new_tokens: int = 128, **sampling) -> str:
        return "".join(self.stream(prompt, max_new_tokens, **sampling))

    def generate_ids(self, ids: Sequence[int], max_new_tokens: int = 128, **sampling) -> list[int]:
        return list(self.stream_ids(ids, max_new_tokens, **sampling))

    def chat(self, message: Union[str, Messages], max_new_tokens: int = 256, stream: bool = False, **sampling):
        """One turn of a conversation kept in ``self.history`` (the KV cache keeps the shared
        prefix, so earlier turns are not recomputed). ``message``: the user's text, or messages
        to append. Returns the reply (or, with stream=True, an iterator of its pieces)."""
        new = [{"role": "user", "content": message}] if isinstance(message, str) else list(message)
        self.history.extend(new)
        pieces = self.stream(self.history, max_new_tokens, **sampling)

        def run():
            reply = []
            for piece in pieces:
                reply.append(piece)
                yield piece
            self.history.append({"role": "assistant", "content": "".join(reply)})

        return run() if stream else "".join(run())
