"""Gemma 4's block (``archs.gemma4``): attention of per-layer head sizes whose values are
RMS-normed (and, on full layers with ``attention_k_eq_v``, are the keys' projection), layers
that attend over an earlier layer's keys and values, a dense MLP (and in the MoE variant routed
experts beside it), the per-layer input gate, and the block's scalar. ``PerLayerInputs`` makes
every layer's input of a token from the per-layer embedding table (on disk by default: one
row read per token) and a projection of the token's embedding.

A layer that shares another's keys and values holds that layer's cache arrays
(``KVCache.kv_layers``) and writes into them the rows that layer wrote in the same forward
(the same bits: the same keys before RoPE, the same RoPE), so that the attention kernels,
rings, rollbacks and prefix reuse treat it as any layer."""

from __future__ import annotations

from typing import Optional

import numpy as np

from ... import _core
from ..config import ModelConfig
from .kv_cache import KVCache
from .layers import Attention, Block, Linear, Rope, _ring_prefill, rms_norm


def ropes(cfg: ModelConfig, max_positions: int) -> tuple:
    """(full layers' RoPE, sliding layers' RoPE): full layers' proportional (the leading
    ``rope_proportion`` of the frequencies over denominators of the whole head, the rest 0)."""
    def inv_freq(d, theta, share):
        turning = int(share * d // 2)
        inv = 1.0 / theta ** (np.arange(0, 2 * turning, 2, dtype=np.float64) / d)
        return np.concatenate([inv, np.zeros(d // 2 - turning)])

    dims = {t: {cfg.layer_head_dim(i) for i in range(cfg.num_layers) if cfg.layer_types[i] == t} for t in ("full", "sliding")}
    if any(len(d) > 1 for d in dims.values()):
        raise ValueError(f"layers of one type must have one head size (got {dims})")
    full = next(iter(dims["full"]), cfg.head_dim)
    local = next(iter(dims["sliding"]), cfg.head_dim)
    return (Rope(cfg, max_positions, inv_freq(full, cfg.rope_theta, cfg.rope_proportion or 1.0), head_dim=full),
            Rope(cfg, max_positions, inv_freq(local, cfg.rope_local_theta, 1.0), head_dim=local))


class Gemma4Attention(Attention):
    """``qkv`` projects q, k and v (q and k: values from keys; q only: a layer that shares the
    keys and values of ``source``, another Gemma4Attention)."""

    def __init__(self, cfg: ModelConfig, layer: int, qkv: Linear, o: Linear, rope: Rope, q_norm: np.ndarray,
                 k_norm: Optional[np.ndarray], source: Optional["Gemma4Attention"] = None):
        super().__init__(cfg, layer, qkv, o, rope, q_norm, k_norm)
        self.d, self.kv, self.source = cfg.layer_head_dim(layer), cfg.layer_kv_heads_of(layer), source
        self.shared = False  # other layers attend over its rows (make_blocks sets it)
        self.own_values = not (cfg.values_from_keys and self.window == 0)
        self._ones = np.ones(self.d, np.float32)

    def _heads(self, x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        n = x.shape[0]
        return rms_norm(np.ascontiguousarray(x).reshape(-1, self.d), weight, self.cfg.rms_norm_eps).reshape(n, -1)

    def attend(self, y: np.ndarray, cache: KVCache, start: int) -> np.ndarray:
        H, d, n = self.cfg.num_heads, self.d, y.shape[0]
        q = self._heads(y[:, :H * d], self.q_norm)
        if self.source is None:
            kv = self.kv * d
            k = y[:, H * d:H * d + kv]
            v = y[:, H * d + kv:] if self.own_values else k
            k, v = self._heads(k, self.k_norm), self._heads(v, self._ones)
        else:  # the source's rows of this forward (its last n: a prefill's shared layers run its last rows)
            k, v, before = cache.shared_rows[self.source.layer]
            k, v = k[-n:], v[-n:]
        qkv = np.concatenate([q, k, v], axis=1)
        kc, vc, ring = cache.k[self.layer], cache.v[self.layer], cache.windows[self.layer]
        wraps = n > 1 and ring and start + n > ring
        if self.source is None and self.shared:
            # for the layers that share them: the rows before RoPE, and a ring's past before this
            # prefill overwrites it (theirs must read the positions it held)
            cache.shared_rows[self.layer] = (k, v, (kc.copy(), vc.copy()) if wraps else None)
        elif self.source is not None and wraps:  # (copies: the prefill refills the ring it is given)
            kc, vc = before[0].copy(), before[1].copy()
        rope, scale = self.rope, float(self.scale)
        if n == 1:
            return _core.attend_one(qkv, rope.cos, rope.sin, start, kc, vc, H, scale, window=ring, softcap=self.softcap)
        if not ring or start + n <= ring:
            return _core.attend_prefill(qkv, rope.cos, rope.sin, start, kc, vc, H, scale, window=self.window,
                                        softcap=self.softcap)
        return _ring_prefill(qkv, rope, start, kc, vc, H, scale, ring, self.softcap)


class Gemma4Block(Block):
    """x + norm(attn(norm x)), then + norm(mlp(norm x)) (in the MoE variant norm(mlp) + norm(experts)),
    then + norm(proj(gelu(gate x) * per-layer input)), all times the block's scalar."""

    def __init__(self, cfg: ModelConfig, attention: Gemma4Attention, gate_up: Linear, down: Linear, norms: dict,
                 scalar: float, ple: Optional[tuple] = None, experts=None):
        super().__init__(cfg, attention, gate_up, down, norms["input_norm"], norms["post_norm"],
                         norms["attn_out_norm"], norms["mlp_out_norm"])
        self.norms, self.scalar, self.ple, self.experts = norms, np.float32(scalar), ple, experts
        self._ones = np.ones(cfg.hidden_size, np.float32)

    def __call__(self, h: np.ndarray, cache: KVCache, start: int, per_layer: Optional[np.ndarray] = None) -> np.ndarray:
        eps, norms = self.cfg.rms_norm_eps, self.norms
        h = h + self._out(self.attention(rms_norm(h, self.input_norm, eps), cache, start), self.attn_out_norm)
        m = self.mlp(rms_norm(h, self.post_norm, eps))
        if self.experts is not None:  # the experts' scalings are folded into their weights (hf/gemma4.py)
            routed = self.experts.mlp(rms_norm(h, self._ones, eps))
            m = rms_norm(m, norms["mlp_norm_1"], eps) + rms_norm(routed, norms["experts_out_norm"], eps)
        h = h + self._out(m, self.mlp_out_norm)
        if self.ple is not None:
            gate, proj = self.ple
            g = _core.gelu_tanh_mul(np.concatenate([gate(h), per_layer], axis=1))  # gelu(gate h) * input
            h = h + rms_norm(proj(g), norms["ple_norm"], eps)
        return h * self.scalar if self.scalar != 1 else h


class PerLayerInputs:
    """Every layer's input of each token, [tokens, layers, P]: (norm(proj(embedding) / sqrt(H)) + table
    row * sqrt(P)) / sqrt(2), the table a MemoryEmbedding or a DiskEmbedding of [vocab, layers * P]
    (``ScaledEmbedding``: the sqrt(P) in the table's dtype, as transformers rounds it)."""

    def __init__(self, cfg: ModelConfig, table, proj: Linear, norm: np.ndarray):
        self.cfg, self.table, self.proj, self.norm = cfg, table, proj, norm
        self.P = cfg.per_layer_input_size

    def __call__(self, ids, embedded: np.ndarray) -> np.ndarray:
        n, L, P = embedded.shape[0], self.cfg.num_layers, self.P
        context = self.proj(embedded) * np.float32(self.cfg.hidden_size ** -0.5)
        context = rms_norm(np.ascontiguousarray(context).reshape(n * L, P), self.norm, self.cfg.rms_norm_eps)
        rows = self.table(ids).reshape(n * L, P)
        return ((context + rows) * np.float32(2 ** -0.5)).reshape(n, L, P)

    def close(self) -> None:
        close = getattr(self.table, "close", None)
        if close is not None:
            close()


def make_blocks(cfg: ModelConfig, linear, vector, max_positions: int) -> list:
    """Gemma 4's blocks from our named tensors (``assemble``'s ``linear`` / ``vector``)."""
    full, local = ropes(cfg, max_positions)
    H, blocks = cfg.hidden_size, []
    for i in range(cfg.num_layers):
        p, d = f"layers.{i}.", cfg.layer_head_dim(i)
        source = None if cfg.kv_layer(i) == i else blocks[cfg.kv_layer(i)].attention
        if source is not None:
            source.shared = True
        q_rows = cfg.num_heads * d
        own = cfg.layer_kv_heads_of(i) * d
        rows = q_rows if source is not None else q_rows + own * (1 if cfg.values_from_keys and not cfg.window(i) else 2)
        attn = Gemma4Attention(cfg, i, linear(p + "qkv", (rows, H)), linear(p + "o", (H, q_rows)),
                               local if cfg.window(i) else full, vector(p + "q_norm", d),
                               None if source is not None else vector(p + "k_norm", d), source)
        names = ["input_norm", "post_norm", "attn_out_norm", "mlp_out_norm"]
        names += ["mlp_norm_1", "experts_out_norm"] if cfg.num_experts else []
        names += ["ple_norm"] if cfg.per_layer_input_size else []
        norms = {n: vector(p + n, H) for n in names}
        ple = None
        if cfg.per_layer_input_size:
            P = cfg.per_layer_input_size
            ple = (linear(p + "ple_gate", (P, H)), linear(p + "ple_proj", (H, P)))
        experts = None
        if cfg.num_experts:
            from .moe import MoeBlock  # noqa: PLC0415

            M = cfg.moe_intermediate_size
            routed = [(linear(f"{p}experts.{e}.gate_up", (2 * M, H)), linear(f"{p}experts.{e}.down", (H, M)))
                      for e in range(cfg.num_experts)]
            experts = MoeBlock(cfg, None, linear(p + "router", (cfg.num_experts, H)), routed, None, None)
        I = cfg.mlp_size(i)
        blocks.append(Gemma4Block(cfg, attn, linear(p + "gate_up", (2 * I, H)), linear(p + "down", (H, I)), norms,
                                  float(vector(p + "layer_scalar", 1)[0]), ple, experts))
    return blocks


def run_blocks(model, ids, h: np.ndarray, cache: KVCache, start: int, all_positions: bool) -> np.ndarray:
    """The blocks of a model with per-layer inputs or shared KV over rows ``h`` of ``ids``. Past
    the first layer that shares KV no layer writes rows of its own, so a prefill that wants the
    last position's logits only runs that position through them (as transformers does)."""
    cfg, n = model.config, len(ids)
    per_layer = None if model.per_layer is None else model.per_layer(ids, h)
    first_shared = next((i for i in range(cfg.num_layers) if cfg.kv_layer(i) != i), cfg.num_layers)
    for i, block in enumerate(model.blocks):
        if i == first_shared and not all_positions and n > 1:
            h, start = h[-1:], start + n - 1
            per_layer = None if per_layer is None else per_layer[-1:]
        h = block(h, cache, start, None if per_layer is None else np.ascontiguousarray(per_layer[:, i]))
    return h
