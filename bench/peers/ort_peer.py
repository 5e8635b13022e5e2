"""onnxruntime's MatMulNBits (com.microsoft contrib op, CPU) as a benchmark peer.

How it works: the weight ``w`` [N, K] (nn.Linear convention, y = x @ w.T) is
quantized block-wise along K with onnxruntime's own C++ quantizer, the one its
``MatMulNBitsQuantizer`` (onnxruntime/quantization/matmul_nbits_quantizer.py,
``DefaultWeightOnlyQuantizer.qbits_block_quant``, QOperator format) calls::

    quantize_matmul_4bits(packed, w.T, scales, zero_points, block, N, K, is_symmetric)

with (kpack = 8 // bits, k_blocks = ceil(K / block)):

* ``w.T``: contiguous float32 [K, N] (the ONNX MatMul ``B``), K padded with
  zeros to k_blocks * block;
* ``packed``: uint8 [N, k_blocks, block / kpack] (output);
* ``scales``: float32 [N, k_blocks] (output);
* ``zero_points``: uint8 [N, ceil(k_blocks / kpack)] (output; for 4 bits two
  zero points per byte, only used when asymmetric).

The pybind functions write into these arrays in place: they must already have
exactly these dtypes and be C-contiguous, otherwise pybind11 converts them to a
temporary and the result is silently lost.

The graph is a single node ``y = MatMulNBits(x, B_q, scales[, zero_points])``
(domain ``com.microsoft``, attributes K, N, bits, block_size,
accuracy_level), opsets ("", 21) and ("com.microsoft", 1), with a dynamic first
dimension of ``x``; the quantized weights are embedded as initializers (far
below protobuf's 2 GB limit for our shapes).  ``accuracy_level`` is the
minimum compute precision: 1 = fp32 (weights dequantized inside the kernel,
float activations), 4 = int8 (activations quantized to int8 per block: W4A8).

The session runs on the CPU execution provider with
``intra_op_num_threads = threads`` and ``inter_op_num_threads = 1``; calls
go through ``io_binding`` with the input and a preallocated output array bound
once per M, so a call is ``run_with_iobinding`` plus nothing else.

Requires ``pip install onnxruntime onnx``.
"""

from __future__ import annotations

import numpy as np

__all__ = ["ORTMatMulNBits", "available", "quantize", "dequantize", "version"]


def available() -> bool:
    """True if onnxruntime (with MatMulNBits' quantizer) and onnx can be imported."""
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
        from onnxruntime.capi._pybind_state import quantize_matmul_4bits  # noqa: F401
    except Exception:
        return False
    return True


def version() -> str | None:
    try:
        import onnxruntime
    except Exception:
        return None
    return onnxruntime.__version__


