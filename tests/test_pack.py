"""Weight quantization and packing: codes, scales and offsets equal the reference bit for bit."""

import platform

import numpy as np
import pytest

import qlinear
from qlinear import reference as ref

GROUPS = [32, 64, 128, 256, None]


def same_f16(a, b):
    return np.array_equal(np.asarray(a).view(np.uint16), np.asarray(b).view(np.uint16))


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("group_size", GROUPS)
@pytest.mark.parametrize("n,k", [(1, 1), (1, 32), (7, 33), (8, 64), (9, 65), (17, 127), (16, 256),
                                 (5, 257), (3, 300), (24, 512), (2, 1000)])
def test_pack_matches_reference(rng, bits, symmetric, group_size, n, k):
    w = (rng.standard_normal((n, k)) * rng.uniform(0.01, 3)).astype(np.float32)
    pw = qlinear.pack_weight(w, bits=bits, group_size=group_size, symmetric=symmetric)
    qw = ref.quantize_weight(w, bits, group_size, symmetric)
    codes, scale, offset = pw.unpack()
    assert np.array_equal(codes, qw.codes)
    assert same_f16(scale, qw.scale)
    if symmetric:
        assert offset is None
    else:
        assert same_f16(offset, qw.offset)
    assert pw.shape == (n, k) and pw.bits == bits and pw.symmetric == symmetric
    assert pw.group_size == (k if group_size is None or group_size >= k else group_size)
    w_deq = pw.dequantize()
    assert np.array_equal(w_deq, ref.dequantize_weight(qw))
    # round to nearest: every weight within half a step (plus float16 rounding of the offset)
    step = np.repeat(scale.astype(np.float32), pw.group_size, axis=1)[:, :k]
    slack = 0 if symmetric else np.repeat(np.abs(offset.astype(np.float32)), pw.group_size, axis=1)[:, :k] * 2.0 ** -10
    inside = np.abs(w - w_deq) <= step * 0.5 * (1 + 1e-3) + slack + 1e-7
    clipped = ~inside  # only the clipped ends may be further (symmetric -8 / fp16 range edges)
    assert clipped.mean() < 0.01


def _native(bits):
    """The layout pack_weight produces at the active level (layout.h)."""
    if platform.machine() not in ("aarch64", "arm64"):
        return "nr8_kr4"
    if qlinear.cpu_info()["active_isa"] == "i8mm":
        return "nr8_kr8_s8" if bits == 8 else "nr8_kr8"
    return "nr8_kr4_s8" if bits == 8 else "nr8_kr4"


def _read_at_speed(isa, layout, bits):
    """Whether a level's own kernels run a weight of this layout (else the scalar ones do): its
    own layout, and on the i8mm level the dotprod level's too (the scalar level: every one)."""
    arm = {4: {"nr8_kr4"}, 8: {"nr8_kr4_s8"}}
    every = {"nr8_kr4", "nr8_kr4_s8", "nr8_kr8", "nr8_kr8_s8"}
    reads = {"scalar": {4: every, 8: every}, "neon": arm, "fp16": arm, "dotprod": arm,
             "i8mm": {4: {"nr8_kr4", "nr8_kr8"}, 8: {"nr8_kr4_s8", "nr8_kr8_s8"}}}
    return layout in reads.get(isa, {4: {"nr8_kr4"}, 8: {"nr8_kr4"}})[bits]   # x86 levels: nr8_kr4


def test_bits_per_weight_and_layout(rng):
    w = rng.standard_normal((4096, 4096)).astype(np.float32)
    pw = qlinear.pack_weight(w, bits=4, group_size=64)
    assert pw.bits_per_weight == pytest.approx(4.5)  # 4 + 2 x 16 bits per 64 weights
    assert qlinear.pack_weight(w[:64], bits=4, group_size=128, symmetric=True).bits_per_weight == pytest.approx(4.125)
    assert pw.nbytes == 4096 * 4096 * 9 // 16
    assert pw.layout == _native(4)
    assert pw.scale_dtype == np.float16


def test_native_layouts():
    """Weights are packed in the active level's layout: x86 nr8_kr4; ARM int8 codes flipped
    (nr8_kr4_s8); the i8mm level 8 k of a row together (nr8_kr8 / nr8_kr8_s8)."""
    w = np.ones((8, 64), np.float32)
    assert qlinear.cpu_info()["layout"] == _native(8)
    for bits in (4, 8):
        assert qlinear.pack_weight(w, bits=bits).layout == _native(bits)
        assert qlinear._core.native_layout(bits) == _native(bits)


