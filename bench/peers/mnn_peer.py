"""MNN (Alibaba) CPU linear layer as a benchmark peer: W4A8 / W8A8.

How it works: the weight ``w`` [N, K] (nn.Linear convention, y = x @ w.T) is
put in a one-node ONNX graph ``y = MatMul(x, B)`` with the constant
``B = w.T`` [K, N] and a dynamic first dimension of ``x``.  MNN's converter
(the compiled ``_tools`` module, called in-process) turns it into an .mnn
file with block-wise asymmetric weight quantization::

    mnnconvert -f ONNX --modelFile in.onnx --MNNModel out.mnn --bizCode biz
               --weightQuantBits {bits} --weightQuantBlock {block}

Pitfall (measured with MNN 3.6.1): despite ``--help`` saying the default is
symmetric, block-wise quantization *without* flags is asymmetric min/max
(scale + zero point per block; memory "normal" output error matches a
numpy min/max emulation to 4+ digits), while
passing ``--weightQuantAsymmetric`` gives symmetric absmax/(2^(bits-1)-1)
quantization (one scale per block, smaller file, larger error).  We pass no
flag, i.e. asymmetric.

The converter turns the MatMul with a constant operand into a 1x1
convolution.  If K is not a multiple of ``block`` it silently falls back to
per-output-channel quantization.

The model runs on MNN's CPU backend.  Memory mode "low" keeps the weights
quantized and quantizes activations to int8 on the fly (W4A8 / W8A8);
"normal" dequantizes the weights to float at load time (float GEMM).

Requires ``pip install MNN onnx``.  ``MNN.tools`` is never imported: importing
it pip-installs a logging SDK and sends usage logs over the network.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import sys
import tempfile

import numpy as np

__all__ = ["MNNLinear", "available"]

_MEMORY_MODES = {"normal": 0, "high": 1, "low": 2}

_mnn = None  # (MNN.nn, MNN.expr) once imported


@contextlib.contextmanager
def _redirect_fds(path: str = os.devnull):
    """Send the process-level stdout/stderr (fds 1 and 2) to ``path``.

    MNN's C++ code prints straight to the file descriptors, so redirecting
    ``sys.stdout`` is not enough.
    """
    for s in (sys.stdout, sys.stderr):
        try:
            s.flush()
        except Exception:
            pass
    libc = None
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        pass
    saved = [os.dup(1), os.dup(2)]
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        yield
    finally:
        if libc is not None:
            libc.fflush(None)  # flush C stdio buffers into the redirect target
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for f in saved + [fd]:
            os.close(f)


def _import_mnn():
    """Import MNN.nn and MNN.expr (silently; MNN prints a CPU banner on import)."""
    global _mnn
    if _mnn is None:
        with _redirect_fds():
            import MNN.expr as expr
            import MNN.nn as nn
        _mnn = (nn, expr)
    return _mnn


def available() -> bool:
    """True if MNN (and onnx, needed to build the model) can be imported."""
    try:
        _import_mnn()
        with _redirect_fds():
            import _tools  # noqa: F401  (MNN's compiled converter)
        import onnx  # noqa: F401
    except Exception:
        return False
    return True


def _build_onnx(w: np.ndarray, path: str) -> None:
    """Write a one-MatMul ONNX model y = x @ w.T with x: float32 [M, K], M dynamic."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    n, k = w.shape
    b = numpy_helper.from_array(np.ascontiguousarray(w.T, dtype=np.float32), "B")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["M", k])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", n])
    node = helper.make_node("MatMul", ["x", "B"], ["y"])
    graph = helper.make_graph([node], "linear", [x], [y], [b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.save(model, path)


def _convert(w: np.ndarray, bits: int, block: int, out_path: str) -> None:
    """Quantize/convert ``w`` into an .mnn file at ``out_path`` (atomically)."""
    with _redirect_fds():
        import _tools

    base = f"{out_path}.{os.getpid()}.tmp"
    onnx_path, mnn_tmp, log_path = base + ".onnx", base + ".mnn", base + ".log"
    argv = [
        "mnnconvert",  # argv[0]: program name, as in sys.argv
        "-f", "ONNX",
        "--modelFile", onnx_path,
        "--MNNModel", mnn_tmp,
        "--bizCode", "biz",
        "--weightQuantBits", str(bits),
        "--weightQuantBlock", str(block),
        # no --weightQuantAsymmetric: in MNN 3.6.1 it selects *symmetric*
        # block quantization; the default is asymmetric (see module doc).
    ]
    try:
        _build_onnx(w, onnx_path)
        with _redirect_fds(log_path):
            ok = _tools.mnnconvert(argv)
        if not ok or not os.path.exists(mnn_tmp):
            with open(log_path, errors="replace") as f:
                log = f.read()[-2000:]
            raise RuntimeError(f"MNN converter failed ({' '.join(argv)}):\n{log}")
        os.replace(mnn_tmp, out_path)
    finally:
        for p in (onnx_path, mnn_tmp, log_path):
            with contextlib.suppress(OSError):
                os.remove(p)


class MNNLinear:
    """MNN's CPU linear y = x @ w.T with weights quantized by MNN's converter
    (bits, block), memory mode low (W4A8) by default.

    Args:
        w: float weight [N, K] (nn.Linear convention).
        bits: weight bits, 4 (W4A8) or 8 (W8A8) (MNN accepts 2..8).
        block: quantization block size along K (e.g. 32, 64, 128); -1 means
            per-output-channel.  If K % block != 0 MNN falls back to
            per-channel quantization.
        threads: CPU threads used by MNN.
        memory: MNN memory mode: "low" = quantized weights, int8 activations
            computed per call (W4A8/W8A8); "normal" = weights dequantized to
            float at load time.
        cache_dir: where converted .mnn files are kept, keyed by shape, bits,
            block and a hash of ``w``.  Default: <system temp>/qlinear_mnn_cache.

    Attributes:
        weight_bytes: size of the converted .mnn file (quantized weights plus
            scales/zero points), for GB/s reporting.
        path: the .mnn file.
    """

    def __init__(self, w: np.ndarray, bits: int = 4, block: int = 64, threads: int = 1,
                 memory: str = "low", cache_dir: str | None = None):
        w = np.ascontiguousarray(w, dtype=np.float32)
        if w.ndim != 2:
            raise ValueError(f"w must be 2-D [N, K], got shape {w.shape}")
        if not 2 <= bits <= 8:
            raise ValueError(f"bits must be in 2..8, got {bits}")
        if memory not in _MEMORY_MODES:
            raise ValueError(f"memory must be one of {sorted(_MEMORY_MODES)}, got {memory!r}")
        self.n, self.k = w.shape
        self.bits, self.block, self.threads, self.memory = bits, block, threads, memory

        if cache_dir is None:
            cache_dir = os.path.join(tempfile.gettempdir(), "qlinear_mnn_cache")
        os.makedirs(cache_dir, exist_ok=True)
        digest = hashlib.blake2b(w.tobytes(), digest_size=12).hexdigest()
        self.path = os.path.join(
            cache_dir, f"linear_n{self.n}_k{self.k}_w{bits}_b{block}_asym_{digest}.mnn")
        if not os.path.exists(self.path):
            _convert(w, bits, block, self.path)
        self.weight_bytes = os.path.getsize(self.path)

        nn, expr = _import_mnn()
        self._expr = expr
        config = {"backend": "CPU", "numThread": int(threads),
                  "memory": _MEMORY_MODES[memory], "precision": 0}
        with _redirect_fds():
            self._rt = nn.create_runtime_manager((config,))
            self._module = nn.load_module_from_file(
                self.path, ["x"], ["y"], runtime_manager=self._rt)
        self._inputs = {}  # M -> reusable placeholder Var [M, K]

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """x: float32 [..., K] -> float32 [..., N]."""
        x = np.asarray(x)
        lead = x.shape[:-1]
        if x.shape[-1] != self.k:
            raise ValueError(f"x last dim must be {self.k}, got shape {x.shape}")
        x2 = np.ascontiguousarray(x.reshape(-1, self.k), dtype=np.float32)
        m = x2.shape[0]
        var = self._inputs.get(m)
        if var is None:
            var = self._inputs[m] = self._expr.placeholder([m, self.k], self._expr.NCHW)
        var.write(x2)
        y = self._module.forward(var).read()
        # read() returns a view of MNN's output buffer, which the next call
        # overwrites: copy it.
        return np.array(y, dtype=np.float32, copy=True).reshape(*lead, self.n)

    def __repr__(self) -> str:
        return (f"MNNLinear(N={self.n}, K={self.k}, bits={self.bits}, block={self.block}, "
                f"threads={self.threads}, memory={self.memory!r})")
