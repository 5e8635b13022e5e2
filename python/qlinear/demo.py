"""A first look: one W4A8 linear layer, its error against float, and its speed against numpy.

    python -m qlinear.demo [--n 4096] [--k 4096] [--threads 1]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import qlinear


def _median_seconds(fn, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=4096, help="output features (weight rows)")
    p.add_argument("--k", type=int, default=4096, help="input features")
    p.add_argument("--group-size", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)

    rng = np.random.default_rng(0)
    w = (rng.standard_normal((args.n, args.k)) * 0.02).astype(np.float32)
    x = rng.standard_normal((1, args.k)).astype(np.float32)
    qlinear.set_num_threads(args.threads)

    t0 = time.perf_counter()
    pw = qlinear.pack_weight(w, bits=4, group_size=args.group_size)
    pack_s = time.perf_counter() - t0
    y = qlinear.matmul_w4a8(x, pw)
    y_float = x @ w.T
    y_weight_only = x @ pw.dequantize().T

    def rel(a, b):
        return float(np.linalg.norm(a - b) / np.linalg.norm(b))

    info = qlinear.kernel_info(pw)
    print(f"qlinear {qlinear.__version__}: W4A8 GEMV, x [1, {args.k}] @ W.T, W [{args.n}, {args.k}]")
    print(f"  weight   : {pw}")
    print(f"  kernels  : {info['gemv']} (ISA {info['isa']}), activations {info['quantize_acts']}")
    print(f"  packed in {pack_s * 1e3:.0f} ms: {pw.nbytes / 1e6:.1f} MB vs {w.nbytes / 1e6:.1f} MB float32")
    print(f"  y[:5]    : {np.array2string(y[0, :5], precision=4)}")
    print(f"  float    : {np.array2string(y_float[0, :5], precision=4)}")
    print(f"  relative error vs float: {rel(y, y_float):.4f} "
          f"(int4 weights alone: {rel(y_weight_only, y_float):.4f}; int8 activations add {rel(y, y_weight_only):.4f})")

    out = np.empty_like(y)
    wt = np.ascontiguousarray(w.T)
    out_np = np.empty_like(y_float)
    t_q = _median_seconds(lambda: qlinear.matmul_w4a8(x, pw, out=out), 200)
    t_np = _median_seconds(lambda: np.matmul(x, wt, out=out_np), 50)
    print(f"  time ({args.threads} thread{'s' if args.threads > 1 else ''}): qlinear {t_q * 1e3:.3f} ms "
          f"({pw.nbytes / t_q / 1e9:.1f} GB/s); numpy fp32 (OpenBLAS, its own threads) {t_np * 1e3:.3f} ms: "
          f"{t_np / t_q:.1f}x faster")


if __name__ == "__main__":
    main()
