"""Reading MNN LLM exports (the output directory of ``llmexport``) into numpy arrays.

An export directory holds:

- ``config.json``: runtime settings of ``MNN.llm`` (threads, precision, memory, sampler, file names);
- ``llm_config.json``: the model's type, hidden size, layer count and chat template;
- ``llm.mnn``: the graph (a FlatBuffer). Every linear layer is a 1x1 ``Convolution`` op named after
  its module (``/layers.0/self_attn/q_proj/Linear``, ``/lm/lm_head/Linear``); its weights are not in
  the graph but in ``llm.mnn.weight`` at ``main.external = [offset, weight_bytes, alpha_bytes,
  bias_bytes, 0]``. RMSNorms are ``LayerNorm`` ops (``useRMSNorm``) with ``external = [offset,
  gamma_bytes, beta_bytes]``. RoPE's inverse frequencies are a float ``Const`` (``/rotary/...``).
- ``llm.mnn.weight``: for each quantized linear, at its offset: a header (``uint8`` ndim = 2,
  ``int16`` [N, K] (``int32`` when ``quanParameter.shapeInt32``), then an ``int8`` code map of
  2^bits + 1 bytes), the codes (``N*K*bits/8`` bytes, row-major; int4 two per byte, high nibble
  first), then the block parameters in fp32 (asymmetric: ``[zero, scale]`` per block, row-major
  ``[N, n_blocks, 2]``; symmetric: ``scale`` per block), then the fp32 bias (``N`` values) if any.
  MNN computes ``w = (code - 2^(bits-1)) * scale + zero`` (int4: code - 8, int8: code - 128), so
  ``lo = zero - 2^(bits-1) * scale`` gives ``w = lo + scale * code``, the asymmetric block scheme
  of qlinear (``lo`` is the block minimum, ``scale = (max - min) / (2^bits - 1)``, codes rounded
  half-to-even). fp16 linears (``quanParameter.type == 3``) hold ``N*K`` halves.
- ``embeddings_bf16.bin``: raw bf16 ``[vocab, hidden]``, the embedding table read from disk.
- ``tokenizer.mtok`` (or ``tokenizer.txt``): the tokenizer (see ``_read_mtok``).

The graph is read by converting ``llm.mnn`` to JSON with MNN's own converter (the compiled
``_tools`` module, run in a subprocess; never the ``MNN.tools`` Python package, which installs
packages and sends usage logs when imported).

``export_with_llmexport`` runs ``llmexport`` (a separate PyPI package) on a Hugging Face
checkpoint to build such a directory.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple, Union

import numpy as np

from .pread_file import PreadFile

__all__ = ["QuantizedLinear", "MnnExport", "read_export", "read_graph", "read_tokenizer",
           "export_with_llmexport", "SUPPORTED_MODEL_TYPES"]

SUPPORTED_MODEL_TYPES = ("qwen2", "llama")

_PROJ_PARENT = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn",
                "o_proj": "self_attn", "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}
_LINEAR_RE = re.compile(r"^/layers\.(\d+)/(self_attn|mlp)/(\w+)/Linear$")
_NORM_RE = re.compile(r"^/blocks\.(\d+)/(input_layernorm|post_attention_layernorm)/")


# ----------------------------------------------------------------------------------------------
# Data classes


@dataclass
class QuantizedLinear:
    """One quantized linear layer of an export, as stored (codes are not re-rounded).

    ``w[n, k] = lo[n, b] + scale[n, b] * codes[n, k]`` with ``b = k // block``, where ``block`` is
    ``block_size`` or K when ``block_size`` is None (one block per row: per channel).
    """

    codes: np.ndarray           # uint8 [N, K], 0 .. 2^bits - 1
    scale: np.ndarray           # float32 [N, n_blocks]
    lo: np.ndarray              # float32 [N, n_blocks]
    bits: int
    block_size: Optional[int]   # None: one block spans the whole row
    bias: Optional[np.ndarray] = None   # float32 [N]
    symmetric: bool = False     # exported symmetric: lo == -2^(bits-1) * scale

    @property
    def shape(self) -> Tuple[int, int]:
        return tuple(self.codes.shape)

    @property
    def n_blocks(self) -> int:
        return self.scale.shape[1]

    def dequantize(self) -> np.ndarray:
        """float32 [N, K], computed as MNN does (``lo + scale * code`` in float32)."""
        n, k = self.codes.shape
        block = self.block_size or k
        scale = np.repeat(self.scale, block, axis=1)[:, :k]
        lo = np.repeat(self.lo, block, axis=1)[:, :k]
        return (lo + scale * self.codes.astype(np.float32)).astype(np.float32)


Linear = Union[QuantizedLinear, np.ndarray]


@dataclass
class MnnExport:
    """An export directory, read: weights by Hugging Face module name, config in HF terms."""

    path: Path
    config: dict                          # Hugging Face config.json terms
    linears: Mapping[str, Linear]         # "model.layers.0.self_attn.q_proj", ..., "lm_head" (read on access)
    norms: Dict[str, np.ndarray]          # "model.layers.0.input_layernorm", ..., "model.norm"
    embedding_path: Path                  # raw bf16 [vocab, hidden]
    embedding_shape: Tuple[int, int]
    tokenizer: object                     # tokenizers.Tokenizer
    chat_template: Optional[str]
    stop_token_ids: List[int]
    bos_token: Optional[str] = None
    eos_token: Optional[str] = None
    rope_inv_freq: Optional[np.ndarray] = None   # float32 [head_dim // 2], as the graph holds it
    runtime_config: dict = field(default_factory=dict)   # the export's config.json
    llm_config: dict = field(default_factory=dict)       # the export's llm_config.json

    def embedding(self, mmap: bool = True) -> np.ndarray:
        """The embedding table as uint16 bf16 bits [vocab, hidden] (memory-mapped by default)."""
        if mmap:
            return np.memmap(self.embedding_path, dtype=np.uint16, mode="r",
                             shape=self.embedding_shape)
        return np.fromfile(self.embedding_path, dtype=np.uint16).reshape(self.embedding_shape)

    def embed(self, ids) -> np.ndarray:
        """float32 rows of the embedding for token ids."""
        rows = np.asarray(self.embedding()[np.asarray(ids, dtype=np.int64)], dtype=np.uint32)
        return (rows << 16).view(np.float32)


# ----------------------------------------------------------------------------------------------
# Files and the graph


def _load_json(path: Path, what: str) -> dict:
    if not path.is_file():
        raise ValueError(f"{path}: missing ({what})")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not valid JSON ({what}): {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object ({what})")
    return data


def read_graph(mnn_path) -> dict:
    """The graph of an ``.mnn`` file as the converter's JSON (ops, tensor names), as a dict.

    Runs MNN's compiled converter (``_tools.mnnconvert``) in a subprocess; weights stored
    externally are not loaded."""
    mnn_path = Path(mnn_path)
    if not mnn_path.is_file():
        raise ValueError(f"{mnn_path}: missing (the graph)")
    if importlib.util.find_spec("_tools") is None:
        raise ImportError("reading an MNN graph needs MNN's converter module `_tools` "
                          "(pip install MNN==3.6.1)")
    with tempfile.TemporaryDirectory(prefix="qlinear-mnn-") as tmp:
        out = Path(tmp) / "graph.json"
        code = ("import sys, _tools; "
                "_tools.mnnconvert(['', '-f', 'MNN', '--modelFile', sys.argv[1], '--JsonFile', sys.argv[2]])")
        proc = subprocess.run([sys.executable, "-c", code, str(mnn_path), str(out)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              errors="replace", timeout=600)
        if proc.returncode != 0 or not out.is_file() or out.stat().st_size == 0:
            tail = "\n".join(proc.stdout.strip().splitlines()[-5:])
            raise ValueError(f"{mnn_path}: MNN's converter could not read the graph "
                             f"(exit {proc.returncode}): {tail}")
        try:
            graph = json.loads(out.read_text(encoding="utf-8", errors="replace"))
        except json.JSONDecodeError as e:
            raise ValueError(f"{mnn_path}: the converter's JSON is unreadable: {e}") from None
    if not isinstance(graph, dict) or not isinstance(graph.get("oplists"), list):
        raise ValueError(f"{mnn_path}: not an MNN graph (no op list)")
    return graph


class _WeightFile:
    """Bounded reads from ``llm.mnn.weight``, with errors naming the file and the record. Reads
    go through pread, not a mapping: the page cache holds the file, the process only what it
    keeps (a model is repacked layer by layer without the export becoming resident)."""

    def __init__(self, path: Path):
        if not path.is_file():
            raise ValueError(f"{path}: missing (the weights)")
        self.path = path
        self._file = PreadFile(path)
        self.size = self._file.size

    def bytes(self, offset: int, length: int, what: str) -> np.ndarray:
        if offset < 0 or length < 0 or offset + length > self.size:
            raise ValueError(f"{self.path}: truncated or corrupt: {what} needs bytes "
                             f"[{offset}, {offset + length}) but the file has {self.size}")
        try:
            data = self._file.read(offset, length)
        except ValueError:
            raise ValueError(f"{self.path}: short read of {what} (file changed while reading?)") from None
        return np.frombuffer(data, dtype=np.uint8)

    def floats(self, offset: int, length: int, what: str) -> np.ndarray:
        if length % 4:
            raise ValueError(f"{self.path}: {what}: {length} bytes is not a whole number of float32")
        return np.array(self.bytes(offset, length, what)).view(np.float32)


def _unpack_codes(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    if bits == 8:
        return np.array(packed[:count], dtype=np.uint8)
    out = np.empty(2 * packed.size, dtype=np.uint8)  # two codes per byte, high nibble first
    np.right_shift(packed, 4, out=out[0::2])
    np.bitwise_and(packed, 0x0F, out=out[1::2])
    return out[:count]


def _read_linear(wf: _WeightFile, op: dict, payload: bool = True) -> Linear:
    """One linear's record; ``payload=False`` checks the record (header, code map, sizes)
    without reading its codes and block parameters, and returns None."""
    name = op.get("name", "?")
    main = op.get("main") or {}
    common = main.get("common") or {}
    n, k = int(common.get("outputCount", 0)), int(common.get("inputCount", 0))
    ext = main.get("external")
    if not ext or len(ext) < 4:
        raise ValueError(f"{wf.path}: op {name}: no external weight record in the graph")
    if common.get("kernelX", 1) != 1 or common.get("kernelY", 1) != 1 or common.get("group", 1) != 1:
        raise ValueError(f"op {name}: a convolution that is not a linear layer (kernel/group != 1)")
    offset, w_len, a_len, b_len = (int(x) for x in ext[:4])
    quan = main.get("quanParameter") or {}
    qtype = quan.get("type")
    what = f"linear {name} [{n}x{k}]"
    bias = None
    if b_len:
        if b_len != 4 * n:
            raise ValueError(f"{wf.path}: {what}: bias of {b_len} bytes, expected {4 * n}")
        bias = wf.floats(offset + w_len + a_len, b_len, f"{what} bias").copy()
    if qtype == 3:   # fp16 weights
        if w_len != 2 * n * k or a_len:
            raise ValueError(f"{wf.path}: {what}: fp16 record of {w_len} bytes, expected {2 * n * k}")
        if offset + w_len > wf.size:
            raise ValueError(f"{wf.path}: truncated or corrupt: {what} lies beyond the end of the file")
        if not payload:
            return None
        w = np.array(wf.bytes(offset, w_len, what)).view(np.float16).astype(np.float32).reshape(n, k)
        return w if bias is None else _FloatLinear(w, bias)
    if qtype != 1:
        raise ValueError(f"{what}: unsupported weight storage (quanParameter.type={qtype!r}; "
                         "supported: 1 = quantized, 3 = fp16)")
    bits = int(quan.get("aMaxOrBits", 0))
    if bits not in (4, 8):
        raise ValueError(f"{what}: {bits}-bit weights are not supported (4 or 8)")
    if quan.get("useInt32") or quan.get("has_scaleInt"):
        raise ValueError(f"{what}: integer scales are not supported")
    if str(quan.get("scaleStorage", "FP32")).upper() not in ("FP32", "0"):
        raise ValueError(f"{what}: scale storage {quan.get('scaleStorage')!r} is not supported (FP32)")
    asym = int(quan.get("aMin", 0)) != 0
    # Header: ndim, dims, code map.
    dtype = np.int32 if quan.get("shapeInt32") else np.int16
    ndim = int(wf.bytes(offset, 1, f"{what} header")[0])
    if ndim != 2:
        raise ValueError(f"{wf.path}: {what}: header says {ndim} dimensions, expected 2")
    dsize = np.dtype(dtype).itemsize
    dims = np.array(wf.bytes(offset + 1, 2 * dsize, f"{what} header")).view(dtype).tolist()
    if dims != [n, k]:
        raise ValueError(f"{wf.path}: {what}: header shape {dims} does not match the graph's [{n}, {k}]")
    map_len = 1 + (1 << bits)
    header = 1 + 2 * dsize + map_len
    cmap = np.array(wf.bytes(offset + 1 + 2 * dsize, map_len, f"{what} code map")).view(np.int8)
    half = 1 << (bits - 1)
    expected_map = np.arange(-half, half, dtype=np.int8)
    if not np.array_equal(cmap[1:], expected_map):
        raise ValueError(f"{wf.path}: {what}: unexpected code map (not -{half}..{half - 1})")
    code_bytes = (n * k * bits + 7) // 8
    if w_len != header + code_bytes:
        raise ValueError(f"{wf.path}: {what}: weight record of {w_len} bytes, expected "
                         f"{header + code_bytes} for {bits}-bit codes")
    per_block = 2 if asym else 1
    if a_len % (4 * per_block * n):
        raise ValueError(f"{wf.path}: {what}: {a_len} bytes of block parameters do not divide "
                         f"into {n} rows")
    n_blocks = a_len // (4 * per_block * n)
    if n_blocks < 1 or k % n_blocks:
        raise ValueError(f"{wf.path}: {what}: {n_blocks} blocks do not divide K={k}")
    if offset + w_len + a_len > wf.size:
        raise ValueError(f"{wf.path}: truncated or corrupt: {what} needs bytes [{offset}, "
                         f"{offset + w_len + a_len}) but the file has {wf.size}")
    if not payload:
        return None
    codes = _unpack_codes(wf.bytes(offset + header, code_bytes, f"{what} codes"), bits, n * k)
    codes = codes.reshape(n, k)
    alpha = wf.floats(offset + w_len, a_len, f"{what} block parameters").reshape(n, n_blocks, per_block)
    if asym:
        zero, scale = alpha[..., 0], alpha[..., 1]
    else:
        scale = alpha[..., 0]
        zero = np.zeros_like(scale)
    scale = np.ascontiguousarray(scale, dtype=np.float32)
    lo = (zero - np.float32(half) * scale).astype(np.float32)
    block = k // n_blocks
    return QuantizedLinear(codes=codes, scale=scale, lo=lo, bits=bits,
                           block_size=None if n_blocks == 1 else block,
                           bias=bias, symmetric=not asym)


class _Linears(Mapping):
    """name -> the linear's record, read from the weight file on each access (so that a model
    can be repacked one layer at a time); every record was checked when the export was read."""

    def __init__(self, wf: _WeightFile, ops: Dict[str, dict]):
        self._wf, self._ops = wf, ops

    def __getitem__(self, name: str) -> Linear:
        return _read_linear(self._wf, self._ops[name])

    def __iter__(self):
        return iter(self._ops)

    def __len__(self) -> int:
        return len(self._ops)


class _FloatLinear(np.ndarray):
    """A float32 weight array carrying a ``bias`` attribute (fp16 records with a bias)."""

    def __new__(cls, w, bias):
        obj = np.asarray(w, dtype=np.float32).view(cls)
        obj.bias = bias
        return obj

    def __array_finalize__(self, obj):
        self.bias = getattr(obj, "bias", None)


def _hf_linear_name(op_name: str) -> Optional[str]:
    m = _LINEAR_RE.match(op_name)
    if m:
        layer, parent, proj = m.groups()
        if _PROJ_PARENT.get(proj) != parent:
            return None
        return f"model.layers.{layer}.{parent}.{proj}"
    if op_name.startswith("/lm/lm_head/") or op_name == "/lm_head/Linear":
        return "lm_head"
    return None


def _rope_from_graph(graph: dict) -> Optional[np.ndarray]:
    for op in graph["oplists"]:
        if op.get("type") == "Const" and str(op.get("name", "")).startswith("/rotary/"):
            vals = (op.get("main") or {}).get("float32s")
            if vals and len(vals) > 1 and abs(vals[0] - 1.0) < 1e-6:
                return np.asarray(vals, dtype=np.float32)
    return None


def _theta_from_inv_freq(inv_freq: np.ndarray, head_dim: int) -> float:
    # inv_freq[i] = theta ** (-2 i / head_dim); the graph stores 6 decimals, so use i = 1 (the
    # largest below 1.0) and round the result to 4 significant digits.
    theta = float(inv_freq[1]) ** (-head_dim / 2.0)
    digits = 3 - int(np.floor(np.log10(theta)))
    return float(round(theta, digits))


# ----------------------------------------------------------------------------------------------
# Tokenizer


class _Reader:
    def __init__(self, data: bytes, path: Path, pos: int = 0):
        self.data, self.path, self.pos = data, path, pos

    def take(self, n: int, what: str) -> bytes:
        if self.pos + n > len(self.data):
            raise ValueError(f"{self.path}: truncated ({what} at byte {self.pos})")
        b = self.data[self.pos:self.pos + n]
        self.pos += n
        return b

    def u8(self, what="a byte"):
        return self.take(1, what)[0]

    def u16(self, what="a length"):
        return struct.unpack("<H", self.take(2, what))[0]

    def u32(self, what="a count"):
        return struct.unpack("<I", self.take(4, what))[0]

    def str(self, what="a string"):
        return self.take(self.u16(what), what).decode("utf-8", errors="surrogateescape")

    def table(self, what="a normalization table"):
        n = self.u32(what)
        entries = {}
        for _ in range(n):
            cp = self.u32(what)
            entries[cp] = self.take(self.u16(what), what)
        return entries


def _mtok_normalizer(r: _Reader):
    t = r.u8("normalizer type")
    if t == 0:
        return None
    if t == 2:
        return {"type": "Prepend", "prepend": r.str()}
    if t == 3:
        pattern, content = r.str(), r.str()
        return {"type": "Replace", "pattern": {"String": pattern}, "content": content}
    if t == 4:
        return {"type": "Sequence", "normalizers": [_mtok_normalizer(r) for _ in range(r.u32())]}
    if t in (5, 7):
        clean, chinese, strip, lower = r.take(4, "normalizer flags")
        if t == 7:
            r.table()
        if (clean, chinese, strip, lower) == (0, 0, 0, 1):
            return {"type": "Lowercase"}
        if (clean, chinese, strip, lower) == (0, 0, 1, 0):
            return {"type": "Sequence", "normalizers": [{"type": "NFD"}, {"type": "StripAccents"}]}
        return {"type": "BertNormalizer", "clean_text": bool(clean), "handle_chinese_chars": bool(chinese),
                "strip_accents": bool(strip), "lowercase": bool(lower)}
    if t == 6:
        table = r.table()
        # NFKC's table maps U+FB01 (the "fi" ligature); NFC's does not.
        return {"type": "NFKC" if 0xFB01 in table else "NFC"}
    if t == 8:
        left, right = r.take(2, "strip flags")
        return {"type": "Strip", "strip_left": bool(left), "strip_right": bool(right)}
    raise ValueError(f"{r.path}: unknown normalizer type {t} at byte {r.pos - 1}")


_SPLIT_BEHAVIOR = {0: "Isolated", 1: "Removed", 2: "MergedWithPrevious"}


def _mtok_pre_tokenizer(r: _Reader):
    t = r.u8("pre-tokenizer type")
    if t == 0:
        return None
    if t == 1:
        return {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                "use_regex": bool(r.u8())}
    if t == 2:
        return {"type": "Digits", "individual_digits": bool(r.u8())}
    if t == 3:
        rep = r.str()
        return {"type": "Metaspace", "replacement": rep,
                "prepend_scheme": "always" if r.u8() else "never", "split": True}
    if t == 4:
        pattern = r.str()
        invert, behavior = r.take(2, "split flags")
        if behavior not in _SPLIT_BEHAVIOR:
            raise ValueError(f"{r.path}: unknown split behavior {behavior}")
        return {"type": "Split", "pattern": {"Regex": pattern},
                "behavior": _SPLIT_BEHAVIOR[behavior], "invert": bool(invert)}
    if t == 5:
        return {"type": "BertPreTokenizer"}
    if t == 6:
        return {"type": "Sequence", "pretokenizers": [_mtok_pre_tokenizer(r) for _ in range(r.u32())]}
    raise ValueError(f"{r.path}: unknown pre-tokenizer type {t} at byte {r.pos - 1}")


def _mtok_decoder(r: _Reader):
    t = r.u8("decoder type")
    if t == 0:
        return {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    if t == 1:
        return {"type": "ByteFallback"}
    if t == 2:
        rep = r.str()
        return {"type": "Metaspace", "replacement": rep,
                "prepend_scheme": "always" if r.u8() else "never", "split": True}
    if t == 3:
        prefix = r.str()
        return {"type": "WordPiece", "prefix": prefix, "cleanup": bool(r.u8())}
    if t == 4:
        return {"type": "Fuse"}
    if t == 5:
        pattern, content = r.str(), r.str()
        return {"type": "Replace", "pattern": {"String": pattern}, "content": content}
    if t == 6:
        content = r.str()
        start, stop = struct.unpack("<II", r.take(8, "strip decoder"))
        return {"type": "Strip", "content": content, "start": start, "stop": stop}
    if t == 7:
        return {"type": "Sequence", "decoders": [_mtok_decoder(r) for _ in range(r.u32())]}
    raise ValueError(f"{r.path}: unknown decoder type {t} at byte {r.pos - 1}")


def _read_header_lines(data: bytes, path: Path):
    """The text header shared by tokenizer.mtok and tokenizer.txt: magic + type, the counts of
    special / stop / prefix ids, then those ids. Returns (type, special, stop, prefix, pos)."""
    lines, pos = [], 0
    for _ in range(3):
        end = data.find(b"\n", pos)
        if end < 0:
            raise ValueError(f"{path}: truncated header")
        lines.append(data[pos:end].decode("ascii", errors="replace").split())
        pos = end + 1
    try:
        magic, ttype = (int(x) for x in lines[0][:2])
        n_special, n_stop, n_prefix = (int(x) for x in lines[1][:3])
        ids = [int(x) for x in lines[2]]
    except ValueError:
        raise ValueError(f"{path}: malformed header") from None
    if magic != 430:
        raise ValueError(f"{path}: not an MNN tokenizer (magic {magic}, expected 430)")
    if len(ids) != n_special + n_stop + n_prefix:
        raise ValueError(f"{path}: header lists {len(ids)} ids, expected {n_special + n_stop + n_prefix}")
    special = ids[:n_special]
    stop = ids[n_special:n_special + n_stop]
    prefix = ids[n_special + n_stop:]
    return ttype, special, stop, prefix, pos


def _read_mtok(path: Path):
    """tokenizer.mtok (type 4, "pipeline"): a binary form of tokenizer.json. Returns
    (tokenizer.json dict, stop ids, chat template, eos token, bos token)."""
    data = path.read_bytes()
    ttype, special, stop, prefix, pos = _read_header_lines(data, path)
    if ttype != 4:
        raise ValueError(f"{path}: tokenizer type {ttype}, expected 4 (pipeline)")
    r = _Reader(data, path, pos)
    normalizer = _mtok_normalizer(r)
    pre_tokenizer = _mtok_pre_tokenizer(r)
    mtype = r.u8("model type")
    if mtype != 0:
        kinds = {1: "WordPiece", 2: "Unigram"}
        raise ValueError(f"{path}: {kinds.get(mtype, f'type {mtype}')} tokenizer models are not "
                         "supported (BPE only)")
    vocab_size = r.u32("vocabulary size")
    byte_fallback, byte_level = r.take(2, "BPE flags")
    n_merges = r.u32("merge count")
    vocab = {}
    for _ in range(vocab_size):
        tok = r.str("a vocabulary entry")
        vocab[tok] = r.u32("a token id")
    id_to_tok = {i: t for t, i in vocab.items()}
    merges = []
    raw = r.take(12 * n_merges, "the merges")
    triples = np.frombuffer(raw, dtype="<u4").reshape(-1, 3)
    for a, b, rank in sorted(triples.tolist(), key=lambda x: x[2]):
        if a not in id_to_tok or b not in id_to_tok:
            raise ValueError(f"{path}: merge of unknown token ids ({a}, {b})")
        merges.append([id_to_tok[a], id_to_tok[b]])
    decoder = _mtok_decoder(r)
    added = []
    for _ in range(r.u32("added token count")):
        aid = r.u32("an added token id")
        sp, lstrip, rstrip = r.take(3, "added token flags")
        content = r.str("an added token")
        added.append({"id": aid, "content": content, "single_word": False, "lstrip": bool(lstrip),
                      "rstrip": bool(rstrip), "normalized": not sp, "special": bool(sp)})
    template = r.take(r.u32("chat template length"), "chat template").decode("utf-8", errors="replace")
    eos = r.str("eos token")
    r.u8("flags")
    bos = r.str("bos token") if r.pos < len(data) else ""
    if byte_level and not _has_type(pre_tokenizer, "ByteLevel"):
        bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
        pre_tokenizer = bl if pre_tokenizer is None else {"type": "Sequence",
                                                         "pretokenizers": [pre_tokenizer, bl]}
    tj = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": normalizer, "pre_tokenizer": pre_tokenizer,
        "post_processor": _prefix_processor(prefix, id_to_tok),
        "decoder": decoder,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": bool(byte_fallback),
                  "ignore_merges": False, "vocab": vocab, "merges": merges},
    }
    return tj, stop, template or None, eos or None, bos or None


def _has_type(node, name) -> bool:
    if node is None:
        return False
    if node.get("type") == name:
        return True
    return any(_has_type(p, name) for p in node.get("pretokenizers", []))


def _prefix_processor(prefix, id_to_tok):
    if not prefix:
        return None
    names = [id_to_tok.get(i, f"<prefix_{i}>") for i in prefix]
    single = [{"SpecialToken": {"id": n, "type_id": 0}} for n in names] + [{"Sequence": {"id": "A", "type_id": 0}}]
    pair = single + [{"Sequence": {"id": "B", "type_id": 1}}]
    return {"type": "TemplateProcessing", "single": single, "pair": pair,
            "special_tokens": {n: {"id": n, "ids": [i], "tokens": [n]} for n, i in zip(names, prefix)}}


def _read_tokenizer_txt(path: Path):
    """tokenizer.txt of type 3 ("huggingface": vocab lines, then merges lines) -> tokenizer.json
    dict. The other text types (sentencepiece, tiktoken, bert) are refused."""
    data = path.read_bytes()
    ttype, special, stop, prefix, pos = _read_header_lines(data, path)
    names = {0: "sentencepiece", 1: "tiktoken", 2: "bert", 3: "huggingface"}
    if ttype != 3:
        raise ValueError(f"{path}: MNN tokenizer type {ttype} ({names.get(ttype, 'unknown')}) is not "
                         "supported; put the model's tokenizer.json next to the export")
    lines = data[pos:].decode("utf-8", errors="surrogateescape").split("\n")
    try:
        n_vocab, n_merges = (int(x) for x in lines[0].split()[:2])
    except ValueError:
        raise ValueError(f"{path}: malformed vocabulary header") from None
    if len(lines) < 1 + n_vocab + n_merges:
        raise ValueError(f"{path}: truncated: {n_vocab} tokens and {n_merges} merges announced")
    vocab_list = lines[1:1 + n_vocab]
    vocab = {t: i for i, t in enumerate(vocab_list)}
    merges = []
    for line in lines[1 + n_vocab:1 + n_vocab + n_merges]:
        if line.startswith("#version") or not line.strip():
            continue
        parts = line.split(" ")
        if len(parts) != 2:
            raise ValueError(f"{path}: malformed merge line {line!r}")
        merges.append(parts)
    added = [{"id": i, "content": vocab_list[i], "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i in special if 0 <= i < n_vocab]
    bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    tj = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
          "normalizer": None, "pre_tokenizer": bl, "post_processor": _prefix_processor(prefix, dict(enumerate(vocab_list))),
          "decoder": dict(bl),
          "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                    "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                    "ignore_merges": False, "vocab": vocab, "merges": merges}}
    return tj, stop, None, None, None


def read_tokenizer(export_dir, tokenizer_file: Optional[str] = None):
    """The export's tokenizer as ``(tokenizers.Tokenizer, stop ids, chat template, eos, bos)``.

    A ``tokenizer.json`` in the directory is used as is; otherwise ``tokenizer.mtok`` (or the file
    that config.json names) is converted into one."""
    from tokenizers import Tokenizer

    d = Path(export_dir)
    candidates = [tokenizer_file] if tokenizer_file else []
    candidates += ["tokenizer.mtok", "tokenizer.txt"]
    mnn_tok = next((d / c for c in candidates if c and (d / c).is_file()), None)
    stop, template, eos, bos = [], None, None, None
    if mnn_tok is not None:
        reader = _read_mtok if mnn_tok.read_bytes()[:6].split()[1:2] == [b"4"] else _read_tokenizer_txt
        tj, stop, template, eos, bos = reader(mnn_tok)
    if (d / "tokenizer.json").is_file():
        try:
            tok = Tokenizer.from_file(str(d / "tokenizer.json"))
        except Exception as e:
            raise ValueError(f"{d / 'tokenizer.json'}: unreadable: {e}") from None
        cfg = d / "tokenizer_config.json"
        if cfg.is_file():
            tc = _load_json(cfg, "tokenizer settings")
            template = template or tc.get("chat_template")
            eos = eos or _token_str(tc.get("eos_token"))
            bos = bos or _token_str(tc.get("bos_token"))
        if not stop and eos is not None and tok.token_to_id(eos) is not None:
            stop = [tok.token_to_id(eos)]
        return tok, stop, template, eos, bos
    if mnn_tok is None:
        raise ValueError(f"{d}: no tokenizer (tokenizer.mtok, tokenizer.txt or tokenizer.json)")
    try:
        tok = Tokenizer.from_str(json.dumps(tj))
    except Exception as e:
        raise ValueError(f"{mnn_tok}: could not be turned into a tokenizer: {e}") from None
    return tok, stop, template, eos, bos


def _token_str(t):
    if isinstance(t, dict):
        return t.get("content")
    return t or None


# ----------------------------------------------------------------------------------------------
# The export


def read_export(path, tokenizer: bool = True) -> MnnExport:
    """Read an ``llmexport`` output directory (see the module docstring) without dequantizing."""
    d = Path(path)
    if not d.is_dir():
        raise ValueError(f"{d}: not a directory (expected an MNN LLM export)")
    runtime = _load_json(d / "config.json", "runtime settings")
    llm_cfg = _load_json(d / "llm_config.json", "model settings")
    model_type = llm_cfg.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"{d / 'llm_config.json'}: model_type {model_type!r} is not supported "
                         f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})")
    for key in ("hidden_size", "layer_nums"):
        if not isinstance(llm_cfg.get(key), int):
            raise ValueError(f"{d / 'llm_config.json'}: missing {key!r}")
    if llm_cfg.get("is_mrope") or llm_cfg.get("attention_type", "full") != "full":
        raise ValueError(f"{d / 'llm_config.json'}: attention_type={llm_cfg.get('attention_type')!r}, "
                         f"is_mrope={llm_cfg.get('is_mrope')!r}: only full attention with plain RoPE "
                         "is supported")
    for key in ("visual_model", "audio_model", "talker_model"):
        if key in runtime or key in llm_cfg:
            raise ValueError(f"{d}: multimodal exports ({key}) are not supported")
    hidden, n_layers = llm_cfg["hidden_size"], llm_cfg["layer_nums"]
    mnn_path = d / runtime.get("llm_model", "llm.mnn")
    weight_path = d / runtime.get("llm_weight", "llm.mnn.weight")
    graph = read_graph(mnn_path)
    wf = _WeightFile(weight_path)

    linears: Dict[str, Linear] = {}
    norms: Dict[str, np.ndarray] = {}
    loose_norms = []
    eps = set()
    n_attention = 0
    for op in graph["oplists"]:
        t, name = op.get("type"), str(op.get("name", ""))
        if t == "Convolution":
            hf = _hf_linear_name(name)
            if hf is None:
                raise ValueError(f"{mnn_path}: linear op {name!r} does not map to a known layer")
            if hf in linears:
                raise ValueError(f"{mnn_path}: two ops for {hf}")
            _read_linear(wf, op, payload=False)  # checked now, read when used
            linears[hf] = op
        elif t == "LayerNorm":
            main = op.get("main") or {}
            if not main.get("useRMSNorm"):
                raise ValueError(f"{mnn_path}: norm {name!r} is a LayerNorm, not an RMSNorm")
            ext = main.get("external")
            if ext:
                gamma = wf.floats(int(ext[0]), int(ext[1]), f"norm {name} weight").copy()
            elif main.get("gamma"):
                gamma = np.asarray(main["gamma"], dtype=np.float32)
            else:
                raise ValueError(f"{mnn_path}: norm {name!r} has no weight")
            if gamma.shape != (hidden,):
                raise ValueError(f"{weight_path}: norm {name}: {gamma.size} values, expected {hidden}")
            eps.add(float(main.get("epsilon", 1e-6)))
            m = _NORM_RE.match(name)
            if m:
                norms[f"model.layers.{m.group(1)}.{m.group(2)}"] = gamma
            else:
                loose_norms.append((name, gamma))
        elif t == "Attention":
            n_attention += 1
        elif t in ("Extra", "MoE", "LinearAttention"):
            raise ValueError(f"{mnn_path}: op {name!r} of type {t} is not supported")
    if len(loose_norms) != 1:
        raise ValueError(f"{mnn_path}: expected one final norm outside the layers, found "
                         f"{[n for n, _ in loose_norms]}")
    norms["model.norm"] = loose_norms[0][1]
    if n_attention != n_layers:
        raise ValueError(f"{mnn_path}: {n_attention} attention ops for {n_layers} layers")

    missing = [f"model.layers.{i}.{p}.{proj}" for i in range(n_layers)
               for proj, p in _PROJ_PARENT.items() if f"model.layers.{i}.{p}.{proj}" not in linears]
    missing += [f"model.layers.{i}.{n}" for i in range(n_layers)
                for n in ("input_layernorm", "post_attention_layernorm")
                if f"model.layers.{i}.{n}" not in norms]
    if "lm_head" not in linears:
        missing.append("lm_head")
    if missing:
        raise ValueError(f"{mnn_path}: missing from the graph: {', '.join(missing[:8])}"
                         + (" ..." if len(missing) > 8 else ""))
    extra = sorted(set(linears) - {f"model.layers.{i}.{p}.{proj}" for i in range(n_layers)
                                   for proj, p in _PROJ_PARENT.items()} - {"lm_head"})
    if extra:
        raise ValueError(f"{mnn_path}: layers beyond layer_nums={n_layers}: {', '.join(extra[:4])}")

    def shape(name):
        common = (linears[name].get("main") or {}).get("common") or {}
        return int(common.get("outputCount", 0)), int(common.get("inputCount", 0))

    q_n, q_k = shape("model.layers.0.self_attn.q_proj")
    k_n, _ = shape("model.layers.0.self_attn.k_proj")
    inter, _ = shape("model.layers.0.mlp.gate_proj")
    vocab, lm_k = shape("lm_head")
    if q_k != hidden or lm_k != hidden:
        raise ValueError(f"{mnn_path}: linear input sizes {q_k}/{lm_k} differ from hidden_size {hidden}")
    inv_freq = _rope_from_graph(graph)
    if inv_freq is None:
        raise ValueError(f"{mnn_path}: no RoPE frequency constant (/rotary/...) in the graph")
    head_dim = 2 * inv_freq.size
    if q_n % head_dim or k_n % head_dim:
        raise ValueError(f"{mnn_path}: q/k sizes {q_n}/{k_n} are not multiples of head_dim {head_dim}")
    if len(eps) != 1:
        raise ValueError(f"{mnn_path}: norms disagree on epsilon: {sorted(eps)}")
    def has_bias(name):
        ext = ((linears[name].get("main") or {}).get("external")) or [0, 0, 0, 0]
        return int(ext[3]) > 0

    q_bias, o_bias = has_bias("model.layers.0.self_attn.q_proj"), has_bias("model.layers.0.self_attn.o_proj")

    emb_name = runtime.get("embedding_file", "embeddings_bf16.bin")
    emb_path = d / emb_name
    if not emb_path.is_file():
        others = sorted(p.name for p in d.glob("embeddings_*.bin"))
        raise ValueError(f"{emb_path}: missing (the bf16 embedding table)"
                         + (f"; found {', '.join(others)}: only bf16 embeddings are supported" if others else ""))
    expected = vocab * hidden * 2
    if emb_path.stat().st_size != expected:
        raise ValueError(f"{emb_path}: {emb_path.stat().st_size} bytes, expected {expected} "
                         f"(bf16 [{vocab}, {hidden}])")

    config = {
        "model_type": model_type,
        "architectures": ["Qwen2ForCausalLM" if model_type == "qwen2" else "LlamaForCausalLM"],
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": n_layers,
        "num_attention_heads": q_n // head_dim,
        "num_key_value_heads": k_n // head_dim,
        "head_dim": head_dim,
        "rms_norm_eps": eps.pop(),
        "rope_theta": _theta_from_inv_freq(inv_freq, head_dim),
        "vocab_size": vocab,
        "tie_word_embeddings": False,
        # Not recorded in an export; RoPE itself has no limit.
        "max_position_embeddings": int(llm_cfg.get("max_position_embeddings", 32768)),
        "attention_bias": q_bias,
        "attention_output_bias": o_bias,
        "hidden_act": "silu",
    }
    tok = None
    stop, template, eos, bos = [], None, None, None
    if tokenizer:
        tok, stop, template, eos, bos = read_tokenizer(d, runtime.get("tokenizer_file"))
    jinja = llm_cfg.get("jinja") or {}
    template = jinja.get("chat_template") or template
    eos = jinja.get("eos") or eos
    bos = jinja.get("bos") or bos
    if tok is not None and eos is not None:
        eos_id = tok.token_to_id(eos)
        if eos_id is not None and eos_id not in stop:
            stop = list(stop) + [eos_id]
    if tok is not None:
        config["eos_token_id"] = stop[0] if len(stop) == 1 else list(stop)
    return MnnExport(path=d, config=config, linears=_Linears(wf, linears), norms=norms, embedding_path=emb_path,
                     embedding_shape=(vocab, hidden), tokenizer=tok, chat_template=template,
                     stop_token_ids=list(stop), bos_token=bos, eos_token=eos, rope_inv_freq=inv_freq,
                     runtime_config=runtime, llm_config=llm_cfg)


# ----------------------------------------------------------------------------------------------
# Building exports with llmexport


_BOOTSTRAP = r"""
import os, sys, types
import _tools
import MNN
# llmexport converts through `MNN.tools.mnnconvert`; importing the real `MNN.tools` installs
# packages and sends usage logs. Put the compiled converter behind that name instead.
pkg = types.ModuleType("MNN.tools")
pkg.__path__ = []
conv = types.ModuleType("MNN.tools.mnnconvert")
conv.convert = _tools.mnnconvert
def _main():
    _tools.mnnconvert(list(sys.argv))
    return 0
