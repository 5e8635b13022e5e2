"""Routed experts over packed weights without a model (csrc/qlinear/llm/moe.h; no torch, so this
runs under qemu and the sanitizers too): the compiled MoeLayer against a numpy reference built
from qlinear.matmul_float's expert outputs, and MoeExperts (experts in slots run as they arrive,
the flash path's) equal to MoeLayer bit for bit, over shapes, top-k, grouping and threads."""

import numpy as np
import pytest

import qlinear
from qlinear import _core
from qlinear._ops import core_handle


def _experts(rng, E, H, inter, bits):
    return [(qlinear.pack_weight(rng.standard_normal((2 * inter, H)).astype(np.float32) / np.sqrt(H), bits, 32),
             qlinear.pack_weight(rng.standard_normal((H, inter)).astype(np.float32) / np.sqrt(inter), bits, 32))
            for _ in range(E)]


def _spec(pw, act_int8):
    return (core_handle(pw), None, act_int8, 32 if act_int8 else pw.shape[1])


def _reference(x, top, w, experts):
    """sum over a row's experts, in ascending expert order, of w * down(silu(gate) * up)."""
    y = np.zeros_like(x, dtype=np.float64)
    for r in range(len(x)):
        for j in np.argsort(top[r], kind="stable"):
            gu, down = experts[top[r, j]]
            g = qlinear.matmul_float(x[r:r + 1], gu).astype(np.float64)
            inter = g.shape[1] // 2
            a = (g[:, :inter] / (1 + np.exp(-g[:, :inter])) * g[:, inter:]).astype(np.float32)
            y[r] += w[r, j] * qlinear.matmul_float(a, down)[0]
    return y


@pytest.mark.parametrize("E, k, H, inter, rows, bits", [(8, 2, 64, 32, 1, 4), (8, 2, 64, 32, 19, 8),
                                                        (5, 5, 96, 64, 7, 4), (16, 4, 64, 96, 33, 4),
                                                        (4, 1, 128, 32, 3, 8)])
def test_layer_and_slots_equal_each_other_and_the_reference(E, k, H, inter, rows, bits):
    rng = np.random.default_rng(E * 100 + rows)
    experts = _experts(rng, E, H, inter, bits)
    router = rng.standard_normal((E, H)).astype(np.float32)
    x = rng.standard_normal((rows, H)).astype(np.float32)
    top, w = _core.moe_route(x, router, None, k, True)
    for act_int8 in (False, True):
        layer = _core.moe_layer(router, None, [(_spec(g, act_int8), _spec(d, act_int8)) for g, d in experts], k, True)
        order = rng.permutation(E)   # slot i holds expert order[i]
        slots = _core.moe_experts([(_spec(experts[e][0], act_int8), _spec(experts[e][1], act_int8)) for e in order],
                                  E, k)
        slot_of = {int(e): i for i, e in enumerate(order)}
        threads = qlinear.get_num_threads()
        try:
            for n in (1, 2):
                qlinear.set_num_threads(n)
                want = layer(x)
                if not act_int8:
                    np.testing.assert_allclose(want, _reference(x, top, w, experts), rtol=2e-4, atol=2e-5)
                slots.begin(x, top, w)
                used = [int(e) for e in rng.permutation(np.unique(top))]
                for group in np.array_split(np.array(used), min(3, len(used))):
                    slots.run([int(e) for e in group], [slot_of[int(e)] for e in group])
                np.testing.assert_array_equal(slots.finish(), want)
        finally:
            qlinear.set_num_threads(threads)


def test_slots_refuse_mismatched_weights():
    rng = np.random.default_rng(0)
    (g, d), (g2, _) = _experts(rng, 2, 64, 32, 4)[0], _experts(rng, 1, 64, 48, 4)[0]
    with pytest.raises(ValueError, match="slot 1 gate_up: weight has shape"):
        _core.moe_experts([(_spec(g, True), _spec(d, True)), (_spec(g2, True), _spec(d, True))], 4, 2)
    with pytest.raises(TypeError, match="slot 0 gate_up must be a tuple"):
        _core.moe_experts([(g, _spec(d, True))], 4, 2)
    with pytest.raises(ValueError, match="slot 0 down: weight has shape"):
        _core.moe_experts([(_spec(g, True), _spec(g, True))], 4, 2)
