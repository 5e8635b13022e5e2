"""``llm.load``: open a model directory of any source and assemble the model.

Sources (each a ``source`` module of its format's package, returning a ``source.Source``): a GGUF
file (``gguf``), a directory written by ``llm.convert`` (``converted``), an MNN LLM export
(``mnn``), a Hugging Face checkpoint (``hf``). A new format is one more package and one more line
in ``_SOURCES``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional, Sequence, Union

from .. import set_num_threads
from .._scheme import DEFAULT_ACT_BLOCK, ActBlock
from .converted import source as converted_source
from .gguf import source as gguf_source
from .hf import source as hf_source
from .mnn import source as mnn_source
from . import weight_region
from .assemble import build_model
from .runtime.model import Model
from .options import Options

# (is this directory of that source?, read it); the first that matches is used.
_SOURCES = (
    (gguf_source.is_gguf, gguf_source.read),
    (converted_source.is_converted, lambda d, opts, bar: converted_source.read(d, opts)),
    (mnn_source.is_export, mnn_source.read),
    (hf_source.is_checkpoint, hf_source.read),
)


def load(path, bits: Optional[int] = 4, group_size: Optional[int] = 64, act: str = "int8",
         memory: str = "low", disk_embedding: bool = True, threads: Optional[int] = None,
         max_context: int = 4096, slim_vocab: Union[bool, Sequence[int]] = False,
         act_block: ActBlock = DEFAULT_ACT_BLOCK, symmetric: bool = False, progress: bool = True,
         memory_budget_mb: Optional[float] = None, predictor=None, window: int = 5,
         reader_threads: Optional[int] = None, kv_cache: str = "float32") -> Model:
    """Open a model: a GGUF file (Qwen2 / Llama / ...; Q4_0 / Q8_0 and the block formats' codes,
    Q2_K .. Q6_K, IQ4, MXFP4, used as they are, other types quantized here to ``bits``), a Hugging Face checkpoint directory (``config.json``, ``*.safetensors``,
    ``tokenizer.json``; quantized here to ``bits`` with ``group_size``), a directory written by
    ``convert`` (its own quantization is used; ``bits``/``group_size`` are ignored), or an MNN
    LLM export (``llm.mnn``, ``llm.mnn.weight``, ...).

    act: "int8" (dynamic int8 activations: W4A8 / W8A8) or "float" (weights dequantized in the
    kernel). memory: "low" keeps weights quantized; "normal" with act="float" dequantizes them to
    float32 at load (faster prefill, 8x the memory of int4). disk_embedding: read embedding rows
    from the file instead of holding the table. slim_vocab: True keeps only the tokenizer's ids in
    the lm head (or pass the ids to keep). act_block: as ``qlinear.matmul``'s ("group": one
    activation scale per row and weight group; None: one per row; an int: per that many k).
    max_context: KV cache positions (generation stops when they are full). kv_cache: their element
    type, "float32" or "float16" (half the memory and the attention's reads; keys and values
    rounded to nearest even as stored). threads: kernel threads (default: physical cores).
    Packed weights held in process memory (not mapped from a file) are moved onto transparent
    huge pages (``weight_region``; ``model.info["huge_page_weights_mb"]``).

    memory="flash" (converted models): attention, norms, lm head and KV cache resident, each
    layer's FFN read from the file per forward, overlapped with compute (``flash``), by
    ``reader_threads`` threads (default: one stream with the kernel's readahead where the
    device's window is 1 MiB or more, else 4 threads without; ``flash_reader.read_plan``); ``memory_budget_mb`` (optional) is checked against what stays resident,
    before loading. ``predictor`` (ReLU models, a file in the flash layout): a file written by
    ``qlinear-llm train-predictor``; only predicted-active FFN neuron bundles are read, those
    active in the last ``window`` tokens kept in memory (``sparsity``). Routed experts (Qwen3-MoE,
    OLMoE) are read on demand into an expert cache sized by ``memory_budget_mb``
    (``flash.experts``; ``model.flash.stats``: its hit rate and bytes read), also from llama.cpp's
    GGUF file itself (Q4_0 / Q8_0 and block-format experts).
    """
    t0 = time.perf_counter()
    if threads is not None:
        set_num_threads(threads)
    opts = Options(bits, group_size, symmetric, act, act_block, memory, disk_embedding, slim_vocab, kv_cache).check()
    d = Path(path)
    if opts.memory == "flash":
        from .flash.loader import load_flash
        model = load_flash(d, opts, max_context, memory_budget_mb, reader_threads, predictor, window)
        model.stats.load_s = time.perf_counter() - t0
        return model
    if memory_budget_mb is not None or predictor is not None:
        raise ValueError("memory_budget_mb and predictor apply to memory='flash' only")
    if not d.is_dir() and not gguf_source.is_gguf(d):
        raise ValueError(f"{d}: not a model directory or GGUF file")
    for matches, read in _SOURCES:
        if matches(d):
            source = read(d, opts, progress)
            huge = weight_region.place(source.tensors)
            model = build_model(source, opts, max_context)
            model.info["huge_page_weights_mb"] = round(huge / 2**20, 1)
            break
    else:
        raise ValueError(f"{d}: no {converted_source.MODEL_FILE} (converted model), llm.mnn (MNN export) "
                         "or config.json (Hugging Face checkpoint)")
    model.stats.load_s = time.perf_counter() - t0
    return model
