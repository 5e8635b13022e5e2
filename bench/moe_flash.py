"""Mixture-of-experts models from flash: qlinear's memory="flash" for routed experts against
llama.cpp (mmap) under one memory limit that counts the page cache (a child memory cgroup; needs
root), the limit half the model file; and the expert cache's hit rate with random routing and
with a trained router.

The model: the synthetic Qwen3-MoE of bench/moe.py (Qwen2.5-0.5B's attention, 24 layers, 32
experts of width 608 per layer, top 4, vocabulary 4096; 1.3B weights; random weights), its
checkpoint written once into $QLINEAR_BENCH_MODELS (default ~/.cache/qlinear-bench). llama.cpp
(built by `python bench/llamacpp_vs.py --build`) reads the Q4_0 GGUF its own converter and
llama-quantize make of the checkpoint (bench/llamacpp_vs.py's `checkpoint_gguf`). qlinear runs
with --same-file that very GGUF file (memory="flash" reads its experts from the stacked
ffn_*_exps tensors and moves their codes into its expert cache), with --from-gguf that file
converted by `llm.convert` (its codes kept: the same weights, experts stored whole), else the
checkpoint converted with `llm.convert(bits=4, group_size=32, symmetric=True)` (Q4_0's weights:
symmetric int4 in groups of 32, a float16 scale as Q4_0's; the same checkpoint at the same bits).

    python bench/moe_flash.py [--limit-mb N] [--decode-tokens 32] [--threads 2] [--read-ahead-kb 128] [--keep]
    python bench/moe_flash.py --same-file      # qlinear on llama.cpp's Q4_0 file itself
    python bench/moe_flash.py --from-gguf      # qlinear on llama.cpp's Q4_0 file, converted (codes kept)

Each run is a fresh process inside the cgroup, the page cache dropped first (echo 3 >
drop_caches). qlinear: load with memory_budget_mb = the limit (the expert cache gets what the
limit holds beyond the resident part and a reserve; the random-routing run's budget also leaves
room for its bound's scratch experts and reader), prefill 8 tokens, then 8 random tokens more
as one prompt (timed: the prefill figure, against llama-bench's pp8, timed after its warm-up
run), decode 8 (warm-up), then the measured decode, each step fed a random token (as llama-bench's generation test does); with
the next layer's experts prefetched from its router applied early, and without. This random
model's routers pick nearly the same experts whatever the token (its hidden states barely depend
on it), so a third run draws each token's experts at random instead (the routers still computed,
no prefetch): the cache's random-routing case, not llama.cpp's workload. llama.cpp:
`llama-bench -p 8 -n N -r 1 -lm mmap`, with its Q4_0 repacking (tensors copied out of the
mapping into its own memory) and without. The bound: read throughput / bytes read per token,
the read throughput measured inside the cgroup on the file qlinear reads, with the flash reader
(sequential 4 MiB reads; reads of one expert each at the experts' offsets in random order; and
the same reads a layer's top-k at a time, each group waited for before the next starts, as a
decode token reads with random routing and nothing in the cache, less its compute; as the expert
cache reads: its reader threads, no readahead, past the page cache where the file system allows).
The device's throughput drifts by tens of percent within minutes on a shared VM, so the random
routing run also measures its bound beside itself: its decode in 4 rounds, each followed by its
reads again without its compute (each layer's misses replayed as as many other experts of that
layer read at once) in the same process, the decode's share of that bound per round.

Hit rates: the big model's as measured in its runs; the trained
models/stdlib-qwen3moe (4 layers x 8 experts, top 2), teacher-forced over a held-out
standard-library file (difflib.py) with caches of 4, 8 and 16 of its 32 experts (LFU, LRU, LFU
with prefetch), against an LRU cache of the same size fed experts drawn uniformly at random.

Files this run makes (checkpoint, converted model, GGUF files) are removed at the end unless
--keep or they were there before.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from moe import NAME, ROOT, checkpoint, converted  # noqa: E402  (bench/moe.py's model)
from flash import read_bytes  # noqa: E402  (bench/flash.py: bytes this process read from disk)
TRAINED = Path(__file__).resolve().parent.parent / "models" / "stdlib-qwen3moe"
PROMPT, WARM = 8, 8
BOUND_ROUNDS = 4   # random routing: decode rounds, each followed by the bound's reads


def worker_qlinear(args) -> dict:
    import qlinear
    from qlinear import llm
    from qlinear.llm.flash.reader import FlashReader
    qlinear.set_num_threads(args.threads)
    m = llm.load(args.model, memory="flash", memory_budget_mb=args.budget_mb, progress=False,
                 max_context=PROMPT + WARM + args.decode_tokens + 8)
    m.flash.experts.prefetch = args.prefetch
    if args.routing == "random":   # each token's experts drawn at random (the routers still run)
        pick = np.random.default_rng(1)

        def random_route(route):
            def drawn(x):
                top, w = route(x)
                r = pick.standard_normal((x.shape[0], m.config.num_experts))
                return np.argsort(-r, axis=1)[:, :top.shape[1]].astype(top.dtype), w
            return drawn
        for b in m.blocks:
            b.route = random_route(b.route)
    # random tokens fed to each decode step, as llama-bench's generation test does: a random
    # model's greedy tokens repeat, and so would its experts (hit rates near 100%)
    rng = np.random.default_rng(0)
    token = int(m.prefill(list(range(100, 100 + PROMPT))).argmax())
    # a prompt of PROMPT random tokens after that first one (llama-bench times its prompt after
    # a warm-up run too)
    t0 = time.perf_counter()
    m._forward([int(t) for t in rng.integers(m.config.vocab_size, size=PROMPT)], m.cache.length)
    prefill = PROMPT / (time.perf_counter() - t0)
    for _ in range(WARM):
        token = int(m._forward([int(rng.integers(m.config.vocab_size))], m.cache.length)[0].argmax())
    # with random routing, the bound is also measured beside the decode: after each round of
    # tokens, its reads again without its compute (each layer's misses, as many other experts of
    # that layer read at once, waited for before the next) by a reader like the cache's (the
    # device's throughput drifts by tens of percent within minutes on a shared VM)
    rounds = BOUND_ROUNDS if args.routing == "random" else 1
    bound = FlashReader(m.flash.experts.reader.path, m.flash.experts.reader.plan) if rounds > 1 else None
    cache, bursts = m.flash.experts, []
    request = cache.request

    def recorded(layer, experts):   # the misses' reads one block issues at once
        before = cache.stats.misses
        got = request(layer, experts)
        if cache.stats.misses > before:
            bursts.append((layer, cache.stats.misses - before))
        return got
    cache.request = recorded
    s0, f0, dt, disk, paired = dict(m.flash.stats), m.flash.bytes_read, 0.0, 0, []
    n = args.decode_tokens
    try:
        for r in range(rounds):
            tokens = n * (r + 1) // rounds - n * r // rounds
            b0, r0, t0 = m.flash.bytes_read, read_bytes(), time.perf_counter()
            bursts.clear()
            for _ in range(tokens):
                token = int(m._forward([int(rng.integers(m.config.vocab_size))], m.cache.length)[0].argmax())
            took = time.perf_counter() - t0
            disk += read_bytes() - r0
            dt += took
            if bound is not None:
                files = m.flash.experts.files
                tp = replayed_bursts(bound, files, reads_of(files), bursts, r)
                paired.append((tokens / took) / (tp / ((m.flash.bytes_read - b0) / tokens)))
    finally:
        if bound is not None:
            bound.close()
    s1 = m.flash.stats
    hits, misses = s1["hits"] - s0["hits"], s1["misses"] - s0["misses"]
    return {"tok_s": n / dt, "bytes_per_token": (m.flash.bytes_read - f0) / n, "disk_bytes_per_token": disk / n,
            "hit_rate": hits / max(hits + misses, 1), "prefetched": (s1["prefetched"] - s0["prefetched"]) / n,
            "prefetch_used": (s1["prefetch_used"] - s0["prefetch_used"]) / n, "slots": s1["slots"],
            "experts": s1["experts"], "expert_mb": s1["expert_bytes"] / 2**20, "peak_rss_mb": m.stats.peak_rss_mb,
            "last_token": token, "of_paired_bound": sorted(paired), "prefill_tok_s": prefill}


def reads_of(files):
    """(layer, expert), j -> the reads of that expert of ``files`` into scratch buffer j % 8."""
    from qlinear.llm.flash.expert_files import ExpertFile
    if isinstance(files, ExpertFile):
        bufs = [(np.empty(files.gate_up_bytes, np.uint8), np.empty(files.down_bytes, np.uint8)) for _ in range(8)]
        return lambda key, j: files.reads(*key, *bufs[j % 8])
    bufs = [np.empty(files.max_expert_read, np.uint8) for _ in range(8)]
    return lambda key, j: files.reads(*key, bufs[j % 8])[0]


def layer_bursts(reader, files, expert_reads, k: int, nbytes: int, seed: int = 0) -> float:
    """Bytes per second of a decode token's reads without its compute: k random experts of a
    layer read at once and waited for before the next layer's, ``nbytes`` in all."""
    groups = max(1, nbytes // (k * files.read_bytes))
    return replayed_bursts(reader, files, expert_reads, [(g % files.L, k) for g in range(groups)], seed)


def replayed_bursts(reader, files, expert_reads, bursts: list, seed: int) -> float:
    """Bytes per second of ``bursts`` [(layer, n)] read again without the compute: n random
    experts of that layer at once (others than the decode's: no cache between the two may help),
    waited for before the next burst."""
    rng = np.random.default_rng(seed)
    t0 = time.perf_counter()
    for layer, n in bursts:
        chosen = rng.choice(files.E, n, replace=False)
        reader.submit([r for j, e in enumerate(chosen) for r in expert_reads((layer, int(e)), j)]).wait()
    return sum(n for _, n in bursts) * files.read_bytes / (time.perf_counter() - t0)


def worker_throughput(args) -> dict:
    """Read throughput of the model file, with the flash reader, in this process (the cgroup)."""
    from qlinear._format import tensor_entries
    from qlinear.llm.config import ModelConfig
    from qlinear.llm.flash.cost import drop_file_cache, read_throughput
    from qlinear.llm.flash.expert_files import ExpertFile, GGUFExpertFile
    from qlinear.llm.flash.experts import EXPERT_READERS
    from qlinear.llm.flash.reader import CHUNK_BYTES, FlashReader, ReadPlan
    from qlinear.llm.gguf.config import read_config
    from qlinear.llm.gguf.file import GGUFFile

    path = Path(args.model)
    if path.is_dir():   # a converted model: each expert one range
        path = path / "model.qlinear"
        entries, meta = tensor_entries(path)
        cfg = ModelConfig.from_dict(meta["config"], str(path))
        files = ExpertFile(path, entries, cfg, os.path.getsize(path))
    else:   # llama.cpp's GGUF file: each expert three slices of its layer's stacked tensors
        f = GGUFFile(path)
        cfg = read_config(f)
        files = GGUFExpertFile(f, cfg, staging=0)
    keys = [(i, e) for i in range(files.L) for e in range(files.E)]
    expert_reads = reads_of(files)
    plan = ReadPlan(False, EXPERT_READERS, CHUNK_BYTES, direct=True)   # the expert cache's reads (moe_loader)
    seq = read_throughput(path, plan=plan)
    order = np.random.default_rng(0).permutation(len(keys))
    reads = [r for j, i in enumerate(order) for r in expert_reads(keys[i], j)]
    drop_file_cache(path)
    reader = FlashReader(path, plan)
    try:
        t0 = time.perf_counter()
        reader.submit(reads).wait()
        rand = len(keys) * files.read_bytes / (time.perf_counter() - t0)
        drop_file_cache(path)
        bursts = layer_bursts(reader, files, expert_reads, cfg.experts_per_token, len(keys) * files.read_bytes)
        direct = reader.direct
    finally:
        reader.close()
    from qlinear.llm.flash.reader import DIRECT_ALIGN
    scratch = 8 * (files.expert_bytes if isinstance(files, ExpertFile) else files.max_expert_read)
    # what the random-routing run's bound holds beside its model: reads_of's 8 experts and a
    # second reader's buffers (its budget leaves room for them)
    bound = scratch + plan.threads * (files.max_read + 2 * DIRECT_ALIGN)
    return {"sequential": seq, "experts_random": rand, "layer_bursts": bursts, "direct": direct, "threads": plan.threads,
            "bound_bytes": bound}


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3")


def in_cgroup(limit: int, tag: str, cmd: list) -> tuple:
    from qlinear.llm.flash.cgroup import MemoryCgroup
    drop_caches()
    with MemoryCgroup(limit, name=f"qlinear-moe-flash-{os.getpid()}-{tag}") as cg:
        r = cg.run(cmd, capture_output=True, text=True)
        return r, cg.peak / 2**20


def llamacpp_run(limit: int, gguf: Path, decode: int, threads: int, repack: int) -> dict:
    import llamacpp_vs as lv
    cmd = [str(lv.tool("llama-bench")), "-m", str(gguf), "-p", str(PROMPT), "-n", str(decode), "-t", str(threads),
           "-r", "1", "-o", "json", "-lm", "mmap", "--repack", str(repack)]
    t0 = time.perf_counter()
    r, peak = in_cgroup(limit, f"llamacpp-{repack}", cmd)
    if r.returncode:
        return {"error": f"exit {r.returncode} after {time.perf_counter() - t0:.0f} s: {r.stderr.strip()[-300:]}",
                "cgroup_peak_mb": peak}
    rows = json.loads(r.stdout)
    gen = [x for x in rows if x.get("n_gen", 0) > 0][0]
    pp = [x for x in rows if x.get("n_prompt", 0) > 0 and x.get("n_gen", 0) == 0]
    return {"tok_s": float(gen["avg_ts"]), "prefill_tok_s": float(pp[0]["avg_ts"]) if pp else float("nan"),
            "cgroup_peak_mb": peak}


def trained_hit_rates(tmp: Path) -> list:
    """(slots, LRU hit rate with the trained router, with uniformly random experts) per cache size."""
    from qlinear import llm
    from qlinear.llm.flash.loader import load_flash
    from qlinear.llm.options import Options

    out = llm.convert(TRAINED, tmp / "stdlib-qwen3moe-q4g32", bits=4, group_size=32, symmetric=True, progress=False)
    text = (Path(sysconfig.get_paths()["stdlib"]) / "difflib.py").read_text()
    rows = []
    for slots in (4, 8, 16):
        row = [slots]
        for prefetch, policy in (("none", "lfu"), ("none", "lru"), ("router", "lfu")):
            m = load_flash(out, Options(memory="flash").check(), 512, expert_slots=slots)
            m.flash.experts.prefetch, m.flash.experts.policy = prefetch, policy
            ids = m.tokenizer.encode(text)[:400]
            for pos, t in enumerate(ids):   # one token per forward: decode's pattern of lookups
                m._forward([t], pos)
            st, cfg = m.flash.stats, m.config
            row += [st["hit_rate"], st["bytes"] / len(ids) / st["read_bytes"], st["prefetched"], st["prefetch_used"]]
            m.close()
        rows.append((*row, uniform_lru_hit_rate(cfg.num_layers, cfg.num_experts, cfg.experts_per_token, slots, len(ids))))
    return rows


def uniform_lru_hit_rate(L: int, E: int, k: int, slots: int, tokens: int, seed: int = 0) -> float:
    """An LRU cache of ``slots`` (layer, expert) entries, each token taking k distinct experts per
    layer uniformly at random (random routing)."""
    from collections import OrderedDict
    rng, lru, hits, n = np.random.default_rng(seed), OrderedDict(), 0, 0
    for _ in range(tokens):
        for i in range(L):
            chosen = [(i, int(e)) for e in rng.choice(E, k, replace=False)]
            for key in chosen:
                n += 1
                if key in lru:
                    hits += 1
                    lru.move_to_end(key)
                else:
                    lru[key] = True
                    if len(lru) > slots:
                        lru.popitem(last=False)
    return hits / n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--limit-mb", type=float, default=None, help="default: half the smaller model file")
    p.add_argument("--decode-tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--keep", action="store_true", help="keep the files this run made")
    p.add_argument("--skip-llamacpp", action="store_true")
    p.add_argument("--same-file", action="store_true",
                   help="qlinear runs llama.cpp's Q4_0 file itself (its experts read from the stacked tensors)")
    p.add_argument("--from-gguf", action="store_true",
                   help="qlinear runs llama.cpp's Q4_0 file converted (llm.convert keeps its codes) instead of the checkpoint's")
    p.add_argument("--gguf", type=Path, default=None,
                   help="a MoE GGUF file to run instead of the synthetic Qwen3-MoE (e.g. bench/llamacpp_vs.py's "
                        "gpt-oss-20b-l5 file): qlinear reads its experts from it (as --same-file), llama.cpp the same file")
    p.add_argument("--read-ahead-kb", type=int, default=None,
                   help="set the model's block device's read_ahead_kb for the runs (restored after): "
                        "llama.cpp's page faults read ahead by it; 128 is the kernel's default")
    p.add_argument("--worker", choices=["qlinear", "throughput"], help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--budget-mb", type=float, help=argparse.SUPPRESS)
    p.add_argument("--prefetch", default="router", help=argparse.SUPPRESS)
    p.add_argument("--routing", default="model", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print(json.dumps(worker_qlinear(args) if args.worker == "qlinear" else worker_throughput(args)))
        return
    from qlinear.llm.flash.cgroup import unavailable_reason
    why = unavailable_reason()
    if why:
        raise SystemExit(f"no memory limit can be set here: {why}")
    import llamacpp_vs as lv

    made = [x for x in (ROOT / NAME, ROOT / f"{NAME}-q4g32", lv.CACHE / f"{NAME}-Q4_0.gguf", lv.CACHE / f"{NAME}-F32.gguf")
            if not x.exists()] if args.gguf is None else []
    tmp = Path(tempfile.mkdtemp(prefix="qlinear-moe-flash-"))
    from qlinear.llm.flash.reader import read_ahead_path
    ra = read_ahead_path(ROOT)
    ra = Path(ra) if ra else None
    ra_before = ra.read_text().strip() if ra else None
    try:
        if args.read_ahead_kb is not None:
            if ra is None:
                raise SystemExit(f"{ROOT}: not on a block device whose read_ahead_kb can be set")
            ra.write_text(str(args.read_ahead_kb))
        print(f"the device's readahead: {ra.read_text().strip() + ' KB' if ra else 'unknown'} (mmap's page faults "
              "read ahead by it; the flash reader reads without readahead)")
        run(args, lv, tmp)
    finally:
        if args.read_ahead_kb is not None and ra is not None:
            ra.write_text(ra_before)
        shutil.rmtree(tmp, ignore_errors=True)
        for x in made if not args.keep else ():
            shutil.rmtree(x, ignore_errors=True) if x.is_dir() else x.unlink(missing_ok=True)


def run(args, lv, tmp: Path) -> None:
    import platform
    have_llamacpp = lv.tool("llama-bench").exists() and not args.skip_llamacpp
    if args.gguf is not None:  # a file of its own: run as it is, by both
        if not args.gguf.is_file():
            raise SystemExit(f"{args.gguf}: no such file")
        model, gguf, args.same_file, args.from_gguf = None, args.gguf, True, False
    else:
        model = converted()
        need_gguf = have_llamacpp or args.same_file or args.from_gguf
        gguf = lv.checkpoint_gguf(checkpoint(), "Q4_0", pre="qwen2") if need_gguf and lv.tool("llama-quantize").exists() else None
    if (args.from_gguf or args.same_file) and gguf is None:
        raise SystemExit("--from-gguf / --same-file need llama.cpp's GGUF file (python bench/llamacpp_vs.py --build)")
    if args.from_gguf:   # llama.cpp's file converted: its Q4_0 codes moved, the same weights
        from qlinear import llm
        model = llm.convert(gguf, tmp / "from-gguf", progress=False)
    qfile = gguf if args.same_file else model / "model.qlinear"
    qsize = qfile.stat().st_size
    sizes = [qsize] + ([gguf.stat().st_size] if gguf else [])
    limit = int(args.limit_mb * 2**20) if args.limit_mb else min(sizes) // 2
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor())
    print(f"CPU {cpu}, {os.cpu_count()} cores, {args.threads} threads")
    print(f"qlinear file {qsize / 2**20:.0f} MB ("
          + (f"{gguf.name} itself: the same file as llama.cpp's" if args.same_file else
             f"{gguf.name} converted: its Q4_0 codes" if args.from_gguf else f"int4 g32 symmetric, converted from {NAME}") + ")"
          + (f"; llama.cpp file {gguf.stat().st_size / 2**20:.0f} MB ({gguf.name}{', the same file' if args.gguf else ', Q4_0, the same checkpoint'})" if gguf else
             "; llama.cpp: skipped" if args.skip_llamacpp else "; llama.cpp: not built (python bench/llamacpp_vs.py --build)"))
    print(f"memory limit {limit / 2**20:.0f} MB (RSS + page cache; the qlinear file is {qsize / limit:.2f}x it)")
    me = [sys.executable, __file__, "--model", str(gguf if args.same_file else model), "--threads", str(args.threads),
          "--decode-tokens", str(args.decode_tokens)]
    # a virtual machine's disk may be served from its host's page cache (bench/flash.py): one pass
    # over each file first, so that no run pays the host's first reads
    for f in {qfile, *([gguf] if gguf else [])}:
        with open(f, "rb", buffering=0) as fh:
            while fh.read(16 << 20):
                pass
    r, _ = in_cgroup(limit, "throughput", me + ["--worker", "throughput"])
    if r.returncode:
        raise SystemExit(f"throughput run failed: {r.stderr[-2000:]}")
    tp = json.loads(r.stdout.strip().splitlines()[-1])
    print(f"read throughput in the cgroup (flash reader as the expert cache reads: {tp['threads']} threads, no readahead, "
          f"{'past the page cache (O_DIRECT)' if tp['direct'] else 'page cache'}, cache dropped): sequential "
          f"4 MiB reads {tp['sequential'] / 1e9:.2f} GB/s; one expert per read, random order "
          f"{tp['experts_random'] / 1e9:.2f} GB/s; a layer's experts at once, waited for, layer after layer "
          f"(a decode token's reads without its compute) {tp['layer_bursts'] / 1e9:.2f} GB/s")
    rows = {}
    for pf, routing in (("router", "model"), ("none", "model"), ("none", "random")):
        budget = (limit - (tp["bound_bytes"] if routing == "random" else 0)) / 2**20
        r, peak = in_cgroup(limit, f"q-{pf}-{routing}", me + ["--worker", "qlinear", "--prefetch", pf, "--routing", routing,
                                                                "--budget-mb", str(budget)])
        rows[f"qlinear flash, prefetch={pf}" + (", random routing" if routing == "random" else "")] = ({**json.loads(r.stdout.strip().splitlines()[-1]), "cgroup_peak_mb": peak}
                                                 if r.returncode == 0 else {"error": r.stderr[-500:], "cgroup_peak_mb": peak})
    for repack in (1, 0) if have_llamacpp else ():
        rows[f"llama.cpp mmap, repack={repack}"] = llamacpp_run(limit, gguf, args.decode_tokens, args.threads, repack)
    print(f"\n| engine | decode tok/s | prefill tok/s ({PROMPT} tokens) | expert cache (slots of experts) | hit rate | "
          f"MB read per token | bound: seq. / random-expert / layer-burst throughput / bytes per token | % of bounds | "
          f"peak RSS MB | cgroup peak MB (limit {limit / 2**20:.0f}) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, x in rows.items():
        if "error" in x:
            print(f"| {name} | failed: {x['error'][-200:]!r} | | | | | | | | {x['cgroup_peak_mb']:.0f} |")
        elif "bytes_per_token" in x:
            bpt = x["bytes_per_token"]
            b1, b2, b3 = (tp[w] / bpt for w in ("sequential", "experts_random", "layer_bursts"))
            print(f"| {name} | {x['tok_s']:.2f} | {x['prefill_tok_s']:.2f} | {x['slots']} of {x['experts']} "
                  f"({x['expert_mb']:.2f} MB each) | "
                  f"{100 * x['hit_rate']:.1f}% | {bpt / 2**20:.1f} (disk {x['disk_bytes_per_token'] / 2**20:.1f}) | "
                  f"{b1:.2f} / {b2:.2f} / {b3:.2f} | {100 * x['tok_s'] / b1:.0f}% / {100 * x['tok_s'] / b2:.0f}% / "
                  f"{100 * x['tok_s'] / b3:.0f}% | "
                  f"{x['peak_rss_mb']:.0f} | {x['cgroup_peak_mb']:.0f} |")
        else:
            print(f"| {name} | {x['tok_s']:.2f} | {x['prefill_tok_s']:.2f} | (page cache) | | | | | | "
                  f"{x['cgroup_peak_mb']:.0f} |")
    for name, x in rows.items():
        if x.get("of_paired_bound"):
            f = x["of_paired_bound"]
            print(f"\n{name}: {100 * float(np.median(f)):.0f}% of the bound measured between its {len(f)} rounds "
                  f"of decode (after each round, its reads again without its compute: each layer's misses as "
                  f"many other experts of that layer at once; rounds "
                  f"{' / '.join(f'{100 * v:.0f}%' for v in f)})")
    best_q = max((x["tok_s"] for n, x in rows.items() if n.startswith("qlinear") and "random" not in n and "tok_s" in x),
                 default=None)
    best_l = max((x["tok_s"] for n, x in rows.items() if n.startswith("llama") and "tok_s" in x), default=None)
    if best_q and best_l:
        print(f"\nqlinear flash / llama.cpp (best of each): {best_q / best_l:.2f}x")
    if args.gguf is not None:
        return
    print("\nexpert cache hit rate, trained router (models/stdlib-qwen3moe, 4 layers x 8 experts, top 2; "
          "400 tokens of difflib.py, one per forward) vs experts drawn uniformly at random:")
    print("| slots (of 32) | trained router, LFU (the default): hit rate, experts read per token | LRU | LFU with "
          "prefetch from the next router applied early (prefetches used) | random routing, LRU: hit rate |")
    print("|---|---|---|---|---|")
    for slots, hit, reads, _, _, lhit, lreads, _, _, phit, preads, pf, used, uni in trained_hit_rates(tmp):
        print(f"| {slots} | {100 * hit:.1f}%, {reads:.2f} | {100 * lhit:.1f}%, {lreads:.2f} | {100 * phit:.1f}%, "
              f"{preads:.2f} ({used} of {pf}) | {100 * uni:.1f}% |")


if __name__ == "__main__":
    main()
