"""The headline comparisons, interleaved: each round times every engine in turn (one untimed
call first, so its weights are as hot as in a decode loop, then `inner` timed calls), so that the
load of a shared machine falls on all of them alike; ratios are of the per-engine medians.

    python bench/headline.py [--rounds 40]

Cases (1 thread, as the foundation and float-path issues state them):
  W4A8 GEMV 1x4096x4096 and GEMM 128x4096x4096, group 64 asymmetric: qlinear vs MNN (memory low)
  float path GEMV 1x4096x11008 group 128: qlinear.matmul_float vs numpy fp32 vs ORT level 1
  per-call overhead 1x64x64
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import qlinear  # noqa: E402


def interleaved(engines: dict, rounds: int, inner: int = 1) -> dict:
    times = {name: [] for name in engines}
    for fn in engines.values():
        fn()
    for _ in range(rounds):
        for name, fn in engines.items():
            fn()
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            times[name].append((time.perf_counter() - t0) / inner)
    return {name: float(np.median(t)) for name, t in times.items()}


def show(title: str, med: dict, ref: str = "qlinear") -> None:
    print(f"\n{title}")
    for name, t in med.items():
        ratio = "" if name == ref else f"   {name}/{ref} = {t / med[ref]:.2f}x"
        print(f"  {name:14s} {t * 1e3:9.3f} ms{ratio}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=40)
    args = p.parse_args()
    from threadpoolctl import threadpool_limits
    from peers.mnn_peer import MNNLinear
    from peers.ort_peer import ORTMatMulNBits

    qlinear.set_num_threads(1)
    rng = np.random.default_rng(0)
    print(f"qlinear {qlinear.__version__}, {qlinear.cpu_info()['active_isa']}, 1 thread")

    w = (rng.standard_normal((4096, 4096)) * 0.02).astype(np.float32)
    pw = qlinear.pack_weight(w, bits=4, group_size=64)
    mnn = MNNLinear(w, bits=4, block=64, threads=1, memory="low")
    for m, rounds, inner in ((1, args.rounds * 2, 10), (128, args.rounds // 2, 1)):
        x = rng.standard_normal((m, 4096)).astype(np.float32)
        out = np.empty((m, 4096), np.float32)
        med = interleaved({"qlinear": lambda: qlinear.matmul_w4a8(x, pw, out=out), "mnn": lambda: mnn(x)},
                          rounds, inner)
        show(f"W4A8 {m}x4096x4096 group 64", med)
    del mnn

    w = (rng.standard_normal((11008, 4096)) * 0.02).astype(np.float32)
    pw = qlinear.pack_weight(w, bits=4, group_size=128)
    ort = ORTMatMulNBits(w, bits=4, block=128, threads=1, accuracy_level=1)
    wt = np.ascontiguousarray(w.T)
    x = rng.standard_normal((1, 4096)).astype(np.float32)
    out, out_np = np.empty((1, 11008), np.float32), np.empty((1, 11008), np.float32)
    with threadpool_limits(1):
        med = interleaved({"qlinear": lambda: qlinear.matmul_float(x, pw, out=out),
                           "numpy": lambda: np.matmul(x, wt, out=out_np), "ort-level1": lambda: ort(x)},
                          args.rounds, 5)
    show("float path 1x4096x11008 group 128", med)

    pw = qlinear.pack_weight(rng.standard_normal((64, 64)).astype(np.float32), bits=4, group_size=32)
    x = rng.standard_normal((1, 64)).astype(np.float32)
    out = np.empty((1, 64), np.float32)
    med = interleaved({"qlinear": lambda: qlinear.matmul_w4a8(x, pw, out=out)}, 200, inner=1000)
    print(f"\nper-call overhead 1x64x64: {med['qlinear'] * 1e6:.2f} us")


if __name__ == "__main__":
    main()
