"""Shared assertions: a kernel output against the numpy reference, within float rounding."""

import numpy as np

import qlinear
from qlinear._ops import act_block_size
from qlinear import reference as ref

# A float32 epilogue adds one term per storage block, each with a few roundings: its error is
# bounded by ~(blocks + 2) * 4 ulp of the sum of the terms' magnitudes.
ULP32 = 2.0 ** -24


def assert_close_to_reference(y, x, pw, bias=None, act_block=None):
    codes, scale, offset = pw.unpack()
    qw = ref.QuantizedWeight(codes, scale, offset, pw.bits, pw.group_size, pw.symmetric)
    y_ref, mag = ref.matmul_int8(np.atleast_2d(x), qw, bias=bias, act_block=act_block,
                                 segment=act_block_size(pw, "group"))  # the kernels' storage block
    y = np.atleast_2d(np.asarray(y, dtype=np.float64))
    blocks = -(-pw.shape[1] // act_block_size(pw, "group"))
    tol = 4 * (blocks + 2) * ULP32 * mag + 1e-30
    if np.asarray(x).dtype == np.float16 or np.asarray(y).dtype == np.float16:
        tol = tol + 2.0 ** -11 * np.abs(y_ref) + 2.0 ** -24
    err = np.abs(y - y_ref)
    bad = ~(err <= tol)
    assert not bad.any(), (
        f"{bad.sum()} of {bad.size} outputs differ from the reference: worst err {err.max():.3g} "
        f"with tol {tol.flat[np.argmax(err - tol)]:.3g}")
    return y_ref


def float_path_magnitude(x, pw):
    """sum_k |x| (|offset'| + |scale * code|), offset' = offset or -zero_point * scale: the scale of
    the float path's rounding, whose kernels may sum scale * sum(x code) and offset' * sum(x)
    apart (they cancel where |w'| << |offset'|)."""
    codes, scale, offset = pw.unpack()
    g = pw.group_size
    k = codes.shape[1]
    per_k = lambda a: np.repeat(a.astype(np.float64), g, axis=1)[:, :k]  # noqa: E731
    s = per_k(scale)
    off = -ref.zero_point(pw.bits, pw.symmetric) * s if offset is None else per_k(offset)
    terms = np.abs(s * codes) + np.abs(off)
    with np.errstate(invalid="ignore", over="ignore"):
        return np.abs(np.atleast_2d(np.asarray(x, dtype=np.float64))) @ terms.T


# The float path in FP16 arithmetic (ARM fp16 level and above, float16 activations), see
# csrc/qlinear/core/fp16_path.h: per chunk of 64 k (32 at the end of an odd block), w' rounded to fp16
# (1 rounding), 4 FMA chains of 16 and 2 additions in fp16: 19 roundings of u = 2^-11 relative to
# sum |x| |w'| to first order; 20 covers the second-order terms. Products and sums are normalized by powers of two, so neither
# overflow nor fp16 subnormals can hurt beyond ~2^-25 per operation in normalized units, where
# the block's largest |x| is >= 8 and largest |w'| >= 16: at most 2^-31 * K * max|x| * max|w'|.
U16 = 2.0 ** -11
FP16_ARITHMETIC_UNITS = 20


def fp16_arithmetic(pw):
    """Whether float16 activations take FP16-arithmetic kernels at the active level."""
    return "f16_" in qlinear.kernel_info(pw)["gemv_float16"]


def fp16_arithmetic_tolerance(x, pw, mag):
    """Extra error bound of the FP16-arithmetic float path over the float32 one, per output."""
    x = np.abs(np.atleast_2d(np.asarray(x, dtype=np.float64)))
    wmax = np.abs(pw.dequantize().astype(np.float64)).max(axis=1)
    with np.errstate(invalid="ignore", over="ignore"):
        tiny = 2.0 ** -30 * x.shape[1] * x.max(axis=1)[:, None] * wmax[None, :]
        return FP16_ARITHMETIC_UNITS * U16 * mag + tiny


def assert_float_path_close(y, x, pw, bias=None, random_data=True):
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
