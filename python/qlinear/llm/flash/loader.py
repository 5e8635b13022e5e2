"""``load(..., memory="flash")``: run a converted model whose weights need not fit in memory,
reading each layer's FFN from the model file per forward ("LLM in a flash", Alizadeh et al.).

What stays resident (copied out of the file at load, so the page cache may drop it): the
attention weights, norms, biases, the lm head and the KV cache; the embedding rows are read
from the file as they are needed (``DiskEmbedding``). Each layer's FFN weights (gate_up and
down: two thirds of a dense model) are read per forward, into one of two preallocated buffers
(double buffering): while layer i computes from one, ``FlashReader``'s workers read layer i+1
into the other with large ``preadv`` calls (one stream the kernel's readahead keeps ahead
of, or several reads in flight: ``flash_reader.read_plan``). The packed bytes read are those
a normal load maps, and the same kernels run on them: the logits are the same, bit for bit.

A file in the bundled layout (``convert(..., flash=True)``, ``flash.layout``) is read as one
sequential range per layer, scattered into the two packed buffers by the reads themselves; with
an activation predictor (ReLU models: ``sparsity``), only the bundles of predicted-active
neurons are read, into a per-layer window (``sparsity.Window``). A model with routed experts
reads them into an expert cache instead (``moe_loader``, ``experts``).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

from ..._format import tensor_entries
from ..converted import source as converted_source
from . import layout as flash_layout
from ..assemble import build_model
from ..config import ModelConfig
from .plan import check_budget, pinned_layers, plan_memory
from .reader import FlashReader, read_plan, split_reads
from .resident import resident_source
from ..runtime.layers import Block, Linear, mlp_activation
from ..runtime.model import Model
from ..options import Options

FFN_PARTS = ("gate_up", "down")


class FFNFile:
    """Where each layer's FFN is in the model file: gate_up and down (a converted file) or
    the layer's bundles (a file in the flash layout)."""

    def __init__(self, path: Path, entries: dict, meta: dict, cfg: ModelConfig):
        self.path, L = path, cfg.num_layers
        fmeta = meta.get(flash_layout.FLASH_META)
        self.bundled = fmeta is not None
        if self.bundled:
            self.layout = flash_layout.layout_of_meta(fmeta, str(path))
            names = [[f"layers.{i}.{flash_layout.BUNDLES}"] for i in range(L)]
        else:
            names = [[f"layers.{i}.{p}" for p in FFN_PARTS] for i in range(L)]
            for n in (x for layer in names for x in layer):
                if n not in entries or entries[n].get("kind", "packed") != "packed":
                    raise ValueError(f"{path}: no packed FFN weight {n!r} (memory='flash' needs quantized FFN weights)")
            geoms = [tuple(flash_layout.Geometry.of_entry(entries[n]) for n in layer) for layer in names]
            if len(set(geoms)) != 1:
                raise ValueError(f"{path}: the layers' FFN weights are quantized differently; "
                                 "memory='flash' streams one geometry")
            self.layout = flash_layout.FFNLayout(*geoms[0])
        flash_layout.check_readable((self.layout.gate_up, self.layout.down), str(path))
        for layer in names:
            for n in layer:
                if n not in entries:
                    raise ValueError(f"{path}: tensor {n!r} is missing")
        self.names = {n for layer in names for n in layer}
        self.starts = [[entries[n]["start"] for n in layer] for layer in names]
        want = [self.layout.nbytes] if self.bundled else [self.layout.gate_up.nbytes, self.layout.down.nbytes]
        for layer in names:
            if [entries[n]["nbytes"] for n in layer] != want:
                raise ValueError(f"{path}: {layer}: sizes do not match the FFN geometry")
        self.layer_bytes = sum(want)
        # every layer's FFN right after the one before (a bundled file, a file converted since
        # the FFNs are written last): the streamed layers are one run of the file
        ends = [(start, start + size) for layer in self.starts for start, size in zip(layer, want)]
        self.one_run = all(0 <= nxt[0] - prev[1] < 4096 for prev, nxt in zip(ends, ends[1:]))

    def layer_reads(self, layer: int, rel_reads: list) -> list:
        """``dense_reads``' reads placed at ``layer``'s file ranges."""
        return [(start + rel, views) for start, per_range in zip(self.starts[layer], rel_reads)
                for rel, views in per_range]

    def read_layer(self, reader: FlashReader, layer: int) -> tuple:
        """``layer``'s (gate_up, down) packed bytes, read now into arrays of their own."""
        gate_up, down = np.empty(self.layout.gate_up.nbytes, np.uint8), np.empty(self.layout.down.nbytes, np.uint8)
        reader.submit(self.layer_reads(layer, self.dense_reads(gate_up, down, reader.plan.chunk))).wait()
        return gate_up, down

    def dense_reads(self, gate_up: np.ndarray, down: np.ndarray, chunk: int) -> list:
        """Per file range of a layer: reads of ``chunk`` bytes relative to its start that fill
        the two buffers."""
        if self.bundled:
            views = [v for b in range(self.layout.count) for v in self.layout.bundle_views(gate_up, down, b)]
            return [split_reads(0, views, chunk)]
        return [split_reads(0, [gate_up], chunk), split_reads(0, [down], chunk)]


