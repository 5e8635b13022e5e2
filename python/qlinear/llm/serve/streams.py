"""What carries a sequence's tokens to its HTTP response: the text they decode to, cut at stop
strings, and the hand-over from the scheduler's thread to the event loop."""

from __future__ import annotations

import asyncio
import threading

from ..runtime.tokenizer import StreamDecoder, Tokenizer


class StopStrings:
    """Text cut before the first stop string; text that could be the start of one is held back
    until it is known not to be. ``matched``: the stop string it stopped at."""

    def __init__(self, stop: list):
        self.stop, self.pending, self.stopped, self.matched = stop, "", False, None

    def push(self, text: str, hold_back: bool = True) -> str:
        self.pending += text
        cuts = [(i, s) for i, s in ((self.pending.find(s), s) for s in self.stop) if i >= 0]
        if cuts:
            at, self.matched = min(cuts, key=lambda c: c[0])  # the earliest; of two there, the first listed
            self.stopped = True
            out, self.pending = self.pending[:at], ""
            return out
        hold = max((k for s in self.stop for k in range(1, len(s)) if self.pending.endswith(s[:k])), default=0)
        hold = hold if hold_back else 0
        out, self.pending = self.pending[:len(self.pending) - hold], self.pending[len(self.pending) - hold:]
        return out


class TextStream:
    """Generated token ids to text pieces, cut before the first stop string."""

    parsed = False  # (serve.replies.ReplyText: True)

    def __init__(self, tokenizer: Tokenizer, stop: list):
        self.decoder, self.cut = StreamDecoder(tokenizer), StopStrings(stop)

    @property
    def stopped(self) -> bool:
        return self.cut.stopped

    def push(self, token: int) -> str:
        return self.cut.push(self.decoder.push(token))

    def flush(self) -> str:
        """The rest, at the end (an incomplete character included, as decode gives it)."""
        return self.cut.push(self.decoder.flush(), hold_back=False)


class Mailbox:
    """Events from the scheduler's thread to the requests' queues on the event loop: a decode
    step's tokens of every sequence wake the loop once, not once per sequence."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop, self.lock = loop, threading.Lock()
        self.pending: list = []

    def post(self, queue: asyncio.Queue, item) -> None:
        with self.lock:
            self.pending.append((queue, item))
            if len(self.pending) > 1:  # a delivery is already scheduled
                return
        self.loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:
        with self.lock:
            items, self.pending = self.pending, []
        for queue, item in items:
            queue.put_nowait(item)
