"""What carries a sequence's tokens to its HTTP response: the text they decode to, cut at stop
strings, and the hand-over from the scheduler's thread to the event loop."""

from __future__ import annotations

import asyncio
import threading

from ..runtime.tokenizer import StreamDecoder, Tokenizer


class TextStream:
    """Generated token ids to text pieces, cut before the first stop string (text that could be
    the start of one is held back until it is known not to be)."""

    def __init__(self, tokenizer: Tokenizer, stop: list):
        self.decoder, self.stop = StreamDecoder(tokenizer), stop
        self.pending = ""
        self.stopped = False

    def push(self, token: int) -> str:
        self.pending += self.decoder.push(token)
        return self._release(hold_back=True)

    def flush(self) -> str:
        """The rest, at the end (an incomplete character included, as decode gives it)."""
        self.pending += self.decoder.flush()
        return self._release(hold_back=False)

    def _release(self, hold_back: bool) -> str:
        cuts = [i for i in (self.pending.find(s) for s in self.stop) if i >= 0]
        if cuts:
            self.stopped = True
            out, self.pending = self.pending[:min(cuts)], ""
            return out
        hold = max((k for s in self.stop for k in range(1, len(s)) if self.pending.endswith(s[:k])), default=0)
        hold = hold if hold_back else 0
        out, self.pending = self.pending[:len(self.pending) - hold], self.pending[len(self.pending) - hold:]
        return out


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
