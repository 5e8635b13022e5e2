"""Decode at the memory roofline: GEMV x[1, 4096] @ W[11008, 4096].T over a sweep of distinct
weight matrices, more than 1 GiB in all, so that every call reads its weights from DRAM (as
decoding a model does), in GB/s of weight bytes read -- next to this machine's streaming read
bandwidth, measured in the same run (every byte of a 1 GiB buffer read once, by the same
thread pool).

Engines (1 and 2 threads each):
  dram-read        _core.stream_read over a 1 GiB buffer: the ceiling
  qlinear-g32/128  W4A8, int4 asymmetric, fp16 scales + offsets
  ort-g32/128      onnxruntime MatMulNBits, accuracy level 4 (int8 activations)
  torch-fbgemm     torch.ao dynamic int8 Linear (per-tensor int8 weights, fbgemm)

A sweep is built from one quantized matrix copied (each copy its own memory): the same bytes,
distinct addresses. Run: pytest bench/test_decode_sweep.py --benchmark-only
"""

from __future__ import annotations

import copy
import gc

import numpy as np
import pytest

import qlinear
from qlinear import _core

# torch 2.13 deprecates torch.ao.quantization and quantized tensors (it still runs them).
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")

K, N = 4096, 11008
SWEEP_BYTES = 1 << 30
ENGINES = ["dram-read", "qlinear-g32", "qlinear-g128", "ort-g32", "ort-g128", "torch-fbgemm"]
CASES = [(e, t) for e in ENGINES for t in (1, 2)]  # engine outermost: one sweep in memory at a time

_current = {}


def _weight() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((N, K), dtype=np.float32)


def _copies(nbytes_each: int) -> int:
    return max(2, -(-SWEEP_BYTES // nbytes_each))


def _qlinear_sweep(group: int):
    pw = qlinear.pack_weight(_weight(), bits=4, group_size=group)
    ws = [qlinear.PackedWeight(_core.PackedWeightHandle(np.copy(pw.buffer), N, K, 4, group, False, pw.layout))
          for _ in range(_copies(pw.nbytes))]
    x = np.random.default_rng(1).standard_normal((1, K), dtype=np.float32)

    def run():
        for w in ws:
            qlinear.matmul_w4a8(x, w)
    return run, sum(w.nbytes for w in ws)


def _ort_sweep(group: int, threads: int):
    from peers import ort_peer
    if not ort_peer.available():
        pytest.skip("onnxruntime / onnx not installed")
    first = ort_peer.ORTMatMulNBits(_weight(), bits=4, block=group, threads=threads, accuracy_level=4)
    # one session per matrix, each with its own pool: idle pools must not spin against the busy one
    sessions = [first.clone(spinning=False) for _ in range(_copies(first.weight_bytes))]
    del first
    x = np.random.default_rng(1).standard_normal((1, K), dtype=np.float32)
    runs = [s.bind(x) for s in sessions]

    def run():
        for r in runs:
            r()
    return run, sessions[0].weight_bytes * len(sessions)


def _torch_sweep(threads: int):
    torch = pytest.importorskip("torch")
    torch.backends.quantized.engine = "fbgemm"
    torch.set_num_threads(threads)
    lin = torch.nn.Linear(K, N, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.from_numpy(_weight()))
    q = torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(lin), {torch.nn.Linear}, dtype=torch.qint8)
    mods = [q] + [copy.deepcopy(q) for _ in range(_copies(N * K) - 1)]
    x = torch.from_numpy(np.random.default_rng(1).standard_normal((1, K), dtype=np.float32))

    def run():
        with torch.inference_mode():
            for m in mods:
                m(x)
    return run, N * K * len(mods)


def _dram_read():
    buf = np.ones(SWEEP_BYTES // 8, np.uint64)

    def run():
        _core.stream_read(buf)
    return run, buf.nbytes


def sweep(engine: str, threads: int):
    key = engine if not engine.startswith(("ort", "torch")) else (engine, threads)  # those fix threads at build
    if _current.get("key") != key:
        _current.clear()
        gc.collect()
        if engine == "dram-read":
            built = _dram_read()
        elif engine.startswith("qlinear"):
            built = _qlinear_sweep(int(engine.split("-g")[1]))
        elif engine.startswith("ort"):
            built = _ort_sweep(int(engine.split("-g")[1]), threads)
        else:
            built = _torch_sweep(threads)
        _current.update(key=key, built=built)
    return _current["built"]


@pytest.mark.parametrize("engine, threads", CASES, ids=[f"{e}-t{t}" for e, t in CASES])
def test_decode_sweep(benchmark, engine, threads):
    qlinear.set_num_threads(threads)
    run, nbytes = sweep(engine, threads)
    benchmark.pedantic(run, rounds=5, warmup_rounds=1)
    benchmark.extra_info.update(engine=engine, threads=threads, weight_bytes=nbytes,
                                gb_s=nbytes / benchmark.stats.stats.min / 1e9)
