"""The float path in FP16 arithmetic (ARM fp16 level and above, float16 activations): weights
dequantized to fp16, fp16 sums over 64 k (32 at the end of a block of an odd multiple of 32)
flushed into float32, products normalized by powers of
two (csrc/qlinear/core/fp16_path.h). Its scalar twin runs on every machine and is checked against the
reference within the bound of _check.py; every level that has the NEON kernels must reproduce the
twin bit for bit (levels without them are skipped)."""

import numpy as np
import pytest

import qlinear
from qlinear._ops import act_block_size
from qlinear import _core
from _check import U16, float_path_magnitude, fp16_arithmetic, fp16_arithmetic_tolerance

CONFIGS = [(bits, sym, g) for bits in (4, 8) for sym in (False, True) for g in (32, 64, 256, None)]
SHAPES = [(1, 1, 1), (1, 64, 8), (1, 100, 13), (2, 33, 9), (3, 257, 17), (5, 129, 24), (8, 512, 33),
          (13, 65, 40), (1, 1100, 70), (6, 700, 9)]


def twin(x, pw, bias=None):
    return _core.matmul_float16_twin(x, pw._h, bias, None, pw._h.k)


def check(y, x, pw, bias=None, random_data=True):
    """Worst case per output: the float32 path's bound + the FP16-arithmetic one + the float16
    output rounding. Random data: norm-wise relative error <= 4 u (measured ~1.5 u, against
    ~0.4 u for the float32 path rounded to fp16)."""
    x64 = np.atleast_2d(np.asarray(x, dtype=np.float64))
    ref = x64 @ pw.dequantize().astype(np.float64).T
    mag = float_path_magnitude(x64, pw)
    if bias is not None:
        ref, mag = ref + np.asarray(bias, np.float64), mag + np.abs(np.asarray(bias, np.float64))
    y = np.atleast_2d(np.asarray(y, dtype=np.float64))
    block = act_block_size(pw, "group")
    tol = (block + -(-pw.shape[1] // block) + 8) * 2.0 ** -24 * mag + U16 * np.abs(ref) + 2.0 ** -25
    tol = tol + fp16_arithmetic_tolerance(x64, pw, mag)
    err = np.abs(y - ref)
    assert (err <= tol).all(), f"{(err > tol).sum()} outputs off; worst {err.max():.3g}"
    if random_data and np.linalg.norm(ref) > 0:
        assert np.linalg.norm(y - ref) / np.linalg.norm(ref) <= 4 * U16


@pytest.mark.parametrize("bits,symmetric,group_size", CONFIGS)
def test_twin_within_the_error_bound(rng, bits, symmetric, group_size):
    for m, k, n in SHAPES:
        pw = qlinear.pack_weight((rng.standard_normal((n, k)) * 0.05).astype(np.float32), bits=bits,
                                 group_size=group_size, symmetric=symmetric)
        x = rng.standard_normal((m, k)).astype(np.float16)
        b = rng.standard_normal(n).astype(np.float32)
        y = twin(x, pw)
        assert y.dtype == np.float16 and y.shape == (m, n)
        check(y, x, pw, random_data=m * n >= 16)
        check(twin(x, pw, b), x, pw, bias=b, random_data=False)


@pytest.mark.parametrize("bits,symmetric,group_size", CONFIGS)
def test_kernels_equal_the_twin(isa, rng, bits, symmetric, group_size):
    probe = qlinear.pack_weight(np.ones((8, 32), np.float32), bits=bits)
    if not fp16_arithmetic(probe):
        pytest.skip(f"level {isa} has no FP16-arithmetic kernels")
    for m, k, n in SHAPES + [(4, 256, 16), (7, 300, 7), (17, 96, 8)]:
        pw = qlinear.pack_weight((rng.standard_normal((n, k)) * 0.05).astype(np.float32), bits=bits,
                                 group_size=group_size, symmetric=symmetric)
        x = rng.standard_normal((m, k)).astype(np.float16)
        b = rng.standard_normal(n).astype(np.float32)
        for bias in (None, b):
            y = qlinear.matmul_float(x, pw, bias=bias)
            assert np.array_equal(y, twin(x, pw, bias)), (m, k, n)
        assert np.array_equal(qlinear.matmul_float(x[0], pw), twin(x[:1], pw)[0])  # GEMV of a vector


def scaled_problem(rng, a, b, group_size=32):
    """x * 2^a and weights * 2^b of one problem with cancellation (partial sums ~20 times the
    result): quantized codes shared, fp16 scales and offsets scaled exactly."""
    n, k = 24, 256
    w = rng.uniform(0.5, 1.5, (n, k)).astype(np.float32)
    x = rng.uniform(0.5, 1.0, (3, k)).astype(np.float32)
    x[:, k // 2:] *= -1  # first half positive, second half negative
    pw = qlinear.pack_weight(w, bits=4, group_size=group_size)
    codes, scale, offset = pw.unpack()
    s = np.float32(2.0 ** b)
    scaled = qlinear.pack_quantized(codes, (scale.astype(np.float32) * s).astype(np.float16),
                                    (offset.astype(np.float32) * s).astype(np.float16), 4, group_size, False)
    assert np.array_equal(scaled.dequantize(), pw.dequantize() * s)  # exact: no fp16 subnormals
    return x.astype(np.float16), pw, (x * np.float32(2.0 ** a)).astype(np.float16), scaled


@pytest.mark.parametrize("group_size", [32, 64, 256])
@pytest.mark.parametrize("a,b", [(10, 2), (14, -2), (-8, -6), (-6, -8)])
def test_large_and_tiny_values_scale_exactly(isa, rng, a, b, group_size):
    """Activations near fp16's top with products of up to 2^12 (a naive fp16 sum overflows), or
    products near its subnormals (a naive fp16 product loses digits): every level's result is the
    unscaled problem's (checked against the reference) times 2^(a + b), bit for bit, wherever
    that is a normal fp16 value. Groups of 32 (fp16 chunks of 32 k) and 64 / 256 (chunks of 64)."""
    x, pw, xs, pws = scaled_problem(rng, a, b, group_size)
    y = qlinear.matmul_float(x, pw)
    check(y, x, pw, random_data=False)  # cancellation: the worst-case bound only
    ys = qlinear.matmul_float(xs, pws)
    expected = y.astype(np.float64) * 2.0 ** (a + b)
    normal = (np.abs(expected) >= 2.0 ** -14) & (np.abs(expected) <= 65504)
    assert normal.mean() > 0.6  # not vacuous
    assert np.array_equal(ys[normal], expected[normal].astype(np.float16))
    products = xs[0].astype(np.float32) * pws.dequantize()[0]
    if a + b > 0:  # what an fp16 accumulator without normalization and flushes would do
        with np.errstate(over="ignore"):
            assert np.isinf(np.cumsum(products.astype(np.float16), dtype=np.float16)).any()
    else:
        assert (np.abs(products) < 2.0 ** -14).mean() > 0.5


@pytest.mark.parametrize("bits,symmetric", [(4, False), (4, True), (8, False), (8, True)])
@pytest.mark.parametrize("group_size", [32, 64, 256, None])
def test_largest_chunk_sums_stay_finite(isa, bits, symmetric, group_size):
    """Every product of one sign and at the top of the normalized range (|x~| just below 16,
    |w~| just below 32): a chunk of 64 k sums to ~2^15 in fp16, below its overflow (65504). The
    result is finite, within the bound, and every level with the NEON kernels equals the twin."""
    m, k, n = 5, 320, 8
    w = np.full((n, k), 1.999, np.float32)
    x = np.full((m, k), 1.999, np.float16)
    pw = qlinear.pack_weight(w, bits=bits, group_size=group_size, symmetric=symmetric)
    wmax = np.abs(pw.dequantize()).max()
    assert wmax > 1.99  # w~ = w' * 16 > 31.8, x~ = x * 8 > 15.9: products > 2^9 - 5
    yt = twin(x, pw)
    assert np.isfinite(yt).all()
    check(yt, x, pw, random_data=False)
    y = qlinear.matmul_float(x, pw)
    check(y, x, pw, random_data=False)
    if fp16_arithmetic(pw):
        assert np.array_equal(y, yt)


def test_nan_and_inf_propagate(isa, rng):
    pw = qlinear.pack_weight(rng.standard_normal((8, 96)).astype(np.float32), bits=4, group_size=32)
    x = np.ones((3, 96), np.float16)
    x[1, 40] = np.nan
    x[2, 70] = np.inf
    y = qlinear.matmul_float(x, pw)
    assert np.isfinite(y[0]).all() and np.isnan(y[1]).all() and not np.isfinite(y[2]).any()
