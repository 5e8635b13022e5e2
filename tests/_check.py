"""Shared assertions: a kernel output against the numpy reference, within float rounding."""

import numpy as np

from qlinear import reference as ref

# A float32 epilogue adds one term per storage block, each with a few roundings: its error is
# bounded by ~(blocks + 2) * 4 ulp of the sum of the terms' magnitudes.
ULP32 = 2.0 ** -24


def assert_close_to_reference(y, x, pw, bias=None, act_block=None):
    codes, scale, offset = pw.unpack()
    qw = ref.QuantizedWeight(codes, scale, offset, pw.bits, pw.group_size, pw.symmetric)
    y_ref, mag = ref.matmul_int8(np.atleast_2d(x), qw, bias=bias, act_block=act_block,
                                 segment=pw._h.block)  # the kernels' storage block
    y = np.atleast_2d(np.asarray(y, dtype=np.float64))
    blocks = -(-pw.shape[1] // pw._h.block)
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
