"""Drafters for speculative decoding: they propose the next tokens, the model verifies them.

- ``NgramDrafter`` (prompt lookup, llama.cpp's ngram-simple / ngram-map-k): the longest suffix of
  the text so far (prompt included) of ``min_ngram`` to ``max_ngram`` tokens that occurred before,
  and the tokens that followed its latest earlier occurrence (continued periodically where they
  reach the end of the text). An index of every n-gram's latest end keeps a lookup O(max_ngram)
  per token.
- ``ModelDrafter``: a smaller model with the same tokenizer decodes ahead on its own KV cache
  (run by the same runtime); after a verification its cache is cut back to what was accepted.

A drafter's ``propose(context, rows, k, sampler)`` returns up to ``k`` token ids and, for each,
the distribution over the lm head it was drawn from (None: a point mass on the token, as n-gram
drafts are); ``context`` holds the token ids so far, ``rows`` their lm head indices.
"""

from __future__ import annotations

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

    def sync(self, context: Sequence[int]) -> None:
        """Bring the draft's cache up to the context (the cached prefix reused: what was
        accepted since its last draft is run: the model's own token while drafts go on, a
        catching up after plain steps)."""
        self._logits = self.model.prefill(list(context))
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
