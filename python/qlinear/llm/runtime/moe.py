"""Routed experts (Qwen3-MoE): a block whose MLP is a router and E SwiGLU experts, each token
running only the k experts its router ranks highest (their outputs summed with the router's
softmax weights over the k, renormalized to 1 with ``norm_topk_prob``), as transformers'
Qwen3MoeSparseMoeBlock computes it. The experts' weights are int4 / int8 like any linear; the
router stays float (its ranking decides which weights run). Rows of a prompt are grouped by
expert: one GEMM per expert over the rows that chose it. Decode runs through the blocks in
Python (the compiled step has no routed MLP); a token reads k / E of the experts' bytes, which
``expert_bytes_read`` counts."""

from __future__ import annotations

import numpy as np

from ..config import ModelConfig
from .layers import Attention, Block, Linear


class MoeBlock(Block):
    def __init__(self, cfg: ModelConfig, attention: Attention, router: Linear, experts: list,
                 input_norm: np.ndarray, post_norm: np.ndarray):
        super().__init__(cfg, attention, None, None, input_norm, post_norm)
        self.router, self.experts = router, experts  # experts: [(gate_up, down)] * num_experts
        self.expert_bytes_read = 0

    def mlp(self, x: np.ndarray) -> np.ndarray:
        k = self.cfg.experts_per_token
        logits = self.router(x).astype(np.float32)
        p = np.exp(logits - logits.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)
        top = np.argsort(-p, axis=-1, kind="stable")[:, :k]  # highest first; ties: the lower index
        w = np.take_along_axis(p, top, axis=-1)
        if self.cfg.norm_topk_prob:
            w = w / w.sum(axis=-1, keepdims=True)
        y = np.zeros(x.shape, np.float32)
        for e in np.unique(top):  # in ascending order, as transformers adds them
            rows, slot = np.nonzero(top == e)
            gate_up, down = self.experts[e]
            out = down(self.act(gate_up(np.ascontiguousarray(x[rows]))))
            np.add.at(y, rows, out * w[rows, slot, None])
            self.expert_bytes_read += _nbytes(gate_up) + _nbytes(down)
        return y

    @property
    def expert_bytes(self) -> int:
        """The bytes of all the experts' weights of this block."""
        return sum(_nbytes(g) + _nbytes(d) for g, d in self.experts)


def _nbytes(linear: Linear) -> int:
    w = linear.weight
    return int(w.nbytes)
