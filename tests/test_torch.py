"""torch CPU tensors in, torch tensors out, without copies where the layout allows."""

import numpy as np
import pytest

import qlinear
from _check import assert_close_to_reference

torch = pytest.importorskip("torch")


def test_tensors_in_and_out(rng):
    w = torch.randn(24, 128)
    pw = qlinear.pack_weight(w, bits=4, group_size=64)
    assert np.array_equal(pw.unpack()[0], qlinear.pack_weight(w.numpy(), bits=4, group_size=64).unpack()[0])
    x = torch.randn(3, 128)
    y = qlinear.matmul_w4a8(x, pw, bias=torch.ones(24))
    assert isinstance(y, torch.Tensor) and y.dtype == torch.float32 and y.shape == (3, 24)
    assert_close_to_reference(y.numpy(), x.numpy(), pw, bias=np.ones(24, np.float32), act_block=64)
    out = torch.empty(3, 24)
    assert qlinear.matmul_w4a8(x, pw, out=out) is out
    np.testing.assert_array_equal(out.numpy(), qlinear.matmul_w4a8(x.numpy(), pw))


def test_half_and_bfloat16(rng):
    pw = qlinear.pack_weight(torch.randn(16, 64, dtype=torch.bfloat16), bits=8, group_size=32)
    x16 = torch.randn(2, 64, dtype=torch.float16)
    y16 = qlinear.matmul_w8a8(x16, pw)
    assert y16.dtype == torch.float16
    xb = torch.randn(2, 64, dtype=torch.bfloat16)
    yb = qlinear.matmul_w8a8(xb, pw)
    assert yb.dtype == torch.bfloat16
    torch.testing.assert_close(yb, qlinear.matmul_w8a8(xb.float(), pw).to(torch.bfloat16))


def test_requires_grad_and_views(rng):
    lin = torch.nn.Linear(64, 8)
    pw = qlinear.pack_weight(lin.weight, bits=4, group_size=32)  # a Parameter: detached, no copy needed
    x = torch.randn(4, 128)[:, ::2]                               # a strided view
    y = qlinear.matmul_w4a8(x, pw, bias=lin.bias)
    ref = qlinear.matmul_w4a8(x.contiguous().numpy(), pw, bias=lin.bias.detach().numpy())
    np.testing.assert_array_equal(y.numpy(), ref)


def test_bad_tensors():
    pw = qlinear.pack_weight(torch.randn(8, 32))
    with pytest.raises(TypeError, match="float32, float16 or bfloat16"):
        qlinear.matmul_w4a8(torch.ones(2, 32, dtype=torch.int32), pw)
    with pytest.raises(TypeError, match="out must be a torch tensor"):
        qlinear.matmul_w4a8(torch.ones(2, 32), pw, out=np.empty((2, 8), np.float32))
