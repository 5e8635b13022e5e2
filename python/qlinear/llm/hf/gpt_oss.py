"""GPT-OSS's stacked experts from a Hugging Face checkpoint, in float (``mlp.experts.gate_up_proj``
[E, hidden, 2 x width] and ``down_proj`` [E, width, hidden], as transformers holds them) or in
MXFP4 as the checkpoints are published (``*_blocks`` [E, N, K / 32, 16] uint8, two e2m1 codes a
byte, the low nibble first; ``*_scales`` [E, N, K / 32] uint8, e8m0 exponents biased by 127), with
their biases. MXFP4 stays as stored: its blocks become qlinear.blocks' MXFP4 rows (the same codes
and exponents, nothing rounded) unless the model is kept in float. Gate and up, interleaved
along N in the file, become our fused [gate; up] halves (rows moved, nothing else)."""

from __future__ import annotations

import numpy as np

from ..._packed import pack_blocks
from ...blocks import dequantize
from .safetensors_file import Checkpoint


def experts(ckpt: Checkpoint, cfg, i: int, p: str, packed: bool) -> dict:
    """Layer ``i``'s experts under our names (``layers.i.experts.e.gate_up`` [2M, H] / ``.down``
    [H, M], their ``.bias``); MXFP4 ones as PackedWeights when ``packed``, else float32."""
    E, M, H = cfg.num_experts, cfg.moe_intermediate_size, cfg.hidden_size
    x, o, out = p + "mlp.experts.", f"layers.{i}.experts.", {}
    halves = np.concatenate([np.arange(0, 2 * M, 2), np.arange(1, 2 * M, 2)])  # [gate; up] of interleaved rows
    gate_up_bias = _floats(ckpt, x + "gate_up_proj_bias", (E, 2 * M))
    down_bias = _floats(ckpt, x + "down_proj_bias", (E, H))
    if x + "gate_up_proj_blocks" in ckpt:
        gate_up, down = _mxfp4_rows(ckpt, x + "gate_up_proj", E, 2 * M, H), _mxfp4_rows(ckpt, x + "down_proj", E, H, M)
        for e in range(E):
            out[f"{o}{e}.gate_up"] = _weight(gate_up[e][halves], (2 * M, H), packed)
            out[f"{o}{e}.down"] = _weight(down[e], (H, M), packed)
    else:
        gate_up, down = _floats(ckpt, x + "gate_up_proj", (E, H, 2 * M)), _floats(ckpt, x + "down_proj", (E, M, H))
        for e in range(E):
            out[f"{o}{e}.gate_up"] = np.ascontiguousarray(gate_up[e][:, halves].T)
            out[f"{o}{e}.down"] = np.ascontiguousarray(down[e].T)
    for e in range(E):
        out[f"{o}{e}.gate_up.bias"] = np.ascontiguousarray(gate_up_bias[e][halves])
        out[f"{o}{e}.down.bias"] = np.ascontiguousarray(down_bias[e])
    return out


def _floats(ckpt: Checkpoint, name: str, shape: tuple) -> np.ndarray:
    if name not in ckpt:
        raise ValueError(f"{ckpt.directory}: GPT-OSS experts need tensor {name!r}")
    w = ckpt.float32(name)
    if w.shape != shape:
        raise ValueError(f"{ckpt.directory}: tensor {name!r} has shape {w.shape}, expected {shape}")
    return w


def _mxfp4_rows(ckpt: Checkpoint, name: str, E: int, n: int, k: int) -> np.ndarray:
    """``name``'s blocks and scales as MXFP4 file rows uint8 [E, n, k / 32 * 17]: per block of 32
    its exponent byte, then 16 bytes of codes j | code j + 16 << 4 (GGUF's order)."""
    if k % 32:
        raise ValueError(f"{ckpt.directory}: MXFP4 tensor {name!r}: {k} columns are not a multiple of 32")
    blocks, scales = name + "_blocks", name + "_scales"
    if scales not in ckpt:
        raise ValueError(f"{ckpt.directory}: {blocks!r} has no {scales!r}")
    for t, shape in ((blocks, (E, n, k // 32, 16)), (scales, (E, n, k // 32))):
        _, dtype, got = ckpt.location(t)
        if tuple(got) != shape or dtype != "U8":
            raise ValueError(f"{ckpt.directory}: MXFP4 tensor {t!r} is {dtype} {got}, expected U8 {shape}")
    b = ckpt.raw(blocks)[0].reshape(E, n, k // 32, 16)
    codes = np.empty((E, n, k // 32, 32), np.uint8)
    codes[..., 0::2], codes[..., 1::2] = b & 15, b >> 4
    rows = np.empty((E, n, k // 32, 17), np.uint8)
    rows[..., 0] = ckpt.raw(scales)[0].reshape(E, n, k // 32)
    rows[..., 1:] = codes[..., :16] | (codes[..., 16:] << 4)
    return rows.reshape(E, n, -1)


def _weight(rows: np.ndarray, shape: tuple, packed: bool):
    rows = np.ascontiguousarray(rows)
    return pack_blocks(rows, "MXFP4", shape) if packed else dequantize(rows, "MXFP4", shape[1])
