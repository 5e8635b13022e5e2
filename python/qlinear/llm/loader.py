"""Loading a model: a Hugging Face checkpoint (quantized at load), a model converted to
qlinear's own file (opened without re-quantizing, memory-mapped), or an MNN LLM export.

Every source is turned into the same set of named tensors (``layers.{i}.qkv`` fused q/k/v
projection, ``layers.{i}.gate_up`` fused gate/up projection, ...) and then assembled by
``build_model``."""

from __future__ import annotations

import ctypes
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Sequence, Union

import numpy as np

from .. import _core, set_num_threads
from .._format import BFloat16Array, array_location, load_weights, save_weights
from .._packed import PackedWeight, pack_quantized, pack_weight
from .._scheme import DEFAULT_ACT_BLOCK, ActBlock
from .config import ModelConfig
from .embedding import DiskEmbedding, MemoryEmbedding
from .layers import Attention, Block, Linear, Rope
from .model import Model
from .safetensors_file import Checkpoint, to_float32
from .tokenizer import Tokenizer

MODEL_FILE = "model.qlinear"
FORMAT_NAME, FORMAT_VERSION = "qlinear-llm", 1
_SAFETENSORS_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}


@dataclass(frozen=True)
class Options:
    bits: Optional[int] = 4            # 4 / 8: quantized weights; None: weights kept in float32
    group_size: Optional[int] = 64     # None: one scale per output row
    symmetric: bool = False
    act: str = "int8"                  # "int8": W4A8 / W8A8 kernels; "float": low-memory float path
    act_block: ActBlock = DEFAULT_ACT_BLOCK  # activation scales, as qlinear.matmul's act_block
    memory: str = "low"                # "normal" with act="float": dequantize weights at load
    disk_embedding: bool = True
    slim_vocab: Union[bool, Sequence[int]] = False

    def check(self):
        if self.bits not in (None, 4, 8):
            raise ValueError(f"bits must be 4, 8 or None, got {self.bits!r}")
        if self.act not in ("int8", "float"):
            raise ValueError(f"act must be 'int8' or 'float', got {self.act!r}")
        if self.memory not in ("low", "normal"):
            raise ValueError(f"memory must be 'low' or 'normal', got {self.memory!r}")
        if self.bits is None and self.act == "int8":
            raise ValueError("act='int8' needs quantized weights (bits=4 or 8); use act='float' with bits=None")


def load(path, bits: Optional[int] = 4, group_size: Optional[int] = 64, act: str = "int8",
         memory: str = "low", disk_embedding: bool = True, threads: Optional[int] = None,
         max_context: int = 4096, slim_vocab: Union[bool, Sequence[int]] = False,
         act_block: ActBlock = DEFAULT_ACT_BLOCK, symmetric: bool = False, progress: bool = True) -> Model:
    """Open a model directory: a Hugging Face checkpoint (``config.json``, ``*.safetensors``,
    ``tokenizer.json``; quantized here to ``bits`` with ``group_size``), a directory written by
    ``convert`` (its own quantization is used; ``bits``/``group_size`` are ignored), or an MNN
    LLM export (``llm.mnn``, ``llm.mnn.weight``, ...).

    act: "int8" (dynamic int8 activations: W4A8 / W8A8) or "float" (weights dequantized in the
    kernel). memory: "low" keeps weights quantized; "normal" with act="float" dequantizes them to
    float32 at load (faster prefill, 8x the memory of int4). disk_embedding: read embedding rows
    from the file instead of holding the table. slim_vocab: True keeps only the tokenizer's ids in
    the lm head (or pass the ids to keep). act_block: as ``qlinear.matmul``'s ("group": one
    activation scale per row and weight group; None: one per row; an int: per that many k). threads: kernel threads (default: physical cores).
    """
    t0 = time.perf_counter()
    if threads is not None:
        set_num_threads(threads)
    opts = Options(bits, group_size, symmetric, act, act_block, memory, disk_embedding, slim_vocab)
    opts.check()
    d = Path(path)
    if not d.is_dir():
        raise ValueError(f"{d}: not a model directory")
    if (d / MODEL_FILE).is_file():
        model = _load_converted(d, opts, max_context)
    elif (d / "llm.mnn").is_file() or (d / "llm_config.json").is_file():
        from .mnn_export import read_export  # noqa: PLC0415
        model = _load_mnn(d, read_export(d), opts, max_context, progress)
    elif (d / "config.json").is_file():
        model = _load_hf(d, opts, max_context, progress)
    else:
        raise ValueError(f"{d}: no {MODEL_FILE} (converted model), llm.mnn (MNN export) or config.json "
                         "(Hugging Face checkpoint)")
    model.stats.load_s = time.perf_counter() - t0
    return model


