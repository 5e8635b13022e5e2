"""Routed experts (Qwen3-MoE, OLMoE, Mixtral, GPT-OSS; Qwen2-MoE adds its shared expert in
``moe_shared``): a block whose MLP is a router and E SwiGLU experts, each token running only the
k experts its router ranks highest (their outputs summed with the router's softmax weights over
the k, renormalized to 1 with ``norm_topk_prob``), as transformers' Qwen3MoeSparseMoeBlock
computes it. The experts' weights are int4 / int8 like any linear; the
router stays float (its ranking decides which weights run).

With packed experts, the routed MLP is one compiled call (``_core.MoeLayer``, csrc/qlinear/llm/moe.h):
rows grouped by expert, one GEMM per expert over its rows, the experts split over the threads;
the compiled decode step runs the same code, so both paths give the same bits. Experts kept in
float run here in numpy, routed by the same compiled op (``_core.moe_route``). A token reads
k / E of the experts' bytes, which ``expert_bytes_read`` counts."""

from __future__ import annotations

from typing import Optional

import numpy as np

from ... import _core
from ..._ops import core_handle
from ..._packed import PackedWeight
from ..config import ModelConfig
from .layers import Attention, Block, Linear


class MoeBlock(Block):
    def __init__(self, cfg: ModelConfig, attention: Attention, router: Linear, experts: list,
                 input_norm: np.ndarray, post_norm: np.ndarray):
        super().__init__(cfg, attention, None, None, input_norm, post_norm)
        k, n = cfg.experts_per_token, cfg.num_experts
        if len(experts) != n or router.shape[0] != n:
            raise ValueError(f"routed experts: the config has {n} experts, the block {len(experts)} "
                             f"and its router {router.shape[0]}")
        if not 1 <= k <= n:
            raise ValueError(f"routed experts: experts_per_token {k} must be in 1..{n}")
        if isinstance(router.weight, PackedWeight):
            raise ValueError("routed experts: the router must be kept in float")
        self.router, self.experts = router, experts  # experts: [(gate_up, down)] * num_experts
        self._router_w = np.ascontiguousarray(router.weight, np.float32)
        self._bytes_read = 0
        self.core_moe = self._compiled()

    def _compiled(self) -> Optional[object]:
        """The compiled routed MLP (``_core.MoeLayer``), or None when an expert is kept in float
        or the activation is not SwiGLU / GeGLU."""
        linears = [m for pair in self.experts for m in pair]
        if self.cfg.hidden_act not in ("silu", "gelu_tanh", "clamped_swiglu") or any(not isinstance(m.weight, PackedWeight)
                                                                    for m in linears):
            return None

        shared = getattr(self, "shared", None)  # (moe_shared: a shared expert every token runs)
        if shared is not None and not all(isinstance(m.weight, PackedWeight) for m in shared):
            return None
        return _core.moe_layer(self._router_w, self.router.bias, [(linear_spec(g), linear_spec(d)) for g, d in self.experts],
                               self.cfg.experts_per_token, bool(self.cfg.norm_topk_prob),
                               **expert_activation(self.cfg),
                               shared=None if shared is None else (linear_spec(shared[0]), linear_spec(shared[1]), self.shared_gate))

    def route(self, x: np.ndarray) -> tuple:
        """(experts [rows, k] highest first, ties the lower; their weights [rows, k]) of x."""
        return _core.moe_route(np.ascontiguousarray(x, np.float32), self._router_w, self.router.bias,
                               self.cfg.experts_per_token, bool(self.cfg.norm_topk_prob))

    def mlp(self, x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x, np.float32)
        if self.core_moe is not None:
            return self.core_moe(x)
        top, w = self.route(x)
        y = np.zeros(x.shape, np.float32)
        for e in np.unique(top):  # in ascending order, as transformers adds them
            rows, slot = np.nonzero(top == e)
            gate_up, down = self.experts[e]
            out = down(self.act(gate_up(np.ascontiguousarray(x[rows]))))
            np.add.at(y, rows, out * w[rows, slot, None])
            self._bytes_read += _nbytes(gate_up) + _nbytes(down)
        return y

    @property
    def step_moe(self) -> Optional[object]:
        """The compiled routed MLP when it is the block's whole MLP (for the decode step), else None."""
        return self.core_moe

    @property
    def expert_bytes_read(self) -> int:
        """The bytes of the experts run so far (by this block and by the compiled decode step)."""
        return self._bytes_read + (self.core_moe.bytes_read if self.core_moe is not None else 0)

    @expert_bytes_read.setter
    def expert_bytes_read(self, value: int) -> None:
        self._bytes_read = value - (self.core_moe.bytes_read if self.core_moe is not None else 0)

    @property
    def expert_bytes(self) -> int:
        """The bytes of all the experts' weights of this block."""
        return sum(_nbytes(g) + _nbytes(d) for g, d in self.experts)


def linear_spec(m: Linear) -> tuple:
    """A packed Linear as the compiled routed MLP takes it: (handle, bias, act_int8, act_block)."""
    return (core_handle(m.weight), m.bias, m.act == "int8", int(m._block))


def expert_activation(cfg: ModelConfig) -> dict:
    """The compiled experts' activation options of ``cfg`` (moe.h ExpertActivation)."""
    if cfg.hidden_act == "clamped_swiglu":
        return {"swiglu_limit": cfg.swiglu_limit, "swiglu_alpha": cfg.swiglu_alpha}
    return {"gelu": cfg.hidden_act == "gelu_tanh"}


def _nbytes(linear: Linear) -> int:
    w = linear.weight
    return int(w.nbytes)
