"""The block formats (qlinear.blocks: GGUF's K-quants Q2_K .. Q6_K, Q5_0 / Q4_1 / Q5_1, IQ4_NL / IQ4_XS, MXFP4) as
weight formats: file rows moved without rounding, the numpy decoder against gguf's own
dequantize, W-x-A8 and float kernels against the numpy reference over awkward shapes, every ISA
level bit for bit, rows independent of their batch, weights of parts."""

import struct
import zlib

import numpy as np
import pytest

import qlinear
from qlinear import blocks
from qlinear import reference as ref

FORMATS = list(blocks.FORMATS)
ULP32 = 2.0 ** -24
LEVELS = qlinear.cpu_info()["available_isas"]


@pytest.fixture(autouse=True)
def _restore_level():
    level = qlinear.cpu_info()["active_isa"]
    yield
    qlinear.set_isa(level)


def weights(fmt, n, k, seed=0):
    rng = np.random.default_rng(seed)
    # rows of different scales, a few outliers: sub-scales and minimums of every size
    w = rng.standard_normal((n, k)).astype(np.float32) * rng.uniform(0.01, 2, (n, 1)).astype(np.float32)
    w[rng.random((n, k)) < 0.01] *= 8
    return w


def shapes(fmt):
    s = blocks.FORMATS[fmt].super
    return [(1, 1, s), (3, 7, 2 * s), (5, 9, s), (17, 33, 3 * s), (2, 64, s + (32 if s == 32 else 0)), (8, 8, s)]


@pytest.mark.parametrize("fmt", FORMATS)
def test_decoder_equals_ggufs_dequantize(fmt):
    gguf = pytest.importorskip("gguf")
    from gguf import quants

    w = weights(fmt, 24, 2 * blocks.FORMATS[fmt].super)
    raw = blocks.quantize(w, fmt)
    want = quants.dequantize(raw, getattr(gguf.GGMLQuantizationType, fmt)).reshape(24, -1)
    np.testing.assert_array_equal(blocks.dequantize(raw, fmt, w.shape[1]), want)
    err = np.abs(want - w).max() / np.abs(w).max()
    assert err < 0.25, err   # the package's rounding lands near the weights


@pytest.mark.parametrize("fmt", FORMATS)
def test_rows_are_moved_not_rounded(fmt):
    f = blocks.FORMATS[fmt]
    rng = np.random.default_rng(1)
    n, k = 13, 2 * f.super
    raw = rng.integers(0, 256, (n, blocks.row_bytes(f, k)), dtype=np.uint8)
    # finite scales: random bytes with the float16 fields rewritten
    raw = blocks.quantize(weights(fmt, n, k), fmt) if blocks.FORMATS[fmt].has_min else _finite(raw, fmt)
    pw = qlinear.pack_blocks(raw, fmt, (n, k))
    assert pw.format == fmt and pw.shape == (n, k) and pw.bits == f.code_bits
    np.testing.assert_array_equal(pw.unpack_blocks(), raw)
    np.testing.assert_array_equal(pw.dequantize(), blocks.dequantize(raw, fmt, k))
    full = qlinear.pack_blocks(np.concatenate([raw, raw[:3]]), fmt, (n + 3, k))
    assert full.bits_per_weight == f.bits_per_weight                       # whole panels: the file's bytes
    assert pw.bits_per_weight == pytest.approx(f.bits_per_weight * 16 / 13)  # 13 rows padded to 16


def _finite(raw, fmt):
    """Random file rows whose float16 scales are finite (every code and sub-scale random)."""
    f = blocks.FORMATS[fmt]
    b = raw.reshape(raw.shape[0], -1, f.file_bytes).copy()
    at = {"Q6_K": 208, "Q3_K": 108}.get(fmt, 0)
    if fmt != "MXFP4":
        b[..., at:at + 2] = np.random.default_rng(2).uniform(-0.01, 0.01, b.shape[:2]).astype(np.float16)[..., None].view(np.uint8)
    else:
        b[..., 0] = np.clip(b[..., 0], 100, 140)
    return b.reshape(raw.shape)


