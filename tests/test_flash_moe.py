"""memory="flash" for routed experts: experts read from the model file into an expert cache
(qlinear.llm.flash.experts)."""

import os
import shutil

import numpy as np
import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("transformers")

from qlinear import llm  # noqa: E402
from qlinear.llm.flash.loader import load_flash  # noqa: E402
from qlinear.llm.flash.plan import PROCESS_RESERVE  # noqa: E402
from qlinear.llm.options import Options  # noqa: E402
from qlinear.llm.synthetic import make_checkpoint  # noqa: E402

IDS = list(range(5, 45))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("flash_moe")
    out = {}
    for arch in ("qwen3_moe", "olmoe", "qwen2_moe", "mixtral"):
        ck = make_checkpoint(d / f"{arch}-ck", arch=arch, shape="tiny", num_hidden_layers=3, norm_noise=0.1)
        out[arch] = llm.convert(ck, d / f"{arch}-q4", bits=4, group_size=32, symmetric=True, progress=False)
    return out


def flash(d, slots=None, budget=None, prefetch="none", policy="lfu"):
    m = load_flash(d, Options(memory="flash").check(), 256, budget, expert_slots=slots)
    m.flash.experts.prefetch, m.flash.experts.policy = prefetch, policy
    return m


@pytest.mark.parametrize("arch", ["qwen3_moe", "olmoe", "qwen2_moe", "mixtral"])
@pytest.mark.parametrize("slots, prefetch, policy", [(None, "none", "lfu"), (2, "router", "lfu"), (2, "none", "lru"),
                                                     (7, "router", "lru"), (5, "none", "lfu"), (1, "router", "lru")])
def test_flash_moe_logits_equal_in_memory_bit_for_bit(models, arch, slots, prefetch, policy):
    """All experts held, one layer's top-k only (2 slots: fewer than a token's 3 x 2 experts), one
    slot (fewer than a layer's 2: experts read in turn, a prefetch holding the slot) and in between;
    with and without prefetch: the same logits and tokens as memory='low'."""
    ref = llm.load(models[arch], progress=False, max_context=256)
    want, want_gen = ref.logits(IDS), ref.generate_ids(IDS[:6], 10)
    with flash(models[arch], slots, prefetch=prefetch, policy=policy) as m:
        assert m.info["memory"] == "flash" and m.info["flash_experts"] and not m.compiled_decode
        np.testing.assert_array_equal(m.logits(IDS), want)
        m.reset()
        assert m.generate_ids(IDS[:6], 10) == want_gen
        m.flash.experts.drain()   # the last token's prefetches may still be read
        st = m.flash.stats
        assert st["hits"] + st["misses"] > 0 and st["bytes"] == m.flash.bytes_read
        assert st["bytes"] == (st["misses"] + st["prefetched"]) * st["expert_bytes"]
        if slots is None:   # every expert held: each read at most once
            assert st["misses"] + st["prefetched"] <= st["experts"]
        if prefetch == "none":
            assert st["prefetched"] == 0


def test_hit_rate_grows_with_the_cache_and_decode_reads_only_misses(models):
    d = models["qwen3_moe"]
    rates = []
    for slots in (2, 6, 24):   # 3 layers x 8 experts = 24: all held
        with flash(d, slots, prefetch="none", policy="lru") as m:
            m.logits(IDS)   # 40 rows: every expert of every layer chosen by some row
            before = dict(m.flash.stats)
            assert before["misses"] == 24 or slots < 24
            m.generate_ids(IDS[:6] + [7] * 3, 12)
            after = m.flash.stats
            lookups = (after["hits"] - before["hits"]) + (after["misses"] - before["misses"])
            rates.append((after["hits"] - before["hits"]) / lookups)
            assert after["bytes"] - before["bytes"] == (after["misses"] - before["misses"]) * after["expert_bytes"]
    assert rates[0] <= rates[1] <= rates[2] and rates[2] == 1.0   # all held and read once: only hits
    assert rates[0] < 1.0


