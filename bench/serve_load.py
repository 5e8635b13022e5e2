"""qlinear-llm serve under load: a server process on loopback, clients in this process.

step        the batched decode step alone (DecodeStep.step_batch, in this process): ms per step and
            tok/s of B = 1, 4, 8 sequences: the ceiling of what batching gives on this machine.
throughput  aggregate decode tok/s of 1, 4 and 8 concurrent streaming clients (the same prompt
            and length each), time to first token, on a Qwen2.5-0.5B-shaped model (int4 group
            64, vocabulary 4096; built into ~/.cache/qlinear-bench as bench/test_llm.py does).
load        N requests from C concurrent clients: streaming, non-streaming, cancelled mid-stream
            and malformed ones; every valid one must complete well-formed, every invalid one get
            its 4xx, none be lost, and the server's RSS return to its idle level.
chat        multi-turn conversations resending their history, with and without the prefix
            cache: time to first token of the later turns, same replies (bench/serve_chat.py).

    python bench/serve_load.py step [--threads 2] [--clients 1 4 8] [--rounds 3]
    python bench/serve_load.py throughput [--threads 2] [--clients 1 4 8] [--tokens 64] [--rounds 3]
                                          [--client light|httpx]
    python bench/serve_load.py load [--requests 200] [--concurrency 16]
    python bench/serve_load.py chat [--conversations 8] [--turns 6] [--parallel 2] [--cache-mb 256]
    python bench/serve_load.py all --model DIR      # any model qlinear.llm.load opens
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(os.environ.get("QLINEAR_BENCH_MODELS", Path.home() / ".cache" / "qlinear-bench"))
NAME = "bench"


def default_model() -> Path:
    """The converted Qwen2.5-0.5B-shaped model of bench/test_llm.py (made once if missing)."""
    out = ROOT / "qwen2.5-0.5b-v4096-int4g64"
    if not (out / "model.qlinear").is_file():
        from qlinear import llm
        from qlinear.llm import synthetic

        hf = ROOT / "qwen2.5-0.5b-v4096"
        if not (hf / "model.safetensors").is_file():
            synthetic.make_checkpoint(hf, shape="qwen2.5-0.5b", vocab_size=4096, dtype="bfloat16")
        llm.convert(hf, out, bits=4, group_size=64)
    return out


class Server:
    """`python -m qlinear.llm serve` in a process of its own, on a free loopback port."""

    def __init__(self, model, threads: int, max_batch: int, max_context: int = 2048, max_queue: int = 64,
                 extra: tuple = ()):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "qlinear.llm", "serve", str(model), "--port", str(self.port),
             "--threads", str(threads), "--max-batch", str(max_batch), "--max-queue", str(max_queue),
             "--max-context", str(max_context), "--model-name", NAME, *extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the server did not start")
            time.sleep(0.2)

    def health(self) -> dict:
        return httpx.get(self.url + "/health", timeout=10).json()

    def loop_cpu_seconds(self) -> float:
        """CPU time of the server's main thread, its event loop (HTTP parsing, the token events'
        JSON, the socket sends), apart from the decode and scheduler threads (Linux /proc)."""
        with open(f"/proc/{self.proc.pid}/task/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime

    def rss_mb(self) -> float:
        with open(f"/proc/{self.proc.pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024

    def peak_rss_mb(self) -> float:
        with open(f"/proc/{self.proc.pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def stream_completion(http: httpx.Client, url: str, body: dict, cancel_after: int = 0) -> dict:
    """One streaming request: its SSE events parsed; times of the first and last token."""
    t0 = time.perf_counter()
    times, text, finish, done = [], [], None, False
    with http.stream("POST", url + "/v1/completions", json={**body, "stream": True}) as r:
        if r.status_code != 200:
            return {"status": r.status_code, "body": json.loads(r.read())}
        for line in r.iter_lines():
            if not line:
                continue
            assert line.startswith("data: "), line
            if line == "data: [DONE]":
                done = True
                continue
            event = json.loads(line[6:])
            choice = event["choices"][0]
            if choice["text"]:
                times.append(time.perf_counter())
                text.append(choice["text"])
            finish = choice["finish_reason"] or finish
            if cancel_after and len(times) >= cancel_after:
                break  # leaving the block closes the connection mid-stream
    return {"status": 200, "t0": t0, "times": times, "text": "".join(text), "finish": finish, "done": done}


# -- the step alone ----------------------------------------------------------------------------
def step_alone(model_dir, threads: int, batches, position: int = 64, repeats: int = 20, rounds: int = 3) -> list:
    """ms per step of each batch size: the median over interleaved rounds of each round's median."""
    import numpy as np

    from qlinear import llm
    from qlinear.llm.runtime.step import decode_step

    model = llm.load(model_dir, threads=threads, max_context=position + repeats + 1, progress=False)
    step = decode_step(model.blocks, model.norm, model.lm_head, model.cache)
    caches = {b: [model.new_cache(position + repeats + 1) for _ in range(b)] for b in batches}
    inputs = {b: np.ascontiguousarray(model.embedding([11] * b), np.float32) for b in batches}
    per_round = {b: [] for b in batches}
    matmul_share = {b: [] for b in batches}   # the matmuls' part of the step, clocked inside it
    for _ in range(rounds):
        for b in batches:
            times, inside = [], []
            for i in range(repeats + 1):
                t0 = time.perf_counter()
                step.step_batch(inputs[b], [position + i] * b, [c.k for c in caches[b]], [c.v for c in caches[b]],
                                [c.capacity for c in caches[b]])
                times.append(time.perf_counter() - t0)
                inside.append(step.last_timing)
            per_round[b].append(1000 * float(np.median(times[1:])))
            matmul_share[b].append(float(np.median([m / t for t, m in inside[1:]])))
    rows = []
    for b in batches:
        ms, share = float(np.median(per_round[b])), float(np.median(matmul_share[b]))
        rows.append({"batch": b, "ms_per_step": ms, "tok_s": 1000 * b / ms, "matmul_share": share})
        print(f"B={b}: {ms:.1f} ms per step, {1000 * b / ms:.1f} tok/s "
              f"({rows[-1]['tok_s'] / rows[0]['tok_s']:.2f}x B={batches[0]}); matmuls {100 * share:.0f}% of it, "
              f"the rest (attention, norms, activation) {ms * (1 - share):.2f} ms", flush=True)
    return rows


