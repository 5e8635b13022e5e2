"""Weight quantization and packing: codes, scales and offsets equal the reference bit for bit."""

import platform

import numpy as np
import pytest

import qlinear
from qlinear import reference as ref

GROUPS = [32, 64, 128, 256, None]


def same_f16(a, b):
    return np.array_equal(np.asarray(a).view(np.uint16), np.asarray(b).view(np.uint16))


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("group_size", GROUPS)
@pytest.mark.parametrize("n,k", [(1, 1), (1, 32), (7, 33), (8, 64), (9, 65), (17, 127), (16, 256),
                                 (5, 257), (3, 300), (24, 512), (2, 1000)])
def test_pack_matches_reference(rng, bits, symmetric, group_size, n, k):
    w = (rng.standard_normal((n, k)) * rng.uniform(0.01, 3)).astype(np.float32)
    pw = qlinear.pack_weight(w, bits=bits, group_size=group_size, symmetric=symmetric)
    qw = ref.quantize_weight(w, bits, group_size, symmetric)
    codes, scale, offset = pw.unpack()
    assert np.array_equal(codes, qw.codes)
    assert same_f16(scale, qw.scale)
    if symmetric:
        assert offset is None
    else:
        assert same_f16(offset, qw.offset)
    assert pw.shape == (n, k) and pw.bits == bits and pw.symmetric == symmetric
    assert pw.group_size == (k if group_size is None or group_size >= k else group_size)
    w_deq = pw.dequantize()
    assert np.array_equal(w_deq, ref.dequantize_weight(qw))
    # round to nearest: every weight within half a step (plus float16 rounding of the offset)
    step = np.repeat(scale.astype(np.float32), pw.group_size, axis=1)[:, :k]
    slack = 0 if symmetric else np.repeat(np.abs(offset.astype(np.float32)), pw.group_size, axis=1)[:, :k] * 2.0 ** -10
    inside = np.abs(w - w_deq) <= step * 0.5 * (1 + 1e-3) + slack + 1e-7
    clipped = ~inside  # only the clipped ends may be further (symmetric -8 / fp16 range edges)
    assert clipped.mean() < 0.01


def test_bits_per_weight_and_layout(rng):
    w = rng.standard_normal((4096, 4096)).astype(np.float32)
    pw = qlinear.pack_weight(w, bits=4, group_size=64)
    assert pw.bits_per_weight == pytest.approx(4.5)  # 4 + 2 x 16 bits per 64 weights
    assert qlinear.pack_weight(w[:64], bits=4, group_size=128, symmetric=True).bits_per_weight == pytest.approx(4.125)
    assert pw.nbytes == 4096 * 4096 * 9 // 16
    assert pw.layout == "nr8_kr4"  # int4: the same bytes on every CPU family
    assert pw.scale_dtype == np.float16


def test_native_layouts():
    """int4 is nr8_kr4 everywhere; int8 is the family's layout: its codes flipped on ARM."""
    w = np.ones((8, 64), np.float32)
    family = qlinear.cpu_info()["layout"]
    assert family == ("nr8_kr4_s8" if platform.machine() in ("aarch64", "arm64") else "nr8_kr4")
    assert qlinear.pack_weight(w, bits=4).layout == "nr8_kr4"
    assert qlinear.pack_weight(w, bits=8).layout == family


