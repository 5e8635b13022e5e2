"""Log-probabilities of the generated tokens (OpenAI's ``logprobs`` / ``top_logprobs``): noted
in the scheduler's thread for the sequences that ask, as each token is decided, and formatted
here in the chat or the completions shape.

The values are vLLM's default raw logprobs: log-softmax, in float64, of the float32 logits row
the sampler saw at that position (before temperature and top-p), over the rows the lm head
computes (all the vocabulary, or the rows a slimmed lm head keeps: the others have probability
0). With structured output the sampler sees the grammar's masked logits, and so do the
logprobs: the distribution the token was drawn from (a forced token's logprob is 0; only
allowed tokens are alternatives). A speculative sequence's token takes the verification row
that decided it (bit-identical to the plain step's). A token's text is the tokenizer's decoding of it alone (special tokens
included); its ``bytes`` are that text's UTF-8 bytes."""

from __future__ import annotations

from typing import Optional

import numpy as np


def record(seq, logits: np.ndarray, row: int, lm_rows: Optional[np.ndarray]) -> None:
    """Append (token id, logprob, [(id, logprob) of the ``seq.logprobs`` most likely rows, most
    likely first]) for the token of lm head row ``row`` to ``seq.entries``; nothing when the
    sequence did not ask (``seq.logprobs`` None)."""
    top = seq.logprobs
    if top is None:
        return
    x = np.asarray(logits, np.float32).astype(np.float64)
    m = x.max()
    lp = x - (m + np.log(np.exp(x - m).sum()))
    to_id = int if lm_rows is None else (lambda r: int(lm_rows[r]))
    best = []
    if top:
        some = np.argpartition(-lp, top - 1)[:top] if top < len(lp) else np.arange(len(lp))
        # rows a grammar forbids (-inf) are not alternatives (nor JSON numbers)
        best = sorted((int(r) for r in some if lp[r] > -np.inf), key=lambda r: (-lp[r], r))
    seq.entries.append((to_id(row), float(lp[row]), [(to_id(r), float(lp[r])) for r in best]))


class LogprobFormat:
    """One request's entries (as ``record`` notes them) in its answer's shape; called with the
    entries of a whole answer, or of each chunk in turn (the completions' text offsets go on)."""

    def __init__(self, tokenizer, chat: bool):
        self.tokenizer, self.chat = tokenizer, chat
        self.offset = 0  # completions: the text offset of the next token
        self._texts: dict = {}

    def text(self, token: int) -> str:
        if token not in self._texts:
            self._texts[token] = self.tokenizer.hf.decode([token], skip_special_tokens=False)
        return self._texts[token]

    def _chat_item(self, token: int, logprob: float) -> dict:
        text = self.text(token)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    def __call__(self, entries: list) -> dict:
        if self.chat:
            return {"content": [{**self._chat_item(t, lp), "top_logprobs": [self._chat_item(a, alp) for a, alp in top]}
                                for t, lp, top in entries], "refusal": None}
        tokens, offsets, tops = [], [], []
        for token, logprob, top in entries:
            tokens.append(self.text(token))
            offsets.append(self.offset)
            self.offset += len(tokens[-1])
            # OpenAI's legacy shape: the alternatives and the chosen token, most likely first
            both = top + ([] if any(a == token for a, _ in top) else [(token, logprob)])
            tops.append({self.text(a): alp for a, alp in sorted(both, key=lambda p: -p[1])})
        return {"tokens": tokens, "token_logprobs": [lp for _, lp, _ in entries], "top_logprobs": tops,
                "text_offset": offsets}
