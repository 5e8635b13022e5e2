"""memory="flash": FFN weights read from the model file per forward (qlinear.llm.flash)."""

import json
import os
import shutil
import threading

import numpy as np
import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("transformers")

import qlinear  # noqa: E402
from qlinear import llm  # noqa: E402
from qlinear.llm.flash import layout as flash_layout  # noqa: E402
from qlinear.llm.synthetic import make_checkpoint  # noqa: E402

IDS = list(range(5, 45))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("flash")
    ck = make_checkpoint(d / "ck", arch="qwen2", shape="tiny", num_hidden_layers=3)
    plain = llm.convert(ck, d / "q4", progress=False)
    bundled = llm.convert(ck, d / "q4f", progress=False, flash=True)
    return {"ck": ck, "plain": plain, "bundled": bundled, "dir": d}


def fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_bundle_layout_roundtrip():
    import qlinear
    from qlinear.llm.flash.layout import FFNLayout, Geometry

    rng = np.random.default_rng(0)
    for H, I, gs in [(64, 176, 64), (96, 192, None), (64, 160, 32)]:
        gu = qlinear.pack_weight(rng.standard_normal((2 * I, H), dtype=np.float32), 4, gs)
        dn = qlinear.pack_weight(rng.standard_normal((H, I), dtype=np.float32), 4, gs)
        geom = lambda w: Geometry(*w.shape, w.bits, w.group_size, w.symmetric, w.layout)  # noqa: E731
        lay = FFNLayout(geom(gu), geom(dn))
        assert geom(gu).nbytes == gu.nbytes and geom(dn).nbytes == dn.nbytes
        b = lay.bundle(np.asarray(gu.buffer), np.asarray(dn.buffer))
        # a bundle holds its neurons' gate rows, up rows and down columns (the codes)
        codes_gu, codes_dn = gu.unpack()[0], dn.unpack()[0]
        for k in range(lay.count):
            part = b[lay.offsets[k]:lay.offsets[k + 1]]
            rows = slice(k * lay.neurons, k * lay.neurons + lay.neurons_of(k))
            rb = lay.rows_bytes(k)
            g = flash_layout.packed(part[:rb].copy(), Geometry(rows.stop - rows.start, H, gu.bits, gu.group_size, False))
            np.testing.assert_array_equal(g.unpack()[0], codes_gu[rows])
            u = flash_layout.packed(part[rb:2 * rb].copy(), Geometry(rows.stop - rows.start, H, gu.bits, gu.group_size, False))
            np.testing.assert_array_equal(u.unpack()[0], codes_gu[I + rows.start:I + rows.stop])
            d = flash_layout.packed(part[2 * rb:].copy(), Geometry(H, lay.neurons, dn.bits, lay.neurons, False))
            np.testing.assert_array_equal(d.unpack()[0][:, :rows.stop - rows.start], codes_dn[:, rows])
        a, c = lay.unbundle(b)
        np.testing.assert_array_equal(a, gu.buffer)
        np.testing.assert_array_equal(c, dn.buffer)


@pytest.mark.parametrize("kind", ["plain", "bundled"])
def test_flash_logits_equal_normal_bit_for_bit(models, kind):
    ref = llm.load(models["plain"], progress=False)
    want = ref.logits(IDS)
    want_gen = ref.generate_ids(IDS[:6], 8)
    with llm.load(models[kind], memory="flash", progress=False) as m:
        assert m.info["memory"] == "flash" and m.info["flash_bundled"] == (kind == "bundled")
        np.testing.assert_array_equal(m.logits(IDS), want)
        assert m.generate_ids(IDS[:6], 8) == want_gen     # decode steps, block by block
        np.testing.assert_array_equal(m.logits(IDS[:7]), ref.logits(IDS[:7]))
        # every forward reads every layer's FFN (reads of the next ones may be in flight)
        layer = m.info["flash_layer_bytes"]
        assert m.flash.bytes_read >= layer * 3 * 10


