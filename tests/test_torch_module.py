"""qlinear.torch: QLinear against matmul_*, quantize_model, smoothing, torch.compile / jit.trace,
state_dict round trips."""

import io

import numpy as np
import pytest

import qlinear

torch = pytest.importorskip("torch")
qt = pytest.importorskip("qlinear.torch")
nn = torch.nn


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.mark.parametrize("bits,group,act,act_block", [
    (4, 32, "int8", "group"), (4, 64, "int8", None), (8, 128, "int8", "group"), (4, None, "int8", "group"),
    (4, 32, "float", "group"), (8, 64, "float", None)])
def test_qlinear_equals_matmul(bits, group, act, act_block):
    lin = nn.Linear(200, 72)
    q = qt.QLinear.from_linear(lin, bits=bits, group_size=group, act=act, act_block=act_block)
    pw = qlinear.pack_weight(lin.weight, bits=bits, group_size=group)
    assert np.array_equal(q.packed.numpy(), pw.buffer)
    x = torch.randn(2, 7, 200)
    with torch.inference_mode():
        y = q(x)
    ref = qlinear.matmul(x.reshape(14, 200), pw, bias=lin.bias, act=act, act_block=act_block)
    assert y.shape == (2, 7, 72) and y.dtype == torch.float32
    torch.testing.assert_close(y.reshape(14, 72), ref, rtol=0, atol=0)
    if bits == 4 and act == "int8":
        torch.testing.assert_close(y.reshape(14, 72), qlinear.matmul_w4a8(x.reshape(14, 200), pw, bias=lin.bias,
                                                                         act_block=act_block), rtol=0, atol=0)


def test_dtypes_and_no_bias():
    lin = nn.Linear(64, 24, bias=False)
    q = qt.QLinear.from_linear(lin, bits=8, group_size=32)
    pw = qlinear.pack_weight(lin.weight, bits=8, group_size=32)
    for dt in (torch.float16, torch.bfloat16):
        x = torch.randn(5, 64).to(dt)
        with torch.inference_mode():
            y = q(x)
        assert y.dtype == dt and y.shape == (5, 24)
        torch.testing.assert_close(y, qlinear.matmul_w8a8(x, pw))
    with torch.inference_mode():
        assert q(torch.randn(64)).shape == (24,)


def test_packed_weight_view_and_repr():
    lin = nn.Linear(96, 16)
    q = qt.QLinear.from_linear(lin, bits=4, group_size=32)
    np.testing.assert_array_equal(q.weight.dequantize().numpy(),
                                  qlinear.pack_weight(lin.weight, bits=4, group_size=32).dequantize())
    assert q.weight.shape == (16, 96) and "int4" in repr(q)
    with pytest.raises(ValueError, match="act"):
        qt.QLinear.from_linear(lin, act="int4")
    with pytest.raises(TypeError):
        qt.QLinear.from_linear(nn.Conv1d(3, 3, 1))


def _toy():
    return nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 32), nn.LayerNorm(32), nn.Linear(32, 8))


def test_quantize_model_summary_and_skip():
    model = _toy().eval()
    x = torch.randn(4, 64)
    with torch.inference_mode():
        ref = model(x)
    summary = qt.quantize_model(model, bits=4, group_size=32, skip=["4"])
    assert summary.replaced == 2 and isinstance(model[0], qt.QLinear) and isinstance(model[4], nn.Linear)
    assert summary.bytes_before == (64 * 128 + 128 + 128 * 32 + 32) * 4
    assert summary.bytes_after < summary.bytes_before / 5
    assert summary.bits_per_weight == pytest.approx(5.0)
    assert "2 layers replaced" in str(summary)
    with torch.inference_mode():
        y = model(x)
    assert torch.nn.functional.cosine_similarity(y, ref).min() > 0.98


def test_state_dict_round_trip(tmp_path):
    model = _toy().eval()
    qt.quantize_model(model, bits=4, group_size=32, act_block=None)
    model[2].act = "float"
    model[2].set_extra_state(model[2].get_extra_state())
    x = torch.randn(3, 64)
    with torch.inference_mode():
        y = model(x)
    path = tmp_path / "m.pt"
    torch.save(model.state_dict(), path)
    sd = torch.load(path, weights_only=True)  # tensors and plain dicts only: no pickled classes
    assert sd["0.packed"].dtype == torch.uint8
    fresh = _toy().eval()
    qt.load_quantized(fresh, sd)
    assert isinstance(fresh[0], qt.QLinear) and fresh[2].act == "float" and fresh[0].act_block is None
    with torch.inference_mode():
        torch.testing.assert_close(fresh(x), y, rtol=0, atol=0)
    # loading into an already quantized model of other settings replaces its buffers
    other = _toy().eval()
    qt.quantize_model(other, bits=8, group_size=None)
    other.load_state_dict(sd)
    with torch.inference_mode():
        torch.testing.assert_close(other(x), y, rtol=0, atol=0)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch's own jit deprecation notices
