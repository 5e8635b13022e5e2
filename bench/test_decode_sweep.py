"""Decode at the memory wall: GEMVs x[1, K] @ W[N, K].T over sweeps of distinct weight matrices,
more than 1 GiB in all, so that every call reads its weights from DRAM (as decoding a model
does), in GB/s of weight bytes read -- next to this machine's streaming read bandwidth measured
in the same run (every byte of a 1 GiB buffer read once, by the same thread pool).

Shapes (N x K, cycled in a model's order):
  mlp-up-7b    11008x4096 alone (a 7B MLP up projection)
  layer-0.5b   a Qwen2.5-0.5B layer as qlinear.llm runs it: fused QKV 1152x896, o 896x896,
               fused gate+up 9728x896, down 896x4864 (~100 such calls per token)
  layer-7b     a 7B (Llama-class) layer: q, k, v, o 4096x4096, gate, up 11008x4096, down 4096x11008

Engines (1 and 2 threads each):
  dram-read         _core.stream_read over a 1 GiB buffer: the ceiling
  qlinear           W4A8, int4 asymmetric group 64 (fp16 scales + offsets), the best level here
  qlinear-avx2      the same at the avx2 level (where the best level is another)
  ort               onnxruntime MatMulNBits block 64, accuracy level 4 (int8 activations)
  torch-fbgemm      torch.ao dynamic int8 Linear (per-tensor int8 weights, fbgemm)

A sweep is built from one quantized set of matrices copied (each copy its own memory): the same
bytes, distinct addresses.

    pytest bench/test_decode_sweep.py --benchmark-only       # every engine, pytest-benchmark
    python bench/test_decode_sweep.py [--rounds 7]           # qlinear vs dram-read, interleaved
                                                              # rounds, % of the ceiling
"""

from __future__ import annotations

import argparse
import copy
import gc
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import qlinear  # noqa: E402
from qlinear import _core  # noqa: E402

# torch 2.13 deprecates torch.ao.quantization and quantized tensors (it still runs them).
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")

SHAPES = {
    "mlp-up-7b": [(11008, 4096)],
    "layer-0.5b": [(1152, 896), (896, 896), (9728, 896), (896, 4864)],
    "layer-7b": [(4096, 4096)] * 4 + [(11008, 4096)] * 2 + [(4096, 11008)],
}
GROUP = 64
SWEEP_BYTES = 1 << 30
BEST = qlinear.cpu_info()["best_isa"]
ENGINES = ["dram-read", "qlinear"] + (["qlinear-avx2"] if BEST != "avx2" else []) + ["ort", "torch-fbgemm"]
# shape outermost, then engine: one sweep in memory at a time
CASES = [(s, e, t) for s in SHAPES for e in ENGINES for t in (1, 2)]

_current = {}


def _weights(shape: str) -> list:
    rng = np.random.default_rng(0)
    return [(rng.standard_normal((n, k), dtype=np.float32) * 0.02) for n, k in SHAPES[shape]]


