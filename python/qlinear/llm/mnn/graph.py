"""The graph of an export, ``llm.mnn`` (a FlatBuffer), read through MNN's own converter, and
the names of its ops.

Every linear layer is a 1x1 ``Convolution`` op named after its module
(``/layers.0/self_attn/q_proj/Linear``, ``/lm/lm_head/Linear``); its weights are not in the graph
but in ``llm.mnn.weight`` at ``main.external = [offset, weight_bytes, alpha_bytes, bias_bytes, 0]``.
RMSNorms are ``LayerNorm`` ops (``useRMSNorm``) with ``external = [offset, gamma_bytes,
beta_bytes]`` (beta all zeros; Gemma's gammas hold ``1 + w``). RoPE's inverse frequencies are a float ``Const`` (``/rotary/...``).

The graph is converted to JSON by MNN's compiled converter (the ``_tools`` module, run in a
subprocess; never the ``MNN.tools`` Python package, which installs packages and sends usage logs
when imported).
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

import numpy as np

PROJ_PARENT = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn",
               "o_proj": "self_attn", "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}
LINEAR_RE = re.compile(r"^/layers\.(\d+)/(self_attn|mlp)/(\w+)/Linear$")
NORM_RE = re.compile(r"^/blocks\.(\d+)/(input_layernorm|post_attention_layernorm|pre_feedforward_layernorm|"
                     r"post_feedforward_layernorm|self_attn/q_norm|self_attn/k_norm)/")
HEAD_NORMS = ("self_attn.q_norm", "self_attn.k_norm")  # Qwen3, Gemma 3: per head, head_dim values


def read_graph(mnn_path) -> dict:
    """The graph of an ``.mnn`` file as the converter's JSON (ops, tensor names), as a dict.

    Runs MNN's compiled converter (``_tools.mnnconvert``) in a subprocess; weights stored
    externally are not loaded."""
    mnn_path = Path(mnn_path)
    if not mnn_path.is_file():
        raise ValueError(f"{mnn_path}: missing (the graph)")
    if importlib.util.find_spec("_tools") is None:
        raise ImportError("reading an MNN graph needs MNN's converter module `_tools` "
                          "(pip install MNN==3.6.1)")
    with tempfile.TemporaryDirectory(prefix="qlinear-mnn-") as tmp:
        out = Path(tmp) / "graph.json"
        code = ("import sys, _tools; "
                "_tools.mnnconvert(['', '-f', 'MNN', '--modelFile', sys.argv[1], '--JsonFile', sys.argv[2]])")
        proc = subprocess.run([sys.executable, "-c", code, str(mnn_path), str(out)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              errors="replace", timeout=600)
        if proc.returncode != 0 or not out.is_file() or out.stat().st_size == 0:
            tail = "\n".join(proc.stdout.strip().splitlines()[-5:])
            raise ValueError(f"{mnn_path}: MNN's converter could not read the graph "
                             f"(exit {proc.returncode}): {tail}")
        try:
            graph = json.loads(out.read_text(encoding="utf-8", errors="replace"))
        except json.JSONDecodeError as e:
            raise ValueError(f"{mnn_path}: the converter's JSON is unreadable: {e}") from None
    if not isinstance(graph, dict) or not isinstance(graph.get("oplists"), list):
        raise ValueError(f"{mnn_path}: not an MNN graph (no op list)")
    return graph


def hf_linear_name(op_name: str) -> Optional[str]:
    m = LINEAR_RE.match(op_name)
    if m:
        layer, parent, proj = m.groups()
        if PROJ_PARENT.get(proj) != parent:
            return None
        return f"model.layers.{layer}.{parent}.{proj}"
    if op_name.startswith("/lm/lm_head/") or op_name == "/lm_head/Linear":
        return "lm_head"
    return None


def rope_from_graph(graph: dict) -> Optional[np.ndarray]:
    for op in graph["oplists"]:
        if op.get("type") == "Const" and str(op.get("name", "")).startswith("/rotary/"):
            vals = (op.get("main") or {}).get("float32s")
            if vals and len(vals) > 1 and abs(vals[0] - 1.0) < 1e-6:
                return np.asarray(vals, dtype=np.float32)
    return None


def theta_from_inv_freq(inv_freq: np.ndarray, head_dim: int) -> float:
    # inv_freq[i] = theta ** (-2 i / head_dim); the graph stores 6 decimals, so use i = 1 (the
    # largest below 1.0) and round the result to 4 significant digits.
    theta = float(inv_freq[1]) ** (-head_dim / 2.0)
    digits = 3 - int(np.floor(np.log10(theta)))
    return float(round(theta, digits))