@pytest.mark.parametrize("fmt", FORMATS)
def test_int8_kernels_against_the_reference(fmt):
    f = blocks.FORMATS[fmt]
    for i, (m, n, k) in enumerate(shapes(fmt)):
        w = weights(fmt, n, k, seed=i)
        pw = qlinear.pack_weight(w, format=fmt)
        raw = pw.unpack_blocks()
        x = np.random.default_rng(100 + i).standard_normal((m, k)).astype(np.float32)
        bias = np.random.default_rng(7).standard_normal(n).astype(np.float32)
        for act_block in (None, "group", 2 * f.super):
            ab = f.super if act_block == "group" else act_block
            y_ref, mag = ref.matmul_blocks_int8(x, raw, fmt, k, bias=bias, act_block=ab)
            nb = -(-k // f.super)
            for level in LEVELS:
                qlinear.set_isa(level)
                y = qlinear.matmul(x, pw, bias=bias, act_block=act_block).astype(np.float64)
                tol = 4 * (nb + 2) * ULP32 * mag + 1e-30
                assert (np.abs(y - y_ref) <= tol).all(), (level, m, n, k, act_block, np.abs(y - y_ref).max())


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_level_gives_the_same_bits(fmt):
    """The integer core is exact and the float epilogue the same operations at every level (the
    scalar kernel's FMAs included)."""
    for i, (m, n, k) in enumerate(shapes(fmt)):
        pw = qlinear.pack_weight(weights(fmt, n, k, seed=i), format=fmt)
        x = np.random.default_rng(i).standard_normal((m, k)).astype(np.float32) * 3
        qlinear.set_isa("scalar")
        want = qlinear.matmul(x, pw)
        for level in LEVELS:
            qlinear.set_isa(level)
            np.testing.assert_array_equal(qlinear.matmul(x, pw), want, err_msg=f"{level} {m}x{n}x{k}")


@pytest.mark.parametrize("fmt", FORMATS)
def test_simd_levels_run_their_own_int8_kernels(fmt):
    """Above scalar, every level multiplies block formats with SIMD kernels (AMX with AVX-512's,
    i8mm with dotprod's), not the scalar reference: the bit-for-bit tests compare real kernels."""
    pw = qlinear.pack_weight(weights(fmt, 16, blocks.FORMATS[fmt].super), format=fmt)
    for level in LEVELS:
        if level == "scalar":
            continue
        qlinear.set_isa(level)
        info = qlinear.kernel_info(pw)
        for job in ("gemv", "gemm"):
            assert not info[job].endswith("_scalar"), (level, job, info[job])


@pytest.mark.parametrize("fmt", FORMATS)
def test_rows_do_not_depend_on_their_batch(fmt):
    """Row r of an M-row matmul (GEMM tiles) is bit-identical to the one-row matmul (GEMV)."""
    k = 2 * blocks.FORMATS[fmt].super
    pw = qlinear.pack_weight(weights(fmt, 40, k), format=fmt)
    x = np.random.default_rng(3).standard_normal((11, k)).astype(np.float32)
    for level in LEVELS:
        qlinear.set_isa(level)
        y = qlinear.matmul(x, pw)
        for r in (0, 4, 10):
            np.testing.assert_array_equal(y[r], qlinear.matmul(x[r:r + 1], pw)[0], err_msg=level)


@pytest.mark.parametrize("fmt", FORMATS)
def test_float_path_equals_the_dequantized_weights(fmt):
    for i, (m, n, k) in enumerate(shapes(fmt)):
        pw = qlinear.pack_weight(weights(fmt, n, k, seed=i), format=fmt)
        x = np.random.default_rng(i).standard_normal((m, k)).astype(np.float32)
        want = x.astype(np.float64) @ pw.dequantize().astype(np.float64).T
        mag = np.abs(x).astype(np.float64) @ np.abs(pw.dequantize()).astype(np.float64).T
        for level in LEVELS:
            qlinear.set_isa(level)
            y = qlinear.matmul(x, pw, act="float")
            assert (np.abs(y - want) <= 2 * k * ULP32 * mag + 1e-30).all(), level
        y16 = qlinear.matmul(x.astype(np.float16), pw, act="float")
        assert y16.dtype == np.float16


def test_nan_and_zero_activations():
    pw = qlinear.pack_weight(weights("Q4_K", 16, 512), format="Q4_K")
    x = np.zeros((3, 512), np.float32)
    x[1, 300] = np.nan
    x[2] = 1
    y = qlinear.matmul(x, pw, act_block=256)
    assert (y[0] == 0).all() and np.isnan(y[1]).all() and np.isfinite(y[2]).all()


def test_weight_of_parts():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((40, 512)).astype(np.float32)
    parts = [qlinear.pack_weight(w[:16], format="Q4_K"), qlinear.pack_weight(w[16:19], format="Q6_K"),
             qlinear.pack_weight(w[19:], bits=4, group_size=32, symmetric=True)]
    pw = qlinear.stack_weights(parts)
    assert pw.format == "parts" and pw.shape == (40, 512) and [p.format for p in pw.parts] == ["Q4_K", "Q6_K", "affine"]
    assert pw.nbytes == sum(p.nbytes for p in parts)
    x = rng.standard_normal((5, 512)).astype(np.float32)
    bias = rng.standard_normal(40).astype(np.float32)
    y = qlinear.matmul(x, pw, bias=bias, act_block=256)
    want = np.concatenate([qlinear.matmul(x, p, act_block=256) for p in parts], 1) + bias
    np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(y[:, :16], qlinear.matmul(x, parts[0], bias=bias[:16], act_block=256))
    np.testing.assert_array_equal(pw.dequantize(), np.concatenate([p.dequantize() for p in parts]))
    with pytest.raises(ValueError, match="multiple"):
        qlinear.matmul(x, pw, act_block=32)   # not a multiple of the Q4_K part's 256
    with pytest.raises(ValueError, match="same K"):
        qlinear.stack_weights([parts[0], qlinear.pack_weight(w[:, :256], format="Q4_K")])
    with pytest.raises(TypeError):
        qlinear.stack_weights([])


def test_files_hold_block_formats_and_parts(tmp_path):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((24, 256)).astype(np.float32)
    a = qlinear.pack_weight(w, format="IQ4_XS")
    b = qlinear.stack_weights([qlinear.pack_weight(w[:8], format="MXFP4"), qlinear.pack_weight(w[8:], bits=8)])
    qlinear.save_weights(tmp_path / "w.qlw", {"a": a, "b": b})
    out, _ = qlinear.load_weights(tmp_path / "w.qlw")
    for name, pw in (("a", a), ("b", b)):
        assert out[name].format == pw.format
        np.testing.assert_array_equal(out[name].buffer, pw.buffer)
    x = rng.standard_normal((2, 256)).astype(np.float32)
    np.testing.assert_array_equal(qlinear.matmul(x, out["b"], act_block=None), qlinear.matmul(x, b, act_block=None))
    # an unknown format in a header whose checksum is right
    data = bytearray((tmp_path / "w.qlw").read_bytes())
    hlen = struct.unpack_from("<I", data, 12)[0]
    header = bytes(data[32:32 + hlen]).replace(b'"IQ4_XS"', b'"IQ9_XS"')
    data[32:32 + hlen] = header
    struct.pack_into("<I", data, 16, zlib.crc32(header))
    (tmp_path / "bad.qlw").write_bytes(bytes(data))
    with pytest.raises(ValueError, match="bad.qlw.*unknown format 'IQ9_XS'"):
        qlinear.load_weights(tmp_path / "bad.qlw")


def test_bad_input_errors():
    w = weights("Q4_K", 8, 256)
    with pytest.raises(ValueError, match="unknown block format"):
        qlinear.pack_weight(w, format="Q7_K")
    with pytest.raises(ValueError, match="NaN"):
        qlinear.pack_weight(np.full((8, 256), np.nan, np.float32), format="Q4_K")
    raw = blocks.quantize(w, "Q6_K")
    raw.reshape(8, -1)[2, 208:210] = np.array([np.inf], np.float16).view(np.uint8)
    with pytest.raises(ValueError, match="row 2 has a scale that is NaN or infinite"):
        qlinear.pack_blocks(raw, "Q6_K", (8, 256))
    pw = qlinear.pack_weight(w, format="Q4_K")
    with pytest.raises(ValueError, match="unpack_blocks"):
        pw.unpack()
    with pytest.raises(ValueError, match="K"):
        qlinear.matmul(np.zeros((1, 128), np.float32), pw)
