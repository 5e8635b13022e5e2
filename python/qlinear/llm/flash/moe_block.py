"""The MoE blocks of ``memory="flash"``: ``FlashMoeBlock`` routes as ``MoeBlock`` does (same
softmax, top-k and ascending order of the sums), so the logits equal the in-memory model's bit
for bit; it asks the expert cache (``experts``) for all the experts it needs at once (the misses'
reads start together, in the reader's threads), runs those whose slots are ready in one compiled
call while the others are read (``_core.MoeExperts``: the in-memory MoeLayer's stages over the
slots, each expert's biases with its slot's weights), and adds the outputs in ascending expert
order."""

from __future__ import annotations

from typing import Optional

import numpy as np

from ..runtime.layers import Linear, rms_norm
from ..runtime.moe import MoeBlock
from .experts import ExpertCache


class FlashMoeBlock(MoeBlock):
    """A MoE block whose experts come from ``cache``; ``next_block``: the next layer's (for prefetch)."""

    def __init__(self, block: MoeBlock, layer: int, cache: ExpertCache):
        vars(self).update(vars(block))
        self.layer, self.cache, self.next_block = layer, cache, None
        self.expert_biases = _stacked_biases(block.experts)  # resident (GPT-OSS's): the weights are the cache's
        self.experts = None   # the placeholders build_model made: the weights are the cache's
        self.core_moe = None  # (built over those placeholders)
        self.core_experts = cache.compiled(self.cfg, layer)

    def __call__(self, h: np.ndarray, cache, start: int) -> np.ndarray:
        out = super().__call__(h, cache, start)
        nb = self.next_block
        if nb is not None and out.shape[0] == 1 and self.cache.prefetch == "router":
            guess, _ = nb.route(rms_norm(out, nb.post_norm, self.cfg.rms_norm_eps))
            self.cache.prefetch_layer(nb.layer, guess[0])
        return out

    def mlp(self, x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x, np.float32)
        top, w = self.route(x)  # MoeBlock's compiled routing: the in-memory model's bits
        needed = [int(e) for e in np.unique(top)]
        core = self.core_experts
        got = self.cache.request(self.layer, needed)
        biases = self.expert_biases
        if core is not None:
            core.begin(x, top, w, *(biases or ()))
        outs, pending = {}, list(needed)
        try:
            while pending:
                # the experts whose slots are ready, together; else the first read in flight, else
                # one without a slot yet (read into a slot the others freed: a prefill's rows may
                # need more experts than the cache holds)
                ready = [e for e in pending if e in got and (got[e].job is None or got[e].job.done)]
                if not ready:
                    ready = [next((e for e in pending if e in got), pending[0])]
                linears = [self.cache.get(self.layer, e, got) for e in ready]
                if core is not None:
                    core.run(ready, [got[e].index for e in ready])
                else:
                    for e, (gate_up, down) in zip(ready, linears):
                        rows, slot = np.nonzero(top == e)
                        if biases is not None:  # the slot's weights with this expert's biases
                            gate_up, down = (Linear(m.weight, b[e], m.act, m._block) for m, b in zip((gate_up, down), biases))
                        out = down(self.act(gate_up(np.ascontiguousarray(x[rows]))))
                        outs[e] = (rows, out * w[rows, slot, None])
                for e in ready:
                    self.cache.release(got[e])
                    pending.remove(e)
                self.expert_bytes_read += len(ready) * self.cache.files.expert_bytes_of(self.layer)
        except BaseException:
            for e in pending:
                if e in got and got[e].pins > 0:
                    self.cache.release(got[e])
            raise
        if core is not None:
            return core.finish()
        y = np.zeros(x.shape, np.float32)
        for e in needed:   # in ascending order, as MoeBlock adds them
            rows, out = outs[e]
            np.add.at(y, rows, out)
        return y

    @property
    def expert_bytes(self) -> int:
        return self.cache.files.E * self.cache.files.expert_bytes


def _stacked_biases(experts: list) -> Optional[tuple]:
    """The experts' biases stacked ([experts, 2 inter], [experts, hidden]), or None without any."""
    if all(m.bias is None for pair in experts for m in pair):
        return None
    return tuple(np.stack([pair[j].bias if pair[j].bias is not None else np.zeros(pair[j].shape[0], np.float32)
                           for pair in experts]).astype(np.float32) for j in (0, 1))


def flash_block(block: MoeBlock, layer: int, cache: ExpertCache) -> FlashMoeBlock:
    """``block`` with its routed experts from ``cache``; a subclass's own MLP (Qwen2-MoE's shared
    expert) kept: its class first, so that its ``mlp`` calls FlashMoeBlock's for the routed part."""
    cls = FlashMoeBlock
    if type(block) is not MoeBlock:
        cls = type(f"Flash{type(block).__name__}", (type(block), FlashMoeBlock), {})
    out = object.__new__(cls)
    FlashMoeBlock.__init__(out, block, layer, cache)
    return out
