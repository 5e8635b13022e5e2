"""A hybrid model's (Qwen3.5: Gated DeltaNet layers with a recurrent state) conversation costs:
the second turn's time to first token with the state snapshot reused and without, and what a
speculative verification saves (k rows verified in one step against k one-token steps).

    python bench/hybrid_turns.py FILE.gguf [--threads 1 2] [--prompt 2000] [--rounds 3]

The first turn is a ``--prompt``-token prompt and a 32-token reply; the second turn's prompt is
the first's, the reply and 50 new tokens. "reused": the model resumes at the state it kept at the
last multiple of 64 before the first prompt's end (docs/semantics.md 7) and prefills the rest;
"fresh": a model that holds nothing prefills it all. Both give the same logits bit for bit (checked
here). The verification row: a block of 5 rows (the token last decided and 4 drafts) through the
compiled step against 5 one-token steps, the cost of n-gram or draft speculation at full
acceptance (random weights repeat no text: n-gram drafts are never accepted on them)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np


def cpu_name() -> str:
    return next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--prompt", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    import qlinear
    from qlinear import llm

    rng = np.random.default_rng(0)
    first = [int(t) for t in rng.integers(0, 4000, a.prompt)]
    model = llm.load(a.model, max_context=a.prompt + 256, progress=False)
    fresh = llm.load(a.model, max_context=a.prompt + 256, progress=False)
    model.tokenizer.stop_ids = set()
    print(f"{cpu_name()}, qlinear level {qlinear.cpu_info()['active_isa']}; {a.model.name}; medians of {a.rounds}")
    print("| threads | first prompt | second turn's prompt | TTFT reused (s) | positions reused | TTFT fresh (s) | "
          "reused / fresh | verify 5 rows (ms) | 5 one-token steps (ms) | verify / steps |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for t in a.threads:
        qlinear.set_num_threads(t)
        reused, cold, verify, steps = [], [], [], []
        for _ in range(a.rounds):
            model.reset()
            reply = model.generate_ids(first, 32)
            second = first + reply + [int(x) for x in rng.integers(0, 4000, 50)]
            t0 = time.perf_counter()
            ours = model.prefill(second)
            reused.append(time.perf_counter() - t0)
            kept = model.stats.reused_tokens
            fresh.reset()
            t0 = time.perf_counter()
            theirs = fresh.prefill(second)
            cold.append(time.perf_counter() - t0)
            assert np.array_equal(ours, theirs), "a reused prefix changed the logits"
            # a verification block against one-token steps, from the same position
            start, block = model.cache.length, [int(x) for x in rng.integers(0, 4000, 5)]
            model.cache.guard(start, len(block))
            t0 = time.perf_counter()
            model.verify(block, start)
            verify.append(time.perf_counter() - t0)
            model.cache.rollback(start)
            model.cache.guard(start, len(block))
            t0 = time.perf_counter()
            for j, tok in enumerate(block):
                model._forward([tok], start + j)
            steps.append(time.perf_counter() - t0)
            model.cache.rollback(start)
        r, c, v, s = (float(np.median(x)) for x in (reused, cold, verify, steps))
        print(f"| {t} | {a.prompt} | {len(second)} | {r:.3f} | {kept} | {c:.3f} | {r / c:.2f}x | {v * 1e3:.1f} | "
              f"{s * 1e3:.1f} | {v / s:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
