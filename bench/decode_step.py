"""Where a decode step's time goes: the compiled step (``_core.DecodeStep``) against its matmuls
run alone, and against the block-by-block Python path, on one model at one context length.

    qlinear-llm make-test-model /tmp/m --shape qwen2.5-0.5b --vocab-size 4096
    python bench/decode_step.py /tmp/m --threads 1 --positions 64

Prints the median time of a step, of the same step's matmuls alone (the GEMVs of every layer
and the lm head, same inputs, same buffers), of ``model._forward`` (the step with the embedding
lookup and the cache's bookkeeping, as generation runs it) and of the Python path, and the share of the step
spent outside the matmuls, two ways: the step against its matmuls run alone, and the step's
own clock around each matmul call (both figures from the same steps, so a busy machine shifts
them less). Rounds are interleaved so that load disturbs them alike; the figures are still
noisy on a shared machine (take the median of a few runs).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="model directory (checkpoint, converted model or MNN export)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--positions", type=int, default=64, help="context length the step attends over")
    ap.add_argument("--steps", type=int, default=20, help="steps per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--act", default="int8", choices=("int8", "float"))
    ap.add_argument("--random-cache", action="store_true",
                    help="fill the KV cache with random values instead of prefilling a prompt (long "
                         "contexts: the attention's cost does not depend on the values)")
    args = ap.parse_args(argv)

    from qlinear import _core, cpu_info, llm
    from qlinear.llm.runtime.step import decode_step

    model = llm.load(args.model, bits=args.bits, act=args.act, threads=args.threads,
                     max_context=args.positions + args.steps + 8, progress=False)
    rng = np.random.default_rng(0)
    hi = min(model.tokenizer.vocab_size, model.config.vocab_size)
    if args.random_cache:
        n = args.positions
        model.cache.k[:, :, :n] = rng.standard_normal(model.cache.k[:, :, :n].shape, np.float32)
        model.cache.v[:, :, :n] = rng.standard_normal(model.cache.v[:, :, :n].shape, np.float32)
        model.cache.length = n
    else:
        model.prefill([int(t) for t in rng.integers(0, hi, args.positions)])
    step = decode_step(model.blocks, model.norm, model.lm_head, model.cache)
    if step is None:
        raise SystemExit("this model keeps float weights: no compiled step")
    tokens = [int(t) for t in rng.integers(0, hi, args.steps)]
    embeds = [np.ascontiguousarray(model.embedding([t]), np.float32) for t in tokens]
    pos0 = args.positions

    inside = []  # per step: (seconds, seconds in matmuls) clocked by the step

    def compiled():
        t0 = time.perf_counter()
        for i, h in enumerate(embeds):
            step.step(h, pos0 + i)
            inside.append(step.last_timing)
        return (time.perf_counter() - t0) / len(embeds)

    def matmuls():
        t0 = time.perf_counter()
        for _ in embeds:
            step.run_matmuls()
        return (time.perf_counter() - t0) / len(embeds)

    def forward():   # what a generation step runs: the embedding lookup, the step, the bookkeeping
        t0 = time.perf_counter()
        for i, t in enumerate(tokens):
            model._forward([t], pos0 + i)
        return (time.perf_counter() - t0) / len(tokens)

    def python_path():
        model.compiled_decode = False
        try:
            t0 = time.perf_counter()
            for i, t in enumerate(tokens):
                model._forward([t], pos0 + i)
            return (time.perf_counter() - t0) / len(tokens)
        finally:
            model.compiled_decode = True

    compiled(), matmuls(), forward(), python_path()  # warm up (pages, pool, caches)
    inside.clear()
    times = {"step": [], "matmuls": [], "forward": [], "python": []}
    for _ in range(args.rounds):
        times["step"].append(compiled())
        times["matmuls"].append(matmuls())
        times["forward"].append(forward())
        times["python"].append(python_path())
    med = {k: statistics.median(v) for k, v in times.items()}
    outside = (med["step"] - med["matmuls"]) / med["step"]
    clocked = statistics.median((total - mm) / total for total, mm in inside)
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               cpu_info()["arch"])
    print(f"{cpu}, isa {cpu_info()['active_isa']}, threads {_core.get_num_threads()}, "
          f"{model.config.num_layers} layers, context {args.positions}, bits {args.bits}, act {args.act}")
    print(f"compiled step   {med['step'] * 1e3:7.3f} ms  ({1 / med['step']:6.1f} steps/s)")
    print(f"matmuls alone   {med['matmuls'] * 1e3:7.3f} ms")
    print(f"model._forward  {med['forward'] * 1e3:7.3f} ms  (the step with the embedding lookup and bookkeeping)")
    print(f"python path     {med['python'] * 1e3:7.3f} ms  ({1 / med['python']:6.1f} steps/s)")
    print(f"outside the matmuls: {outside * 100:.1f}% of the compiled step (step vs matmuls alone), "
          f"{clocked * 100:.1f}% (clocked inside the step, median of {len(inside)} steps)")


if __name__ == "__main__":
    main()
