"""W4A8 / W8A8 kernels against the numpy reference, at every ISA level of this machine."""

import itertools

import numpy as np
import pytest

import qlinear
from qlinear._ops import act_block_size
from qlinear import reference as ref
from _check import assert_close_to_reference

CONFIGS = [(bits, sym, g) for bits in (4, 8) for sym in (False, True) for g in (32, 64, 128, 256, None)]
SHAPES = [(1, 1, 1), (1, 64, 8), (1, 100, 13), (2, 33, 9), (3, 257, 17), (4, 256, 16), (5, 129, 24),
          (7, 300, 7), (8, 512, 33), (13, 65, 40), (1, 1024, 130)]


def run(x, pw, act_block):
    return qlinear.matmul(x, pw, act_block="group" if act_block == "group" else act_block)


def act_block_of(pw, act_block):
    return act_block_size(pw, "group") if act_block == "group" else act_block


@pytest.mark.parametrize("bits,symmetric,group_size", CONFIGS)
@pytest.mark.parametrize("act_block", [None, "group"])
def test_shapes_and_configs(isa, rng, bits, symmetric, group_size, act_block):
    for m, k, n in SHAPES:
        w = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
        x = rng.standard_normal((m, k)).astype(np.float32)
        pw = qlinear.pack_weight(w, bits=bits, group_size=group_size, symmetric=symmetric)
        y = run(x, pw, act_block)
        assert y.shape == (m, n) and y.dtype == np.float32
        assert_close_to_reference(y, x, pw, act_block=act_block_of(pw, act_block))


@pytest.mark.parametrize("bits", [4, 8])
def test_every_m(isa, rng, bits):
    """M = 1..17, 64, 128: GEMV and every GEMM row-tile remainder."""
    k, n = 160, 37
    w = rng.standard_normal((n, k)).astype(np.float32)
    pw = qlinear.pack_weight(w, bits=bits, group_size=32)
    for m in list(range(1, 18)) + [64, 128]:
        x = rng.standard_normal((m, k)).astype(np.float32)
        assert_close_to_reference(qlinear.matmul(x, pw), x, pw, act_block=32)


@pytest.mark.parametrize("bits,symmetric,group_size", [(4, False, 32), (4, True, 128), (4, False, None),
                                                       (8, False, 64), (8, True, None)])
def test_prefill_gemm_tiles(isa, rng, bits, symmetric, group_size):
    """Prompt-sized M: row tiles and their remainders, row chunks (long K: fewer rows per chunk),
    odd panel counts and a partial last panel, with bias."""
    for m, k, n in [(12, 64, 16), (14, 200, 24), (40, 96, 43), (97, 64, 8), (80, 3000, 17)]:
        w = rng.standard_normal((n, k)).astype(np.float32)
        bias = rng.standard_normal(n).astype(np.float32)
        x = rng.standard_normal((m, k)).astype(np.float32)
        pw = qlinear.pack_weight(w, bits=bits, group_size=group_size, symmetric=symmetric)
        for ab in (None, "group"):
            y = qlinear.matmul(x, pw, bias=bias, act_block="group" if ab else None)
            assert_close_to_reference(y, x, pw, bias=bias, act_block=act_block_of(pw, ab))


@pytest.mark.parametrize("bits", [4, 8])
def test_integer_sums_at_their_bounds(isa, bits):
    """Largest codes times +-127 in every k: the integer sums reach their extremes (for int4
    the s16 partial sums of 32 k reach 30480) and must stay exact."""
    k, n = 256, 24
    hi = 15 if bits == 4 else 255
    w = np.full((n, k), float(hi), np.float32)
    w[:, ::64] = 0  # every group holds both ends: scale 1, offset 0
    pw = qlinear.pack_weight(w, bits=bits, group_size=64)
    assert np.array_equal(pw.dequantize(), w)
    for m in (1, 5, 16):
        for sign in (1, -1):
            x = np.full((m, k), sign * 127.0, np.float32)
            expected = x.astype(np.int64) @ w.astype(np.int64).T
            assert np.array_equal(qlinear.matmul(x, pw), expected.astype(np.float32))


