"""Structured output: a request's ``response_format`` (``json_object``, ``json_schema``) or a tool
call's format becomes a grammar, and the grammar a ``Constraint`` on its sequence's tokens.

llguidance compiles the grammar and computes, before each token, the mask of the tokenizer's
tokens that keep the output on the grammar (it was measured against xgrammar on our tokenizers:
docs/serving.md). The mask goes over the lm head's rows (a slimmed head's rows are token ids
``lm_rows``; tokens outside the tokenizer are never allowed), and the disallowed rows' logits
become -inf before the sampler sees them, greedy or sampled. The matcher advances with each
decided token; once the grammar can take nothing more the sequence ends ("stop").

JSON is generated with fixed separators (", " and ": ", no other whitespace): a model free to
put whitespace anywhere can wander in it (small models do) and never close the object."""

from __future__ import annotations

import json
import threading
from typing import Optional

import numpy as np

from .protocol import ApiError

COMPILED = 64  # grammars kept compiled (a compilation: ~0.6 ms for a small schema, 4,096 tokens)
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def _llguidance():
    try:
        import llguidance
    except ImportError:  # the serve extra installs it
        raise ApiError(400, "structured output needs the llguidance package (pip install 'qlinear[serve]')",
                       param="response_format") from None
    return llguidance


def json_grammar(schema: dict, param: str = "response_format") -> str:
    """The llguidance grammar of JSON values that satisfy ``schema``; ApiError 400 for a schema it
    cannot read (an integer beyond 64 bits in it)."""
    try:
        return _llguidance().LLMatcher.grammar_from_json_schema(schema, overrides=JSON_OPTIONS)
    except ValueError as e:
        raise ApiError(400, f"'{param}': the schema cannot be used: {e}", param=param) from None


def check_grammar(grammar: str, param: str) -> str:
    """``grammar`` if llguidance compiles it; otherwise ApiError 400 with its message."""
    bad, messages = _llguidance().LLMatcher.validate_grammar_with_warnings(grammar)
    if bad:
        raise ApiError(400, f"'{param}': the schema cannot be used: {messages[0] if messages else 'invalid'}",
                       param=param)
    return grammar


def response_schema(body: dict) -> Optional[dict]:
    """The JSON Schema a request's ``response_format`` asks for (None: free text); ApiError 400 for
    a malformed one (a schema llguidance rejects: at ``Grammars.constraint``)."""
    fmt = body.get("response_format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind != "json_schema":
        raise ApiError(400, "'response_format' must be an object with 'type' \"text\", \"json_object\" or "
                            f"\"json_schema\", got {json.dumps(fmt)[:80]}", param="response_format")
    spec = fmt.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) or not spec["name"]:
        raise ApiError(400, "'response_format.json_schema' must be an object with a non-empty string 'name' "
                            "and a 'schema'", param="response_format")
    schema = spec.get("schema", {})
    if not isinstance(schema, dict):
        raise ApiError(400, "'response_format.json_schema.schema' must be a JSON Schema object, got "
                            f"{json.dumps(schema)[:80]}", param="response_format")
    return schema


