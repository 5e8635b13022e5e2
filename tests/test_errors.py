"""Bad input raises TypeError / ValueError naming the problem; never a crash."""

import numpy as np
import pytest

import qlinear


@pytest.fixture
def pw(rng):
    return qlinear.pack_weight(rng.standard_normal((16, 64)).astype(np.float32), bits=4, group_size=32)


def test_pack_weight_bad_input(rng):
    w = rng.standard_normal((8, 64)).astype(np.float32)
    cases = [
        (dict(w=w, bits=3), ValueError, "bits must be 4 or 8"),
        (dict(w=w, bits=4.0), TypeError, "bits must be an int"),
        (dict(w=w, group_size=0), ValueError, "group_size must be positive"),
        (dict(w=w, group_size=-64), ValueError, "group_size must be positive"),
        (dict(w=w, group_size=48), ValueError, "multiple of 32"),
        (dict(w=w, group_size=512), ValueError, "multiple of 32"),  # < K not allowed above 256...
        (dict(w=w, group_size="64"), TypeError, "group_size must be an int"),
        (dict(w=w, symmetric="no"), TypeError, "symmetric must be a bool"),
        (dict(w=np.zeros((0, 64), np.float32)), ValueError, "non-empty"),
        (dict(w=np.zeros((8, 0), np.float32)), ValueError, "non-empty"),
        (dict(w=np.zeros(64, np.float32)), ValueError, r"shape \[N, K\]"),
        (dict(w=np.zeros((8, 64), np.int32)), TypeError, "float32"),
        (dict(w="weights"), TypeError, "numpy array or a torch tensor"),
        (dict(w=np.full((8, 64), np.nan, np.float32)), ValueError, "NaN or Inf"),
        (dict(w=np.full((8, 64), 1e30, np.float32)), ValueError, "float16 range"),
    ]
    for kwargs, exc, msg in cases:
        if kwargs.get("group_size") == 512:
            kwargs["w"] = rng.standard_normal((8, 1024)).astype(np.float32)
        with pytest.raises(exc, match=msg):
            qlinear.pack_weight(**kwargs)


def test_matmul_bad_input(pw):
    x = np.ones((2, 64), np.float32)
    cases = [
        (lambda: qlinear.matmul_w4a8(np.ones((2, 63), np.float32), pw), ValueError, "K = 63"),
        (lambda: qlinear.matmul_w4a8(np.ones((2, 64), np.float64), pw), TypeError, "float32 or float16"),
        (lambda: qlinear.matmul_w4a8(np.ones((2, 64), np.int8), pw), TypeError, "float32 or float16"),
        (lambda: qlinear.matmul_w4a8(np.ones((2, 2, 64), np.float32), pw), ValueError, r"\[M, K\]"),
        (lambda: qlinear.matmul_w4a8(np.float32(1), pw), TypeError, "numpy array or a torch"),
        (lambda: qlinear.matmul_w4a8(np.array(1, np.float32), pw), ValueError, r"\[M, K\]"),
        (lambda: qlinear.matmul_w4a8([1.0] * 64, pw), TypeError, "numpy array or a torch"),
        (lambda: qlinear.matmul_w4a8(x, "pw"), TypeError, "PackedWeight"),
        (lambda: qlinear.matmul_w8a8(x, pw), ValueError, "8-bit weight"),
        (lambda: qlinear.matmul_w4a8(x, pw, bias=np.ones(15, np.float32)), ValueError, "bias must have shape"),
        (lambda: qlinear.matmul_w4a8(x, pw, bias=np.ones(16, np.int64)), TypeError, "bias must be"),
        (lambda: qlinear.matmul_w4a8(x, pw, out=np.empty((2, 15), np.float32)), ValueError, "wrong shape"),
        (lambda: qlinear.matmul_w4a8(x, pw, out=np.empty((2, 16), np.float16)), TypeError, "dtype of x"),
        (lambda: qlinear.matmul_w4a8(x, pw, out=np.empty((16, 2), np.float32).T), ValueError, "C-contiguous"),
        (lambda: qlinear.matmul_w4a8(x, pw, out=[0.0]), TypeError, "numpy array"),
        (lambda: qlinear.matmul_w4a8(x, pw, act_block=48), ValueError, "multiple of the weight's group"),
        (lambda: qlinear.matmul_w4a8(x, pw, act_block=0), ValueError, "positive"),
        (lambda: qlinear.matmul_w4a8(x, pw, act_block=1.5), TypeError, "act_block"),
        (lambda: qlinear.matmul_w4a8(x, pw, act_block="row"), ValueError, "act_block"),
        (lambda: qlinear.matmul(x, pw, act="int4"), ValueError, "act must be"),
        (lambda: qlinear.matmul_float(np.ones((2, 65), np.float32), pw), ValueError, "K = 65"),
        (lambda: qlinear.matmul_float(np.ones((2, 64), np.int32), pw), TypeError, "float32 or float16"),
        (lambda: qlinear.matmul_float(x, "pw"), TypeError, "PackedWeight"),
        (lambda: qlinear.matmul(x, "pw", act="float"), TypeError, "PackedWeight"),
        (lambda: qlinear.quantize_activation(x, act_block=0), ValueError, "positive"),
        (lambda: qlinear.quantize_activation("x"), TypeError, "numpy array"),
        (lambda: qlinear.set_num_threads(0), ValueError, ">= 1"),
        (lambda: qlinear.set_num_threads("2"), TypeError, "int"),
        (lambda: qlinear.set_isa("avx9000"), ValueError, "unknown ISA"),
        (lambda: qlinear.kernel_info(None), TypeError, "PackedWeight"),
        (lambda: qlinear.PackedWeight(None), TypeError, "pack_weight"),
    ]
    for call, exc, msg in cases:
        with pytest.raises(exc, match=msg):
            call()


def test_read_only_out_is_rejected(pw):
    out = np.empty((2, 16), np.float32)
    out.setflags(write=False)
    with pytest.raises(ValueError, match="writeable"):
        qlinear.matmul_w4a8(np.ones((2, 64), np.float32), pw, out=out)


def test_empty_m_gives_empty_output(pw):
    y = qlinear.matmul_w4a8(np.ones((0, 64), np.float32), pw)
    assert y.shape == (0, 16)
