"""Gated DeltaNet, the linear-attention token mixer of Qwen3.5's hybrid layers, as
transformers' Qwen3_5GatedDeltaNet computes it: one projection of the layer's input gives the
conv channels (q, k, v), the output gate z and the logits of beta and of the decay; a causal
depthwise conv (kernel ``conv_kernel``, its last inputs kept in the cache) and SiLU over the
channels; q and k L2-normed per head, q scaled by head_k ** -0.5; then per value head the gated
delta rule over a state S [head_k, head_v]:

    S <- exp(g_t) S;   S <- S + k_t (beta_t (v_t - k_t S));   o_t = q_t S

with g_t = -exp(A_log) softplus(a_t + dt_bias), beta_t = sigmoid(b_t) (key heads shared by
value heads in groups). The readout is RMS-normed per head, times silu(z), and projected out.

Two forms of the same rule (docs/semantics.md, "Recurrent state"): a prefill runs it in chunks
of ``CHUNK`` positions (the WY / UT form: within a chunk, the updates solved as one triangular
system and applied with matmuls), the chunks cut at multiples of CHUNK of the absolute position
so that a prompt's state does not depend on where the prompt was cut; one-token steps (decode,
a speculative verification's rows) run the recurrent form, compiled (``_core.delta_rows``, the
decode step's own code). One-token steps record their projected rows in the cache, so that it
can roll the state back to any position of a guarded run (``KVCache.rollback``: the states before
the run restored, the kept rows replayed through the same code, the same bits)."""

from __future__ import annotations

import numpy as np

from ... import _core
from ..config import ModelConfig
from .kv_cache import KVCache
from .layers import Linear, sigmoid

CHUNK = 64
_L2_EPS = 1e-6  # as transformers' l2norm (and the FLA kernels)


def softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(np.float32(0), x).astype(np.float32, copy=False)


def silu(x: np.ndarray) -> np.ndarray:
    return x * sigmoid(x)


def l2norm(x: np.ndarray) -> np.ndarray:
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + np.float32(_L2_EPS))


