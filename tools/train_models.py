"""Train the small language models in models/ on Python's standard-library sources, so that
quality, speculative acceptance and expert routing are measured on a model that learned its text.

    python tools/train_models.py                 # all three (~2 h on 2 cores), into models/
    python tools/train_models.py --only draft    # one of them; the tokenizer is made first if missing
    python tools/train_models.py --steps 20 --out /tmp/m   # a quick trial of the whole pipeline
    python tools/train_models.py --agreement models/stdlib-qwen2-draft   # its top-1 agreement with stdlib-qwen2

Models (one tokenizer, a byte-level BPE of 4,096 tokens trained here, ChatML):
- ``stdlib-qwen2``: Qwen2 architecture, hidden 256, 6 layers, 4 query / 2 key-value heads,
  intermediate 768, tied embeddings, context 512;
- ``stdlib-qwen2-draft``: the same tokenizer, hidden 128, 2 layers: the draft model of
  speculative decoding, distilled from ``stdlib-qwen2`` (trained after it: its loss is mostly the
  KL divergence from that model's softmax on the same sequences);
- ``stdlib-qwen3moe``: Qwen3-MoE, hidden 256, 4 layers, 8 experts of width 256, top-2, so that
  its router is a trained one.
Every K of every linear layer is a multiple of 256, as llama.cpp's k-quants need.

Deterministic: fixed seeds, the file split below, files in sorted order, sequences drawn from a
seeded generator, a fixed step count (not a time budget). The stdlib differs between Python
versions: the log records the version, the file count and a hash of the training text. Torch
runs with 2 threads; other thread counts change float rounding, not the recipe.

Each model directory gets config.json, model.safetensors (bfloat16), the tokenizer files and
training_log.json (the loss curve, held-out loss, tokens seen, time, CPU, versions; a distilled
model's teacher, its hash, and how often its top token is the teacher's on the held-out text).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import platform
import shutil
import sys
import sysconfig
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STDLIB = Path(sysconfig.get_paths()["stdlib"])
CONTEXT = 512
VOCAB = 4096
DISTILL_WEIGHT = 0.9  # a distilled model's loss: this much KL from its teacher, the rest next-token

# Never trained on (neither the tokenizer nor the models): the held-out text of the quality
# figures, the speculative-decoding tasks and the tests.
HELD_OUT = (
    "bisect.py", "calendar.py", "csv.py", "difflib.py", "fnmatch.py", "fractions.py", "glob.py",
    "heapq.py", "shlex.py", "statistics.py", "string.py", "textwrap.py",
    "json/decoder.py", "json/encoder.py", "email/utils.py", "http/cookies.py",
    "test/test_heapq.py", "test/test_textwrap.py",
)
# Not text a model should learn: generated tables and documentation dumps.
SKIPPED_DIRS = ("site-packages", "pydoc_data", "encodings", "lib2to3", "__pycache__")

MODELS = {
    "stdlib-qwen2": dict(
        arch="Qwen2Config", hidden_size=256, intermediate_size=768, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=2, steps=900, batch=8, lr=2e-3, seed=1),
    # distilled: its loss is mostly the KL divergence from the trained model's softmax on the same
    # sequences (DISTILL_WEIGHT), so that it predicts what the model predicts, not the text alone;
    # 2 layers, so that it can copy from its context as the model does (an induction head needs 2)
    "stdlib-qwen2-draft": dict(
        arch="Qwen2Config", hidden_size=128, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, steps=840, batch=8, lr=3e-3, seed=2,
        teacher="stdlib-qwen2"),
    "stdlib-qwen3moe": dict(
        arch="Qwen3MoeConfig", hidden_size=256, intermediate_size=768, moe_intermediate_size=256,
        num_experts=8, num_experts_per_tok=2, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=64, steps=600, batch=8, lr=2e-3, seed=3),
}


def split_files() -> tuple:
    """(training files, held-out files), relative to the stdlib, sorted."""
    train, held = [], []
    for path in sorted(STDLIB.rglob("*.py")):
        rel = path.relative_to(STDLIB).as_posix()
        if any(part in SKIPPED_DIRS for part in path.relative_to(STDLIB).parts):
            continue
        (held if rel in HELD_OUT else train).append(rel)
    missing = sorted(set(HELD_OUT) - set(held))
    if missing:
        raise SystemExit(f"held-out files missing from {STDLIB}: {missing}")
    return train, held


def read(rel: str) -> str:
    return (STDLIB / rel).read_text(encoding="utf-8", errors="replace")


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def make_tokenizer(out: Path, train_files: list) -> None:
    sys.path.insert(0, str(ROOT / "python"))
    from qlinear.llm.synthetic import train_tokenizer  # noqa: PLC0415

    train_tokenizer(out, vocab_size=VOCAB, text=(read(f) for f in train_files))


def token_stream(tok_dir: Path, files: list):
    """The files' tokens, each file followed by <|endoftext|>, as one int32 array."""
    import numpy as np  # noqa: PLC0415
    from tokenizers import Tokenizer  # noqa: PLC0415

    tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    eot = tok.token_to_id("<|endoftext|>")
    parts = []
    for enc in tok.encode_batch([read(f) for f in files], add_special_tokens=False):
        parts.append(np.asarray(enc.ids + [eot], np.int32))
    return np.concatenate(parts)


