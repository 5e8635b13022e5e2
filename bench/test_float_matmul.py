"""Low-memory float path: qlinear.matmul_float (int4 weights kept packed,
float32 activations and accumulation) vs numpy fp32, onnxruntime MatMulNBits
(accuracy_level 1 = fp32 compute) and MNN memory mode low.

"qlinear-float16" runs the same with float16 activations and output: FP16 arithmetic on ARM
levels that have it (fp16, dotprod, i8mm), float16 widened to float32 elsewhere.

Shapes are (M, K, N): y[M, N] = x[M, K] @ W.T with W [N, K] (nn.Linear).

MNN note: this MNN wheel (3.6.1) has no float-activation mode that keeps the
weights quantized: memory "low" quantizes the activations to int8 at every
precision setting (it is the same W4A8 path as test_int8_matmul.py's "mnn"),
"normal"/"high" dequantize the weights to float32 at load time.  So "mnn-low"
here is MNN's int8-activation path, shown for reference (see bench/README.md).

Run: python -m pytest bench/ --benchmark-only [--quick]   (see bench/README.md)
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

import qlinear

from _bench_util import blas_threads, shape_id

SHAPES = [  # (M, K, N)
    (1, 4096, 11008),
    (1, 4096, 4096),
    (1, 896, 4864),
]
GROUPS = [32, 128]
THREADS = [1, 2]
ENGINES = ["qlinear-float", "qlinear-float16", "numpy", "ort-level1", "mnn-low"]
NUMPY_GROUP = 128  # numpy fp32 does not depend on the group: measured once

GEMM_SHAPE = (128, 4096, 4096)
GEMM_GROUP = 128
GEMM_THREADS = 1
GEMM_ENGINES = ["qlinear-float", "qlinear-float16", "numpy", "ort-level1"]


def _param(shape, group, threads, engine):
    return pytest.param(shape, group, threads, engine,
                        id=f"{shape_id(shape)}-g{group}-t{threads}-{engine}")


def _cases():
    for shape in SHAPES:
        for group in GROUPS:
            for threads in THREADS:
                for engine in ENGINES:
                    if engine == "numpy" and group != NUMPY_GROUP:
                        continue
                    yield _param(shape, group, threads, engine)
    for engine in GEMM_ENGINES:
        yield _param(GEMM_SHAPE, GEMM_GROUP, GEMM_THREADS, engine)


@pytest.mark.parametrize("shape,group,threads,engine", list(_cases()))
def test_float(run_bench, bench_cache, qlinear_threads, shape, group, threads, engine):
    m, k, n = shape
    x = bench_cache.x(m, k)
    out = np.empty((m, n), dtype=np.float32)
    ctx = contextlib.nullcontext()
    extra = {}

    if engine in ("qlinear-float", "qlinear-float16"):
        pw = bench_cache.packed(n, k, group, bits=4)
        qlinear_threads(threads)
        nbytes = pw.nbytes
        half = engine == "qlinear-float16"  # fp16 activations (FP16 arithmetic on ARM fp16 level)
        ki = qlinear.kernel_info(pw)
        suffix = "_float16" if half else "_float"
        extra = {"kernel": ki.get(("gemv" if m == 1 else "gemm") + suffix), "isa": ki.get("isa")}
        xe = x.astype(np.float16) if half else x
        oute = np.empty((m, n), dtype=np.float16) if half else out

        def fn():
            return qlinear.matmul_float(xe, pw, out=oute)
    elif engine == "numpy":
        ctx = blas_threads(threads)
        wT = bench_cache.weight_t(n, k)
        nbytes = 4 * n * k

        def fn():
            return np.matmul(x, wT, out=out)
    elif engine == "ort-level1":
        mod = bench_cache.ort(n, k, group, bits=4, threads=threads, accuracy_level=1)
        nbytes = mod.weight_bytes
        extra["accuracy_level"] = mod.accuracy_level
        fn = mod.bind(x)  # run_with_iobinding into a preallocated output
    elif engine == "mnn-low":
        mod = bench_cache.mnn(n, k, group, bits=4, threads=threads)
        nbytes = mod.weight_bytes
        extra["memory"] = mod.memory
        extra["activations"] = "int8"  # no float-activation low-memory mode in MNN

        def fn():
            return mod(x)
    else:  # pragma: no cover
        raise AssertionError(engine)

    with ctx:
        y = run_bench(fn, engine=engine, shape=shape, group=group, threads=threads,
                      weight_bytes=nbytes, bits=4, kind="float-" + ("gemv" if m == 1 else "gemm"),
                      group_name=f"float {m}x{k}x{n} g{group} t{threads}", **extra)
    assert y.shape == (m, n)
