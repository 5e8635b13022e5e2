"""QLinear: an inference-only ``nn.Linear`` replacement running qlinear's packed int4 / int8 kernels."""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch
from torch import nn

from .. import _core
from .._ops import act_block_size
from .._packed import PackedWeight, pack_quantized, pack_weight
from .._scheme import DEFAULT_ACT_BLOCK, ActBlock
from ._linear_op import packed_weight


class QLinear(nn.Module):
    """``y = x @ W'.T + bias`` with ``W'`` an int4 / int8 packed weight (inference only).

    State (all tensors, so ``state_dict`` needs no pickled classes):

    * ``packed``: uint8 [nbytes], the packed weight exactly as the kernels read it;
    * ``bias``: float32 [N] or absent;
    * ``in_scale``: float32 [K] or absent, multiplied into the input before the matmul (a
      SmoothQuant scale that could not be folded into a previous layer);
    * extra state: a dict of ints / bools / strings (shape, bits, group size, symmetry, layout,
      act, act_block).

    Float32, float16 and bfloat16 inputs ``[..., K]`` give outputs of the same dtype ``[..., N]``.
    """

    def __init__(self, pw: PackedWeight, bias: Optional[torch.Tensor] = None, act: str = "int8",
                 act_block: ActBlock = DEFAULT_ACT_BLOCK, in_scale: Optional[torch.Tensor] = None):
        super().__init__()
        if type(pw) is not PackedWeight:
            raise TypeError(f"expected a qlinear.PackedWeight, got {type(pw).__name__}")
        if act not in ("int8", "float"):
            raise ValueError(f"act must be 'int8' or 'float', got {act!r}")
        n, k = pw.shape
        self.in_features, self.out_features = k, n
        self.register_buffer("packed", torch.from_numpy(np.array(pw.buffer, copy=True)))
        self._set_geometry(pw.bits, pw.group_size, pw.symmetric, pw.layout)
        self.act = act
        self.act_block = act_block
        self._check_act_block()
        self.register_buffer("bias", None if bias is None else bias.detach().float().reshape(n).clone())
        self.register_buffer("in_scale", None if in_scale is None else in_scale.detach().float().reshape(k).clone())
        self._update_kernel_act_block()

    # -- construction -----------------------------------------------------------------------
    @classmethod
    def from_linear(cls, lin: nn.Linear, bits: int = 4, group_size: Optional[int] = 64,
                    symmetric: bool = False, act: str = "int8",
                    act_block: ActBlock = DEFAULT_ACT_BLOCK) -> "QLinear":
        """Quantize ``lin``'s weight (round to nearest, as ``qlinear.pack_weight``)."""
        if not isinstance(lin, nn.Linear):
            raise TypeError(f"expected an nn.Linear, got {type(lin).__name__}")
        pw = pack_weight(lin.weight.detach().float(), bits=bits, group_size=group_size, symmetric=symmetric)
        return cls(pw, lin.bias, act=act, act_block=act_block)

    def _set_geometry(self, bits, group_size, symmetric, layout):
        self.bits, self.group_size, self.symmetric, self.layout = int(bits), int(group_size), bool(symmetric), str(layout)

    def _check_act_block(self):
        if self.act_block is None or (isinstance(self.act_block, str) and self.act_block == "group"):
            return
        if isinstance(self.act_block, bool) or not isinstance(self.act_block, int) or self.act_block <= 0:
            raise ValueError(f"act_block must be None, 'group' or a positive int, got {self.act_block!r}")

    def _update_kernel_act_block(self) -> None:
        # Resolved once: forward reads a plain int (no Python work under torch.compile).
        self._kblock = act_block_size(self.packed_weight, self.act_block)

    # -- the packed weight --------------------------------------------------------------------
    @property
    def weight(self) -> "_PackedView":
        return _PackedView(self)

    @property
    def packed_weight(self) -> PackedWeight:
        """A PackedWeight over this module's bytes (no copy)."""
        return packed_weight(self.packed, self.out_features, self.in_features, self.bits,
                                  self.group_size, self.symmetric, self.layout)

    def dequantized_weight(self) -> torch.Tensor:
        """The float32 weight ``[N, K]`` the kernels compute with, in the input's frame
        (the ``in_scale`` folded in)."""
        w = torch.from_numpy(self.packed_weight.dequantize())
        return w if self.in_scale is None else w * self.in_scale

    # -- forward -----------------------------------------------------------------------------
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.in_scale is not None:
            x = x * self.in_scale.to(x.dtype)
        return torch.ops.qlinear.linear(x, self.packed, self.bias, self.out_features, self.in_features,
                                        self.bits, self.group_size, self.symmetric, self.layout,
                                        self.act, self._kblock)

    def extra_repr(self) -> str:
        g = "per-channel" if self.group_size >= self.in_features else f"group {self.group_size}"
        return (f"in_features={self.in_features}, out_features={self.out_features}, int{self.bits}, {g}, "
                f"{'symmetric' if self.symmetric else 'asymmetric'}, act={self.act!r}, "
                f"act_block={self.act_block!r}, bias={self.bias is not None}, "
                f"smooth={self.in_scale is not None}")

    # -- state_dict ----------------------------------------------------------------------------
    def get_extra_state(self) -> dict:
        return {"version": 1, "in_features": self.in_features, "out_features": self.out_features,
                "bits": self.bits, "group_size": self.group_size, "symmetric": self.symmetric,
                "layout": self.layout, "act": self.act, "act_block": self.act_block}

    def set_extra_state(self, state: dict) -> None:
        if not isinstance(state, dict) or state.get("version") != 1:
            raise ValueError(f"unsupported QLinear state {state!r}")
        self.in_features, self.out_features = int(state["in_features"]), int(state["out_features"])
        self._set_geometry(state["bits"], state["group_size"], state["symmetric"], state["layout"])
        self.act, self.act_block = state["act"], state["act_block"]
        self._check_act_block()
        if self.layout != _core.native_layout(self.bits):  # saved on another CPU family: move the codes
            # (int8 codes are stored flipped on ARM, docs/kernels.md), no re-rounding
            codes, scale, off = self.packed_weight.unpack()
            pw = pack_quantized(codes, scale, off, self.bits, self.group_size, self.symmetric)
            self.packed = torch.from_numpy(np.array(pw.buffer, copy=True))
            self.layout = pw.layout
        self._update_kernel_act_block()  # also validates the bytes against the geometry

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        # The packed size, and whether bias / in_scale exist, come from the state being loaded.
        for name in ("packed", "bias", "in_scale"):
            t = state_dict.get(prefix + name)
            if t is not None and (getattr(self, name) is None or getattr(self, name).shape != t.shape):
                setattr(self, name, torch.empty_like(t, dtype=torch.uint8 if name == "packed" else torch.float32))
            elif t is None and name != "packed" and getattr(self, name) is not None:
                setattr(self, name, None)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)

    @classmethod
    def empty(cls) -> "QLinear":
        """A placeholder to ``load_state_dict`` into (sizes come from the state)."""
        m = cls.__new__(cls)
        nn.Module.__init__(m)
        m.in_features = m.out_features = 0
        m.register_buffer("packed", torch.empty(0, dtype=torch.uint8))
        m._set_geometry(4, 0, False, _core.native_layout(4))
        m.act, m.act_block, m._kblock = "int8", DEFAULT_ACT_BLOCK, 0
        m.register_buffer("bias", None)
        m.register_buffer("in_scale", None)
        return m


class _PackedView:
    """``QLinear.weight``: what code reading ``module.weight`` usually wants (shape, dtype, device)."""

    def __init__(self, m: QLinear):
        self._m = m

    @property
    def shape(self):
        return torch.Size((self._m.out_features, self._m.in_features))

    @property
    def dtype(self):
        return torch.float32

    @property
    def device(self):
        return self._m.packed.device

    def dequantize(self) -> torch.Tensor:
        return self._m.dequantized_weight()
