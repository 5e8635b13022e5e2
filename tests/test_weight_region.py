"""llm.weight_region: a model's packed weights moved onto one region of huge pages, unchanged."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import qlinear
from qlinear import llm
from qlinear.llm import synthetic, weight_region


UNDER_QEMU = "QEMU_LD_PREFIX" in os.environ  # tools/test-aarch64.sh's guest environment
UNDER_ASAN = "libasan" in os.environ.get("LD_PRELOAD", "")


def address(pw) -> int:
    return pw.buffer.ctypes.data


def smaps_flags(addr: int) -> list:
    """The VmFlags of this process's mapping that holds ``addr``."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(v, 16) for v in head.split("-"))
                inside = lo <= addr < hi
            elif inside and head == "VmFlags:":
                return line.split()[1:]
    raise AssertionError(f"no mapping holds {addr:#x}")


def weights(rng, tmp_path):
    shapes = [(37, 96, 4, 32, True), (64, 256, 8, 64, False), (9, 33, 4, None, False), (1, 32, 8, 32, True)]
    out = {f"w{i}": qlinear.pack_weight(rng.standard_normal((n, k)).astype(np.float32), bits=b, group_size=g,
                                        symmetric=s)
           for i, (n, k, b, g, s) in enumerate(shapes)}
    qlinear.save_weight(tmp_path / "mapped.qlw", out["w1"])
    out["mapped"] = qlinear.load_weight(tmp_path / "mapped.qlw")  # a view of the mapped file
    out["norm"] = rng.standard_normal(16).astype(np.float32)
    out["w0_again"] = out["w0"]  # one weight under two names (tied)
    return out


@pytest.mark.skipif(not weight_region.available(), reason="no transparent huge pages here")
def test_place_moves_weights_in_memory_into_one_advised_region(rng, tmp_path):
    tensors = weights(rng, tmp_path)
    before = dict(tensors)
    xs = {n: rng.standard_normal((3, w.shape[1])).astype(np.float32) for n, w in tensors.items() if n != "norm"}
    ys = {n: qlinear.matmul_w4a8(x, tensors[n]) if tensors[n].bits == 4 else qlinear.matmul_w8a8(x, tensors[n])
          for n, x in xs.items()}
    moved = weight_region.place(tensors)

    names = [f"w{i}" for i in range(4)]
    assert moved == sum(-(-before[n].nbytes // 64) * 64 for n in names)
    assert tensors["mapped"] is before["mapped"] and tensors["norm"] is before["norm"]
    assert tensors["w0_again"] is tensors["w0"]  # moved once
    starts = [address(tensors[n]) for n in names]
    assert starts[0] % weight_region.HUGE_PAGE == 0
    assert all(b - a == -(-before[n].nbytes // 64) * 64 for a, b, n in zip(starts, starts[1:], names))
    if not UNDER_QEMU:  # qemu-user takes the advice without passing it on
        assert "hg" in smaps_flags(starts[0])  # MADV_HUGEPAGE
    assert weight_region.place(tensors) == 0  # placed once: nothing moves again
    for n in names:
        assert tensors[n] is not before[n] and address(tensors[n]) != address(before[n])
        assert np.array_equal(tensors[n].buffer, before[n].buffer)
        assert (tensors[n].shape, tensors[n].bits, tensors[n].group_size, tensors[n].symmetric) == \
            (before[n].shape, before[n].bits, before[n].group_size, before[n].symmetric)
    for n, x in xs.items():
        y = qlinear.matmul_w4a8(x, tensors[n]) if tensors[n].bits == 4 else qlinear.matmul_w8a8(x, tensors[n])
        assert np.array_equal(y, ys[n])


def test_place_can_be_turned_off(rng, tmp_path, monkeypatch):
    monkeypatch.setenv("QLINEAR_HUGE_PAGES", "0")
    tensors = weights(rng, tmp_path)
    before = dict(tensors)
    assert not weight_region.available()
    assert weight_region.place(tensors) == 0
    assert all(tensors[n] is before[n] for n in before)


def test_load_places_the_weights_and_computes_the_same_bits(tmp_path, monkeypatch):
    pytest.importorskip("torch")  # synthetic checkpoints are written with it
    ckpt = synthetic.make_checkpoint(tmp_path / "m", arch="qwen2", shape="tiny", seed=3, hidden_size=128,
                                     intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
                                     num_hidden_layers=2, vocab_size=512)
    ids = list(range(5, 40))
    placed = llm.load(ckpt, bits=4, group_size=64, progress=False)
    assert (placed.info["huge_page_weights_mb"] > 0) == weight_region.available()
    monkeypatch.setenv("QLINEAR_HUGE_PAGES", "0")
    plain = llm.load(ckpt, bits=4, group_size=64, progress=False)
    assert plain.info["huge_page_weights_mb"] == 0
    assert np.array_equal(placed.logits(ids), plain.logits(ids))
    assert placed.generate_ids(ids[:8], max_new_tokens=6) == plain.generate_ids(ids[:8], max_new_tokens=6)


@pytest.mark.skipif(not weight_region.available() or UNDER_ASAN,
                    reason="no transparent huge pages here / ASan's quarantine keeps freed memory resident")
def test_place_does_not_grow_the_resident_size():
    # 640 weights of ~290 KB (MoE experts' size) in separate buffers: what a loader leaves
    script = textwrap.dedent("""
        import numpy as np, qlinear
        from qlinear.llm import weight_region
        def status(key):  # VmRSS / VmHWM (peak) of this process, in bytes
            with open("/proc/self/status") as f:
                return next(int(l.split()[1]) * 1024 for l in f if l.startswith(key + ":"))
        w = qlinear.pack_weight(np.random.default_rng(0).standard_normal((512, 1024), np.float32), bits=4, group_size=32)
        tensors = {f"w{i}": w.copy_to(np.empty(w.nbytes, np.uint8)) for i in range(640)}
        before = status("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:  # the peak starts again from here
            f.write("5")
        moved = weight_region.place(tensors)
        print(moved, before, status("VmHWM"), status("VmRSS"))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    moved, before, peak, after = (int(v) for v in out.split())
    assert moved >= 640 * 290_000
    assert peak - before <= 48 << 20, f"peak grew by {(peak - before) >> 20} MB while placing {moved >> 20} MB"
    assert after - before <= 8 << 20, f"resident size grew by {(after - before) >> 20} MB"
