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
        [--export ~/.cache/qlinear-bench/qwen2.5-0.5b-v4096-mnn-int4b64] [--tokens 2 10] [--profile]

--profile also attributes each engine's per-token instructions to the files they run in and, for
the file with the most, to its functions (the plugin's per-block counts, each block counted for the
function its first instruction is in: approximate at function edges).
"""

from __future__ import annotations

import argparse
import bisect
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
if len(sys.argv) > 4:  # --profile: where the libraries were mapped
    import shutil
    shutil.copy("/proc/self/maps", sys.argv[4])
'''


def build_plugin(out: Path) -> Path:
    so = out / "libqemu_insn_count.so"
    src = REPO / "tools" / "qemu_insn_count.c"
    if not so.exists() or so.stat().st_mtime < src.stat().st_mtime:
        subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(so), str(src)], check=True)
    return so


def count(plugin, rootfs, pythonpath, cpu, engine, export, n, profile: Path | None = None) -> int:
    """Instructions of one run; with ``profile``, the plugin's per-block counts are written there and
    the guest's memory map beside it (profile + ".maps")."""
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "LD_LIBRARY_PATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(QEMU_LD_PREFIX=str(rootfs), QEMU_CPU=cpu, PYTHONPATH=pythonpath, OMP_NUM_THREADS="1")
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(GUEST)
    plugin_arg = str(plugin) + (f",out={profile}" if profile else "")
    extra = [f"{profile}.maps"] if profile else []
    try:
        r = subprocess.run(["qemu-aarch64", "-plugin", plugin_arg, str(rootfs / "usr/bin/python3"), f.name,
                            engine, str(export), str(n)] + extra, env=env, capture_output=True, text=True)
    finally:
        os.unlink(f.name)
    m = re.search(r"^insns (\d+)$", r.stderr, re.M)
    if r.returncode != 0 or not m:
        sys.exit(f"{engine} n={n} failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")
    return int(m.group(1))


def attribute(profile: Path) -> dict[tuple[str, int], int]:
    """Instructions per (mapped file, offset in it of a translated block's first instruction)."""
    regions = []
    for line in open(f"{profile}.maps"):
        p = line.split()
        lo, hi = (int(x, 16) for x in p[0].split("-"))
        regions.append((lo, hi, int(p[2], 16), p[5] if len(p) > 5 else "[anon]"))
    regions.sort()
    starts = [r[0] for r in regions]
    base = {}  # a file's load address: where its offset 0 is mapped
    for lo, _, off, name in regions:
        if off == 0:
            base.setdefault(name, lo)
    out: dict[tuple[str, int], int] = {}
    for line in open(profile):
        a, insns, execs = line.split()
        addr = int(a, 16)
        i = bisect.bisect_right(starts, addr) - 1
        name, at = "[unmapped]", addr
        if i >= 0 and addr < regions[i][1]:
            name = regions[i][3]
            at = addr - base.get(name, regions[i][0] - regions[i][2])
        out[(name, at)] = out.get((name, at), 0) + int(insns) * int(execs)
    return out


def functions(path: str) -> tuple[list[int], list[str]]:
    """Start addresses (sorted) and names of a shared object's FUNC symbols (hand-written assembly's
    local labels are NOTYPE, so a kernel's labels count as its own)."""
    text = subprocess.run(["aarch64-linux-gnu-readelf", "-sW", "--demangle", path], capture_output=True, text=True).stdout
    syms = sorted({(int(m.group(1), 16), m.group(2)) for m in
                   re.finditer(r"^\s*\d+:\s+([0-9a-f]+)\s+\d+\s+FUNC\s+\w+\s+\w+\s+\d+\s+(.+)$", text, re.M)})
    return [a for a, _ in syms], [n for _, n in syms]


def report_profile(engine: str, per_token: dict[tuple[str, int], float], symbol_files: dict[str, str]) -> None:
    by_file: dict[str, float] = {}
    for (name, _), v in per_token.items():
        by_file[name] = by_file.get(name, 0) + v
    total = sum(by_file.values())
    print(f"  {engine}: {total:,.0f} per decode token; by file:")
    for name, v in sorted(by_file.items(), key=lambda kv: -kv[1])[:6]:
        print(f"    {v / 1e6:8.2f} M  {os.path.basename(name)}")
    main_file = max(by_file, key=by_file.get)
    sym_path = symbol_files.get(os.path.basename(main_file), main_file)
    starts, names = functions(sym_path)
    if not starts:
        return
    by_fn: dict[str, float] = {}
    for (name, at), v in per_token.items():
        if name == main_file:
            i = bisect.bisect_right(starts, at) - 1
            fn = names[i] if i >= 0 else "?"
            by_fn[fn] = by_fn.get(fn, 0) + v
    print(f"  {os.path.basename(main_file)} by function (a translated block counts for the function its first instruction is in):")
    for fn, v in sorted(by_fn.items(), key=lambda kv: -kv[1])[:12]:
        print(f"    {v / 1e6:8.2f} M  {fn[:120]}")


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
    ap.add_argument("--profile", action="store_true",
                    help="also attribute the per-token instructions to files and functions (qlinear's _core: "
                         "symbols from the build tree's unstripped link, as bench/arm_kernels.py makes it)")
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
    symbol_files = {}
    if args.profile:
        sys.path.insert(0, str(REPO / "bench"))
        from arm_kernels import unstripped_core
        core = unstripped_core(str(cache / "build"))
        if core:
            symbol_files = {p.name: core for p in (stage / "qlinear").glob("_core*.so")}
    for engine in args.engines:
        prof = [work / f"profile-{engine}-{args.cpu}-{n}.txt" if args.profile else None for n in (n1, n2)]
        c1 = count(plugin, rootfs, pythonpath, args.cpu, engine, args.export, n1, prof[0])
        c2 = count(plugin, rootfs, pythonpath, args.cpu, engine, args.export, n2, prof[1])
        print(f"{engine:8s} {n1} tokens: {c1} insns, {n2} tokens: {c2} insns, "
              f"per decode token: {(c2 - c1) / (n2 - n1):,.0f}")
        if args.profile:
            a1, a2 = attribute(prof[0]), attribute(prof[1])
            per_token = {k: (a2.get(k, 0) - a1.get(k, 0)) / (n2 - n1) for k in set(a1) | set(a2)}
            report_profile(engine, per_token, symbol_files)


if __name__ == "__main__":
    main()
