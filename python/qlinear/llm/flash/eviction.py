"""Which expert held in the expert cache a newly needed one replaces (``experts.ExpertCache``):
"lru", the least recently used; "lfu", the one needed least often since load, ties to the most
recently used (in a cycle of more experts than slots, the one needed again last). Both in
O(log n) a choice: a decode token with random routing evicts ~70 experts, and a scan of a
216-slot cache for each cost 4 ms a token in Python."""

from __future__ import annotations

import heapq
from collections import OrderedDict
from typing import Callable, Optional


class EvictionOrder:
    def __init__(self, capacity: int):
        self.uses: dict = {}   # key -> times a block needed it (held or not)
        self.recent: "OrderedDict[tuple, int]" = OrderedDict()   # key held -> stamp of its last use, least recent first
        self._heap: list = []   # (uses, -stamp, key) of held keys; entries whose stamp is not the key's are stale
        self._stamp = 0
        self._capacity = capacity

    def need(self, key: tuple) -> None:
        self.uses[key] = self.uses.get(key, 0) + 1

    def touch(self, key: tuple) -> None:
        """``key``, held, just used (or just read)."""
        self._stamp += 1
        self.recent[key] = self._stamp
        self.recent.move_to_end(key)
        heapq.heappush(self._heap, (self.uses.get(key, 0), -self._stamp, key))
        if len(self._heap) > 4 * self._capacity + 64:   # drop the stale entries
            self._heap = [(self.uses.get(k, 0), -t, k) for k, t in self.recent.items()]
            heapq.heapify(self._heap)

    def forget(self, key: tuple) -> None:
        self.recent.pop(key, None)

    def victim(self, policy: str, pinned: Callable[[tuple], bool]) -> Optional[tuple]:
        """The key to evict among those held and not ``pinned`` (None: every one pinned); forgotten."""
        key = None
        if policy == "lru":
            key = next((k for k in self.recent if not pinned(k)), None)
        else:
            skipped = []
            while self._heap and key is None:
                entry = heapq.heappop(self._heap)
                if self.recent.get(entry[2]) != -entry[1]:
                    continue   # stale: used since, or evicted
                if pinned(entry[2]):
                    skipped.append(entry)
                else:
                    key = entry[2]
            for entry in skipped:
                heapq.heappush(self._heap, entry)
        if key is not None:
            self.forget(key)
        return key
