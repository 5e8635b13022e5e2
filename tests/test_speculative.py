"""Speculative decoding: greedy output equal to plain decoding for every drafter, ISA level,
thread count and attention kind (sliding-window rings rolled back); speculative rejection sampling
keeps the model's distribution (chi-square); the KV cache after a run equals plain decoding's;
bad options refused."""

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")
pytest.importorskip("torch")
pytest.importorskip("transformers")

import qlinear  # noqa: E402
from qlinear import llm  # noqa: E402
from qlinear.llm.runtime.drafters import NgramDrafter  # noqa: E402
from qlinear.llm.runtime.generation import Sampler, Sampling  # noqa: E402
from qlinear.llm.runtime.draft_length import DraftLength  # noqa: E402
from qlinear.llm.runtime.speculative import Speculation, judge  # noqa: E402
from qlinear.llm.synthetic import make_checkpoint  # noqa: E402

# A prompt that repeats itself: an n-gram drafter finds continuations in it.
PROMPT = "def add(a, b):\n    return a + b\n\n\ndef add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a"
TRAINED = Path(__file__).resolve().parents[1] / "models" / "stdlib-qwen2"
ARCHS = {"qwen2": {}, "mistral": {"sliding_window": 8}, "gemma2": {"sliding_window": 8}}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("spec")
    return {arch: make_checkpoint(root / arch, arch=arch, shape="tiny", seed=3, **extra)
            for arch, extra in ARCHS.items()}


def plain_and_speculative(model, ids, n, **kw):
    plain = model.generate_ids(ids, n)
    fast = model.generate_ids(ids, n, **kw)
    return plain, fast, model.stats


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("arch", list(ARCHS))
def test_greedy_ngram_equals_plain_decoding(checkpoints, arch, threads, isa):
    qlinear.set_num_threads(threads)
    model = llm.load(checkpoints[arch], bits=4, group_size=32, max_context=96, progress=False)
    ids = model.tokenizer.encode(PROMPT)
    for max_draft in (1, 3, 8, 16):  # 8 and 16: blocks longer than the window of 8
        plain, fast, st = plain_and_speculative(model, ids, 40, speculative=Speculation("ngram", max_draft=max_draft,
                                                                                         adaptive=False))
        assert fast == plain
        assert st.draft_tokens > 0 and st.decode_steps < len(plain)  # drafts were verified, some kept
    assert model._compiled_step() is not None  # the verification ran in the compiled step


@pytest.mark.parametrize("arch", ["qwen2", "mistral"])
def test_greedy_draft_model_equals_plain_decoding(checkpoints, arch, isa):
    """The draft is the same checkpoint at int8, the target at int4: many drafts are kept (an
    unrelated draft on random weights would see ~1 in 1000 kept)."""
    target = llm.load(checkpoints[arch], bits=4, group_size=32, max_context=96, progress=False)
    draft = llm.load(checkpoints[arch], bits=8, max_context=96, progress=False)
    ids = target.tokenizer.encode("import os\nimport sys\n")
    # every draft length (not adaptive: a draft model as large as the target never pays)
    plain, fast, st = plain_and_speculative(target, ids, 40, speculative=Speculation("draft", draft, adaptive=False))
    assert fast == plain
    assert st.accepted_tokens > 0.25 * st.draft_tokens > 0
    assert plain_and_speculative(target, ids, 40, speculative="draft", draft_model=draft)[1] == plain


def test_draft_model_runs_each_position_once_and_stays_exact(checkpoints):
    """The draft model prefills the prompt with the target's prefill and then runs only the
    positions its cache lacks (the text's tokens once, a rejected draft's once more); used on its
    own afterwards, it gives the tokens a fresh copy of it gives (its decode-step rows are not
    taken for a prefill's)."""
    target = llm.load(checkpoints["qwen2"], bits=4, group_size=32, max_context=96, progress=False)
    draft = llm.load(checkpoints["qwen2"], bits=8, max_context=96, progress=False)
    ids = target.tokenizer.encode(PROMPT)
    rows, forward = [], draft._forward
    draft._forward = lambda x, start, *a, **kw: rows.append(len(x)) or forward(x, start, *a, **kw)
    plain = target.generate_ids(ids, 40)
    assert target.generate_ids(ids, 40, speculative=Speculation("draft", draft, max_draft=4, adaptive=False)) == plain
    st = target.stats
    assert st.draft_tokens > st.accepted_tokens > 0
    assert rows[0] == len(ids) - 1  # the prompt, before any draft
    assert sum(rows) <= len(ids) + 1 + len(plain) + st.draft_tokens - st.accepted_tokens
    del draft._forward
    fresh = llm.load(checkpoints["qwen2"], bits=8, max_context=96, progress=False)
    again = ids + plain[:8]
    assert draft.generate_ids(again, 16) == fresh.generate_ids(again, 16)


