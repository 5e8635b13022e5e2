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


@pytest.mark.parametrize("heads, kv_heads, d, pos", [(4, 2, 16, 0), (6, 3, 32, 9), (14, 2, 64, 100), (2, 2, 10, 3)])
def test_attend_with_half_caches(isa, rng, heads, kv_heads, d, pos):
    """float16 caches: this token's key (after RoPE) and value stored rounded to nearest even, the
    attention that of float caches holding the same half values (decode and prefill)."""
    cap = 128
    k16 = (rng.standard_normal((kv_heads, cap, d)) * 3).astype(np.float16)
    v16 = rng.standard_normal((kv_heads, cap, d)).astype(np.float16)
    qkv = (rng.standard_normal((1, (heads + 2 * kv_heads) * d)) * 2).astype(np.float32)
    cos, sin = _rope_tables(cap, d)
    k32, v32 = k16.astype(np.float32), v16.astype(np.float32)
    out32 = _core.attend_one(qkv, cos, sin, pos, k32, v32, heads, 1 / np.sqrt(d))  # stores float rows
    kh, vh = k16.copy(), v16.copy()
    out16 = _core.attend_one(qkv, cos, sin, pos, kh, vh, heads, 1 / np.sqrt(d))
    np.testing.assert_array_equal(vh, v32.astype(np.float16))          # this value, rounded
    np.testing.assert_array_equal(kh, k32.astype(np.float16))          # this key after RoPE, rounded
    # the attention over the rounded rows
    k_r, v_r = kh.astype(np.float32), vh.astype(np.float32)
    q = qkv[0, :heads * d].reshape(heads, d)
    h2 = d // 2
    q = np.concatenate([q[:, :h2] * cos[pos] - q[:, h2:] * sin[pos], q[:, h2:] * cos[pos] + q[:, :h2] * sin[pos]], 1)
    want = np.empty((heads, d))
    for h in range(heads):
        g = h // (heads // kv_heads)
        sc = (k_r[g, :pos + 1].astype(np.float64) @ q[h]) / np.sqrt(d)
        e = np.exp(sc - sc.max())
        want[h] = (e / e.sum()) @ v_r[g, :pos + 1]
    np.testing.assert_allclose(out16.reshape(heads, d), want, rtol=1e-5, atol=1e-5)
    assert np.abs(out16 - out32).max() < 0.05   # one row's rounding apart
    # prefill over half caches: as float caches holding the rounded rows
    rows = 20
    qkv_p = (rng.standard_normal((rows, (heads + 2 * kv_heads) * d)) * 2).astype(np.float32)
    kh, vh = k16.copy(), v16.copy()
    out_h = _core.attend_prefill(qkv_p, cos, sin, pos, kh, vh, heads, 1 / np.sqrt(d))
    ref_p, k_ref, v_ref = _prefill_reference(qkv_p, cos, sin, pos, k16.astype(np.float32), v16.astype(np.float32),
                                             heads, 1 / np.sqrt(d))
    np.testing.assert_array_equal(vh, v_ref.astype(np.float16))
    np.testing.assert_allclose(kh.astype(np.float32), k_ref, rtol=1e-3, atol=1e-3)   # rounded
    ref_h, _, _ = _prefill_reference(qkv_p, cos, sin, pos, kh.astype(np.float32), vh.astype(np.float32),
                                     heads, 1 / np.sqrt(d), stored=True)
    np.testing.assert_allclose(out_h, ref_h, rtol=1e-5, atol=2e-5)
    with pytest.raises(ValueError, match="one dtype"):
        _core.attend_one(qkv, cos, sin, pos, k16.copy(), v32.copy(), heads, 0.25)
    with pytest.raises(TypeError, match="one dtype"):
        _core.attend_prefill(qkv_p, cos, sin, pos, k16.copy(), v32.copy(), heads, 0.25)


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
            kh, vh = caches[0].astype(np.float16), caches[1].astype(np.float16)   # half caches
            att_h = _core.attend_one(qkv, cos, sin, pos, kh, vh, heads, 0.125)
            pre_h = _core.attend_prefill(np.tile(qkv, (70, 1)), cos, sin, 100, kh, vh, heads, 0.125)
            results[level] = (_core.rms_norm(x, w, 1e-6), _core.silu_mul(gu), att, k, v, att_h, pre_h, kh, vh)
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


