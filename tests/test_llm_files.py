"""Hostile model files: the LLM loaders (safetensors checkpoints, converted model files,
tokenizer and config files) reject truncated, bit-flipped and absurd files with ValueError --
no crash, no giant allocation, no pickle. And loading a converted model costs about its size."""

import json
import os
import struct
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")
pytest.importorskip("torch")
pytest.importorskip("transformers")

from qlinear import llm  # noqa: E402
from qlinear.llm import synthetic  # noqa: E402
from qlinear.llm.hf.safetensors_file import SafetensorsFile  # noqa: E402


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return synthetic.make_checkpoint(tmp_path_factory.mktemp("files") / "hf", shape="tiny", seed=3,
                                     hidden_size=128, intermediate_size=256)


@pytest.fixture(scope="module")
def converted(ckpt, tmp_path_factory):
    return llm.convert(ckpt, tmp_path_factory.mktemp("conv") / "q4", bits=4, progress=False)


def copy_dir(src, dst):
    dst.mkdir()
    for p in src.iterdir():
        (dst / p.name).write_bytes(p.read_bytes())
    return dst


def write_safetensors(path, header: dict, data: bytes = b"", hlen=None):
    hb = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(hb) if hlen is None else hlen) + hb + data)


@pytest.mark.parametrize("header, data, hlen", [
    ({}, b"", 1 << 62),                                                                 # header length beyond the file
    ({"w": {"dtype": "F32", "shape": [1 << 40, 1 << 40], "data_offsets": [0, 16]}}, bytes(16), None),
    ({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 1 << 60]}}, bytes(16), None),
    ({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [8, 0]}}, bytes(16), None),
    ({"w": {"dtype": "F32", "shape": [2, -2], "data_offsets": [0, 16]}}, bytes(16), None),
    ({"w": {"dtype": "X9", "shape": [2, 2], "data_offsets": [0, 16]}}, bytes(16), None),
    ({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 16]}}, bytes(16), None),
    ({"w": [1, 2, 3]}, b"", None),
])
def test_hostile_safetensors_headers(tmp_path, header, data, hlen):
    path = tmp_path / "model.safetensors"
    write_safetensors(path, header, data, hlen)
    with pytest.raises(ValueError, match="not a valid safetensors file"):
        SafetensorsFile(path)


