"""Every ```python block of README.md runs as written (each in a fresh namespace, in a temporary
directory), so that the README cannot drift from the API."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```", README.read_text(encoding="utf-8"), re.S | re.M)


def _needs(code: str) -> list:
    mods = []
    if "qlinear.torch" in code or re.search(r"^import torch|^from torch", code, re.M):
        mods.append("torch")
    if "qlinear import llm" in code or "qlinear.llm" in code:
        mods += ["tokenizers", "jinja2", "torch", "transformers"]
    return mods


def test_readme_has_python_blocks():
    assert len(BLOCKS) >= 3


@pytest.mark.parametrize("index", range(len(BLOCKS)), ids=lambda i: f"block{i + 1}")
def test_readme_python_block_runs(index, tmp_path, monkeypatch):
    code = BLOCKS[index]
    for mod in _needs(code):
        pytest.importorskip(mod)
    monkeypatch.chdir(tmp_path)
    import qlinear
    threads, isa = qlinear.get_num_threads(), qlinear.cpu_info()["active_isa"]
    try:
        exec(compile(code, f"README.md python block {index + 1}", "exec"), {"__name__": "readme"})
    finally:  # blocks may switch these
        qlinear.set_num_threads(threads)
        qlinear.set_isa(isa)