# -- prefill attention -------------------------------------------------------------------------

def _rope_tables(cap, d, base=10000.0):
    ang = np.arange(cap)[:, None] * (1.0 / base ** (np.arange(0, d, 2) / d))[None, :]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def _prefill_reference(qkv, cos, sin, start, k_cache, v_cache, heads, scale, stored=False):
    """numpy (float64): RoPE, the caches updated at start.. (stored: they hold those rows already),
    causal attention of every row."""
    kv, cap, d = k_cache.shape
    t, half = qkv.shape[0], d // 2
    pos = np.arange(start, start + t)

    def rope(x):
        c, s = cos[pos][:, None, :], sin[pos][:, None, :]
        return np.concatenate([x[..., :half] * c - x[..., half:] * s, x[..., half:] * c + x[..., :half] * s], -1)

    q = rope(qkv[:, :heads * d].reshape(t, heads, d).astype(np.float64))
    kc, vc = k_cache.astype(np.float64), v_cache.astype(np.float64)
    k_new = rope(qkv[:, heads * d:(heads + kv) * d].reshape(t, kv, d).astype(np.float64))
    if not stored:
        kc[:, start:start + t] = k_new.transpose(1, 0, 2)
        vc[:, start:start + t] = qkv[:, (heads + kv) * d:].reshape(t, kv, d).transpose(1, 0, 2)
    out = np.empty((t, heads, d))
    group, end = heads // kv, start + t
    for h in range(heads):
        s = q[:, h] @ kc[h // group, :end].T * scale
        s[np.arange(end)[None, :] > pos[:, None]] = -np.inf
        p = np.exp(s - s.max(1, keepdims=True))
        out[:, h] = (p / p.sum(1, keepdims=True)) @ vc[h // group, :end]
    return out.reshape(t, heads * d), kc, vc


@pytest.mark.parametrize("heads, kv_heads, d, rows, start", [
    (4, 2, 64, 1, 0), (14, 2, 64, 37, 5), (6, 3, 32, 100, 0), (8, 1, 128, 70, 33), (2, 2, 10, 17, 3),
    (4, 1, 64, 600, 0), (4, 2, 64, 257, 130), (3, 3, 24, 65, 63)])
def test_attend_prefill(rng, heads, kv_heads, d, rows, start):
    cap = start + rows + 3
    k = rng.standard_normal((kv_heads, cap, d)).astype(np.float32)
    v = rng.standard_normal((kv_heads, cap, d)).astype(np.float32)
    qkv = (rng.standard_normal((rows, (heads + 2 * kv_heads) * d)) * 2).astype(np.float32)
    cos, sin = _rope_tables(cap, d)
    ref, k_ref, v_ref = _prefill_reference(qkv, cos, sin, start, k, v, heads, 1 / np.sqrt(d))
    out = _core.attend_prefill(qkv, cos, sin, start, k, v, heads, 1 / np.sqrt(d))
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=2e-5)
    np.testing.assert_allclose(k, k_ref, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(v, v_ref)


def test_attend_prefill_row_equals_decode(rng):
    """A prompt's last row attends as a decode step at that position would."""
    heads, kv, d, rows, cap = 14, 2, 64, 90, 96
    qkv = rng.standard_normal((rows, (heads + 2 * kv) * d)).astype(np.float32)
    cos, sin = _rope_tables(cap, d)
    k, v = np.zeros((kv, cap, d), np.float32), np.zeros((kv, cap, d), np.float32)
    out = _core.attend_prefill(qkv, cos, sin, 0, k, v, heads, 0.125)
    k2, v2 = np.zeros_like(k), np.zeros_like(v)
    _core.attend_prefill(qkv[:-1], cos, sin, 0, k2, v2, heads, 0.125)
    last = _core.attend_one(qkv[-1:], cos, sin, rows - 1, k2, v2, heads, 0.125)
    np.testing.assert_allclose(out[-1:], last, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(k, k2)


def test_attend_prefill_rejects_bad_input(rng):
    k = np.zeros((2, 8, 16), np.float32)
    cos = np.ones((8, 8), np.float32)
    qkv = np.zeros((3, 8 * 16), np.float32)
    for kw in (dict(start=6), dict(start=-1), dict(heads=3), dict(qkv=qkv[:, :-1]), dict(v_cache=k[:1]),
               dict(k_cache=np.zeros((2, 8, 15), np.float32)), dict(cos=cos[:, :3]), dict(cos=cos[:4]),
               dict(qkv=qkv[:0]), dict(qkv=np.zeros((3, 8, 16), np.float32)), dict(qkv=qkv[:, ::2])):
        args = dict(qkv=qkv, cos=cos, sin=cos, start=1, k_cache=k, v_cache=k.copy(), heads=4, scale=0.25)
        args.update(kw)
        with pytest.raises(ValueError):
            _core.attend_prefill(**args)
    for kw in (dict(k_cache=k.astype(np.float64)), dict(sin=[[1.0]]), dict(qkv=qkv.astype(np.float16))):
        args = dict(qkv=qkv, cos=cos, sin=cos, start=1, k_cache=k, v_cache=k.copy(), heads=4, scale=0.25)
        args.update(kw)
        with pytest.raises(TypeError):
            _core.attend_prefill(**args)
    ro = k.copy()
    ro.flags.writeable = False
    with pytest.raises(ValueError):
        _core.attend_prefill(qkv, cos, cos, 1, ro, k.copy(), 4, 0.25)
    bad = qkv.copy()
    bad[1, 0] = np.nan  # row 1's query: row 1 is NaN, row 0 is not
    out = _core.attend_prefill(bad, cos, cos, 0, k.copy(), k.copy(), 4, 0.25)
    assert np.isnan(out[1, :16]).all() and not np.isnan(out[0]).any()


@pytest.mark.parametrize("threads", [1, 2])
def test_prefill_levels_and_threads_agree_exactly(rng, threads):
    import qlinear
    heads, kv, d, rows, start = 14, 2, 64, 150, 20
    cap = start + rows
    qkv = rng.standard_normal((rows, (heads + 2 * kv) * d)).astype(np.float32)
    cos, sin = _rope_tables(cap, d)
    base = rng.standard_normal((2, kv, cap, d)).astype(np.float32)
    previous, prev_threads = qlinear.cpu_info()["active_isa"], qlinear.get_num_threads()
    results = {}
    try:
        for t in sorted({1, threads}):
            qlinear.set_num_threads(t)
            for level in qlinear.cpu_info()["available_isas"]:
                qlinear.set_isa(level)
                k, v = base[0].copy(), base[1].copy()
                results[level, t] = (_core.attend_prefill(qkv, cos, sin, start, k, v, heads, 0.125), k, v)
    finally:
        qlinear.set_isa(previous)
        qlinear.set_num_threads(prev_threads)
    for key, outs in results.items():
        for a, b in zip(outs, results["scalar", 1]):
            assert np.array_equal(a, b), key


# -- decode attention at long context -------------------------------------------------------------

@pytest.mark.parametrize("heads, kv_heads, d", [(14, 2, 64), (32, 1, 64), (4, 4, 128), (6, 2, 40)])
def test_attend_one_long_context(rng, heads, kv_heads, d):
    """4k positions (heads split over the pool), groups wider than one pass over the keys, head
    sizes that are not a multiple of the vector width."""
    pos, cap = 4000, 4096
    k = rng.standard_normal((kv_heads, cap, d)).astype(np.float32)
    v = rng.standard_normal((kv_heads, cap, d)).astype(np.float32)
    qkv = (rng.standard_normal((1, (heads + 2 * kv_heads) * d)) * 2).astype(np.float32)
    cos, sin = _rope_tables(cap, d)
    k_before, v_before = k.copy(), v.copy()
    out = _core.attend_one(qkv, cos, sin, pos, k, v, heads, 1 / np.sqrt(d))
    ref, _, _ = _prefill_reference(qkv, cos, sin, pos, k_before[:, :pos + 1], v_before[:, :pos + 1], heads,
                                   1 / np.sqrt(d))
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


# -- the whole decode step ------------------------------------------------------------------------

def _step_model(rng, bits, act, bias, heads=4, kv_heads=2, d=32, hidden=128, inter=160, layers=2,
                vocab=96, cap=24, arch=None, kv_dtype=np.float32):
    """Random packed weights and norms of a small decoder, and the specs _core.decode_step takes.
    arch "qwen3": RMSNorms of the query and key heads; "gemma2": RMSNorms of the attention's and
    the MLP's outputs, GELU-tanh, soft-capped scores and logits, and layer 0 a sliding window of
    8 positions (its cache a ring) with RoPE tables of its own."""
    def linear(n, k, with_bias):
        h = _core.quantize_and_pack((rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32), bits, 32, False)
        b = (rng.standard_normal(n) * 0.1).astype(np.float32) if with_bias else None
        return (h, b, act == "int8", 32 if act == "int8" else k)
    norm = lambda n=hidden: (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)  # noqa: E731
    tables, caps, extra = [_rope_tables(cap, d)] * layers, [cap] * layers, {}
    options = {None: lambda: {}, "qwen3": lambda: {"q_norm": norm(d), "k_norm": norm(d)},
               "gemma2": lambda: {"attn_out_norm": norm(), "mlp_out_norm": norm()}}[arch]
    if arch == "gemma2":
        tables[0], caps[0] = _rope_tables(cap, d, base=100.0), 8
        extra = dict(gelu=True, attn_softcap=2.0, final_softcap=1.5, context=cap)
    if len(set(caps)) == 1:
        k = np.zeros((layers, kv_heads, cap, d), kv_dtype)
    else:
        k = [np.zeros((kv_heads, c, d), kv_dtype) for c in caps]
    v = [a.copy() for a in k] if isinstance(k, list) else k.copy()
    specs = [(linear((heads + 2 * kv_heads) * d, hidden, bias), linear(hidden, heads * d, False),
              linear(2 * inter, hidden, False), linear(hidden, inter, False), norm(), norm(), k[i], v[i],
              *tables[i], options())
             for i in range(layers)]
    return dict(layers=specs, final_norm=norm(), lm_head=linear(vocab, hidden, False),
                heads=heads, eps=1e-6, scale=1 / np.sqrt(d), **extra), k, v


def _python_step(m, k, v, h, pos):
    """The decode step op by op through _core (as qlinear.llm's per-layer Python path runs it)."""
    def lin(spec, x):
        w, b, int8, block = spec
        return (_core.matmul_int8 if int8 else _core.matmul_float)(x, w, b, None, block if int8 else w.k)
    h = h.reshape(1, -1)
    for i, (qkv, o, gate_up, down, n1, n2, _, _, cos, sin, _) in enumerate(m["layers"]):
        a = _core.attend_one(lin(qkv, _core.rms_norm(h, n1, m["eps"])), cos, sin, pos, k[i], v[i],
                             m["heads"], m["scale"])
        h = h + lin(o, a)
        h = h + lin(down, _core.silu_mul(lin(gate_up, _core.rms_norm(h, n2, m["eps"]))))
    return lin(m["lm_head"], _core.rms_norm(h, m["final_norm"], m["eps"]))


@pytest.mark.parametrize("bits, act, bias, heads, kv_heads", [
    (4, "int8", True, 4, 2), (4, "int8", False, 4, 4), (8, "int8", True, 6, 2), (4, "float", True, 4, 1),
    (8, "float", False, 4, 2)])
def test_decode_step_equals_ops(rng, bits, act, bias, heads, kv_heads):
    """The compiled step gives the bits of the same operations called one by one, at several
    positions, and fills the caches the same way."""
    m, k_cache, v_cache = _step_model(rng, bits, act, bias, heads=heads, kv_heads=kv_heads)
    step = _core.decode_step(**m)
    k, v = k_cache.copy(), v_cache.copy()
    for pos in range(12):
        h = rng.standard_normal(128).astype(np.float32)
        logits = step.step(h, pos)
        assert logits.shape == (1, 96) and logits.dtype == np.float32
        np.testing.assert_array_equal(logits, _python_step(m, k, v, h, pos))
    np.testing.assert_array_equal(k_cache, k)
    np.testing.assert_array_equal(v_cache, v)
    total, in_matmuls = step.last_timing
    assert 0 < in_matmuls <= total
    step.run_matmuls()


def test_decode_step_with_half_caches(isa, rng):
    """float16 caches: the compiled step gives the bits of the operations one by one over the same
    caches, at every level, and fills them the same way."""
    m, k_cache, v_cache = _step_model(rng, 4, "int8", True, kv_dtype=np.float16)
    step = _core.decode_step(**m)
    k, v = k_cache.copy(), v_cache.copy()
    for pos in range(12):
        h = rng.standard_normal(128).astype(np.float32)
        np.testing.assert_array_equal(step.step(h, pos), _python_step(m, k, v, h, pos))
    np.testing.assert_array_equal(k_cache, k)
    np.testing.assert_array_equal(v_cache, v)
    assert k_cache.dtype == np.float16 and k_cache[:, :, 11].any()
    mixed = [lay[:7] + (lay[7].astype(np.float32),) + lay[8:] for lay in m["layers"]]
    with pytest.raises(TypeError, match="one dtype"):
        _core.decode_step(**{**m, "layers": mixed})


def test_decode_step_keeps_its_arrays_alive(rng):
    import gc
    m, k, _ = _step_model(rng, 4, "int8", True)
    step = _core.decode_step(**m)
    h = rng.standard_normal(128).astype(np.float32)
    first = step.step(h, 3)
    del m
    gc.collect()
    np.testing.assert_array_equal(step.step(h, 3), first)
    assert k[:, :, 3].any()


def test_decode_step_rejects_bad_input(rng):
    m = _step_model(rng, 4, "int8", True)[0]
    step = _core.decode_step(**m)
    h = np.zeros(128, np.float32)
    for args in ((h, 24), (h, -1), (h[:-1], 0), (h.astype(np.float64), 0), (np.zeros(256, np.float32)[::2], 0)):
        with pytest.raises(ValueError):
            step.step(*args)
    lay = m["layers"][0]
    qkv_w, qkv_b = lay[0][0], lay[0][1]
    swaps = {  # a bad part -> the error it raises
        "final_norm": (m["final_norm"][:-1], ValueError),
        "heads": (3, ValueError),
        "lm_head": ((m["lm_head"][0], None, True, 7), ValueError),
        "attn_softcap": (-1.0, ValueError),
    }
    ro = lay[6].copy()
    ro.flags.writeable = False
    layer_swaps = [
        (0, (qkv_w, qkv_b[:-1], True, 32), ValueError),
        (0, (qkv_w, qkv_b.astype(np.float64), True, 32), TypeError),
        (0, (lay[1][0], None, True, 32), ValueError),             # o's weight as qkv: wrong shape
        (0, (qkv_w, qkv_b, 1, 32), TypeError),                     # act_int8 not a bool
        (0, (np.zeros((3, 3), np.float32), None, True, 32), TypeError),
        (0, (qkv_w, qkv_b), TypeError),
        (4, m["final_norm"][:-1], ValueError),
        (5, [1.0] * 128, TypeError),
        (6, lay[6][:1], ValueError),                               # k_cache of other heads than v_cache
        (7, lay[7][:, :1], ValueError),
        (6, ro, ValueError),
        (8, lay[8][:, :3], ValueError),                            # cos of the wrong width
        (10, {"q_norm": np.ones(31, np.float32)}, ValueError),     # [head_dim] expected
        (10, {"bias": None}, ValueError),                          # unknown option
        (10, None, TypeError),
    ]
    for name, (bad, err) in swaps.items():
        with pytest.raises(err):
            _core.decode_step(**{**m, name: bad})
    for index, bad, err in layer_swaps:
        layers = list(m["layers"])
        layers[1] = tuple(bad if i == index else x for i, x in enumerate(layers[1]))
        with pytest.raises(err):
            _core.decode_step(**{**m, "layers": layers})
    with pytest.raises(ValueError):
        _core.decode_step(**{**m, "layers": []})
    with pytest.raises(TypeError):
        _core.decode_step(**{**m, "layers": [m["layers"][0], None]})
    with pytest.raises(TypeError):
        _core.decode_step(**{**m, "layers": [m["layers"][0][:10]]})


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_decode_step_threads(rng, threads):
    """A wide MLP (its SiLU split over the pool) and a context long enough to split the heads:
    the bits of the ops called one by one on one thread."""
    import qlinear
    m, k_cache, v_cache = _step_model(rng, 4, "int8", True, heads=8, kv_heads=2, d=64, hidden=256, inter=4160,
                                      layers=1, cap=300)
    k, v = k_cache.copy(), v_cache.copy()
    rng_cache = rng.standard_normal(k.shape).astype(np.float32)
    for a in (k_cache, k):
        a[:] = rng_cache
    for a in (v_cache, v):
        a[:] = rng_cache[..., ::-1]
    h = rng.standard_normal(256).astype(np.float32)
    prev = qlinear.get_num_threads()
    try:
        qlinear.set_num_threads(1)
        ref = _python_step(m, k, v, h, 290)
        qlinear.set_num_threads(threads)
        out = _core.decode_step(**m).step(h, 290)
    finally:
        qlinear.set_num_threads(prev)
    np.testing.assert_array_equal(out, ref)
    np.testing.assert_array_equal(k_cache, k)


# -- the decode step of several sequences (continuous batching) -----------------------------------

def _row_caches(rng, m, context):
    """Random caches of one sequence of `context` positions for the model `m` (a layer whose
    cache in `m` is shorter than its context: a ring of that size), of its caches' dtype."""
    caps = [min(context, lay[6].shape[1]) if lay[6].shape[1] < m.get("context", 0) else context for lay in m["layers"]]
    shape = lambda c: (m["layers"][0][6].shape[0], c, m["layers"][0][6].shape[2])  # noqa: E731
    dtype = m["layers"][0][6].dtype
    return ([rng.standard_normal(shape(c)).astype(dtype) for c in caps],
            [rng.standard_normal(shape(c)).astype(dtype) for c in caps])


def _own_step(m, k, v, context):
    """A DecodeStep whose own caches are copies of one sequence's; the step and those copies."""
    k, v = [a.copy() for a in k], [a.copy() for a in v]
    layers = [lay[:6] + (k[i], v[i]) + lay[8:] for i, lay in enumerate(m["layers"])]
    return _core.decode_step(**{**m, "layers": layers, "context": context}), k, v


def _single_step(m, k, v, context, h, pos):
    """The step of one sequence alone: a DecodeStep over its caches (copies); logits, caches."""
    step, k, v = _own_step(m, k, v, context)
    return step.step(h, pos), k, v


@pytest.mark.parametrize("arch", [None, "qwen3", "gemma2"])
@pytest.mark.parametrize("bits, act", [(4, "int8"), (8, "int8"), (4, "float")])
def test_step_batch_rows_equal_the_single_step(isa, rng, bits, act, arch):
    """DecodeStep.step_batch: each row's logits and cache writes are the step of that sequence
    alone, whatever the other rows (their number, order, positions, contexts and caches), at every
    ISA level; with q / k norms (Qwen3), and with sandwich norms, GELU-tanh, soft-caps and a
    sliding layer whose ring wraps (Gemma 2)."""
    m = _step_model(rng, bits, act, True, arch=arch)[0]
    step = _core.decode_step(**m)
    contexts = [24, 24, 12, 24, 3, 24, 20, 24, 24]
    positions = [0, 5, 11, 17, 1, 23, 19, 9, 2]
    caches = [_row_caches(rng, m, c) for c in contexts]
    h = rng.standard_normal((9, 128)).astype(np.float32)
    expected = [_single_step(m, k, v, c, x, p) for (k, v), c, x, p in zip(caches, contexts, h, positions)]
    for rows in ([3], [0, 1], [2, 4, 6, 8], list(range(9)), [8, 5, 0]):
        ks, vs = [[a.copy() for a in caches[r][0]] for r in rows], [[a.copy() for a in caches[r][1]] for r in rows]
        logits = step.step_batch(np.ascontiguousarray(h[rows]), [positions[r] for r in rows], ks, vs,
                                 [contexts[r] for r in rows])
        assert logits.shape == (len(rows), 96)
        for i, r in enumerate(rows):
            np.testing.assert_array_equal(logits[i:i + 1], expected[r][0])
            for got, want in zip(ks[i] + vs[i], expected[r][1] + expected[r][2]):
                np.testing.assert_array_equal(got, want)



@pytest.mark.parametrize("arch", [None, "gemma2"])
def test_step_batch_rows_of_one_sequence(isa, rng, arch):
    """Rows of one sequence in a batch (a speculative verification), its caches given for each of
    them at consecutive positions, beside another sequence's rows (before, between and after
    them): each row's logits and the caches' writes are step_block's, and the one-token step's,
    bit for bit (Gemma 2: the block wraps layer 0's ring of 8). Rows sharing caches at other than
    consecutive positions are refused."""
    m = _step_model(rng, 4, "int8", True, arch=arch)[0]
    step = _core.decode_step(**m)
    (k, v), (ko, vo) = _row_caches(rng, m, 24), _row_caches(rng, m, 24)
    start, n = 6, 4
    h = rng.standard_normal((n + 2, 128)).astype(np.float32)
    block, kb, vb = _own_step(m, k, v, 24)
    want = block.step_block(h[1:n + 1], start)
    one = _own_step(m, k, v, 24)[0]
    np.testing.assert_array_equal(np.concatenate([one.step(h[1 + j], start + j) for j in range(n)]), want)
    other, ko_want, vo_want = _own_step(m, ko, vo, 24)
    other_want = other.step_block(np.ascontiguousarray(h[[0, n + 1]]), 10)
    ks, vs = [a.copy() for a in k], [a.copy() for a in v]
    kso, vso = [a.copy() for a in ko], [a.copy() for a in vo]
    logits = step.step_batch(h, [10, *range(start, start + n), 11], [kso] + [ks] * n + [kso],
                             [vso] + [vs] * n + [vso], [24] * (n + 2))
    np.testing.assert_array_equal(logits[1:n + 1], want)
    np.testing.assert_array_equal(logits[[0, n + 1]], other_want)
    for got, expected in zip(ks + vs + kso + vso, kb + vb + ko_want + vo_want):
        np.testing.assert_array_equal(got, expected)
    for positions in ([6, 8], [7, 6], [6, 6]):
        with pytest.raises(ValueError, match="consecutive positions"):
            step.step_batch(h[:2], positions, [ks, ks], [vs, vs], [24, 24])

def test_step_batch_is_the_single_step_of_the_own_cache(rng):
    """A batch of one row over the step's own caches ([layers, ...] views) is step() itself."""
    m, k, v = _step_model(rng, 4, "int8", True)
    step = _core.decode_step(**m)
    k[:], v[:] = rng.standard_normal(k.shape), rng.standard_normal(v.shape)
    k0, v0, h = k.copy(), v.copy(), rng.standard_normal(128).astype(np.float32)
    one = step.step(h, 7)
    k1, v1 = k.copy(), v.copy()
    k[:], v[:] = k0, v0
    np.testing.assert_array_equal(step.step_batch(h[None], [7], [k], [v], [24]), one)
    np.testing.assert_array_equal(k, k1)
    np.testing.assert_array_equal(v, v1)
    step.run_matmuls()


@pytest.mark.parametrize("threads", [1, 2])
def test_step_batch_threads_and_long_context(rng, threads):
    """Heads split over the pool (a long context) and a wide MLP: rows as the single step's."""
    import qlinear
    m = _step_model(rng, 4, "int8", True, heads=8, kv_heads=2, d=64, hidden=256, inter=4160, layers=1, cap=300)[0]
    caches = [_row_caches(rng, m, 300) for _ in range(3)]
    h, positions = rng.standard_normal((3, 256)).astype(np.float32), [290, 7, 150]
    prev = qlinear.get_num_threads()
    try:
        qlinear.set_num_threads(threads)
        expected = [_single_step(m, k, v, 300, x, p)[0] for (k, v), x, p in zip(caches, h, positions)]
        out = _core.decode_step(**m).step_batch(h, positions, [k for k, _ in caches], [v for _, v in caches], [300] * 3)
    finally:
        qlinear.set_num_threads(prev)
    for i in range(3):
        np.testing.assert_array_equal(out[i:i + 1], expected[i])


@pytest.mark.parametrize("arch", [None, "gemma2"])
def test_step_batch_rows_with_half_caches(isa, rng, arch):
    """float16 caches in a batch: each row's logits and cache writes are its single step's; caches
    of another dtype than the step's own are refused."""
    m = _step_model(rng, 4, "int8", True, arch=arch, kv_dtype=np.float16)[0]
    step = _core.decode_step(**m)
    contexts, positions = [24, 12, 24, 3], [5, 11, 23, 1]
    caches = [_row_caches(rng, m, c) for c in contexts]
    h = rng.standard_normal((4, 128)).astype(np.float32)
    expected = [_single_step(m, k, v, c, x, p) for (k, v), c, x, p in zip(caches, contexts, h, positions)]
    ks, vs = [[a.copy() for a in k] for k, _ in caches], [[a.copy() for a in v] for _, v in caches]
    logits = step.step_batch(h, positions, ks, vs, contexts)
    for i in range(4):
        np.testing.assert_array_equal(logits[i:i + 1], expected[i][0])
        for got, want in zip(ks[i] + vs[i], expected[i][1] + expected[i][2]):
            np.testing.assert_array_equal(got, want)
    k, v = caches[0]
    with pytest.raises(TypeError, match="float16"):
        step.step_batch(h[:1], [0], [[a.astype(np.float32) for a in k]], [v], [24])


@pytest.mark.parametrize("arch", [None, "qwen3"])
def test_step_batch_takes_stacked_caches(isa, rng, arch):
    """A row's caches as one [layers, kv_heads, context, head_dim] array each (a KVCache whose
    layers all hold the context) are read and written as the same caches given layer by layer."""
    m = _step_model(rng, 4, "int8", True, arch=arch)[0]
    step = _core.decode_step(**m)
    contexts, positions = [24, 24, 17], [5, 23, 16]
    stacked = [tuple(np.stack(part) for part in _row_caches(rng, m, c)) for c in contexts]
    h = rng.standard_normal((3, 128)).astype(np.float32)
    ks, vs = [k.copy() for k, _ in stacked], [v.copy() for _, v in stacked]
    by_layer = ([[layer for layer in k.copy()] for k, _ in stacked], [[layer for layer in v.copy()] for _, v in stacked])
    want = step.step_batch(h, positions, [list(k) for k in by_layer[0]], [list(v) for v in by_layer[1]], contexts)
    np.testing.assert_array_equal(step.step_batch(h, positions, ks, vs, contexts), want)
    for got, layers in zip(ks + vs, by_layer[0] + by_layer[1]):
        np.testing.assert_array_equal(got, np.stack(layers))
    k, v = stacked[0]
    with pytest.raises(ValueError, match="row 0 k_caches must have shape"):   # 24 positions, context 20
        step.step_batch(h[:1], [0], [k], [v], [20])
    with pytest.raises(ValueError, match="share a cache"):
        step.step_batch(h[:2], [0, 1], [k, k], [v, v.copy()], [24, 24])
    with pytest.raises(TypeError, match="float32"):
        step.step_batch(h[:1], [0], [k.astype(np.float64)], [v], [24])
    with pytest.raises(ValueError, match="writeable"):
        k.flags.writeable = False
        step.step_batch(h[:1], [0], [k], [v], [24])


def test_step_batch_rejects_bad_input(rng):
    m = _step_model(rng, 4, "int8", True, arch="gemma2")[0]
    step = _core.decode_step(**m)
    k, v = _row_caches(rng, m, 24)
    h = np.zeros((1, 128), np.float32)
    with pytest.raises(ValueError, match="outside its context"):
        step.step_batch(h, [24], [k], [v], [24])
    with pytest.raises(ValueError, match="outside its context"):
        step.step_batch(h, [12], [k], [v], [12])
    with pytest.raises(ValueError, match="context 25"):
        step.step_batch(h, [0], [k], [v], [25])
    with pytest.raises(ValueError, match="same number"):
        step.step_batch(h, [0, 1], [k], [v], [24, 24])
    with pytest.raises(ValueError, match="share a cache"):
        step.step_batch(np.zeros((2, 128), np.float32), [0, 1], [k, k], [v, [a.copy() for a in v]], [24, 24])
    with pytest.raises(ValueError, match="layer 0 k_cache"):  # a sliding layer's ring of the wrong size
        step.step_batch(h, [0], [[k[1], k[1]]], [v], [24])
    with pytest.raises(ValueError, match="layer 1 k_cache"):  # a cache shorter than the context
        step.step_batch(h, [0], [k], [v], [20])
    with pytest.raises(ValueError, match="2 layers"):
        step.step_batch(h, [0], [k[:1]], [v[:1]], [24])
    with pytest.raises(ValueError):
        step.step_batch(np.zeros((2, 128), np.float32), [0], [k], [v], [24])       # h's rows
    with pytest.raises(ValueError):
        step.step_batch(h, [0], [[a[:1] for a in k]], [v], [24])                    # kv heads
    with pytest.raises(TypeError):
        step.step_batch(h, [0], [[a.astype(np.float64) for a in k]], [v], [24])
