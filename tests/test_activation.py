"""Dynamic activation quantization against the reference: codes and scales bit for bit."""

import numpy as np
import pytest

import qlinear
from qlinear import reference as ref


@pytest.mark.parametrize("block", [None, 32, 64, 128, 256])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_matches_reference(isa, rng, block, dtype):
    for m, k in [(1, 1), (1, 31), (2, 32), (3, 33), (4, 100), (5, 256), (1, 4097), (17, 130)]:
        x = (rng.standard_normal((m, k)) * rng.uniform(1e-3, 1e3)).astype(dtype)
        x[0, -1] = 0.5 * float(np.abs(x).max()) * 126.5 / 127  # near a rounding tie
        xq, s = qlinear.quantize_activation(x, block)
        xq_ref, s_ref = ref.quantize_activation(x, block)
        assert np.array_equal(xq, xq_ref)
        assert np.array_equal(s, s_ref)
        assert xq.dtype == np.int8 and s.dtype == np.float32


def test_exact_ties_round_to_even(isa):
    x = np.array([[127.0, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5]], np.float32)
    xq, s = qlinear.quantize_activation(x)
    assert s[0, 0] == 1.0
    assert xq.tolist() == [[127, 0, 2, 2, 0, -2, -2, 126]]


def test_special_values(isa):
    x = np.zeros((5, 70), np.float32)
    x[1, 3] = np.nan
    x[2, 69] = -np.inf
    x[3] = 1e-44          # scale underflows: zeros
    x[4, 0] = 3e38        # huge but finite
    for block in (None, 32):
        xq, s = qlinear.quantize_activation(x, block)
        xq_ref, s_ref = ref.quantize_activation(x, block)
        assert np.array_equal(xq, xq_ref)
        np.testing.assert_array_equal(s, s_ref)  # NaN == NaN here
        assert np.isnan(s[1]).any() and np.isnan(s[2]).any()
        assert (xq[0] == 0).all() and (s[0] == 0).all()


def test_vector_and_torch(rng):
    x = rng.standard_normal(96).astype(np.float32)
    xq, s = qlinear.quantize_activation(x, 32)
    assert xq.shape == (96,) and s.shape == (3,)
