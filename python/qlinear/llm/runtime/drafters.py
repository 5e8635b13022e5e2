"""Drafters for speculative decoding: they propose the next tokens, the model verifies them.

- ``NgramDrafter`` (prompt lookup, llama.cpp's ngram-simple / ngram-map-k): the longest suffix of
  the text so far (prompt included) of ``min_ngram`` to ``max_ngram`` tokens that occurred before,
  and the tokens that followed its latest earlier occurrence (continued periodically where they
  reach the end of the text). An index of every n-gram's latest end keeps a lookup O(max_ngram)
  per token.
- ``ModelDrafter``: a smaller model with the same tokenizer decodes ahead on its own KV cache
  (run by the same runtime): it prefills the prompt after the model's prefill, runs only the
  positions its cache lacks, and after a verification its cache is cut back to what was accepted.

A drafter's ``propose(context, rows, k, sampler)`` returns up to ``k`` token ids and, for each,
the distribution over the lm head it was drawn from (None: a point mass on the token, as n-gram
drafts are); ``context`` holds the token ids so far, ``rows`` their lm head indices.
"""

from __future__ import annotations

import time
import weakref
from typing import Optional, Sequence

import numpy as np

from .generation import Sampler


class NgramDrafter:
    name = "ngram"

    def __init__(self, max_ngram: int = 4, min_ngram: int = 2):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"n-gram sizes must satisfy 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.index = [dict() for _ in range(max_ngram + 1)]  # n -> {n-gram: end of its latest occurrence}
        self.seen = 0   # context tokens indexed so far
        self.tokens: list[int] = []

    def _index(self, context: Sequence[int]) -> None:
        if len(context) < self.seen or (self.seen and context[self.seen - 1] != self.tokens[self.seen - 1]):
            self.__init__(self.max_ngram, self.min_ngram)  # another text: start over
        for end in range(self.seen, len(context)):
            self.tokens.append(int(context[end]))
            # the n-grams ending just before `end`: their continuation starts at `end`
            for n in range(self.min_ngram, self.max_ngram + 1):
                if end - n >= 0:
                    self.index[n][tuple(self.tokens[end - n:end])] = end
        self.seen = len(context)

    def propose(self, context: Sequence[int], rows: Sequence[int], k: int, sampler: Optional[Sampler] = None):
        self._index(context)
        n_ctx = len(self.tokens)
        for n in range(min(self.max_ngram, n_ctx), self.min_ngram - 1, -1):
            start = self.index[n].get(tuple(self.tokens[n_ctx - n:]))
            if start is not None and start < n_ctx:  # an earlier occurrence, not the suffix itself
                # past the end of the text, the continuation is the draft itself: a run that
                # repeats with period n_ctx - start goes on repeating (degenerate loops, rows of
                # a table), so a late match still gives a draft of k tokens
                draft = self.tokens[start:start + k]
                while len(draft) < k:
                    draft.append(draft[len(draft) - (n_ctx - start)])
                return draft, [None] * len(draft)
        return [], []

    def accepted(self, context: Sequence[int]) -> None:
        """The context after a verification (the n-gram index follows it on the next proposal)."""


