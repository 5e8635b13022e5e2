"""Every micro-kernel of this build, run directly by its descriptor (qlinear._core._run_ukernel:
that level's activation packing, then the kernel on the whole request, one thread), against the
numpy reference over shapes around its register tile and the weight's block: M from the smallest
it serves to 2 * mr + 1 beyond, N around its tile width (nr - 1, nr, nr + 1, 2 nr + 1), K around
the block (block - 1 .. 2 block + 1 and non-multiples), int4 / int8, symmetric / asymmetric,
group 32 / 64 / 128 / per-channel. The public-API tests stay in test_matmul.py / test_float_path.py;
the levels emulated by a QLINEAR_EMULATE_X86 build are listed and run here too."""

import zlib

import numpy as np
import pytest

import qlinear
from qlinear import _core
from _check import assert_close_to_reference, assert_float_path_close

UKERNELS = _core._ukernels()


def _id(k):
    return f"{k['isa']}:{k['name']}"


def _rows(uk):
    """M values the kernel serves: m_min .. m_min + 2 mr + 1 in its units, and one past a
    tiled GEMM's largest row chunk (96)."""
    lo, hi, unit = uk["m_min"], uk["m_max"], uk["m_unit"]
    ms = [m for m in range(lo, lo + 2 * uk["mr"] + 2) if m <= hi and m % unit == 0]
    if hi > 200:
        ms.append(197 // unit * unit)
    return ms


def _cases(uk, rng):
    """(m, n, k, group, symmetric) tuples: every M x every N with K and group cycling, then the
    K sweep around the block at the largest small M."""
    nr = uk["nr"]
    ns = [max(1, nr - 1), nr, nr + 1, 2 * nr + 1]
    groups = [32, 64, 128, None]
    cases = []
    i = 0
    for m in _rows(uk):
        for n in ns:
            g = groups[i % 4]
            block = g or 256
            k = [block - 1, block, block + 1, 2 * block + 1, block + 7, 3 * block - 5][i % 6] if g else [31, 200, 257, 300][i % 4]
            cases.append((m, n, max(1, k), g, bool(i % 2)))
            i += 1
    m = _rows(uk)[min(len(_rows(uk)) - 1, 2)]
    for g in (32, 64, 128):
        for k in (g - 1, g, g + 1, 2 * g - 1, 2 * g, 2 * g + 1, g + 13):
            cases.append((m, nr + 1, k, g, bool(k % 2)))
    # N over more than 8 panels (kernels that walk the panels in groups), about a row tile's M
    m = _rows(uk)[min(len(_rows(uk)) - 1, uk["mr"] - 1)]
    cases += [(m, 9 * nr + 3, 200, 64, False), (m, 9 * nr + 3, 300, None, True)]
    return cases


def _check(uk, rng, m, n, k, g, symmetric):
    w = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
    # in the layout the kernel's level reads (on an i8mm CPU the active level packs int8 for SMMLA)
    pw = qlinear.PackedWeight(_core.quantize_and_pack(w, uk["bits"], g or k, symmetric, uk["layout"]))
    x = rng.standard_normal((m, k)).astype(np.float16 if uk["family"] == "float16" else np.float32)
    bias = rng.standard_normal(n).astype(np.float32) if m % 2 else None
    where = f"m={m} n={n} k={k} group={g} symmetric={symmetric}"
    if uk["family"] == "int8":
        per_row = (m + n) % 2 == 0
        act_block = pw._h.k if per_row else pw._h.block
        y = _core._run_ukernel(uk["isa"], "int8", uk["name"], x, pw._h, bias, act_block)
        assert y.shape == (m, n), where
        assert_close_to_reference(y, x, pw, bias=bias, act_block=None if per_row else pw._h.block)
    elif uk["family"] == "float32":
        y = _core._run_ukernel(uk["isa"], "float32", uk["name"], x, pw._h, bias, pw._h.k)
        assert_float_path_close(y, x, pw, bias=bias)
    else:  # FP16 arithmetic: step for step its scalar twin
        y = _core._run_ukernel(uk["isa"], "float16", uk["name"], x, pw._h, bias, pw._h.k)
        twin = _core.matmul_float16_twin(x, pw._h, bias, None, pw._h.k)
        np.testing.assert_array_equal(y, twin, err_msg=where)


@pytest.mark.parametrize("uk", UKERNELS, ids=_id)
def test_ukernel_against_reference(uk):
    rng = np.random.default_rng(zlib.crc32(_id(uk).encode()))
    for m, n, k, g, symmetric in _cases(uk, rng):
        _check(uk, rng, m, n, k, g, symmetric)


@pytest.mark.parametrize("uk", [u for u in UKERNELS if u["m_max"] > 1], ids=_id)
def test_gemm_row_tiles_over_long_k(uk):
    """GEMMs at M around the row tiles of every level (4, 8, 12, 24 rows and their tails), K
    several times the block and past 512 (the dotprod GEMM packs its rows' activations 512 k at a
    time and carries the sums from one such slab to the next), odd N."""
    rng = np.random.default_rng(zlib.crc32(("long_k " + _id(uk)).encode()))
    ms = [m for m in (2, 11, 12, 13, 23, 24, 25, 49) if uk["m_min"] <= m <= uk["m_max"] and m % uk["m_unit"] == 0]
    shapes = [(1100, 32), (1025, 64), (1300, None), (641, 128)]
    for i, m in enumerate(ms):
        k, g = shapes[i % len(shapes)]
        _check(uk, rng, m, [9, 17][i % 2], k, g, bool(i % 3))


@pytest.mark.parametrize("uk", [u for u in UKERNELS if u["m_max"] > 1 and u["family"] == "int8"], ids=_id)
def test_gemm_staged_panels(uk):
    """GEMMs of several row tiles per call (the i8mm GEMM stages its panels, 4 at a time, from 19
    rows on for int4 and 25 for int8): M at and past those counts with a short last tile, N over
    several staging groups with a partial last one, every block size, K past one block."""
    rng = np.random.default_rng(zlib.crc32(("staged " + _id(uk)).encode()))
    ms = [m for m in (13, 19, 25, 37, 61) if uk["m_min"] <= m <= uk["m_max"] and m % uk["m_unit"] == 0]
    shapes = [(200, 64, False), (257, 128, True), (96, 32, False), (300, None, True), (520, 256, False)]
    for i, m in enumerate(ms):
        for j, (k, g, sym) in enumerate(shapes):
            _check(uk, rng, m, [77, 33][(i + j) % 2], k, g, sym)


@pytest.mark.parametrize("bits", [4, 8])
def test_int8_kernels_agree_bit_for_bit(bits):
    """Every int8-activation kernel of every SIMD level gives the same bits for the same request:
    the integer sums are exact and the float epilogue is the same operations in the same order,
    whatever the tile (a GEMV row by row, the GEMMs around their tile heights)."""
    rng = np.random.default_rng(bits)
    ks = [k for k in UKERNELS if k["family"] == "int8" and k["bits"] == bits and k["isa"] != "scalar"]
    for sym, g, n, k in ((False, 64, 75, 200), (True, 32, 9, 300), (False, None, 17, 300), (True, 128, 8, 257)):
        w = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
        pw = qlinear.pack_weight(w, bits=bits, group_size=g, symmetric=sym)
        # the same codes in each level's layout (int8: the i8mm level's differs from the others')
        packed = {uk["layout"]: qlinear.pack_quantized(*pw.unpack(), bits, g, sym, layout=uk["layout"]) for uk in ks}
        for m in (2, 13, 25, 37):
            x = rng.standard_normal((m, k)).astype(np.float32)
            bias = rng.standard_normal(n).astype(np.float32)
            for act_block in (pw._h.k, pw._h.block):
                outs = {}
                for uk in ks:
                    rows = [x] if uk["m_max"] >= m else [x[i:i + 1] for i in range(m)]
                    if all(uk["m_min"] <= len(r) <= uk["m_max"] and len(r) % uk["m_unit"] == 0 for r in rows):
                        outs[_id(uk)] = np.concatenate(
                            [_core._run_ukernel(uk["isa"], "int8", uk["name"], r, packed[uk["layout"]]._h, bias, act_block)
                             for r in rows])
                first = next(iter(outs))
                for name, y in outs.items():
                    np.testing.assert_array_equal(y, outs[first], err_msg=f"{name} vs {first}: m={m} n={n} k={k} group={g}")


def test_every_level_lists_its_kernels():
    """Each level this build can run has, per weight width, a kernel for one row and one for many,
    and every name states its tile and level (scheme_layout_tile_level)."""
    for isa in qlinear.cpu_info()["available_isas"]:
        for family in ("int8", "float32"):
            for bits in (4, 8):
                ks = [k for k in UKERNELS if k["isa"] == isa and k["family"] == family and k["bits"] == bits]
                assert any(k["m_min"] == 1 for k in ks), (isa, family, bits)
                assert any(k["m_max"] > 1000 for k in ks), (isa, family, bits)
    levels = {"avx2", "avxvnni", "avx512vnni", "amx", "neon", "fp16", "dotprod", "i8mm"}
    for k in UKERNELS:
        if k["isa"] != "scalar":  # a level may list a lower level's kernel (amx: avx512vnni's GEMV)
            assert k["name"].rsplit("_", 1)[1] in levels, k["name"]
            assert f"_{k['mr']}x{k['nr']}_" in k["name"], k["name"]


def test_a_kernel_refuses_what_it_does_not_serve(rng):
    pw = qlinear.pack_weight(rng.standard_normal((16, 64)).astype(np.float32), bits=4)
    gemv = next(k for k in UKERNELS if k["family"] == "int8" and k["bits"] == 4 and k["m_max"] == 1)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    with pytest.raises(ValueError, match="does not serve 3 rows"):
        _core._run_ukernel(gemv["isa"], "int8", gemv["name"], x, pw._h, None, 64)
    pw8 = qlinear.pack_weight(rng.standard_normal((16, 64)).astype(np.float32), bits=8)
    with pytest.raises(ValueError, match="8-bit"):
        _core._run_ukernel(gemv["isa"], "int8", gemv["name"], x[:1], pw8._h, None, 64)
    with pytest.raises(ValueError, match="no kernel named"):
        _core._run_ukernel("scalar", "int8", "gemm_w4a8_nope", x, pw._h, None, 64)
    with pytest.raises(ValueError, match="family"):
        _core._run_ukernel("scalar", "int4", gemv["name"], x, pw._h, None, 64)


@pytest.mark.parametrize("m", [1, 2, 5, 11, 12, 13, 16, 17, 40, 97])
def test_kernel_info_names_what_runs(isa, rng, m):
    """kernel_info(pw, m) names the kernels that will run: their rows cover [0, m) without gap,
    each serves its rows, and the result equals running them one by one."""
    pw = qlinear.pack_weight(rng.standard_normal((24, 96)).astype(np.float32), bits=4, group_size=32)
    info = qlinear.kernel_info(pw, m=m)
    assert info["isa"] == isa and info["m"] == m
    by_name = {k["name"]: k for k in UKERNELS if k["isa"] == isa}
    for family in ("int8", "float"):
        runs = info[family]
        assert runs[0]["rows"][0] == 0 and runs[-1]["rows"][1] == m
        assert all(a["rows"][1] == b["rows"][0] for a, b in zip(runs, runs[1:]))
        for r in runs:
            k = by_name[r["name"]]
            rows = r["rows"][1] - r["rows"][0]
            assert k["m_min"] <= rows <= k["m_max"] or k["m_unit"] > 1, (r, k)
            assert (r["mr"], r["nr"]) == (k["mr"], k["nr"])
    x = rng.standard_normal((m, 96)).astype(np.float32)
    y = qlinear.matmul(x, pw, act="int8", act_block=None)
    parts = [_core._run_ukernel(isa, "int8", r["name"], np.ascontiguousarray(x[r["rows"][0]:r["rows"][1]]),
                                pw._h, None, 96) for r in info["int8"]]
    np.testing.assert_array_equal(y, np.concatenate(parts))
    if m == 1:
        assert info["int8"][0]["name"] == qlinear.kernel_info(pw)["gemv"]


def test_kernel_info_rejects_bad_m(rng):
    pw = qlinear.pack_weight(rng.standard_normal((8, 32)).astype(np.float32))
    with pytest.raises(ValueError, match="m must be >= 1"):
        qlinear.kernel_info(pw, m=0)
    with pytest.raises(TypeError, match="m must be an int"):
        qlinear.kernel_info(pw, m=2.0)
