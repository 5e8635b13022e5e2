"""Codes, packed bytes and integer results are identical on every ISA level of every machine:
checked against vectors produced on x86-64 (tests/make_cross_isa_vectors.py). (ARM stores int8
codes flipped, layout nr8_kr4_s8: its bytes equal x86's once flipped back.)"""

import os

import numpy as np
import pytest

import qlinear
from make_cross_isa_vectors import CASES

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "cross_isa_vectors.npz")


@pytest.mark.parametrize("case", range(len(CASES)))
def test_matches_stored_x86_vectors(isa, case):
    bits, sym, group = CASES[case]
    with np.load(DATA, allow_pickle=False) as d:
        assert str(d["machine"]) == "x86_64"
        w, x = d[f"w{case}"], d[f"x{case}"]
        pw = qlinear.pack_weight(w, bits=bits, group_size=group, symmetric=sym)
        codes, scale, offset = pw.unpack()
        x86 = qlinear.pack_quantized(codes, scale, offset, bits, group, sym, layout="nr8_kr4")
        assert np.array_equal(x86.buffer, d[f"packed{case}"])  # the same rounding, to the byte
        assert pw.layout == qlinear.cpu_info()["layout"] or bits == 4
        assert np.array_equal(qlinear.matmul(x, pw, act_block=None), d[f"y_row{case}"])
        assert np.array_equal(qlinear.matmul(x, pw), d[f"y_group{case}"])
        assert np.array_equal(qlinear.matmul(x, pw, act="float"), d[f"y_float{case}"])
        assert np.array_equal(qlinear.matmul(x[0], pw), d[f"y_gemv{case}"])
