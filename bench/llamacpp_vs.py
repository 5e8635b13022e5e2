"""qlinear.llm and llama.cpp side by side on the same GGUF file: prefill (64-token prompt) and
decode (32 tokens) tok/s at 1 and 2 threads, in interleaved rounds.

llama.cpp is built here from the `llama-cpp-python` source distribution on PyPI (it vendors
llama.cpp), CPU only, native flags, into a cache folder outside the repository
($QLINEAR_LLAMACPP_DIR, default ~/.cache/qlinear-llamacpp): the `llama-bench` and `llama-quantize`
tools only (~10 min on 2 cores, once). GGUF files are made from the synthetic Qwen2.5-0.5B-shaped
checkpoint of bench/test_llm.py with llama.cpp's own `convert_hf_to_gguf.py` (to BF16 and Q8_0;
the synthetic tokenizer's pre-tokenizer is not in the script's list of known ones and is taken as
qwen2's) and `llama-quantize` (Q4_0, Q4_K_M).

    python bench/llamacpp_vs.py [--quants Q4_0 Q8_0 Q4_K_M] [--threads 1 2] [--rounds 3]
    python bench/llamacpp_vs.py --logits [--quants ...]    # needs llama-cpp-python installed

--logits compares teacher-forced logits over 160 positions of a random prompt: llama.cpp through
its Python bindings (`pip install llama_cpp_python-*.tar.gz` from the cache folder) against
qlinear.llm on the same file, per position cosine and top-1 agreement.

llama.cpp's figures are `llama-bench -p 64 -n 32` (its prompt of random tokens, then generation
from it); qlinear's are the same token counts through `qlinear.llm.load(FILE.gguf)` (W4A8 for the
4-bit files, W8A8 for Q8_0: the file's codes moved, not re-rounded, where the formats agree).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

CACHE = Path(os.environ.get("QLINEAR_LLAMACPP_DIR", Path.home() / ".cache" / "qlinear-llamacpp"))
VERSION = "0.3.36"
SRC = CACHE / f"llama_cpp_python-{VERSION}" / "vendor" / "llama.cpp"
BUILD = CACHE / "build"
PROMPT, DECODE = 64, 32

_CONVERT_WRAPPER = '''
import sys
sys.path.insert(0, sys.argv.pop(1))
import convert_hf_to_gguf as c
from conversion import base
known = base.TextModel.get_vocab_base_pre
def pre(self, tokenizer):
    try:
        return known(self, tokenizer)
    except NotImplementedError:  # a synthetic tokenizer: take qwen2's pre-tokenizer
        return "qwen2"
base.TextModel.get_vocab_base_pre = pre
sys.argv[0] = "convert_hf_to_gguf.py"
c.main()
'''


def tool(name: str) -> Path:
    return BUILD / "bin" / name


def build() -> None:
    """Fetches the llama-cpp-python sdist and builds llama-bench and llama-quantize (once)."""
    if tool("llama-bench").exists() and tool("llama-quantize").exists():
        return
    CACHE.mkdir(parents=True, exist_ok=True)
    sdist = CACHE / f"llama_cpp_python-{VERSION}.tar.gz"
    if not sdist.exists():
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-build-isolation",
                        "--no-binary", "llama-cpp-python", f"llama-cpp-python=={VERSION}", "-d", str(CACHE)], check=True)
    if not SRC.exists():
        with tarfile.open(sdist) as t:
            t.extractall(CACHE, filter="data")
    subprocess.run(["cmake", "-S", str(SRC), "-B", str(BUILD), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                    "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
                    "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF"], check=True)
    subprocess.run(["cmake", "--build", str(BUILD), "-t", "llama-bench", "llama-quantize"], check=True)


def gguf_file(quant: str) -> Path:
    """The synthetic checkpoint as a GGUF file of the given type (made once)."""
    from test_llm import VOCAB, _checkpoint
    out = CACHE / f"qwen2.5-0.5b-v{VOCAB}-{quant}.gguf"
    if out.exists():
        return out
    env = dict(os.environ, PYTHONPATH=str(SRC / "gguf-py"))
    wrapper = CACHE / "convert_wrapper.py"
    wrapper.write_text(_CONVERT_WRAPPER)
    if quant in ("Q8_0", "BF16"):
        subprocess.run([sys.executable, str(wrapper), str(SRC), str(_checkpoint()), "--outtype", quant.lower(),
                        "--outfile", str(out)], check=True, env=env)
    else:
        subprocess.run([str(tool("llama-quantize")), str(gguf_file("BF16")), str(out), quant], check=True)
    return out


def llamacpp_speed(path: Path, threads: int) -> dict:
    """llama-bench's pp64 and tg32 tok/s (one repetition)."""
    r = subprocess.run([str(tool("llama-bench")), "-m", str(path), "-p", str(PROMPT), "-n", str(DECODE),
                        "-t", str(threads), "-r", "1", "-o", "json"], check=True, capture_output=True, text=True)
    rows = json.loads(r.stdout)
    out = {}
    for row in rows:
        phase = "prefill" if row["n_prompt"] > 0 else "decode"
        out[phase] = float(row["avg_ts"])
        out["backend"] = f"{row.get('backends', '')} {row.get('cpu_info', '')}".strip()
    return out


