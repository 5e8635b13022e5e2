"""Saving and loading packed weights: round trips, and hostile files rejected with ValueError."""

import json
import struct
import zlib

import numpy as np
import pytest

import qlinear


@pytest.fixture
def saved(tmp_path, rng):
    w = rng.standard_normal((40, 200)).astype(np.float32)
    pw = qlinear.pack_weight(w, bits=4, group_size=64)
    path = tmp_path / "w.qlw"
    qlinear.save_weight(path, pw)
    return pw, path


@pytest.mark.parametrize("mmap", [True, False])
def test_round_trip(saved, rng, mmap):
    pw, path = saved
    back = qlinear.load_weight(path, mmap=mmap)
    assert back.shape == pw.shape and back.bits == pw.bits and back.group_size == pw.group_size
    assert back.symmetric == pw.symmetric and back.layout == pw.layout
    assert np.array_equal(back.buffer, pw.buffer)
    x = rng.standard_normal((3, 200)).astype(np.float32)
    assert np.array_equal(qlinear.matmul(x, back), qlinear.matmul(x, pw))


def test_many_tensors_and_metadata(tmp_path, rng):
    ws = {f"layer{i}": qlinear.pack_weight(rng.standard_normal((8 + i, 64)).astype(np.float32),
                                           bits=8 if i % 2 else 4, group_size=32, symmetric=bool(i % 2))
          for i in range(4)}
    qlinear.save_weights(tmp_path / "m.qlw", ws, metadata={"model": "test", "n": 4})
    back, meta = qlinear.load_weights(tmp_path / "m.qlw")
    assert meta == {"model": "test", "n": 4}
    assert set(back) == set(ws)
    for name in ws:
        assert np.array_equal(back[name].buffer, ws[name].buffer)


def test_mmap_is_not_a_copy(saved):
    _, path = saved
    back = qlinear.load_weight(path, mmap=True)
    assert not back.buffer.flags.owndata and not back.buffer.flags.writeable


