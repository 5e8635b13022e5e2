"""Weight quantization and packing: codes, scales and offsets equal the reference bit for bit."""

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
    assert pw.layout == qlinear.cpu_info()["layout"]
    assert pw.scale_dtype == np.float16


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
