"""Structured output (response_format json_schema): the token masks' cost, and a server under load.

masks   the cost of a token's mask (compute it and apply it to a logits row) on the trained
        models' tokenizer (models/tokenizer, 4,096 tokens) and on Qwen2.5's vocabulary size (the
        synthetic Qwen2.5-0.5B-shaped lm head: 151,936 rows over a 4,096-token tokenizer), for
        llguidance (what the server uses) and xgrammar, walking valid documents of random
        schemas token by token; and the share of a batch-8 decode step that 8 masks take.
serve   N requests with random JSON schemas (nested objects, enums, arrays, required fields)
        from C concurrent openai clients at temperature 0.7: every answer must parse and
        validate (jsonschema); the aggregate tok/s, and the server process's CPU time per token,
        against the same requests without response_format generating as many tokens each.

    python bench/structured.py masks [--model models/stdlib-qwen2] [--docs 40]
    python bench/structured.py serve [--model models/stdlib-qwen2] [--requests 500] [--clients 8] [--rounds 3]

Schemas bound their strings (maxLength), arrays (maxItems) and numbers' digits (multipleOf): a
weak model may otherwise write one string or number for ever, and the answer would end at
max_tokens, cut (finish_reason "length").
"""

from __future__ import annotations

import argparse
import json
import os
import random
import string
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
WORDS = ["red", "green", "blue", "small", "large", "open", "closed", "alpha", "beta", "none", "auto", "x"]
NAMES = ["id", "name", "kind", "size", "tags", "items", "owner", "count", "state", "color", "note", "level",
         "user", "limit", "mode", "path", "score", "flags", "child", "value"]


def random_schema(rng: random.Random, depth: int = 0) -> dict:
    """A JSON schema: an object of 1-5 properties (leaves, arrays, nested objects up to depth 2),
    some required, no others allowed."""
    props = {}
    for name in rng.sample(NAMES, rng.randint(1, 5)):
        roll = rng.random()
        if roll < 0.15 and depth < 2:
            props[name] = random_schema(rng, depth + 1)
        elif roll < 0.35:
            items = random_schema(rng, depth + 1) if depth < 1 and rng.random() < 0.3 else _leaf(rng)
            props[name] = {"type": "array", "items": items, "maxItems": rng.randint(1, 4)}
        else:
            props[name] = _leaf(rng)
    required = [n for n in props if rng.random() < 0.7]
    return {"type": "object", "properties": props, "required": required, "additionalProperties": False}


def _leaf(rng: random.Random) -> dict:
    kind = rng.choice(["string", "enum", "integer", "boolean", "number"])
    if kind == "string":
        return {"type": "string", "maxLength": rng.randint(1, 16)}
    if kind == "enum":
        return {"type": "string", "enum": rng.sample(WORDS, rng.randint(2, 4))}
    if kind == "integer":
        lo = rng.randint(-50, 50)
        return {"type": "integer", "minimum": lo, "maximum": lo + rng.randint(1, 1000)}
    if kind == "number":
        return {"type": "number", "minimum": 0, "maximum": 100, "multipleOf": 0.25}  # else digits without end
    return {"type": "boolean"}


def random_instance(schema: dict, rng: random.Random):
    """A document valid under a schema of random_schema's."""
    t = schema.get("type")
    if "enum" in schema:
        return rng.choice(schema["enum"])
    if t == "object":
        props = schema["properties"]
        return {n: random_instance(s, rng) for n, s in props.items()
                if n in schema["required"] or rng.random() < 0.5}
    if t == "array":
        return [random_instance(schema["items"], rng) for _ in range(rng.randint(0, schema["maxItems"]))]
    if t == "string":
        return "".join(rng.choice(string.ascii_lowercase + " ") for _ in range(rng.randint(0, schema["maxLength"])))
    if t == "integer":
        return rng.randint(schema["minimum"], schema["maximum"])
    if t == "number":
        # llguidance writes multipleOf 0.25 as an integer or with two decimals ("12.50", not "12.5")
        return rng.choice([rng.randint(0, 100), rng.randint(0, 99) + rng.choice([0.25, 0.75])])
    return rng.random() < 0.5


def dumps(doc) -> str:
    return json.dumps(doc, separators=(", ", ": "))


# -- masks ------------------------------------------------------------------------------------
COMPILE = {"llguidance": [], "xgrammar": []}  # seconds to compile a schema's grammar, per library


def _walk_llguidance(grammars, schema, ids, rows):
    from qlinear.llm.serve import structured

    logits = np.zeros(rows, np.float32)
    t0 = time.perf_counter()
    c = grammars.constraint(structured.json_grammar(schema))
    COMPILE["llguidance"].append(time.perf_counter() - t0)
    times = []
    for t in ids:
        t0 = time.perf_counter()
        masked = c.mask(logits)
        times.append(time.perf_counter() - t0)
        assert masked[t] == 0, f"llguidance forbade token {t}"
        assert c.advance(t)
    return times


