"""llama.cpp as a peer on the same GGUF file (``qlinear-llm bench FILE.gguf --vs llamacpp``).

Speed and peak RSS come from llama.cpp's own ``llama-bench`` tool, run as a child process (its
peak resident set, VmHWM, read from /proc while it runs); the CPU path it took (the repacked
kernels, e.g. ``q4_0_8x8``) from its verbose log. Greedy tokens come from llama.cpp's Python
bindings (``llama-cpp-python``) when they are installed, in a child process too, so that neither
engine's memory counts against the other.

llama.cpp is not a dependency: ``bench/llamacpp_vs.py`` builds its tools from the
``llama-cpp-python`` source distribution into ``~/.cache/qlinear-llamacpp`` (or
``$QLINEAR_LLAMACPP_DIR``), where they are found; ``--llamacpp DIR`` or ``$QLINEAR_LLAMACPP_BIN``
name another build's ``bin`` folder.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Optional, Sequence

BUILD_HINT = ("build it with `python bench/llamacpp_vs.py --build` (from the qlinear source tree) or pass "
              "--llamacpp DIR, a llama.cpp build's bin folder")


def default_dirs() -> list:
    """Where llama.cpp's tools are looked for, in order."""
    dirs = [os.environ.get("QLINEAR_LLAMACPP_BIN")]
    cache = Path(os.environ.get("QLINEAR_LLAMACPP_DIR", Path.home() / ".cache" / "qlinear-llamacpp"))
    dirs.append(str(cache / "build" / "bin"))
    return [Path(d) for d in dirs if d]


def find_tool(name: str, where: Optional[str] = None) -> Path:
    """The path of llama.cpp's tool ``name`` (``llama-bench``, ...), else a ValueError saying how
    to get it."""
    dirs = [Path(where)] if where else default_dirs()
    for d in dirs:
        if (d / name).is_file() and os.access(d / name, os.X_OK):
            return d / name
    found = None if where else shutil.which(name)
    if found:
        return Path(found)
    raise ValueError(f"llama.cpp's {name} was not found in {', '.join(map(str, dirs))} "
                     f"{'' if where else 'or on PATH'}; {BUILD_HINT}")


def _run_measured(cmd: Sequence[str]) -> tuple:
    """Run ``cmd``; (stdout, stderr, the child's peak RSS in MB). The peak is the child's own
    VmHWM, read while it runs: the resource usage wait4 returns would also count the image of
    this process that the child was forked from (Linux keeps the larger of the two across exec)."""
    # (its log may print a token's bytes cut inside a UTF-8 character: replaced, not fatal)
    with tempfile.TemporaryFile("w+", errors="replace") as out, tempfile.TemporaryFile("w+", errors="replace") as err:
        proc = subprocess.Popen(list(cmd), stdout=out, stderr=err, text=True)
        peak_kb = 0
        while proc.poll() is None:
            peak_kb = max(peak_kb, _vm_hwm_kb(proc.pid))
            time.sleep(0.01)
        out.seek(0), err.seek(0)
        stdout, stderr = out.read(), err.read()
    if proc.returncode != 0:
        raise ValueError(f"{Path(cmd[0]).name} failed (exit {proc.returncode}): {stderr.strip()[-400:]}")
    return stdout, stderr, peak_kb / 1024


def _vm_hwm_kb(pid: int) -> int:
    """A live process's peak resident set (VmHWM, KB); 0 once it has exited."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def bench(path, prompt_tokens: int, decode_tokens: int, threads: int, repeats: int = 1,
          where: Optional[str] = None, extra_args=()) -> dict:
    """``llama-bench -p P -n N -t T -r R`` on ``path``: prefill and decode tok/s (llama-bench's
    averages), its peak RSS and the CPU path it took. ``where``: the folder of the build's tools
    (llama.cpp's or a fork's, e.g. ik_llama.cpp's); ``extra_args``: more of its options (``-rtr 1``)."""
    tool = find_tool("llama-bench", where)
    out, err, rss = _run_measured([str(tool), "-m", str(path), "-p", str(prompt_tokens), "-n", str(decode_tokens),
                                   "-t", str(threads), "-r", str(repeats), "-o", "json", "-v", *extra_args])
    try:
        rows = json.loads(out)
    except json.JSONDecodeError as e:
        raise ValueError(f"llama-bench printed no JSON ({e}): {out[:200]!r}") from None
    row = {"engine": "llama.cpp", "threads": threads, "peak_rss_mb": rss}
    for r in rows:
        key = "prefill_tok_s" if r.get("n_prompt", 0) > 0 else "decode_tok_s"
        row[key] = float(r["avg_ts"])
        row["model_type"] = r.get("model_type", "")
        row["build"] = r.get("build_commit", "")
    row["cpu_path"] = cpu_path(err, rows[0] if rows else {})
    return row


def cpu_path(log: str, row: dict) -> str:
    """Which CPU kernels llama.cpp used, from llama-bench's verbose log: e.g. 'CPU, repacked
    q4_0_8x8 (168 tensors), others CPU_Mapped'."""
    repacked = Counter(re.findall(r"repack tensor \S+ with (\S+)", log))
    parts = [row.get("backends", "CPU") or "CPU"]
    if repacked:
        parts.append("repacked " + ", ".join(f"{k} ({n} tensors)" for k, n in repacked.most_common()))
    else:
        parts.append("no repacked tensors")
    return "; ".join(parts)


_GREEDY = r"""
import json, sys
import numpy as np
from llama_cpp import Llama
a = json.load(sys.stdin)
ll = Llama(model_path=a["path"], n_ctx=len(a["ids"]) + a["steps"] + 8, n_threads=a["threads"],
           n_batch=512, logits_all=True, verbose=False)
ll.eval(a["ids"])
out = []
for i in range(a["steps"]):
    token = int(np.argmax(ll.scores[ll.n_tokens - 1]))
    out.append(token)
    if i + 1 < a["steps"]:
        ll.eval([token])
print(json.dumps(out))
"""


def has_bindings() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def greedy_tokens(path, prompt_ids: Sequence[int], steps: int, threads: int) -> Optional[list]:
    """The first ``steps`` greedy tokens after ``prompt_ids`` through llama.cpp's Python
    bindings (None when they are not installed)."""
    if not has_bindings():
        return None
    r = subprocess.run([sys.executable, "-c", _GREEDY], capture_output=True, text=True,
                       input=json.dumps({"path": str(path), "ids": [int(i) for i in prompt_ids],
                                         "steps": int(steps), "threads": int(threads)}))
    if r.returncode != 0:
        raise ValueError(f"llama-cpp-python failed on {path}: {r.stderr.strip()[-400:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])