def test_truncated_files(saved):
    _, path = saved
    data = path.read_bytes()
    for cut in (0, 7, 20, 40, len(data) // 2, len(data) - 1):
        path.write_bytes(data[:cut])
        with pytest.raises(ValueError, match="not a valid qlinear weight file"):
            qlinear.load_weight(path)


def test_bit_flips_are_detected(saved, rng):
    _, path = saved
    data = bytearray(path.read_bytes())
    for pos in list(range(0, 32)) + list(rng.integers(32, len(data), 40)):
        bad = bytearray(data)
        bad[pos] ^= 1 << int(rng.integers(0, 8))
        path.write_bytes(bytes(bad))
        try:
            qlinear.load_weight(path)
        except ValueError:
            continue
        # A flip can only go unnoticed in padding bytes, never in the header or data.
        header_len = struct.unpack_from("<I", data, 12)[0]
        assert 32 + header_len <= pos < 32 + header_len + 64 or pos >= len(data) - 64, pos


def write_with_header(path, header: dict, data: bytes = b""):
    hb = json.dumps(header).encode()
    prefix = struct.pack("<8sIII12x", b"QLINEAR\0", 1, len(hb), zlib.crc32(hb))
    start = -(-(32 + len(hb)) // 64) * 64
    path.write_bytes(prefix + hb + b"\0" * (start - 32 - len(hb)) + data)


def entry(**kw):
    e = {"shape": [8, 64], "bits": 4, "group_size": 64, "symmetric": False,
         "layout": qlinear.cpu_info()["layout"], "scale_dtype": "float16", "offset": 0,
         "nbytes": 288, "crc32": zlib.crc32(bytes(288))}
    e.update(kw)
    return {"tensors": {"w": e}}


@pytest.mark.parametrize("bad", [
    {"shape": [1 << 40, 1 << 40]}, {"shape": [8]}, {"shape": [-8, 64]}, {"shape": "x"},
    {"nbytes": 1 << 50}, {"nbytes": 100}, {"offset": 1 << 62}, {"offset": 3},
    {"bits": 3}, {"bits": "4"}, {"group_size": 0}, {"group_size": 48}, {"layout": "nope"},
    {"symmetric": "yes"}, {"scale_dtype": "float32"}, {"crc32": 5},
])
def test_hostile_headers(tmp_path, bad):
    path = tmp_path / "bad.qlw"
    write_with_header(path, entry(**bad), bytes(288))
    with pytest.raises(ValueError):
        qlinear.load_weight(path)


def test_valid_handmade_file_loads(tmp_path):
    path = tmp_path / "ok.qlw"
    write_with_header(path, entry(), bytes(288))
    pw = qlinear.load_weight(path)
    assert pw.shape == (8, 64)
    assert np.array_equal(pw.dequantize(), np.zeros((8, 64), np.float32))


def test_oversized_header_length_and_bad_magic(tmp_path):
    path = tmp_path / "h.qlw"
    path.write_bytes(struct.pack("<8sIII12x", b"QLINEAR\0", 1, 0xFFFFFFFF, 0) + b"{}")
    with pytest.raises(ValueError, match="header length"):
        qlinear.load_weight(path)
    path.write_bytes(b"\x80\x04\x95" + bytes(100))  # a pickle is not a weight file
    with pytest.raises(ValueError, match="bad magic"):
        qlinear.load_weight(path)
    path.write_bytes(struct.pack("<8sIII12x", b"QLINEAR\0", 99, 2, zlib.crc32(b"{}")) + b"{}")
    with pytest.raises(ValueError, match="version 99"):
        qlinear.load_weight(path)
    write_with_header(path, {"tensors": []})
    with pytest.raises(ValueError, match="tensor table"):
        qlinear.load_weight(path)


def test_load_weight_needs_exactly_one_tensor(tmp_path, rng):
    ws = {n: qlinear.pack_weight(rng.standard_normal((8, 32)).astype(np.float32)) for n in "ab"}
    qlinear.save_weights(tmp_path / "two.qlw", ws)
    with pytest.raises(ValueError, match="holds 2 tensors"):
        qlinear.load_weight(tmp_path / "two.qlw")


@pytest.mark.parametrize("mmap", [True, False])
def test_arrays_beside_packed_weights(tmp_path, rng, mmap):
    from qlinear._format import BFloat16Array
    f32 = rng.standard_normal((5, 7)).astype(np.float32)
    bf16 = BFloat16Array((f32.view(np.uint32) >> 16).astype(np.uint16))
    ws = {"w": qlinear.pack_weight(rng.standard_normal((8, 64)).astype(np.float32)),
          "norm": f32[0], "table": bf16, "f16": f32.astype(np.float16).T, "ids": np.arange(3, dtype=np.int32),
          "empty": np.zeros((0, 4), np.float32)}
    qlinear.save_weights(tmp_path / "m.qlw", ws, metadata={"kind": "model"})
    back, meta = qlinear.load_weights(tmp_path / "m.qlw", mmap_mode=mmap)
    assert meta == {"kind": "model"} and set(back) == set(ws)
    assert np.array_equal(back["w"].buffer, ws["w"].buffer)
    for name in ("norm", "f16", "ids", "empty"):
        assert back[name].dtype == ws[name].dtype and np.array_equal(back[name], ws[name])
    assert isinstance(back["table"], BFloat16Array) and np.array_equal(back["table"].bits, bf16.bits)
    np.testing.assert_allclose(back["table"].to_float32(), f32, rtol=2 ** -7)
    with pytest.raises(ValueError, match="holds 6 tensors"):
        qlinear.load_weight(tmp_path / "m.qlw")


def test_unsupported_arrays_are_refused(tmp_path):
    for bad in (np.zeros(3, np.float64), np.zeros(3, np.int8), [1.0, 2.0]):
        with pytest.raises(TypeError):
            qlinear.save_weights(tmp_path / "x.qlw", {"a": bad})


def array_entry(**kw):
    e = {"kind": "array", "dtype": "float32", "shape": [4, 8], "offset": 0, "nbytes": 128,
         "crc32": zlib.crc32(bytes(128))}
    e.update(kw)
    return {"tensors": {"a": e}}


@pytest.mark.parametrize("bad", [
    {"dtype": "float64"}, {"dtype": None}, {"shape": [4, 9]}, {"shape": [1 << 40, 1 << 40]},
    {"shape": [-4, -8]}, {"shape": "x"}, {"shape": [1] * 9}, {"nbytes": 1 << 50}, {"crc32": 1},
])
def test_hostile_array_entries(tmp_path, bad):
    path = tmp_path / "bad.qlw"
    hb = json.dumps(array_entry(**bad)).encode()
    prefix = struct.pack("<8sIII12x", b"QLINEAR\0", 2, len(hb), zlib.crc32(hb))
    start = -(-(32 + len(hb)) // 64) * 64
    path.write_bytes(prefix + hb + b"\0" * (start - 32 - len(hb)) + bytes(128))
    with pytest.raises(ValueError, match="not a valid qlinear weight file"):
        qlinear.load_weights(path)