# -- Hugging Face checkpoints ----------------------------------------------------------------
def _hf_tensors(ckpt: Checkpoint, cfg: ModelConfig, opts: Options, rows: Optional[np.ndarray], progress: bool):
    """Our named tensors from a HF checkpoint: fused projections, quantized per ``opts``."""
    def f32(name):
        return ckpt.float32(name)

    def maybe(name):
        return f32(name) if name in ckpt else None

    def quantize(w):
        if opts.bits is None:
            return w
        return pack_weight(w, bits=opts.bits, group_size=opts.group_size, symmetric=opts.symmetric)

    out = {}
    bar = _progress(cfg.num_layers + 1, "quantizing" if opts.bits else "loading", progress)
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        a, m = p + "self_attn.", p + "mlp."
        out[f"layers.{i}.input_norm"] = f32(p + "input_layernorm.weight")
        out[f"layers.{i}.post_norm"] = f32(p + "post_attention_layernorm.weight")
        out[f"layers.{i}.qkv"] = quantize(np.concatenate([f32(a + n + "_proj.weight") for n in "qkv"]))
        biases = [maybe(a + n + "_proj.bias") for n in "qkv"]
        if any(b is not None for b in biases):
            if any(b is None for b in biases):
                raise ValueError(f"{ckpt.directory}: layer {i} has biases on some of q/k/v only")
            out[f"layers.{i}.qkv.bias"] = np.concatenate(biases)
        out[f"layers.{i}.o"] = quantize(f32(a + "o_proj.weight"))
        out[f"layers.{i}.gate_up"] = quantize(np.concatenate([f32(m + "gate_proj.weight"), f32(m + "up_proj.weight")]))
        out[f"layers.{i}.down"] = quantize(f32(m + "down_proj.weight"))
        for src, dst in ((a + "o_proj.bias", "o"), (m + "down_proj.bias", "down")):
            if src in ckpt:
                out[f"layers.{i}.{dst}.bias"] = f32(src)
        if (m + "gate_proj.bias") in ckpt:
            out[f"layers.{i}.gate_up.bias"] = np.concatenate([f32(m + "gate_proj.bias"), f32(m + "up_proj.bias")])
        _trim_heap()
        bar.update(1)
    out["norm"] = f32("model.norm.weight")
    head = "model.embed_tokens.weight" if cfg.tie_word_embeddings or "lm_head.weight" not in ckpt else "lm_head.weight"
    if rows is None:
        w = f32(head)
    else:  # only the kept rows are widened
        raw, dtype = ckpt.raw(head)
        w = to_float32(raw[rows], dtype)
    out["lm_head"] = quantize(w)
    if rows is not None:
        out["lm_rows"] = rows
    bar.update(1)
    bar.close()
    return out


def _load_hf(d: Path, opts: Options, max_context: int, progress: bool) -> Model:
    cfg = _read_hf_config(d)
    tokenizer = Tokenizer.from_dir(d, extra_stop_ids=_ids(cfg.eos_token_id))
    ckpt = Checkpoint(d)
    tensors = _hf_tensors(ckpt, cfg, opts, _slim_rows(opts.slim_vocab, cfg, tokenizer), progress)
    name = "model.embed_tokens.weight"
    st = ckpt.file(name)
    offset, dtype, shape = st.location(name)
    if dtype not in _SAFETENSORS_DTYPES or tuple(shape) != (cfg.vocab_size, cfg.hidden_size):
        raise ValueError(f"{d}: embedding is {dtype} {shape}, expected float [{cfg.vocab_size}, {cfg.hidden_size}]")
    if opts.disk_embedding:
        embedding = DiskEmbedding(st.path, offset, cfg.vocab_size, cfg.hidden_size, _SAFETENSORS_DTYPES[dtype])
    else:
        embedding = MemoryEmbedding(ckpt.float32(name))
    return build_model(cfg, tokenizer, embedding, tensors, opts, max_context,
                       info={"source": "huggingface", "path": str(d)})


