"""Prompt prefixes computed once: the KV rows of a prompt's leading positions, kept across
requests and turns of a conversation, so that a prompt that starts as an earlier one did prefills
only what follows.

Exactness. A position's keys and values depend on the tokens up to it and on the path that
computed them: the prefill path (GEMM rows equal to the one-row GEMV, attention whose key blocks
sit at absolute positions, so a row's sums do not depend on where the prompt was cut into chunks)
or the decode path (another attention kernel: other sums). Only rows a prefill computed are reused
(``KVCache.prefilled``), and a prefill never runs a one-row chunk (that row would take the decode
attention): a prompt whose prefix is reused gets the logits, tokens and KV rows bit for bit that
prefilling all of it gives. A generated reply's rows come from decode steps: the next turn's prompt
prefills them again (then they are kept).

The store (``PrefixCache``) holds fixed-size blocks of rows keyed by a hash chain of the tokens
(a block's key: the previous block's key and its own tokens), one copy of each block however many
prompts share it, least recently used blocks evicted first beyond a budget of bytes. A sequence's
own cache is contiguous (the attention kernels read it so): reused blocks are copied into it, a
memory copy per block against a prefill's work per token. Sliding-window layers keep a ring of
their window: a block keeps such a layer's rows only while they were still in the ring, and a
prefix is reused only up to where every ring can be refilled with the window it needs.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from .kv_cache import KVCache

PREFILL_CHUNK = 512  # prompt tokens per forward: bounds the attention scores' memory


# A model with recurrent state resumes a prompt only where a state snapshot was kept: at the end
# of a prefill's forward that falls on a multiple of this (the delta rule's chunk, so that a cut
# there changes no bits: docs/semantics.md 7). A prefill of such a model also cuts at the last
# such multiple before its end, where a next turn of the conversation will resume.
STATE_ALIGN = 64


def prefill_chunks(start: int, end: int, state: bool = False) -> list:
    """The [first, last) chunks a prefill of positions start..end runs: cut at multiples of
    PREFILL_CHUNK (where a prefill from 0 cuts), a one-row last chunk joined to the chunk before
    it (one row would take the decode path's attention, whose sums differ). ``state`` (a model
    with recurrent state): cut too at the last multiple of STATE_ALIGN that leaves >= 2 rows."""
    cuts = [start] + list(range((start // PREFILL_CHUNK + 1) * PREFILL_CHUNK, end, PREFILL_CHUNK)) + [end]
    if len(cuts) > 2 and cuts[-1] - cuts[-2] == 1:
        del cuts[-2]
    last = (end - 2) // STATE_ALIGN * STATE_ALIGN
    if state and cuts[-2] < last:
        cuts.insert(-1, last)
    return list(zip(cuts[:-1], cuts[1:]))


def own_prefix(cache: KVCache, ids: Sequence[int]) -> int:
    """How many leading positions of ``ids`` the cache itself holds as a prefill computed them, and
    can resume after: at most len(ids) - 2 (the rest is a prefill of >= 2 rows), 0 when its rings
    hold positions past that prefix (they overwrote slots the prefix's window needs)."""
    limit = min(len(ids) - 2, cache.prefilled)
    common = 0
    for a, b in zip(cache.ids[:max(limit, 0)], ids):
        if a != b:
            break
        common += 1
    if any(cache.windows) and cache.length > common + 1:
        return 0
    if cache.has_state and common != cache.length:  # states: at the cache's end, or its snapshot
        return cache.snapshot[0] if cache.snapshot is not None and cache.snapshot[0] <= common else 0
    return common


@dataclass
class _Block:
    """Rows of ``len(tokens)`` positions (fewer than the store's block: a prompt's tail, a leaf
    of the chain). A ring layer keeps the rows its ring still held: from offset ``lo[i]`` on."""
    tokens: tuple
    k: list  # per layer: [kv_heads, len(tokens) - lo[i], head_dim] (None: no row left)
    v: list
    lo: list
    nbytes: int
    states: Optional[list] = None  # a model with recurrent state: the states at the block's end


class PrefixCache:
    """Blocks of ``block`` positions' KV rows, at most ``budget_mb`` MB of them (0: none kept;
    then only a cache's own prefix is reused). Used by one thread (the scheduler's, or the
    model's caller)."""

    def __init__(self, budget_mb: float = 0, block: int = 32):
        if isinstance(budget_mb, bool) or not isinstance(budget_mb, (int, float)) or not budget_mb >= 0:
            raise ValueError(f"the prefix cache's budget must be a number of MB >= 0, got {budget_mb!r}")
        if isinstance(block, bool) or not isinstance(block, int) or block < 1:
            raise ValueError(f"block must be an int >= 1, got {block!r}")
        self.budget, self.block = int(budget_mb * 2**20), block
        self._blocks: OrderedDict = OrderedDict()  # key -> _Block, least recently used first
        self.nbytes = 0
        self._shape = None  # of the caches it serves (set by the first)
        self.lookups = self.hits = self.prompt_tokens = self.cached_tokens = self.evicted_blocks = 0
        self.warmed_tokens = 0  # prefilled by warm

    @property
    def blocks(self) -> int:
        return len(self._blocks)

    @property
    def hit_rate(self) -> float:
        """The share of prompt tokens whose rows came from the cache."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def figures(self) -> dict:
        return {"budget_bytes": self.budget, "bytes": self.nbytes, "blocks": self.blocks, "lookups": self.lookups,
                "hits": self.hits, "prompt_tokens": self.prompt_tokens, "cached_tokens": self.cached_tokens,
                "hit_rate": round(self.hit_rate, 4), "evicted_blocks": self.evicted_blocks,
                "warmed_tokens": self.warmed_tokens}

    @staticmethod
    def _key(parent: bytes, tokens: Sequence[int]) -> bytes:
        return hashlib.blake2b(parent + np.asarray(tokens, np.int64).tobytes(), digest_size=16).digest()

    def _spans(self, count: int) -> list:
        """[first, last) of the blocks of ``count`` positions: whole blocks, then the tail."""
        return [(a, min(a + self.block, count)) for a in range(0, count, self.block)]

    def _check(self, cache: KVCache) -> None:
        """One store serves the caches of one model: the same layers, heads, width and type."""
        shape = tuple((cache.k[i].shape[0], cache.k[i].shape[2], cache.k[i].dtype.str)
                      for i in range(len(cache.windows)))
        if self._shape is None:
            self._shape = shape
        elif shape != self._shape:
            raise ValueError("this prefix cache holds another model's rows (layers, heads, head size "
                             "or element type differ)")

    # -- reuse ------------------------------------------------------------------------------------
    def restore(self, cache: KVCache, ids: Sequence[int], count: bool = True) -> int:
        """Make ``cache`` hold the longest prefix of ``ids`` that it, or this store, has (leaving
        >= 2 positions to prefill); returns that prefix's length, where the prefill resumes.
        ``count``: in the figures (lookups, hits, tokens)."""
        ids = [int(i) for i in ids]
        own = own_prefix(cache, ids)
        found = self._longest(cache, ids, own)
        start = own
        if found:
            start = found[-1][2]
            self._copy_in(cache, found, own)
            if cache.has_state:  # the states where the rows end
                for st, kept in zip(cache.states, found[-1][0].states):
                    if st is not None:
                        for a, b in zip(st, kept):
                            a[:] = b
        elif cache.has_state and 0 < start < cache.length:  # at the snapshot (own_prefix)
            cache.resume_at_snapshot()
        if start == 0 and cache.has_state:
            cache.reset_states()
        cache.length, cache.ids, cache.prefilled = start, ids[:start], start
        cache.forget_saved()
        if count:
            self.lookups += 1
            self.hits += start > 0
            self.prompt_tokens += len(ids)
            self.cached_tokens += start
        return start

    def warm(self, model, ids: Sequence[int]) -> int:
        """Prefill ``ids`` for this store only (in a cache of their own, dropped after): what a
        conversation's next turn will start with, its reply rendered as the chat template renders
        it, so that the turn prefills only what is new (the reply's rows came from decode steps:
        not reusable). Returns the positions prefilled."""
        if not self.budget or len(ids) < 2:
            return 0
        cache = model.new_cache(len(ids))
        start = self.restore(cache, ids, count=False)
        model.prefill_into(cache, ids, start, self)
        self.warmed_tokens += len(ids) - start
        return len(ids) - start

    def _longest(self, cache: KVCache, ids: list, beyond: int) -> list:
        """The stored blocks [(block, first, last)] of the longest prefix of ``ids`` longer than
        ``beyond`` and at most len(ids) - 2 long whose rows can fill ``cache`` (every ring's window
        before its end present); [] if none."""
        self._check(cache)
        limit = len(ids) - 2
        if not self._blocks or limit <= beyond:
            return []
        chain, parent = [], b""
        for a in range(0, limit - self.block + 1, self.block):  # whole blocks
            key = self._key(parent, ids[a:a + self.block])
            b = self._blocks.get(key)
            if b is None or b.tokens != tuple(ids[a:a + self.block]):
                break
            chain.append((key, b, a, a + self.block))
            parent = key
        a = len(chain) * self.block
        for m in range(min(self.block - 1, limit - a), 0, -1):  # a tail after them
            tail_key = self._key(parent, ids[a:a + m])
            b = self._blocks.get(tail_key)
            if b is not None and b.tokens == tuple(ids[a:a + m]):
                chain.append((tail_key, b, a, a + m))
                break
        while chain and chain[-1][3] > beyond:
            end = chain[-1][3]
            if cache.has_state and chain[-1][1].states is None:  # no state kept there
                chain.pop()
                continue
            if all(b.lo[i] <= max(0, need - first)
                   for i, need in enumerate(self._needed(cache, beyond, end))
                   for _, b, first, last in chain if last > need):
                for key, *_ in reversed(chain):  # the chain's head most recent: leaves are evicted first
                    self._blocks.move_to_end(key)
                return [(b, first, last) for _, b, first, last in chain]
            chain.pop()
        return []

    @staticmethod
    def _needed(cache: KVCache, own: int, end: int) -> list:
        """Per layer, the first position whose rows the cache needs to resume at ``end``: a ring,
        its window's; else the first it lacks (it holds ``own``)."""
        return [max(0, end - w + 1) if w else own for w in cache.windows]

    def _copy_in(self, cache: KVCache, found: list, own: int) -> None:
        end = found[-1][2]
        for i, need in enumerate(self._needed(cache, own, end)):
            w = cache.windows[i]
            if not cache.k[i].shape[1] or cache.kv_layers[i] != i:  # a recurrent layer, or another's rows
                continue
            for b, first, last in found:
                lo = max(need, first)
                if lo >= last:
                    continue
                pos = np.arange(lo, last)
                slots = pos % w if w else pos
                rows = slice(lo - first - b.lo[i], last - first - b.lo[i])
                cache.k[i][:, slots], cache.v[i][:, slots] = b.k[i][:, rows], b.v[i][:, rows]

    # -- keeping ------------------------------------------------------------------------------------
    def store(self, cache: KVCache) -> None:
        """Keep the rows ``cache`` holds as a prefill computed them: its whole blocks and its tail."""
        if not self.budget:
            return
        self._check(cache)
        count = min(cache.prefilled, cache.length)
        snapshot = cache.has_state and count == cache.length and count % STATE_ALIGN == 0 and count % self.block == 0
        keys, key = [], b""
        for first, last in self._spans(count):
            key = self._key(key, cache.ids[first:last])
            keys.append(key)
            have = self._blocks.get(key)
            states = None
            if snapshot and last == count:  # the states at this block's end
                states = have.states if have is not None and have.states is not None else \
                    [None if st is None else [a.copy() for a in st] for st in cache.states]
            if have is not None and not any(have.lo) and (states is None or have.states is not None):
                continue
            k, v, lo = [], [], []
            for i, w in enumerate(cache.windows):
                held = min(max(0, cache.length - w - first), last - first) if w else 0  # rows a ring lost
                if not cache.k[i].shape[1]:  # a recurrent layer: no rows
                    k.append(None), v.append(None), lo.append(0)
                    continue
                j = cache.kv_layers[i]
                if j != i:  # a layer that holds another's rows: the same rows
                    k.append(k[j]), v.append(v[j]), lo.append(lo[j])
                    continue
                if have is not None and have.lo[i] <= held:
                    k.append(have.k[i]), v.append(have.v[i]), lo.append(have.lo[i])
                    continue
                pos = np.arange(first + held, last)
                slots = pos % w if w else pos
                k.append(np.ascontiguousarray(cache.k[i][:, slots]) if len(pos) else None)
                v.append(np.ascontiguousarray(cache.v[i][:, slots]) if len(pos) else None)
                lo.append(held)
            if states is None and have is not None:
                states = have.states
            nbytes = sum(a.nbytes for a in {id(a): a for a in k + v if a is not None}.values())
            nbytes += sum(a.nbytes for st in states or () if st is not None for a in st)
            self.nbytes += nbytes - (have.nbytes if have is not None else 0)
            self._blocks[key] = _Block(tuple(cache.ids[first:last]), k, v, lo, nbytes, states)
        for key in reversed(keys):
            self._blocks.move_to_end(key)
        while self.nbytes > self.budget:  # the least recently used first: this chain's last
            _, b = self._blocks.popitem(last=False)
            self.nbytes -= b.nbytes
            self.evicted_blocks += 1
