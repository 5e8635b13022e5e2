"""``load(..., memory="flash")`` of a model with routed experts (Qwen3-MoE, OLMoE): attention,
norms, routers, lm head and KV cache resident, the embedding rows read as needed
(``DiskEmbedding``), the experts read from the file into an expert cache (``flash.experts``)
whose size comes from ``memory_budget_mb``: what the budget holds after the resident part and
the process's reserve (``plan.PROCESS_RESERVE``), at least experts_per_token slots (one layer's
experts for one token); every expert without a budget. The file: a converted model, or llama.cpp's
GGUF file itself (Q4_0 / Q8_0 and block-format experts, Q4_K, Q6_K, MXFP4, ..., read from their
stacked tensors: ``expert_files``)."""

from __future__ import annotations

import os
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from ..assemble import build_model
from ..converted import source as converted_source
from ..options import Options
from ..runtime.model import Model
from . import layout as flash_layout
from ..gguf import source as gguf_source
from ..gguf.config import read_config
from ..gguf.file import GGUFFile
from .expert_files import ExpertFile, GGUFExpertFile
from .experts import EXPERT_READERS, ExpertCache
from .moe_block import flash_block
from .plan import PROCESS_RESERVE, MemoryPlan, kv_cache_bytes
from .reader import DIRECT_ALIGN, FlashReader, checked_threads, read_plan
from .resident import resident_source


