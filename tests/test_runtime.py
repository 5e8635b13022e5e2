"""Dispatch, kernel reporting and threads."""

import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import qlinear


def test_cpu_info_and_kernel_info(rng):
    info = qlinear.cpu_info()
    assert info["arch"] in ("x86_64", "aarch64", "unknown")
    assert "scalar" in info["available_isas"] and info["active_isa"] in info["available_isas"]
    assert info["physical_cores"] >= 1
    pw = qlinear.pack_weight(rng.standard_normal((8, 64)).astype(np.float32), bits=8)
    k = qlinear.kernel_info(pw)
    assert k["isa"] == info["active_isa"] and k["layout"] == pw.layout
    assert "w8a8" in k["gemv"] and "w8a8" in k["gemm"] and "w8f" in k["gemv_float16"]
    # Every level names itself in one of its own kernels (the fp16 level's are the float16 ones;
    # its int8 kernels are the neon level's).
    assert any(k["isa"] in k[op] for op in ("gemm", "gemm_float16"))


def test_emulated_levels_are_flagged():
    """A QLINEAR_EMULATE_X86 build runs the x86 levels beyond AVX2 on emulated intrinsics: they
    are listed, and only such levels can be."""
    info = qlinear.cpu_info()
    assert set(info["emulated"]) <= set(info["available_isas"])
    assert set(info["emulated"]) <= {"avxvnni", "avx512vnni", "amx"}
    if info["emulated"]:
        assert "avx2" in info["available_isas"]


def test_amx_implies_avx512vnni():
    levels = qlinear.cpu_info()["available_isas"]
    assert "amx" not in levels or "avx512vnni" in levels


@pytest.mark.parametrize("level", qlinear.cpu_info()["available_isas"])
def test_qlinear_isa_environment_caps_the_level(level):
    code = "import qlinear; print(qlinear.cpu_info()['active_isa'])"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "QLINEAR_ISA": level},
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == level


def test_qlinear_num_threads_sets_the_default():
    code = "import qlinear; print(qlinear.get_num_threads())"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "QLINEAR_NUM_THREADS": "3"},
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "3"


def test_unknown_qlinear_isa_is_an_error():
    out = subprocess.run([sys.executable, "-c", "import qlinear"],
                         env={**os.environ, "QLINEAR_ISA": "avx9000"}, capture_output=True, text=True)
    assert out.returncode != 0 and "QLINEAR_ISA=avx9000" in out.stderr


def test_thread_count_does_not_change_results(rng):
    w = rng.standard_normal((1000, 512)).astype(np.float32)
    pw = qlinear.pack_weight(w, bits=4, group_size=64)
    before = qlinear.get_num_threads()
    try:
        for m in (1, 3, 40):
            x = rng.standard_normal((m, 512)).astype(np.float32)
            results = []
            for n in (1, 2, 3, 5):
                qlinear.set_num_threads(n)
                assert qlinear.get_num_threads() == n
                results.append(qlinear.matmul(x, pw))
            for y in results[1:]:
                assert np.array_equal(y, results[0])
    finally:
        qlinear.set_num_threads(before)


def test_concurrent_calls_from_python_threads(rng):
    """Shared weights, several Python threads, thread count changing under them."""
    weights = [qlinear.pack_weight(rng.standard_normal((n, 256)).astype(np.float32), bits=b, group_size=64)
               for n, b in ((300, 4), (64, 8), (129, 4))]
    inputs = [rng.standard_normal((m, 256)).astype(np.float32) for m in (1, 2, 17)]
    expected = {(i, j): qlinear.matmul(x, w) for i, w in enumerate(weights) for j, x in enumerate(inputs)}
    errors = []
    before = qlinear.get_num_threads()

    def worker(seed):
        local = np.random.default_rng(seed)
        for _ in range(60):
            i, j = int(local.integers(len(weights))), int(local.integers(len(inputs)))
            if not np.array_equal(qlinear.matmul(inputs[j], weights[i]), expected[(i, j)]):
                errors.append((i, j))

    def resizer():
        for n in (1, 2, 3, 2, 1, 2) * 3:
            qlinear.set_num_threads(n)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(6)] + [threading.Thread(target=resizer)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    qlinear.set_num_threads(before)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    assert not errors