def test_budget_sizes_the_cache_and_too_small_a_budget_is_refused(models):
    d = models["qwen3_moe"]
    with flash(d) as m:
        xb = m.flash.files.expert_bytes   # all but the slots: resident, KV cache, staging and reader buffers
        resident = m.flash.plan.total - m.info["flash_expert_slots"] * xb
    mb = lambda n: n / 2**20  # noqa: E731
    with flash(d, budget=mb(resident + PROCESS_RESERVE + 5 * xb + xb // 2)) as m:
        assert m.info["flash_expert_slots"] == 5
    with pytest.raises(ValueError, match=r"too small .* 2 expert slots .*experts_per_token=2"):
        flash(d, budget=mb(resident + PROCESS_RESERVE + 1 * xb))
    with pytest.raises(ValueError, match="memory_budget_mb must be a positive number"):
        flash(d, budget=-1)
    with pytest.raises(ValueError, match="expert_slots must be an int >= 1"):
        flash(d, slots=0)


def test_reader_threads_and_their_buffers_are_planned(models):
    """Experts are read by EXPERT_READERS threads (or reader_threads), past the page cache where
    the file system allows, each thread's buffer of one read counted in the plan."""
    from qlinear.llm.flash.experts import EXPERT_READERS
    from qlinear.llm.flash.reader import DIRECT_ALIGN

    d = models["qwen3_moe"]
    with flash(d, slots=3) as m:
        reader, plan12 = m.flash.experts.reader, m.flash.plan
        assert reader.plan.threads == EXPERT_READERS and reader.plan.direct and reader.alive_threads == EXPERT_READERS
        np.testing.assert_array_equal(m.logits([5, 6, 7]), llm.load(d, progress=False).logits([5, 6, 7]))
    with llm.load(d, memory="flash", reader_threads=1, progress=False, max_context=256) as m:
        assert m.flash.experts.reader.alive_threads == 1
        per_reader = m.flash.files.max_read + 2 * DIRECT_ALIGN
        assert plan12.ffn_buffers - m.flash.plan.ffn_buffers == \
            (EXPERT_READERS - 1) * per_reader + (3 - m.info["flash_expert_slots"]) * m.flash.files.expert_bytes
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="reader threads"):
            llm.load(d, memory="flash", reader_threads=bad, progress=False)


def test_truncated_file_is_refused(models, tmp_path):
    src = models["qwen3_moe"]
    bad = tmp_path / "trunc"
    shutil.copytree(src, bad)
    f = bad / "model.qlinear"
    with open(f, "r+b") as fh:
        fh.truncate(os.path.getsize(f) - 4096)
    with pytest.raises(ValueError, match="truncated|short|size|end"):
        m = llm.load(bad, memory="flash", progress=False)
        m.logits(IDS)


def test_file_changed_while_running_is_named_and_the_cache_recovers(models, tmp_path):
    """A read that fails (the file changed under the model) raises; the slot is not left pinned."""
    src = models["qwen3_moe"]
    d = tmp_path / "m"
    shutil.copytree(src, d)
    with flash(d, 2, prefetch="none") as m:
        m.logits(IDS[:4])
        os.utime(d / "model.qlinear", ns=(1, 1))
        with pytest.raises(ValueError, match="changed on disk"):
            m.reset()
            m.logits(IDS)
        assert all(s.pins == 0 for s in m.flash.experts.slots)


def test_cost_model_counts_the_misses(models):
    from qlinear.llm.flash.cost import cost_model

    with flash(models["qwen3_moe"], 6, prefetch="none") as m:
        m.logits(IDS[:8])
        st = m.flash.stats
        per_token = 3 * 2 * (1 - 6 / 24) * st["expert_bytes"]   # uniform routing over 6 of 24 experts
        text = cost_model(m, 1e9)
        assert "3 layers x 8 experts, 2 per token" in text and f"{st['misses']} misses" in text
        assert f"{1e9 / per_token:.2f} tok/s" in text
        assert f"measured 10.00 tok/s ({100 * 10 * 1000 / 1e9:.0f}%)" in cost_model(m, 1e9, 10.0, 1000)


def test_lfu_keeps_the_most_needed_experts_where_lru_cycles(models):
    """Six experts needed in turn, over and over, through four slots: LRU evicts each just before
    it is needed again (no hits after the first round); LFU keeps the more often needed ones."""
    cycle = [(layer, e) for layer in range(3) for e in (0, 1)]
    rates = {}
    for policy in ("lru", "lfu"):
        with flash(models["qwen3_moe"], 4, policy=policy) as m:
            cache = m.flash.experts
            for rnd in range(6):
                for layer, e in cycle + ([(0, 0)] if rnd == 0 else []):   # (0, 0) the most needed
                    got = cache.request(layer, [e])
                    cache.get(layer, e, got)
                    cache.release(got[e])
            rates[policy] = cache.stats.hit_rate
        with pytest.raises(ValueError, match="policy must be one of lru, lfu"):
            m.flash.experts.policy = "fifo"
    assert rates["lru"] < 0.05 < 0.3 < rates["lfu"]


# -- llama.cpp's GGUF file itself: experts read from its stacked ffn_*_exps tensors -------------

@pytest.fixture(scope="module")
def gguf_models(tmp_path_factory):
    pytest.importorskip("gguf")
    from test_gguf import SHAPE, T, write_gguf

    d = tmp_path_factory.mktemp("flash_moe_gguf")
    out = {}
    for arch in ("qwen3_moe", "olmoe", "mixtral"):
        experts = {"num_local_experts" if arch == "mixtral" else "num_experts": 8}
        ck = make_checkpoint(d / f"{arch}-ck", arch=arch, seed=5, norm_noise=0.1, num_experts_per_tok=2,
                             **experts, **{**SHAPE, "num_hidden_layers": 3})
        for qtype in (T.Q4_0, T.Q8_0):
            out[arch, qtype.name] = write_gguf(ck, d / f"{arch}-{qtype.name}.gguf", qtype)
        if arch == "qwen3_moe":   # one layer's down experts of another type; the block formats
            out["mixed"] = write_gguf(ck, d / "mixed.gguf", T.Q4_0, types={"blk.1.ffn_down_exps.weight": T.Q8_0})
            # a Q4_K_M file's experts: Q4_K, the downs of some layers Q6_K
            out["Q4_K_M"] = write_gguf(ck, d / "q4km.gguf", T.Q4_K, types={"blk.1.ffn_down_exps.weight": T.Q6_K})
            out["MXFP4"] = write_gguf(ck, d / "mxfp4.gguf", T.MXFP4)
            out["Q2_K"] = write_gguf(ck, d / "q2k.gguf", T.Q2_K, types={"blk.0.ffn_down_exps.weight": T.Q3_K})
            out["gate-up-apart"] = write_gguf(ck, d / "apart.gguf", T.Q4_K, types={"blk.2.ffn_up_exps.weight": T.Q5_K})
            out["dense-ck"] = ck
    return out


def _runs_as_in_memory(m, want, want_gen) -> dict:
    """The flash model's logits and generated tokens equal the in-memory load's; its stats."""
    np.testing.assert_array_equal(m.logits(IDS), want)
    m.reset()
    assert m.generate_ids(IDS[:6], 10) == want_gen
    m.flash.experts.drain()
    st = m.flash.stats
    assert st["misses"] > 0 and st["bytes"] == m.flash.bytes_read
    return st


@pytest.mark.parametrize("arch, qtype", [("qwen3_moe", "Q4_0"), ("qwen3_moe", "Q8_0"), ("olmoe", "Q4_0"),
                                         ("mixtral", "Q8_0")])
@pytest.mark.parametrize("slots, prefetch", [(None, "none"), (2, "router"), (1, "none"), (5, "none")])
def test_gguf_experts_read_from_the_file_equal_its_in_memory_load(gguf_models, arch, qtype, slots, prefetch):
    """memory='flash' on llama.cpp's file itself: each expert read from its three stacked tensors
    and its codes moved into a slot as the in-memory load moves them: the same logits and tokens
    bit for bit, whatever the cache's size (one slot: fewer than a layer's experts)."""
    path = gguf_models[arch, qtype]
    ref = llm.load(path, progress=False, max_context=256)
    want, want_gen = ref.logits(IDS), ref.generate_ids(IDS[:6], 10)
    with flash(path, slots, prefetch=prefetch) as m:
        assert m.info["memory"] == "flash" and m.info["flash_experts"]
        st = _runs_as_in_memory(m, want, want_gen)
        assert st["bytes"] == (st["misses"] + st["prefetched"]) * st["read_bytes"]
        if slots is None:
            assert st["misses"] + st["prefetched"] <= st["experts"] == 3 * 8


@pytest.mark.parametrize("name", ["mixed", "Q4_K_M", "MXFP4", "Q2_K"])
def test_gguf_experts_of_every_type_read_from_the_file_equal_its_in_memory_load(gguf_models, name):
    """Experts of the block formats (a Q4_K_M file's Q4_K with Q6_K downs in some layers, MXFP4,
    Q2_K with Q3_K) and of types that differ by layer (Q4_0 with a layer's Q8_0 downs): each
    layer's experts computed in that layer's geometry over the slots' buffers, the codes moved as
    the in-memory load moves them, the same logits and tokens bit for bit."""
    path = gguf_models[name]
    ref = llm.load(path, progress=False, max_context=256)
    assert ref.info["gguf_requantized"] == []
    want, want_gen = ref.logits(IDS), ref.generate_ids(IDS[:6], 10)
    for slots in (None, 1):
        with flash(path, slots) as m:
            st = _runs_as_in_memory(m, want, want_gen)
            files = m.flash.files
            assert len(files.kinds) == (1 if name == "MXFP4" else 2)
            assert st["expert_bytes"] == max(g.nbytes for g, _ in files.kinds) + max(d.nbytes for _, d in files.kinds)


def test_converted_block_format_experts_read_from_the_file_equal_its_in_memory_load(gguf_models, tmp_path):
    """A converted Q4_K_M MoE file (Q4_K experts, a layer's downs Q6_K): each layer's experts
    read in their own geometry from the converted file, the same logits bit for bit."""
    want = llm.load(gguf_models["Q4_K_M"], progress=False, max_context=256).logits(IDS)
    llm.convert(gguf_models["Q4_K_M"], tmp_path / "conv", progress=False)
    for slots in (None, 1):
        with flash(tmp_path / "conv", slots) as m:
            np.testing.assert_array_equal(m.logits(IDS), want)
            assert len(m.flash.files.kinds) == 2 and m.flash.stats["misses"] > 0


def test_gguf_flash_refuses_what_it_cannot_read(gguf_models, tmp_path):
    with pytest.raises(ValueError, match="layer 2's expert gate is Q4_K and its up Q5_K"):
        flash(gguf_models["gate-up-apart"])
    from test_gguf import SHAPE, T, write_gguf

    dense = make_checkpoint(tmp_path / "dense", arch="qwen2", **SHAPE)
    with pytest.raises(ValueError, match="has none; stream a dense model's FFNs from a converted file"):
        llm.load(write_gguf(dense, tmp_path / "dense.gguf", T.Q4_0), memory="flash", progress=False)
    path = gguf_models["qwen3_moe", "Q4_0"]
    with pytest.raises(ValueError, match=r"too small .* 2 expert slots"):
        flash(path, budget=1)
    bad = tmp_path / "trunc.gguf"   # cut inside the last layer's experts
    bad.write_bytes(path.read_bytes()[:-8192])
    with pytest.raises(ValueError, match="outside the file|truncated"):
        flash(bad)


def test_gguf_file_truncated_while_running_is_named(gguf_models, tmp_path):
    """The file cut after loading: the read of a missing expert fails with the file named, and
    the slots and the staging buffers are given back."""
    path = tmp_path / "m.gguf"
    shutil.copy(gguf_models["qwen3_moe", "Q4_0"], path)
    with flash(path, 2, prefetch="none") as m:
        m.logits(IDS[:4])
        with open(path, "r+b") as fh:
            fh.truncate(path.stat().st_size // 2)
        with pytest.raises(ValueError, match="short read|changed on disk"):
            m.reset()
            m.logits(IDS)
        assert all(s.pins == 0 for s in m.flash.experts.slots)
        for s in m.flash.experts.slots:   # reads still in flight end too
            if s.job is not None:
                s.job._done.wait()
        assert m.flash.files._staging.qsize() == m.config.experts_per_token