@pytest.mark.parametrize("arch", ["gemma2", "qwen3"])
def test_flash_keeps_the_architecture_s_block(tmp_path, arch):
    """Only the MLP's weights are streamed: Gemma 2's norms around attention and MLP, soft-caps
    and sliding layers, Qwen3's q / k norms are the block's own, bit for bit."""
    ck = make_checkpoint(tmp_path / "ck", arch=arch, shape="tiny", num_hidden_layers=3)
    conv = llm.convert(ck, tmp_path / "q4", progress=False)
    ref = llm.load(conv, progress=False)
    with llm.load(conv, memory="flash", progress=False) as m:
        np.testing.assert_array_equal(m.logits(IDS), ref.logits(IDS))
        assert m.generate_ids(IDS[:6], 8) == ref.generate_ids(IDS[:6], 8)


def test_bundled_file_loads_normally(models):
    a = llm.load(models["plain"], progress=False).logits(IDS)
    np.testing.assert_array_equal(llm.load(models["bundled"], progress=False).logits(IDS), a)


def test_budget_too_small_refused_before_loading(models, monkeypatch):
    from qlinear.llm.converted import source as converted_source

    def no_read(*a, **k):
        raise AssertionError("read the model before checking the budget")

    monkeypatch.setattr(converted_source, "read", no_read)
    with pytest.raises(ValueError, match="memory_budget_mb=0.1 is too small.*resident weights"):
        llm.load(models["plain"], memory="flash", memory_budget_mb=0.1, progress=False)
    with pytest.raises(ValueError, match="memory_budget_mb must be a positive"):
        llm.load(models["plain"], memory="flash", memory_budget_mb=-1, progress=False)
    with pytest.raises(ValueError, match="apply to memory='flash' only"):
        llm.load(models["plain"], memory_budget_mb=100, progress=False)


def test_budget_that_fits_loads(models):
    with llm.load(models["plain"], memory="flash", memory_budget_mb=64, max_context=256, progress=False) as m:
        assert m.logits(IDS[:4]).shape == (4, m.config.vocab_size)


def test_flash_needs_a_converted_model(models):
    with pytest.raises(ValueError, match="needs a converted model"):
        llm.load(models["ck"], memory="flash", progress=False)


