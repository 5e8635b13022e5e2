"""The matmul entry points, y = x @ W.T (+ bias) on packed weights, and the one internal entry
the rest of the package calls (``qlinear.torch``'s op, ``qlinear.llm``'s Linear).

This is the only module that reaches into ``PackedWeight._h`` (the kernels' handle).
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from . import _core
from ._arrays import is_torch_tensor, optional_positive_int
from ._packed import PackedWeight
from ._scheme import DEFAULT_ACT_BLOCK, ActBlock, act_block_size as _act_block_size

__all__ = ["DEFAULT_ACT_BLOCK", "matmul", "matmul_w4a8", "matmul_w8a8", "matmul_float",
           "quantize_activation", "kernel_info", "act_block_size", "matmul_array"]

_ACTS = ("int8", "float")


def act_block_size(pw: PackedWeight, act_block: ActBlock) -> int:
    """k per activation scale for ``pw`` (None: per row = K; "group": the weight's storage
    block; an int: itself), the value the kernels take."""
    if type(act_block) is str and act_block == "group":
        return pw._h.block
    return _act_block_size(pw._h.k, pw._h.group_size, act_block)


def matmul_array(x: np.ndarray, pw: PackedWeight, bias, out, act: str, block: int) -> np.ndarray:
    """The internal entry: numpy ``x``, ``act`` "int8" or "float", ``block`` from act_block_size
    (ignored by the float path). No argument checks beyond the kernels' own."""
    h = pw._h
    if act == "int8":
        return _core.matmul_int8(x, h, bias, out, block)
    return _core.matmul_float(x, h, bias, out, h.k)


def core_handle(pw: PackedWeight):
    """The compiled core's handle of a packed weight, for callers that hand weights to C++
    entries themselves (qlinear.llm's decode step)."""
    return pw._h


def _check_weight(pw) -> None:
    if type(pw) is not PackedWeight:
        raise TypeError(f"weight must be a qlinear.PackedWeight, got {type(pw).__name__}")


def _matmul(x, pw: PackedWeight, bias, out, act: str, act_block: ActBlock):
    block = act_block_size(pw, act_block) if act == "int8" else pw._h.k
    if type(x) is np.ndarray:  # the fast path: decode calls this thousands of times
        return matmul_array(x, pw, bias, out, act, block)
    if is_torch_tensor(x):
        return _torch_matmul(x, pw, bias, out, act, block)
    raise TypeError(f"x must be a numpy array or a torch CPU tensor, got {type(x).__name__}")


def _torch_matmul(x, pw, bias, out, act, block):
    import torch
    if x.device.type != "cpu":
        raise ValueError(f"x must be a CPU tensor, got device {x.device}")
    dtype = x.dtype
    if dtype == torch.bfloat16:  # computed from float32, returned as bfloat16
        x = x.float()
    elif dtype not in (torch.float32, torch.float16):
        raise TypeError(f"x must be float32, float16 or bfloat16, got {dtype}")
    xn = x.detach().numpy()
    if is_torch_tensor(bias):
        bias = bias.detach().float().numpy()
    if out is not None:
        if not is_torch_tensor(out):
            raise TypeError("out must be a torch tensor when x is one")
        if out.dtype != dtype:
            raise TypeError(f"out must have the dtype of x ({dtype}), got {out.dtype}")
        if dtype == torch.bfloat16:
            out.copy_(torch.from_numpy(matmul_array(xn, pw, bias, None, act, block)))
        else:
            matmul_array(xn, pw, bias, out.numpy(), act, block)
        return out
    y = torch.from_numpy(matmul_array(xn, pw, bias, None, act, block))
    return y.to(torch.bfloat16) if dtype == torch.bfloat16 else y


def _a(bits: int) -> str:
    return f"an {bits}" if bits == 8 else f"a {bits}"


def _int8_matmul(x, pw, bias, out, act_block, bits: int):
    _check_weight(pw)
    if pw._h.bits != bits:
        raise ValueError(f"matmul_w{bits}a8 needs {_a(bits)}-bit weight, got {_a(pw._h.bits)}-bit one")
    return _matmul(x, pw, bias, out, "int8", act_block)