@pytest.mark.parametrize("bits,symmetric,group_size", CONFIGS + [(4, False, 96), (8, True, 96)])
def test_row_tiles(isa, rng, bits, symmetric, group_size):
    """M around 16- and 32-row tiles (the amx GEMM's; the other levels' row tails), odd and even
    panel counts, blocks of 32 + 64j k (half-depth tile steps)."""
    for m, k, n in [(16, 96, 8), (17, 200, 24), (31, 64, 17), (32, 160, 40), (33, 300, 9),
                    (48, 257, 16), (130, 128, 33)]:
        w = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
        x = rng.standard_normal((m, k)).astype(np.float32)
        pw = qlinear.pack_weight(w, bits=bits, group_size=group_size, symmetric=symmetric)
        bias = rng.standard_normal(n).astype(np.float32)
        for act_block in (None, "group"):
            y = qlinear.matmul(x, pw, bias=bias, act_block="group" if act_block == "group" else None)
            assert_close_to_reference(y, x, pw, bias=bias, act_block=act_block_of(pw, act_block))


@pytest.mark.parametrize("group_size", [32, 64, 128, 256])
def test_k_around_group_edges(isa, rng, group_size):
    n = 11
    for k in sorted({1, 2, 7, 31, group_size - 1, group_size, group_size + 1, 2 * group_size - 1,
                     2 * group_size, 2 * group_size + 1, 3 * group_size + 5}):
        w = rng.standard_normal((n, k)).astype(np.float32)
        x = rng.standard_normal((3, k)).astype(np.float32)
        for bits, sym in itertools.product((4, 8), (False, True)):
            pw = qlinear.pack_weight(w, bits=bits, group_size=group_size, symmetric=sym)
            for ab in (None, "group"):
                assert_close_to_reference(run(x, pw, ab), x, pw, act_block=act_block_of(pw, ab))


def integer_weights(rng, n, k, g, bits, symmetric):
    """Weights whose quantization is exact: scale 1, offset 0, q = w (each group holds both ends)."""
    lo, hi = ref.qrange(bits, symmetric)
    if symmetric:
        lo = -hi
    w = rng.integers(lo, hi + 1, size=(n, k)).astype(np.float32)
    for j in range(0, k, g):
        w[:, j] = lo
        w[:, min(j + 1, k - 1)] = hi
    return w


@pytest.mark.parametrize("bits,symmetric", [(4, False), (4, True), (8, False), (8, True)])
@pytest.mark.parametrize("group_size", [32, 64, 256, None])
def test_integer_core_is_exact(isa, rng, bits, symmetric, group_size):
    """Integer data makes every scale 1: the output is the exact int32 sum, bit for bit."""
    # m >= 12 takes the prefill GEMM (blocks of two panels unpacked, 3-row tiles, row chunks)
    for m, k, n in [(1, 256, 24), (5, 96, 9), (4, 1000, 16), (1, 4098, 8), (13, 320, 40), (20, 1000, 19)]:
        g = k if group_size is None else group_size
        w = integer_weights(rng, n, k, min(g, k), bits, symmetric)
        x = rng.integers(-127, 128, size=(m, k)).astype(np.float32)
        pw = qlinear.pack_weight(w, bits=bits, group_size=group_size, symmetric=symmetric)
        x[:, ::act_block_size(pw, "group")] = 127  # absmax 127 in every activation block: activation scale 1
        assert np.array_equal(pw.dequantize(), w)
        expected = x.astype(np.int64) @ w.astype(np.int64).T
        for ab in (None, "group"):
            y = run(x, pw, ab)
            assert np.array_equal(y, expected.astype(np.float32)), (m, k, n, ab)


@pytest.mark.parametrize("bits", [4, 8])
def test_float16_in_and_out(isa, rng, bits):
    for m, k, n in [(1, 64, 16), (3, 200, 21), (9, 128, 8)]:
        w = rng.standard_normal((n, k)).astype(np.float32)
        x = rng.standard_normal((m, k)).astype(np.float16)
        pw = qlinear.pack_weight(w, bits=bits, group_size=64)
        for ab in (None, "group"):
            y = run(x, pw, ab)
            assert y.dtype == np.float16 and y.shape == (m, n)
            assert_close_to_reference(y, x, pw, act_block=act_block_of(pw, ab))