def model_config(spec: dict, tok_dir: Path):
    import transformers  # noqa: PLC0415
    from tokenizers import Tokenizer  # noqa: PLC0415

    tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    fields = {k: v for k, v in spec.items() if k not in ("arch", "steps", "batch", "lr", "seed", "teacher")}
    extra = {"router_aux_loss_coef": 0.01, "output_router_logits": True, "norm_topk_prob": True,
             "decoder_sparse_step": 1, "mlp_only_layers": []} if spec["arch"] == "Qwen3MoeConfig" else {}
    return getattr(transformers, spec["arch"])(
        vocab_size=VOCAB, max_position_embeddings=CONTEXT, rms_norm_eps=1e-6, rope_theta=10000.0,
        tie_word_embeddings=True, bos_token_id=tok.token_to_id("<|endoftext|>"),
        eos_token_id=tok.token_to_id("<|im_end|>"), pad_token_id=tok.token_to_id("<|endoftext|>"),
        attention_dropout=0.0, **extra, **fields)


def file_sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def load_teacher(path: Path):
    """A trained model (float32, inference only) whose softmax a distilled model learns."""
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415

    teacher = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    return teacher


def top1(model, windows, batch: int = 8):
    """The model's most likely next token at every position of ``windows`` (n, CONTEXT)."""
    import torch  # noqa: PLC0415

    with torch.no_grad():
        return torch.cat([model(input_ids=windows[i:i + batch]).logits.argmax(-1) for i in range(0, len(windows), batch)])


def held_out_windows(held_ids):
    """32 windows of CONTEXT tokens spread evenly over the held-out text."""
    import numpy as np  # noqa: PLC0415
    import torch  # noqa: PLC0415

    starts = np.linspace(0, len(held_ids) - CONTEXT, 32).astype(np.int64)
    return torch.from_numpy(np.stack([held_ids[s:s + CONTEXT] for s in starts]).astype(np.int64))


