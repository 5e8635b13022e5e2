"""What an export's graph computes beyond its weights and norms, read from the graph itself: the
embedding's scale, the logits' soft-cap and the attention mask each layer takes; and the Gemma
settings in Hugging Face terms that follow from them.

What llmexport writes for Gemma 2 / Gemma 3 (text), and MNN's engine computes on it:

- the embedding is multiplied by sqrt(hidden) in the graph (a ``Const`` times the ``input_ids``
  input, which holds the embedding rows);
- RMSNorm gammas are stored as ``1 + w`` (the checkpoint's ``w`` folded in);
- the final soft-cap ``c * tanh(logits / c)`` is ops after the lm head, when the checkpoint has one;
- the attention soft-cap is not: MNN's ``Attention`` op has none, so Gemma 2's
  ``attn_logit_softcapping`` is dropped;
- the queries' scale is ``llm_config.json``'s ``attn_scale`` (``query_pre_attn_scalar ** -0.5``);
- ``attention_type`` "full" attends over the whole context in every layer (Gemma 2's export
  records no sliding window); "mix" passes MNN's [full, sliding] masks stacked and each layer
  gathers one; "sliding" gives every layer the sliding mask (``sliding_window`` positions);
- one RoPE for every layer: Gemma 3's sliding layers lose their own base (``rope_local_base_freq``).
"""

from __future__ import annotations

from typing import Dict, List, Optional

import numpy as np

GEMMA_TYPES = ("gemma2", "gemma3_text")


def _producers(graph: dict) -> Dict[int, dict]:
    return {t: op for op in graph["oplists"] for t in op.get("outputIndexes") or []}


def _const(op: Optional[dict]) -> Optional[np.ndarray]:
    if op is None or op.get("type") != "Const":
        return None
    main = op.get("main") or {}
    vals = main.get("float32s") or main.get("int32s")
    return None if vals is None else np.asarray(vals).reshape(main.get("dims") or ())


def _mul_by_const(op: dict, producers: dict):
    """(the other input, the constant) of a BinaryOp MUL by a scalar constant, else None."""
    if op.get("type") != "BinaryOp" or (op.get("main") or {}).get("opType") != "MUL":
        return None
    a, b = op["inputIndexes"]
    for x, c in ((a, b), (b, a)):
        v = _const(producers.get(c))
        if v is not None and v.size == 1:
            return x, float(v.reshape(()))
    return None


def embed_scale(graph: dict) -> Optional[float]:
    """The constant the embedding rows (the ``input_ids`` input) are multiplied by, if any."""
    producers = _producers(graph)
    inputs = {op["outputIndexes"][0] for op in graph["oplists"]
              if op.get("type") == "Input" and op.get("name") == "input_ids"}
    for op in graph["oplists"]:
        m = _mul_by_const(op, producers)
        if m and m[0] in inputs:
            return m[1]
    return None


def final_softcap(graph: dict) -> Optional[float]:
    """``c`` of ``logits = c * tanh(x * (1 / c))`` after the lm head (None: no soft-cap)."""
    producers = _producers(graph)
    for op in graph["oplists"]:
        outer = _mul_by_const(op, producers)
        tanh = producers.get(outer[0]) if outer else None
        if (tanh is None or tanh.get("type") != "UnaryOp"
                or (tanh.get("main") or {}).get("opType") != "TANH"):
            continue
        inner = _mul_by_const(producers.get(tanh["inputIndexes"][0], {}), producers)
        if inner and str(producers.get(inner[0], {}).get("name", "")).startswith("/lm/"):
            c = outer[1]
            if abs(inner[1] * c - 1) > 1e-4:
                raise ValueError(f"a logits soft-cap whose scales do not match: x * {inner[1]} then * {c}")
            return c
    return None


