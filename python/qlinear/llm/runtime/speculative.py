"""Speculative decoding: a drafter proposes the next tokens, one forward of the model over them
(a verification: the decode step's code over rows of one sequence) scores them all, and every
token the model agrees with is kept, with one token more of the model's own.

Exact: a verification row computes what the one-token decode step computes at that position
(the projections are int8 GEMMs whose rows are the GEMV's, the attention runs row by row), so
greedy output is the plain greedy output token for token. Sampling keeps the model's distribution
by speculative rejection sampling (Leviathan et al. 2023, Chen et al. 2023): a draft x from q is
kept with probability min(1, p(x) / q(x)), else the token is drawn from max(p - q, 0) normalized;
an n-gram draft is a point mass (q(x) = 1). The KV rows of rejected tokens are rolled back,
sliding-window rings included (``KVCache.guard`` / ``rollback``).

The draft length adapts: the acceptance rate (a running mean) and the measured cost of a
verification of each length (and of drafting) give the expected tokens per second of each
length; the best is taken, 0 (plain decode) when no length pays, with an occasional probe so the
estimates follow the text. A draft model prefills the prompt with the model's prefill (counted in
its time) and times one step of its own there, so its cost is known before any draft; where
drafting could not gain much even with every draft kept (a small model whose weights sit in the
CPU's caches: a verification's extra rows and a draft token cost about a step), probes become
rare. A sampled sequence's lengths follow its acceptance alone (costs guessed, not measured): its
random draws, and so its text under a seed, do not depend on timings.

``Speculator`` is one sequence's part (drafter, draft length, judging the verification's rows):
``decode`` here runs one sequence, qlinear.llm.serve's scheduler verifies many in one batch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterator, Optional

import numpy as np

from .draft_length import DraftLength
from .drafters import ModelDrafter, NgramDrafter

MAX_DRAFT = 32
METHODS = ("ngram", "draft")


@dataclass
class Speculation:
    """``method``: "ngram" (prompt lookup) or "draft" (``draft_model``, a smaller model with the
    same tokenizer); ``max_draft``: the longest draft (1..32); ``adaptive``: choose each draft's
    length from the measured acceptance and costs (else always the longest available)."""

    method: str = "ngram"
    draft_model: object = None
    max_draft: int = 8
    adaptive: bool = True
    max_ngram: int = 4
    min_ngram: int = 2

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"speculative must be one of {', '.join(METHODS)}, got {self.method!r}")
        if isinstance(self.max_draft, bool) or not isinstance(self.max_draft, int) or not 1 <= self.max_draft <= MAX_DRAFT:
            raise ValueError(f"max_draft must be an int in 1..{MAX_DRAFT}, got {self.max_draft!r}")
        if self.method == "draft" and self.draft_model is None:
            raise ValueError("speculative='draft' needs a draft_model (a smaller model with the same tokenizer)")
        if self.method == "ngram" and self.draft_model is not None:
            raise ValueError("a draft_model goes with speculative='draft', not 'ngram'")

    @classmethod
    def of(cls, speculative, draft_model=None, max_draft: Optional[int] = None) -> Optional["Speculation"]:
        """``Model.stream_ids``' options as a Speculation (None: plain decode)."""
        if speculative is None or speculative is False:
            if draft_model is not None:
                raise ValueError("draft_model given without speculative='draft'")
            return None
        if isinstance(speculative, Speculation):
            return speculative
        if not isinstance(speculative, str):
            raise TypeError(f"speculative must be None, 'ngram', 'draft' or a Speculation, got {type(speculative).__name__}")
        return cls(speculative, draft_model, **({} if max_draft is None else {"max_draft": max_draft}))


def judge(p: Optional[np.ndarray], q: Optional[np.ndarray], x: Optional[int], logits: np.ndarray,
          sampler) -> tuple[bool, int]:
    """(kept, token): the draft ``x`` against the model's distribution ``p`` (None: greedy, whose
    choice is ``argmax`` of the penalized ``logits``); ``q``: the draft's distribution (None: a
    point mass on x). A rejected draft's replacement comes from the residual distribution.
    ``x`` None: a token the lm head cannot produce (vocabulary slimming), always rejected."""
    if p is None:
        best = int(np.argmax(logits))
        return best == x, best
    if x is None:
        return False, int(sampler.rng.choice(len(p), p=p))
    qx = 1.0 if q is None else float(q[x])
    if qx > 0 and sampler.rng.random() * qx < p[x]:  # u < p(x) / q(x)
        return True, x
    residual = np.maximum(p - (np.eye(1, len(p), x)[0] if q is None else q), 0.0)
    total = residual.sum()
    if not total > 0:  # p == q: nothing left to prefer (a kept draft would have been certain)
        return True, x
    return False, int(sampler.rng.choice(len(p), p=residual / total))


