"""One request's generation as the scheduler runs it: its prompt, sampling, stop tokens, what
it has generated, its KV cache and (decoding speculatively) its speculator."""

from __future__ import annotations

from typing import Callable, Optional, Sequence as Seq

from ..runtime.generation import Sampler, Sampling
from ..runtime.kv_cache import KVCache
from ..runtime.speculative import Speculation, Speculator


class Sequence:
    """One request's generation. ``emit(kind, value)`` is called from the scheduler thread:
    ("token", id) per generated token, then ("done", "stop" | "length" | "cancelled") or
    ("error", message). ``speculation``: decode it speculatively (None: one token per step);
    ``constraint``: the grammar its tokens follow (``structured.Constraint``; None: free);
    ``logit_bias``: (rows, values) added to the logits before sampling (OpenAI's logit_bias)."""

    def __init__(self, ids: Seq[int], max_tokens: int, sampling: Sampling, emit: Callable[[str, object], None],
                 ignore_eos: bool = False, speculation: Optional[Speculation] = None, logprobs: Optional[int] = None,
                 constraint=None, logit_bias: Optional[tuple] = None):
        if not len(ids):
            raise ValueError("the prompt is empty")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        self.ids = [int(i) for i in ids]
        self.max_tokens = max_tokens
        self.sampler = Sampler(sampling)
        self.stop_ids = set(sampling.stop_ids)
        self.ignore_eos = ignore_eos  # the model's stop tokens do not end it
        self.emit, self.cancelled = emit, False
        self.logprobs, self.entries = logprobs, []  # logprobs (top alternatives; None: none): record's entries
        # structured output (serve.structured.Constraint): its logits masked before sampling. It
        # decodes one token per step: drafts would need a mask per verification row
        self.constraint = constraint
        self.logit_bias = logit_bias  # (lm head rows, values) added to their logits before sampling; None: none
        self.speculation = None if constraint is not None or logit_bias is not None else speculation
        self.speculator: Optional[Speculator] = None  # the scheduler's, while it runs
        self.cache: Optional[KVCache] = None
        self.cached_tokens = 0  # the prompt's leading tokens whose KV rows the prefix cache held
        # generated ids -> the ids a next turn's prompt starts with (chat: the history and this
        # reply as the template renders them), prefilled into the prefix cache once it ends
        self.next_turn: Optional[Callable[[list], list]] = None
        self.tokens = list(self.ids)  # the prompt and the tokens generated (what drafts follow)
        self.generated = 0
        self.next_token: Optional[int] = None

    def biased(self, logits):
        """``logits`` with the request's logit_bias added (a copy; the same array if it has none)."""
        if self.logit_bias is None:
            return logits
        out = logits.copy()
        out[self.logit_bias[0]] += self.logit_bias[1]
        return out

    def cancel(self) -> None:
        """Stop generating (from any thread): the scheduler frees the sequence at its next step."""
        self.cancelled = True
