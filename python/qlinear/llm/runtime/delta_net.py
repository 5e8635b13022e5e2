"""Gated DeltaNet, the linear-attention token mixer of Qwen3.5's hybrid layers, as
transformers' Qwen3_5GatedDeltaNet computes it: one projection of the layer's input gives the
conv channels (q, k, v), the output gate z and the logits of beta and of the decay; a causal
depthwise conv (kernel ``conv_kernel``, its last inputs kept in the cache) and SiLU over the
channels; q and k L2-normed per head, q scaled by head_k ** -0.5; then per value head the gated
delta rule over a state S [head_k, head_v]:

    S <- exp(g_t) S;   S <- S + k_t (beta_t (v_t - k_t S));   o_t = q_t S

with g_t = -exp(A_log) softplus(a_t + dt_bias), beta_t = sigmoid(b_t) (key heads shared by
value heads in groups). The readout is RMS-normed per head, times silu(z), and projected out.

Two forms of the same rule (docs/semantics.md, "Recurrent state"), both compiled (decoder.h),
the value heads split over the threads: the recurrent form (``_core.delta_rows``: one-token steps,
decode and a speculative verification's rows, and by default a prefill's rows, row after row), and
the chunked form (``_core.delta_chunked``, ``prefill_form = "chunked"``): chunks of 64 positions
cut at multiples of 64 of the absolute position (so that a prompt's state does not depend on where
the prompt was cut), within a chunk the updates solved as one triangular system and applied as
products with the state (the WY / UT form). One-token steps record their projected rows in the cache, so that it
can roll the state back to any position of a guarded run (``KVCache.rollback``: the states before
the run restored, the kept rows replayed through the same code, the same bits)."""

from __future__ import annotations

import numpy as np

from ... import _core
from ..config import ModelConfig

class GatedDeltaNet:
    def __init__(self, cfg: ModelConfig, layer: int, proj, out, conv: np.ndarray,
                 dt_bias: np.ndarray, ssm_a: np.ndarray, norm: np.ndarray):
        """``ssm_a``: the decay's rate -exp(A_log) per value head (as llama.cpp's files store it)."""
        self.cfg, self.layer, self.proj, self.out = cfg, layer, proj, out
        C, K, nv = cfg.delta_conv_dim, cfg.conv_kernel, cfg.delta_v_heads
        conv = np.asarray(conv, np.float32)
        if conv.shape not in ((C, 1, K), (C, K)):
            raise ValueError(f"layer {layer}: the delta conv has shape {conv.shape}, expected ({C}, 1, {K})")
        self.conv = np.ascontiguousarray(conv.reshape(C, K).T)  # [K, C]: tap j of every channel
        for name, v, n in (("dt_bias", dt_bias, nv), ("A", ssm_a, nv), ("norm", norm, cfg.delta_v_dim)):
            if np.shape(v) != (n,):
                raise ValueError(f"layer {layer}: the delta {name} has shape {np.shape(v)}, expected ({n},)")
        self.dt_bias = np.asarray(dt_bias, np.float32)
        self.neg_a = np.asarray(ssm_a, np.float32)
        if not np.all(self.neg_a < 0):  # exp(g) <= 1: the state decays (a file may not say otherwise)
            raise ValueError(f"layer {layer}: the delta decay rate A = -exp(A_log) must be negative")
        self.norm = np.asarray(norm, np.float32)
        self._geometry = self.geometry()

    # -- the state a cache holds for this layer ----------------------------------------------------
    @staticmethod
    def state_shapes(cfg: ModelConfig) -> tuple:
        """(the conv's last inputs [kernel - 1, channels], the recurrent state [v_heads, head_k, head_v])."""
        return ((cfg.conv_kernel - 1, cfg.delta_conv_dim),
                (cfg.delta_v_heads, cfg.delta_k_dim, cfg.delta_v_dim))

    def geometry(self) -> dict:
        """The layer's shape as the compiled kernels take it (``_core.delta_rows``, the decode step)."""
        cfg = self.cfg
        return {"k_heads": cfg.delta_k_heads, "v_heads": cfg.delta_v_heads, "k_dim": cfg.delta_k_dim,
                "v_dim": cfg.delta_v_dim, "kernel": cfg.conv_kernel, "tiled": cfg.delta_tiled_heads,
                "eps": cfg.rms_norm_eps}

    @staticmethod
    def width(cfg: ModelConfig) -> int:
        """Columns of the input projection: conv channels, z, b, a."""
        return cfg.delta_conv_dim + cfg.delta_v_heads * cfg.delta_v_dim + 2 * cfg.delta_v_heads

    def __call__(self, x: np.ndarray, cache, start: int) -> np.ndarray:
        y = self.proj(x)
        if y.shape[0] == 1:  # recorded as the compiled step records it: a rollback replays it
            cache.records[self.layer][start % cache.RECORD_ROWS] = y[0]
        else:
            cache.replayable = False  # (a guarded run of chunked rows is not rolled back part way)
        return self.out(self.mix(y, *cache.states[self.layer], start))

    # How a prefill's rows run: "recurrent" (row after row, the one-token step's code: measured
    # 2.6x faster than "chunked" on an AVX-512 Xeon, 512 rows of a 2B model's layer, and the rows'
    # bits are the decode step's, wherever the prompt is cut) or "chunked" (the WY / UT form).
    prefill_form = "recurrent"

    def mix(self, y: np.ndarray, conv_state: np.ndarray, state: np.ndarray, start: int) -> np.ndarray:
        """The readouts [n, v_heads * v_dim] of projected rows ``y`` at positions start.., the
        states updated: by the compiled recurrent step (the decode step's own code), or a
        prefill's rows by the compiled chunked rule (``_core.delta_chunked``) with
        ``prefill_form = "chunked"``."""
        y = np.ascontiguousarray(y, np.float32)
        args = (self._geometry, self.conv, self.dt_bias, self.neg_a, self.norm, conv_state, state)
        if y.shape[0] == 1 or self.prefill_form == "recurrent":
            return _core.delta_rows(y, *args)
        return _core.delta_chunked(y, start, *args)