def test_the_layouts_a_level_reads(isa):
    for layout, bits in (("nr8_kr4", 4), ("nr8_kr8", 4), ("nr8_kr4", 8), ("nr8_kr4_s8", 8), ("nr8_kr8_s8", 8)):
        assert qlinear._core.reads_layout(layout, bits) == _read_at_speed(isa, layout, bits), (layout, bits)
    assert not qlinear._core.reads_layout("nr8_kr8", 8)    # int4-only / int8-only names
    assert not qlinear._core.reads_layout("nr8_kr8_s8", 4)
    with pytest.raises(ValueError, match="unknown packed layout"):
        qlinear._core.reads_layout("nr4", 4)


def _code_bytes(codes, block, symmetric, bits, kr, flip):
    """The bytes of a packed weight (kr 4 or 8) from its codes, the layout as layout.h documents it,
    and True where a byte holds a real code (row < N, k < K)."""
    n, k = codes.shape
    nb, npan = -(-k // block), -(-n // 8)
    block_bytes = 8 * block * bits // 8 + 16 * (1 if symmetric else 2)
    out, real = np.zeros(npan * nb * block_bytes, np.uint8), np.zeros(npan * nb * block_bytes, bool)
    for p in range(npan):
        for b in range(nb):
            base = (p * nb + b) * block_bytes
            for r in range(min(8, n - 8 * p)):
                for j in range(min(block, k - b * block)):
                    code = int(codes[8 * p + r, b * block + j])
                    if bits == 8:   # k = b * block + j: chunk j // kr, byte j % kr
                        at = base + (j // kr) * 8 * kr + r * kr + j % kr
                        out[at] = code ^ flip
                    else:           # chunk j // 2kr; its first kr k in the low nibbles, the next kr in the high
                        within = j % (2 * kr)
                        at = base + (j // (2 * kr)) * 8 * kr + r * kr + within % kr
                        out[at] |= code << (0 if within < kr else 4)
                    real[at] = True
    return out, real


@pytest.mark.parametrize("bits, layout", [(8, "nr8_kr4_s8"), (8, "nr8_kr8_s8"), (4, "nr8_kr8")])
@pytest.mark.parametrize("symmetric", [True, False])
def test_other_layouts(isa, rng, symmetric, bits, layout):
    """ARM's layouts: nr8_kr4_s8 (nr8_kr4 with each int8 code ^ 0x80) and the i8mm level's
    nr8_kr8_s8 (8 k of a row together, codes ^ 0x80) and nr8_kr8 (int4: 16 k of a row in 8 bytes),
    byte for byte as layout.h says; every layout gives the same results to the bit at the scalar
    level (a layout the level reads runs its kernels, another the scalar ones)."""
    n, k, group = 13, 200, 64
    w = rng.standard_normal((n, k)).astype(np.float32)
    codes, scale, offset = qlinear.pack_weight(w, bits=bits, group_size=group, symmetric=symmetric).unpack()
    plain = qlinear.pack_quantized(codes, scale, offset, bits, group, symmetric, layout="nr8_kr4")
    other = qlinear.pack_quantized(codes, scale, offset, bits, group, symmetric, layout=layout)
    assert (plain.layout, other.layout) == ("nr8_kr4", layout)
    rest = []   # each layout's bytes with its codes zeroed: scales, offsets, zero padding
    for pw, kr, flip in ((plain, 4, 0), (other, 8 if "kr8" in layout else 4, 0x80)):
        want, real = _code_bytes(codes, group, symmetric, bits, kr, flip)
        got = np.array(pw.buffer, copy=True)
        np.testing.assert_array_equal(got[real], want[real])
        got[real] = 0
        rest.append(got)
    np.testing.assert_array_equal(rest[0], rest[1])
    for got, want in zip(other.unpack(), (codes, scale, offset)):
        np.testing.assert_array_equal(got, want)
    for m in (1, 5, 37):
        x = rng.standard_normal((m, k)).astype(np.float32)
        for xx, kw in ((x, {}), (x, {"act_block": None}), (x, {"act": "float"}), (x.astype(np.float16), {"act": "float"})):
            got = [qlinear.matmul(xx, pw, **kw) for pw in (plain, other)]
            qlinear.set_isa("scalar")   # the scalar level reads every layout, to the same bits
            want = [qlinear.matmul(xx, pw, **kw) for pw in (plain, other)]
            qlinear.set_isa(isa)
            np.testing.assert_array_equal(want[0], want[1])
            tol = 1e-5 if xx.dtype == np.float32 else 2e-3   # (fp16 in, fp16 out: its last bit)
            for g in got:   # a SIMD level's float epilogue may round differently from the scalar one
                np.testing.assert_allclose(g, want[0], rtol=tol, atol=tol * np.abs(want[0]).max())
        for pw in (plain, other):
            ran = qlinear.kernel_info(pw, m)["int8"][0]["name"]
            assert ("scalar" in ran) == (isa == "scalar" or not _read_at_speed(isa, pw.layout, bits)), (pw.layout, ran)


def test_int4_and_int8_names_of_a_layout(rng):
    """A layout asked for a width it has no variant of gives that width's one of the same kr."""
    w = rng.standard_normal((9, 64)).astype(np.float32)
    for bits, asked, got in ((4, "nr8_kr4_s8", "nr8_kr4"), (4, "nr8_kr8_s8", "nr8_kr8"), (8, "nr8_kr8", "nr8_kr8_s8")):
        c, s, o = qlinear.pack_weight(w, bits=bits, group_size=32).unpack()
        pw = qlinear.pack_quantized(c, s, o, bits, 32, False, layout=asked)
        assert pw.layout == got
        np.testing.assert_array_equal(pw.buffer, qlinear.pack_quantized(c, s, o, bits, 32, False, layout=got).buffer)


@pytest.mark.parametrize("bits", [4, 8])
def test_file_of_the_other_layout_loads_in_the_native_one(tmp_path, rng, bits):
    """A weight saved on another CPU (family or level) loads in this one's layout, same codes."""
    w = rng.standard_normal((19, 96)).astype(np.float32)
    codes, scale, offset = qlinear.pack_weight(w, bits=bits, group_size=32).unpack()
    native = _native(bits)
    layouts = {"nr8_kr4", "nr8_kr4_s8", "nr8_kr8_s8"} if bits == 8 else {"nr8_kr4", "nr8_kr8"}
    for other in layouts - {native}:
        qlinear.save_weight(tmp_path / "w.qlw", qlinear.pack_quantized(codes, scale, offset, bits, 32, False, layout=other))
        got = qlinear.load_weight(tmp_path / "w.qlw")
        assert got.layout == native
        for a, b in zip(got.unpack(), (codes, scale, offset)):
            np.testing.assert_array_equal(a, b)


def test_constant_and_zero_groups_dequantize_exactly():
    w = np.zeros((3, 96), np.float32)
    w[1] = 0.5          # constant groups (hi == lo): scale 0, the offset carries the value
    w[2, :32] = -2.0
    for bits in (4, 8):
        pw = qlinear.pack_weight(w, bits=bits, group_size=32, symmetric=False)
        assert np.array_equal(pw.dequantize(), w)
        zeros = qlinear.pack_weight(np.zeros_like(w), bits=bits, group_size=32, symmetric=True)
        assert np.array_equal(zeros.dequantize(), np.zeros_like(w))  # absmax 0: no division


def test_float16_and_float64_weights_give_float32_result(rng):
    w = rng.standard_normal((10, 70)).astype(np.float16)
    a = qlinear.pack_weight(w).unpack()
    b = qlinear.pack_weight(w.astype(np.float32)).unpack()
    c = qlinear.pack_weight(w.astype(np.float64)).unpack()
    for x, y, z in zip(a, b, c):
        assert np.array_equal(x, y) and np.array_equal(y, z)


def test_pack_quantized_round_trips(rng):
    w = rng.standard_normal((19, 200)).astype(np.float32)
    for sym in (False, True):
        pw = qlinear.pack_weight(w, bits=4, group_size=64, symmetric=sym)
        codes, scale, offset = pw.unpack()
        again = qlinear.pack_quantized(codes, scale, offset, 4, 64, sym)
        assert np.array_equal(again.buffer, pw.buffer)


def test_pack_quantized_rejects_out_of_range_codes():
    codes = np.full((8, 64), 16, np.uint8)
    scale = np.ones((8, 1), np.float16)
    with pytest.raises(ValueError, match="codes exceed 15"):
        qlinear.pack_quantized(codes, scale, scale, 4, 64, False)
