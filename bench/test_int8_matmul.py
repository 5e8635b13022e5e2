"""qlinear W4A8 / W8A8 matmul vs MNN (W4A8/W8A8, memory mode low), onnxruntime
MatMulNBits (accuracy_level 4 = W4A8) and numpy fp32.

Shapes are (M, K, N): y[M, N] = x[M, K] @ W.T with W [N, K] (nn.Linear), so
1x4096x11008 is K=4096, N=11008 (an MLP up projection at decode time) and
1x11008x4096 is K=11008, N=4096 (the down projection).

Run: python -m pytest bench/ --benchmark-only [--quick]   (see bench/README.md)
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

import qlinear

from _bench_util import blas_threads, shape_id

SHAPES = [  # (M, K, N)
    (1, 4096, 4096),
    (1, 4096, 11008),
    (1, 11008, 4096),
    (1, 896, 4864),
    (128, 4096, 4096),
]
GROUPS = [32, 64, 128]
THREADS = [1, 2]
ENGINES = ["qlinear", "qlinear-rowscale", "mnn", "ort-level4", "numpy"]
NUMPY_GROUP = 64  # numpy fp32 does not depend on the group: measured once

W8A8_SHAPES = [(1, 4096, 4096), (128, 4096, 4096)]
W8A8_GROUP = 64


def _cases():
    for shape in SHAPES:
        for group in GROUPS:
            for threads in THREADS:
                for engine in ENGINES:
                    if engine == "numpy" and group != NUMPY_GROUP:
                        continue
                    yield pytest.param(shape, group, threads, engine,
                                       id=f"{shape_id(shape)}-g{group}-t{threads}-{engine}")


def _w8a8_cases():
    for shape in W8A8_SHAPES:
        for threads in THREADS:
            for engine in ("qlinear", "mnn"):
                yield pytest.param(shape, W8A8_GROUP, threads, engine,
                                   id=f"{shape_id(shape)}-g{W8A8_GROUP}-t{threads}-{engine}")


def _qlinear_info(pw, m):
    ki = qlinear.kernel_info(pw)
    return {"kernel": ki.get("gemv" if m == 1 else "gemm"), "isa": ki.get("isa")}


@pytest.mark.parametrize("shape,group,threads,engine", list(_cases()))
def test_w4a8(run_bench, bench_cache, qlinear_threads, shape, group, threads, engine):
    m, k, n = shape
    x = bench_cache.x(m, k)
    out = np.empty((m, n), dtype=np.float32)
    ctx = contextlib.nullcontext()
    extra = {}

    if engine in ("qlinear", "qlinear-rowscale"):
        pw = bench_cache.packed(n, k, group, bits=4)
        qlinear_threads(threads)
        act_block = "group" if engine == "qlinear" else None
        nbytes = pw.nbytes
        extra = _qlinear_info(pw, m)
        extra["act_block"] = act_block

        def fn():
            return qlinear.matmul_w4a8(x, pw, out=out, act_block=act_block)
    elif engine == "mnn":
        mod = bench_cache.mnn(n, k, group, bits=4, threads=threads)
        nbytes = mod.weight_bytes
        extra["memory"] = mod.memory

        def fn():
            return mod(x)
    elif engine == "ort-level4":
        mod = bench_cache.ort(n, k, group, bits=4, threads=threads, accuracy_level=4)
        nbytes = mod.weight_bytes
        extra["accuracy_level"] = mod.accuracy_level
        fn = mod.bind(x)  # run_with_iobinding into a preallocated output
    elif engine == "numpy":
        ctx = blas_threads(threads)
        wT = bench_cache.weight_t(n, k)
        nbytes = 4 * n * k

        def fn():
            return np.matmul(x, wT, out=out)
    else:  # pragma: no cover
        raise AssertionError(engine)

    with ctx:
        y = run_bench(fn, engine=engine, shape=shape, group=group, threads=threads,
                      weight_bytes=nbytes, bits=4, **extra)
    assert y.shape == (m, n)


@pytest.mark.parametrize("shape,group,threads,engine", list(_w8a8_cases()))
def test_w8a8(run_bench, bench_cache, qlinear_threads, shape, group, threads, engine):
    m, k, n = shape
    x = bench_cache.x(m, k)
    out = np.empty((m, n), dtype=np.float32)
    extra = {}
    if engine == "qlinear":
        pw = bench_cache.packed(n, k, group, bits=8)
        qlinear_threads(threads)
        nbytes = pw.nbytes
        extra = _qlinear_info(pw, m)

        def fn():
            return qlinear.matmul_w8a8(x, pw, out=out)
    else:
        mod = bench_cache.mnn(n, k, group, bits=8, threads=threads)
        nbytes = mod.weight_bytes
        extra["memory"] = mod.memory

        def fn():
            return mod(x)

    y = run_bench(fn, engine=engine, shape=shape, group=group, threads=threads,
                  weight_bytes=nbytes, bits=8, kind="w8a8-" + ("gemv" if m == 1 else "gemm"),
                  group_name=f"W8A8 {m}x{k}x{n} g{group} t{threads}", **extra)
    assert y.shape == (m, n)


# ------------------------------------------------------------------ per-call overhead

OVERHEAD_SHAPE = (1, 64, 64)  # (M, K, N)
OVERHEAD_GROUP = 32


@pytest.mark.parametrize("engine", ["qlinear", "numpy"])
def test_call_overhead(run_bench, qlinear_threads, engine):
    """Fixed cost of one tiny call (Python binding, dispatch, activation
    quantization) for 1x64x64 int4, group 32, 1 thread, vs numpy ``x @ W.T``."""
    m, k, n = OVERHEAD_SHAPE
    rng = np.random.default_rng(64)
    w = rng.standard_normal((n, k), dtype=np.float32) * np.float32(0.02)
    x = rng.standard_normal((m, k), dtype=np.float32)
    out = np.empty((m, n), dtype=np.float32)
    ctx = contextlib.nullcontext()
    extra = {}
    if engine == "qlinear":
        pw = qlinear.pack_weight(w, bits=4, group_size=OVERHEAD_GROUP, symmetric=False)
        qlinear_threads(1)
        nbytes = pw.nbytes
        extra = _qlinear_info(pw, m)

        def fn():
            return qlinear.matmul_w4a8(x, pw, out=out)
    else:
        ctx = blas_threads(1)
        wT = np.ascontiguousarray(w.T)
        nbytes = 4 * n * k

        def fn():
            return np.matmul(x, wT, out=out)

    with ctx:
        # ~microseconds per call: time batches of 20 calls per round.
        y = run_bench(fn, engine=engine, shape=OVERHEAD_SHAPE, group=OVERHEAD_GROUP, threads=1,
                      weight_bytes=nbytes, bits=4, kind="overhead",
                      group_name=f"overhead {m}x{k}x{n} g{OVERHEAD_GROUP} t1",
                      rounds=2000, warmup_rounds=100, iterations=20, **extra)
    assert y.shape == (m, n)
