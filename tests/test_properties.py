"""Property-based tests over the public API: every call either returns the reference's answer
or raises TypeError / ValueError -- never a crash, a hang or a wrong answer.

The default run draws a few hundred examples; `pytest -m slow` runs the long one (>= 10,000)."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import qlinear
from qlinear._ops import act_block_size
from _check import assert_close_to_reference, float_path_magnitude, fp16_arithmetic, fp16_arithmetic_tolerance

GROUPS = st.sampled_from([32, 64, 128, 256, None])
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(max_examples=10_000, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def problems(draw):
    m = draw(st.sampled_from([0, 1, 1, 2, 3, 5, 7, 16, 31]))
    k = draw(st.one_of(st.integers(1, 300), st.sampled_from([509, 1021, 2048, 4099])))
    n = draw(st.integers(1, 40))
    bits = draw(st.sampled_from([4, 8]))
    sym = draw(st.booleans())
    group = draw(GROUPS)
    dtype = draw(st.sampled_from([np.float32, np.float16]))
    scale = draw(st.sampled_from([1e-3, 1.0, 1e3]))
    seed = draw(st.integers(0, 2**32 - 1))
    special = draw(st.sampled_from([None, "nan", "inf", "zero_row", "denormal", "huge"]))
    layout = draw(st.sampled_from(["c", "strided_rows", "strided_cols", "fortran"]))
    act = draw(st.sampled_from([None, "group", "float"]))
    return m, k, n, bits, sym, group, dtype, scale, seed, special, layout, act


def make_x(rng, m, k, dtype, scale, special, layout):
    x = (rng.standard_normal((m, k)) * scale).astype(np.float32)
    if m and special == "nan":
        x[rng.integers(m), rng.integers(k)] = np.nan
    elif m and special == "inf":
        x[rng.integers(m), rng.integers(k)] = -np.inf
    elif m and special == "zero_row":
        x[rng.integers(m)] = 0
    elif m and special == "denormal":
        x[rng.integers(m)] = 1e-42
    elif m and special == "huge" and dtype == np.float32:
        x[rng.integers(m), rng.integers(k)] = 3e38
    x = x.astype(dtype)
    if layout == "strided_rows":
        big = np.zeros((2 * m, k), dtype)
        big[::2] = x
        x = big[::2]
    elif layout == "strided_cols":
        big = np.zeros((m, 2 * k), dtype)
        big[:, ::2] = x
        x = big[:, ::2]
    elif layout == "fortran":
        x = np.asfortranarray(x)
    return x


def check_problem(p):
    m, k, n, bits, sym, group, dtype, scale, seed, special, layout, act = p
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((n, k)) * 0.1).astype(np.float32)
    pw = qlinear.pack_weight(w, bits=bits, group_size=group, symmetric=sym)
    x = make_x(rng, m, k, dtype, scale, special, layout)
    if act == "float":
        y = qlinear.matmul(x, pw, act="float")
        assert y.shape == (m, n) and y.dtype == dtype
        if m == 0:
            return
        x64, w64 = np.ascontiguousarray(x).astype(np.float64), pw.dequantize().astype(np.float64)
        with np.errstate(invalid="ignore", over="ignore"):
            ref = x64 @ w64.T
            mag = float_path_magnitude(x64, pw)
            bad_rows = ~np.isfinite(x64).all(axis=1)
            ok = np.isfinite(ref) & (np.abs(ref) < (6e4 if dtype == np.float16 else 1e37)) & ~bad_rows[:, None]
            tol = (act_block_size(pw, "group") + k // 32 + 16) * 2.0 ** -24 * mag
            if dtype == np.float16:
                tol = tol + 2.0 ** -10 * np.abs(ref) + 2.0 ** -24  # float16 subnormal spacing
                if fp16_arithmetic(pw):
                    tol = tol + fp16_arithmetic_tolerance(x64, pw, mag)
            err = np.abs(y.astype(np.float64) - ref)
        assert not np.isfinite(y[bad_rows]).any()  # NaN, or +-inf where x held an infinity
        assert (err[ok] <= tol[ok] + 1e-30).all()
        return
    y = qlinear.matmul(x, pw, act="int8", act_block=act)
    assert y.shape == (m, n) and y.dtype == dtype
    if m == 0:
        return
    xc = np.ascontiguousarray(x)
    bad_rows = ~np.isfinite(xc.astype(np.float32)).all(axis=1)
    assert np.isnan(y[bad_rows]).all()
    good = ~bad_rows
    if good.any():
        ab = act_block_size(pw, "group") if act == "group" else None
        with np.errstate(over="ignore"):
            if dtype == np.float16 and not np.isfinite(y[good]).all():
                return  # the true result exceeds float16's range: inf is the right answer
        assert_close_to_reference(y[good], xc[good], pw, act_block=ab)


@FAST
@given(problems())
def test_matmul_properties(p):
    check_problem(p)


@pytest.mark.slow
@SLOW
@given(problems())
def test_matmul_properties_long(p):
    check_problem(p)


BAD_VALUES = st.one_of(st.none(), st.integers(-5, 600), st.floats(allow_nan=True), st.text(max_size=3),
                       st.just(np.zeros((2, 2), np.int16)), st.just(np.zeros((0, 3), np.float32)),
                       st.just(np.zeros((3,), np.float64)), st.just([1.0, 2.0]))


@FAST
@given(w=BAD_VALUES, bits=BAD_VALUES, group=BAD_VALUES, sym=BAD_VALUES)
def test_pack_weight_bad_arguments_raise_cleanly(w, bits, group, sym):
    try:
        qlinear.pack_weight(w, bits=bits, group_size=group, symmetric=sym)
    except (TypeError, ValueError):
        pass


@FAST
@given(x=BAD_VALUES, bias=BAD_VALUES, out=BAD_VALUES, act_block=BAD_VALUES)
def test_matmul_bad_arguments_raise_cleanly(x, bias, out, act_block):
    pw = qlinear.pack_weight(np.ones((3, 2), np.float32), bits=4, group_size=None)
    for fn in (lambda: qlinear.matmul_w4a8(x, pw, bias=bias, out=out, act_block=act_block),
               lambda: qlinear.matmul_float(x, pw, bias=bias, out=out)):
        try:
            fn()
        except (TypeError, ValueError):
            pass