class Speculator:
    """One sequence's speculative decoding: its drafter (``draft_model``, if given, instead of
    the Speculation's: a model of the sequence's own) and draft length, and the judging of a
    verification's rows."""

    def __init__(self, spec: Speculation, target, sampler, draft_model=None):
        self.drafter = (NgramDrafter(spec.max_ngram, spec.min_ngram) if spec.method == "ngram"
                        else ModelDrafter(target, draft_model or spec.draft_model))
        self.length = DraftLength(spec.max_draft, spec.adaptive, timed=sampler.p.temperature == 0,
                                  costly_drafts=spec.method == "draft")
        self.sampler = sampler
        self.to_row = (lambda t: t) if target.lm_rows is None else {int(t): i for i, t in enumerate(target.lm_rows)}.get
        self.draft_seconds = 0.0  # of the last draft

    def start(self, tokens: list) -> None:
        """After the prefill, before the first draft: a draft model prefills the prompt into its
        cache (no catching up at the first draft) and times one step of its own, so the draft
        length weighs drafting's cost from the start."""
        if hasattr(self.drafter, "start"):
            seconds = self.drafter.start(tokens)
            if seconds is not None:
                self.length.drafted(seconds)

    def draft(self, tokens: list, rows: list, room: int) -> tuple[list, list]:
        """Up to ``room`` token ids to follow ``tokens`` (``rows``: their lm head indices), as many
        as the draft length chooses, and the distributions they were drawn from."""
        k = self.length.choose(room)
        t = time.perf_counter()
        # a draft model's catching up (the tokens the model added since its last draft) is part
        # of drafting's cost: the token after each verification, the text plain steps decoded
        if k and hasattr(self.drafter, "sync"):
            self.drafter.sync(tokens)
        drafts, dists = self.drafter.propose(tokens, rows, k, self.sampler) if k else ([], [])
        self.draft_seconds = time.perf_counter() - t
        return drafts[:k], dists[:k]

    def verdicts(self, logits: np.ndarray, drafts: list, dists: list, rows: list) -> Iterator[tuple[bool, int]]:
        """(kept, lm head row) of each token a verification decides: every draft kept, then the
        model's own (the first rejected draft's replacement, or the token after the last draft).
        ``logits``: the verification's rows; ``rows``, the context for the repetition penalty,
        may grow by each token before the next is judged."""
        for j, d in enumerate(drafts):
            kept, x = judge(self.sampler.distribution(logits[j], rows), dists[j], self.to_row(d),
                            self.sampler.penalized(logits[j], rows), self.sampler)
            yield kept, x
            if not kept:
                return
        yield False, self.sampler(logits[len(drafts)], rows)

    def verified(self, cache, start: int, drafted: int, accepted: int, tokens: list, seconds: float) -> None:
        """After a verification at ``start`` of ``drafted`` drafts (``seconds``) that kept
        ``accepted``: the draft length learns, the cache keeps the accepted rows, the drafter
        follows ``tokens``."""
        self.length.update(drafted, accepted, 1 + drafted, seconds, self.draft_seconds)
        cache.rollback(start + 1 + accepted)
        self.drafter.accepted(tokens)


def decode(model, logits: np.ndarray, ids: list, rows: list, max_new_tokens: int, sampler, stop: set,
           spec: Speculation) -> Iterator[int]:
    """The tokens after a prefill whose last logits are ``logits`` (``ids``: the prompt's token
    ids, ``rows``: their indices in the lm head, for the repetition penalty), each verification
    one forward of the model over the token last decided and the draft."""
    st, cache = model.stats, model.cache
    speculator = Speculator(spec, model, sampler)
    to_id = (lambda r: r) if model.lm_rows is None else (lambda r: int(model.lm_rows[r]))
    tokens = list(ids)
    st.finish_reason = "length"
    clock = time.perf_counter()
    speculator.start(tokens)  # a draft model's prefill: part of the prefill's time
    st.prefill_s += time.perf_counter() - clock
    clock = time.perf_counter()

    def decided(row: int) -> bool:
        """A token decided: False when generation ends with it (a stop token, the length)."""
        nonlocal clock
        now = time.perf_counter()
        st.decode_s += now - clock
        clock = now
        token = to_id(row)
        if token in stop:
            st.finish_reason = "stop"
            return False
        st.decode_tokens += 1
        yielded.append(token)
        tokens.append(token)
        rows.append(row)
        return st.decode_tokens < max_new_tokens

    # The prefill's logits judge the first draft token: the first token is speculative too.
    yielded: list = []
    drafts, dists = speculator.draft(tokens, rows, max(0, min(spec.max_draft, cache.capacity - cache.length - 1)))
    if drafts:
        ok, x = judge(sampler.distribution(logits, rows), dists[0], speculator.to_row(drafts[0]),
                      sampler.penalized(logits, rows), sampler)
        st.draft_tokens, st.accepted_tokens = st.draft_tokens + 1, st.accepted_tokens + ok
        drafts, dists = (drafts[1:], dists[1:]) if ok else ([], [])
    else:
        x = sampler(logits, rows)
    going = max_new_tokens > 0 and decided(x)
    yield from _drain(yielded)
    while going:
        clock = time.perf_counter()
        start = cache.length
        room = min(cache.capacity - start, cache.max_run) - 1  # after the decided token
        if room < 0:
            break
        if not drafts:
            drafts, dists = speculator.draft(tokens, rows, room)
        if not drafts:  # a plain step: the one-token step, without a verification's bookkeeping
            t = time.perf_counter()
            out = model._forward([to_id(rows[-1])], start)[0]
            speculator.length.update(0, 0, 1, time.perf_counter() - t, 0.0)
            st.decode_steps += 1
            st.step_tokens += 1
            going = decided(sampler(out, rows))
            yield from _drain(yielded)
            continue
        drafts, dists = drafts[:room], dists[:room]
        block = [to_id(rows[-1])] + drafts
        cache.guard(start, len(block))
        t = time.perf_counter()
        out = model.verify(block, start)
        seconds = time.perf_counter() - t
        st.decode_steps += 1
        st.step_tokens += 1
        accepted = 0
        for kept, x in speculator.verdicts(out, drafts, dists, rows):
            accepted += kept
            going = decided(x)
            if not going:
                break
        st.draft_tokens += len(drafts)
        st.accepted_tokens += accepted
        st.step_tokens += accepted
        speculator.verified(cache, start, len(drafts), accepted, tokens, seconds)
        drafts, dists = [], []
        yield from _drain(yielded)


def _drain(pending: list) -> Iterator[int]:
    while pending:
        yield pending.pop(0)
