"""Dynamic instructions per decode token under qemu-user: qlinear against MNN.llm on the same export.

An honest count without ARM hardware: qemu-aarch64 runs the arm64 Python of tools/test-aarch64.sh's
root filesystem with a TCG plugin (tools/qemu_insn_count.c, built here with the host's gcc) that adds
each translated block's instruction count to a counter every time the block runs. Each engine is
run twice in a fresh process, decoding N1 and N2 tokens after the same 8-token prompt, one thread;
instructions per token = (count(N2) - count(N1)) / (N2 - N1), so loading, prefill and start-up
cancel out. A "token" is one decode step as bench/test_llm.py times it: the forward of one token
and the argmax of its logits (Python glue included, the same for both engines). Instruction counts
are not time: an SDOT counts one like an ADD, and memory stalls are not seen.

Prerequisites: tools/test-aarch64.sh run once (its cache: the arm64 root filesystem and the
cross-built module, staged in CACHE/stage); the bench model's MNN export, made on x86 by
bench/test_llm.py's _export() (torch, transformers, MNN, llmexport); MNN 3.6.1's aarch64 wheel
(pip download MNN==3.6.1 --only-binary=:all: --platform manylinux2014_aarch64 --python-version 311
--no-deps -d DIR) and the aarch64 wheel of tokenizers that qlinear.llm reads MNN's tokenizer with
(the same pip download, package tokenizers), both unpacked here for the guest Python (never
installed on the host).

    python bench/insn_per_token.py --mnn-wheel DIR/mnn-3.6.1-cp311-...aarch64.whl \
        --tokenizers-wheel DIR/tokenizers-...aarch64.whl [--cpu neoverse-n1]
        [--export ~/.cache/qlinear-bench/qwen2.5-0.5b-v4096-mnn-int4b64] [--tokens 2 10]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

GUEST = r'''
import sys, numpy as np
engine, export, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
prompt = [int(t) for t in np.random.default_rng(0).integers(0, 4096, 8)]
if engine == "qlinear":
    import qlinear
    from qlinear import llm
    qlinear.set_num_threads(1)
    model = llm.load(export, max_context=64, progress=False)
    model.reset()
    tok = int(np.argmax(model.prefill(prompt)))
    for _ in range(n):
        tok = int(np.argmax(model._forward([tok], model.cache.length)[0]))
else:
    from qlinear.llm.peers.mnn_llm import MnnLlm
    m = MnnLlm(export, threads=1)
    m.reset()
    tok = int(np.argmax(m._forward(prompt)[-1]))
    for _ in range(n):
        tok = int(np.argmax(m._forward([tok])[-1]))
print("last token", tok)
'''


def build_plugin(out: Path) -> Path:
    so = out / "libqemu_insn_count.so"
    src = REPO / "tools" / "qemu_insn_count.c"
    if not so.exists() or so.stat().st_mtime < src.stat().st_mtime:
        subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(so), str(src)], check=True)
    return so


def count(plugin, rootfs, pythonpath, cpu, engine, export, n) -> int:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "LD_LIBRARY_PATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(QEMU_LD_PREFIX=str(rootfs), QEMU_CPU=cpu, PYTHONPATH=pythonpath, OMP_NUM_THREADS="1")
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(GUEST)
    try:
        r = subprocess.run(["qemu-aarch64", "-plugin", str(plugin), str(rootfs / "usr/bin/python3"), f.name,
                            engine, str(export), str(n)], env=env, capture_output=True, text=True)
    finally:
        os.unlink(f.name)
    m = re.search(r"^insns (\d+)$", r.stderr, re.M)
    if r.returncode != 0 or not m:
        sys.exit(f"{engine} n={n} failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")
    return int(m.group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cache = Path(os.environ.get("QLINEAR_AARCH64_CACHE", Path.home() / ".cache" / "qlinear-aarch64"))
    models = Path(os.environ.get("QLINEAR_BENCH_MODELS", Path.home() / ".cache" / "qlinear-bench"))
    ap.add_argument("--mnn-wheel", required=True)
    ap.add_argument("--tokenizers-wheel", required=True)
    ap.add_argument("--export", default=str(models / "qwen2.5-0.5b-v4096-mnn-int4b64"))
    ap.add_argument("--cpu", default="neoverse-n1", help="qemu CPU model (default neoverse-n1: dotprod + fp16)")
    ap.add_argument("--tokens", nargs=2, type=int, default=[2, 10])
    ap.add_argument("--engines", nargs="+", default=["qlinear", "mnn"])
    args = ap.parse_args()

    rootfs = next(cache.glob("rootfs-*"))
    stage = cache / "stage"
    if not (stage / "qlinear").is_dir():
        sys.exit(f"{stage}: run tools/test-aarch64.sh first")
    work = cache / "insn-count"
    work.mkdir(exist_ok=True)
    mnn_dir = work / ("mnn-" + Path(args.mnn_wheel).name.split("-")[1])
    if not (mnn_dir / "MNN").is_dir():
        with zipfile.ZipFile(args.mnn_wheel) as z:
            z.extractall(mnn_dir)
    tok_dir = work / ("tokenizers-" + Path(args.tokenizers_wheel).name.split("-")[1])
    if not (tok_dir / "tokenizers").is_dir():
        with zipfile.ZipFile(args.tokenizers_wheel) as z:
            z.extractall(tok_dir)
    plugin = build_plugin(work)
    pythonpath = f"{stage}:{mnn_dir}:{tok_dir}"
    n1, n2 = args.tokens
    print(f"qemu-aarch64 -cpu {args.cpu}, one thread, {args.export}")
    for engine in args.engines:
        c1 = count(plugin, rootfs, pythonpath, args.cpu, engine, args.export, n1)
        c2 = count(plugin, rootfs, pythonpath, args.cpu, engine, args.export, n2)
        print(f"{engine:8s} {n1} tokens: {c1} insns, {n2} tokens: {c2} insns, "
              f"per decode token: {(c2 - c1) / (n2 - n1):,.0f}")


if __name__ == "__main__":
    main()
