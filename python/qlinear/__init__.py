"""qlinear: quantized int4 / int8 matrix multiplies for running LLMs on CPUs.

    import qlinear
    pw = qlinear.pack_weight(w, bits=4, group_size=64)      # w: float [N, K]
    y = qlinear.matmul_w4a8(x, pw)                          # x: [M, K] or [K], float32 / float16

See docs/semantics.md (and ``qlinear.reference``, its executable form) for the exact semantics
every kernel follows.
"""

from . import _core, blocks, reference
from ._format import load_weight, load_weights, save_weight, save_weights
from ._ops import (DEFAULT_ACT_BLOCK, kernel_info, matmul, matmul_float, matmul_w4a8, matmul_w8a8,
                   quantize_activation)
from ._packed import PackedWeight, pack_blocks, pack_quantized, pack_weight, stack_weights

__version__ = "0.1.0"

__all__ = [
    "PackedWeight", "pack_weight", "pack_blocks", "pack_quantized", "stack_weights", "blocks", "load_weight", "load_weights", "save_weight",
    "save_weights", "matmul", "matmul_w4a8", "matmul_w8a8", "matmul_float", "quantize_activation",
    "DEFAULT_ACT_BLOCK", "cpu_info", "kernel_info", "set_num_threads", "get_num_threads", "set_isa",
    "reference",
]


def cpu_info() -> dict:
    """What this CPU offers and which ISA level the kernels run at."""
    return _core.cpu_info()


def set_num_threads(n: int) -> None:
    """Threads used by every kernel call (the calling thread included). Default: physical cores."""
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"number of threads must be an int, got {type(n).__name__}")
    _core.set_num_threads(n)


def get_num_threads() -> int:
    return _core.get_num_threads()


def set_isa(level: str) -> None:
    """Switch the kernels' ISA level at run time (a level of ``cpu_info()['available_isas']``),
    e.g. to compare levels; the ``QLINEAR_ISA`` environment variable sets it at start-up."""
    _core.set_isa(level)
