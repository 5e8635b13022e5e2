"""The cost model of memory="flash": a decode step reads bytes_per_token from the model file,
so it cannot run faster than (sequential read throughput / bytes_per_token) tokens per second;
with the reads overlapped with compute, it should come close.

``read_throughput`` measures the file's throughput as the model reads it (the same reader, read
size and threads, the file's pages dropped from the page cache first).
"""

from __future__ import annotations

import os
import time
from typing import Optional

import numpy as np

from .reader import CHUNK_BYTES, FlashReader, ReadPlan


def drop_file_cache(path) -> None:
    """Drop the file's pages from the page cache (the next reads come from the disk)."""
    fd = os.open(os.fspath(path), os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def read_throughput(path, nbytes: Optional[int] = None, plan: ReadPlan = ReadPlan(False, 4, CHUNK_BYTES)) -> float:
    """Bytes per second reading ``nbytes`` (default: the whole file, at most 1 GiB) of the file
    from its start as ``plan`` says (a model's: ``model.flash.reader.plan``), cache dropped first."""
    workers, chunk = plan.threads, plan.chunk
    size = os.path.getsize(path)
    nbytes = min(size, 1 << 30) if nbytes is None else min(nbytes, size)
    nbytes -= nbytes % chunk if nbytes >= chunk else 0
    drop_file_cache(path)
    bufs = [np.empty(min(chunk, nbytes), np.uint8) for _ in range(2 * workers)]
    reads = [(off, [memoryview(bufs[i % len(bufs)])[:min(chunk, nbytes - off)]])
             for i, off in enumerate(range(0, nbytes, chunk))]
    reader = FlashReader(path, plan)
    try:
        t0 = time.perf_counter()
        reader.submit(reads).wait()
        return nbytes / (time.perf_counter() - t0)
    finally:
        reader.close()


def describe(plan: ReadPlan) -> str:
    how = "with the kernel's readahead" if plan.readahead else "without readahead"
    return f"{plan.threads} reader thread{'s' * (plan.threads > 1)}, {plan.chunk >> 20} MiB reads, {how}"


def bundles_read_fraction(sparsity: float, neurons_per_bundle: int) -> float:
    """Expected fraction of bundles with at least one active neuron, neurons active
    independently with probability 1 - sparsity."""
    return 1.0 - sparsity ** neurons_per_bundle


def cost_model(model, throughput: float, measured_tok_s: Optional[float] = None,
               decode_bytes_per_token: Optional[float] = None, sparsities=(0.9, 0.97)) -> str:
    """The cost model's lines for a flash model (``model.flash``)."""
    fl = model.flash
    if hasattr(fl, "experts"):
        return moe_cost_model(model, throughput, measured_tok_s, decode_bytes_per_token)
    L, lay = model.config.num_layers, fl.ffn.layout
    dense = fl.streamed_layers * fl.ffn.layer_bytes
    per_token = dense if decode_bytes_per_token is None else decode_bytes_per_token
    sizes = fl.reader.stats.sizes
    top = sorted(sizes.items(), key=lambda kv: -kv[0] * kv[1])[:3]
    mb = lambda n: f"{n / 2**20:.1f} MB"  # noqa: E731
    lines = [
        f"flash cost model ({'bundled' if fl.ffn.bundled else 'unbundled'} file, {L} layers"
        + (f" ({len(fl.pinned)} FFNs held in memory by the budget)" if fl.pinned else "") + ", "
        f"{mb(fl.ffn.layer_bytes)} FFN per layer, {lay.count} bundles of {lay.neurons} neurons)",
        f"  bytes read per token: {mb(per_token)} (dense: {mb(dense)})",
        f"  reads: {fl.reader.stats.reads} in {fl.reader.stats.jobs} jobs, mean "
        f"{fl.reader.stats.bytes / max(fl.reader.stats.reads, 1) / 1024:.0f} KiB; most bytes in reads of "
        + ", ".join(f"{s / 1024:.0f} KiB x{c}" for s, c in top),
        f"  measured sequential read throughput: {throughput / 1e9:.2f} GB/s ({describe(fl.reader.plan)})",
    ]
    if per_token > 0:
        lines.append(f"  predicted (throughput / bytes per token): {throughput / per_token:.2f} tok/s"
                     + ("" if measured_tok_s is None else
                        f"; measured {measured_tok_s:.2f} tok/s ({100 * measured_tok_s * per_token / throughput:.0f}%)"))
    else:
        lines.append("  no reads per decoded token: what it needs stays in memory (the windows)")
    for s in sparsities if dense else ():   # nothing streamed: the budget holds every layer
        f_ind = bundles_read_fraction(s, lay.neurons)
        lines.append(f"  at {100 * s:.0f}% neuron sparsity: bundles read {100 * f_ind:.1f}% if neurons are "
                     f"active independently -> {throughput / (dense * f_ind):.2f} tok/s; "
                     f"{100 * (1 - s):.0f}% if active neurons cluster in bundles -> "
                     f"{throughput / (dense * (1 - s)):.2f} tok/s")
    return "\n".join(lines)


def moe_cost_model(model, throughput: float, measured_tok_s: Optional[float] = None,
                   decode_bytes_per_token: Optional[float] = None) -> str:
    """A flash MoE model's (``flash.experts``): a token reads its experts that miss the cache,
    misses x the bytes an expert reads; routing that picks experts uniformly at random hits a cache of S of
    the L x E experts at rate S / (L x E)."""
    fl, cfg = model.flash, model.config
    st, L, E, k = fl.stats, cfg.num_layers, cfg.num_experts, cfg.experts_per_token
    xb, held = st["read_bytes"], st["slots"] / (L * E)
    uniform = L * k * (1 - held) * xb
    per_token = uniform if decode_bytes_per_token is None else decode_bytes_per_token
    mb = lambda n: f"{n / 2**20:.1f} MB"  # noqa: E731
    lines = [f"flash MoE cost model ({L} layers x {E} experts, {k} per token, {mb(xb)} per expert; cache of "
             f"{st['slots']} experts = {100 * held:.0f}% of them, prefetch={fl.experts.prefetch})",
             f"  expert cache so far: hit rate {100 * st['hit_rate']:.1f}% ({st['hits']} hits, {st['misses']} misses), "
             f"{st['prefetched']} prefetched ({st['prefetch_used']} then used)",
             f"  bytes read per token: {mb(per_token)} (all experts missing: {mb(L * k * xb)}; uniform routing "
             f"over this cache: {mb(uniform)})",
             f"  measured read throughput: {throughput / 1e9:.2f} GB/s ({describe(fl.reader.plan)})"]
    if per_token > 0:
        lines.append(f"  predicted (throughput / bytes per token): {throughput / per_token:.2f} tok/s"
                     + ("" if measured_tok_s is None else
                        f"; measured {measured_tok_s:.2f} tok/s ({100 * measured_tok_s * per_token / throughput:.0f}%)"))
    return "\n".join(lines)


def flash_bench(model, row: dict, decode_tokens: int) -> dict:
    """Bytes read per decoded token (the reader's count over a prefill alone and over prefill +
    decode), the file's read throughput, and the cost model's lines."""
    stats = model.flash.reader.stats
    ids = row["prompt_ids"]
    model.reset()
    b0 = stats.bytes
    model.generate_ids(ids, 1, stop_ids=())
    b1 = stats.bytes
    model.reset()
    model.generate_ids(ids, decode_tokens + 1, stop_ids=())
    per_token = ((stats.bytes - b1) - (b1 - b0)) / max(model.stats.decode_steps, 1)
    throughput = read_throughput(model.flash.reader.path, plan=model.flash.reader.plan)
    return {"bytes_per_token": per_token, "read_throughput": throughput,
            "cost_model": cost_model(model, throughput, row["decode_tok_s"], per_token)}