def moe_plan(resident: int, files, cfg, max_context: int, slots: int, readers: int) -> MemoryPlan:
    """What stays in memory: ``resident`` bytes (everything but the experts and the embedding),
    the KV cache, the RoPE tables and ``slots`` expert slots with the file's staging buffers and
    the ``readers`` reader threads' buffers of direct reads (under ``ffn_buffers``)."""
    positions = min(max_context, cfg.max_position_embeddings)
    rope = 2 * positions * (cfg.head_dim // 2) * 4
    buffers = slots * files.expert_bytes + files.staging_bytes + readers * (files.max_read + 2 * DIRECT_ALIGN)
    return MemoryPlan(resident, kv_cache_bytes(cfg, positions), buffers, rope)


def expert_slots(resident: int, files, cfg, max_context: int, budget_mb: Optional[float],
                 slots: Optional[int], path, readers: int) -> int:
    """The expert cache's size: ``slots`` if given, else what ``budget_mb`` holds (all the
    experts without a budget). A budget that does not hold the resident part, the reserve and
    experts_per_token slots is refused, naming the figures."""
    total, k = files.L * files.E, cfg.experts_per_token
    if budget_mb is not None and (isinstance(budget_mb, bool) or not isinstance(budget_mb, (int, float))
                                  or budget_mb <= 0):
        raise ValueError(f"memory_budget_mb must be a positive number, got {budget_mb!r}")
    if slots is not None:
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise ValueError(f"expert_slots must be an int >= 1, got {slots!r}")
        slots = min(slots, total)
    base = moe_plan(resident, files, cfg, max_context, 0, readers)
    if budget_mb is None:
        return total if slots is None else slots
    room = budget_mb * 2**20 - base.total - PROCESS_RESERVE
    fit = int(max(room, 0) // files.expert_bytes)
    need = k if slots is None else slots
    if fit < need:
        mb = lambda n: f"{n / 2**20:.1f} MB"  # noqa: E731
        raise ValueError(f"{path}: memory_budget_mb={budget_mb} is too small for memory='flash' with routed "
                         f"experts: resident {base} + process reserve {mb(PROCESS_RESERVE)} + {need} expert "
                         f"slot{'s' * (need > 1)} of {mb(files.expert_bytes)} (at least experts_per_token={k}) "
                         f"= {mb(base.total + PROCESS_RESERVE + need * files.expert_bytes)}; raise the budget "
                         "or lower max_context")
    return min(fit, total) if slots is None else slots


def load_flash_moe(d: Path, opts: Options, max_context: int, entries: dict, cfg,
                   memory_budget_mb: Optional[float] = None, reader_threads: Optional[int] = None,
                   slots: Optional[int] = None, prefetch: str = "none") -> Model:
    """A Model over the converted MoE model in ``d`` whose experts are read on demand."""
    path = d / converted_source.MODEL_FILE
    files = ExpertFile(path, entries, cfg, os.path.getsize(path))
    resident = sum(e["nbytes"] for n, e in entries.items()
                   if n not in files.names and n != converted_source.EMBEDDING and n != "lm_rows")
    readers = checked_threads(reader_threads) or EXPERT_READERS
    n = expert_slots(resident, files, cfg, max_context, memory_budget_mb, slots, path, readers)
    source = resident_source(d, opts, entries, files.names)
    return _model(path, source, files, n, moe_plan(resident, files, cfg, max_context, n, readers), opts, max_context,
                  readers, prefetch)


def load_flash_moe_gguf(p: Path, opts: Options, max_context: int, memory_budget_mb: Optional[float] = None,
                        reader_threads: Optional[int] = None, slots: Optional[int] = None,
                        prefetch: str = "none") -> Model:
    """A Model over llama.cpp's GGUF file ``p`` of a MoE model (Q4_0 / Q8_0 / block-format experts), its experts
    read from that file on demand (``expert_files.GGUFExpertFile``)."""
    f = GGUFFile(p)
    cfg = read_config(f)
    if not cfg.num_experts:
        raise ValueError(f"{p}: memory='flash' reads the routed experts of a GGUF file, and this {cfg.arch} model "
                         "has none; stream a dense model's FFNs from a converted file (llm.convert)")
    files = GGUFExpertFile(f, cfg, staging=cfg.experts_per_token)
    embd = "token_embd.weight"
    resident = sum(int(t.n_bytes) for n, t in f.tensors.items()
                   if n not in files.names and (n != embd or cfg.tie_word_embeddings))
    readers = checked_threads(reader_threads) or EXPERT_READERS
    n = expert_slots(resident, files, cfg, max_context, memory_budget_mb, slots, p, readers)
    del f
    source = gguf_source.read(p, opts, progress_bar=False, routed_experts=False)
    return _model(p, source, files, n, moe_plan(resident, files, cfg, max_context, n, readers), opts, max_context,
                  readers, prefetch)


def _model(path: Path, source, files, n: int, plan: MemoryPlan, opts: Options, max_context: int,
           readers: int, prefetch: str) -> Model:
    """The model of ``source`` (its tensors but the experts), the experts read from ``path`` into
    an expert cache of ``n`` slots."""
    cfg, tensors = source.config, source.tensors
    # one placeholder of each shape stands for every expert, so that build_model builds the rest
    # (one per kind of layer: a file's types may differ by layer)
    ph = [(flash_layout.packed(np.zeros(g.nbytes, np.uint8), g), flash_layout.packed(np.zeros(d.nbytes, np.uint8), d))
          for g, d in files.kinds]
    for i in range(cfg.num_layers):
        for e in range(cfg.num_experts):
            tensors[f"layers.{i}.experts.{e}.gate_up"], tensors[f"layers.{i}.experts.{e}.down"] = ph[files.kind(i)]
    model = build_model(source, opts, max_context)
    del source, tensors
    first = model.blocks[0].experts[0]
    reader = FlashReader(path, read_plan(path, False, readers, direct=True))
    try:
        cache = ExpertCache(reader, files, n, first[0].act, opts.act_block, prefetch)
    except BaseException:
        reader.close()
        raise
    blocks = [flash_block(b, i, cache) for i, b in enumerate(model.blocks)]
    for b, nxt in zip(blocks, blocks[1:]):
        b.next_block = nxt
    model.blocks = blocks
    model.compiled_decode = False
    model.resources.append(reader)
    model.resources.append(model.embedding)
    weakref.finalize(model, reader.close)
    model.flash = FlashMoeInfo(reader, files, cache, plan)
    model.info.update(memory="flash", flash_experts=True, flash_expert_slots=n,
                      flash_expert_bytes=files.expert_bytes, flash_expert_cache_mb=round(cache.nbytes / 2**20, 1))
    return model


@dataclass
class FlashMoeInfo:
    """What a flash MoE model reads: for ``model.flash.stats``, the cost model and the benchmarks."""

    reader: FlashReader
    files: "ExpertFile | GGUFExpertFile"
    experts: ExpertCache
    plan: MemoryPlan

    @property
    def bytes_read(self) -> int:
        return self.reader.stats.bytes

    @property
    def stats(self) -> dict:
        """The expert cache's hits, misses, hit rate, prefetches and bytes read; the bytes of an
        expert in a slot (expert_bytes) and read from the file (read_bytes: equal for a converted
        file)."""
        return {**self.experts.stats.as_dict(), "slots": len(self.experts.slots),
                "experts": self.files.L * self.files.E, "expert_bytes": self.files.expert_bytes,
                "read_bytes": self.files.read_bytes}
