"""qlinear in torch: ``QLinear`` modules, ``quantize_model``, calibration and SmoothQuant.

    import qlinear.torch as qt
    summary = qt.quantize_model(model, bits=4, group_size=64)          # nn.Linear -> QLinear, in place
    calib = qt.calibrate(model, batches)                                # activation statistics
    summary = qt.quantize_model(model, smooth="search", clip_search=True, bits_budget=5.0,
                                calibration=calib)

Inference only. The kernels run through the ``torch.library`` op ``qlinear::linear`` (with a
fake implementation), so quantized models work under ``torch.compile`` and ``torch.jit.trace``.
"""

from . import _linear_op  # noqa: F401  (registers torch.ops.qlinear.linear)
from .module import QLinear
from .quantize import (Calibration, LayerStats, QuantizeSummary, calibrate, fake_quantize_weight,
                       quantize_model)

__all__ = ["QLinear", "quantize_model", "calibrate", "Calibration", "LayerStats", "QuantizeSummary",
           "fake_quantize_weight", "load_quantized"]


def load_quantized(model, state_dict, strict: bool = True):
    """Load a ``state_dict`` saved from a quantized model into a float model of the same
    architecture: the Linears the state holds packed are replaced by ``QLinear`` first."""
    import torch.nn as nn
    from .quantize import _set_module
    for name, m in list(model.named_modules()):
        if isinstance(m, nn.Linear) and f"{name}.packed" in state_dict:
            _set_module(model, name, QLinear.empty())
    return model.load_state_dict(state_dict, strict=strict)
