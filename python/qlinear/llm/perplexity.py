"""Perplexity of a model over a text, and the KL divergence of its next-token distributions from
a base model's (``llm.perplexity``, ``qlinear-llm perplexity --kl-divergence BASE``), so
quantization methods compare on text as llama.cpp's ``llama-perplexity --kl-divergence`` does.

Two ways to cut the text into windows (``scheme``):
- ``"sliding"``: windows of ``window`` tokens start every ``stride < window`` tokens; each window
  scores only the tokens the previous windows did not (the first window all but its first token),
  so every token past the first is scored once and, past the first window, from at least
  ``window - stride`` tokens of context (the Hugging Face perplexity guide's scheme);
- ``"chunks"``: llama-perplexity's: non-overlapping chunks of ``window`` tokens (a partial last
  chunk dropped), each scoring the tokens of its second half, from at least ``window / 2``
  tokens of context.

The base is a model (run over the same windows) or a file of its log-probabilities saved by an
earlier run (``save_base=``): float16 log-softmax rows of the scored positions (llama.cpp keeps
its base logits as 16-bit values too) and each row's most likely token (taken before the
rounding, which would break near-ties), with the token ids and windows they belong to.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np

WINDOW, STRIDE = 512, 256
SCHEMES = ("sliding", "chunks")
BASE_KIND = "qlinear-base-log-probs"


@dataclass(frozen=True)
class Divergence:
    """KL(base || model) per scored token, in nats, summarized as llama-perplexity does."""

    mean: float
    stderr: float         # standard error of the mean
    median: float
    p90: float
    p99: float
    p999: float
    max: float
    top1_agreement: float  # fraction of positions where both models' most likely token is the same
    base_perplexity: float

    def __str__(self) -> str:
        return (f"KL divergence mean {self.mean:.6f} ± {self.stderr:.6f}, median {self.median:.6f}, "
                f"99% {self.p99:.6f}, max {self.max:.6f}; same top token {100 * self.top1_agreement:.2f}%; "
                f"base perplexity {self.base_perplexity:.4f}")


@dataclass(frozen=True)
class PerplexityResult:
    perplexity: float     # exp(nll)
    nll: float            # mean negative log-likelihood of the scored tokens, nats
    tokens: int           # tokens scored
    windows: int
    forward_tokens: int   # tokens run through the model (windows overlap)
    seconds: float
    divergence: Optional[Divergence] = None   # with a base

    @property
    def tok_s(self) -> float:
        """Tokens run through the model per second."""
        return self.forward_tokens / self.seconds if self.seconds else 0.0

    def __str__(self) -> str:
        s = (f"perplexity {self.perplexity:.4f} (nll {self.nll:.4f} nats/token) over {self.tokens} tokens, "
             f"{self.windows} windows; {self.forward_tokens} tokens in {self.seconds:.2f} s ({self.tok_s:.1f} tok/s)")
        return s if self.divergence is None else f"{s}\n{self.divergence}"


def windows(n: int, window: int, stride: int, scheme: str = "sliding") -> list[tuple[int, int, int]]:
    """(begin, end, first scored position) of each window over ``n`` tokens."""
    if scheme == "chunks":
        return [(b, b + window, b + window // 2 + 1) for b in range(0, n - window + 1, window)]
    out, prev_end = [], 0
    for begin in range(0, n, stride):
        end = min(begin + window, n)
        out.append((begin, end, max(prev_end, begin + 1)))
        prev_end = end
        if end == n:
            break
    return out


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Rows of float64 log-probabilities (-inf logits, slimmed-away ids, stay -inf)."""
    x = logits.astype(np.float64)
    top = x.max(1, keepdims=True)
    return x - (np.log(np.exp(x - top).sum(1, keepdims=True)) + top)


def _token_ids(model, text_or_ids) -> np.ndarray:
    if isinstance(text_or_ids, str):
        return np.asarray(model.tokenizer.encode(text_or_ids), np.int64)
    ids = np.asarray(text_or_ids)
    if ids.size and (ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer)):
        raise TypeError("token ids must be a 1-D sequence of ints")
    return ids.astype(np.int64)


