"""The draft length of speculative decoding: each draft's length chosen from the acceptance so
far and the measured cost of a verification of each length and of drafting (tokens per second
expected), 0 (a plain step) when no length pays."""

from __future__ import annotations

from collections import deque
from typing import Optional


class DraftLength:
    """Chooses each draft's length from the running acceptance rate and measured costs."""

    RATE = 0.15   # weight of the newest figure in the running means
    WINDOW = 8    # verifications of each length whose least time is its cost
    WARM_UP = 3   # plain steps measured before any draft
    FUTILE_GAIN = 1.2  # the least speed-up, were every draft kept, worth probing for

    def __init__(self, max_draft: int, adaptive: bool, probe_every: int = 16, timed: bool = True,
                 costly_drafts: bool = False):
        self.max_draft, self.adaptive, self.probe_every = max_draft, adaptive, probe_every
        self.timed = timed             # False: costs guessed, lengths a function of the acceptance alone
        # drafting costs as much as a step or more (a draft model on a small target): plain steps
        # until their time settles and a short first draft, or drafts would look cheap at first;
        # an n-gram draft is free and starts at once
        self.costly_drafts = costly_drafts
        # acceptance of a draft token whose predecessors were kept: kept / tried, running sums
        # (a prior of 0.6 of one try); tokens after a rejection were never tried
        self.kept, self.tried = 0.6, 1.0
        self.verify_s: dict = {}       # rows -> seconds of a verification: the least of the last few
        self.recent: dict = {}         # rows -> those seconds
        self.draft_s = 0.0             # seconds to draft one token: the median of the last few drafts
        self.recent_drafts: deque = deque(maxlen=self.WINDOW)
        self.plain_run = self.draft_run = 0
        self.probe_interval = probe_every  # doubles after each probe that did not pay
        # drafting could not gain FUTILE_GAIN even if every draft were kept (a verification's
        # extra row and a draft token cost about a step: a small model whose weights sit in the
        # CPU's caches): probes, each needing a draft model to catch up, would not pay back
        self.futile = False

    @property
    def alpha(self) -> float:
        return self.kept / self.tried

    def warming(self) -> bool:
        """Plain steps still being measured: fewer than WARM_UP, or (up to WINDOW) the last was
        faster than all before it by 10% (the first steps after a prefill run slower while the
        caches warm: a draft weighed against them would look cheap)."""
        plain = self.recent.get(1, ())
        if len(plain) < self.WARM_UP:
            return True
        return self.costly_drafts and len(plain) < self.WINDOW and plain[-1] < 0.9 * min(list(plain)[:-1])

    def best(self, k_max: int, alpha: Optional[float] = None) -> int:
        return self.rate(k_max, alpha)[0]

    def rate(self, k_max: int, alpha: Optional[float] = None) -> tuple:
        """(the draft length of the most tokens per second, that rate over plain decoding's): a
        verification's expected tokens, 1 + a + ... + a^k (a: the acceptance so far, or
        ``alpha``), over its cost (a length not measured yet: the 1-row cost and the steepest
        measured slope). Runs once a token: plain arithmetic, no allocation."""
        one = self.verify_s.get(1)
        timed = one is not None
        slope = max(((t - one) / (r - 1) for r, t in self.verify_s.items() if r > 1), default=0.02 * one) if timed else 0.1
        a, term, tokens = min(self.alpha if alpha is None else alpha, 0.999), 1.0, 1.0
        best, best_rate = 0, 1.0 / (one if timed else 1.0)
        for k in range(1, k_max + 1):
            term *= a
            tokens += term
            cost = (self.verify_s.get(k + 1, one + slope * k) + k * self.draft_s) if timed else 1.0 + 0.1 * k
            if tokens / cost > best_rate:
                best, best_rate = k, tokens / cost
        return best, best_rate * (one if timed else 1.0)

    def choose(self, available: int) -> int:
        k_max = min(self.max_draft, available)
        if k_max <= 0 or not self.adaptive:
            return max(k_max, 0)
        if self.timed and self.warming():
            return 0  # plain steps first: the cost every draft length is weighed against
        if self.futile and self.plain_run + 1 < 16 * self.probe_every:
            self.plain_run += 1  # no length can pay: plain steps until the next (rare) probe
            return 0
        best = self.best(k_max)
        if best and self.costly_drafts and not self.recent_drafts:
            best = min(best, 2)  # the first draft measures drafting's cost: a short one
        if best:
            self.plain_run, self.probe_interval = 0, self.probe_every
            self.draft_run += 1
            # now and then a plain step, so that the cost drafts are weighed against stays
            # measured (the first steps after a prefill run slower while caches warm)
            return 0 if self.draft_run % self.probe_every == 0 else best
        self.plain_run += 1
        if self.futile:  # probes cannot pay: only seldom, in case the costs were misread
            self.probe_interval = 16 * self.probe_every
        if self.plain_run < self.probe_interval:
            return 0
        # a probe keeps the acceptance current; while probes do not pay, they grow rarer
        self.plain_run, self.probe_interval = 0, min(2 * self.probe_interval, 16 * self.probe_every)
        return min(2, k_max)

    def drafted(self, seconds: float) -> None:
        """The seconds one draft token took (a draft model's step timed before any draft)."""
        self.recent_drafts.append(seconds)  # a median: a catching up after plain steps is rare
        self.draft_s = sorted(self.recent_drafts)[len(self.recent_drafts) // 2]

    def update(self, drafted: int, accepted: int, rows: int, seconds: float, draft_seconds: float) -> None:
        rate = self.RATE
        if drafted:
            tried = accepted + (accepted < drafted)
            self.kept += rate * (accepted - self.kept)
            self.tried += rate * (tried - self.tried)
            self.drafted(draft_seconds / drafted)
        # the least of the last few: a step's cost is its time when nothing else intervened
        # (a shared machine's preemptions, the first steps' cold caches and buffers only add)
        recent = self.recent.setdefault(rows, deque(maxlen=self.WINDOW))
        recent.append(seconds)
        self.verify_s[rows] = min(recent)
        if rows > 1 and self.timed and 1 in self.verify_s:
            self.futile = self.rate(self.max_draft, alpha=1.0)[1] < self.FUTILE_GAIN
