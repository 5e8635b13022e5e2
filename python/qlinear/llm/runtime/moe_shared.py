"""A routed MLP with a shared expert (Qwen2-MoE): every token also runs one SwiGLU expert of its
own width, its output scaled by sigmoid(gate . x) and added to the routed experts' sum, as
transformers' Qwen2MoeSparseMoeBlock computes it."""

from __future__ import annotations

import numpy as np

from .moe import MoeBlock


class SharedExpertMoeBlock(MoeBlock):
    def __init__(self, *args, shared: tuple, shared_gate: np.ndarray, **kwargs):
        super().__init__(*args, **kwargs)
        self.shared = shared  # (gate_up, down) Linears
        self.shared_gate = np.ascontiguousarray(shared_gate, np.float32)  # [hidden]: one logit per token

    @property
    def step_moe(self):
        return None  # the compiled step has no shared expert: decode runs through the blocks

    def mlp(self, x: np.ndarray) -> np.ndarray:
        routed = super().mlp(x)
        gate_up, down = self.shared
        out = down(self.act(gate_up(np.ascontiguousarray(x))))
        gate = 1.0 / (1.0 + np.exp(-(x.astype(np.float32) @ self.shared_gate)))
        return routed + out * gate[:, None]