class ModelDrafter:
    name = "draft"
    STEPS = 4  # positions to catch up that run as one-token steps (more: as a prefill)

    def __init__(self, target, draft):
        check_compatible(target, draft)
        self.model = draft
        self.synced = 0  # leading context positions the draft's cache is known to hold
        self._logits = None  # the draft's logits after the context, from sync()
        lm_rows = draft.lm_rows
        self.to_id = (lambda r: r) if lm_rows is None else (lambda r: int(lm_rows[r]))

    def propose(self, context: Sequence[int], rows: Sequence[int], k: int, sampler: Sampler):
        m = self.model
        k = min(k, m.cache.capacity - len(context), m.cache.max_run + 1)  # k - 1 positions run ahead
        if k <= 0:
            return [], []
        if self._logits is None or self.synced != len(context):
            self.sync(context)
        logits, self._logits = self._logits, None
        m.cache.guard(m.cache.length, k - 1)
        tokens, dists, ctx = [], [], list(rows)
        for j in range(k):
            probs = sampler.distribution(logits, ctx)
            r = int(np.argmax(sampler.penalized(logits, ctx))) if probs is None else int(sampler.rng.choice(len(probs), p=probs))
            tokens.append(self.to_id(r))
            dists.append(probs)
            ctx.append(r)
            if j + 1 < k:
                logits = m._forward([tokens[-1]], m.cache.length)[0]
        return tokens, dists

    def start(self, context: Sequence[int]) -> Optional[float]:
        """Before decoding (after the target's prefill): prefill the prompt into the draft's cache,
        its last token by the one-token step (twice, the second time timed: a warm step), so the
        first draft needs no catching up; the seconds of one draft step (None: a one-token prompt)."""
        m = self.model
        if len(context) < 2:
            self.sync(context)
            return None
        m.prefill(list(context[:-1]))
        n = len(context) - 1
        m.cache.guard(n, 1)
        m._forward([int(context[-1])], n)
        m.cache.rollback(n)
        t = time.perf_counter()
        self._logits = m._forward([int(context[-1])], n)[0]
        seconds = time.perf_counter() - t
        self.synced = len(context)
        return seconds

    def sync(self, context: Sequence[int]) -> None:
        """Bring the draft's cache up to the context: only the positions it does not hold are run
        (the model's own token while drafts go on, a catching up after plain steps), a few by the
        one-token step, more as a prefill; a cache that went another way (or an empty one) is
        prefilled anew."""
        m, cache = self.model, self.model.cache
        if self._logits is not None and self.synced == len(context) == cache.length:
            return  # start() or the last sync left it there
        held = cache.length
        if held > len(context) or cache.ids[:held] != list(context[:held]):
            held = next((i for i, (x, y) in enumerate(zip(cache.ids, context)) if x != y), min(held, len(context)))
        held = min(held, len(context) - 1)
        if held == 0 or (held < cache.length and (any(cache.windows) or cache.has_state)):
            self._logits = m.prefill(list(context))  # a ring or a recurrent state: not cut back unguarded
            self.synced = len(context)
            return
        cache.rollback(held)
        new = [int(t) for t in context[held:]]
        if len(new) <= self.STEPS:  # the one-token step: cheaper than a prefill's path for a few
            for j, t in enumerate(new):
                self._logits = m._forward([t], held + j)[0]
        else:
            prefilled = cache.prefilled  # rows after it came from decode steps: not a prefill's
            self._logits = m.prefill_into(cache, context, held)[0]
            if prefilled < held:  # the model's own prefix reuse stays exact
                cache.prefilled = prefilled
        self.synced = len(context)

    def accepted(self, context: Sequence[int]) -> None:
        """Cut the draft's cache back to the verified context (its rejected tokens dropped): it
        held the context up to where its last draft began, so only the draft is compared."""
        cache = self.model.cache
        keep = min(self.synced, cache.length)
        for a, b in zip(cache.ids[keep:cache.length], context[keep:]):
            if a != b:
                break
            keep += 1
        cache.rollback(keep)


def check_compatible(target, draft) -> None:
    """A draft model must speak the target's tokens: the same vocabulary and tokenizer."""
    if draft is target:
        raise ValueError("the draft model must be another model than the one it drafts for")
    checked = getattr(draft, "_checked_for", None)
    if checked is not None and checked() is target:
        return  # a pair checked before (each generation builds its drafter anew)
    tv, dv = target.config.vocab_size, draft.config.vocab_size
    if tv != dv:
        raise ValueError(f"the draft model's vocabulary ({dv} tokens) is not the target's ({tv})")
    if (target.lm_rows is None) != (draft.lm_rows is None) or (
            target.lm_rows is not None and not np.array_equal(target.lm_rows, draft.lm_rows)):
        raise ValueError("the draft model's lm head covers other token ids than the target's (slim_vocab)")
    probe = "def f(x):\n    return {'a': [1, 2.5]} # héllo <|im_end|>"
    if target.tokenizer.encode(probe) != draft.tokenizer.encode(probe) or \
            target.tokenizer.vocab_size != draft.tokenizer.vocab_size:
        raise ValueError("the draft model's tokenizer is not the target's (its tokens would mean other text)")
    draft._checked_for = weakref.ref(target)