def test_torch_compile_and_jit_trace():
    model = _toy().eval()
    qt.quantize_model(model, bits=4, group_size=32)
    x = torch.randn(6, 64)
    with torch.inference_mode():
        y = model(x)
        compiled = torch.compile(model, fullgraph=True)   # fullgraph: a graph break would raise
        torch.testing.assert_close(compiled(x), y)
        xh = x.half()  # the fake implementation's dtype and shape, through AOT autograd
        torch.testing.assert_close(torch.compile(model, fullgraph=True, backend="aot_eager")(xh), model(xh))
    with torch.no_grad():
        traced = torch.jit.trace(model, x)
        assert "qlinear::linear" in str(traced.inlined_graph)
        torch.testing.assert_close(traced(x), y, rtol=0, atol=0)
        buf = io.BytesIO()
        torch.jit.save(traced, buf)
        buf.seek(0)
        torch.testing.assert_close(torch.jit.load(buf)(x), y, rtol=0, atol=0)


def test_fake_impl():
    q = qt.QLinear.from_linear(nn.Linear(64, 24), bits=4, group_size=32)
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode(allow_non_fake_inputs=True):
        y = torch.ops.qlinear.linear(torch.empty(2, 3, 64, dtype=torch.bfloat16), q.packed, q.bias, 24, 64,
                                     4, 32, False, q.layout, "int8", 32)
    assert y.shape == (2, 3, 24) and y.dtype == torch.bfloat16


class _PreNorm(nn.Module):
    """x + W2 act(W1 LN(x)): the norm's output feeds only W1 (foldable)."""

    def __init__(self, d=64):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(self.norm(x))))


class _PostNorm(_PreNorm):
    """h = LN(x); h + W2 act(W1 h): the norm's output is also the residual (not foldable)."""

    def forward(self, x):
        h = self.norm(x)
        return h + self.down(torch.relu(self.up(h)))


def _outlier_batches(d=64, n=4):
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(n):
        x = torch.randn(16, d, generator=g)
        x[:, :3] *= 30  # outlier channels
        out.append(x)
    return out


@pytest.mark.parametrize("cls,where", [(_PreNorm, "fold:norm"), (_PostNorm, "in_scale")])
def test_smoothing_fold_or_input_scale(cls, where):
    model = cls().eval()
    with torch.no_grad():
        model.norm.weight.copy_(torch.rand(64) + 0.5)
        model.norm.weight[:3] *= 20   # LayerNorm outputs with outlier channels
        model.norm.bias.normal_()
    batches = _outlier_batches()
    calib = qt.calibrate(model, batches)
    assert calib["up"].producers == {"norm"} and calib["down"].producers == {None}
    x = torch.randn(8, 64)
    with torch.inference_mode():
        ref = model(x)
    summary = qt.quantize_model(model, bits=8, group_size=32, act="float", smooth=0.5, calibration=calib)
    rows = {r["name"]: r for r in summary.layers}
    assert rows["up"]["smoothing"] == where and rows["up"]["alpha"] == 0.5
    assert rows["down"]["smoothing"] == "in_scale"
    assert (model.up.in_scale is None) == (where == "fold:norm")
    with torch.inference_mode():  # smoothing is exact in float: only int8 weight rounding remains
        y = model(x)
    assert ((y - ref).norm() / ref.norm()) < 0.01


def test_smoothing_search_helps_with_outliers():
    errs = {}
    for smooth in (None, "search"):
        model = _PreNorm().eval()
        with torch.no_grad():
            model.norm.weight[:3] *= 40
        calib = qt.calibrate(model, _outlier_batches())
        x = torch.cat(_outlier_batches(n=2))
        with torch.inference_mode():
            ref = model.up(model.norm(x))
        qt.quantize_model(model, bits=4, group_size=64, act_block=None, smooth=smooth, calibration=calib)
        with torch.inference_mode():
            y = model.up(model.norm(x))
        errs[smooth] = float((y - ref).norm() / ref.norm())
    assert errs["search"] < 0.8 * errs[None], errs


def test_clip_search_and_mixed_precision():
    model = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 64)).eval()
    calib = qt.calibrate(model, [torch.randn(32, 128) for _ in range(4)])
    plain = qt.quantize_model(_copy(model), bits=4, group_size=64, calibration=calib)
    clipped = qt.quantize_model(_copy(model), bits=4, group_size=64, calibration=calib, clip_search=True)
    for a, b in zip(plain.layers, clipped.layers):
        assert b["err_int4"] <= a["err_int4"] * 1.001 and b["clip_mean"] < 1.0
    mixed = qt.quantize_model(_copy(model), bits=4, group_size=64, calibration=calib, bits_budget=5.8)
    assert 4.5 < mixed.bits_per_weight <= 5.8
    assert any(r["bits"] == 8 for r in mixed.layers) and any(r["bits"] == 4 for r in mixed.layers)
    forced = qt.quantize_model(_copy(model), bits=4, group_size=64, int8_layers=["2"])
    assert [r["bits"] for r in forced.layers] == [4, 8, 4]
    with pytest.raises(ValueError, match="calibration"):
        qt.quantize_model(_copy(model), smooth=0.5)


def _copy(m):
    import copy
    return copy.deepcopy(m)