class DenseStream:
    """The FFNs of ``layers`` (those not held in memory), read in turn into two buffers: visit v
    (layer ``layers[v mod S]``) uses buffer v mod 2; when visit v is done, visit v + 2 is read
    into its buffer."""

    def __init__(self, reader: FlashReader, ffn: FFNFile, biases: list, act: str, act_block, layers: list):
        lay = ffn.layout
        self.reader, self.ffn, self.layers, self.S = reader, ffn, list(layers), len(layers)
        self.index = {layer: k for k, layer in enumerate(self.layers)}
        self.buffers = [(np.zeros(lay.gate_up.nbytes, np.uint8), np.zeros(lay.down.nbytes, np.uint8)) for _ in range(2)]
        weights = [(flash_layout.packed(g, lay.gate_up), flash_layout.packed(d, lay.down)) for g, d in self.buffers]
        self.reads = [ffn.dense_reads(g, d, reader.plan.chunk) for g, d in self.buffers]
        self.linears = {layer: [(Linear(gu, biases[layer][0], act, act_block), Linear(dn, biases[layer][1], act, act_block))
                                for gu, dn in weights] for layer in self.layers}
        self.nbytes = sum(g.nbytes + d.nbytes for g, d in self.buffers)
        self.jobs: dict = {}
        self._start(0)

    def _submit(self, v: int) -> None:
        self.jobs[v] = self.reader.submit(self.ffn.layer_reads(self.layers[v % self.S], self.reads[v % 2]))

    def _start(self, visit: int) -> None:
        """(Re)start the pipeline at ``visit``: in-flight reads are waited for and dropped."""
        for job in self.jobs.values():
            try:
                job.wait()
            except ValueError:
                pass
        self.jobs = {}
        self.visit = visit
        self._submit(visit)
        self._submit(visit + 1)

    def acquire(self, layer: int) -> tuple:
        """The (gate_up, down) Linears of ``layer``, its weights read."""
        if self.layers[self.visit % self.S] != layer or self.visit not in self.jobs:
            self._start(self.index[layer])
        try:
            self.jobs[self.visit].wait()
        except ValueError:
            self.jobs.pop(self.visit)   # the next call restarts the pipeline
            raise
        return self.linears[layer][self.visit % 2]

    def release(self, layer: int) -> None:
        self.jobs.pop(self.visit)
        self._submit(self.visit + 2)
        self.visit += 1


class FlashFFN:
    """A block's MLP on streamed weights: act(gate) * up, then down."""

    def __init__(self, stream: DenseStream, layer: int, act):
        self.stream, self.layer, self.act = stream, layer, act

    def __call__(self, x: np.ndarray) -> np.ndarray:
        gate_up, down = self.stream.acquire(self.layer)
        y = down(self.act(gate_up(x)))
        self.stream.release(self.layer)
        return y


class FlashBlock(Block):
    """A decoder block whose MLP is ``ffn`` on streamed weights; the rest is ``block``'s own."""

    def __init__(self, block: Block, ffn):
        vars(self).update(vars(block))
        del self.gate_up, self.down   # the placeholders the block was built with
        self.ffn = ffn

    def mlp(self, x: np.ndarray) -> np.ndarray:
        return self.ffn(x)


def _refuse_state(cfg: ModelConfig, where) -> None:
    if cfg.has_state:
        raise ValueError(f"{where}: memory='flash' is not supported for hybrid models with recurrent layers "
                         f"({cfg.arch}); load it with memory='normal'")