def _walk_xgrammar(xgr, compiler, info, schema, ids, rows):
    import torch

    t0 = time.perf_counter()
    grammar = compiler.compile_json_schema(json.dumps(schema), any_whitespace=False, separators=(", ", ": "))
    matcher = xgr.GrammarMatcher(grammar)
    COMPILE["xgrammar"].append(time.perf_counter() - t0)
    bitmask = xgr.allocate_token_bitmask(1, info.vocab_size)
    logits = torch.zeros(1, rows)
    times = []
    for t in ids:
        t0 = time.perf_counter()
        matcher.fill_next_token_bitmask(bitmask)
        masked = logits.clone()
        xgr.apply_token_bitmask_inplace(masked[:, :info.vocab_size], bitmask)
        masked[:, info.vocab_size:] = -float("inf")
        times.append(time.perf_counter() - t0)
        assert masked[0, t] == 0, f"xgrammar forbade token {t}"
        assert matcher.accept_token(t)
    return times


def step_ms(model_dir: Path, batch: int = 8, position: int = 64, repeats: int = 30) -> float:
    """The batched decode step's median ms at ``batch`` sequences (as serve_load.py step)."""
    from qlinear import llm
    from qlinear.llm.runtime.step import decode_step

    model = llm.load(model_dir, max_context=position + repeats + 1, progress=False)
    step = decode_step(model.blocks, model.norm, model.lm_head, model.cache)
    caches = [model.new_cache(position + repeats + 1) for _ in range(batch)]
    h = np.ascontiguousarray(model.embedding([11] * batch), np.float32)
    times = []
    for i in range(repeats):
        t0 = time.perf_counter()
        step.step_batch(h, [position + i] * batch, [c.k for c in caches], [c.v for c in caches],
                        [c.capacity for c in caches])
        times.append(time.perf_counter() - t0)
    return 1000 * float(np.median(times[1:]))


def masks(model_dir: Path, docs: int, seed: int = 0) -> dict:
    from qlinear.llm.runtime.tokenizer import Tokenizer
    from qlinear.llm.serve.structured import Grammars

    tok = Tokenizer.from_dir(model_dir)
    rng = random.Random(seed)
    schemas = [random_schema(rng) for _ in range(docs)]
    walks = [(s, tok.encode(dumps(random_instance(s, rng)))) for s in schemas]
    tokens = sum(len(ids) for _, ids in walks)
    out = {"tokens": tokens, "documents": docs}
    for rows in (tok.vocab_size, 151936):
        grammars = Grammars(tok)
        t = [x for s, ids in walks for x in _walk_llguidance(grammars, s, ids, rows)]
        out[f"llguidance_us_{rows}"] = 1e6 * float(np.mean(t))
        print(f"llguidance, {rows} rows: {out[f'llguidance_us_{rows}']:.1f} us per token "
              f"(median {1e6 * np.median(t):.1f}) over {tokens} tokens", flush=True)
    try:
        t0 = time.perf_counter()
        import xgrammar as xgr
        from transformers import PreTrainedTokenizerFast
        out["xgrammar_import_s"] = time.perf_counter() - t0
        hf = PreTrainedTokenizerFast(tokenizer_file=str(model_dir / "tokenizer.json"))
        info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=tok.vocab_size, stop_token_ids=sorted(tok.stop_ids))
        compiler = xgr.GrammarCompiler(info, max_threads=1)
        for rows in (tok.vocab_size, 151936):
            t = [x for s, ids in walks for x in _walk_xgrammar(xgr, compiler, info, s, ids, rows)]
            out[f"xgrammar_us_{rows}"] = 1e6 * float(np.mean(t))
            print(f"xgrammar, {rows} rows: {out[f'xgrammar_us_{rows}']:.1f} us per token "
                  f"(median {1e6 * np.median(t):.1f}); its import {out['xgrammar_import_s']:.1f} s "
                  "(torch, transformers)", flush=True)
    except ImportError as e:
        print(f"xgrammar not measured: {e}")
    for lib, t in COMPILE.items():
        if t:
            out[f"{lib}_compile_ms"] = 1000 * float(np.mean(t))
            print(f"{lib}: {out[f'{lib}_compile_ms']:.2f} ms to compile a schema (mean of {len(t)})")
    ms = step_ms(model_dir)
    share = 8 * out[f"llguidance_us_{tok.vocab_size}"] / 1000 / ms
    out.update(step_ms_batch8=ms, mask_share_batch8=share)
    print(f"{model_dir.name}: batch-8 decode step {ms:.2f} ms; 8 llguidance masks {100 * share:.1f}% of it")
    return out


# -- serve --------------------------------------------------------------------------------------
def prompt(schema: dict) -> str:
    """A short request (the trained models' context is 512 tokens)."""
    return "A JSON object with the keys " + ", ".join(schema["properties"]) + ":"


def _requests(n: int, seed: int) -> list:
    rng = random.Random(seed)
    return [random_schema(rng) for _ in range(n)]