def _evaluate(t: int, producers: dict, inputs: dict, memo: dict) -> np.ndarray:
    """An integer tensor of shape arithmetic (the converter's index normalization), evaluated."""
    if t in memo:
        return memo[t]
    op = producers.get(t)
    kind, main = (op or {}).get("type"), (op or {}).get("main") or {}
    if kind == "Input" and op.get("name") in inputs:
        return inputs[op["name"]]
    args = [_evaluate(i, producers, inputs, memo) for i in (op or {}).get("inputIndexes") or []]
    if kind == "Const" and _const(op) is not None:
        out = _const(op).astype(np.int64)
    elif kind == "Shape":
        out = np.asarray(args[0].shape, np.int64)
    elif kind == "Rank":
        out = np.asarray(args[0].ndim, np.int64)
    elif kind == "StridedSlice" and not any(main.get(k) for k in ("beginMask", "endMask", "ellipsisMask",
                                                                   "newAxisMask", "shrinkAxisMask")):
        (b,), (e,), (s,) = args[1].ravel(), args[2].ravel(), args[3].ravel()
        out = args[0][b:e:s]
    elif kind == "Squeeze":
        out = np.squeeze(args[0], axis=tuple(main["squeezeDims"]) if main.get("squeezeDims") else None)
    elif kind == "Unsqueeze":
        out = np.expand_dims(args[0], tuple(main.get("squeezeDims") or ()))
    elif kind == "BinaryOp" and main.get("opType") in ("ADD", "SUB", "MUL", "MOD"):
        out = {"ADD": np.add, "SUB": np.subtract, "MUL": np.multiply, "MOD": np.mod}[main["opType"]](*args)
    else:
        raise ValueError(f"op {(op or {}).get('name')!r} ({kind}) in a mask index")
    memo[t] = out
    return out


def mask_choices(graph: dict) -> List[Optional[int]]:
    """Per layer (the Attention ops in order): which of the stacked masks its attention takes
    (None: the ``attention_mask`` input as it is)."""
    producers = _producers(graph)
    mask_in = next((op for op in graph["oplists"] if op.get("type") == "Input" and op.get("name") == "attention_mask"), {})
    mask = np.zeros([d if d > 0 else 1 for d in (mask_in.get("main") or {}).get("dims") or [1]], np.float32)
    out = []
    for op in graph["oplists"]:
        if op.get("type") != "Attention":
            continue
        m = producers.get(op["inputIndexes"][3]) if len(op["inputIndexes"]) > 3 else None
        if m is mask_in:
            out.append(None)
        elif m is not None and m.get("type") == "GatherV2" and producers.get(m["inputIndexes"][0]) is mask_in:
            memo = {}
            index, axis = (_evaluate(i, producers, {"attention_mask": mask}, memo) for i in m["inputIndexes"][1:3])
            if int(axis) != 0 or np.size(index) != 1:
                raise ValueError(f"attention {op.get('name')!r} gathers its mask along axis {int(axis)}")
            out.append(int(index))
        else:
            raise ValueError(f"attention {op.get('name')!r}: its mask is not the attention_mask input")
    return out


def gemma_config(graph: dict, llm_cfg: dict, hidden: int, n_layers: int, where: str) -> dict:
    """The Gemma fields of an export's config in Hugging Face terms (see the module docstring)."""
    scale = embed_scale(graph)
    if scale is None or abs(scale - np.sqrt(hidden)) > 1e-5 * np.sqrt(hidden):
        raise ValueError(f"{where}: the graph scales the embedding by {scale}, not sqrt(hidden_size)")
    kind, window = llm_cfg.get("attention_type", "full"), llm_cfg.get("sliding_window")
    types = None
    if kind in ("sliding", "mix"):
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"{where}: attention_type {kind!r} without a positive sliding_window")
        # MNN's mask for "mix" is [full, sliding]; a "sliding" export has only the sliding one
        choice = mask_choices(graph) if kind == "mix" else [1] * n_layers
        if any(c not in (0, 1) for c in choice):
            raise ValueError(f"{where}: attention masks {choice} are not one of [full, sliding] per layer")
        types = ["sliding_attention" if c else "full_attention" for c in choice]
    elif kind != "full":   # "full": no sliding layer (Gemma 2's export records no window)
        raise ValueError(f"{where}: attention_type {kind!r} is not supported (full, sliding, mix)")
    attn_scale = llm_cfg.get("attn_scale")
    out = {"hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh",
           "query_pre_attn_scalar": None if attn_scale is None else float(attn_scale) ** -2,
           "attn_logit_softcapping": None,   # MNN's attention op has no soft-cap
           "final_logit_softcapping": final_softcap(graph)}
    if types is not None:
        out.update(layer_types=types, sliding_window=window)
    return out