class GatedDeltaNet:
    def __init__(self, cfg: ModelConfig, layer: int, proj: Linear, out: Linear, conv: np.ndarray,
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

    def __call__(self, x: np.ndarray, cache: KVCache, start: int) -> np.ndarray:
        y = self.proj(x)
        if y.shape[0] == 1:  # recorded as the compiled step records it: a rollback replays it
            cache.records[self.layer][start % cache.RECORD_ROWS] = y[0]
        else:
            cache.replayable = False  # (a guarded run of chunked rows is not rolled back part way)
        return self.out(self.mix(y, *cache.states[self.layer], start))

    def mix(self, y: np.ndarray, conv_state: np.ndarray, state: np.ndarray, start: int) -> np.ndarray:
        """The readouts [n, v_heads * v_dim] of projected rows ``y`` at positions start.., the
        states updated: one row by the compiled recurrent step (the decode step's own code), more
        by the chunked rule."""
        if y.shape[0] == 1:
            return _core.delta_rows(np.ascontiguousarray(y), self._geometry, self.conv, self.dt_bias, self.neg_a,
                                    self.norm, conv_state, state)
        cfg = self.cfg
        n, C, vd, nv = y.shape[0], cfg.delta_conv_dim, cfg.delta_v_heads * cfg.delta_v_dim, cfg.delta_v_heads
        mixed, z, b, a = y[:, :C], y[:, C:C + vd], y[:, C + vd:C + vd + nv], y[:, C + vd + nv:]
        q, k, v = self._conv(mixed, conv_state)
        beta = sigmoid(b)
        g = (self.neg_a * softplus(a + self.dt_bias)).astype(np.float32)
        o = chunked(state, q, k, v, beta, g, start).reshape(n, nv, cfg.delta_v_dim)
        o = o / np.sqrt(np.mean(o * o, axis=-1, keepdims=True) + np.float32(cfg.rms_norm_eps)) * self.norm
        return np.ascontiguousarray(o.reshape(n, vd) * silu(z), np.float32)

    def _conv(self, mixed: np.ndarray, conv_state: np.ndarray) -> tuple:
        """The causal conv and SiLU over ``mixed`` [n, C] after the cached inputs (updated); q, k
        [v_heads, n, head_k] (normed, q scaled; key heads repeated for their value heads) and v
        [v_heads, n, head_v]."""
        cfg = self.cfg
        n, K = mixed.shape[0], cfg.conv_kernel
        window = np.concatenate([conv_state, mixed])  # [K - 1 + n, C]
        acc = window[0:n] * self.conv[0]
        for j in range(1, K):
            acc += window[j:j + n] * self.conv[j]
        conv_state[:] = window[n:]
        h = silu(acc)
        kd, nk, nv = cfg.delta_k_heads * cfg.delta_k_dim, cfg.delta_k_heads, cfg.delta_v_heads
        q = l2norm(h[:, :kd].reshape(n, nk, cfg.delta_k_dim)) * np.float32(cfg.delta_k_dim ** -0.5)
        k = l2norm(h[:, kd:2 * kd].reshape(n, nk, cfg.delta_k_dim))
        v = h[:, 2 * kd:].reshape(n, nv, cfg.delta_v_dim)
        if nv != nk:  # each key head serves nv / nk value heads: consecutive ones, or every nk-th
            spread = (lambda x: np.tile(x, (1, nv // nk, 1))) if cfg.delta_tiled_heads else \
                (lambda x: np.repeat(x, nv // nk, axis=1))
            q, k = spread(q), spread(k)
        return (np.ascontiguousarray(q.transpose(1, 0, 2)), np.ascontiguousarray(k.transpose(1, 0, 2)),
                np.ascontiguousarray(v.transpose(1, 0, 2)))


def chunked(state: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray, beta: np.ndarray,
            g: np.ndarray, start: int) -> np.ndarray:
    """The delta rule over positions start.. in chunks cut at multiples of CHUNK (absolute), each
    chunk in the WY / UT form; ``state`` updated in place; the readout [n, h * dv]."""
    h, n, dv = v.shape
    out = np.empty((h, n, dv), np.float32)
    cuts = [0] + [c - start for c in range((start // CHUNK + 1) * CHUNK, start + n, CHUNK)] + [n]
    for a, b in zip(cuts[:-1], cuts[1:]):
        out[:, a:b] = _chunk(state, q[:, a:b], k[:, a:b], v[:, a:b], beta[a:b].T, g[a:b].T)
    return out.transpose(1, 0, 2).reshape(n, h * dv)


def _chunk(state, q, k, v, beta, g):
    """One chunk of L positions: q, k [h, L, dk], v [h, L, dv], beta, g [h, L]."""
    L = q.shape[1]
    G = np.cumsum(g, axis=1)                                        # log decay from the chunk's start
    lower = np.tril(np.ones((L, L), bool))
    decay = np.exp(np.where(lower, G[:, :, None] - G[:, None, :], -np.inf)).astype(np.float32)  # i >= j
    kb = k * beta[:, :, None]
    # (I + strictly lower (beta_i k_i . k_j decay_ij)) [u, w] = [beta v, beta k exp(G)]: the updates
    # of the chunk's positions as if each saw the ones before it
    system = np.tril((kb @ k.transpose(0, 2, 1)) * decay, -1) + np.eye(L, dtype=np.float32)
    eG = np.exp(G)[:, :, None]
    uw = np.linalg.solve(system, np.concatenate([v * beta[:, :, None], kb * eG], axis=2)).astype(np.float32)
    u, w = uw[:, :, :v.shape[2]], uw[:, :, v.shape[2]:]
    new_v = u - w @ state                                           # what the state did not predict
    out = (q * eG) @ state + ((q @ k.transpose(0, 2, 1)) * decay) @ new_v
    last = G[:, -1:]
    state *= np.exp(last)[:, :, None]
    state += (k * np.exp(last - G)[:, :, None]).transpose(0, 2, 1) @ new_v
    return out