def quantize(w: np.ndarray, bits: int, block: int, symmetric: bool = False):
    """Quantize w [N, K] like onnxruntime's MatMulNBitsQuantizer (QOperator format).

    Returns (packed u8 [N, k_blocks, block*bits/8], scales f32 [N, k_blocks],
    zero_points u8 [N, ceil(k_blocks*bits/8)]).
    """
    from onnxruntime.capi import _pybind_state as C

    n, k = w.shape
    kpack = 8 // bits
    k_blocks = (k + block - 1) // block
    b = np.zeros((k_blocks * block, n), dtype=np.float32)  # B = w.T [K, N], K padded
    b[:k] = w.T
    packed = np.zeros((n, k_blocks, (block + kpack - 1) // kpack), dtype=np.uint8)
    zero_points = np.zeros((n, (k_blocks + kpack - 1) // kpack), dtype=np.uint8)
    scales = np.zeros((n, k_blocks), dtype=np.float32)
    fn = {4: C.quantize_matmul_4bits, 8: getattr(C, "quantize_matmul_8bits", None)}.get(bits)
    if fn is None:
        raise ValueError(f"bits={bits} not supported by this onnxruntime")
    fn(packed, b, scales, zero_points, block, n, k, bool(symmetric))
    return packed, scales, zero_points


def dequantize(packed, scales, zero_points, bits, block, k, symmetric=False):
    """Float weights [N, K] that ``quantize``'s output stands for (low nibble
    first; without zero points the zero point is 2^(bits-1)), for checks."""
    n, k_blocks, _ = packed.shape
    if bits == 4:
        q = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(n, k_blocks, block)
        zp = np.stack([zero_points & 0x0F, zero_points >> 4], axis=-1).reshape(n, -1)[:, :k_blocks]
    else:
        q, zp = packed.reshape(n, k_blocks, block), zero_points[:, :k_blocks]
    if symmetric:
        zp = np.full((n, k_blocks), 1 << (bits - 1))
    w = (q.astype(np.float32) - zp[..., None].astype(np.float32)) * scales[..., None]
    return w.reshape(n, k_blocks * block)[:, :k]


def _build_model(w, bits, block, accuracy_level, symmetric):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    n, k = w.shape
    packed, scales, zero_points = quantize(w, bits, block, symmetric)
    inits = [numpy_helper.from_array(packed, "B_q"), numpy_helper.from_array(scales, "scales")]
    inputs = ["x", "B_q", "scales"]
    if not symmetric:
        inits.append(numpy_helper.from_array(zero_points, "zero_points"))
        inputs.append("zero_points")
    node = helper.make_node("MatMulNBits", inputs, ["y"], domain="com.microsoft",
                            K=k, N=n, bits=bits, block_size=block,
                            accuracy_level=int(accuracy_level))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["M", k])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", n])
    graph = helper.make_graph([node], "matmul_nbits", [x], [y], inits)
    model = helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = min(model.ir_version, 10)  # accepted by onnxruntime >= 1.20
    nbytes = packed.nbytes + scales.nbytes + (0 if symmetric else zero_points.nbytes)
    return model, nbytes


def _without_spinning(so):
    import onnxruntime as ort

    new = ort.SessionOptions()
    for attr in ("intra_op_num_threads", "inter_op_num_threads", "execution_mode",
                 "graph_optimization_level", "log_severity_level"):
        setattr(new, attr, getattr(so, attr))
    new.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return new


class ORTMatMulNBits:
    """onnxruntime CPU ``MatMulNBits``: y = x @ w.T with block-quantized weights.

    Args:
        w: float weight [N, K] (nn.Linear convention).
        bits: weight bits, 4 (or 8 if this onnxruntime has quantize_matmul_8bits).
        block: quantization block size along K (power of 2, >= 16).
        threads: ``intra_op_num_threads``.
        accuracy_level: 1 = fp32 activations/compute, 4 = int8 activations (W4A8).
        symmetric: symmetric quantization (no zero points).  Default asymmetric
            (scale + zero point per block, like qlinear's and MNN's cases).

    Attributes:
        weight_bytes: bytes of the quantized weights, scales and zero points.
    """

    def __init__(self, w: np.ndarray, bits: int = 4, block: int = 64, threads: int = 1,
                 accuracy_level: int = 4, symmetric: bool = False):
        import onnxruntime as ort

        w = np.ascontiguousarray(w, dtype=np.float32)
        if w.ndim != 2:
            raise ValueError(f"w must be 2-D [N, K], got shape {w.shape}")
        if block < 16 or block & (block - 1):
            raise ValueError(f"block must be a power of 2 >= 16, got {block}")
        self.n, self.k = w.shape
        self.bits, self.block, self.threads = bits, block, threads
        self.accuracy_level, self.symmetric = accuracy_level, symmetric

        model, self.weight_bytes = _build_model(w, bits, block, accuracy_level, symmetric)
        so = ort.SessionOptions()
        so.intra_op_num_threads = int(threads)
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.log_severity_level = 3  # errors only
        self._model_bytes, self._options = model.SerializeToString(), so
        self._sess = ort.InferenceSession(self._model_bytes, so, providers=["CPUExecutionProvider"])
        self._bindings = {}  # M -> (io_binding, x buffer [M, K], y buffer [M, N])

    def clone(self, spinning: bool = True) -> "ORTMatMulNBits":
        """Another session on the same quantized weights, with its own copy of them (for sweeps
        over many distinct weight matrices without quantizing each). Every session has its own
        thread pool: for many sessions, ``spinning=False`` keeps their idle workers from spinning
        against each other (set it on the first session too, with ``set_spinning``)."""
        import onnxruntime as ort

        other = object.__new__(type(self))
        other.__dict__.update(self.__dict__)
        so = self._options
        if not spinning:
            so = _without_spinning(so)
        other._options = so
        other._sess = ort.InferenceSession(self._model_bytes, so, providers=["CPUExecutionProvider"])
        other._bindings = {}
        return other

    def _binding(self, m):
        b = self._bindings.get(m)
        if b is None:
            xb = np.empty((m, self.k), dtype=np.float32)
            yb = np.empty((m, self.n), dtype=np.float32)
            io = self._sess.io_binding()
            # Both are bound by address (no copy): writing into xb changes the
            # next run's input, and the run writes into yb.
            io.bind_cpu_input("x", xb)
            io.bind_output("y", "cpu", 0, np.float32, list(yb.shape), yb.ctypes.data)
            b = self._bindings[m] = (io, xb, yb)
        return b

    def bind(self, x: np.ndarray):
        """For timing: copy x [M, K] into the bound input buffer once and return
        ``run()``, which only calls ``run_with_iobinding`` and returns the bound
        output buffer [M, N] (overwritten by the next call with the same M)."""
        x = np.asarray(x, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != self.k:
            raise ValueError(f"x must be [M, {self.k}], got shape {x.shape}")
        io, xb, yb = self._binding(x.shape[0])
        np.copyto(xb, x)
        sess = self._sess

        def run():
            sess.run_with_iobinding(io)
            return yb

        return run

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """x: float32 [..., K] -> float32 [..., N] (a new array)."""
        x = np.asarray(x)
        lead = x.shape[:-1]
        if x.shape[-1] != self.k:
            raise ValueError(f"x last dim must be {self.k}, got shape {x.shape}")
        io, xb, yb = self._binding(int(np.prod(lead, dtype=np.int64)))
        np.copyto(xb, x.reshape(-1, self.k), casting="same_kind")
        self._sess.run_with_iobinding(io)
        return yb.copy().reshape(*lead, self.n)

    def __repr__(self) -> str:
        return (f"ORTMatMulNBits(N={self.n}, K={self.k}, bits={self.bits}, block={self.block}, "
                f"threads={self.threads}, accuracy_level={self.accuracy_level}, "
                f"symmetric={self.symmetric})")
