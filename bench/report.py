"""Markdown tables from a pytest-benchmark JSON file written by bench/.

Usage:
    python -m pytest bench/ --benchmark-only --benchmark-json=out.json
    python bench/report.py out.json

Times are medians.  "MNN/qlinear", "ORT/qlinear" and "numpy/qlinear" are how
many times faster qlinear (W4A8 table: default act_block="group"; float table:
qlinear.matmul_float) is than that engine (>1: qlinear faster).  numpy fp32
does not depend on the group size and is measured once per shape and thread
count (W4A8: at group 64, float: at group 128); its time is shown on every
group's row.  ORT = onnxruntime MatMulNBits (accuracy_level 4 in the W4A8
table, 1 in the float table); MNN-low in the float table is MNN's W4A8 path
(MNN has no float-activation low-memory mode).
"""

from __future__ import annotations

import argparse
import json
import sys


def _ms(t):
    return "" if t is None else f"{t * 1e3:.3f}"


def _us(t):
    return "" if t is None else f"{t * 1e6:.2f}"


def _ratio(a, b):
    return "" if a is None or b is None or b <= 0 else f"{a / b:.2f}x"


def _rate(info, t):
    """qlinear GB/s (GEMV, weight bytes / median) or GOPS (GEMM, 2MNK / median)."""
    if info is None or t is None:
        return ""
    m, n, k = info["M"], info["N"], info["K"]
    if m == 1:
        return f"{info['weight_bytes'] / t / 1e9:.1f} GB/s"
    return f"{2.0 * m * n * k / t / 1e9:.1f} GOPS"


def _sort_key(key):
    (m, k, n), group, threads = key
    return (m, k * n, k, threads, group)


def load(path):
    with open(path) as f:
        data = json.load(f)
    rows = {}  # kind -> {((M,K,N), group, threads): {engine: (median_s, info)}}
    for b in data.get("benchmarks", []):
        info = b.get("extra_info") or {}
        if "engine" not in info or "M" not in info:
            continue
        shape = (info["M"], info["K"], info["N"])
        kind = info.get("kind") or ("gemv" if info["M"] == 1 else "gemm")
        kind = {"gemv": "w4a8", "gemm": "w4a8"}.get(kind, kind)
        if kind.startswith("w8a8"):
            kind = "w8a8"
        elif kind.startswith("float"):
            kind = "float"
        key = (shape, info["group"], info["threads"])
        rows.setdefault(kind, {}).setdefault(key, {})[info["engine"]] = (
            b["stats"]["median"], info)
    return data, rows


def _t(cell, engine):
    v = cell.get(engine)
    return v[0] if v else None


def _info(cell, engine):
    v = cell.get(engine)
    return v[1] if v else None


def _numpy_by(rows):
    """numpy is measured at one group per (shape, threads): share it across groups."""
    numpy_by = {}
    for (shape, group, threads), cell in rows.items():
        if "numpy" in cell:
            numpy_by.setdefault((shape, threads), cell["numpy"][0])
    return numpy_by


def table_w4a8(rows):
    numpy_by = _numpy_by(rows)
    out = [
        "| shape MxKxN | group | threads | qlinear ms | qlinear-rowscale ms | MNN ms | ORT-l4 ms "
        "| numpy ms | qlinear GB/s or GOPS | MNN/qlinear | ORT/qlinear | numpy/qlinear |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key in sorted(rows, key=_sort_key):
        shape, group, threads = key
        cell = rows[key]
        q, qr, mnn = _t(cell, "qlinear"), _t(cell, "qlinear-rowscale"), _t(cell, "mnn")
        ort = _t(cell, "ort-level4")
        npy = _t(cell, "numpy") or numpy_by.get((shape, threads))
        out.append(
            f"| {'x'.join(map(str, shape))} | {group} | {threads} | {_ms(q)} | {_ms(qr)} "
            f"| {_ms(mnn)} | {_ms(ort)} | {_ms(npy)} | {_rate(_info(cell, 'qlinear'), q)} "
            f"| {_ratio(mnn, q)} | {_ratio(ort, q)} | {_ratio(npy, q)} |")
    return out


def table_float(rows):
    numpy_by = _numpy_by(rows)
    out = [
        "| shape MxKxN | group | threads | qlinear-float ms | numpy ms | ORT-l1 ms | MNN-low ms "
        "| qlinear GB/s or GOPS | numpy/qlinear | ORT/qlinear | MNN/qlinear |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key in sorted(rows, key=_sort_key):
        shape, group, threads = key
        cell = rows[key]
        q, ort, mnn = _t(cell, "qlinear-float"), _t(cell, "ort-level1"), _t(cell, "mnn-low")
        npy = _t(cell, "numpy") or numpy_by.get((shape, threads))
        out.append(
            f"| {'x'.join(map(str, shape))} | {group} | {threads} | {_ms(q)} | {_ms(npy)} "
            f"| {_ms(ort)} | {_ms(mnn)} | {_rate(_info(cell, 'qlinear-float'), q)} "
            f"| {_ratio(npy, q)} | {_ratio(ort, q)} | {_ratio(mnn, q)} |")
    return out


def table_w8a8(rows):
    out = [
        "| shape MxKxN | group | threads | qlinear ms | MNN ms | qlinear GB/s or GOPS "
        "| MNN/qlinear |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for key in sorted(rows, key=_sort_key):
        shape, group, threads = key
        cell = rows[key]
        q, mnn = _t(cell, "qlinear"), _t(cell, "mnn")
        out.append(
            f"| {'x'.join(map(str, shape))} | {group} | {threads} | {_ms(q)} | {_ms(mnn)} "
            f"| {_rate(_info(cell, 'qlinear'), q)} | {_ratio(mnn, q)} |")
    return out


def table_overhead(rows):
    out = [
        "| shape MxKxN | group | threads | qlinear us | numpy us | qlinear/numpy |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for key in sorted(rows, key=_sort_key):
        shape, group, threads = key
        cell = rows[key]
        q, npy = _t(cell, "qlinear"), _t(cell, "numpy")
        out.append(f"| {'x'.join(map(str, shape))} | {group} | {threads} | {_us(q)} "
                   f"| {_us(npy)} | {_ratio(q, npy)} |")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("json", help="file written by pytest --benchmark-json=FILE")
    args = ap.parse_args(argv)
    data, rows = load(args.json)
    if not rows:
        print(f"no qlinear bench results in {args.json}", file=sys.stderr)
        return 1

    mi = data.get("machine_info") or {}
    cpu = (mi.get("cpu") or {}).get("brand_raw") or mi.get("processor") or "?"
    commit = (data.get("commit_info") or {}).get("id")
    head = f"Machine: {cpu}; {data.get('datetime', '')}"
    if commit:
        head += f"; commit {commit[:10]}" + (" (dirty)" if data["commit_info"].get("dirty") else "")
    print(head)
    print("Medians; ratios = other engine's time / qlinear's time (>1: qlinear faster).")

    sections = [("W4A8 (int4 weights, int8 activations)", "w4a8", table_w4a8),
                ("W8A8 (int8 weights, int8 activations)", "w8a8", table_w8a8),
                ("Float activations (low-memory)", "float", table_float),
                ("Per-call overhead", "overhead", table_overhead)]
    for title, kind, fn in sections:
        if kind in rows:
            print(f"\n### {title}\n")
            print("\n".join(fn(rows[kind])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
