"""Conversions between the array kinds users pass (numpy, torch CPU tensors) and numpy."""

from __future__ import annotations

import sys

import numpy as np


def is_torch_tensor(x) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def weight_to_numpy(w) -> np.ndarray:
    """A float weight as numpy (float32 / float16 kept; bfloat16 and float64 made float32)."""
    if is_torch_tensor(w):
        import torch
        if w.device.type != "cpu":
            raise ValueError(f"weight must be a CPU tensor, got device {w.device}")
        if not w.is_floating_point():
            raise TypeError(f"weight must be a float tensor, got {w.dtype}")
        w = w.detach()
        if w.dtype not in (torch.float32, torch.float16):
            w = w.float()
        return w.numpy()
    if not isinstance(w, np.ndarray):
        if isinstance(w, (list, tuple)):
            w = np.asarray(w)
        else:
            raise TypeError(f"weight must be a numpy array or a torch tensor, got {type(w).__name__}")
    if w.dtype not in (np.float32, np.float16, np.float64):
        raise TypeError(f"weight must be float32, float16 or float64, got {w.dtype}")
    return w


def bf16_to_float32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 values held as their uint16 bit patterns, widened exactly to float32 (a new
    array; the shift is done in place, so no temporary of the result's size is made)."""
    wide = np.asarray(bits, dtype=np.uint16).astype(np.uint32)
    wide <<= 16
    return wide.view(np.float32)


def optional_positive_int(value, name: str) -> "int | None":
    """``value`` as an int, or None; TypeError / ValueError naming ``name`` otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int or None, got {type(value).__name__}")
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {value}")
    return int(value)
