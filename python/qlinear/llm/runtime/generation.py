"""Choosing the next token: greedy, temperature / top-k / top-p sampling, repetition penalty."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np


@dataclass
class Sampling:
    """temperature 0 is greedy (argmax); top_k 0 and top_p 1 switch those filters off;
    repetition_penalty > 1 makes tokens already in the context less likely (as transformers)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    seed: Optional[int] = None
    stop_ids: Sequence[int] = field(default_factory=tuple)

    def __post_init__(self):
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an int >= 0, got {self.top_k!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not self.repetition_penalty > 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")


class Sampler:
    def __init__(self, params: Sampling):
        self.p = params
        # a negative seed as its 64-bit two's complement (numpy's generators take seeds >= 0)
        self.rng = np.random.default_rng(None if params.seed is None else params.seed % 2**64)

    def __call__(self, logits: np.ndarray, context: Sequence[int]) -> int:
        """The index of the next token in ``logits`` (1-D); ``context`` holds indices into the
        same space (for the repetition penalty)."""
        probs = self.distribution(logits, context)
        if probs is None:
            return int(np.argmax(self.penalized(logits, context)))
        return int(self.rng.choice(probs.shape[0], p=probs))

    def penalized(self, logits: np.ndarray, context: Sequence[int]) -> np.ndarray:
        """``logits`` with the repetition penalty applied to the tokens of ``context``."""
        p = self.p
        if p.repetition_penalty == 1.0 or not len(context):
            return logits
        seen = np.unique(np.asarray(context))
        seen = seen[seen < logits.shape[0]]
        vals = logits[seen]
        logits = logits.copy()
        logits[seen] = np.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
        return logits

    def distribution(self, logits: np.ndarray, context: Sequence[int]) -> Optional[np.ndarray]:
        """The float64 probabilities the next token is drawn from (after the penalty,
        temperature, top-k and top-p), or None when decoding is greedy."""
        p = self.p
        if p.temperature == 0:
            return None
        z = self.penalized(logits, context).astype(np.float64)
        with np.errstate(over="ignore"):  # a tiny temperature: -inf below the top (greedy's choice)
            z = (z - z.max()) / p.temperature
        if p.top_k and p.top_k < z.shape[0]:
            kth = np.partition(z, -p.top_k)[-p.top_k]
            z = np.where(z < kth, -np.inf, z)
        probs = np.exp(z - z.max())
        probs /= probs.sum()
        if p.top_p < 1.0:  # smallest set of most likely tokens whose mass reaches top_p
            order = np.argsort(-probs, kind="stable")
            cum = np.cumsum(probs[order])
            keep = order[:int(np.searchsorted(cum, p.top_p) + 1)]
            mask = np.zeros_like(probs)
            mask[keep] = probs[keep]
            probs = mask / mask.sum()
        return probs
