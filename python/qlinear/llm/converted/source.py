"""Source: a directory written by ``llm.convert`` (``model.qlinear`` + tokenizer files), opened
memory-mapped, its weights used as they were quantized."""

from __future__ import annotations

from pathlib import Path

from ..._format import array_location, load_weights
from ..config import ModelConfig
from ..flash import layout as flash_layout
from ..runtime.embedding import EmbeddingFile
from ..options import Options
from ..source import Source, select_rows, slim_rows, stop_ids
from ..runtime.tokenizer import Tokenizer

KIND = FORMAT_NAME = "qlinear-llm"
FORMAT_VERSION = 1
MODEL_FILE = "model.qlinear"
EMBEDDING = "embed"
PER_LAYER_EMBEDDING = "per_layer_embed"  # Gemma 4's [vocab, layers x P] table


def is_converted(d: Path) -> bool:
    return (d / MODEL_FILE).is_file()


def read(d: Path, opts: Options, verify: bool = True) -> Source:
    """The converted model; of ``opts`` only ``slim_vocab`` applies (the rest was fixed at
    conversion). A file in the flash layout has its FFN bundles put back into packed weights
    (``memory="flash"`` reads them itself: ``flash``)."""
    path = d / MODEL_FILE
    tensors, meta = load_weights(path, mmap_mode=True, verify=verify)
    if meta.get("format") != FORMAT_NAME or meta.get("version") != FORMAT_VERSION:
        raise ValueError(f"{path}: not a {FORMAT_NAME} v{FORMAT_VERSION} model file "
                         f"(format {meta.get('format')!r}, version {meta.get('version')!r})")
    cfg = ModelConfig.from_dict(meta.get("config") or {}, str(path))
    if flash_layout.FLASH_META in meta and opts.memory != "flash":
        flash_layout.unbundle_file_tensors(tensors, meta[flash_layout.FLASH_META], cfg.num_layers, str(path))
    q = meta.get("quantization") or {}
    tokenizer = Tokenizer.from_dir(d, extra_stop_ids=stop_ids(cfg.eos_token_id))
    rows = slim_rows(opts.slim_vocab, cfg, tokenizer)
    if rows is not None:
        if "lm_rows" in tensors:
            raise ValueError(f"{path}: the vocabulary was slimmed at conversion already")
        tensors["lm_head"], tensors["lm_rows"] = select_rows(tensors["lm_head"], rows), rows
    embed = tensors.pop(EMBEDDING, None)
    if embed is None or tuple(embed.shape) != (cfg.vocab_size, cfg.hidden_size):
        raise ValueError(f"{path}: embedding table missing or of the wrong shape")
    offset, dtype, _ = array_location(path, EMBEDDING)
    embedding = EmbeddingFile(str(path), offset, cfg.vocab_size, cfg.hidden_size, dtype)
    per_layer, width = tensors.pop(PER_LAYER_EMBEDDING, None), cfg.num_layers * cfg.per_layer_input_size
    if per_layer is not None or width:
        if per_layer is None or tuple(per_layer.shape) != (cfg.per_layer_vocab_size, width):
            raise ValueError(f"{path}: per-layer embedding table missing or of the wrong shape")
        offset, dtype, _ = array_location(path, PER_LAYER_EMBEDDING)
        per_layer = EmbeddingFile(str(path), offset, cfg.per_layer_vocab_size, width, dtype)
    quantization = {"bits": q.get("bits"), "group_size": q.get("group_size"),
                    "symmetric": bool(q.get("symmetric"))}
    # how the weights were rounded ("rtn" / "gptq"; the calibration; SmoothQuant's alpha), for model.info
    info = {k: q[k] for k in ("method", "calibration", "gptq", "smooth") if k in q}
    return Source(KIND, d, cfg, tokenizer, embedding, tensors, quantization, info, per_layer_embedding=per_layer)