def test_cache_after_speculation_equals_plain(checkpoints):
    """The KV rows a run leaves (rejected rows rolled back, ring slots restored) are plain
    decoding's, bit for bit."""
    for arch in ("qwen2", "gemma2"):
        model = llm.load(checkpoints[arch], bits=4, group_size=32, max_context=96, progress=False)
        ids = model.tokenizer.encode(PROMPT)
        model.generate_ids(ids, 30)
        plain = [np.array(k) for k in model.cache.k], model.cache.length
        model.reset()
        model.generate_ids(ids, 30, speculative=Speculation("ngram", max_draft=6, adaptive=False))
        assert model.cache.length == plain[1]
        n = plain[1]
        for i, (want, got) in enumerate(zip(plain[0], model.cache.k)):
            ring = model.cache.windows[i]
            rows = slice(None) if ring else slice(0, n)
            np.testing.assert_array_equal(np.asarray(got)[:, rows], want[:, rows])


def test_judge_keeps_the_target_distribution():
    """Speculative rejection sampling: drafts from q, kept or replaced, are distributed as p."""
    rng = np.random.default_rng(0)
    p, q = rng.dirichlet(np.ones(6)), rng.dirichlet(np.ones(6))
    sampler = Sampler(Sampling(temperature=1.0, seed=1))
    draws = 40000
    counts = {"model": np.zeros(6), "point": np.zeros(6)}
    for _ in range(draws):
        x = int(sampler.rng.choice(6, p=q))
        counts["model"][judge(p, q, x, None, sampler)[1]] += 1
        counts["point"][judge(p, None, 2, None, sampler)[1]] += 1  # an n-gram's draft: always token 2
    for c in counts.values():
        chi2 = float(((c - draws * p) ** 2 / (draws * p)).sum())
        assert chi2 < 20.5  # 5 degrees of freedom, p-value 0.001


def test_first_sampled_token_has_the_plain_distribution():
    """With temperature, the first token (judged against the prefill's logits: the prompt offers
    an n-gram draft) over many seeds: a chi-square test against the plain sampler's own
    distribution on the trained model's most likely tokens."""
    model = llm.load(TRAINED, bits=4, group_size=32, max_context=64, progress=False)
    model.tokenizer.stop_ids = set()
    ids = model.tokenizer.encode(PROMPT)
    probs = Sampler(Sampling(temperature=1.0)).distribution(model.prefill(ids), ids)
    top = np.argsort(-probs)[:8]
    runs = 1500
    counts = np.zeros(len(top) + 1)
    drafted = 0
    for seed in range(runs):
        t = model.generate_ids(ids, 1, temperature=1.0, seed=seed, speculative=Speculation("ngram", adaptive=False))[0]
        drafted += model.stats.draft_tokens
        hit = np.flatnonzero(top == t)
        counts[hit[0] if hit.size else -1] += 1
    assert drafted == runs  # every run judged a draft for its first token
    expected = runs * np.append(probs[top], 1 - probs[top].sum())
    assert expected.min() > 20  # the test has power on every cell
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 27.9  # 8 degrees of freedom, p-value 0.0005


def test_sampling_with_a_seed_is_reproducible(checkpoints):
    model = llm.load(checkpoints["qwen2"], bits=4, group_size=32, max_context=96, progress=False)
    draft = llm.load(checkpoints["qwen2"], bits=8, max_context=96, progress=False)
    ids = model.tokenizer.encode(PROMPT)
    for kw in (dict(speculative="ngram"), dict(speculative="draft", draft_model=draft)):
        runs = [model.generate_ids(ids, 24, temperature=0.8, top_p=0.9, seed=7, **kw) for _ in range(2)]
        assert runs[0] == runs[1] and len(runs[0]) > 0


def test_guarded_runs_fit_the_smallest_ring(checkpoints):
    """A run longer than a ring would write a slot twice: rollback could not restore it."""
    model = llm.load(checkpoints["mistral"], bits=4, max_context=64, progress=False)
    assert model.cache.max_run == 8
    model.cache.guard(0, 8)
    with pytest.raises(ValueError, match="exceeds the smallest sliding window"):
        model.cache.guard(0, 9)
    assert llm.load(checkpoints["qwen2"], bits=4, max_context=64, progress=False).cache.max_run == 64


def test_ngram_drafter_finds_the_longest_earlier_match():
    d = NgramDrafter(max_ngram=3, min_ngram=1)
    text = [5, 6, 7, 8, 1, 6, 7, 9, 2, 6, 7]
    draft, dists = d.propose(text, text, 3)
    assert draft == [9, 2, 6] and dists == [None] * 3  # "6 7" last continued by 9 (the latest)
    assert d.propose(text + [8], None, 2)[0] == [1, 6]  # "6 7 8" occurred once
    assert d.propose([1, 2, 3], None, 4) == ([], [])     # nothing repeats
    # a match near the end: its continuation runs into the draft itself (period 3)
    assert d.propose([4, 1, 2, 3, 1, 2, 3, 1, 2], None, 5)[0] == [3, 1, 2, 3, 1]
    assert d.propose([7, 7, 7], None, 4)[0] == [7, 7, 7, 7]


