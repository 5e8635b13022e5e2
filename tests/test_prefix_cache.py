"""The prefix cache (runtime.prefix_cache): a prompt that reuses a cached prefix gets the logits
and KV rows of prefilling all of it, bit for bit (quantized weights: every GEMM row is the one-row
GEMV, and prefill attention sums over key blocks at absolute positions), for full caches,
sliding-window rings and float16 caches; rows decode computed are never reused; the store stays
under its budget, least recently used blocks leaving first."""

import numpy as np
import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("transformers")

from qlinear import llm  # noqa: E402
from qlinear.llm import synthetic  # noqa: E402
from qlinear.llm.runtime import prefix_cache  # noqa: E402
from qlinear.llm.runtime.prefix_cache import PrefixCache, prefill_chunks  # noqa: E402

ARCHS = {"qwen2": {}, "mistral": {"sliding_window": 24}, "gemma3": {"sliding_window": 16}}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("prefix")
    return {arch: synthetic.make_checkpoint(root / arch, arch=arch, shape="tiny", seed=3, **kw)
            for arch, kw in ARCHS.items()}


def load(path, kv="float32", budget=0):
    model = llm.load(path, bits=4, max_context=400, progress=False, kv_cache=kv)
    model.prefix_cache = PrefixCache(budget, block=16)
    return model


def rows(model) -> list:
    """Every layer's keys and values of the positions the cache holds (rings: the window's)."""
    c = model.cache

    def held(i):
        w = c.windows[i]
        return np.arange(c.length) if not w else np.arange(max(0, c.length - w), c.length) % w
    return [np.array(a[i][:, held(i)]) for a in (c.k, c.v) for i in range(model.config.num_layers)]


def fresh(path, ids, kv):
    """The reference: the prompt prefilled from an empty cache."""
    model = load(path, kv)
    return model.prefill(ids), rows(model)


def prompt(seed, n, vocab):
    return [int(t) for t in np.random.default_rng(seed).integers(3, vocab, n)]


def test_prefill_chunks_cut_where_a_prefill_from_zero_cuts(monkeypatch):
    monkeypatch.setattr(prefix_cache, "PREFILL_CHUNK", 8)
    assert prefill_chunks(0, 20) == [(0, 8), (8, 16), (16, 20)]
    assert prefill_chunks(5, 20) == [(5, 8), (8, 16), (16, 20)]
    assert prefill_chunks(0, 17) == [(0, 8), (8, 17)]  # no one-row chunk
    assert prefill_chunks(3, 9) == [(3, 9)]
    assert prefill_chunks(0, 1) == [(0, 1)]  # a one-token prompt is one row in every run


