"""GPTQ conversion of a Hugging Face checkpoint, block by block (``llm.convert(..., method="gptq")``).

The calibration tokens run through the float embedding; then, for each decoder block, the inputs
of its projections are recorded as ``X^T X`` (the Hessian GPTQ rounds against) in the order the
block computes them: qkv; then o, reading the attention computed with the quantized qkv; then
gate_up, after the quantized attention; then down, after the quantized gate_up. Each projection
is quantized (``qlinear.torch.gptq_quantize``) as soon as its Hessian is complete, and the next
block's inputs are the outputs of the quantized block (weights as the kernels hold them, float
activations). The lm head is quantized with GPTQ too, against the final norm's outputs.

The block runs on the runtime's own layers (``layers.Block``), so calibration computes what
inference computes. Held at once: the calibration hidden states, one block's float weights and
one projection's Hessian. Deterministic. Needs torch (the GPTQ rounding is ``qlinear.torch``'s).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np

from ..._packed import pack_quantized, pack_weight
from ..source import trim_heap
from ..hf.source import KIND, LINEARS, head_tensors, layer_tensors, open_checkpoint
from ..assemble import make_block, ropes
from ..runtime.embedding import ScaledEmbedding, embed_scale
from ..runtime.kv_cache import KVCache
from ..runtime.layers import Linear, rms_norm
from ..options import Options
from ..source import progress
from ..source import Source

METHODS = ("rtn", "gptq")
DAMP = 0.1                 # dampening, a fraction of the Hessian's mean diagonal (chosen on calibration-side text: bench/gptq_llm.py --tune-damp)
CALIBRATION_TOKENS = 8192  # at most this many calibration tokens are used (well over the widest K overfits less)
SEQ_LEN = 512              # tokens per calibration sequence (each attends within itself)
HEAD_ROWS = 16384          # lm head rows rounded per call (rows are independent under GPTQ)
ERROR_ROWS = 64            # rows on which the reported rounding errors are estimated

Calibration = Union[str, os.PathLike, Sequence[int], np.ndarray]


@dataclass(frozen=True)
class CalibrationSet:
    """Calibration token sequences and where they came from (recorded in the model file)."""
    sequences: tuple       # int64 arrays of <= seq_len tokens
    source: str            # the text file's name, or "ids"

    @property
    def tokens(self) -> int:
        return sum(len(s) for s in self.sequences)

    def facts(self) -> dict:
        digest = hashlib.sha256(b"".join(np.asarray(s, "<i4").tobytes() for s in self.sequences))
        return {"source": self.source, "tokens": self.tokens, "sequences": len(self.sequences),
                "seq_len": max(len(s) for s in self.sequences), "sha256": digest.hexdigest()}


def calibration_set(calibration: Calibration, tokenizer, vocab_size: int,
                    max_tokens: int = CALIBRATION_TOKENS, seq_len: int = SEQ_LEN) -> CalibrationSet:
    """Token sequences from a text file (a path; encoded with the model's tokenizer) or from
    token ids. Split into sequences of ``seq_len``; beyond ``max_tokens`` tokens, sequences are
    taken evenly spaced over the whole text (variety over its beginning only)."""
    for name, v in (("calibration_tokens", max_tokens), ("seq_len", seq_len)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if isinstance(calibration, (str, os.PathLike)):
        path = Path(calibration)
        if not path.is_file():
            raise ValueError(f"calibration file {str(path)!r} does not exist")
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"calibration file {str(path)!r}: cannot read it as UTF-8 text ({e})") from None
        ids = np.asarray(tokenizer.encode(text), np.int64)
        source = path.name
        if ids.size == 0:
            raise ValueError(f"calibration file {str(path)!r} is empty (no tokens)")
    else:
        if isinstance(calibration, (bytes, dict)) or not hasattr(calibration, "__len__"):
            raise TypeError("calibration must be a text file's path or a sequence of token ids, "
                            f"got {type(calibration).__name__}")
        ids = np.asarray(calibration)
        if ids.size == 0:
            raise ValueError("calibration ids are empty")
        if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
            raise TypeError("calibration ids must be a 1-D sequence of ints")
        ids = ids.astype(np.int64)
        source = "ids"
    if ids.min() < 0 or ids.max() >= vocab_size:
        raise ValueError(f"calibration token ids must lie in [0, {vocab_size})")
    chunks = [ids[s:s + seq_len] for s in range(0, len(ids), seq_len)]
    want = -(-max_tokens // seq_len)
    if len(chunks) > want:
        if len(chunks[-1]) < seq_len and len(chunks) - 1 >= want:
            chunks.pop()  # full sequences only, when there are enough
        chunks = [chunks[int(i)] for i in np.linspace(0, len(chunks) - 1, want).round()]
    total = 0
    kept = []
    for c in chunks:
        c = c[:max_tokens - total]
        if len(c):
            kept.append(c)
            total += len(c)
    return CalibrationSet(tuple(kept), source)


class _Stop(Exception):
    """Raised by a recorder: the rest of the block's forward is not needed."""


class _Recorder:
    """Stands in for one projection of a block: adds ``X^T X`` of its input to ``xtx``, then
    stops the forward."""

    def __init__(self, k: int):
        self.xtx = np.zeros((k, k), np.float64)

    def __call__(self, x: np.ndarray):
        x = np.asarray(x, np.float32)
        self.xtx += x.T @ x  # float32 products per sequence, summed in float64
        raise _Stop


@dataclass
class _Rounding:
    """How each weight is rounded (``gptq_quantize``'s arguments besides the weight)."""
    bits: int
    group_size: Optional[int]
    symmetric: bool
    damp: float
    act_order: bool

    def gptq(self, w: np.ndarray, xtx: np.ndarray, rows: Optional[int] = None):
        """(PackedWeight, W' float32 as the kernels compute with, relative error of GPTQ and of
        round-to-nearest on the calibration inputs: ||X (W - W')^T||^2 / ||X W^T||^2, estimated on
        at most ERROR_ROWS evenly spaced rows). ``rows``: round that many rows per call."""
        import torch  # noqa: PLC0415

        from ...torch.quantize import gptq_quantize  # noqa: PLC0415
        h, step = torch.from_numpy(xtx), rows or w.shape[0]
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # thousands of small steps: OpenMP barriers cost more than they save (10x)
        try:
            parts = [gptq_quantize(torch.from_numpy(np.ascontiguousarray(w[r:r + step])), h, self.bits,
                                   self.group_size, self.symmetric, act_order=self.act_order, damp=self.damp)
                     for r in range(0, w.shape[0], step)]
        finally:
            torch.set_num_threads(threads)
        codes = np.concatenate([p.codes.numpy() for p in parts])
        scale = np.concatenate([p.scale.numpy() for p in parts])
        offset = None if self.symmetric else np.concatenate([p.offset.numpy() for p in parts])
        packed = pack_quantized(codes, scale, offset, self.bits, self.group_size, self.symmetric)
        wq = np.concatenate([p.weight.numpy() for p in parts])
        sub = slice(None, None, -(-w.shape[0] // ERROR_ROWS))
        ws = np.ascontiguousarray(w[sub])
        rtn = pack_weight(ws, self.bits, self.group_size, self.symmetric).dequantize()
        hf = xtx.astype(np.float32)
        energy = max(float(np.einsum("nk,nk->", ws @ hf, ws)), 1e-30)
        err = lambda d: float(np.einsum("nk,nk->", d @ hf, d)) / energy  # noqa: E731
        return packed, wq, err(ws - wq[sub]), err(ws - rtn)


def read(d: Path, opts: Options, calibration: Calibration, damp: float = DAMP, act_order: bool = False,
         calibration_tokens: int = CALIBRATION_TOKENS, progress_bar: bool = True,
         bar_leave: bool = False) -> Source:
    """A checkpoint quantized with GPTQ per ``opts`` (bits, group_size, symmetric, slim_vocab)
    against ``calibration`` (a text file or token ids); see the module's description."""
    if opts.bits is None:
        raise ValueError("method='gptq' quantizes weights: bits must be 4 or 8")
    if isinstance(damp, bool) or not isinstance(damp, (int, float)) or not 0 < damp < 1e3:
        raise ValueError(f"damp must be a positive number (a fraction of the Hessian's mean diagonal), got {damp!r}")
    if not isinstance(act_order, bool):
        raise TypeError(f"act_order must be a bool, got {type(act_order).__name__}")
    try:
        import torch  # noqa: F401, PLC0415
    except ImportError:
        raise ImportError("method='gptq' needs torch (pip install torch): its rounding is qlinear.torch's") from None
    cfg, tokenizer, ckpt, embedding, rows = open_checkpoint(d, opts)
    if cfg.num_experts:
        raise ValueError(f"{d}: GPTQ of routed experts ({cfg.arch}) is not supported; convert with method='rtn'")
    calib = calibration_set(calibration, tokenizer, cfg.vocab_size, calibration_tokens)
    rounding = _Rounding(opts.bits, opts.group_size, opts.symmetric, float(damp), act_order)
    seq_len = max(len(s) for s in calib.sequences)
    cache = KVCache(cfg, seq_len)  # lazily resident: a layer's pages once it is run
    rope, local_rope = ropes(cfg, seq_len)
    table = embedding.open(on_disk=True)
    if cfg.embed_scale:
        table = ScaledEmbedding(table, embed_scale(cfg.hidden_size, embedding.dtype))
    hidden = [table(s) for s in calib.sequences]
    tensors, errors = {}, {}
    bar = progress(cfg.num_layers + 1, "GPTQ", progress_bar, leave=bar_leave)
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        t = layer_tensors(ckpt, cfg, i)
        current = {n: Linear(t[p + n], t.get(p + n + ".bias"), act="float") for n in LINEARS}

        def block(linears):
            return make_block(cfg, i, lambda name, shape: linears[name[len(p):]], lambda name, n: t[name],
                              rope, local_rope)

        for n in LINEARS:  # in the order the block computes them, each after its predecessors are quantized
            bar.set_description(f"GPTQ layer {i} {n}")
            recorder = _Recorder(t[p + n].shape[1])
            run = block({**current, n: recorder})
            for h in hidden:
                try:
                    run(h, cache, 0)
                except _Stop:
                    pass
            packed, wq, e_gptq, e_rtn = rounding.gptq(t[p + n], recorder.xtx)
            del recorder
            tensors[p + n], errors[p + n] = packed, (e_gptq, e_rtn)
            current[n] = Linear(wq, t.get(p + n + ".bias"), act="float")
        run = block(current)
        hidden = [run(h, cache, 0) for h in hidden]  # the next block reads the quantized block's output
        tensors.update({k: v for k, v in t.items() if k not in tensors})  # norms, biases
        del t, current, run
        trim_heap()
        bar.update(1)
    bar.set_description("GPTQ lm head")
    head = head_tensors(ckpt, cfg, rows)
    recorder = _Recorder(cfg.hidden_size)
    for h in hidden:
        try:
            recorder(rms_norm(np.ascontiguousarray(h), head["norm"], cfg.rms_norm_eps))
        except _Stop:
            pass
    head["lm_head"], _, *errors["lm_head"] = rounding.gptq(head["lm_head"], recorder.xtx, HEAD_ROWS)
    tensors.update(head)
    bar.update(1)
    bar.close()
    gptq = {"damp": float(damp), "act_order": act_order, "lm_head": "gptq",
            "rel_error": float(np.mean([e[0] for e in errors.values()])),
            "rel_error_rtn": float(np.mean([e[1] for e in errors.values()])),
            "layers": {k: [round(e[0], 7), round(e[1], 7)] for k, e in errors.items()}}
    quantization = {"bits": opts.bits, "group_size": opts.group_size, "symmetric": opts.symmetric,
                    "method": "gptq", "calibration": calib.facts(), "gptq": gptq}
    return Source(KIND, d, cfg, tokenizer, embedding, tensors, quantization)