@pytest.mark.parametrize("kind", ["plain", "bundled"])
@pytest.mark.parametrize("change", ["truncate", "rewrite"])
def test_file_changed_during_a_run_raises(models, tmp_path, kind, change):
    d = tmp_path / "m"
    shutil.copytree(models[kind], d)
    f = d / "model.qlinear"
    with llm.load(d, memory="flash", progress=False) as m:
        m.logits(IDS[:4])
        if change == "truncate":
            with open(f, "r+b") as fh:
                fh.truncate(os.path.getsize(f) // 2)
        else:
            with open(f, "r+b") as fh:   # same size, other bytes
                fh.seek(os.path.getsize(f) // 2)
                fh.write(b"\xff" * 4096)
        with pytest.raises(ValueError, match="truncated|changed on disk"):
            m.logits(IDS[:4])
        with pytest.raises(ValueError, match="truncated|changed on disk"):   # stays an error
            m.generate_ids(IDS[:4], 3)


def test_reader_threads_and_fds_are_released(models):
    import gc

    before_threads, before_fds = set(threading.enumerate()), fd_count()
    m = llm.load(models["bundled"], memory="flash", progress=False)
    m.logits(IDS[:4])
    plan = m.flash.reader.plan   # 1 thread reading with the kernel's readahead, or 4 without
    assert (plan.threads, plan.readahead) in ((1, True), (4, False))
    assert len(set(threading.enumerate()) - before_threads) == plan.threads
    assert fd_count() > before_fds
    m.close()
    assert set(threading.enumerate()) == before_threads and fd_count() == before_fds
    m.close()  # idempotent
    with pytest.raises(ValueError, match="closed"):
        m.logits(IDS[:4])

    with llm.load(models["plain"], memory="flash", reader_threads=2, progress=False) as m:
        assert len(set(threading.enumerate()) - before_threads) == 2
    assert set(threading.enumerate()) == before_threads and fd_count() == before_fds

    m = llm.load(models["plain"], memory="flash", progress=False)   # garbage collection
    m.logits(IDS[:3])
    del m
    gc.collect()
    threads = [t for t in threading.enumerate() if t.name.startswith("qlinear-flash-reader")]
    for t in threads:
        t.join(timeout=10)
    assert set(threading.enumerate()) == before_threads
    assert fd_count() == before_fds


def test_window_swap_delete_matches_reference():
    from qlinear.llm.flash.sparsity import Window

    rng = np.random.default_rng(1)
    data = np.full(16, -1)
    moves = []

    def move(src, dst):
        moves.append((src, dst))
        data[dst] = data[src]

    w = Window(16, move)
    ref = {}   # bundle -> last active token
    for now in range(1, 200):
        w.evict(now, 5)
        ref = {b: t for b, t in ref.items() if now - t < 5}
        active = rng.choice(16, rng.integers(0, 5), replace=False)
        for b, s in w.touch(active, now):
            data[s] = b          # "read" bundle b into slot s
        ref.update({int(b): now for b in active})
        held = w.ids[:w.count]
        assert sorted(held.tolist()) == sorted(ref) and (w.ids[w.count:] == -1).all()
        assert all(w.slot[b] == s for s, b in enumerate(held.tolist()))
        assert data[:w.count].tolist() == held.tolist()              # slot data follows its id
        assert {int(b): int(t) for b, t in zip(held, w.last[:w.count])} == ref
    assert moves and all(src == max(src, dst) for src, dst in moves)   # the last slot moves into the hole


@pytest.fixture(scope="module")
def relu_model(tmp_path_factory):
    d = tmp_path_factory.mktemp("relu")
    ck = make_checkpoint(d / "ck", arch="llama", shape="tiny", hidden_act="relu", intermediate_size=256)
    return llm.convert(ck, d / "q4f", progress=False, flash=True), ck


def test_relu_llama_matches_transformers(relu_model):
    import torch
    import transformers

    _, ck = relu_model
    hf = transformers.AutoModelForCausalLM.from_pretrained(ck, dtype=torch.float32).eval()
    with torch.no_grad():
        want = hf(torch.tensor([IDS])).logits[0].numpy()
    got = llm.load(ck, bits=None, act="float", progress=False).logits(IDS)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_predictor_and_sparse_flash(relu_model, tmp_path):
    from qlinear.llm.flash import sparsity

    path, _ = relu_model
    dense = llm.load(path, progress=False)
    rng = np.random.default_rng(0)
    seqs = [rng.integers(3, 1000, 32).tolist() for _ in range(24)]
    preds = sparsity.train(dense, seqs[:16], rank=16, recall=0.99)
    held = sparsity.evaluate(preds, sparsity.collect(dense, seqs[16:]))
    assert held["recall"] > 0.9 and 0.3 < held["sparsity"] < 0.7   # random weights: about half active
    # an all-knowing predictor (threshold below every score) reads every bundle: the dense result
    sparsity.save(tmp_path / "p.qlinear", preds)
    want = dense.logits(seqs[20])
    with llm.load(path, memory="flash", predictor=tmp_path / "p.qlinear", window=2, progress=False) as m:
        got = m.logits(seqs[20])
        cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
        assert cos.min() >= 0.99
        assert m.generate_ids(seqs[21][:8], 6) == dense.generate_ids(seqs[21][:8], 6)
    never = [(a, b, np.float32(np.inf)) for a, b, _ in preds]   # predicts nothing: reads nothing
    with llm.load(path, memory="flash", predictor=never, progress=False) as m:
        m.logits(seqs[20][:4])
        assert m.flash.bytes_read == 0
    with pytest.raises(ValueError, match="ReLU model"):
        sparsity.train(llm.load(llm.convert(make_checkpoint(tmp_path / "s", shape="tiny"), tmp_path / "sq",
                                            progress=False), progress=False), seqs[:2])


def test_cgroup_limited_run(models, tmp_path):
    import sys

    from qlinear.llm.flash.cgroup import MemoryCgroup, unavailable_reason

    why = unavailable_reason()
    if why:
        pytest.skip(f"no memory cgroup can be made here: {why}")
    code = ("import sys, json; from qlinear import llm; "
            "m = llm.load(sys.argv[1], memory='flash', max_context=64, progress=False); "
            "print(json.dumps(m.generate_ids(list(range(5, 15)), 6)))")
    want = llm.load(models["plain"], progress=False).generate_ids(list(range(5, 15)), 6)
    with MemoryCgroup(300 << 20, name=f"qlinear-flash-test-{os.getpid()}") as cg:
        r = cg.run([sys.executable, "-c", code, str(models["bundled"])], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout) == want
        assert 0 < cg.peak <= 300 << 20
        # the limit holds: a process that needs more is stopped
        r = cg.run([sys.executable, "-c", "b = bytearray(400 << 20); b[::4096] = b'x' * len(b[::4096])"],
                   capture_output=True, timeout=120)
        assert r.returncode != 0


def test_budget_room_holds_ffn_layers(models):
    """A budget with room beyond what flash needs holds whole FFN layers in memory, the last
    ones; only the others are read per token; the logits stay the normal mode's."""
    from qlinear._format import tensor_entries
    from qlinear.llm.converted import source as converted_source
    from qlinear.llm.flash import loader as flash, plan as flash_plan
    from qlinear.llm.config import ModelConfig

    file = models["plain"] / converted_source.MODEL_FILE
    entries, meta = tensor_entries(file)
    cfg = ModelConfig.from_dict(meta["config"])
    ffn = flash.FFNFile(file, entries, meta, cfg)
    plan = flash_plan.plan_memory(entries, ffn, cfg, 256)
    ref = llm.load(models["plain"], progress=False)
    want, want_gen = ref.logits(IDS), ref.generate_ids(IDS[:6], 4)
    for held in (0, 1, 2, 3):
        budget = (plan.total + flash_plan.PROCESS_RESERVE + held * ffn.layer_bytes + ffn.layer_bytes // 2) / 2**20
        with llm.load(models["plain"], memory="flash", memory_budget_mb=budget, max_context=256,
                      progress=False) as m:
            pinned = m.info["flash_pinned_layers"]
            assert pinned == list(range(3 - held, 3))
            before = m.flash.bytes_read
            np.testing.assert_array_equal(m.logits(IDS), want)
            assert m.generate_ids(IDS[:6], 4) == want_gen
            # 6 forwards (logits, prefill, 4 decode steps), each reading the streamed layers,
            # and at most two layers' reads in flight beyond them
            assert m.flash.bytes_read - before <= (6 * (3 - held) + 2) * ffn.layer_bytes
            assert (m.flash.bytes_read > before) == (held < 3)


def test_converted_files_hold_the_ffns_in_one_run(models, tmp_path):
    """A converted file stores every layer's FFN after all the rest, layer after layer (one run
    for flash's reader, which then reads with the kernel's readahead); a file with each FFN
    beside its layer's attention weights (converted before) is read without it, to the same
    logits."""
    from qlinear._format import load_weights, save_weights, tensor_entries
    from qlinear.llm.converted import source as converted_source
    from qlinear.llm.flash import loader as flash
    from qlinear.llm.config import ModelConfig

    def ffn_file(d):
        file = d / converted_source.MODEL_FILE
        entries, meta = tensor_entries(file)
        return flash.FFNFile(file, entries, meta, ModelConfig.from_dict(meta["config"]))

    assert ffn_file(models["plain"]).one_run and ffn_file(models["bundled"]).one_run
    tensors, meta = load_weights(models["plain"] / converted_source.MODEL_FILE, mmap_mode=False)
    by_layer = sorted(tensors, key=lambda n: int(n.split(".")[1]) if n.startswith("layers.") else -1)
    old = tmp_path / "interleaved"
    shutil.copytree(models["plain"], old)
    save_weights(old / converted_source.MODEL_FILE, {n: tensors[n] for n in by_layer}, meta)
    assert not ffn_file(old).one_run
    want = llm.load(models["plain"], progress=False).logits(IDS)
    with llm.load(old, memory="flash", progress=False) as m:
        np.testing.assert_array_equal(m.logits(IDS), want)


@pytest.mark.parametrize("read_ahead_kb", [8192, 128, None])
def test_read_plan_follows_the_devices_readahead(models, monkeypatch, read_ahead_kb):
    """One run on a device with a large readahead window: one thread, reads the kernel reads
    ahead of; otherwise 4 threads without readahead. Either way the same logits."""
    from qlinear.llm.flash import reader as flash_reader

    monkeypatch.setattr(flash_reader, "device_read_ahead_kb", lambda path: read_ahead_kb)
    stream = read_ahead_kb == 8192
    want = (True, 1, flash_reader.STREAM_CHUNK, False) if stream else (False, 4, flash_reader.CHUNK_BYTES, False)
    assert tuple(vars(flash_reader.read_plan("f", one_run=True)).values()) == want
    assert not flash_reader.read_plan("f", one_run=False).readahead
    assert flash_reader.read_plan("f", one_run=True, threads=3).threads == 3
    expect = llm.load(models["plain"], progress=False).logits(IDS)
    for name in ("plain", "bundled"):
        with llm.load(models[name], memory="flash", progress=False) as m:
            assert m.flash.reader.plan == flash_reader.read_plan(m.flash.reader.path, True)
            np.testing.assert_array_equal(m.logits(IDS), expect)
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="reader threads"):
            llm.load(models["plain"], memory="flash", reader_threads=bad, progress=False)


@pytest.mark.parametrize("bits", [4, 8])
def test_file_of_another_layout(models, tmp_path, bits):
    """A model converted on another CPU (int8: x86's nr8_kr4 or ARM's nr8_kr4_s8; int4: nr8_kr4 or
    the i8mm level's nr8_kr8): memory='ram' moves the codes (same logits); flash, which reads the
    file's bytes into the kernels as they are, runs it if the level reads that layout (the i8mm
    level reads the dotprod level's) and otherwise refuses it and says what to do."""
    from qlinear import _format
    src = llm.convert(models["ck"], tmp_path / "q", bits=bits, progress=False)
    native = qlinear._core.native_layout(bits)
    if bits == 8:
        other = "nr8_kr4_s8" if native == "nr8_kr4" else "nr8_kr4"
    else:
        other = "nr8_kr8" if native == "nr8_kr4" else "nr8_kr4"
    moved = tmp_path / "qother"
    shutil.copytree(src, moved)
    tensors, meta = _format.load_weights(src / "model.qlinear")
    for name, t in tensors.items():
        if isinstance(t, qlinear.PackedWeight):
            codes, scale, offset = t.unpack()
            tensors[name] = qlinear.pack_quantized(codes, scale, offset, t.bits, t.group_size, t.symmetric, other)
    _format.save_weights(moved / "model.qlinear", tensors, meta)
    assert _format.tensor_entries(moved / "model.qlinear")[0]["layers.0.down"]["layout"] == other
    want = llm.load(src, progress=False).logits(IDS)
    np.testing.assert_array_equal(llm.load(moved, progress=False).logits(IDS), want)
    if qlinear._core.reads_layout(other, bits):
        with llm.load(moved, memory="flash", progress=False) as m:
            np.testing.assert_array_equal(m.logits(IDS), want)
        return
    with pytest.raises(ValueError, match="memory='ram'"):
        llm.load(moved, memory="flash", progress=False)


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K", "MXFP4"])
@pytest.mark.parametrize("bundled", [False, True])
def test_block_format_ffns_stream_from_a_converted_file(tmp_path, qtype, bundled):
    """A GGUF file's block-format FFNs, converted (as separate weights or in the bundled layout),
    stream with memory='flash' as the in-memory load computes them, bit for bit; a file whose
    layers' FFNs differ in type (a Q4_K_M file's Q6_K downs in some layers) is refused by name."""
    gguf = pytest.importorskip("gguf")
    from test_gguf import SHAPE, write_gguf

    T = gguf.GGMLQuantizationType
    ck = make_checkpoint(tmp_path / "ck", arch="qwen2", seed=5, **SHAPE)
    path = write_gguf(ck, tmp_path / "m.gguf", getattr(T, qtype))
    ids = list(range(5, 40))
    want = llm.load(path, progress=False, max_context=128).logits(ids)
    llm.convert(path, tmp_path / "conv", progress=False, flash=bundled)
    with llm.load(tmp_path / "conv", memory="flash", progress=False, max_context=128) as m:
        np.testing.assert_array_equal(m.logits(ids), want)
    mix = write_gguf(ck, tmp_path / "mix.gguf", T.Q4_K, types={"blk.1.ffn_down.weight": T.Q6_K})
    llm.convert(mix, tmp_path / "mixc", progress=False)
    with pytest.raises(ValueError, match="quantized differently"):
        llm.load(tmp_path / "mixc", memory="flash", progress=False)
