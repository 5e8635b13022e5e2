"""memory="flash" under a real memory limit that counts the page cache (a child memory cgroup;
needs root): plain mmap loading vs flash (dense, unbundled file) vs flash with the bundled file,
on a Qwen2.5-1.5B-shaped int4 model whose file is >= 2x the limit.

    python bench/flash.py                     # builds the model under --dir the first time
    python bench/flash.py --limit-mb 600 --decode-tokens 16 --threads 2
    python bench/flash.py --no-budget         # flash streams every FFN layer (no memory_budget_mb)
    python bench/flash.py --read-ahead-kb 128 # the device's readahead set for the runs (then restored)

Per run (a fresh process inside the cgroup, the model file's pages dropped from the page cache
first: posix_fadvise DONTNEED on the file, or with --drop-caches `echo 3 > drop_caches`):
decode tok/s, bytes read from the disk per decoded token (/proc/self/io read_bytes), the
process's peak RSS and the cgroup's peak (RSS + page cache). Besides: the file's sequential
read throughput (cache dropped; the flash reader's reads), and the cost model's bound.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

MODES = {"mmap": ("q4", "low"), "flash": ("q4", "flash"), "flash+bundles": ("q4-flash", "flash")}


def read_bytes() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("read_bytes:"):
            return int(line.split()[1])
    return 0


def worker(args) -> None:
    """One run, inside the cgroup: load, prefill, decode; JSON on stdout."""
    from qlinear import llm

    sub, memory = MODES[args.worker]
    budget = {"memory_budget_mb": args.budget_mb} if memory == "flash" and args.budget_mb else {}
    model = llm.load(Path(args.dir) / sub, memory=memory, threads=args.threads,
                     max_context=args.prompt_tokens + args.decode_tokens + 8, progress=False, **budget)
    ids = list(range(100, 100 + args.prompt_tokens))
    model.generate_ids(ids, 1, stop_ids=())        # prefill (and warm up)
    flash = getattr(model, "flash", None)
    f0 = flash.bytes_read if flash else 0
    r0, t0 = read_bytes(), time.perf_counter()
    logits = model.prefill(ids)
    token = int(logits.argmax())
    for _ in range(args.decode_tokens):
        token = int(model._forward([token], model.cache.length)[0].argmax())
    dt = time.perf_counter() - t0
    # the prefill's reads: one more forward of the prompt
    r1, f1 = read_bytes(), flash.bytes_read if flash else 0
    model.reset()
    model.prefill(ids)
    prefill_bytes = read_bytes() - r1
    ffn_prefill = (flash.bytes_read if flash else 0) - f1
    print(json.dumps({"tok_s": args.decode_tokens / dt, "decode_s": dt, "last_token": token,
                      "held_layers": len(model.info.get("flash_pinned_layers", [])),
                      "bytes_per_token": (r1 - r0 - prefill_bytes) / args.decode_tokens,
                      "ffn_bytes_per_token": (f1 - f0 - ffn_prefill) / args.decode_tokens,
                      "peak_rss_mb": model.stats.peak_rss_mb}))
    model.close()


def drop_cache(path: Path, everything: bool) -> None:
    if everything:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3")
    else:
        from qlinear.llm.flash.cost import drop_file_cache
        drop_file_cache(path)


def warm_host_cache(path: Path) -> None:
    with open(path, "rb", buffering=0) as f:
        while f.read(16 << 20):
            pass


def build(d: Path, shape: str) -> None:
    from qlinear import llm
    from qlinear.llm.synthetic import make_checkpoint

    if not (d / "q4" / "model.qlinear").exists():
        ck = make_checkpoint(d / "ckpt", arch="qwen2", shape=shape, dtype="bfloat16", force=True)
        llm.convert(ck, d / "q4", bits=4, group_size=64, force=True)
        shutil.rmtree(ck)                       # 3 GB of bf16 weights: not needed any more
    if not (d / "q4-flash" / "model.qlinear").exists():
        llm.convert(d / "q4", d / "q4-flash", flash=True, force=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", default=os.path.expanduser("~/.cache/qlinear-flash"))
    p.add_argument("--shape", default="qwen2.5-1.5b")
    p.add_argument("--limit-mb", type=float, default=None, help="default: 45%% of the model file")
    p.add_argument("--prompt-tokens", type=int, default=8)
    p.add_argument("--decode-tokens", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--drop-caches", action="store_true", help="echo 3 > /proc/sys/vm/drop_caches before each run")
    p.add_argument("--read-ahead-kb", type=int, default=None,
                   help="set the model's block device's read_ahead_kb for the runs (restored after): "
                        "plain mmap's page faults read ahead by it; 128 is the kernel's default")
    p.add_argument("--no-budget", action="store_true",
                   help="flash modes without memory_budget_mb (every FFN layer streamed; by default the "
                        "limit is the budget, and its room holds FFN layers in memory)")
    p.add_argument("--budget-mb", type=float, default=None, help=argparse.SUPPRESS)
    p.add_argument("--worker", choices=list(MODES), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)

    from qlinear.llm.flash.cgroup import unavailable_reason

    d = Path(args.dir)
    build(d, args.shape)
    file = d / "q4" / "model.qlinear"
    size = file.stat().st_size
    limit = int(args.limit_mb * 2**20) if args.limit_mb else int(0.45 * size)
    why = unavailable_reason()
    if why:
        raise SystemExit(f"no memory limit can be set here: {why}")
    from qlinear.llm.flash.reader import read_ahead_path

    ra = read_ahead_path(file)
    ra = Path(ra) if ra else None
    ra_before = ra.read_text().strip() if ra else None
    if args.read_ahead_kb is not None:
        if ra is None:
            raise SystemExit(f"{file}: not on a block device whose read_ahead_kb can be set")
        ra.write_text(str(args.read_ahead_kb))
    try:
        run_modes(args, d, file, size, limit, ra)
    finally:
        if args.read_ahead_kb is not None:
            ra.write_text(ra_before)


def run_modes(args, d: Path, file: Path, size: int, limit: int, ra) -> None:
    from qlinear.llm.flash.cgroup import MemoryCgroup
    from qlinear.llm.flash.cost import describe, read_throughput
    from qlinear.llm.flash.reader import read_plan

    # A virtual machine's disk may be served from its host's page cache: here a file not read
    # for a while read at 73 MB/s, the next time at 1.7-2.3 GB/s. One pass over every model
    # file first, so that no mode pays the host's first reads.
    for mode in {MODES[m][0] for m in args.modes.split(",")}:
        warm_host_cache(d / mode / "model.qlinear")
    drop_cache(file, args.drop_caches)
    plan = read_plan(file, one_run=True)   # a converted file's FFNs are one run
    throughput = read_throughput(file, plan=plan)
    print(f"model file {size / 2**20:.0f} MB, limit {limit / 2**20:.0f} MB (RSS + page cache), "
          f"sequential read {throughput / 1e9:.2f} GB/s ({describe(plan)}, cache dropped), "
          f"the device's readahead {ra.read_text().strip() + ' KB' if ra else 'unknown'}")
    rows = {}
    for mode in args.modes.split(","):
        sub = d / MODES[mode][0] / "model.qlinear"
        drop_cache(sub, args.drop_caches)
        with MemoryCgroup(limit, name=f"qlinear-flash-{os.getpid()}-{mode.replace('+', '-')}") as cg:
            cmd = [sys.executable, __file__, "--worker", mode, "--dir", str(d), "--threads", str(args.threads),
                   "--prompt-tokens", str(args.prompt_tokens), "--decode-tokens", str(args.decode_tokens)]
            if not args.no_budget:
                cmd += ["--budget-mb", str(limit / 2**20)]
            r = cg.run(cmd, capture_output=True, text=True)
            if r.returncode:
                print(f"{mode}: exit {r.returncode} {r.stderr[-2000:]}")
                continue
            rows[mode] = {**json.loads(r.stdout.strip().splitlines()[-1]), "cgroup_peak_mb": cg.peak / 2**20}
    print("\n| mode | FFN layers held | decode tok/s | MB read per token (of them FFN) | peak RSS MB | peak RSS + cache MB "
          f"(limit {limit / 2**20:.0f}) | bound: throughput / bytes per token | % of bound |")
    print("|---|---|---|---|---|---|---|---|")
    for mode, r in rows.items():
        bound = throughput / r["bytes_per_token"] if r["bytes_per_token"] > 0 else float("inf")
        ffn = f" ({r['ffn_bytes_per_token'] / 2**20:.1f})" if r["ffn_bytes_per_token"] else ""
        print(f"| {mode} | {r['held_layers']} | {r['tok_s']:.2f} | {r['bytes_per_token'] / 2**20:.1f}{ffn} | "
              f"{r['peak_rss_mb']:.0f} | {r['cgroup_peak_mb']:.0f} | {bound:.2f} | {100 * r['tok_s'] / bound:.0f}% |")
    if "mmap" in rows and "flash" in rows:
        print(f"\nflash / mmap: {rows['flash']['tok_s'] / rows['mmap']['tok_s']:.2f}x; the same greedy "
              f"tokens: {len({r['last_token'] for r in rows.values()}) == 1}")


if __name__ == "__main__":
    main()
