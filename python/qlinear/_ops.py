"""The matmul entry points: y = x @ W.T (+ bias) on packed weights."""

from __future__ import annotations

from typing import Optional, Union

import numpy as np

from . import _core
from ._arrays import is_torch_tensor
from ._packed import PackedWeight

#: Default activation granularity: one int8 scale per row *and* weight group (ggml's Q8_0 way).
#: Measured on MiniLM's real activations and random ones, it is markedly more accurate than one
#: scale per row at no measurable speed cost (see README, "Choosing act_block").
DEFAULT_ACT_BLOCK = "group"

ActBlock = Union[None, int, str]

_core_matmul = _core.matmul_int8
_core_matmul_float = _core.matmul_float


def _act_block(pw: PackedWeight, act_block: ActBlock) -> int:
    if type(act_block) is str:
        if act_block == "group":
            return pw._h.block
        raise ValueError(f"act_block must be None, 'group' or an int, got {act_block!r}")
    if act_block is None:
        return pw._h.k
    if isinstance(act_block, bool) or not isinstance(act_block, (int, np.integer)):
        raise TypeError(f"act_block must be None, 'group' or an int, got {type(act_block).__name__}")
    return int(act_block)


def _int8_matmul(x, pw, bias, out, act_block, bits: int):
    if type(pw) is not PackedWeight:
        raise TypeError(f"weight must be a qlinear.PackedWeight, got {type(pw).__name__}")
    if pw._h.bits != bits:
        raise ValueError(f"matmul_w{bits}a8 needs a {bits}-bit weight, got a {pw._h.bits}-bit one")
    blk = _act_block(pw, act_block)
    if type(x) is np.ndarray:  # the fast path: decode calls this thousands of times
        return _core_matmul(x, pw._h, bias, out, blk)
    if is_torch_tensor(x):
        return _torch_matmul(x, pw, bias, out, blk)
    raise TypeError(f"x must be a numpy array or a torch CPU tensor, got {type(x).__name__}")


def _torch_matmul(x, pw, bias, out, blk, core=_core_matmul):
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
            out.copy_(torch.from_numpy(core(xn, pw._h, bias, None, blk)))
        else:
            core(xn, pw._h, bias, out.numpy(), blk)
        return out
    y = torch.from_numpy(core(xn, pw._h, bias, None, blk))
    return y.to(torch.bfloat16) if dtype == torch.bfloat16 else y


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
    if type(pw) is not PackedWeight:
        raise TypeError(f"weight must be a qlinear.PackedWeight, got {type(pw).__name__}")
    if type(x) is np.ndarray:
        return _core_matmul_float(x, pw._h, bias, out, pw._h.k)
    if is_torch_tensor(x):
        return _torch_matmul(x, pw, bias, out, pw._h.k, _core_matmul_float)
    raise TypeError(f"x must be a numpy array or a torch CPU tensor, got {type(x).__name__}")


def matmul(x, pw: PackedWeight, bias=None, out=None, act: str = "int8",
           act_block: ActBlock = DEFAULT_ACT_BLOCK):
    """One entry for every mode; ``act`` is explicit and never changed behind the caller's back.

    act="int8": dynamic int8 activations (W4A8 / W8A8 by the weight's bits).
    act="float": float activations, weights dequantized in the kernel (see matmul_float).
    """
    if type(pw) is not PackedWeight:
        raise TypeError(f"weight must be a qlinear.PackedWeight, got {type(pw).__name__}")
    if act == "int8":
        return _int8_matmul(x, pw, bias, out, act_block, pw.bits)
    if act == "float":
        return matmul_float(x, pw, bias, out)
    raise ValueError(f"act must be 'int8' or 'float', got {act!r}")


def quantize_activation(x, block: Optional[int] = None):
    """Dynamic int8 quantization as the kernels do it: (xq int8 [M, K], scales float32 [M, B]).

    ``block=None``: one scale per row (B = 1); else one per ``block`` consecutive k.
    """
    if is_torch_tensor(x):
        x = x.detach().float().numpy()
    if not isinstance(x, np.ndarray):
        raise TypeError(f"x must be a numpy array or a torch CPU tensor, got {type(x).__name__}")
    if block is not None:
        if isinstance(block, bool) or not isinstance(block, (int, np.integer)):
            raise TypeError(f"block must be None or an int, got {block!r}")
        if block <= 0:
            raise ValueError(f"block must be positive, got {block}")
    k = x.shape[-1] if x.ndim else 0
    xq, scale, _ = _core.quantize_activation(x, max(k, 1) if block is None else min(int(block), max(k, 1)))
    return (xq[0], scale[0]) if x.ndim == 1 else (xq, scale)