def test_draft_length_stops_drafting_when_it_does_not_pay():
    length = DraftLength(max_draft=8, adaptive=True, probe_every=1000)
    for _ in range(20):  # drafts rarely kept, a verification row costs as much as a step
        length.update(4, 0, 5, 5e-3, 0.0)
        length.update(0, 0, 1, 1e-3, 0.0)
    assert length.choose(8) == 0
    for _ in range(40):  # drafts kept, extra rows cheap: the longest draft
        length.update(8, 8, 9, 1.2e-3, 0.0)
    assert length.choose(8) == 8


def test_draft_length_measures_a_plain_step_first_and_weighs_drafting():
    length = DraftLength(max_draft=8, adaptive=True, probe_every=1000, costly_drafts=True)
    for seconds in (5e-3, 2e-3, 1e-3, 1e-3):  # the cost every length is weighed against; cold steps first
        assert length.choose(8) == 0
        length.update(0, 0, 1, seconds, 0.0)
    assert length.verify_s[1] == 1e-3
    assert length.choose(8) == 2  # the prior acceptance, extra rows guessed cheap: a short first draft
    for _ in range(30):  # half the drafts kept, but drafting a token costs as much as a step
        length.update(4, 2, 5, 1.2e-3, 4e-3)
    assert abs(length.alpha - 2 / 3) < 0.01  # two kept of three tried (the fourth never was)
    assert length.choose(8) == 0
    assert length.futile  # not even drafts all kept would pay: a draft token costs a step
    length.probe_every = length.probe_interval = 4
    probes = [i for i in range(200) if length.choose(8)]  # seldom: every 16 x probe_every steps
    assert len(probes) >= 2 and {b - a for a, b in zip(probes, probes[1:])} == {64}


def test_draft_length_probes_rarer_while_probes_do_not_pay():
    length = DraftLength(max_draft=8, adaptive=True, probe_every=4, costly_drafts=True)
    for _ in range(30):  # cheap extra rows and drafts, but nothing kept
        length.update(0, 0, 1, 1e-3, 0.0)
        length.update(4, 0, 5, 1.2e-3, 1e-5)
    assert length.choose(8) == 0 and not length.futile
    probes = [i for i in range(200) if length.choose(8)]
    assert len(probes) >= 3 and probes[2] - probes[1] > probes[1] - probes[0]


def test_draft_length_weighs_a_draft_step_timed_before_any_draft():
    """A draft model's step timed at the prefill: one dearer than a plain step never drafts
    (not even a first, short draft); a cheap one drafts once the plain step is measured."""
    for draft_step, drafts in ((2e-3, False), (1e-4, True)):
        length = DraftLength(max_draft=8, adaptive=True, probe_every=1000, costly_drafts=True)
        length.drafted(draft_step)
        for _ in range(DraftLength.WARM_UP):
            assert length.choose(8) == 0
            length.update(0, 0, 1, 1e-3, 0.0)
        assert (length.choose(8) > 0) == drafts


def test_bad_options(checkpoints, tmp_path):
    model = llm.load(checkpoints["qwen2"], bits=4, max_context=64, progress=False)
    ids = model.tokenizer.encode("x = 1")
    for kw, err, match in [
        (dict(speculative="lookahead"), ValueError, "speculative must be one of"),
        (dict(speculative="draft"), ValueError, "needs a draft_model"),
        (dict(speculative=Speculation), TypeError, "speculative must be"),
        (dict(speculative="ngram", draft_model=model), ValueError, "goes with speculative='draft'"),
        (dict(speculative="draft", draft_model=model), ValueError, "another model"),
    ]:
        with pytest.raises(err, match=match):
            model.generate_ids(ids, 4, **kw)
    for bad in (0, 33, 2.5, True):
        with pytest.raises(ValueError, match="max_draft"):
            Speculation("ngram", max_draft=bad)
    other = make_checkpoint(tmp_path / "other", shape="tiny", seed=1, vocab_size=512, tokenizer_vocab=512)
    with pytest.raises(ValueError, match="vocabulary"):
        model.generate_ids(ids, 4, speculative="draft", draft_model=llm.load(other, progress=False))


def test_widened_trained_model_computes_the_trained_function(tmp_path, monkeypatch):
    """bench/speculative.py's memory-wall target: the trained model grown (hidden, heads,
    intermediate, layers) with zero residual dimensions and silent layers predicts as it does."""
    from qlinear.llm import synthetic
    monkeypatch.setitem(synthetic.SHAPES, "wider", dict(hidden_size=384, intermediate_size=1000, num_hidden_layers=8,
                                                       num_attention_heads=6, num_key_value_heads=2, vocab_size=4096))
    wide = synthetic.widen_checkpoint(TRAINED, tmp_path / "wide", "wider")
    a = llm.load(TRAINED, bits=None, act="float", progress=False)
    b = llm.load(wide, bits=None, act="float", progress=False)
    assert b.config.hidden_size == 384 and b.config.num_layers == 8
    ids = a.tokenizer.encode(PROMPT * 3)
    la, lb = a.logits(ids), b.logits(ids)
    assert np.abs(la - lb).max() <= 1e-5 * np.abs(la).max()
    with pytest.raises(ValueError, match="keeps the key-value heads"):
        synthetic.widen_checkpoint(TRAINED, tmp_path / "bad", "qwen2.5-1.5b")
