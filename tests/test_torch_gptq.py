"""GPTQ in qlinear.torch: error feedback through the inverse Hessian of the calibration inputs."""

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import qlinear  # noqa: E402
import qlinear.torch as qt  # noqa: E402
from qlinear._scheme import qrange, zero_point  # noqa: E402
from qlinear.torch.quantize import fake_quantize_weight, gptq_quantize  # noqa: E402


def _correlated_inputs(rows, k, seed=0):
    """Inputs with strongly correlated channels (a low-rank mix plus noise) and uneven scales."""
    g = torch.Generator().manual_seed(seed)
    mix = torch.randn(k // 4, k, generator=g)
    x = torch.randn(rows, k // 4, generator=g) @ mix + 0.1 * torch.randn(rows, k, generator=g)
    return x * (torch.rand(k, generator=g) + 0.5)


def _rel(x, w, wq):
    ref = x @ w.T
    return float((x @ wq.T - ref).norm() / ref.norm())


@pytest.mark.parametrize("bits,group_size,symmetric", [(4, 32, False), (4, 128, False), (4, 64, True),
                                                       (8, 128, False), (4, None, False)])
def test_gptq_beats_round_to_nearest_on_held_out_rows(bits, group_size, symmetric):
    g = torch.Generator().manual_seed(1)
    w = torch.randn(48, 256, generator=g) * 0.05
    x = _correlated_inputs(1024, 256, seed=2)
    held_out = _correlated_inputs(512, 256, seed=2)[256:]  # same distribution, other rows
    x = x[:768]
    res = gptq_quantize(w, x.double().T @ x.double(), bits, group_size, symmetric)
    rtn = fake_quantize_weight(w, bits, group_size, symmetric)
    assert _rel(held_out, w, res.weight) < 0.8 * _rel(held_out, w, rtn)


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("act_order", [False, True])
def test_codes_in_range_and_packed_exactly(symmetric, act_order):
    w = torch.randn(24, 200) * 0.1  # K not a multiple of the group: a shorter last group
    x = _correlated_inputs(400, 200, seed=3)
    res = gptq_quantize(w, x.double().T @ x.double(), 4, 64, symmetric, clip=True, act_order=act_order)
    qmin, qmax = qrange(4, symmetric)
    zp = zero_point(4, symmetric)
    assert res.codes.dtype == torch.uint8 and res.codes.shape == (24, 200)
    assert int(res.codes.min()) >= qmin + zp and int(res.codes.max()) <= qmax + zp
    pw = res.pack()
    codes, scale, offset = pw.unpack()
    np.testing.assert_array_equal(codes, res.codes.numpy())
    np.testing.assert_array_equal(scale, res.scale.numpy())
    if symmetric:
        assert offset is None
    else:
        np.testing.assert_array_equal(offset, res.offset.numpy())
    np.testing.assert_array_equal(pw.dequantize(), res.weight.numpy())  # GPTQ optimized what runs
    xs = torch.randn(5, 200)
    y = qlinear.matmul_w4a8(xs, pw, act_block=None)
    assert float((y - xs @ res.weight.T).norm() / (xs @ res.weight.T).norm()) < 0.02


def test_deterministic_and_act_order():
    w = torch.randn(32, 128) * 0.1
    x = _correlated_inputs(512, 128, seed=4)
    h = x.double().T @ x.double()
    a = gptq_quantize(w, h, 4, 32)
    b = gptq_quantize(w, h, 4, 32)
    assert torch.equal(a.codes, b.codes) and torch.equal(a.scale, b.scale) and torch.equal(a.offset, b.offset)
    ao = gptq_quantize(w, h, 4, 32, act_order=True)
    assert not torch.equal(ao.codes, a.codes)
    rtn = _rel(x, w, fake_quantize_weight(w, 4, 32))
    assert _rel(x, w, ao.weight) < rtn and _rel(x, w, a.weight) < rtn
    # a dead input channel (never active in calibration) is handled
    h[5, :] = 0
    h[:, 5] = 0
    assert torch.isfinite(gptq_quantize(w, h, 4, 32).weight).all()


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(128, 256), nn.GELU(), nn.Linear(256, 64)).eval()


def _batches(n=6, seed=5):
    """Rows of one fixed correlated distribution (the mix); ``seed`` draws the rows."""
    mix = torch.randn(16, 128, generator=torch.Generator().manual_seed(99))
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(64, 16, generator=g) @ mix + 0.2 * torch.randn(64, 128, generator=g) for _ in range(n)]