# -- throughput ---------------------------------------------------------------------------------
def throughput(model, threads: int, clients_list, tokens: int, prompt_tokens: int, rounds: int = 1,
               client: str = "light") -> list:
    """Per client count, the median over `rounds` rounds (the counts interleaved in each round, so
    that a slow spell of a shared machine does not fall on one count only)."""
    runs = {c: [] for c in clients_list}
    with Server(model, threads, max_batch=max(clients_list)) as server:
        prompt = [(7 * i) % 3000 + 10 for i in range(prompt_tokens)]  # token ids: no tokenizer needed here
        body = {"model": NAME, "prompt": prompt, "max_tokens": tokens, "temperature": 0, "ignore_eos": True}
        with httpx.Client(timeout=600) as http:
            stream_completion(http, server.url, {**body, "max_tokens": 4})  # warm up
        for _ in range(rounds):
            for clients in clients_list:
                runs[clients].append(_concurrent_decode(server, body, clients, tokens, client))
    rows = []
    for clients in clients_list:
        tok_s = sorted(r[0] for r in runs[clients])
        ttft = [t for r in runs[clients] for t in r[1]]
        cpu_ms, step_ms, loop_ms = (sorted(r[i] for r in runs[clients])[len(runs[clients]) // 2] for i in (2, 3, 4))
        rows.append({"clients": clients, "decode_tok_s": tok_s[len(tok_s) // 2], "rounds_tok_s": tok_s,
                     "ttft_mean_ms": 1000 * sum(ttft) / len(ttft), "ttft_max_ms": 1000 * max(ttft),
                     "tokens_each": tokens, "client": client, "client_cpu_ms_per_token": cpu_ms,
                     "server_step_ms": step_ms, "server_loop_cpu_ms_per_token": loop_ms})
        print(f"{clients} clients: aggregate decode {rows[-1]['decode_tok_s']:.1f} tok/s "
              f"({rows[-1]['decode_tok_s'] / rows[0]['decode_tok_s']:.2f}x one client; rounds "
              f"{', '.join(f'{t:.0f}' for t in tok_s)}), time to first token "
              f"mean {rows[-1]['ttft_mean_ms']:.0f} ms, max {rows[-1]['ttft_max_ms']:.0f} ms; clients ({client}) "
              f"{cpu_ms:.2f} ms CPU per token, the server's event loop {loop_ms:.2f}; the server's decode "
              f"step {step_ms:.1f} ms of the {1000 * clients / rows[-1]['decode_tok_s']:.1f} ms between a "
              f"client's tokens", flush=True)
    return rows


def _concurrent_decode(server, body: dict, clients: int, tokens: int, client: str = "light") -> tuple:
    """(aggregate decode tok/s, times to first token, the clients' CPU ms per token received, the
    server's mean ms per decode step (its /health figures; the steps with fewer clients at the
    start and end included), its event loop's CPU ms per token decoded) of `clients` streaming
    clients at once."""
    h0, cpu0, loop0 = server.health(), time.process_time(), server.loop_cpu_seconds()
    if client == "light":
        results = asyncio.run(_light_clients(server.port, body, clients))
    else:
        start = threading.Barrier(clients)

        def one(_):
            with httpx.Client(timeout=600) as http:
                start.wait()
                return stream_completion(http, server.url, body)

        with ThreadPoolExecutor(clients) as pool:
            results = list(pool.map(one, range(clients)))
    assert all(r["status"] == 200 and len(r["times"]) >= tokens - 1 and r["done"] for r in results), results
    # decode: from the last client's first token to the first client's last (all decoding)
    first, last = max(r["times"][0] for r in results), min(r["times"][-1] for r in results)
    if last <= first:
        raise SystemExit("the clients never decoded all at once: give them more --tokens")
    steps = sum(sum(first <= t <= last for t in r["times"]) - 1 for r in results)  # intervals
    cpu_ms = 1000 * (time.process_time() - cpu0) / sum(len(r["times"]) for r in results)
    loop_s, h1 = server.loop_cpu_seconds() - loop0, server.health()
    step_ms = 1000 * (h1["decode_seconds"] - h0["decode_seconds"]) / max(1, h1["decode_steps"] - h0["decode_steps"])
    loop_ms = 1000 * loop_s / max(1, h1["decoded_tokens"] - h0["decoded_tokens"])
    return steps / (last - first), [r["times"][0] - r["t0"] for r in results], cpu_ms, step_ms, loop_ms


# The clients share the server's cores here (on a network they would not): httpx in a thread per
# client costs ~0.45 ms of CPU per token received (Zen 4), a tenth of a 2-core 8-sequence step's
# time taken from the server. These clients speak HTTP/1.1 on asyncio streams, one thread for
# all, and still parse every event.
async def _light_clients(port: int, body: dict, clients: int) -> list:
    conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(clients)]
    payload = json.dumps({**body, "stream": True}).encode()
    request = (f"POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\ncontent-type: application/json\r\n"
               f"content-length: {len(payload)}\r\n\r\n").encode() + payload
    try:
        return await asyncio.gather(*(_light_stream(r, w, request) for r, w in conns))
    finally:
        for _, w in conns:
            w.close()


async def _light_stream(reader, writer, request: bytes) -> dict:
    """One streaming completion over a raw connection: the response's chunked body read as it
    comes, each `data:` event parsed; the times of the events that carry text."""
    t0 = time.perf_counter()
    writer.write(request)
    status = int((await reader.readline()).split()[1])
    headers = {}
    while (line := await reader.readline()) != b"\r\n":
        name, _, value = line.decode().partition(":")
        headers[name.strip().lower()] = value.strip()
    if status != 200 or headers.get("transfer-encoding") != "chunked":
        return {"status": status, "body": (await reader.read(65536)).decode(errors="replace")}
    times, text, finish, done, buf = [], [], None, False, b""
    while not done:
        size = int((await reader.readline()).strip(), 16)
        if size == 0:
            break
        buf += await reader.readexactly(size + 2)  # the chunk and its CRLF
        buf = buf[:-2]
        *events, buf = buf.split(b"\n\n")
        for event in events:
            assert event.startswith(b"data: "), event
            if event == b"data: [DONE]":
                done = True
                continue
            choice = json.loads(event[6:])["choices"][0]
            if choice["text"]:
                times.append(time.perf_counter())
                text.append(choice["text"])
            finish = choice["finish_reason"] or finish
    return {"status": 200, "t0": t0, "times": times, "text": "".join(text), "finish": finish, "done": done}


# -- load ---------------------------------------------------------------------------------------
MALFORMED = [
    (b'{"model": "bench", "prompt": ', 400), (b'"just a string"', 400),
    ({"model": NAME, "prompt": "hi", "max_tokens": 0}, 400), ({"model": NAME, "prompt": "hi", "max_tokens": "9"}, 400),
    ({"model": "gpt-4", "prompt": "hi"}, 404), ({"model": NAME, "prompt": "word " * 5000}, 400),
    ({"model": NAME, "messages": "hello"}, 400), ({"model": NAME, "prompt": "hi", "temperature": "hot"}, 400),
]


def check_complete(r: dict, body: dict) -> None:
    """A non-streaming answer: its shape and its counts."""
    assert r["object"] == "text_completion" and r["model"] == NAME and r["id"], r
    (choice,) = r["choices"]
    assert isinstance(choice["text"], str) and choice["finish_reason"] in ("stop", "length"), r
    u = r["usage"]
    assert 0 <= u["completion_tokens"] <= body["max_tokens"], r  # 0: a stop token came first
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"] and u["prompt_tokens"] > 0, r
    assert choice["finish_reason"] == "stop" or u["completion_tokens"] == body["max_tokens"], r


def load_test(model, threads: int, requests: int, concurrency: int, max_batch: int) -> dict:
    rng = random.Random(0)
    kinds = [("stream", "plain", "cancel", "malformed")[i % 4] if i % 5 else "plain" for i in range(requests)]
    rng.shuffle(kinds)
    with Server(model, threads, max_batch=max_batch, max_queue=requests) as server:
        url = server.url
        words = "the of and to in is was for on that with as by at from".split()

        def body_of(i):
            prompt = " ".join(rng.choice(words) for _ in range(8 + i % 40))
            return {"model": NAME, "prompt": prompt, "max_tokens": 8 + (i * 7) % 40, "temperature": (i % 3) * 0.5,
                    "seed": i}

        def run(i):
            kind, body = kinds[i], body_of(i)
            with httpx.Client(timeout=600) as http:
                if kind == "malformed":
                    bad, status = MALFORMED[i % len(MALFORMED)]
                    r = http.post(url + "/v1/completions", **({"content": bad} if isinstance(bad, bytes) else {"json": bad}))
                    assert r.status_code == status and r.json()["error"]["message"], (r.status_code, r.text)
                elif kind == "plain":
                    r = http.post(url + "/v1/completions", json=body)
                    assert r.status_code == 200, r.text
                    check_complete(r.json(), body)
                else:
                    cancel = kind == "cancel"
                    if cancel:
                        body = {**body, "max_tokens": 400, "ignore_eos": True}
                    r = stream_completion(http, url, body, cancel_after=3 if cancel else 0)
                    assert r["status"] == 200, r
                    if not cancel:
                        assert r["done"] and r["finish"] in ("stop", "length"), r
            return kind

        def wave(indices) -> list:
            with ThreadPoolExecutor(concurrency) as pool:
                futures = [pool.submit(run, i) for i in indices]
                outcomes = []
                for f in futures:
                    try:
                        outcomes.append(f.result())
                    except Exception as e:  # noqa: BLE001  (counted: a failed or lost request)
                        outcomes.append(f"FAILED {type(e).__name__}: {e}"[:300])
            deadline = time.monotonic() + 30
            while (h := server.health())["running"] or h["waiting"]:  # cancelled ones leave at the next step
                assert time.monotonic() < deadline, h
                time.sleep(0.2)
            time.sleep(1)
            return outcomes

        wave(range(concurrency))  # warm-up (buffers, allocator pools): the idle level is after it
        idle_rss = server.rss_mb()
        t0 = time.perf_counter()
        outcomes = wave(range(requests))
        seconds = time.perf_counter() - t0
        after_rss = server.rss_mb()
    failed = [o for o in outcomes if o.startswith("FAILED")]
    counts = {k: outcomes.count(k) for k in ("plain", "stream", "cancel", "malformed")}
    print(f"{requests} requests from {concurrency} clients in {seconds:.1f} s: {counts}, failed {len(failed)}")
    for f in failed[:10]:
        print("  ", f)
    back = after_rss <= idle_rss * 1.02 + 4
    print(f"server RSS idle {idle_rss:.0f} MB, after the load {after_rss:.0f} MB "
          f"({'back to idle' if back else 'NOT back to idle'}: within 2% + 4 MB)", flush=True)
    return {"requests": requests, "concurrency": concurrency, "seconds": seconds, "counts": counts,
            "failed": failed, "idle_rss_mb": idle_rss, "after_rss_mb": after_rss, "rss_back_to_idle": back}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=["step", "throughput", "load", "chat", "all"])
    p.add_argument("--model", default=None, help="model directory (default: the Qwen2.5-0.5B-shaped bench model)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--clients", type=int, nargs="+", default=[1, 4, 8])
    p.add_argument("--tokens", type=int, default=64, help="tokens each throughput client generates")
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3, help="rounds of step and throughput (the median is reported)")
    p.add_argument("--client", choices=["light", "httpx"], default="light",
                   help="throughput clients: asyncio streams in one thread, or httpx in a thread each")
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--max-batch", type=int, default=8, help="the load test server's --max-batch")
    p.add_argument("--conversations", type=int, default=8, help="chat: conversations")
    p.add_argument("--turns", type=int, default=6, help="chat: turns of each")
    p.add_argument("--parallel", type=int, default=2, help="chat: conversations at a time")
    p.add_argument("--system-tokens", type=int, default=1100, help="chat: each system prompt's length")
    p.add_argument("--user-tokens", type=int, default=120, help="chat: each user message's length")
    p.add_argument("--reply-tokens", type=int, default=48, help="chat: each reply's length")
    p.add_argument("--cache-mb", type=float, default=256, help="chat: the prefix cache's budget")
    p.add_argument("--json", default=None, help="write the figures here")
    args = p.parse_args(argv)
    model = args.model or default_model()
    out = {}
    if args.what in ("step", "all"):
        out["step"] = step_alone(model, args.threads, args.clients, rounds=args.rounds)
    if args.what in ("throughput", "all"):
        out["throughput"] = throughput(model, args.threads, args.clients, args.tokens, args.prompt_tokens, args.rounds,
                                       args.client)
    if args.what in ("load", "all"):
        out["load"] = load_test(model, args.threads, args.requests, args.concurrency, args.max_batch)
    if args.what in ("chat", "all"):
        from serve_chat import chat

        out["chat"] = chat(model, args.threads, Server, args.conversations, args.turns, args.parallel,
                           args.system_tokens, args.user_tokens, args.reply_tokens, args.cache_mb)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    if out.get("load", {}).get("failed") or not out.get("load", {}).get("rss_back_to_idle", True):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