def _read_hf_config(d: Path) -> ModelConfig:
    try:
        hf = json.loads((d / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{d / 'config.json'}: cannot read ({e})") from None
    return ModelConfig.from_hf(hf, str(d / "config.json"))


def _slim_rows(slim, cfg: ModelConfig, tokenizer: Tokenizer) -> Optional[np.ndarray]:
    """Vocabulary slimming: the lm head rows to keep (None: all). True keeps the ids the
    tokenizer can produce, when the model's vocabulary is larger."""
    if slim is False or slim is None:
        return None
    if slim is True:
        n = tokenizer.vocab_size
        return np.arange(n, dtype=np.int32) if n < cfg.vocab_size else None
    rows = np.unique(np.asarray(list(slim), dtype=np.int64))
    if rows.size == 0 or rows[0] < 0 or rows[-1] >= cfg.vocab_size:
        raise ValueError(f"slim_vocab ids must lie in [0, {cfg.vocab_size})")
    return rows.astype(np.int32)


def _select_rows(w, rows: np.ndarray):
    """Rows of a weight (packed: codes moved, not re-rounded)."""
    if not isinstance(w, PackedWeight):
        return np.asarray(w, np.float32)[rows]
    codes, scale, offset = w.unpack()
    return pack_quantized(codes[rows], scale[rows], None if offset is None else offset[rows],
                          w.bits, None if w.per_channel else w.group_size, w.symmetric)


def _ids(x) -> list[int]:
    if x is None:
        return []
    return [int(i) for i in (x if isinstance(x, (list, tuple)) else [x])]


def _trim_heap() -> None:
    """Give freed memory back to the OS (glibc): loading makes a layer's transient arrays, and
    glibc keeps freed heap memory by default (its mmap threshold grows after the first large
    free), so without this the peak RSS of a load grows by the sum of the leftovers."""
    global _malloc_trim
    if _malloc_trim is None:
        try:
            _malloc_trim = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _malloc_trim = False
    if _malloc_trim:
        _malloc_trim(0)


_malloc_trim = None


def _progress(total: int, desc: str, enabled: bool):
    try:
        from tqdm.auto import tqdm  # noqa: PLC0415
    except ImportError:
        enabled = False
    if not enabled:
        class _Quiet:
            def update(self, n=1):
                pass

            def close(self):
                pass
        return _Quiet()
    return tqdm(total=total, desc=desc, unit="layer", leave=False)


# -- assembling ---------------------------------------------------------------------------------
def build_model(cfg: ModelConfig, tokenizer: Tokenizer, embedding, tensors: dict, opts: Options,
                max_context: int, info: dict, rope_inv_freq: Optional[np.ndarray] = None) -> Model:
    """A Model from our named tensors (PackedWeight or float32 arrays)."""
    if isinstance(max_context, bool) or not isinstance(max_context, int) or max_context < 1:
        raise ValueError(f"max_context must be a positive int, got {max_context!r}")
    max_context = min(max_context, cfg.max_position_embeddings)

    def need(name):
        if name not in tensors:
            raise ValueError(f"model has no tensor {name!r}")
        return tensors[name]

    def linear(name, shape):
        w = need(name)
        if tuple(w.shape) != shape:
            raise ValueError(f"tensor {name!r} has shape {tuple(w.shape)}, expected {shape}")
        if isinstance(w, PackedWeight) and opts.memory == "normal" and opts.act == "float":
            w = w.dequantize()
        bias = tensors.get(name + ".bias")
        if bias is not None:
            bias = np.asarray(bias, np.float32)
            if bias.shape != (shape[0],):
                raise ValueError(f"tensor {name + '.bias'!r} has shape {bias.shape}, expected ({shape[0]},)")
        if not isinstance(w, PackedWeight):
            return Linear(np.asarray(w, np.float32), bias, act="float")
        return Linear(w, bias, act=opts.act, act_block=opts.act_block)

    def vector(name, n):
        v = np.array(need(name), dtype=np.float32)
        if v.shape != (n,):
            raise ValueError(f"tensor {name!r} has shape {v.shape}, expected ({n},)")
        return v

    H, I = cfg.hidden_size, cfg.intermediate_size
    rope = Rope(cfg, max_context, rope_inv_freq)
    blocks = []
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        attn = Attention(cfg, i, linear(p + "qkv", (cfg.q_size + 2 * cfg.kv_size, H)),
                         linear(p + "o", (H, cfg.q_size)), rope)
        blocks.append(Block(cfg, attn, linear(p + "gate_up", (2 * I, H)), linear(p + "down", (H, I)),
                            vector(p + "input_norm", H), vector(p + "post_norm", H)))
    rows = tensors.get("lm_rows")
    rows = None if rows is None else np.asarray(rows, np.int64)
    lm_head = linear("lm_head", (cfg.vocab_size if rows is None else len(rows), H))
    info = {**info, "bits": opts.bits, "group_size": opts.group_size, "act": opts.act,
            "memory": opts.memory, "disk_embedding": isinstance(embedding, DiskEmbedding),
            "threads": _core.get_num_threads()}
    return Model(cfg, tokenizer, embedding, blocks, vector("norm", H), lm_head, rows, max_context, info)


# -- qlinear's own model files --------------------------------------------------------------------
def convert(src, out_dir, bits: Optional[int] = 4, group_size: Optional[int] = 64, symmetric: bool = False,
            slim_vocab: Union[bool, Sequence[int]] = False, progress: bool = True) -> Path:
    """Quantize a Hugging Face checkpoint once and write OUT_DIR: ``model.qlinear`` (packed
    weights, norms, biases and the embedding table in the checkpoint's dtype, one checked,
    mmap-able file; its metadata holds the model config), plus the tokenizer files."""
    src, out = Path(src), Path(out_dir)
    if (src / MODEL_FILE).is_file():
        raise ValueError(f"{src} is already converted")
    opts = Options(bits, group_size, symmetric, act="float" if bits is None else "int8", slim_vocab=slim_vocab)
    opts.check()
    cfg = _read_hf_config(src)
    tokenizer = Tokenizer.from_dir(src)
    ckpt = Checkpoint(src)
    tensors = _hf_tensors(ckpt, cfg, opts, _slim_rows(slim_vocab, cfg, tokenizer), progress)
    raw, dtype = ckpt.raw("model.embed_tokens.weight")
    tensors["embed"] = BFloat16Array(raw) if dtype == "BF16" else np.asarray(raw)
    if "lm_rows" in tensors:
        tensors["lm_rows"] = np.asarray(tensors["lm_rows"], np.int32)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"format": FORMAT_NAME, "version": FORMAT_VERSION, "config": cfg.to_dict(),
            "quantization": {"bits": bits, "group_size": group_size, "symmetric": symmetric}}
    save_weights(out / MODEL_FILE, tensors, meta)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (src / name).is_file():
            (out / name).write_bytes((src / name).read_bytes())
    return out


def _load_converted(d: Path, opts: Options, max_context: int) -> Model:
    path = d / MODEL_FILE
    tensors, meta = load_weights(path, mmap_mode=True, verify=True)
    if meta.get("format") != FORMAT_NAME or meta.get("version") != FORMAT_VERSION:
        raise ValueError(f"{path}: not a {FORMAT_NAME} v{FORMAT_VERSION} model file "
                         f"(format {meta.get('format')!r}, version {meta.get('version')!r})")
    cfg = ModelConfig.from_dict(meta.get("config") or {}, str(path))
    q = meta.get("quantization") or {}
    slim = opts.slim_vocab
    opts = Options(q.get("bits"), q.get("group_size"), bool(q.get("symmetric")),
                   "float" if q.get("bits") is None else opts.act, opts.act_block, opts.memory,
                   opts.disk_embedding)
    tokenizer = Tokenizer.from_dir(d, extra_stop_ids=_ids(cfg.eos_token_id))
    rows = _slim_rows(slim, cfg, tokenizer)
    if rows is not None:
        if "lm_rows" in tensors:
            raise ValueError(f"{path}: the vocabulary was slimmed at conversion already")
        tensors["lm_head"], tensors["lm_rows"] = _select_rows(tensors["lm_head"], rows), rows
    embed = tensors.pop("embed", None)
    if embed is None or tuple(embed.shape) != (cfg.vocab_size, cfg.hidden_size):
        raise ValueError(f"{path}: embedding table missing or of the wrong shape")
    if opts.disk_embedding:
        offset, dtype, _ = array_location(path, "embed")
        embedding = DiskEmbedding(path, offset, cfg.vocab_size, cfg.hidden_size, dtype)
    else:
        table = embed.to_float32() if isinstance(embed, BFloat16Array) else np.asarray(embed, np.float32)
        embedding = MemoryEmbedding(table)
    del embed
    return build_model(cfg, tokenizer, embedding, tensors, opts, max_context,
                       info={"source": FORMAT_NAME, "path": str(d)})


# -- MNN exports ----------------------------------------------------------------------------------
_SUPPORTED_BLOCKS = (32, 64, 128, 256)


def _mnn_weight(parts: list, what: str, fallbacks: list):
    """One PackedWeight from MNN weight records stacked along N (q/k/v, gate/up), their codes
    moved as they are: MNN's w = lo + scale * code (fp32 lo / scale per block) is our asymmetric
    scheme with fp16 scale / offset. A block size our layouts lack (llmexport halves the block
    until it divides K, e.g. 16) or a scale outside fp16 keeps the layer in float32: MNN's
    dequantized weights exactly."""
    from .mnn_export import QuantizedLinear  # noqa: PLC0415

    if all(isinstance(p, QuantizedLinear) for p in parts):
        bits, block = parts[0].bits, parts[0].block_size
        if all(p.bits == bits and p.block_size == block for p in parts) and block in (None, *_SUPPORTED_BLOCKS):
            scale = np.concatenate([p.scale for p in parts]).astype(np.float16)
            lo = np.concatenate([p.lo for p in parts]).astype(np.float16)
            if np.isfinite(scale).all() and np.isfinite(lo).all():
                codes = np.concatenate([p.codes for p in parts])
                return pack_quantized(codes, scale, lo, bits, block, symmetric=False)
    fallbacks.append(what)
    return np.concatenate([p.dequantize() if isinstance(p, QuantizedLinear) else np.asarray(p, np.float32)
                           for p in parts])


def _load_mnn(d: Path, export, opts: Options, max_context: int, progress: bool) -> Model:
    """An llmexport directory: its int4 / int8 records repacked (no re-rounding), its bf16
    embedding file as the disk embedding, its tokenizer turned into a ``tokenizers`` one."""
    cfg = ModelConfig.from_hf(export.config, str(d / "llm_config.json"))
    lin, fallbacks, tensors = export.linears, [], {}

    def bias(recs):
        bs = [getattr(r, "bias", None) for r in recs]
        if all(b is None for b in bs):
            return None
        return np.concatenate([np.zeros(r.shape[0], np.float32) if b is None else b for r, b in zip(recs, bs)])

    bar = _progress(cfg.num_layers + 1, "repacking", progress)
    for i in range(cfg.num_layers):
        a, m = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        groups = {"qkv": [a + "q_proj", a + "k_proj", a + "v_proj"], "o": [a + "o_proj"],
                  "gate_up": [m + "gate_proj", m + "up_proj"], "down": [m + "down_proj"]}
        for ours, names in groups.items():
            recs = [lin[n] for n in names]  # read from the file now, dropped once packed
            tensors[f"layers.{i}.{ours}"] = _mnn_weight(recs, f"layers.{i}.{ours}", fallbacks)
            b = bias(recs)
            if b is not None:
                tensors[f"layers.{i}.{ours}.bias"] = b
        tensors[f"layers.{i}.input_norm"] = export.norms[f"model.layers.{i}.input_layernorm"]
        tensors[f"layers.{i}.post_norm"] = export.norms[f"model.layers.{i}.post_attention_layernorm"]
        _trim_heap()
        bar.update(1)
    tensors["norm"] = export.norms["model.norm"]
    head = lin["lm_head"]
    tensors["lm_head"] = _mnn_weight([head], "lm_head", fallbacks)
    if getattr(head, "bias", None) is not None:
        tensors["lm_head.bias"] = head.bias
    bar.close()
    if opts.slim_vocab not in (False, None):
        raise ValueError("slim_vocab is not supported for MNN exports")
    tokenizer = Tokenizer(export.tokenizer, chat_template=export.chat_template, bos_token=export.bos_token)
    tokenizer.stop_ids |= set(export.stop_token_ids)
    vocab, hidden = export.embedding_shape
    if opts.disk_embedding:
        embedding = DiskEmbedding(export.embedding_path, 0, vocab, hidden, "bfloat16")
    else:
        embedding = MemoryEmbedding(export.embed(np.arange(vocab)))
    bits = {w.bits for w in tensors.values() if isinstance(w, PackedWeight)}
    opts = Options(bits.pop() if len(bits) == 1 else None, None, False, opts.act, opts.act_block,
                   opts.memory, opts.disk_embedding)
    return build_model(cfg, tokenizer, embedding, tensors, opts, max_context,
                       info={"source": "mnn", "path": str(d), "float_layers": fallbacks},
                       rope_inv_freq=export.rope_inv_freq)
