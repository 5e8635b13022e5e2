"""The LLM decode step's C++ operations against numpy (they run under the sanitizers and on
every architecture, without the LLM runtime's dependencies)."""

import numpy as np
import pytest

from qlinear import _core


def test_rms_norm(rng):
    x = rng.standard_normal((3, 37)).astype(np.float32) * 5
    w = rng.standard_normal(37).astype(np.float32)
    ref = x / np.sqrt((x.astype(np.float64) ** 2).mean(1, keepdims=True) + 1e-6) * w
    np.testing.assert_allclose(_core.rms_norm(x, w, 1e-6), ref, rtol=2e-6, atol=1e-6)
    with pytest.raises(ValueError):
        _core.rms_norm(x, w[:5], 1e-6)
    with pytest.raises(ValueError):
        _core.rms_norm(x.astype(np.float64), w, 1e-6)
    with pytest.raises(ValueError):
        _core.rms_norm(x[:, ::2], w[:19], 1e-6)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_prefill_sized_rows(rng, threads):
    """Many rows (a prompt) are split over the thread pool: every row as computed alone."""
    import qlinear
    previous = qlinear.get_num_threads()
    qlinear.set_num_threads(threads)
    try:
        x = rng.standard_normal((97, 896)).astype(np.float32)
        w = rng.standard_normal(896).astype(np.float32)
        gu = rng.standard_normal((97, 2 * 1200)).astype(np.float32) * 4
        norm, act = _core.rms_norm(x, w, 1e-6), _core.silu_mul(gu)
        for r in (0, 1, 48, 96):
            assert np.array_equal(norm[r], _core.rms_norm(x[r:r + 1], w, 1e-6)[0])
            assert np.array_equal(act[r], _core.silu_mul(gu[r:r + 1])[0])
    finally:
        qlinear.set_num_threads(previous)


def test_silu_mul(rng):
    gu = (rng.standard_normal((2, 2 * 101)) * 30).astype(np.float32)
    gu[0, :4] = [np.nan, 200.0, -200.0, 0.0]
    g, u = gu[:, :101].astype(np.float64), gu[:, 101:].astype(np.float64)
    with np.errstate(over="ignore"):
        ref = g / (1 + np.exp(-g)) * u
    out = _core.silu_mul(gu)
    assert np.isnan(out[0, 0])
    np.testing.assert_allclose(out[:, 1:], ref[:, 1:], rtol=1e-6, atol=1e-30)
    with pytest.raises(ValueError):
        _core.silu_mul(gu[:, :5])


@pytest.mark.parametrize("heads, kv_heads, d, pos", [(4, 2, 16, 0), (6, 3, 32, 9), (8, 1, 64, 40), (2, 2, 2, 3)])
def test_attend_one(rng, heads, kv_heads, d, pos):
    cap = 48
    k_cache = rng.standard_normal((kv_heads, cap, d)).astype(np.float32)
    v_cache = rng.standard_normal((kv_heads, cap, d)).astype(np.float32)
    k_ref, v_ref = k_cache.copy(), v_cache.copy()
    qkv = rng.standard_normal((1, (heads + 2 * kv_heads) * d)).astype(np.float32)
    ang = np.arange(cap)[:, None] * (1.0 / 10000 ** (np.arange(0, d, 2) / d))[None, :]
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)

    def rope(x):
        h = d // 2
        return np.concatenate([x[..., :h] * cos[pos] - x[..., h:] * sin[pos], x[..., h:] * cos[pos] + x[..., :h] * sin[pos]], -1)

    q = rope(qkv[0, :heads * d].reshape(heads, d))
    k_ref[:, pos] = rope(qkv[0, heads * d:(heads + kv_heads) * d].reshape(kv_heads, d))
    v_ref[:, pos] = qkv[0, (heads + kv_heads) * d:].reshape(kv_heads, d)
    scale = 1 / np.sqrt(d)
    ref = np.empty((heads, d))
    for h in range(heads):
        g = h // (heads // kv_heads)
        s = (k_ref[g, :pos + 1].astype(np.float64) @ q[h]) * scale
        p = np.exp(s - s.max())
        ref[h] = (p / p.sum()) @ v_ref[g, :pos + 1]
    out = _core.attend_one(qkv, cos, sin, pos, k_cache, v_cache, heads, scale)
    np.testing.assert_allclose(k_cache, k_ref, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(v_cache, v_ref)
    np.testing.assert_allclose(out.reshape(heads, d), ref, rtol=1e-5, atol=1e-5)


def test_attend_one_rejects_bad_input(rng):
    k = np.zeros((2, 8, 16), np.float32)
    cos = np.ones((8, 8), np.float32)
    qkv = np.zeros((1, 8 * 16), np.float32)
    for kw in (dict(pos=8), dict(pos=-1), dict(heads=3), dict(qkv=qkv[:, :-1]), dict(v_cache=k[:1]),
               dict(k_cache=k.astype(np.float64)), dict(cos=cos[:, :3]), dict(k_cache=np.zeros((2, 8, 15), np.float32))):
        args = dict(qkv=qkv, cos=cos, sin=cos, pos=1, k_cache=k, v_cache=k.copy(), heads=4, scale=0.25)
        args.update(kw)
        with pytest.raises(ValueError):
            _core.attend_one(**args)
    qkv_nan = qkv.copy()
    qkv_nan[0, 0] = np.nan
    assert np.isnan(_core.attend_one(qkv_nan, cos, cos, 1, k, k.copy(), 4, 0.25)[0, :16]).all()


@pytest.mark.parametrize("threads", [1, 2])
def test_levels_and_threads_agree_exactly(rng, threads):
    """The baseline and AVX2 builds of the decoder operations run the same float operations in the
    same order, and a long context's heads split over threads change nothing: bit-identical."""
    import qlinear
    heads, kv_heads, d, cap, pos = 14, 2, 64, 2048, 1500  # long enough to split the heads
    x = rng.standard_normal((5, 896)).astype(np.float32)
    w = rng.standard_normal(896).astype(np.float32)
    gu = (rng.standard_normal((5, 2 * 300)) * 6).astype(np.float32)
    qkv = rng.standard_normal((1, (heads + 2 * kv_heads) * d)).astype(np.float32)
    ang = np.arange(cap)[:, None] * (1.0 / 10000 ** (np.arange(0, d, 2) / d))[None, :]
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    caches = rng.standard_normal((2, kv_heads, cap, d)).astype(np.float32)
    previous, prev_threads = qlinear.cpu_info()["active_isa"], qlinear.get_num_threads()
    results = {}
    try:
        qlinear.set_num_threads(threads)
        for level in qlinear.cpu_info()["available_isas"]:
            qlinear.set_isa(level)
            k, v = caches[0].copy(), caches[1].copy()
            att = _core.attend_one(qkv, cos, sin, pos, k, v, heads, 0.125)
            results[level] = (_core.rms_norm(x, w, 1e-6), _core.silu_mul(gu), att, k, v)
    finally:
        qlinear.set_isa(previous)
        qlinear.set_num_threads(prev_threads)
    for level, outs in results.items():
        for a, b in zip(outs, results["scalar"]):
            assert np.array_equal(a, b, equal_nan=True), level
    if threads == 2:
        qlinear.set_num_threads(1)
        try:
            k, v = caches[0].copy(), caches[1].copy()
            assert np.array_equal(_core.attend_one(qkv, cos, sin, pos, k, v, heads, 0.125), results["scalar"][2])
        finally:
            qlinear.set_num_threads(prev_threads)
