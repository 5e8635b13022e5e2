"""The expert cache's eviction order (qlinear.llm.flash.eviction) against a scan of every held
expert: LRU the least recently used unpinned one, LFU the least needed unpinned one, ties to the
most recently used; over long random runs with pins, reads of keys not held and evictions."""

from collections import OrderedDict

import numpy as np
import pytest

from qlinear.llm.flash.eviction import EvictionOrder


def reference_victim(policy, recent, uses, pinned):
    free = [k for k in recent if not pinned(k)]   # least recent first
    if not free:
        return None
    if policy == "lru":
        return free[0]
    return min(reversed(free), key=lambda k: uses.get(k, 0))


@pytest.mark.parametrize("policy", ["lru", "lfu"])
@pytest.mark.parametrize("seed", range(4))
def test_victims_equal_a_full_scan(policy, seed):
    rng = np.random.default_rng(seed)
    slots, keys = 12, [(layer, e) for layer in range(3) for e in range(10)]
    order, recent, uses = EvictionOrder(slots), OrderedDict(), {}
    pins = set()
    chosen = 0
    for step in range(3000):
        key = keys[int(rng.integers(len(keys)))] if rng.random() < 0.7 else keys[int(rng.integers(5))]
        order.need(key)
        uses[key] = uses.get(key, 0) + 1
        if rng.random() < 0.2:   # a few held keys pinned, as a running block's experts are
            held = list(recent)
            pins = set(held[i] for i in rng.choice(len(held), min(len(held), 3), replace=False)) if held else set()
        if key in recent:
            recent.move_to_end(key)
            order.touch(key)
            continue
        if len(recent) >= slots:
            pinned = pins.__contains__
            want = reference_victim(policy, recent, uses, pinned)
            got = order.victim(policy, pinned)
            assert got == want, f"step {step}"
            if got is None:
                continue   # every held key pinned: not read
            del recent[got]
            chosen += 1
        recent[key] = True
        order.touch(key)
    assert chosen > 500


def test_forgotten_keys_are_never_chosen():
    order = EvictionOrder(4)
    for k in range(4):
        order.need(k)
        order.touch(k)
    order.forget(0)
    assert order.victim("lfu", lambda k: False) == 3   # all needed once: the most recent
    assert order.victim("lru", lambda k: False) == 1
    assert order.victim("lfu", lambda k: k == 2) is None
