"""A routed MLP with a shared expert (Qwen2-MoE, Qwen3.5-MoE): every token also runs one SwiGLU
expert of its own width, its output scaled by sigmoid(gate . x) and added to the routed experts'
sum, as transformers' Qwen2MoeSparseMoeBlock computes it. With packed weights the compiled routed
MLP runs it too (moe.h, MoeLayer's shared expert), in the Python path and the compiled decode
step alike; numpy runs it otherwise."""

from __future__ import annotations

import numpy as np

from ... import _core
from ..._packed import PackedWeight
from .moe import MoeBlock, linear_spec


class SharedExpertMoeBlock(MoeBlock):
    def __init__(self, *args, shared: tuple, shared_gate: np.ndarray, **kwargs):
        self.shared = shared  # (gate_up, down) Linears; set first: MoeBlock compiles them in
        self.shared_gate = np.ascontiguousarray(shared_gate, np.float32)  # [hidden]: one logit per token
        super().__init__(*args, **kwargs)

    def mlp(self, x: np.ndarray) -> np.ndarray:
        if self.core_moe is not None:  # the shared expert included
            return super().mlp(x)
        routed = super().mlp(x)
        gate_up, down = self.shared
        if all(isinstance(m.weight, PackedWeight) for m in self.shared):  # the compiled one's bits (flash: routed here)
            _core.shared_expert_add(routed, np.ascontiguousarray(x, np.float32),
                                    (linear_spec(gate_up), linear_spec(down), self.shared_gate), gelu=self.cfg.hidden_act == "gelu_tanh")
            return routed
        out = down(self.act(gate_up(np.ascontiguousarray(x))))
        gate = 1.0 / (1.0 + np.exp(-(x.astype(np.float32) @ self.shared_gate)))
        return routed + out * gate[:, None]