def _model_err(model, qmodel, xs):
    with torch.inference_mode():
        ref, y = model(xs), qmodel(xs)
    return float((y - ref).norm() / ref.norm())


@pytest.mark.parametrize("smooth,clip,budget", [(None, False, None), ("search", True, None), (None, False, 5.8)])
def test_quantize_model_gptq(smooth, clip, budget):
    model = _mlp()
    calib = qt.calibrate(model, _batches(), hessian=True)
    assert calib["0"].xtx.shape == (128, 128) and calib["0"].xtx.dtype == torch.float64
    held_out = torch.cat(_batches(3, seed=6))  # rows not used for calibration
    kw = dict(bits=4, group_size=32 if budget is None else 64, smooth=smooth, clip_search=clip, bits_budget=budget, calibration=calib)
    rtn, gptq = copy.deepcopy(model), copy.deepcopy(model)
    s_rtn = qt.quantize_model(rtn, **kw)
    s_gptq = qt.quantize_model(gptq, method="gptq", **kw)
    assert [r["method"] for r in s_gptq.layers] == ["gptq", "gptq"]
    assert [r["method"] for r in s_rtn.layers] == ["rtn", "rtn"]
    if budget is not None:
        assert s_gptq.bits_per_weight <= budget and any(r["bits"] == 8 for r in s_gptq.layers)
    assert "gptq" in str(s_gptq)
    assert _model_err(model, gptq, held_out) < 0.9 * _model_err(model, rtn, held_out)
    again = copy.deepcopy(model)
    qt.quantize_model(again, method="gptq", **kw)
    assert torch.equal(again[0].packed, gptq[0].packed) and torch.equal(again[2].packed, gptq[2].packed)


def test_gptq_bad_arguments():
    model = _mlp()
    calib = qt.calibrate(model, _batches(2))
    with pytest.raises(ValueError, match="method must be 'rtn' or 'gptq'"):
        qt.quantize_model(copy.deepcopy(model), method="awq", calibration=calib)
    with pytest.raises(TypeError, match="method must be a str"):
        qt.quantize_model(copy.deepcopy(model), method=None)
    with pytest.raises(ValueError, match="needs calibration"):
        qt.quantize_model(copy.deepcopy(model), method="gptq")
    with pytest.raises(ValueError, match="hessian=True"):
        qt.quantize_model(copy.deepcopy(model), method="gptq", calibration=calib)
    with pytest.raises(TypeError, match="act_order must be a bool"):
        qt.quantize_model(copy.deepcopy(model), method="gptq", calibration=calib, act_order=1)
    with pytest.raises(ValueError, match="act_order applies"):
        qt.quantize_model(copy.deepcopy(model), act_order=True)
    with pytest.raises(TypeError, match="hessian must be a bool"):
        qt.calibrate(model, _batches(1), hessian="yes")
    with pytest.raises(ValueError, match="hessian must have shape"):
        gptq_quantize(torch.randn(4, 32), torch.eye(16))
    for damp in (0, -0.1, True, "0.1"):
        with pytest.raises(ValueError, match="damp must be a positive number"):
            qt.quantize_model(copy.deepcopy(model), method="gptq", calibration=calib, damp=damp)


def test_strong_dampening_tends_to_round_to_nearest():
    """damp adds a multiple of the mean diagonal to X^T X: large, the Hessian is nearly a scaled
    identity and GPTQ's feedback vanishes (round to nearest); small, the fit to X is tighter."""
    w = torch.randn(32, 128) * 0.1
    x = _correlated_inputs(512, 128, seed=6)
    h = x.double().T @ x.double()
    rtn = fake_quantize_weight(w, 4, 32)
    strong = gptq_quantize(w, h, 4, 32, damp=1e2).weight
    weak = gptq_quantize(w, h, 4, 32, damp=1e-3).weight
    assert (strong - rtn).abs().max() < (weak - rtn).abs().max()
    assert _rel(x, w, weak) < _rel(x, w, strong)
