"""Sliding-window perplexity of a model over a text (``llm.perplexity``, ``qlinear-llm perplexity``),
so quantization methods compare on text.

Windows of ``window`` tokens start every ``stride < window`` tokens; each window scores only the
tokens the previous windows did not (the first window all but its first token), each predicted
from the window's tokens before it, so every token past the first is scored once and, past the
first window, from at least ``window - stride`` tokens of context (the Hugging Face perplexity
guide's scheme).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence, Union

import numpy as np

WINDOW, STRIDE = 512, 256


@dataclass(frozen=True)
class PerplexityResult:
    perplexity: float     # exp(nll)
    nll: float            # mean negative log-likelihood of the scored tokens, nats
    tokens: int           # tokens scored
    windows: int
    forward_tokens: int   # tokens run through the model (windows overlap)
    seconds: float

    @property
    def tok_s(self) -> float:
        """Tokens run through the model per second."""
        return self.forward_tokens / self.seconds if self.seconds else 0.0

    def __str__(self) -> str:
        return (f"perplexity {self.perplexity:.4f} (nll {self.nll:.4f} nats/token) over {self.tokens} tokens, "
                f"{self.windows} windows; {self.forward_tokens} tokens in {self.seconds:.2f} s ({self.tok_s:.1f} tok/s)")


def windows(n: int, window: int, stride: int) -> list[tuple[int, int, int]]:
    """(begin, end, first scored position) of each window over ``n`` tokens."""
    out, prev_end = [], 0
    for begin in range(0, n, stride):
        end = min(begin + window, n)
        out.append((begin, end, max(prev_end, begin + 1)))
        prev_end = end
        if end == n:
            break
    return out


def perplexity(model, text_or_ids: Union[str, Sequence[int], np.ndarray], window: int = WINDOW,
               stride: int = STRIDE) -> PerplexityResult:
    """Perplexity of ``model`` (an ``llm.Model``) over a text (encoded with its tokenizer) or
    token ids, in windows of ``window`` tokens every ``stride`` (see the module's description).
    Teacher-forced logits (``model.logits``) per window; log-softmax in float64."""
    for name, v in (("window", window), ("stride", stride)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if window < 2:
        raise ValueError(f"window must be >= 2 tokens, got {window}")
    if stride >= window:
        raise ValueError(f"stride ({stride}) must be smaller than window ({window}): the first token of a "
                         "window is scored from the previous one's context")
    if window > model.cache.capacity:
        raise ValueError(f"window ({window}) exceeds the model's context ({model.cache.capacity} positions: max_context)")
    if isinstance(text_or_ids, str):
        ids = np.asarray(model.tokenizer.encode(text_or_ids), np.int64)
    else:
        ids = np.asarray(text_or_ids)
        if ids.size and (ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer)):
            raise TypeError("token ids must be a 1-D sequence of ints")
    if ids.size < 2:
        raise ValueError(f"perplexity needs at least 2 tokens, got {ids.size}")
    t0 = time.perf_counter()
    nll, scored, forward = 0.0, 0, 0
    spans = windows(len(ids), window, stride)
    for begin, end, first in spans:
        logits = model.logits(ids[begin:end])[first - 1 - begin:end - 1 - begin].astype(np.float64)
        top = logits.max(1, keepdims=True)
        lse = np.log(np.exp(logits - top).sum(1)) + top[:, 0]
        nll += float((lse - logits[np.arange(len(logits)), ids[first:end]]).sum())
        scored += end - first
        forward += end - begin
    mean = nll / scored
    return PerplexityResult(float(np.exp(mean)), mean, scored, len(spans), forward, time.perf_counter() - t0)