class Qlinear:
    def __init__(self, path: Path, threads: int):
        import qlinear
        from qlinear import llm
        qlinear.set_num_threads(threads)
        self.threads = threads
        self.model = llm.load(path, max_context=PROMPT + DECODE + 8, progress=False)
        self.ids = [int(t) for t in np.random.default_rng(0).integers(0, 4096, PROMPT)]

    def speed(self) -> dict:
        import qlinear
        qlinear.set_num_threads(self.threads)
        m = self.model
        m.reset()
        t0 = time.perf_counter()
        token = int(np.argmax(m.prefill(self.ids)))
        t1 = time.perf_counter()
        for i in range(DECODE):
            token = int(np.argmax(m._forward([token], PROMPT + i)[0]))
        t2 = time.perf_counter()
        return {"prefill": PROMPT / (t1 - t0), "decode": DECODE / (t2 - t1)}


def compare_logits(quants, positions: int = 160) -> None:
    from llama_cpp import Llama
    from qlinear import llm
    ids = [int(t) for t in np.random.default_rng(1).integers(0, 4096, positions)]
    print(f"teacher-forced logits over {positions} positions, qlinear (W4A8 / W8A8) vs llama.cpp on the same file")
    print("| file | cosine mean | cosine min | top-1 agreement |")
    print("|---|---|---|---|")
    for quant in quants:
        path = gguf_file(quant)
        ref = Llama(model_path=str(path), n_ctx=positions + 8, logits_all=True, n_threads=2, verbose=False)
        ref.eval(ids)
        theirs = np.array(ref.scores[:positions], dtype=np.float64)
        del ref
        ours = llm.load(path, max_context=positions + 8, progress=False).logits(ids).astype(np.float64)
        cos = (ours * theirs).sum(1) / (np.linalg.norm(ours, axis=1) * np.linalg.norm(theirs, axis=1))
        top1 = float(np.mean(ours.argmax(1) == theirs.argmax(1)))
        print(f"| {quant} | {cos.mean():.5f} | {cos.min():.5f} | {top1:.1%} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quants", nargs="+", default=["Q4_0", "Q8_0"])
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--logits", action="store_true", help="compare logits instead of speed")
    a = ap.parse_args()
    build()
    if a.logits:
        compare_logits(a.quants)
        return
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    import qlinear
    print(f"{cpu}, qlinear level {qlinear.cpu_info()['active_isa']}; {PROMPT}-token prompt, {DECODE} decoded tokens; "
          f"medians (best) of {a.rounds} interleaved rounds, tok/s")
    print("| file | phase | threads | qlinear | llama.cpp | qlinear / llama.cpp |")
    print("|---|---|---|---|---|---|")
    backend = ""
    for quant in a.quants:
        path = gguf_file(quant)
        for t in a.threads:
            q = Qlinear(path, t)
            q.speed()  # warm-up: builds the decode step, maps the weights
            runs = {"qlinear": [], "llama.cpp": []}
            for _ in range(a.rounds):
                runs["qlinear"].append(q.speed())
                lc = llamacpp_speed(path, t)
                backend = lc.pop("backend")
                runs["llama.cpp"].append(lc)
            for phase in ("prefill", "decode"):
                v = {e: [r[phase] for r in rs] for e, rs in runs.items()}
                med = {e: float(np.median(x)) for e, x in v.items()}
                print(f"| {quant} | {phase} | {t} | {med['qlinear']:.1f} ({max(v['qlinear']):.1f}) | "
                      f"{med['llama.cpp']:.1f} ({max(v['llama.cpp']):.1f}) | {med['qlinear'] / med['llama.cpp']:.2f}x |",
                      flush=True)
            del q
    print(f"llama.cpp backend: {backend}")


if __name__ == "__main__":
    main()
