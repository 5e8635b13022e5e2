"""``qlinear-llm bench``: prefill and decode speed of a loaded model, and MNN.llm on the same
export or llama.cpp on the same GGUF file side by side."""

from __future__ import annotations

def bench(model, prompt_tokens: int = 64, decode_tokens: int = 32, repeats: int = 1, prompt_ids=None,
          **speculation) -> dict:
    """Prefill ``prompt_tokens`` (ids drawn from the tokenizer's vocabulary, deterministic, or the
    first of ``prompt_ids``: a text's) and decode ``decode_tokens`` greedily; the best of
    ``repeats`` runs. Decode speed counts the tokens decided from the decode forwards' logits
    (the first token comes from the prefill). ``speculation``: ``Model.stream_ids``' speculative
    options (the row then reports the drafts kept and the tokens per forward)."""
    import numpy as np

    capacity = model.cache.capacity
    if prompt_tokens < 1 or decode_tokens < 0:
        raise ValueError(f"need a prompt of >= 1 token and >= 0 decode tokens, got {prompt_tokens}, {decode_tokens}")
    if prompt_tokens + decode_tokens > capacity:
        raise ValueError(f"a {prompt_tokens}-token prompt and {decode_tokens} decoded tokens need "
                         f"{prompt_tokens + decode_tokens} positions; the context holds {capacity} "
                         "(--max-context sets it)")
    if prompt_ids is not None:
        if len(prompt_ids) < prompt_tokens:
            raise ValueError(f"the prompt text has {len(prompt_ids)} tokens, fewer than {prompt_tokens}")
        ids = [int(t) for t in prompt_ids[:prompt_tokens]]
    else:
        rng = np.random.default_rng(0)
        hi = min(model.tokenizer.vocab_size, model.config.vocab_size)
        ids = [int(t) for t in rng.integers(0, hi, prompt_tokens)]
    best = None
    for _ in range(repeats):
        model.reset()
        tokens = model.generate_ids(ids, decode_tokens + 1, stop_ids=(), **speculation)
        s = model.stats
        row = {"prompt_tokens": s.prompt_tokens, "prefill_tok_s": s.prefill_tok_s,
               "decode_tokens": s.step_tokens, "decode_tok_s": s.decode_tok_s,
               "prompt_ids": ids, "tokens": tokens}
        if speculation.get("speculative"):
            row["speculative"] = {"drafted": s.draft_tokens, "accepted": s.accepted_tokens,
                                  "acceptance_rate": s.acceptance_rate, "forwards": s.decode_steps,
                                  "tokens_per_forward": s.tokens_per_step}
        if best is None or row["decode_tok_s"] > best["decode_tok_s"]:
            best = row
    best["peak_rss_mb"] = model.stats.peak_rss_mb
    best["load_s"] = model.stats.load_s
    return best


def weight_bits(model) -> str:
    """The bits of the model's weights: "4", "8", "4+8" (e.g. a GGUF file's int8 lm head) or "float"."""
    from .runtime.layers import Linear

    parts = [model.lm_head] + [p for b in model.blocks for p in (*vars(b).values(), *vars(b.attention).values())]
    bits = sorted({getattr(m.weight, "bits", None) or 32 for m in parts if isinstance(m, Linear)})
    return "+".join("float" if b == 32 else str(b) for b in bits)


def bench_text(row: dict) -> str:
    lines = [f"threads {row['threads']}  bits {row['bits']}  act {row['act']}",
             f"prefill {row['prompt_tokens']} tokens: {row['prefill_tok_s']:.1f} tok/s",
             f"decode {row['decode_tokens']} tokens: {row['decode_tok_s']:.1f} tok/s",
             f"load {row['load_s']:.2f} s, peak RSS {row['peak_rss_mb']:.0f} MB"]
    spec = row.get("speculative")
    if spec:
        lines.insert(3, f"speculative: {spec['accepted']} of {spec['drafted']} drafted tokens kept "
                        f"({100 * spec['acceptance_rate']:.1f}%), {spec['tokens_per_forward']:.2f} tokens per forward")
    mnn = row.get("mnn")
    if mnn:
        lines += [f"MNN.llm prefill {mnn['prefill_tok_s']:.1f} tok/s, decode {mnn['decode_tok_s']:.1f} tok/s, "
                  f"peak RSS {mnn.get('peak_rss_mb', float('nan')):.0f} MB",
                  f"ratio qlinear/MNN: prefill {row['prefill_tok_s'] / mnn['prefill_tok_s']:.2f}x, "
                  f"decode {row['decode_tok_s'] / mnn['decode_tok_s']:.2f}x",
                  f"greedy tokens agree: the first {mnn['agree_tokens']} of {mnn['compared_tokens']}"]
    peer = row.get("llamacpp")
    if peer:
        lines += [f"llama.cpp prefill {peer['prefill_tok_s']:.1f} tok/s, decode {peer['decode_tok_s']:.1f} tok/s, "
                  f"peak RSS {peer['peak_rss_mb']:.0f} MB (llama-bench, {peer['cpu_path']})",
                  f"ratio qlinear/llama.cpp: prefill {row['prefill_tok_s'] / peer['prefill_tok_s']:.2f}x, "
                  f"decode {row['decode_tok_s'] / peer['decode_tok_s']:.2f}x, "
                  f"peak RSS {row['peak_rss_mb'] / peer['peak_rss_mb']:.2f}x",
                  "greedy tokens agree: " + (f"the first {peer['agree_tokens']} of {peer['compared_tokens']}"
                                             if "agree_tokens" in peer else
                                             "not compared (llama-cpp-python is not installed)")]
    return "\n".join(lines)


def bench_vs_mnn(export_dir, model, row: dict, decode_tokens: int) -> dict:
    """The same prompt through MNN.llm (a fresh process: its peak RSS is its own), greedy."""
    if model.info.get("source") != "mnn":
        raise ValueError("--vs mnn needs an MNN export directory (llm.mnn, llm.mnn.weight, ...)")
    from .peers.mnn_llm import bench_in_subprocess

    mnn = bench_in_subprocess(export_dir, row["prompt_ids"], decode_tokens, threads=row["threads"])
    mnn.update(_agreement(row["tokens"], mnn.get("tokens", [])))
    return mnn


def _agreement(ours: list, theirs: list) -> dict:
    agree = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
    return {"agree_tokens": agree, "compared_tokens": min(len(ours), len(theirs))}


def bench_vs_llamacpp(gguf_path, model, row: dict, decode_tokens: int, repeats: int = 1, where=None) -> dict:
    """llama.cpp on the same GGUF file: ``llama-bench`` (its own prompt of the same length; best
    of ``repeats``) and, with llama-cpp-python installed, the greedy tokens of our prompt."""
    if model.info.get("source") != "gguf":
        raise ValueError("--vs llamacpp needs a GGUF file")
    from .peers import llamacpp

    peer = llamacpp.bench(gguf_path, row["prompt_tokens"], decode_tokens, row["threads"], repeats, where)
    tokens = llamacpp.greedy_tokens(gguf_path, row["prompt_ids"], len(row["tokens"]), row["threads"])
    if tokens is not None:
        peer["tokens"] = tokens
        peer.update(_agreement(row["tokens"], tokens))
    return peer
