"""Speculative decoding on the trained model (models/stdlib-qwen2, its draft model
models/stdlib-qwen2-draft): plain decode vs n-gram (prompt lookup) vs the draft model, tok/s and
drafts kept, at 1 and 2 threads, beside llama.cpp's own `llama-lookup` (n-gram) and
`llama-speculative` (draft model) on the same GGUF files (Q4_0 of both, made by llama.cpp's
converter and llama-quantize) and the same prompts, in interleaved rounds.

Tasks, from the held-out standard-library files (tools/train_models.py, never trained on):
- copy: a function's source, then its first line again under another name: the body that follows
  is in the prompt (a function re-emitted with an edit);
- extend: the first lines of a held-out file twice over and its first line once more (text that
  repeats);
- free: a held-out file's first lines, continued (nothing to copy).
Greedy, 128 tokens each; decode tok/s = decoded tokens / decode time (prefill excluded).

Two targets: the trained model itself (5.8 M parameters: its weights sit in the CPU's caches, so
a verification's extra rows cost compute, not memory), and "wide": the trained model grown to
Qwen2.5-0.5B's shape (hidden 896, 14 heads, intermediate 4864, 24 layers; `synthetic.
widen_checkpoint`: zero residual dimensions and silent layers, so it predicts exactly what the
trained model predicts) whose decode streams a 0.5B model's weights per token, the memory wall
speculative decoding is for. The draft model is the same for both.

    python bench/llamacpp_vs.py --build   # llama.cpp's tools, once
    python bench/speculative.py [--targets trained wide] [--threads 1 2] [--rounds 3] [--tokens 128]
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

import llamacpp_vs as lc  # noqa: E402
import train_models as tm  # noqa: E402

import qlinear  # noqa: E402
from qlinear import llm  # noqa: E402
from qlinear.llm.runtime.speculative import Speculation  # noqa: E402

MODELS = Path(__file__).resolve().parents[1] / "models"
TARGET, DRAFT = MODELS / "stdlib-qwen2", MODELS / "stdlib-qwen2-draft"
FILES = ("textwrap.py", "difflib.py", "statistics.py", "fractions.py")


def tasks(tokenizer, per_task: int = 4, max_prompt: int = 360) -> dict:
    """task -> prompts (text), each under ``max_prompt`` tokens (the model's context is 512)."""
    out = {"copy": [], "extend": [], "free": []}
    for name in FILES:
        src = tm.read(name)
        lines = src.splitlines(keepends=True)
        fns = [n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.FunctionDef) and 6 <= n.end_lineno - n.lineno <= 20]
        for f in fns[:2]:
            body = "".join(lines[f.lineno - 1:f.end_lineno])
            prompt = body + "\n\n" + lines[f.lineno - 1].replace(f.name, f.name + "_v2", 1)
            if len(tokenizer.encode(prompt)) <= max_prompt:
                out["copy"].append(prompt)
        head = "".join(lines[20:32])
        out["extend"].append(head + head + lines[20])
        out["free"].append(tokenizer.decode(tokenizer.encode("".join(lines[:40]))[:max_prompt - 8]))
    for k in out:
        out[k] = [p for p in out[k] if len(tokenizer.encode(p)) <= max_prompt][:per_task]
    return out


def qlinear_run(model, prompt_ids, tokens: int, spec) -> dict:
    model.reset()
    model.generate_ids(prompt_ids, tokens, stop_ids=(), **({} if spec is None else {"speculative": spec}))
    s = model.stats
    return {"tok_s": s.decode_tok_s, "drafted": s.draft_tokens, "accepted": s.accepted_tokens}


def llamacpp_run(tool: str, target: Path, draft: Path, prompt: str, tokens: int, threads: int, tmp: Path) -> dict:
    pf = tmp / "prompt.txt"
    pf.write_text(prompt)
    args = [str(lc.tool(tool)), "-m", str(target), "-f", str(pf), "-n", str(tokens), "--temp", "0", "-t", str(threads),
            "-c", "512", "--spec-draft-n-max", "8"] if tool == "llama-lookup" else \
           [str(lc.tool(tool)), "-m", str(target), "-md", str(draft), "-f", str(pf), "-n", str(tokens), "--temp", "0",
            "-t", str(threads), "-td", str(threads), "-c", "512", "--spec-draft-n-max", "8"]
    for _ in range(6):  # its log thread now and then leaves out the closing lines: run again
        r = subprocess.run(args, capture_output=True, text=True, errors="replace", timeout=600)
        text = r.stdout + r.stderr
        m = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", text)
        if r.returncode != 0 or m:
            break
    if r.returncode != 0 or not m:
        raise RuntimeError(f"{tool} failed ({r.returncode}): {text[-1500:]}")
    drafted = re.search(r"n_drafted\s*=\s*(\d+)", text)
    accepted = re.search(r"n_accept\s*=\s*(\d+)", text)
    return {"tok_s": int(m.group(1)) / float(m.group(2)), "drafted": int(drafted.group(1)) if drafted else 0,
            "accepted": int(accepted.group(1)) if accepted else 0}


