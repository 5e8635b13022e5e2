"""memory="flash": FFN weights read from the model file per forward (qlinear.llm.flash)."""

import os
import shutil
import threading

import numpy as np
import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("transformers")

from qlinear import llm  # noqa: E402
from qlinear.llm import flash_layout  # noqa: E402
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
    from qlinear.llm.flash_layout import FFNLayout, Geometry

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
        # every forward read every layer's FFN once (and at most 2 ahead)
        layer = m.info["flash_layer_bytes"]
        assert m.flash.bytes_read % layer == 0 and m.flash.bytes_read >= layer * 3


def test_bundled_file_loads_normally(models):
    a = llm.load(models["plain"], progress=False).logits(IDS)
    np.testing.assert_array_equal(llm.load(models["bundled"], progress=False).logits(IDS), a)


def test_budget_too_small_refused_before_loading(models, monkeypatch):
    from qlinear.llm import converted_source

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
    assert len(set(threading.enumerate()) - before_threads) == 4   # reader_threads
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
