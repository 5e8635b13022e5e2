"""Accuracy of per-row vs per-group activation scales (the table of docs/accuracy.md).

    python bench/act_block_accuracy.py

Relative error of W4A8 against the same int4 weights with float activations, so that only the
activation quantization is measured; "outliers" scales 8 input channels by 60, as the outlier
features of LLM activations.
"""

import numpy as np

import qlinear


def main():
    rng = np.random.default_rng(0)
    k, n, m = 4096, 1024, 32
    w = (rng.standard_normal((n, k)) * 0.02).astype(np.float32)
    gaussian = rng.standard_normal((m, k)).astype(np.float32)
    outliers = rng.standard_normal((m, k)).astype(np.float32)
    outliers[:, rng.choice(k, 8, replace=False)] *= 60
    print("| activations | group | per row | per group |\n|---|---|---|---|")
    for name, x in (("Gaussian", gaussian), ("8 outlier channels (x60)", outliers)):
        for g in (32, 64, 128):
            pw = qlinear.pack_weight(w, bits=4, group_size=g)
            y_weight_only = x @ pw.dequantize().T
            errs = [np.linalg.norm(qlinear.matmul(x, pw, act_block=ab) - y_weight_only)
                    / np.linalg.norm(y_weight_only) for ab in (None, "group")]
            print(f"| {name} | {g} | {errs[0]:.4f} | {errs[1]:.4f} |")


if __name__ == "__main__":
    import argparse

    argparse.ArgumentParser(description=__doc__.split("\n", 1)[0]).parse_args()
    main()