def _code_byte_mask(n, k, block, nbytes, symmetric):
    """True at the bytes of an int8 nr8_kr4 weight that hold a real code (row < n, k < K)."""
    nb = -(-k // block)
    block_bytes = 8 * block + 16 * (1 if symmetric else 2)
    mask = np.zeros(nbytes, bool)
    for p in range(-(-n // 8)):
        for b in range(nb):
            base = (p * nb + b) * block_bytes
            for c in range(block // 4):          # chunk c: k 4c .. 4c + 3 of rows 0..7
                for r in range(min(8, n - 8 * p)):
                    for i in range(4):
                        if b * block + 4 * c + i < k:
                            mask[base + 32 * c + 4 * r + i] = True
    return mask


@pytest.mark.parametrize("symmetric", [True, False])
def test_flipped_int8_layout(isa, rng, symmetric):
    """nr8_kr4_s8 (ARM's int8 layout) is nr8_kr4 with each real code byte ^ 0x80 and nothing else
    changed; both layouts give the same results to the bit at every level (the level's own layout
    runs its kernels, the other the scalar ones), int4 asked for in it stays nr8_kr4."""
    n, k, group = 13, 200, 64
    w = rng.standard_normal((n, k)).astype(np.float32)
    codes, scale, offset = qlinear.pack_weight(w, bits=8, group_size=group, symmetric=symmetric).unpack()
    plain = qlinear.pack_quantized(codes, scale, offset, 8, group, symmetric, layout="nr8_kr4")
    flipped = qlinear.pack_quantized(codes, scale, offset, 8, group, symmetric, layout="nr8_kr4_s8")
    assert (plain.layout, flipped.layout) == ("nr8_kr4", "nr8_kr4_s8")
    diff = np.frombuffer(plain.buffer, np.uint8) ^ np.frombuffer(flipped.buffer, np.uint8)
    mask = _code_byte_mask(n, k, group, plain.nbytes, symmetric)
    assert np.all(diff[mask] == 0x80) and np.all(diff[~mask] == 0)
    for got, want in zip(flipped.unpack(), (codes, scale, offset)):
        np.testing.assert_array_equal(got, want)
    native = qlinear.cpu_info()["layout"]
    for m in (1, 5, 37):
        x = rng.standard_normal((m, k)).astype(np.float32)
        for xx, kw in ((x, {}), (x, {"act_block": None}), (x, {"act": "float"}), (x.astype(np.float16), {"act": "float"})):
            got = [qlinear.matmul(xx, pw, **kw) for pw in (plain, flipped)]
            qlinear.set_isa("scalar")   # the scalar level reads both layouts, to the same bits
            want = [qlinear.matmul(xx, pw, **kw) for pw in (plain, flipped)]
            qlinear.set_isa(isa)
            np.testing.assert_array_equal(want[0], want[1])
            tol = 1e-5 if xx.dtype == np.float32 else 2e-3   # (fp16 in, fp16 out: its last bit)
            for g in got:   # a SIMD level's float epilogue may round differently from the scalar one
                np.testing.assert_allclose(g, want[0], rtol=tol, atol=tol * np.abs(want[0]).max())
        for pw in (plain, flipped):
            ran = qlinear.kernel_info(pw, m)["int8"][0]["name"]
            assert ("scalar" in ran) == (pw.layout != native or isa == "scalar"), (pw.layout, ran)
    c4, s4, o4 = qlinear.pack_weight(w, bits=4, group_size=group).unpack()
    four = qlinear.pack_quantized(c4, s4, o4, 4, group, False, layout="nr8_kr4_s8")
    assert four.layout == "nr8_kr4"
    np.testing.assert_array_equal(four.buffer, qlinear.pack_quantized(c4, s4, o4, 4, group, False).buffer)


def test_file_of_the_other_layout_loads_in_the_native_one(tmp_path, rng):
    """A weight saved on the other CPU family (int8: the other layout) loads in this one's, same codes."""
    w = rng.standard_normal((19, 96)).astype(np.float32)
    codes, scale, offset = qlinear.pack_weight(w, bits=8, group_size=32).unpack()
    native = qlinear.cpu_info()["layout"]
    other = "nr8_kr4" if native == "nr8_kr4_s8" else "nr8_kr4_s8"
    qlinear.save_weight(tmp_path / "w.qlw", qlinear.pack_quantized(codes, scale, offset, 8, 32, False, layout=other))
    got = qlinear.load_weight(tmp_path / "w.qlw")
    assert got.layout == native
    for a, b in zip(got.unpack(), (codes, scale, offset)):
        np.testing.assert_array_equal(a, b)


def test_constant_and_zero_groups_dequantize_exactly():
    w = np.zeros((3, 96), np.float32)
    w[1] = 0.5          # constant groups (hi == lo): scale 0, the offset carries the value
    w[2, :32] = -2.0
    for bits in (4, 8):
        pw = qlinear.pack_weight(w, bits=bits, group_size=32, symmetric=False)
        assert np.array_equal(pw.dequantize(), w)
        zeros = qlinear.pack_weight(np.zeros_like(w), bits=bits, group_size=32, symmetric=True)
        assert np.array_equal(zeros.dequantize(), np.zeros_like(w))  # absmax 0: no division


def test_float16_and_float64_weights_give_float32_result(rng):
    w = rng.standard_normal((10, 70)).astype(np.float16)
    a = qlinear.pack_weight(w).unpack()
    b = qlinear.pack_weight(w.astype(np.float32)).unpack()
    c = qlinear.pack_weight(w.astype(np.float64)).unpack()
    for x, y, z in zip(a, b, c):
        assert np.array_equal(x, y) and np.array_equal(y, z)


def test_pack_quantized_round_trips(rng):
    w = rng.standard_normal((19, 200)).astype(np.float32)
    for sym in (False, True):
        pw = qlinear.pack_weight(w, bits=4, group_size=64, symmetric=sym)
        codes, scale, offset = pw.unpack()
        again = qlinear.pack_quantized(codes, scale, offset, 4, 64, sym)
        assert np.array_equal(again.buffer, pw.buffer)


def test_pack_quantized_rejects_out_of_range_codes():
    codes = np.full((8, 64), 16, np.uint8)
    scale = np.ones((8, 1), np.float16)
    with pytest.raises(ValueError, match="codes exceed 15"):
        qlinear.pack_quantized(codes, scale, scale, 4, 64, False)