class Grammars:
    """A server's side of constraints: llguidance's view of the tokenizer (built at the first
    constrained request: ~35 ms for 4,096 tokens) and how tokens map to the lm head's rows."""

    def __init__(self, tokenizer, lm_rows: Optional[np.ndarray] = None):
        self.tokenizer, self.lm_rows = tokenizer, lm_rows
        self._ll = None
        self._lock = threading.Lock()
        self._row_bits: Optional[np.ndarray] = None
        self._compiled: dict = {}  # grammar -> its matcher at the start (the event loop's thread only)

    def _setup(self):
        with self._lock:
            if self._ll is None:
                llg = _llguidance()
                tok = llg.LLTokenizer(self.tokenizer.hf.to_str(), n_vocab=self.tokenizer.vocab_size,
                                      eos_token=sorted(self.tokenizer.stop_ids) or None)
                self.words, self._ll = (tok.vocab_size + 31) // 32, (llg, tok)
        return self._ll

    def row_bits(self) -> Optional[np.ndarray]:
        """Each of a slimmed lm head's rows' index into the unpacked mask (of ``words`` +
        1 words): its token's bit, or for a token past the tokenizer's a bit that is always 0.
        None when row i is token i (no gather)."""
        if self.lm_rows is None:
            return None
        if self._row_bits is None:
            ids = np.asarray(self.lm_rows, np.int64)
            self._row_bits = np.where(ids < self._ll[1].vocab_size, ids, 32 * self.words).astype(np.intp)
        return self._row_bits

    def constraint(self, grammar: str, param: str = "response_format") -> "Constraint":
        """A new sequence's constraint; ApiError 400 if llguidance cannot compile ``grammar``."""
        matcher = self._compiled.pop(grammar, None)  # a schema seen lately: copied, not compiled again
        if matcher is None:
            llg, tok = self._setup()
            matcher = llg.LLMatcher(tok, grammar, log_level=0)
            if matcher.is_error():
                raise ApiError(400, f"'{param}': the schema cannot be used: {matcher.get_error()}", param=param)
        self._compiled[grammar] = matcher  # the most recent last
        while len(self._compiled) > COMPILED:
            del self._compiled[next(iter(self._compiled))]
        return Constraint(self, matcher.deep_copy())


class Constraint:
    """One sequence's grammar state: ``mask`` the logits of its next token, ``advance`` with each
    decided token; ``done`` once the grammar takes no more tokens."""

    def __init__(self, grammars: Grammars, matcher):
        self.grammars, self.matcher = grammars, matcher
        self.bits = np.zeros(grammars.words + 1, np.int32)  # the mask, and a 0 word for rows past it

    def allowed(self, rows: int) -> np.ndarray:
        """Which of the lm head's first ``rows`` rows the grammar allows next (bool); shorter than
        ``rows`` when a padded lm head has rows past the tokenizer's tokens (never allowed)."""
        g = self.grammars
        self.matcher.unsafe_compute_mask_ptr(self.bits.ctypes.data, 4 * g.words)
        if self.matcher.is_error():
            raise RuntimeError(f"structured output: {self.matcher.get_error()}")
        bits = np.unpackbits(self.bits.view(np.uint8), bitorder="little").view(bool)
        index = g.row_bits()
        return bits[index] if index is not None else bits[:rows]

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """``logits`` (one per lm head row) with the rows the grammar forbids at -inf."""
        return self._masked(self.allowed(len(logits)), logits)

    @staticmethod
    def _masked(allowed: np.ndarray, logits: np.ndarray) -> np.ndarray:
        if len(allowed) == len(logits):
            return np.where(allowed, logits, np.float32(-np.inf))
        out = np.full(len(logits), -np.inf, np.float32)
        out[:len(allowed)] = np.where(allowed, logits[:len(allowed)], np.float32(-np.inf))
        return out

    def sample(self, sampler, logits: np.ndarray, masked: bool) -> tuple:
        """(row, logits) of the next token: ``sampler`` run on the allowed rows' logits alone (the
        distribution of the masked row: forbidden rows have probability 0 and do not move top-k,
        top-p or argmax; the draw walks the same cumulative sums), a forced token taken as it is.
        The logits returned are the masked row if ``masked`` (for logprobs), else ``logits``."""
        allowed = self.allowed(len(logits))
        rows = np.flatnonzero(allowed)
        if not len(rows):
            raise RuntimeError("structured output: the grammar's next token is not among the rows of this "
                               "model's slimmed lm head")
        row = int(rows[0]) if len(rows) == 1 else int(rows[sampler(logits[rows], ())])
        return row, (self._masked(allowed, logits) if masked else logits)

    def advance(self, token: int) -> bool:
        """False if ``token`` is off the grammar (the matcher is then in error)."""
        return self.matcher.consume_token(token)

    @property
    def done(self) -> bool:
        return self.matcher.is_stopped()
