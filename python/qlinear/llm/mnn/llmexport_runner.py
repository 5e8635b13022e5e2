"""Building an export: running ``llmexport`` (a separate PyPI package) on a Hugging Face
checkpoint, in a subprocess, with MNN's compiled converter behind the name ``MNN.tools``."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


_BOOTSTRAP = r"""
import os, sys, types
import _tools
import MNN
# llmexport converts through `MNN.tools.mnnconvert`; importing the real `MNN.tools` installs
# packages and sends usage logs. Put the compiled converter behind that name instead.
pkg = types.ModuleType("MNN.tools")
pkg.__path__ = []
conv = types.ModuleType("MNN.tools.mnnconvert")
conv.convert = _tools.mnnconvert
def _main():
    _tools.mnnconvert(list(sys.argv))
    return 0
conv.main = _main
pkg.mnnconvert = conv
sys.modules["MNN.tools"] = pkg
sys.modules["MNN.tools.mnnconvert"] = conv
MNN.tools = pkg
script = sys.argv[1]
sys.path.insert(0, os.path.dirname(script))
sys.argv = [script] + sys.argv[2:]
with open(script, encoding="utf-8") as fh:
    code = compile(fh.read(), script, "exec")
exec(code, {"__name__": "__main__", "__file__": script, "__builtins__": __builtins__})
"""


def llmexport_script() -> Path:
    """Path of llmexport's ``llmexport.py`` (the package's console script does not run)."""
    spec = importlib.util.find_spec("llmexport")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("llmexport is not installed: pip install --no-deps llmexport==0.0.5 "
                          "(with transformers>=4.56,<5, onnx, onnxslim, safetensors, sentencepiece, "
                          "yaspin, termcolor)")
    script = Path(list(spec.submodule_search_locations)[0]) / "llmexport.py"
    if not script.is_file():
        raise ImportError(f"llmexport is installed but {script} is missing")
    return script


def export_with_llmexport(hf_dir, out_dir, bits: int = 4, block: int = 64, symmetric: bool = False,
                          keep_onnx: bool = False, timeout: float = 1800) -> Path:
    """Export a Hugging Face checkpoint directory to an MNN LLM export with llmexport.

    ``bits`` 4 or 8 (16: fp16 weights); ``block`` the quantization block (0: per channel; llmexport
    halves it until it divides K). Runs in a subprocess; MNN's converter is reached through its
    compiled module, never through ``MNN.tools``. Returns ``out_dir``."""
    script = llmexport_script()
    if importlib.util.find_spec("_tools") is None:
        raise ImportError("llmexport needs MNN's converter module `_tools` (pip install MNN==3.6.1)")
    hf_dir, out_dir = Path(hf_dir).resolve(), Path(out_dir).resolve()
    if not (hf_dir / "config.json").is_file():
        raise ValueError(f"{hf_dir}: not a Hugging Face checkpoint (no config.json)")
    with tempfile.TemporaryDirectory(prefix="qlinear-llmexport-") as tmp:
        args = [sys.executable, "-c", _BOOTSTRAP, str(script), "--path", str(hf_dir),
                "--export", "mnn", "--dst_path", str(out_dir), "--quant_bit", str(bits),
                "--quant_block", str(block), "--mnnconvert", str(Path(tmp) / "no-such-binary")]
        if symmetric:
            args.append("--sym")
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                   TOKENIZERS_PARALLELISM="false", PYTHONWARNINGS="ignore")
        log = Path(tmp) / "export.log"
        with open(log, "w") as fh:
            proc = subprocess.run(args, cwd=tmp, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                  timeout=timeout)
        text = log.read_text(errors="replace")
    if proc.returncode != 0 or not (out_dir / "llm.mnn").is_file() or not (out_dir / "llm.mnn.weight").is_file():
        tail = "\n".join(text.strip().splitlines()[-15:])
        raise RuntimeError(f"llmexport failed for {hf_dir} (exit {proc.returncode}):\n{tail}")
    if not keep_onnx:
        shutil.rmtree(out_dir / "onnx", ignore_errors=True)
    return out_dir