def matmul_w4a8(x, pw: PackedWeight, bias=None, out=None, act_block: ActBlock = DEFAULT_ACT_BLOCK):
    """y = x @ W.T (+ bias) with int4 weights and int8 activations quantized on the fly.

    x: ``[M, K]`` or ``[K]``, float32 or float16 (output in the same dtype), numpy or torch.
    act_block: ``"group"`` (default) one activation scale per row and weight group; ``None`` one
    per row; an int: per that many k (a multiple of the weight's group size).
    """
    return _int8_matmul(x, pw, bias, out, act_block, 4)


def matmul_w8a8(x, pw: PackedWeight, bias=None, out=None, act_block: ActBlock = DEFAULT_ACT_BLOCK):
    """y = x @ W.T (+ bias) with int8 weights and int8 activations; see matmul_w4a8."""
    return _int8_matmul(x, pw, bias, out, act_block, 8)


def matmul_float(x, pw: PackedWeight, bias=None, out=None):
    """y = x @ W'.T (+ bias) with float activations: the weights stay packed and are dequantized
    inside the kernel (w' = offset + scale * q), products accumulate in float32. No activation
    quantization: the accuracy of ``x @ pw.dequantize().T`` at the memory cost of the packed weight.
    """
    _check_weight(pw)
    return _matmul(x, pw, bias, out, "float", None)


def matmul(x, pw: PackedWeight, bias=None, out=None, act: str = "int8",
           act_block: ActBlock = DEFAULT_ACT_BLOCK):
    """One entry for every mode (``act`` defaults to "int8"; nothing is switched behind the
    caller's back: a weight or argument the mode cannot take raises).

    act="int8": dynamic int8 activations (W4A8 / W8A8 by the weight's bits).
    act="float": float activations, weights dequantized in the kernel (see matmul_float).
    """
    _check_weight(pw)
    if act not in _ACTS:
        raise ValueError(f"act must be 'int8' or 'float', got {act!r}")
    return _matmul(x, pw, bias, out, act, act_block)


def quantize_activation(x, act_block: Optional[int] = None):
    """Dynamic int8 quantization as the kernels do it: (xq int8 [M, K], scales float32 [M, B]).

    ``act_block=None``: one scale per row (B = 1); else one per ``act_block`` consecutive k.
    """
    if is_torch_tensor(x):
        x = x.detach().float().numpy()
    if not isinstance(x, np.ndarray):
        raise TypeError(f"x must be a numpy array or a torch CPU tensor, got {type(x).__name__}")
    act_block = optional_positive_int(act_block, "act_block")
    k = x.shape[-1] if x.ndim else 0
    block = max(k, 1) if act_block is None else min(int(act_block), max(k, 1))
    xq, scale, _ = _core.quantize_activation(x, block)
    return (xq[0], scale[0]) if x.ndim == 1 else (xq, scale)


def kernel_info(pw: PackedWeight, m: Optional[int] = None) -> dict:
    """The kernels a call on ``pw`` runs now: ISA level, layout, activation quantizer, and

    - without ``m``: the GEMV (one row) and the GEMM (many rows) of each activation type;
    - with ``m``: the kernels that will run for ``m`` rows, per activation type ("int8", "float",
      "float16"): a list of ``{"name", "mr", "nr", "rows"}``, the register tile (mr rows x nr
      outputs) and the row range each computes (two entries where a kernel takes whole tiles
      only, e.g. AMX's 16-row tiles, and another the rows left).
    """
    if type(pw) is not PackedWeight:
        raise TypeError(f"expected a PackedWeight, got {type(pw).__name__}")
    if m is not None and (isinstance(m, bool) or not isinstance(m, (int, np.integer))):
        raise TypeError(f"m must be an int, got {type(m).__name__}")
    if m is not None and m < 1:
        raise ValueError(f"m must be >= 1, got {m}")
    return _core.kernel_info(pw._h, None if m is None else int(m))
