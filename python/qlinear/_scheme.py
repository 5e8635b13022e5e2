"""The quantization scheme, written once: code ranges, zero points, group sizes, rounding.

The vocabulary used across the package (docs/semantics.md states the rules in full):

* ``group_size``: consecutive k of a weight row sharing one float16 ``scale`` (and, asymmetric,
  one float16 ``offset``); ``None`` or >= K is one group per row ("per channel").
* ``code``: the stored integer; ``q = code - zero_point`` is what multiplies the scale.
* ``act_block``: consecutive k of an activation row sharing one int8 scale: ``None`` per row,
  ``"group"`` per the weight's group (its storage block), an int per that many k.
* rounding: round half to even (``np.rint``, ``torch.round``), in float32.

``reference.py`` (numpy), ``torch/quantize.py`` (torch) and the packing wrappers read their
constants from here; the C++ core (``csrc/qlinear/core/pack.h``) implements the same rules.
"""

from __future__ import annotations

from typing import Optional, Union

#: Group sizes the packed layouts hold below K (per channel is any group_size >= K).
GROUP_SIZES = (32, 64, 128, 256)
#: Largest storage block of a per-channel weight (its scale is repeated per block).
MAX_STORAGE_BLOCK = 256
#: Activation codes lie in [-ACT_QMAX, ACT_QMAX]; the scale is absmax / ACT_QMAX.
ACT_QMAX = 127
#: The default activation granularity: one int8 scale per row and weight group.
DEFAULT_ACT_BLOCK = "group"

ActBlock = Union[None, int, str]


def qrange(bits: int, symmetric: bool) -> tuple[int, int]:
    """(qmin, qmax) of ``q``: asymmetric 0..15 / 0..255, symmetric -8..7 / -127..127."""
    if symmetric:
        return (-8, 7) if bits == 4 else (-127, 127)
    return (0, 15) if bits == 4 else (0, 255)


def zero_point(bits: int, symmetric: bool) -> int:
    """What a stored code holds above ``q``: 8 / 128 for symmetric weights, else 0."""
    return (8 if bits == 4 else 128) if symmetric else 0


def scale_divisor(bits: int, symmetric: bool) -> int:
    """``scale = range / scale_divisor``: (max - min) / qmax asymmetric, absmax / qmax symmetric."""
    return qrange(bits, symmetric)[1]


def group_of(k: int, group_size: Optional[int]) -> int:
    """The semantic group of a weight with K = ``k`` (per channel: ``k``)."""
    return k if group_size is None or group_size >= k else int(group_size)


def storage_block(k: int, group_size: Optional[int]) -> int:
    """k per packed block: the group, or for per-channel weights ``min(round_up(K, 32), 256)``."""
    g = group_of(k, group_size)
    return min(-(-k // 32) * 32, MAX_STORAGE_BLOCK) if g >= k else g


def act_block_size(k: int, group_size: Optional[int], act_block: ActBlock) -> int:
    """The one meaning of ``act_block`` as k per activation scale: None -> K (per row),
    "group" -> the weight's storage block, an int -> itself. The kernels check the int
    (positive, a multiple of the group below K)."""
    if act_block is None:
        return k
    if type(act_block) is str:
        if act_block == "group":
            return storage_block(k, group_size)
        raise ValueError(f"act_block must be None, 'group' or an int, got {act_block!r}")
    if isinstance(act_block, bool) or not hasattr(act_block, "__index__") or getattr(act_block, "ndim", 0) != 0:
        raise TypeError(f"act_block must be None, 'group' or an int, got {type(act_block).__name__}")
    return int(act_block)