def load_flash(d: Path, opts: Options, max_context: int, memory_budget_mb: Optional[float] = None,
               reader_threads: Optional[int] = None, predictor=None, window: int = 5,
               expert_slots: Optional[int] = None) -> Model:
    """A Model over the converted model in ``d`` whose FFN weights (or routed experts: ``expert_slots``
    of them held, else as many as ``memory_budget_mb`` holds) are read per forward; or over
    llama.cpp's GGUF file ``d`` of a MoE model, its routed experts read from it."""
    from ..gguf import source as gguf_source
    if gguf_source.is_gguf(d):
        from ..gguf.config import read_config as gguf_config  # noqa: PLC0415
        from ..gguf.file import GGUFFile  # noqa: PLC0415
        _refuse_state(gguf_config(GGUFFile(d)), d)
        if predictor is not None:
            raise ValueError(f"{d}: a predictor applies to a converted model's dense FFNs, not to a GGUF file")
        from .moe_loader import load_flash_moe_gguf
        return load_flash_moe_gguf(d, opts, max_context, memory_budget_mb, reader_threads, expert_slots)
    if not converted_source.is_converted(d):
        raise ValueError(f"{d}: memory='flash' needs a converted model file "
                         f"({converted_source.MODEL_FILE}, written by qlinear-llm convert)")
    path = d / converted_source.MODEL_FILE
    entries, meta = tensor_entries(path)
    cfg = ModelConfig.from_dict(meta.get("config") or {}, str(path))
    _refuse_state(cfg, path)
    if cfg.num_experts:   # routed experts: read into an expert cache (flash.experts)
        if predictor is not None:
            raise ValueError(f"{path}: a predictor applies to dense FFNs, not to routed experts ({cfg.arch})")
        from .moe_loader import load_flash_moe
        return load_flash_moe(d, opts, max_context, entries, cfg, memory_budget_mb, reader_threads, expert_slots)
    ffn = FFNFile(path, entries, meta, cfg)
    # a predictor's reads are scattered bundles: not a stream
    reading = read_plan(path, ffn.one_run and predictor is None, reader_threads)
    sparse = None
    if predictor is not None:
        from .sparsity import SparseSetup
        sparse = SparseSetup(predictor, ffn, cfg, window)
    plan = plan_memory(entries, ffn, cfg, max_context, None if sparse is None else sparse.nbytes)
    check_budget(plan, memory_budget_mb, path)
    pinned = [] if sparse is not None else pinned_layers(plan, memory_budget_mb, ffn.layer_bytes, cfg.num_layers)

    source = resident_source(d, opts, entries, ffn.names)
    tensors = source.tensors
    # Placeholders of the right shape, so that build_model checks and builds the rest.
    lay = ffn.layout
    placeholder = (flash_layout.packed(np.zeros(lay.gate_up.nbytes, np.uint8), lay.gate_up),
                   flash_layout.packed(np.zeros(lay.down.nbytes, np.uint8), lay.down))
    for i in range(cfg.num_layers):
        for part, w in zip(FFN_PARTS, placeholder):
            tensors[f"layers.{i}.{part}"] = w
    model = build_model(source, opts, max_context)
    del source, tensors, placeholder

    reader = FlashReader(path, reading)
    try:
        biases = [(b.gate_up.bias, b.down.bias) for b in model.blocks]
        act = mlp_activation(cfg)
        if sparse is None:
            for i in pinned:   # held in memory: the block keeps its own MLP, on weights read once
                b, (gu, dn) = model.blocks[i], ffn.read_layer(reader, i)
                b.gate_up = Linear(flash_layout.packed(gu, lay.gate_up), b.gate_up.bias, b.gate_up.act, opts.act_block)
                b.down = Linear(flash_layout.packed(dn, lay.down), b.down.bias, b.down.act, opts.act_block)
            streamed = [i for i in range(cfg.num_layers) if i not in pinned]
            stream = DenseStream(reader, ffn, biases, model.blocks[0].gate_up.act, opts.act_block,
                                 streamed) if streamed else None
            ffns = [None if i in pinned else FlashFFN(stream, i, act) for i in range(cfg.num_layers)]
            buffers = 0 if stream is None else stream.nbytes
        else:
            ffns = sparse.ffns(reader, model.blocks, opts.act_block)
            buffers = sparse.nbytes
    except BaseException:
        reader.close()
        raise
    model.blocks = [b if f is None else FlashBlock(b, f) for b, f in zip(model.blocks, ffns)]
    model.compiled_decode = False
    model.resources.append(reader)
    model.resources.append(model.embedding)
    weakref.finalize(model, reader.close)
    model.flash = FlashInfo(reader, ffn, buffers, sparse, pinned)
    model.info.update(memory="flash", flash_bundled=ffn.bundled, flash_sparse=sparse is not None,
                      flash_layer_bytes=ffn.layer_bytes, flash_pinned_layers=pinned)
    return model


@dataclass
class FlashInfo:
    """What a flash model reads: for the cost model and the benchmarks."""

    reader: FlashReader
    ffn: FFNFile
    buffer_bytes: int
    sparse: object = None
    pinned: list = field(default_factory=list)   # FFN layers held in memory (the budget's room)

    @property
    def streamed_layers(self) -> int:
        return len(self.ffn.starts) - len(self.pinned)

    @property
    def bytes_read(self) -> int:
        return self.reader.stats.bytes
