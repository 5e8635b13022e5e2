"""MNN's own LLM engine (``MNN.llm``) on an MNN export, for side-by-side runs with qlinear.

``MNN.llm`` keeps the export's settings except the thread count (``thread_num``), which is set
through ``Llm.set_config`` before loading. llmexport writes ``"precision": "low"`` and
``"memory": "low"``: int4/int8 weights stay quantized and activations are quantized to int8 on the
fly (MNN's W4A8/W8A8 path); these are left as the export sets them.

Every method runs ``Llm.forward`` (the decoder with its KV cache): ``logits`` with the
``all_logits`` setting (one forward over the whole sequence returns ``[1, T, vocab]``), ``greedy``
and ``bench`` as a prefill forward then one forward per generated token, argmax on the host.
(``Llm.generate(ids)`` of the Python wrapper returns []; ``_c_obj.generate(ids, n)`` works but
reading the context after it crashes MNN 3.6.1, so timings are taken here.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np

__all__ = ["MnnLlm", "bench_in_subprocess"]


class MnnLlm:
    """``MNN.llm`` on an export directory, with ``threads`` CPU threads."""

    def __init__(self, export_dir, threads: int = 1, config: Optional[dict] = None):
        try:
            import MNN.llm as mnn_llm  # noqa: PLC0415
        except ImportError as e:
            raise ImportError("MNN.llm is not available: pip install MNN==3.6.1") from e
        d = Path(export_dir)
        cfg_path = d / "config.json"
        if not cfg_path.is_file():
            raise ValueError(f"{cfg_path}: missing (not an MNN LLM export)")
        self.export_dir = d
        self.threads = int(threads)
        self._llm = mnn_llm.create(str(cfg_path))
        settings = {"thread_num": self.threads, "all_logits": False, **(config or {})}
        self._llm.set_config(settings)
        self._all_logits = bool(settings["all_logits"])
        t0 = time.perf_counter()
        self._llm.load()
        self.load_s = time.perf_counter() - t0
        self.config = json.loads(self._llm._c_obj.dump_config())

    # -- helpers ---------------------------------------------------------------------------------
    def _set_all_logits(self, on: bool) -> None:
        if self._all_logits != on:
            self._llm.set_config({"all_logits": on})
            self._all_logits = on

    def _forward(self, ids: Sequence[int]) -> np.ndarray:
        out = self._llm.forward([int(i) for i in ids])
        logits = np.array(out.read(), dtype=np.float32)
        return logits.reshape(-1, logits.shape[-1])

    def reset(self) -> None:
        """Forget the KV cache (the next forward starts at position 0)."""
        self._llm.reset()

    # -- API -------------------------------------------------------------------------------------
    def encode(self, text: str) -> List[int]:
        """Token ids of ``text`` by MNN's tokenizer (no chat template)."""
        return list(self._llm.tokenizer_encode(text))

    def decode(self, token: int) -> str:
        return self._llm.tokenizer_decode(int(token))

    def logits(self, ids: Sequence[int]) -> np.ndarray:
        """Teacher-forced logits, float32 ``[len(ids), vocab]``: position i scores token i + 1.

        One forward over the whole sequence from an empty cache, with ``all_logits``."""
        if len(ids) == 0:
            raise ValueError("logits of an empty sequence")
        self.reset()
        self._set_all_logits(True)
        try:
            out = self._forward(ids)
        finally:
            self.reset()
        if out.shape[0] != len(ids):
            raise RuntimeError(f"MNN.llm returned logits for {out.shape[0]} positions, expected {len(ids)}")
        return out

    def greedy(self, ids: Sequence[int], n: int, stop_ids: Sequence[int] = ()) -> List[int]:
        """``n`` tokens by argmax after the prompt ``ids`` (stops early at a token of ``stop_ids``)."""
        return self._generate(ids, n, stop_ids)[0]

    def _generate(self, ids, n, stop_ids=()):
        if len(ids) == 0:
            raise ValueError("an empty prompt")
        if n <= 0:
            return [], 0.0, 0.0
        self.reset()
        self._set_all_logits(False)
        stop = set(int(s) for s in stop_ids)
        t0 = time.perf_counter()
        tok = int(np.argmax(self._forward(ids)[-1]))
        t1 = time.perf_counter()
        out = []
        for _ in range(n):
            out.append(tok)
            if tok in stop or len(out) == n:
                break
            tok = int(np.argmax(self._forward([tok])[-1]))
        t2 = time.perf_counter()
        self.reset()
        return out, t1 - t0, t2 - t1

    def bench(self, prompt_ids: Sequence[int], n_decode: int, warmup: bool = True) -> Dict[str, float]:
        """Prefill of ``prompt_ids`` and ``n_decode`` greedy decode steps, timed.

        Returns prefill_tok_s, decode_tok_s (decode steps after the first token, which the
        prefill yields), prefill_s, decode_s, n_prompt, n_decode, tokens (the greedy tokens)."""
        if warmup:
            self._generate(prompt_ids[: min(len(prompt_ids), 8)], 2)
        tokens, prefill_s, decode_s = self._generate(prompt_ids, n_decode + 1)
        steps = len(tokens) - 1
        return {
            "prefill_tok_s": len(prompt_ids) / prefill_s if prefill_s > 0 else float("inf"),
            "decode_tok_s": steps / decode_s if steps and decode_s > 0 else float("nan"),
            "prefill_s": prefill_s, "decode_s": decode_s,
            "n_prompt": len(prompt_ids), "n_decode": steps, "tokens": tokens[:n_decode],
            "threads": self.threads, "load_s": self.load_s,
        }


_CHILD = r"""
import json, sys
from qlinear.llm.peers.mnn_llm import MnnLlm
args = json.loads(sys.argv[1])
eng = MnnLlm(args["export_dir"], threads=args["threads"])
res = eng.bench(args["prompt_ids"], args["n_decode"])
from qlinear.llm.runtime.stats import peak_rss_mb
res["peak_rss_mb"] = peak_rss_mb()
sys.stdout.write("\n@@RESULT@@" + json.dumps(res) + "\n")
"""


def bench_in_subprocess(export_dir, prompt_ids: Sequence[int], n_decode: int, threads: int = 1,
                        timeout: float = 1800) -> Dict[str, float]:
    """``MnnLlm(export_dir, threads).bench(...)`` in a fresh Python process, so that its peak RSS
    (``peak_rss_mb``, the child's VmHWM) is MNN's alone."""
    args = json.dumps({"export_dir": str(export_dir), "threads": int(threads),
                       "prompt_ids": [int(i) for i in prompt_ids], "n_decode": int(n_decode)})
    proc = subprocess.run([sys.executable, "-c", _CHILD, args], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, errors="replace", timeout=timeout,
                          env=dict(os.environ))
    marker = "@@RESULT@@"
    if proc.returncode != 0 or marker not in proc.stdout:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-10:])
        raise RuntimeError(f"MNN.llm benchmark failed (exit {proc.returncode}): {tail}")
    return json.loads(proc.stdout.rsplit(marker, 1)[1].strip().splitlines()[0])