def _check_args(model, window, stride, scheme) -> None:
    for name, v in (("window", window), ("stride", stride)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if window < 2:
        raise ValueError(f"window must be >= 2 tokens, got {window}")
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {', '.join(SCHEMES)}, got {scheme!r}")
    if scheme == "sliding" and stride >= window:
        raise ValueError(f"stride ({stride}) must be smaller than window ({window}): the first token of a "
                         "window is scored from the previous one's context")
    if window > model.cache.capacity:
        raise ValueError(f"window ({window}) exceeds the model's context ({model.cache.capacity} positions: max_context)")


class SavedBase:
    """Base log-probabilities read from a file of ``save_base``, checked against the run."""

    def __init__(self, path):
        from .._format import load_weights  # noqa: PLC0415

        self.path = Path(path)
        try:
            tensors, meta = load_weights(self.path)
        except (OSError, ValueError) as e:
            raise ValueError(f"{self.path}: not a base log-probabilities file ({e})") from None
        if meta.get("kind") != BASE_KIND or set(tensors) != {"log_probs", "top", "ids"}:
            raise ValueError(f"{self.path}: not a base log-probabilities file (kind {meta.get('kind')!r})")
        self.log_probs, self.top, self.meta = tensors["log_probs"], tensors["top"], meta
        self.ids = np.asarray(tensors["ids"], np.int64)
        self.row = 0

    def check(self, ids: np.ndarray, window: int, stride: int, scheme: str, vocab: int) -> None:
        got = {"window": window, "stride": stride, "scheme": scheme, "vocab": vocab}
        want = {k: self.meta.get(k) for k in got}
        if scheme == "chunks":
            got.pop("stride"), want.pop("stride")
        if got != want:
            raise ValueError(f"{self.path}: the base was computed with {want}, this run uses {got}")
        if not np.array_equal(ids, self.ids):
            raise ValueError(f"{self.path}: the base was computed over other tokens "
                             f"({len(self.ids)} tokens there, {len(ids)} here, or another tokenizer)")

    def next(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """The next ``n`` rows' log-probabilities (renormalized after the float16 rounding) and
        most likely tokens."""
        rows = self.log_probs[self.row:self.row + n].astype(np.float64)
        top = self.top[self.row:self.row + n]
        self.row += n
        return rows - np.log(np.exp(rows).sum(1, keepdims=True)), top


def perplexity(model, text_or_ids: Union[str, Sequence[int], np.ndarray], window: int = WINDOW,
               stride: int = STRIDE, *, scheme: str = "sliding", base=None,
               save_base: Optional[Union[str, Path]] = None) -> PerplexityResult:
    """Perplexity of ``model`` (an ``llm.Model``) over a text (encoded with its tokenizer) or
    token ids, in windows (see the module's description). Teacher-forced logits
    (``model.logits``) per window; log-softmax in float64.

    ``base``: a model, or a file written by ``save_base``; the result then carries the KL
    divergence of ``model``'s next-token distributions from the base's and their top-1
    agreement. ``save_base``: write this model's log-probabilities of the scored positions to a
    file, to be a later run's base."""
    _check_args(model, window, stride, scheme)
    ids = _token_ids(model, text_or_ids)
    spans = windows(len(ids), window, stride, scheme)
    if len(ids) < 2 or not spans:
        raise ValueError(f"perplexity needs at least {2 if scheme == 'sliding' else window} tokens, got {ids.size}")
    vocab = model.config.vocab_size
    saved = SavedBase(base) if isinstance(base, (str, Path)) else None
    if saved is not None:
        saved.check(ids, window, stride, scheme, vocab)
    elif base is not None and base.config.vocab_size != vocab:
        raise ValueError(f"the base model's vocabulary ({base.config.vocab_size}) is not this model's ({vocab})")
    t0 = time.perf_counter()
    nll, base_nll, kld, same, kept, forward = [], [], [], [], [], 0
    for begin, end, first in spans:
        lp = log_softmax(model.logits(ids[begin:end])[first - 1 - begin:end - 1 - begin])
        targets = ids[first:end]
        nll.append(-lp[np.arange(len(lp)), targets])
        forward += end - begin
        if save_base is not None:
            kept.append((lp.astype(np.float16), lp.argmax(1).astype(np.int32)))
        if base is None:
            continue
        if saved:
            blp, btop = saved.next(len(lp))
        else:
            blp = log_softmax(base.logits(ids[begin:end])[first - 1 - begin:end - 1 - begin])
            btop = blp.argmax(1)
        p = np.exp(blp)
        with np.errstate(invalid="ignore"):  # 0 * (-inf - x) where the base gives a token no mass
            kld.append(np.nansum(p * (blp - lp), axis=1))
        same.append(lp.argmax(1) == btop)
        base_nll.append(-blp[np.arange(len(blp)), targets])
    seconds = time.perf_counter() - t0
    nll = np.concatenate(nll)
    if save_base is not None:
        from .._format import save_weights  # noqa: PLC0415
        save_weights(save_base, {"log_probs": np.concatenate([r for r, _ in kept]),
                                 "top": np.concatenate([t for _, t in kept]), "ids": ids.astype(np.int32)},
                     metadata={"kind": BASE_KIND, "window": window, "stride": stride, "scheme": scheme, "vocab": vocab})
    divergence = None
    if base is not None:
        k = np.concatenate(kld)
        q = np.quantile(k, [0.5, 0.9, 0.99, 0.999])
        divergence = Divergence(float(k.mean()), float(k.std(ddof=1) / np.sqrt(len(k))) if len(k) > 1 else 0.0,
                                *map(float, q), float(k.max()), float(np.concatenate(same).mean()),
                                float(np.exp(np.concatenate(base_nll).mean())))
    mean = float(nll.mean())
    return PerplexityResult(float(np.exp(mean)), mean, len(nll), len(spans), forward, seconds, divergence)