def test_bias_out_and_vector_input(isa, rng):
    k, n = 96, 20
    w = rng.standard_normal((n, k)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    pw = qlinear.pack_weight(w, bits=4, group_size=32)
    x = rng.standard_normal(k).astype(np.float32)
    y = qlinear.matmul_w4a8(x, pw, bias=b)
    assert y.shape == (n,)
    assert_close_to_reference(y, x, pw, bias=b, act_block=32)
    out = np.empty((n,), np.float32)
    assert qlinear.matmul_w4a8(x, pw, bias=b, out=out) is out
    assert np.array_equal(out, y)
    x2 = rng.standard_normal((5, k)).astype(np.float32)
    out2 = np.full((5, n), np.nan, np.float32)
    qlinear.matmul_w4a8(x2, pw, bias=b.astype(np.float16), out=out2)
    assert_close_to_reference(out2, x2, pw, bias=b.astype(np.float16), act_block=32)


def test_non_contiguous_inputs(isa, rng):
    k, n = 128, 24
    w = rng.standard_normal((n, k)).astype(np.float32)
    pw = qlinear.pack_weight(w, bits=8, group_size=64)
    big = rng.standard_normal((12, 2 * k)).astype(np.float32)
    for x in (big[::2, :k], big[:, ::2], big[3:9, 5:5 + k], np.asfortranarray(big[:, :k])):
        y = qlinear.matmul_w8a8(x, pw, act_block=None)
        assert_close_to_reference(y, np.ascontiguousarray(x), pw)
        assert np.array_equal(y, qlinear.matmul_w8a8(np.ascontiguousarray(x), pw, act_block=None))


def test_larger_act_block_is_a_multiple_of_the_group(isa, rng):
    w = rng.standard_normal((16, 512)).astype(np.float32)
    x = rng.standard_normal((3, 512)).astype(np.float32)
    pw = qlinear.pack_weight(w, bits=4, group_size=64)
    for ab in (128, 256, 512, 4096):
        assert_close_to_reference(qlinear.matmul(x, pw, act_block=ab), x, pw, act_block=ab)
    pc = qlinear.pack_weight(w, bits=4, group_size=None)  # per-channel: stored in blocks of 256
    assert_close_to_reference(qlinear.matmul(x, pc, act_block=256), x, pc, act_block=256)


def test_levels_agree_to_rounding(rng):
    """Every level against the scalar oracle on a mid-size problem, GEMV and GEMM."""
    w = rng.standard_normal((300, 1000)).astype(np.float32)
    for m in (1, 6):
        x = rng.standard_normal((m, 1000)).astype(np.float32)
        for bits in (4, 8):
            pw = qlinear.pack_weight(w, bits=bits, group_size=128)
            outs = {}
            for level in qlinear.cpu_info()["available_isas"]:
                qlinear.set_isa(level)
                outs[level] = qlinear.matmul(x, pw)
            qlinear.set_isa(qlinear.cpu_info()["best_isa"])
            for level, y in outs.items():
                np.testing.assert_allclose(y, outs["scalar"], rtol=2e-5, atol=2e-5 * np.abs(outs["scalar"]).max())


def test_nan_and_inf_activations_make_their_rows_nan(isa, rng):
    w = rng.standard_normal((16, 128)).astype(np.float32)
    pw = qlinear.pack_weight(w, bits=4, group_size=64)
    x = rng.standard_normal((4, 128)).astype(np.float32)
    x[1, 5] = np.nan
    x[2, 100] = np.inf
    y = qlinear.matmul(x, pw, act_block=None)
    assert np.isnan(y[1]).all() and np.isnan(y[2]).all()
    assert np.isfinite(y[[0, 3]]).all()
    assert_close_to_reference(y[[0, 3]], x[[0, 3]], pw)


def test_zero_and_tiny_activations(isa):
    w = np.linspace(-1, 1, 16 * 64, dtype=np.float32).reshape(16, 64)
    pw = qlinear.pack_weight(w, bits=8, group_size=32)
    x = np.zeros((3, 64), np.float32)
    x[1, 3] = 1e-44  # subnormal: its scale (x / 127) underflows to zero
    x[2, :] = 1e-30
    y = qlinear.matmul(x, pw, act_block=None)
    assert np.array_equal(y[:2], np.zeros((2, 16), np.float32))
    assert_close_to_reference(y, x, pw)


@pytest.mark.parametrize("bits", [4, 8])
def test_rows_equal_single_rows(isa, rng, bits):
    """Row m of an M-row W4A8 / W8A8 matmul equals the one-row matmul of that row, bit for bit
    (M 1..16, and 32): what makes a sequence's logits independent of the other sequences decoded
    with it (qlinear.llm.serve). The float path does not promise it."""
    k, n = 320, 72
    for group_size in (32, None):
        pw = qlinear.pack_weight(rng.standard_normal((n, k)).astype(np.float32), bits=bits, group_size=group_size)
        bias = rng.standard_normal(n).astype(np.float32)
        for act_block in ("group", None):
            for m in list(range(1, 17)) + [32]:
                x = rng.standard_normal((m, k)).astype(np.float32)
                rows = qlinear.matmul(x, pw, bias=bias, act_block=act_block)
                for i in range(m):
                    one = qlinear.matmul(x[i:i + 1], pw, bias=bias, act_block=act_block)
                    assert np.array_equal(rows[i:i + 1], one), (isa, bits, group_size, act_block, m, i)
