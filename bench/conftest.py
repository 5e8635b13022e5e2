"""pytest-benchmark setup for qlinear's benchmarks (see bench/README.md).

* puts bench/ on sys.path so the tests can ``import peers``;
* ``--quick``: smoke run, only the 1x4096x4096 and 128x4096x4096 shapes at
  group 64 and 1 thread, plus 1x4096x11008 group 128 1 thread of
  test_float_matmul.py (and the tiny unparametrized benchmarks);
* ``bench_cache``: session cache of weights, qlinear packed weights, MNN
  modules and onnxruntime sessions, so each is built once.  Benchmarks are reordered so that all cases
  using the same weight matrix [N, K] run back to back, and the cache only
  keeps the objects of the current weight (the largest weights take ~180 MB
  as float32, plus their transposed copy, packed forms and MNN modules);
* ``run_bench``: times a callable with ``benchmark.pedantic`` and records
  extra_info (engine, shape, group, threads, weight bytes, GB/s or GOPS).
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np
import pytest

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
if BENCH_DIR not in sys.path:
    sys.path.insert(0, BENCH_DIR)

import qlinear  # noqa: E402

QUICK_SHAPES = {(1, 4096, 4096), (128, 4096, 4096)}
QUICK_GROUP = 64
QUICK_THREADS = 1
# Extra --quick cases per test file: {file name: {(shape, group, threads)}}.
QUICK_EXTRA = {
    "test_float_matmul.py": {((1, 4096, 11008), 128, 1)},
}

# Timing budget per benchmark: rounds are chosen from a short calibration so
# that one benchmark takes about TARGET_S seconds, clamped to [lo, hi].
GEMV_ROUNDS = (100, 300)
GEMV_WARMUP = 10
GEMV_TARGET_S = 1.0
GEMM_ROUNDS = (10, 20)
GEMM_WARMUP = 2
GEMM_TARGET_S = 1.5


def pytest_addoption(parser):
    parser.addoption(
        "--quick", action="store_true", default=False,
        help="qlinear bench: only shapes 1x4096x4096 and 128x4096x4096, group 64, 1 thread "
             "(plus 1x4096x11008 group 128, 1 thread of the float benchmarks)")


def _case_params(item):
    callspec = getattr(item, "callspec", None)
    return callspec.params if callspec is not None else {}


def _weight_key(params):
    shape = params.get("shape")
    if shape is None:
        return None
    m, k, n = shape
    return (n, k)


def _in_quick_set(item, p):
    shape = tuple(p["shape"])
    group, threads = p.get("group", QUICK_GROUP), p.get("threads", QUICK_THREADS)
    if shape in QUICK_SHAPES and group == QUICK_GROUP and threads == QUICK_THREADS:
        return True
    extra = QUICK_EXTRA.get(os.path.basename(str(item.path)), ())
    return (shape, group, threads) in extra


def pytest_collection_modifyitems(config, items):
    # --quick: deselect everything outside the smoke set.
    if config.getoption("--quick"):
        keep, drop = [], []
        for item in items:
            p = _case_params(item)
            if "shape" not in p:  # unparametrized, tiny benchmarks: always run
                keep.append(item)
            elif _in_quick_set(item, p):
                keep.append(item)
            else:
                drop.append(item)
        if drop:
            config.hook.pytest_deselected(items=drop)
            items[:] = keep

    # Run all cases of one weight matrix back to back (stable otherwise), so the
    # cache can drop a weight's objects once it moves on.
    first_seen = {}
    order = []
    for i, item in enumerate(items):
        key = _weight_key(_case_params(item))
        if key is None:
            key = ("item", i)
        first_seen.setdefault(key, len(first_seen))
        order.append((first_seen[key], i))
    ranked = sorted(zip(order, items), key=lambda t: t[0])
    items[:] = [item for _, item in ranked]


# --------------------------------------------------------------------------- cache


class BenchCache:
    """Builds and caches benchmark inputs; keyed by weight shape (N, K)."""

    def __init__(self):
        self._wkey = None
        self._objs = {}  # objects of the current weight [N, K]
        self._xs = {}    # activations are small: kept for the whole session
        self._mnn_ok = None
        self._ort_ok = None

    # -- helpers ------------------------------------------------------------
    def _for_weight(self, n, k):
        if self._wkey != (n, k):
            self._objs.clear()  # drop packed weights / MNN modules of the previous weight
            self._wkey = (n, k)
        return self._objs

    def _get(self, n, k, key, build):
        objs = self._for_weight(n, k)
        if key not in objs:
            objs[key] = build()
        return objs[key]

    # -- inputs ---------------------------------------------------------------
    def weight(self, n, k):
        """float32 W [N, K], ~N(0, 0.02^2), deterministic per shape."""
        def build():
            rng = np.random.default_rng([n, k, 1])
            return rng.standard_normal((n, k), dtype=np.float32) * np.float32(0.02)
        return self._get(n, k, "w", build)

    def weight_t(self, n, k):
        """Contiguous copy of W.T [K, N] (numpy baseline)."""
        return self._get(n, k, "wT", lambda: np.ascontiguousarray(self.weight(n, k).T))

    def x(self, m, k):
        key = (m, k)
        if key not in self._xs:
            rng = np.random.default_rng([m, k, 2])
            self._xs[key] = rng.standard_normal((m, k), dtype=np.float32)
        return self._xs[key]

    def packed(self, n, k, group, bits=4):
        """qlinear PackedWeight (asymmetric, like MNN's default)."""
        return self._get(n, k, ("qlinear", group, bits), lambda: qlinear.pack_weight(
            self.weight(n, k), bits=bits, group_size=group, symmetric=False))

    def mnn_available(self):
        if self._mnn_ok is None:
            from peers.mnn_peer import available
            self._mnn_ok = available()
        return self._mnn_ok

    def mnn(self, n, k, group, bits=4, threads=1):
        """MNNLinear, memory mode low (W4A8 / W8A8); skips if MNN is missing."""
        if not self.mnn_available():
            pytest.skip("MNN not available (pip install MNN==3.6.1 onnx)")
        from peers.mnn_peer import MNNLinear
        return self._get(n, k, ("mnn", group, bits, threads), lambda: MNNLinear(
            self.weight(n, k), bits=bits, block=group, threads=threads, memory="low"))

    def ort_available(self):
        if self._ort_ok is None:
            from peers.ort_peer import available
            self._ort_ok = available()
        return self._ort_ok

    def ort(self, n, k, group, bits=4, threads=1, accuracy_level=4):
        """onnxruntime MatMulNBits session (asymmetric, block = group); skips if
        onnxruntime is missing."""
        if not self.ort_available():
            pytest.skip("onnxruntime not available (pip install onnxruntime onnx)")
        from peers.ort_peer import ORTMatMulNBits
        return self._get(n, k, ("ort", group, bits, threads, accuracy_level),
                         lambda: ORTMatMulNBits(self.weight(n, k), bits=bits, block=group,
                                                threads=threads, accuracy_level=accuracy_level))

    def clear(self):
        self._objs.clear()
        self._xs.clear()
        self._wkey = None


@pytest.fixture(scope="session")
def bench_cache():
    cache = BenchCache()
    yield cache
    cache.clear()


@pytest.fixture
def qlinear_threads():
    """Restores qlinear's thread count after the test."""
    before = qlinear.get_num_threads()
    yield qlinear.set_num_threads
    qlinear.set_num_threads(before)


# --------------------------------------------------------------------------- timing


def _calibrate(fn, n=3):
    fn()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return sorted(ts)[len(ts) // 2]


def _rounds_for(t, target, lo, hi):
    return int(min(hi, max(lo, target / max(t, 1e-9))))


@pytest.fixture
def run_bench(benchmark):
    """run_bench(fn, engine=, shape=(M, K, N), group=, threads=, weight_bytes=, bits=4,
    group_name=None, **extra) -> result of fn.

    Times ``fn`` with benchmark.pedantic (GEMV: 100-300 rounds, GEMM: 10-20,
    chosen from a quick calibration) and fills benchmark.group / extra_info.
    """

    def run(fn, *, engine, shape, group, threads, weight_bytes, bits=4, kind=None,
            group_name=None, rounds=None, warmup_rounds=None, iterations=1, **extra):
        m, k, n = shape
        if kind is None:
            kind = "gemv" if m == 1 else "gemm"
        benchmark.group = group_name or f"{m}x{k}x{n} g{group} t{threads}"
        info = benchmark.extra_info
        info.update(engine=engine, shape=f"{m}x{k}x{n}", M=m, K=k, N=n, group=group,
                    threads=threads, bits=bits, kind=kind, weight_bytes=int(weight_bytes))
        info.update(extra)

        if rounds is None:
            t = _calibrate(fn)
            if m == 1:
                rounds = _rounds_for(t, GEMV_TARGET_S, *GEMV_ROUNDS)
            else:
                rounds = _rounds_for(t, GEMM_TARGET_S, *GEMM_ROUNDS)
        if warmup_rounds is None:
            warmup_rounds = GEMV_WARMUP if m == 1 else GEMM_WARMUP
        result = benchmark.pedantic(fn, rounds=rounds, warmup_rounds=warmup_rounds,
                                    iterations=iterations)

        stats = getattr(getattr(benchmark, "stats", None), "stats", None)
        if stats is not None and stats.median > 0:
            med = stats.median
            info["median_ms"] = med * 1e3
            if m == 1:
                info["gbps"] = weight_bytes / med / 1e9
            else:
                info["gops"] = 2.0 * m * n * k / med / 1e9
        return result

    return run
