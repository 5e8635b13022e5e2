"""Multi-turn chat against qlinear-llm serve, with and without the prefix cache (``serve_load.py
chat`` runs this): conversations that send their whole history every turn, as chat apps and agent
frameworks do.

Each conversation has a system prompt of its own (no prefix is shared between conversations: the
cache only helps a conversation's later turns) and user messages of fixed size; every reply is
``--reply-tokens`` long (ignore_eos), greedy. ``--conversations`` of them run ``--parallel`` at a
time, ``--turns`` turns each. The same conversations run against a server with ``--cache-mb 0``
and one with ``--cache-mb`` B (both up; each group of ``--parallel`` conversations runs on one, then
the other, the order alternating); reported: the mean time to first token of turns 2.. (the client's:
from sending the request to the first token's event), the ratio with / without, whether every
reply is the same text in both runs, the prompt tokens reused (usage's cached_tokens), and the
cache's bytes against its budget and the server's peak RSS.
"""

from __future__ import annotations

import json
import random
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

WORDS = ("the model reads every token of the prompt before it answers and a cache keeps what it has read "
         "so that the next turn of a conversation only pays for what is new agents send long system prompts "
         "with tools and rules then many short turns while chat apps resend the whole history").split()


def _text(rng: random.Random, tokenizer, tokens: int) -> str:
    """Words drawn at random until the tokenizer makes ``tokens`` of them."""
    words = []
    while len(tokenizer.encode(" ".join(words))) < tokens:
        words.append(rng.choice(WORDS))
    return " ".join(words)


def conversations(tokenizer, count: int, turns: int, system_tokens: int, user_tokens: int, seed: int = 0) -> list:
    rng = random.Random(seed)
    return [{"system": f"Conversation {i}. " + _text(rng, tokenizer, system_tokens),
             "users": [_text(rng, tokenizer, user_tokens) for _ in range(turns)]} for i in range(count)]


def _turn(http: httpx.Client, url: str, messages: list, reply_tokens: int) -> dict:
    body = {"model": "bench", "messages": messages, "max_tokens": reply_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    first, text, usage = None, [], None
    with http.stream("POST", url + "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            raise SystemExit(f"the server answered {r.status_code}: {r.read()[:300]!r}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                usage = event["usage"]
            for choice in event["choices"]:
                piece = choice["delta"].get("content")
                if piece:
                    first = first or time.perf_counter()
                    text.append(piece)
    return {"ttft": first - t0, "text": "".join(text), "prompt_tokens": usage["prompt_tokens"],
            "cached_tokens": usage["prompt_tokens_details"]["cached_tokens"]}


def run_conversations(url: str, convs: list, parallel: int, reply_tokens: int) -> list:
    """Every conversation's turns ([conversation][turn] -> _turn's figures), ``parallel`` at a time."""
    def one(conv) -> list:
        out, messages = [], [{"role": "system", "content": conv["system"]}]
        with httpx.Client(timeout=600) as http:
            for user in conv["users"]:
                messages.append({"role": "user", "content": user})
                turn = _turn(http, url, messages, reply_tokens)
                messages.append({"role": "assistant", "content": turn["text"]})
                out.append(turn)
        return out

    with ThreadPoolExecutor(parallel) as pool:
        return list(pool.map(one, convs))


def chat(model, threads: int, server_class, conversations_: int = 8, turns: int = 6, parallel: int = 2,
         system_tokens: int = 1100, user_tokens: int = 120, reply_tokens: int = 48, cache_mb: float = 256,
         max_context: int = 4096) -> dict:
    from qlinear import llm

    tokenizer = llm.load(model, max_context=16, progress=False).tokenizer
    convs = conversations(tokenizer, conversations_, turns, system_tokens, user_tokens)
    budgets = (0, cache_mb)
    servers = []
    try:  # both servers up, one busy at a time: each group of conversations runs on one then the
        # other, the order alternating (the machine's load drifts alike for both)
        for b in budgets:
            servers.append(server_class(model, threads, max_batch=parallel, max_context=max_context,
                                        extra=("--cache-mb", str(b))))
        runs = {b: {"turns": [], "seconds": 0.0} for b in budgets}
        for g, first in enumerate(range(0, conversations_, parallel)):
            group = convs[first:first + parallel]
            for i in (0, 1) if g % 2 == 0 else (1, 0):
                t0 = time.perf_counter()
                runs[budgets[i]]["turns"] += run_conversations(servers[i].url, group, parallel, reply_tokens)
                runs[budgets[i]]["seconds"] += time.perf_counter() - t0
        for b, server in zip(budgets, servers):
            runs[b].update(prefix_cache=server.health()["prefix_cache"], peak_rss_mb=server.peak_rss_mb())
    finally:
        for server in servers:
            server.close()
    plain, cached = runs[0], runs[cache_mb]
    later = lambda run: [t["ttft"] for conv in run["turns"] for t in conv[1:]]  # noqa: E731
    figures = {
        "conversations": conversations_, "turns": turns, "parallel": parallel, "reply_tokens": reply_tokens,
        "prompt_tokens_by_turn": [round(statistics.mean(c[t]["prompt_tokens"] for c in cached["turns"]))
                                  for t in range(turns)],
        "ttft_turn1_s": {k: round(statistics.mean(c[0]["ttft"] for c in r["turns"]), 4)
                         for k, r in (("no_cache", plain), ("cache", cached))},
        "ttft_later_turns_s": {"no_cache": round(statistics.mean(later(plain)), 4),
                               "cache": round(statistics.mean(later(cached)), 4)},
        "cached_tokens_later_turns": round(statistics.mean(t["cached_tokens"] for c in cached["turns"] for t in c[1:])),
        "same_replies": all(a["text"] == b["text"] for ca, cb in zip(plain["turns"], cached["turns"])
                            for a, b in zip(ca, cb)),
        "seconds": {"no_cache": round(plain["seconds"], 2), "cache": round(cached["seconds"], 2)},
        "cache_bytes": cached["prefix_cache"]["bytes"], "cache_budget_bytes": cached["prefix_cache"]["budget_bytes"],
        "cache_evicted_blocks": cached["prefix_cache"]["evicted_blocks"],
        "cache_hit_rate": cached["prefix_cache"]["hit_rate"],
        "peak_rss_mb": {"no_cache": round(plain["peak_rss_mb"]), "cache": round(cached["peak_rss_mb"])},
    }
    figures["ttft_ratio"] = round(figures["ttft_later_turns_s"]["cache"] / figures["ttft_later_turns_s"]["no_cache"], 4)
    print(f"chat: {conversations_} conversations x {turns} turns, {parallel} at a time, prompts "
          f"{figures['prompt_tokens_by_turn'][0]}..{figures['prompt_tokens_by_turn'][-1]} tokens, replies {reply_tokens}")
    print(f"  time to first token, turns 2-{turns}: {figures['ttft_later_turns_s']['no_cache']:.3f} s without the "
          f"prefix cache, {figures['ttft_later_turns_s']['cache']:.3f} s with it: {figures['ttft_ratio']:.3f}x "
          f"({figures['cached_tokens_later_turns']} prompt tokens reused per turn)")
    print(f"  same replies with and without: {figures['same_replies']}; cache {figures['cache_bytes'] / 2**20:.1f} MB "
          f"of {figures['cache_budget_bytes'] / 2**20:.0f} MB ({figures['cache_evicted_blocks']} blocks evicted); "
          f"peak RSS {figures['peak_rss_mb']['no_cache']} / {figures['peak_rss_mb']['cache']} MB")
    return figures
