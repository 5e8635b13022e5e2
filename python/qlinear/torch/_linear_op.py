"""``torch.library`` custom op ``qlinear::linear``: y = x @ W'.T (+ bias) on a packed weight.

The packed weight travels as a plain uint8 tensor (its bytes) plus its geometry as int / bool /
str arguments, so graphs (``torch.compile``, ``torch.jit.trace``) hold only tensors and constants.
A fake (meta) implementation gives the output's shape and dtype for tracing.
"""

from __future__ import annotations

import ctypes
from typing import Optional

import numpy as np
import torch

from .. import _core
from .._ops import matmul_array
from .._packed import PackedWeight

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def packed_weight(packed: torch.Tensor, n: int, k: int, bits: int, group_size: int, symmetric: bool,
                  layout: str) -> PackedWeight:
    """A PackedWeight over ``packed``'s bytes (no copy; valid while ``packed`` lives), cached on
    the tensor itself.

    It views the tensor's memory without holding a reference to the tensor (a reference
    would make a cycle the garbage collector cannot break): it lives exactly as long as the
    tensor, as an attribute of it, and is rebuilt when the tensor's storage moves.
    """
    key = (packed.data_ptr(), packed.numel(), n, k, bits, group_size, symmetric, layout)
    cached = getattr(packed, "_qlinear_weight", None)
    if cached is not None and cached[0] == key:
        return cached[1]
    if packed.dtype != torch.uint8 or packed.dim() != 1 or not packed.is_contiguous():
        raise ValueError("packed weight must be a contiguous 1-d uint8 tensor")
    if packed.device.type != "cpu":
        raise ValueError(f"packed weight must be on the CPU, got {packed.device}")
    raw = (ctypes.c_uint8 * packed.numel()).from_address(packed.data_ptr())
    view = np.ctypeslib.as_array(raw)
    pw = PackedWeight(_core.PackedWeightHandle(view, n, k, bits, group_size, symmetric, layout))
    packed._qlinear_weight = (key, pw)
    return pw


@torch.library.custom_op("qlinear::linear", mutates_args=(), device_types="cpu")
def linear(x: torch.Tensor, packed: torch.Tensor, bias: Optional[torch.Tensor], n: int, k: int,
           bits: int, group_size: int, symmetric: bool, layout: str, act: str,
           act_block: int) -> torch.Tensor:
    """x [..., K] (float32 / float16 / bfloat16) -> [..., N] in x's dtype.

    act: "int8" (dynamic int8 activations, one scale per ``act_block`` k, as resolved by
    ``qlinear._ops.act_block_size``: K is one per row) or "float" (weights dequantized in the
    kernel, float32 accumulation).
    """
    pw = packed_weight(packed, n, k, bits, group_size, symmetric, layout)
    dtype = x.dtype
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    if dtype == torch.bfloat16:
        x2 = x2.float()
    if not x2.is_contiguous():
        x2 = x2.contiguous()
    b = None if bias is None else bias.detach().float().contiguous().numpy()
    xn = x2.detach().numpy()
    if act not in ("int8", "float"):
        raise ValueError(f"act must be 'int8' or 'float', got {act!r}")
    y = torch.from_numpy(matmul_array(xn, pw, b, None, act, act_block))
    if dtype == torch.bfloat16:
        y = y.to(torch.bfloat16)
    return y.reshape(*lead, n)


@linear.register_fake
def _(x, packed, bias, n, k, bits, group_size, symmetric, layout, act, act_block):
    torch._check(x.shape[-1] == k, lambda: f"x has {x.shape[-1]} features, the weight {k}")
    torch._check(x.dtype in _DTYPES, lambda: f"x must be float32, float16 or bfloat16, got {x.dtype}")
    return x.new_empty((*x.shape[:-1], n))