def wide_target() -> Path:
    """The trained model at Qwen2.5-0.5B's shape (cached beside the other bench models)."""
    from qlinear.llm import synthetic
    out = Path(os.environ.get("QLINEAR_BENCH_MODELS", Path.home() / ".cache" / "qlinear-bench")) / "stdlib-qwen2-wide-0.5b"
    if not (out / "model.safetensors").is_file():
        synthetic.widen_checkpoint(TARGET, out, "qwen2.5-0.5b", force=True)
    return out


def gguf(hf: Path, quant: str = "Q4_0") -> Path:
    """llama.cpp's file of a checkpoint (cached by name), made anew when the checkpoint is newer
    than the cached files (a model trained again)."""
    for q in ("F32", quant):
        out = lc.CACHE / f"{hf.name}-{q}.gguf"
        if out.exists() and out.stat().st_mtime < (hf / "model.safetensors").stat().st_mtime:
            out.unlink()
    return lc.checkpoint_gguf(hf, quant)


def run_target(hf: Path, a, peers: bool) -> dict:
    """(task, threads, engine) -> runs, interleaved: every engine on each prompt in turn."""
    gguf_t = gguf(hf) if peers else None
    gguf_d = gguf(DRAFT) if peers else None
    target = llm.load(gguf_t if peers else hf, bits=4, group_size=32, symmetric=True, progress=False)
    draft = llm.load(gguf_d if peers else DRAFT, bits=4, group_size=32, symmetric=True, progress=False)
    prompts = tasks(target.tokenizer)
    engines = {"qlinear plain": None, "qlinear ngram": Speculation("ngram"), "qlinear draft": Speculation("draft", draft)}
    results = {}
    with tempfile.TemporaryDirectory() as d:
        for _ in range(a.rounds):
            for threads in a.threads:
                qlinear.set_num_threads(threads)
                for task, texts in prompts.items():
                    for text in texts:
                        ids = target.tokenizer.encode(text)
                        for name, spec in engines.items():
                            results.setdefault((task, threads, name), []).append(qlinear_run(target, ids, a.tokens, spec))
                        if peers:
                            for name, tool in (("llama.cpp lookup", "llama-lookup"), ("llama.cpp speculative", "llama-speculative")):
                                results.setdefault((task, threads, name), []).append(
                                    llamacpp_run(tool, gguf_t, gguf_d, text, a.tokens, threads, Path(d)))
    return results


def print_table(results: dict, threads_list) -> None:
    print("| task | threads | engine | decode tok/s (median) | vs qlinear plain | drafts kept |")
    print("|---|---|---|---|---|---|")
    for task in dict.fromkeys(k[0] for k in results):
        for threads in threads_list:
            plain = statistics.median(r["tok_s"] for r in results[(task, threads, "qlinear plain")])
            for name in dict.fromkeys(k[2] for k in results if k[:2] == (task, threads)):
                runs = results[(task, threads, name)]
                tok_s = statistics.median(r["tok_s"] for r in runs)
                drafted, kept = sum(r["drafted"] for r in runs), sum(r["accepted"] for r in runs)
                rate = f"{kept} / {drafted} ({100 * kept / drafted:.0f}%)" if drafted else "—"
                print(f"| {task} | {threads} | {name} | {tok_s:.1f} | {tok_s / plain:.2f}x | {rate} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--targets", nargs="+", default=["trained", "wide"], choices=["trained", "wide"])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128)
    a = ap.parse_args()
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    peers = lc.tool("llama-lookup").exists() and lc.tool("llama-speculative").exists()
    for name in a.targets:
        hf = TARGET if name == "trained" else wide_target()
        results = run_target(hf, a, peers)
        print(f"\n{name}: {hf.name} ({'Q4_0 GGUF, both engines on the same file' if peers else 'int4 g32'}; draft: "
              f"stdlib-qwen2-draft), greedy {a.tokens} tokens, {a.rounds} rounds; CPU {cpu}, qlinear level "
              f"{qlinear.cpu_info()['active_isa']}\n")
        print_table(results, a.threads)


if __name__ == "__main__":
    main()