@pytest.mark.parametrize("kv", ["float32", "float16"])
@pytest.mark.parametrize("arch", list(ARCHS))
def test_reused_prefix_gives_the_bits_of_a_full_prefill(checkpoints, arch, kv, monkeypatch):
    # chunks cut inside the prompts, and no longer than the rings (which then hold every
    # chunk's rows when the store keeps them)
    monkeypatch.setattr(prefix_cache, "PREFILL_CHUNK", 16)
    path = checkpoints[arch]
    model = load(path, kv, budget=64)
    vocab = model.config.vocab_size
    first = prompt(1, 150, vocab)
    model.prefill(first)
    assert model.prefix_cache.blocks == -(-150 // 16)  # whole blocks and the tail
    for n_shared, n_more in ((150, 30), (97, 60), (33, 2), (16, 5)):
        ids = first[:n_shared] + prompt(n_shared + n_more, n_more, vocab)
        model.reset()  # the model's own cache forgets: the prefix comes from the store
        logits = model.prefill(ids)
        assert model.stats.reused_tokens > 0
        assert model.stats.reused_tokens <= min(n_shared, len(ids) - 2)
        want_logits, want_rows = fresh(path, ids, kv)
        np.testing.assert_array_equal(logits, want_logits)
        for got, want in zip(rows(model), want_rows):
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("budget", [0, 64])
@pytest.mark.parametrize("arch", ["qwen2", "gemma3"])
def test_a_conversation_reuses_prefilled_rows_only(checkpoints, arch, budget):
    """Turn by turn on one cache: the history's prefilled rows are reused (from the model's own
    cache; a ring's, whose window the reply overwrote, from the store), the reply's (decode
    computed them) are prefilled again; each turn's logits are those of a fresh prefill."""
    path = checkpoints[arch]
    model = load(path, budget=budget)
    vocab = model.config.vocab_size
    history = prompt(7, 60, vocab)
    logits = model.prefill(history)
    for turn in range(3):
        start, reply = model.cache.length, []
        token = int(np.argmax(logits))
        for _ in range(5):  # decode a reply into the same cache
            reply.append(token)
            token = int(np.argmax(model._forward([token], model.cache.length)[0]))
        assert model.cache.length == start + 5 and model.cache.prefilled == start
        prev, history = len(history), history + reply + prompt(turn, 20, vocab)
        logits = model.prefill(history)
        rings = any(model.cache.windows)
        assert model.stats.reused_tokens == (0 if rings and not budget else prev)
        np.testing.assert_array_equal(logits, fresh(path, history, "float32")[0])


def test_store_keeps_under_its_budget_least_recent_first(checkpoints):
    model = load(checkpoints["qwen2"], budget=0.05)  # 52 KB: a few 16-token blocks of this model
    vocab = model.config.vocab_size
    one_block = None
    prompts = [prompt(s, 100, vocab) for s in range(4)]
    for ids in prompts:
        model.reset()
        model.prefill(ids)
        store = model.prefix_cache
        one_block = one_block or store.nbytes // max(store.blocks, 1)
        assert store.nbytes <= store.budget
    assert store.evicted_blocks > 0
    model.reset()
    model.prefill(prompts[-1] + [5, 6, 7])  # the newest prompt's head is still there
    assert model.stats.reused_tokens >= 16
    model.reset()
    model.prefill(prompts[0] + [5, 6, 7])  # the oldest was evicted
    assert model.stats.reused_tokens == 0


def test_bad_budgets_and_other_models_rows_are_refused(checkpoints):
    for bad in (-1, "1", True, float("nan")):
        with pytest.raises(ValueError, match="budget"):
            PrefixCache(bad)
    with pytest.raises(ValueError, match="block"):
        PrefixCache(1, block=0)
    store = PrefixCache(16, block=16)
    a, b = load(checkpoints["qwen2"]), load(checkpoints["qwen2"], kv="float16")
    a.prefix_cache = b.prefix_cache = store
    a.prefill(prompt(0, 40, a.config.vocab_size))
    with pytest.raises(ValueError, match="another model"):
        b.prefill(prompt(0, 40, b.config.vocab_size))


def test_rings_and_full_caches_share_a_store(checkpoints, monkeypatch):
    """The server sizes each sequence's cache by its prompt and max_tokens: a sliding layer is a
    ring in some caches and holds every position in others. A store's blocks serve both, each
    only with the rows it needs (a full cache every row, a ring its window)."""
    monkeypatch.setattr(prefix_cache, "PREFILL_CHUNK", 16)  # a chunk's rows all in the ring after it
    model = load(checkpoints["mistral"])  # window 24
    store, vocab = PrefixCache(64, block=8), model.config.vocab_size
    long, short = prompt(1, 100, vocab), prompt(1, 18, vocab) + [7, 8]
    ring, full = model.new_cache(200), model.new_cache(24)
    assert ring.windows[0] == 24 and full.windows[0] == 0
    model.prefill_into(ring, long, store.restore(ring, long), store)  # chunk by chunk: every row kept
    assert store.restore(full, short) == 16  # whole blocks (the long prompt's tail is elsewhere)
    want = fresh(checkpoints["mistral"], short, "float32")[0]
    np.testing.assert_array_equal(model.prefill_into(full, short, 16)[0], want)

    store = PrefixCache(64, block=8)
    model.prefill_into(ring, long, store.restore(ring, long))  # kept after the prefill: the ring's window only
    store.store(ring)
    assert store.restore(model.new_cache(24), short) == 0  # a full cache needs rows the ring had lost
    assert store.restore(model.new_cache(200), long[:90] + [7, 8]) == 0  # 65..75 were lost
    assert store.restore(model.new_cache(200), long + [7, 8]) == 100  # a ring needs its window only
