"""LFM2's short convolution, a token mixer with a fixed-size state, as transformers'
Lfm2ShortConv computes it: one projection of the layer's input gives B, C and x (hidden each),
B * x is convolved per channel over the last ``conv_kernel`` positions (depthwise, no
activation: the state is the last conv_kernel - 1 values of B * x), and C times that is projected
out. One-token steps run the compiled step's code (``_core.short_conv_rows``) and record their
projected rows in the cache for a rollback (as ``delta_net``'s); a prefill's rows run here, the
same float operations in the same order (each output a sum over the taps in order)."""

from __future__ import annotations

import numpy as np

from ... import _core
from ..config import ModelConfig


class ShortConv:
    def __init__(self, cfg: ModelConfig, layer: int, proj, out, conv: np.ndarray):
        self.cfg, self.layer, self.proj, self.out = cfg, layer, proj, out
        H, K = cfg.hidden_size, cfg.conv_kernel
        conv = np.asarray(conv, np.float32)
        if conv.shape not in ((H, 1, K), (H, K)):
            raise ValueError(f"layer {layer}: the short conv has shape {conv.shape}, expected ({H}, 1, {K})")
        self.conv = np.ascontiguousarray(conv.reshape(H, K).T)  # [K, H]: tap j of every channel

    @staticmethod
    def state_shapes(cfg: ModelConfig) -> tuple:
        return ((cfg.conv_kernel - 1, cfg.hidden_size),)  # the last inputs of the conv (B * x)

    @staticmethod
    def width(cfg: ModelConfig) -> int:
        return 3 * cfg.hidden_size

    def __call__(self, x: np.ndarray, cache, start: int) -> np.ndarray:
        y = self.proj(x)
        if y.shape[0] == 1:  # recorded as the compiled step records it: a rollback replays it
            cache.records[self.layer][start % cache.RECORD_ROWS] = y[0]
        else:
            cache.replayable = False
        return self.out(self.mix(y, *cache.states[self.layer], start))

    def mix(self, y: np.ndarray, conv_state: np.ndarray, start: int = 0) -> np.ndarray:
        """C * conv(B * x) [n, hidden] of projected rows ``y`` [n, 3 hidden], the state updated."""
        if y.shape[0] == 1:
            return _core.short_conv_rows(np.ascontiguousarray(y), self.conv, conv_state)
        H, K, n = self.cfg.hidden_size, self.cfg.conv_kernel, y.shape[0]
        b, c, x = y[:, :H], y[:, H:2 * H], y[:, 2 * H:]
        window = np.concatenate([conv_state, b * x])  # [K - 1 + n, H]
        acc = window[0:n] * self.conv[0]
        for j in range(1, K):
            acc += window[j:j + n] * self.conv[j]
        conv_state[:] = window[n:]
        return np.ascontiguousarray(c * acc, np.float32)
