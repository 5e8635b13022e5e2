"""The low-memory float path (act="float"): float activations, weights dequantized in the kernel.
Outputs match x @ pw.dequantize().T to float32 rounding, at every ISA level."""

import numpy as np
import pytest

import qlinear
from qlinear._ops import act_block_size
from _check import float_path_magnitude, fp16_arithmetic, fp16_arithmetic_tolerance

CONFIGS = [(bits, sym, g) for bits in (4, 8) for sym in (False, True) for g in (32, 64, 128, 256, None)]
SHAPES = [(1, 1, 1), (1, 64, 8), (1, 100, 13), (2, 33, 9), (3, 257, 17), (4, 256, 16), (5, 129, 24),
          (7, 300, 7), (8, 512, 33), (13, 65, 40), (1, 2500, 130), (6, 2100, 9)]


def check(y, x, pw, bias=None, random_data=True):
    """Each output within the worst-case float32 error of a blocked sum, (block + blocks) ulps of
    sum |x| (|offset| + |scale q|); on random data also the norm-wise relative error <= 1e-5.
    float16 activations on a level with FP16 arithmetic: plus its bound (_check.py)."""
    w = pw.dequantize().astype(np.float64)
    x64 = np.atleast_2d(np.asarray(x, dtype=np.float64))
    ref = x64 @ w.T
    mag = float_path_magnitude(x64, pw)
    if bias is not None:
        ref = ref + np.asarray(bias, np.float64)
        mag = mag + np.abs(np.asarray(bias, np.float64))
    half = np.asarray(y).dtype == np.float16
    fp16_arith = np.asarray(x).dtype == np.float16 and fp16_arithmetic(pw)
    y = np.atleast_2d(np.asarray(y, dtype=np.float64))
    block = act_block_size(pw, "group")
    tol = (block + -(-pw.shape[1] // block) + 8) * 2.0 ** -24 * mag + 1e-30
    if half:
        tol = tol + 2.0 ** -11 * np.abs(ref)
    if fp16_arith:
        tol = tol + fp16_arithmetic_tolerance(x64, pw, mag)
    bad = ~(np.abs(y - ref) <= tol)
    assert not bad.any(), f"{bad.sum()} outputs off; worst {np.abs(y - ref).max():.3g}"
    if random_data and not half and np.linalg.norm(ref) > 0:
        assert np.linalg.norm(y - ref) / np.linalg.norm(ref) <= 1e-5


@pytest.mark.parametrize("bits,symmetric,group_size", CONFIGS)
def test_shapes_and_configs(isa, rng, bits, symmetric, group_size):
    for m, k, n in SHAPES:
        w = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
        x = rng.standard_normal((m, k)).astype(np.float32)
        pw = qlinear.pack_weight(w, bits=bits, group_size=group_size, symmetric=symmetric)
        y = qlinear.matmul(x, pw, act="float")
        assert y.shape == (m, n) and y.dtype == np.float32
        check(y, x, pw)


@pytest.mark.parametrize("bits", [4, 8])
def test_every_m_and_bias(isa, rng, bits):
    k, n = 160, 37
    pw = qlinear.pack_weight(rng.standard_normal((n, k)).astype(np.float32), bits=bits, group_size=32)
    b = rng.standard_normal(n).astype(np.float32)
    for m in list(range(1, 18)) + [64, 128]:
        x = rng.standard_normal((m, k)).astype(np.float32)
        check(qlinear.matmul_float(x, pw, bias=b), x, pw, bias=b)


def test_one_packed_weight_serves_both_modes(rng):
    w = rng.standard_normal((40, 256)).astype(np.float32)
    pw = qlinear.pack_weight(w, bits=4, group_size=64)
    x = rng.standard_normal((3, 256)).astype(np.float32)
    y_int8, y_float = qlinear.matmul(x, pw, act="int8"), qlinear.matmul(x, pw, act="float")
    y_exact = x @ pw.dequantize().T
    assert np.linalg.norm(y_float - y_exact) < np.linalg.norm(y_int8 - y_exact) / 100


@pytest.mark.parametrize("bits", [4, 8])
def test_float16_in_and_out(isa, rng, bits):
    for m, k, n in [(1, 64, 16), (3, 200, 21), (9, 1024, 8)]:
        pw = qlinear.pack_weight(rng.standard_normal((n, k)).astype(np.float32), bits=bits, group_size=64)
        x = rng.standard_normal((m, k)).astype(np.float16)
        y = qlinear.matmul_float(x, pw)
        assert y.dtype == np.float16
        check(y, x, pw)


def test_large_float16_inputs_do_not_overflow(isa, rng):
    """fp16 inputs near 65504: partial sums far beyond fp16's range (an fp16 accumulator would
    overflow to inf / NaN), results representable or not; fp32 accumulation inside."""
    k, n = 4096, 16
    w = np.abs(rng.standard_normal((n, k))).astype(np.float32) * 0.1 + 0.5
    w[8:] = np.linspace(0.5, 1.5, 8, dtype=np.float32)[:, None]  # constant rows: exact cancellation
    pw = qlinear.pack_weight(w, bits=8, group_size=128)
    x = np.full((2, k), 60000.0, np.float16)
    x[1, k // 2:] = -60000.0
    y32 = qlinear.matmul_float(x.astype(np.float32), pw)
    assert np.isfinite(y32).all() and np.abs(y32[0]).min() > 65504  # true result beyond fp16
    check(y32, x.astype(np.float32), pw, random_data=False)
    y16 = qlinear.matmul_float(x, pw)
    assert np.isinf(y16[0]).all()                 # beyond fp16: inf, as numpy's cast gives
    assert np.isfinite(y16[1, 8:]).all()          # partial sums ~1e8, total ~0
    constant_rows = qlinear.pack_quantized(*[a[8:] for a in pw.unpack()], 8, 128, False)
    check(y16[1:, 8:], x[1:], constant_rows, random_data=False)


def test_huge_float32_activations_stay_finite(isa, rng):
    pw = qlinear.pack_weight(rng.standard_normal((8, 512)).astype(np.float32), bits=4, group_size=32)
    x = rng.standard_normal((2, 512)).astype(np.float32) * 1e30
    y = qlinear.matmul_float(x, pw)
    assert np.isfinite(y).all()
    check(y, x, pw, random_data=False)


def test_nan_propagates(isa, rng):
    pw = qlinear.pack_weight(rng.standard_normal((8, 64)).astype(np.float32), bits=4, group_size=32)
    x = np.ones((2, 64), np.float32)
    x[1, 7] = np.nan
    y = qlinear.matmul_float(x, pw)
    assert np.isfinite(y[0]).all() and np.isnan(y[1]).all()


def test_normal_memory_mode_matches(rng):
    """Normal-memory mode: dequantize once, then any float GEMM (numpy BLAS here)."""
    pw = qlinear.pack_weight(rng.standard_normal((33, 300)).astype(np.float32), bits=4, group_size=64)
    x = rng.standard_normal((5, 300)).astype(np.float32)
    w32, w16 = pw.dequantize(), pw.dequantize(np.float16)
    assert w16.dtype == np.float16 and np.array_equal(w16, w32.astype(np.float16))
    check(x @ w32.T, x, pw)
    check(qlinear.matmul_float(x, pw), x, pw)
