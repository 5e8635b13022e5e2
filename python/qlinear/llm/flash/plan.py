"""What memory="flash" holds in memory, checked against ``memory_budget_mb`` before loading, and
the FFN layers the budget's room holds besides (the rest are read per token)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..converted import source as converted_source
from ..config import ModelConfig


@dataclass
class MemoryPlan:
    """Bytes the model holds in memory in flash mode (the budget is checked against the sum)."""

    resident_weights: int       # attention, norms, biases, lm head
    kv_cache: int
    ffn_buffers: int            # the two FFN buffers (dense) or the windows (sparse)
    other: int = 0              # RoPE tables, predictors
    pinned_ffn: int = 0         # FFN layers the budget holds in memory (not read per token)

    @property
    def total(self) -> int:
        return self.resident_weights + self.kv_cache + self.ffn_buffers + self.other + self.pinned_ffn

    def __str__(self) -> str:
        mb = lambda n: f"{n / 2**20:.1f} MB"  # noqa: E731
        return (f"{mb(self.total)}: resident weights {mb(self.resident_weights)}, KV cache "
                f"{mb(self.kv_cache)}, FFN buffers {mb(self.ffn_buffers)}, other {mb(self.other)}"
                + (f", pinned FFN layers {mb(self.pinned_ffn)}" if self.pinned_ffn else ""))


def kv_cache_bytes(cfg: ModelConfig, positions: int) -> int:
    return 2 * cfg.num_layers * cfg.num_kv_heads * positions * cfg.head_dim * 4


def plan_memory(entries: dict, ffn, cfg: ModelConfig, max_context: int,
                window_bytes: Optional[int] = None) -> MemoryPlan:
    """``ffn``: the model file's ``flash.FFNFile``; ``window_bytes``: the sparse windows' (else
    the two dense FFN buffers)."""
    resident = sum(e["nbytes"] for n, e in entries.items()
                   if n not in ffn.names and n != converted_source.EMBEDDING and n != "lm_rows")
    positions = min(max_context, cfg.max_position_embeddings)
    buffers = 2 * (ffn.layout.gate_up.nbytes + ffn.layout.down.nbytes) if window_bytes is None else window_bytes
    rope = 2 * positions * (cfg.head_dim // 2) * 4
    return MemoryPlan(resident, kv_cache_bytes(cfg, positions), buffers, rope)


# What the process holds beyond its plan (the interpreter, libraries, heap, activations, reads in
# flight): the budget's room above plan + this holds FFN layers in memory.
PROCESS_RESERVE = 128 << 20


def pinned_layers(plan: MemoryPlan, budget_mb: Optional[float], layer_bytes: int, num_layers: int) -> list:
    """The FFN layers that the budget holds in memory (not read per token): the last ones. A cyclic
    scan over more than the memory holds is the worst case of a page cache's LRU (each page is
    evicted just before it is needed again); a fixed set of layers held is the best. The last
    ones, so that where every layer's FFN follows the one before in the file (a bundled file, a
    converted one: ``flash.layout``) the streamed FFNs are one run, one sequential stream per token
    that the kernel's readahead follows: held layers spread over the depth cut it into runs of
    2-3 layers, each read past its end (Qwen2.5-1.5B-shaped bench model, bundled, Zen 4 VM:
    2.79-2.85 -> 3.44-3.58 tok/s, 540 -> 470 MB read per token)."""
    if budget_mb is None:
        return []
    n = min(num_layers, int(max(0, budget_mb * 2**20 - plan.total - PROCESS_RESERVE) // layer_bytes))
    return list(range(num_layers - n, num_layers))


def check_budget(plan: MemoryPlan, budget_mb: Optional[float], path) -> None:
    if budget_mb is None:
        return
    if isinstance(budget_mb, bool) or not isinstance(budget_mb, (int, float)) or budget_mb <= 0:
        raise ValueError(f"memory_budget_mb must be a positive number, got {budget_mb!r}")
    if plan.total > budget_mb * 2**20:
        raise ValueError(f"{path}: memory_budget_mb={budget_mb} is too small for what memory='flash' keeps "
                         f"resident ({plan}); raise the budget or lower max_context")