def run_clients(base_url: str, model_name: str, schemas: list, clients: int, lengths=None,
                max_tokens: int = 256, seed: int = 0) -> dict:
    """Every schema's request through ``clients`` concurrent openai clients, with response_format
    (answers validated), or when ``lengths`` is given without it, each generating exactly its
    structured twin's number of tokens (ignore_eos): the same prompts, prefills and tokens."""
    import jsonschema
    import openai

    local = threading.local()
    lock = threading.Lock()
    tally = {"valid": 0, "finish": {}, "tokens": 0, "lengths": [0] * len(schemas), "failures": []}

    def one(i):
        if not hasattr(local, "client"):
            local.client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=600)
        schema = schemas[i]
        if lengths is None:
            extra = {"max_tokens": max_tokens, "response_format": {
                "type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema, "strict": True}}}
        else:
            extra = {"max_tokens": lengths[i], "extra_body": {"ignore_eos": True}}
        r = local.client.chat.completions.create(
            model=model_name, temperature=0.7, seed=seed + i, messages=[{"role": "user", "content": prompt(schema)}],
            **extra)
        text, finish = r.choices[0].message.content, r.choices[0].finish_reason
        ok, error = False, None
        try:
            jsonschema.validate(json.loads(text), schema)
            ok = True
        except (ValueError, jsonschema.ValidationError) as e:
            error = f"{type(e).__name__}: {str(e)[:120]}"
        with lock:
            tally["tokens"] += r.usage.completion_tokens
            tally["lengths"][i] = r.usage.completion_tokens
            tally["finish"][finish] = tally["finish"].get(finish, 0) + 1
            tally["valid"] += ok
            if not ok and lengths is None and len(tally["failures"]) < 5:
                tally["failures"].append({"text": text[:300], "finish": finish, "error": error})

    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(one, range(len(schemas))))
    tally["seconds"] = time.perf_counter() - t0
    tally["tok_s"] = tally["tokens"] / tally["seconds"]
    return tally


def _cpu_seconds(pid: int) -> float:
    """CPU time of a process, all its threads (Linux /proc: utime + stime)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def serve(model_dir: Path, requests: int, clients: int, threads: int, rounds: int = 3) -> dict:
    """Rounds of the structured requests and their unconstrained twins, alternated; a server
    process of its own (serve_load.Server), the clients in this one."""
    sys.path.insert(0, str(Path(__file__).parent))
    from serve_load import NAME, Server

    from qlinear import llm

    context = llm.load(model_dir, progress=False).max_context
    schemas = _requests(requests, seed=1)
    out = {"requests": requests, "clients": clients, "structured": [], "free": []}
    with Server(model_dir, threads, max_batch=clients, max_context=context, max_queue=requests) as server:
        run_clients(server.url, NAME, schemas[:clients], clients)  # warm up (llguidance's tokenizer)
        for _ in range(rounds):
            s, f = {}, {}
            for r, lengths in ((s, None), (f, "s")):
                cpu = _cpu_seconds(server.proc.pid)
                r.update(run_clients(server.url, NAME, schemas, clients, lengths=lengths and s["lengths"]))
                r["server_cpu_ms_per_token"] = 1000 * (_cpu_seconds(server.proc.pid) - cpu) / r["tokens"]
            for name, r in (("structured", s), ("free", f)):
                out[name].append({k: v for k, v in r.items() if k != "lengths"})
                print(f"{name}: {r['tokens']} tokens in {r['seconds']:.1f} s, {r['tok_s']:.1f} tok/s, the server's "
                      f"CPU {r['server_cpu_ms_per_token']:.3f} ms per token"
                      + (f"; {r['valid']}/{requests} valid; finish {r['finish']}" if name == "structured" else ""),
                      flush=True)
            for failure in s["failures"]:
                print("  failed:", failure)
    out["valid"] = min(r["valid"] for r in out["structured"])
    out["round_ratios"] = [s["tok_s"] / f["tok_s"] for s, f in zip(out["structured"], out["free"])]
    out["cpu_ratio"] = float(np.mean([r["server_cpu_ms_per_token"] for r in out["free"]])
                             / np.mean([r["server_cpu_ms_per_token"] for r in out["structured"]]))
    out["ratio"] = float(np.mean([r["tok_s"] for r in out["structured"]]) / np.mean([r["tok_s"] for r in out["free"]]))
    print(f"{model_dir.name}: {out['valid']}/{requests} valid in every round; structured / unconstrained "
          f"throughput {out['ratio']:.3f} (rounds {', '.join(f'{r:.3f}' for r in out['round_ratios'])}), the server's CPU per token (unconstrained / structured) "
          f"{out['cpu_ratio']:.3f} ({clients} clients, {threads} threads)")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("mode", choices=["masks", "serve"])
    p.add_argument("--model", type=Path, default=ROOT / "models" / "stdlib-qwen2")
    p.add_argument("--docs", type=int, default=40)
    p.add_argument("--requests", type=int, default=500)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", type=Path, help="write the figures here")
    args = p.parse_args(argv)
    out = (masks(args.model, args.docs) if args.mode == "masks"
           else serve(args.model, args.requests, args.clients, args.threads, args.rounds))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0 if args.mode == "masks" or out["valid"] == args.requests else 1


if __name__ == "__main__":
    sys.exit(main())
