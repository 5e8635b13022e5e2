"""Writes tests/data/cross_isa_vectors.npz: integer-valued problems and the outputs this machine's
kernels give for them (every output an exact integer). test_cross_isa.py checks that every ISA
level of every machine -- ARM under qemu included -- reproduces them bit for bit.

    python tests/make_cross_isa_vectors.py     # run on x86-64; commit the .npz
"""

import os

import numpy as np

import qlinear
from qlinear._ops import act_block_size
from test_matmul import integer_weights

CASES = [(4, False, 64), (4, True, 32), (8, False, 128), (8, True, None)]


def build():
    rng = np.random.default_rng(2024)
    arrays = {}
    for i, (bits, sym, group) in enumerate(CASES):
        m, k, n = 5, 300, 19
        w = integer_weights(rng, n, k, group or k, bits, sym)
        x = rng.integers(-127, 128, size=(m, k)).astype(np.float32)
        pw = qlinear.pack_weight(w, bits=bits, group_size=group, symmetric=sym)
        x[:, ::act_block_size(pw, "group")] = 127
        arrays[f"w{i}"], arrays[f"x{i}"] = w, x
        arrays[f"packed{i}"] = pw.buffer.copy()
        arrays[f"y_row{i}"] = qlinear.matmul(x, pw, act_block=None)
        arrays[f"y_group{i}"] = qlinear.matmul(x, pw)
        arrays[f"y_float{i}"] = qlinear.matmul(x, pw, act="float")
        arrays[f"y_gemv{i}"] = qlinear.matmul(x[0], pw)
    return arrays


if __name__ == "__main__":
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "cross_isa_vectors.npz")
    arrays = build()
    np.savez_compressed(out, **arrays, machine=np.array(qlinear.cpu_info()["arch"]))
    print(f"wrote {out} ({os.path.getsize(out)} bytes)")