def _copies(nbytes_each: int) -> int:
    return max(2, -(-SWEEP_BYTES // nbytes_each))


def qlinear_sweep(shape: str):
    """A callable running the shape's GEMVs over >= 1 GiB of distinct packed weights, and the
    bytes it reads."""
    packed = [qlinear.pack_weight(w, bits=4, group_size=GROUP) for w in _weights(shape)]
    layer_bytes = sum(p.nbytes for p in packed)
    layers = [[qlinear.PackedWeight(_core.PackedWeightHandle(np.copy(p.buffer), p.shape[0], p.shape[1], 4, GROUP,
                                                             False, p.layout)) for p in packed]
              for _ in range(_copies(layer_bytes))]
    calls = []
    for layer in layers:
        for w in layer:
            x = np.random.default_rng(1).standard_normal((1, w.shape[1]), dtype=np.float32)
            out = np.empty((1, w.shape[0]), np.float32)
            calls.append((x, w, out))

    def run():
        for x, w, out in calls:
            qlinear.matmul_w4a8(x, w, out=out)
    return run, layer_bytes * len(layers)


def _ort_sweep(shape: str, threads: int):
    from peers import ort_peer
    if not ort_peer.available():
        pytest.skip("onnxruntime / onnx not installed")
    firsts = [ort_peer.ORTMatMulNBits(w, bits=4, block=GROUP, threads=threads, accuracy_level=4) for w in _weights(shape)]
    layer_bytes = sum(f.weight_bytes for f in firsts)
    # one session per matrix, each with its own pool: idle pools must not spin against the busy one
    runs = []
    for _ in range(_copies(layer_bytes)):
        for f in firsts:
            x = np.random.default_rng(1).standard_normal((1, f.k), dtype=np.float32)
            runs.append(f.clone(spinning=False).bind(x))
    del firsts

    def run():
        for r in runs:
            r()
    return run, layer_bytes * (len(runs) // len(SHAPES[shape]))


def _torch_sweep(shape: str, threads: int):
    torch = pytest.importorskip("torch")
    torch.backends.quantized.engine = "fbgemm"
    torch.set_num_threads(threads)
    mods, xs = [], []
    for w in _weights(shape):
        lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(w))
        mods.append(torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(lin), {torch.nn.Linear}, dtype=torch.qint8))
        xs.append(torch.from_numpy(np.random.default_rng(1).standard_normal((1, w.shape[1]), dtype=np.float32)))
    layer_bytes = sum(w.size for w in _weights(shape))
    calls = []
    for i in range(_copies(layer_bytes)):
        calls += [(m if i == 0 else copy.deepcopy(m), x) for m, x in zip(mods, xs)]

    def run():
        with torch.inference_mode():
            for m, x in calls:
                m(x)
    return run, layer_bytes * _copies(layer_bytes)


def dram_read():
    buf = np.ones(SWEEP_BYTES // 8, np.uint64)

    def run():
        _core.stream_read(buf)
    return run, buf.nbytes


def sweep(shape: str, engine: str, threads: int):
    key = (shape, engine if not engine.startswith(("ort", "torch")) else (engine, threads))  # those fix threads at build
    if engine == "qlinear-avx2":
        key = (shape, "qlinear")
    if _current.get("key") != key:
        _current.clear()
        gc.collect()
        if engine == "dram-read":
            built = dram_read()
        elif engine.startswith("qlinear"):
            built = qlinear_sweep(shape)
        elif engine == "ort":
            built = _ort_sweep(shape, threads)
        else:
            built = _torch_sweep(shape, threads)
        _current.update(key=key, built=built)
    return _current["built"]


@pytest.mark.parametrize("shape, engine, threads", CASES, ids=[f"{s}-{e}-t{t}" for s, e, t in CASES])
def test_decode_sweep(benchmark, shape, engine, threads):
    qlinear.set_num_threads(threads)
    previous = qlinear.cpu_info()["active_isa"]
    qlinear.set_isa("avx2" if engine == "qlinear-avx2" else BEST)
    try:
        run, nbytes = sweep(shape, engine, threads)
        benchmark.pedantic(run, rounds=5, warmup_rounds=1)
    finally:
        qlinear.set_isa(previous)
    if benchmark.stats:  # None under --benchmark-disable
        benchmark.extra_info.update(shape=shape, engine=engine, threads=threads, weight_bytes=nbytes,
                                    gb_s=nbytes / benchmark.stats.stats.min / 1e9)


def main() -> None:
    import time
    p = argparse.ArgumentParser(description="qlinear's GEMV sweeps vs the streaming read, interleaved rounds")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    args = p.parse_args()
    levels = ["avx2"] + ([BEST] if BEST != "avx2" else [])
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    print(f"{cpu}; levels {', '.join(levels)}; best of {args.rounds} interleaved rounds (GB/s of weight bytes)")
    ceiling = dram_read()
    for shape in args.shapes:
        run, nbytes = qlinear_sweep(shape)
        for t in args.threads:
            qlinear.set_num_threads(t)
            best = {name: float("inf") for name in ["dram-read"] + levels}
            for _ in range(args.rounds):
                for name in best:
                    fn, n = ceiling if name == "dram-read" else (run, nbytes)
                    if name != "dram-read":
                        qlinear.set_isa(name)
                    t0 = time.perf_counter()
                    fn()
                    best[name] = min(best[name], (time.perf_counter() - t0) / n)
            ref = 1 / best["dram-read"] / 1e9
            row = "  ".join(f"{name} {1 / s / 1e9:6.1f}" + ("" if name == "dram-read" else f" ({1 / s / 1e9 / ref:4.0%})")
                            for name, s in best.items())
            print(f"{shape:11s} t{t}  {row}")
        del run
        gc.collect()
    qlinear.set_isa(BEST)


if __name__ == "__main__":
    main()