def train(name: str, spec: dict, out: Path, tok_dir: Path, train_ids, held_ids, steps: int, log_every: int) -> None:
    import numpy as np  # noqa: PLC0415
    import torch  # noqa: PLC0415
    import torch.nn.functional as F  # noqa: PLC0415, N812
    import transformers  # noqa: PLC0415

    torch.manual_seed(spec["seed"])
    config = model_config(spec, tok_dir)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for n, p in model.named_parameters() if p.ndim == 2 and "embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim == 2 and "embed" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=spec["lr"], betas=(0.9, 0.95), eps=1e-8)
    warmup = max(1, steps // 20)

    def lr_at(step):  # linear warm-up, cosine down to a tenth
        if step < warmup:
            return spec["lr"] * (step + 1) / warmup
        t = (step - warmup) / max(1, steps - warmup)
        return spec["lr"] * (0.1 + 0.45 * (1 + math.cos(math.pi * t)))

    rng = np.random.default_rng(spec["seed"])
    held = held_out_windows(held_ids)
    teacher = load_teacher(out.parent / spec["teacher"]) if spec.get("teacher") else None
    teacher_top1 = top1(teacher, held) if teacher is not None else None

    def held_out_loss() -> float:
        model.eval()
        with torch.no_grad():
            losses = [model(input_ids=held[i:i + 8], labels=held[i:i + 8]).loss.item()
                      for i in range(0, len(held), 8)]
        model.train()
        return float(np.mean(losses))

    def agreement() -> dict:  # how often the model's top token is the teacher's, on held-out text
        model.eval()
        same = float((top1(model, held) == teacher_top1).float().mean())
        model.train()
        return {"agreement_with_teacher": round(same, 4)}

    curve, evals = [], []
    t0 = time.perf_counter()
    model.train()
    for step in range(steps):
        starts = rng.integers(0, len(train_ids) - CONTEXT - 1, spec["batch"])
        batch = torch.from_numpy(np.stack([train_ids[s:s + CONTEXT] for s in starts]).astype(np.int64))
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        out_ = model(input_ids=batch, labels=batch)
        loss, kl = out_.loss, None
        if teacher is not None:  # KL(teacher || model) per token, on the same sequences
            with torch.no_grad():
                target = F.log_softmax(teacher(input_ids=batch).logits.flatten(0, 1), -1)
            kl = F.kl_div(F.log_softmax(out_.logits.flatten(0, 1), -1), target, log_target=True,
                          reduction="batchmean")
            loss = DISTILL_WEIGHT * kl + (1 - DISTILL_WEIGHT) * out_.loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % log_every == 0 or step == steps - 1:
            lm_loss = float(out_.loss.item() - (config.router_aux_loss_coef * out_.aux_loss.item()
                                                 if getattr(out_, "aux_loss", None) is not None else 0.0))
            curve.append({"step": step, "tokens": (step + 1) * spec["batch"] * CONTEXT, "loss": round(lm_loss, 4),
                          **({} if kl is None else {"kl": round(kl.item(), 4)}),
                          "lr": round(lr_at(step), 6), "seconds": round(time.perf_counter() - t0, 1)})
            print(f"{name} step {step}/{steps} loss {lm_loss:.3f}{'' if kl is None else f' kl {kl.item():.3f}'} "
                  f"lr {lr_at(step):.2e} {curve[-1]['seconds']:.0f} s", flush=True)
        if (step + 1) % max(1, steps // 8) == 0 or step == steps - 1:
            evals.append({"step": step, "held_out_loss": round(held_out_loss(), 4),
                          **(agreement() if teacher is not None else {})})
            print(f"{name} step {step} held-out {evals[-1]}", flush=True)
    seconds = time.perf_counter() - t0

    out.mkdir(parents=True, exist_ok=True)
    model.config.output_router_logits = False  # an inference checkpoint
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    (out / "generation_config.json").unlink(missing_ok=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tok_dir / f, out / f)
    distilled = {} if teacher is None else {
        "distilled_from": spec["teacher"], "teacher_sha256": file_sha256(out.parent / spec["teacher"] / "model.safetensors"),
        "distill_loss": f"{DISTILL_WEIGHT} * KL(teacher || model) + {1 - DISTILL_WEIGHT:.1f} * next-token cross-entropy",
        "held_out_agreement_with_teacher": evals[-1]["agreement_with_teacher"]}
    return {"model": name, "parameters": n_params, "steps": steps, "batch": spec["batch"], "context": CONTEXT,
            "tokens_seen": steps * spec["batch"] * CONTEXT, "seconds": round(seconds, 1), **distilled,
            "final_held_out_loss": evals[-1]["held_out_loss"], "curve": curve, "held_out": evals}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "models"))
    ap.add_argument("--only", choices=list(MODELS), nargs="+", default=list(MODELS))
    ap.add_argument("--steps", type=int, default=None, help="override every model's step count (trials)")
    ap.add_argument("--log-every", type=int, default=20)
    ap.add_argument("--agreement", metavar="DIR", help="print how often DIR's model (a draft model) predicts "
                    "stdlib-qwen2's top token on the held-out text, and exit")
    a = ap.parse_args()

    import numpy as np  # noqa: PLC0415
    import tokenizers  # noqa: PLC0415
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415

    torch.set_num_threads(2)
    out = Path(a.out)
    tok_dir = out / "tokenizer"
    train_files, held_files = split_files()
    text_hash = hashlib.sha256("".join(read(f) for f in train_files).encode()).hexdigest()[:16]
    if not (tok_dir / "tokenizer.json").is_file():
        t = time.perf_counter()
        make_tokenizer(tok_dir, train_files)
        print(f"tokenizer trained in {time.perf_counter() - t:.0f} s", flush=True)
    train_ids, held_ids = token_stream(tok_dir, train_files), token_stream(tok_dir, held_files)
    counts = np.bincount(train_ids, minlength=VOCAB) + 1.0  # add-one unigram baseline
    p = counts / counts.sum()
    unigram = float(-np.mean(np.log(p[held_ids])))
    print(f"{len(train_files)} training files, {len(train_ids)} tokens; {len(held_files)} held-out, "
          f"{len(held_ids)} tokens; unigram held-out loss {unigram:.3f}", flush=True)
    if a.agreement:
        held = held_out_windows(held_ids)
        same = (top1(load_teacher(a.agreement), held) == top1(load_teacher(out / "stdlib-qwen2"), held)).float().mean()
        print(f"{a.agreement}: top-1 agreement with stdlib-qwen2 on {held.numel()} held-out positions: {float(same):.4f}")
        return
    for name in a.only:
        spec = MODELS[name]
        log = train(name, spec, out / name, tok_dir, train_ids, held_ids, a.steps or spec["steps"], a.log_every)
        log.update(cpu=cpu_name(), threads=torch.get_num_threads(), python=platform.python_version(),
                   torch=torch.__version__, transformers=transformers.__version__, tokenizers=tokenizers.__version__,
                   numpy=np.__version__, stdlib=str(STDLIB), training_files=len(train_files),
                   training_tokens=int(len(train_ids)), training_text_sha256=text_hash, held_out_files=list(held_files),
                   held_out_tokens=int(len(held_ids)), unigram_held_out_loss=round(unigram, 4),
                   recipe={k: v for k, v in spec.items()})
        (out / name / "training_log.json").write_text(json.dumps(log, indent=1) + "\n")
        print(f"{name}: {log['parameters'] / 1e6:.2f} M parameters, {log['tokens_seen']} tokens in "
              f"{log['seconds'] / 60:.1f} min, held-out loss {log['final_held_out_loss']:.3f} "
              f"(unigram {unigram:.3f})", flush=True)


if __name__ == "__main__":
    main()
