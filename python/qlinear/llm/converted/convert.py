"""``llm.convert``: quantize a Hugging Face checkpoint once into qlinear's own model file, which
``llm.load`` then maps without re-quantizing (``converted.source``)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np

from ..._format import BFloat16Array, load_weights, save_weights
from . import source as converted_source, gptq
from ..flash import layout as flash_layout
from ..gguf import source as gguf_source
from ..hf import source as hf_source
from ..config import ModelConfig
from ..options import Options
from ..runtime.tokenizer import Tokenizer
from ..source import progress as progress_bar
from .smooth import smooth_checkpoint

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def check_out_dir(out: Path, force: bool) -> None:
    """Refuse an output directory that exists and is not empty, unless ``force`` (then the files
    written replace those of the same name; nothing else is removed)."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise ValueError(f"{out} exists and is not empty (force=True / --force overwrites it)")


def convert(src, out_dir, bits: Optional[int] = 4, group_size: Optional[int] = 64, symmetric: bool = False,
            slim_vocab: Union[bool, Sequence[int]] = False, progress: bool = True,
            force: bool = False, flash: bool = False, method: str = "rtn",
            calibration: Optional[gptq.Calibration] = None, damp: float = gptq.DAMP, act_order: bool = False,
            calibration_tokens: int = gptq.CALIBRATION_TOKENS, smooth: Optional[float] = None) -> Path:
    """Quantize a Hugging Face checkpoint (or a GGUF file: its Q4_0 / Q8_0 / Q4_K codes kept, the
    rest quantized to ``bits``) once and write OUT_DIR: ``model.qlinear`` (packed
    weights, norms, biases and the embedding table in the checkpoint's dtype, one checked,
    mmap-able file; its metadata holds the model config), plus the tokenizer files. An existing
    non-empty OUT_DIR is refused unless ``force``. ``flash``: store each layer's FFN as neuron
    bundles (``flash.layout``), for ``load(..., memory="flash")`` to read only what it needs; SRC
    may then be a converted model (its file re-laid out, nothing re-quantized).

    method: "rtn" rounds every weight to nearest; "gptq" rounds with GPTQ's error feedback against
    ``calibration`` (a UTF-8 text file's path, or token ids), block by block, each block's inputs
    computed by the blocks already quantized, the lm head included (``converted.gptq``): ``damp`` (the
    fraction of the Hessian's mean diagonal added to it), ``act_order`` (columns by decreasing
    input energy), ``calibration_tokens`` (at most this many, in sequences of 512). The method and
    the calibration's facts go into the file's metadata (``model.info`` shows them).

    smooth: SmoothQuant's alpha (0..1): activation outliers moved into the weights by scales
    folded into the float model first (``converted.smooth``; calibration= gives the activations),
    then rounded by ``method``."""
    src, out = Path(src), Path(out_dir)
    if converted_source.is_converted(src) and not flash:
        raise ValueError(f"{src} is already converted")
    if out.resolve() == src.resolve():
        raise ValueError(f"{out}: the output directory must differ from the checkpoint's")
    opts = Options(bits, group_size, symmetric, act="float" if bits is None else "int8",
                   slim_vocab=slim_vocab).check()
    if method not in gptq.METHODS:
        raise ValueError(f"method must be one of {', '.join(gptq.METHODS)}, got {method!r}")
    needs_calibration = method == "gptq" or smooth is not None
    if (calibration is None) == needs_calibration:
        what = "method='gptq'" if method == "gptq" else "smooth="
        raise ValueError(f"{what} needs calibration= (a text file or token ids)" if needs_calibration
                         else "calibration applies to method='gptq' or smooth= only")
    check_out_dir(out, force)
    if converted_source.is_converted(src):
        if method != "rtn":
            raise ValueError(f"{src} is converted already: method='gptq' needs the Hugging Face checkpoint")
        return _relayout_flash(src, out)
    gguf = gguf_source.is_gguf(src)
    if gguf and method == "gptq":
        raise ValueError(f"{src}: method='gptq' needs a Hugging Face checkpoint (a GGUF file's codes are kept)")
    if smooth is not None:
        if gguf:
            raise ValueError(f"{src}: smooth= needs a Hugging Face checkpoint (a GGUF file's codes are kept)")
        with tempfile.TemporaryDirectory(prefix="qlinear-smooth-") as tmp:
            calib = gptq.calibration_set(calibration, Tokenizer.from_dir(src), hf_source.read_config(src).vocab_size,
                                         calibration_tokens)
            smoothed = smooth_checkpoint(src, Path(tmp) / "smoothed", np.concatenate(calib.sequences), smooth)
            out_dir = convert(smoothed, out, bits, group_size, symmetric, slim_vocab, progress, True, flash, method,
                              calibration if method == "gptq" else None, damp, act_order, calibration_tokens)
        _note_smoothing(out, smooth, calib)
        return out_dir
    if gguf:
        source = gguf_source.read(src, opts, progress)
    elif method == "gptq":
        source = gptq.read(src, opts, calibration, damp, act_order, calibration_tokens, progress, bar_leave=True)
    else:
        source = hf_source.read(src, opts, progress, bar_leave=True)
    tensors = source.tensors
    for name, table in ((converted_source.EMBEDDING, source.embedding),
                        (converted_source.PER_LAYER_EMBEDDING, source.per_layer_embedding)):
        if table is not None:  # (Gemma 4's per-layer table beside the embedding, read on disk alike)
            raw = table.raw()
            tensors[name] = BFloat16Array(raw) if table.dtype == "bfloat16" else np.asarray(raw)
    if "lm_rows" in tensors:
        tensors["lm_rows"] = np.asarray(tensors["lm_rows"], np.int32)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"format": converted_source.FORMAT_NAME, "version": converted_source.FORMAT_VERSION,
            "config": source.config.to_dict(),
            "quantization": source.quantization}
    if flash:
        if source.config.has_state:
            raise ValueError(f"{src}: flash=True (FFNs read from disk) is not supported for hybrid models with "
                             f"recurrent layers ({source.config.arch}); convert without it")
        tensors, meta[flash_layout.FLASH_META] = flash_layout.bundle_file_tensors(tensors, source.config.num_layers)
    else:
        tensors = flash_layout.ffn_last(tensors, source.config.num_layers)
    bar = progress_bar(1, f"writing {out / converted_source.MODEL_FILE}", progress, unit="file", leave=True)
    save_weights(out / converted_source.MODEL_FILE, tensors, meta)
    bar.update(1)
    bar.close()
    if gguf:
        gguf_source.write_tokenizer(source.tokenizer, out)
    for name in () if gguf else TOKENIZER_FILES:
        if (src / name).is_file():
            (out / name).write_bytes((src / name).read_bytes())
    return out


