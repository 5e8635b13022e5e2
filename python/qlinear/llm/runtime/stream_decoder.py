"""Incremental decoding for streaming: token ids to text pieces, whole characters only."""

from __future__ import annotations


class StreamDecoder:
    """Turns a growing list of token ids into text pieces, holding back incomplete UTF-8. Each
    push decodes a window only (the tokens of the last piece and those after it: the text before
    them is complete), so a piece costs the same at any length of the text."""

    def __init__(self, tokenizer):  # a tokenizer.Tokenizer
        self.tok = tokenizer
        self.ids: list[int] = []
        self.start = 0  # the window: ids[start:]; ids[start:done] made the last piece
        self.done = 0

    def _new_text(self) -> tuple:
        seen = self.tok.decode(self.ids[self.start:self.done])
        text = self.tok.decode(self.ids[self.start:])
        return text[len(seen):], len(text) > len(seen)

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        piece, grew = self._new_text()
        if not grew or piece.endswith("\ufffd"):  # a multi-byte character is not complete yet
            return ""
        self.start, self.done = self.done, len(self.ids)
        return piece

    def flush(self) -> str:
        """The text held back (an incomplete character, as decode renders it), at the end."""
        piece, _ = self._new_text()
        self.start, self.done = self.done, len(self.ids)
        return piece