conv.main = _main
pkg.mnnconvert = conv
sys.modules["MNN.tools"] = pkg
sys.modules["MNN.tools.mnnconvert"] = conv
MNN.tools = pkg
script = sys.argv[1]
sys.path.insert(0, os.path.dirname(script))
sys.argv = [script] + sys.argv[2:]
with open(script, encoding="utf-8") as fh:
    code = compile(fh.read(), script, "exec")
exec(code, {"__name__": "__main__", "__file__": script, "__builtins__": __builtins__})
"""


def llmexport_script() -> Path:
    """Path of llmexport's ``llmexport.py`` (the package's console script does not run)."""
    spec = importlib.util.find_spec("llmexport")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("llmexport is not installed: pip install --no-deps llmexport==0.0.5 "
                          "(with transformers>=4.56,<5, onnx, onnxslim, safetensors, sentencepiece, "
                          "yaspin, termcolor)")
    script = Path(list(spec.submodule_search_locations)[0]) / "llmexport.py"
    if not script.is_file():
        raise ImportError(f"llmexport is installed but {script} is missing")
    return script


def export_with_llmexport(hf_dir, out_dir, bits: int = 4, block: int = 64, symmetric: bool = False,
                          keep_onnx: bool = False, timeout: float = 1800) -> Path:
    """Export a Hugging Face checkpoint directory to an MNN LLM export with llmexport.

    ``bits`` 4 or 8 (16: fp16 weights); ``block`` the quantization block (0: per channel; llmexport
    halves it until it divides K). Runs in a subprocess; MNN's converter is reached through its
    compiled module, never through ``MNN.tools``. Returns ``out_dir``."""
    script = llmexport_script()
    if importlib.util.find_spec("_tools") is None:
        raise ImportError("llmexport needs MNN's converter module `_tools` (pip install MNN==3.6.1)")
    hf_dir, out_dir = Path(hf_dir).resolve(), Path(out_dir).resolve()
    if not (hf_dir / "config.json").is_file():
        raise ValueError(f"{hf_dir}: not a Hugging Face checkpoint (no config.json)")
    with tempfile.TemporaryDirectory(prefix="qlinear-llmexport-") as tmp:
        args = [sys.executable, "-c", _BOOTSTRAP, str(script), "--path", str(hf_dir),
                "--export", "mnn", "--dst_path", str(out_dir), "--quant_bit", str(bits),
                "--quant_block", str(block), "--mnnconvert", str(Path(tmp) / "no-such-binary")]
        if symmetric:
            args.append("--sym")
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                   TOKENIZERS_PARALLELISM="false", PYTHONWARNINGS="ignore")
        log = Path(tmp) / "export.log"
        with open(log, "w") as fh:
            proc = subprocess.run(args, cwd=tmp, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                  timeout=timeout)
        text = log.read_text(errors="replace")
    if proc.returncode != 0 or not (out_dir / "llm.mnn").is_file() or not (out_dir / "llm.mnn.weight").is_file():
        tail = "\n".join(text.strip().splitlines()[-15:])
        raise RuntimeError(f"llmexport failed for {hf_dir} (exit {proc.returncode}):\n{tail}")
    if not keep_onnx:
        shutil.rmtree(out_dir / "onnx", ignore_errors=True)
    return out_dir