def _note_smoothing(out: Path, alpha: float, calib) -> None:
    """Record the smoothing in the converted file's metadata (rewritten: the tensors are mapped)."""
    tensors, meta = load_weights(out / converted_source.MODEL_FILE, mmap_mode=True, verify=True)
    meta["quantization"] = {**meta["quantization"], "smooth": {"alpha": alpha, **calib.facts()}}
    tmp = out / (converted_source.MODEL_FILE + ".tmp")
    save_weights(tmp, tensors, meta)
    del tensors
    os.replace(tmp, out / converted_source.MODEL_FILE)


def _relayout_flash(src: Path, out: Path) -> Path:
    """A converted model's file rewritten in the flash layout (the same packed bytes, moved)."""
    tensors, meta = load_weights(src / converted_source.MODEL_FILE, mmap_mode=True, verify=True)
    if flash_layout.FLASH_META in meta:
        raise ValueError(f"{src} is in the flash layout already")
    cfg = ModelConfig.from_dict(meta.get("config") or {}, str(src))
    tensors, meta[flash_layout.FLASH_META] = flash_layout.bundle_file_tensors(tensors, cfg.num_layers)
    out.mkdir(parents=True, exist_ok=True)
    save_weights(out / converted_source.MODEL_FILE, tensors, meta)
    for f in src.iterdir():
        if f.is_file() and f.name != converted_source.MODEL_FILE:
            (out / f.name).write_bytes(f.read_bytes())
    return out