def test_safetensors_bit_flips_and_truncation(ckpt, tmp_path, rng):
    data = (ckpt / "model.safetensors").read_bytes()
    (hlen,) = struct.unpack_from("<Q", data)
    path = tmp_path / "model.safetensors"
    rejected = 0
    for pos in list(range(8)) + [int(p) for p in rng.integers(8, 8 + hlen, 60)]:
        bad = bytearray(data)
        bad[pos] ^= 1 << int(rng.integers(0, 8))
        path.write_bytes(bytes(bad))
        try:
            st = SafetensorsFile(path)
        except ValueError:
            rejected += 1
            continue
        for name in st.keys():  # a flip that keeps the header valid still reads inside the file
            st.raw(name)
    assert rejected >= 30
    for cut in (0, 7, 8 + hlen // 2, 8 + hlen, len(data) // 2, len(data) - 1):
        path.write_bytes(data[:cut])
        with pytest.raises(ValueError, match="not a valid safetensors file"):
            SafetensorsFile(path)


def test_converted_model_fuzz(converted, tmp_path, rng):
    d = copy_dir(converted, tmp_path / "c")
    f = d / "model.qlinear"
    data = f.read_bytes()
    (hlen,) = struct.unpack_from("<I", data, 12)
    data_start = -(-(32 + hlen) // 64) * 64
    for pos in list(range(32)) + [int(p) for p in rng.integers(32, len(data), 60)]:
        bad = bytearray(data)
        bad[pos] ^= 1 << int(rng.integers(0, 8))
        f.write_bytes(bytes(bad))
        try:
            llm.load(d, progress=False)
        except ValueError:
            continue
        # only padding may change unnoticed (between the header and the data, between tensors)
        assert 32 + hlen <= pos < data_start or pos >= data_start, pos
    for cut in (10, 32 + hlen // 2, data_start + 100, len(data) - 1):
        f.write_bytes(data[:cut])
        with pytest.raises(ValueError, match="not a valid qlinear weight file"):
            llm.load(d, progress=False)


def test_converted_model_with_a_foreign_metadata(converted, tmp_path, rng):
    import qlinear

    d = copy_dir(converted, tmp_path / "m")
    tensors, meta = qlinear.load_weights(d / "model.qlinear", mmap_mode=False)
    for bad_meta in ({**meta, "format": "something-else"}, {**meta, "version": 99},
                     {**meta, "config": {**meta["config"], "hidden_size": "x"}},
                     {**meta, "config": {"arch": "qwen2"}}):
        qlinear.save_weights(d / "model.qlinear", tensors, bad_meta)
        with pytest.raises((ValueError, TypeError)):
            llm.load(d, progress=False)
    qlinear.save_weights(d / "model.qlinear", {k: v for k, v in tensors.items() if k != "layers.1.down"}, meta)
    with pytest.raises(ValueError, match="layers.1.down"):
        llm.load(d, progress=False)


@pytest.mark.parametrize("patch", [
    {"hidden_size": 1 << 40}, {"num_hidden_layers": 1 << 40}, {"num_attention_heads": 0},
    {"num_key_value_heads": 3}, {"vocab_size": -5}, {"intermediate_size": "big"},
    {"hidden_act": "gelu"}, {"rope_scaling": {"rope_type": "yarn", "factor": 4}},
    {"model_type": None},
])
def test_hostile_configs(ckpt, tmp_path, patch):
    d = copy_dir(ckpt, tmp_path / "h")
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, **patch}))
    with pytest.raises(ValueError):
        llm.load(d, progress=False)


@pytest.mark.parametrize("name, content", [
    ("config.json", b"{not json"), ("tokenizer.json", b"\x80\x04\x95 a pickle"),
    ("tokenizer.json", b'{"model": {"type": "Nope"}}'), ("tokenizer_config.json", b"[1, 2"),
])
def test_corrupt_side_files(ckpt, tmp_path, name, content):
    d = copy_dir(ckpt, tmp_path / "s")
    (d / name).write_bytes(content)
    with pytest.raises(ValueError):
        llm.load(d, progress=False)


def test_loading_a_converted_model_costs_about_its_size(tmp_path):
    """Peak RSS of loading a converted model and generating from it (disk embedding) stays
    within 1.1x the model file's size: the packed weights are mapped, never copied."""
    src = synthetic.make_checkpoint(tmp_path / "hf", shape="tiny", seed=5, hidden_size=512, intermediate_size=2048,
                                    num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
                                    vocab_size=16384)
    out = llm.convert(src, tmp_path / "q8", bits=8, group_size=64, progress=False)
    size = os.path.getsize(out / "model.qlinear")
    script = textwrap.dedent(f"""
        from qlinear import llm
        from qlinear.llm.runtime.stats import peak_rss_mb
        def rss():
            with open("/proc/self/status") as f:
                return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmRSS:"))
        warm = llm.load({str(src)!r}, bits=4, max_context=64, progress=False)  # every code path once
        warm.generate_ids([1, 2, 3], 2)
        del warm
        with open("/proc/self/clear_refs", "w") as f:  # restart VmHWM from the current RSS
            f.write("5")
        before = rss()
        model = llm.load({str(out)!r}, max_context=256)
        model.tokenizer.stop_ids = set()
        model.generate_ids(list(range(1, 65)), 16)
        print(before, int(peak_rss_mb() * 2**20) - before)
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    extra = int(r.stdout.split()[-1])
    assert extra <= 1.1 * size, f"a {size}-byte model raised the peak RSS by {extra} bytes"
