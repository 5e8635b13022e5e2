"""qlinear-llm serve: the OpenAI API over HTTP (the real openai client, raw HTTP for the errors),
continuous batching (batch invariance against the single-request path), speculative decoding in
the batch, cancellation, auth and the bounded queue. Servers run in-process on a loopback port
with a tiny synthetic model."""

import contextlib
import json
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("starlette")
prometheus = pytest.importorskip("prometheus_client.parser")
uvicorn = pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("transformers")

from qlinear import llm  # noqa: E402
from qlinear.llm import synthetic  # noqa: E402
from qlinear.llm.runtime.generation import Sampling  # noqa: E402
from qlinear.llm.runtime.speculative import Speculation  # noqa: E402
from qlinear.llm.serve import QueueFull, Scheduler, SchedulerClosed, Sequence, create_app  # noqa: E402

NAME = "tiny"
CONTEXT = 256
WAIT = 30  # seconds: the bound of every wait below (never reached when things work)
PROMPTS = ["def main():", "import os\nimport sys", "class Foo(object):", "for i in range(10):",
           "# Copyright", "return None", "x = [", "while True:"]
REPEATING = "def add(a, b):\n    return a + b\n\n\ndef add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return synthetic.make_checkpoint(tmp_path_factory.mktemp("serve") / "tiny", shape="tiny", seed=1)


def load(checkpoint, max_context=CONTEXT, **options):
    return llm.load(checkpoint, bits=4, max_context=max_context, progress=False, **options)


@pytest.fixture(scope="module")
def reference(checkpoint):
    """A model of its own for the single-request path (the server's belongs to its scheduler)."""
    return load(checkpoint)


def reference_ids(model, ids, max_tokens, **sampling):
    model.reset()  # an empty cache: the prompt's prefill in the same chunks as the server's
    return model.generate_ids(ids, max_tokens, **sampling)


@contextlib.contextmanager
def running_server(model, **options):
    """The app on a loopback port in a uvicorn thread; yields (base URL, app); bounded shutdown."""
    app = create_app(model, NAME, **options)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2, lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    app.state.event_loop_thread = thread
    thread.start()
    deadline = time.monotonic() + WAIT
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", app
    finally:
        server.should_exit = True
        thread.join(WAIT)
        sock.close()
        assert not thread.is_alive(), "the server did not shut down"


@pytest.fixture(scope="module")
def server(checkpoint):
    with running_server(load(checkpoint), max_batch=4, max_queue=16) as (url, app):
        yield url, app


def client(url, **kw):
    return openai.OpenAI(base_url=url + "/v1", api_key=kw.pop("api_key", "unused"), max_retries=0, timeout=WAIT, **kw)


def wait_until(condition, what):
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


# -- the scheduler (batch invariance of the batched step itself: tests/test_decoder_ops.py; of the
# kernels' rows: tests/test_matmul.py) -----------------------------------------------------------------
def run_scheduler(model, jobs, max_batch):
    """Run (ids, max_tokens, sampling[, speculation]) jobs through a Scheduler at once; their
    token ids and finish reasons, and the scheduler."""
    scheduler = Scheduler(model, max_batch=max_batch, max_queue=len(jobs))
    results = [([], []) for _ in jobs]
    done = threading.Semaphore(0)

    def emit(i):
        def on(kind, value):
            results[i][0 if kind == "token" else 1].append(value)
            if kind != "token":
                done.release()
        return on

    for i, (ids, n, sampling, *speculation) in enumerate(jobs):
        scheduler.submit(Sequence(ids, n, Sampling(**sampling), emit(i), speculation=next(iter(speculation), None)))
    scheduler.start()
    try:
        for _ in jobs:
            assert done.acquire(timeout=WAIT)
    finally:
        scheduler.stop(WAIT)
    return results, scheduler


def test_scheduler_equals_single_request_path(checkpoint):
    """Sequences of different lengths joining and leaving the batch: every one's tokens equal
    Model.stream_ids' alone (greedy, and sampled with its own seed)."""
    reference = load(checkpoint, max_context=1024)
    tok = reference.tokenizer
    jobs = [(tok.encode(p), 5 + 7 * i, {} if i % 3 else {"temperature": 0.9, "top_p": 0.9, "seed": i})
            for i, p in enumerate(PROMPTS)]
    long_prompt = [int(t) for t in np.random.default_rng(2).integers(3, 1000, 700)]  # two prefill chunks
    jobs += [(tok.encode("x" * 300)[:200], 30, {}), (long_prompt, 20, {})]
    results, _ = run_scheduler(load(checkpoint, max_context=1024), jobs, max_batch=3)
    for (ids, n, sampling), (tokens, finish) in zip(jobs, results):
        assert tokens == reference_ids(reference, ids, n, **sampling)
        assert finish == ["length"]


@pytest.mark.parametrize("arch, extra, kv_cache", [("gemma2", dict(sliding_window=16), "float32"),
                                                   ("gemma2", dict(sliding_window=16), "float16"),
                                                   ("qwen3", {}, "float32"), ("qwen3", {}, "float16"),
                                                   ("gpt_oss", dict(sliding_window=16), "float32"),
                                                   ("gpt_oss", dict(sliding_window=16), "float16")])
def test_scheduler_on_other_architectures(tmp_path, arch, extra, kv_cache):
    """Gemma 2 (layer 0 a sliding window of 16 that most sequences run past: a ring cache per
    sequence; GELU-tanh, soft-caps, sandwich norms), Qwen3 (q / k norms) and GPT-OSS (sinks, a
    window of 16 on layer 0, MXFP4 experts with biases, the clamped SwiGLU), with float32 and
    float16 KV caches: the scheduler's tokens equal Model.generate_ids' alone, in the compiled
    batched step; the greedy jobs again with n-gram speculation beside them (their verifications
    in the batch, rejected rows rolled back, ring slots included)."""
    path = synthetic.make_checkpoint(tmp_path / arch, arch=arch, shape="tiny", seed=3, norm_noise=0.1, **extra)
    reference, model = load(path, kv_cache=kv_cache), load(path, kv_cache=kv_cache)
    assert model.cache.k[0].dtype == np.dtype(kv_cache)
    assert Scheduler(model)._step is not None  # the compiled step, not the Python blocks
    if extra:
        assert model.config.window(0) == 16 and not model.config.window(1)
    tok = reference.tokenizer
    jobs = [(tok.encode(p), n, {} if i % 3 else {"temperature": 0.9, "top_p": 0.9, "seed": i})
            for i, (p, n) in enumerate(zip(PROMPTS, [40, 3, 25, 60, 9, 33]))]  # prompt + 3 < 16: no ring
    jobs.append(([int(t) for t in np.random.default_rng(4).integers(3, 1000, 50)], 20, {}))  # prefill wraps the ring
    ngram = Speculation("ngram", max_draft=4, adaptive=False)  # a draft wherever the text repeats
    jobs += [(ids, n, sampling, ngram) for ids, n, sampling in jobs if not sampling]
    results, scheduler = run_scheduler(model, jobs, max_batch=4)
    for (ids, n, sampling, *_), (tokens, finish) in zip(jobs, results):
        assert tokens == reference_ids(reference, ids, n, **sampling)
        assert finish == (["length"] if len(tokens) == n else ["stop"])
    assert sum(len(t) for t, _ in results) > 120
    assert scheduler.speculative.accepted_tokens > 0


@pytest.mark.parametrize("arch", ["qwen3_5", "qwen3_5_moe"])
def test_scheduler_on_hybrids(tmp_path, arch):
    """Qwen3.5 (Gated DeltaNet layers: a recurrent state per sequence in its cache) and its MoE:
    sequences joining and leaving the batch, greedy and sampled, speculative or not, each one's
    tokens those of Model.generate_ids alone; a second turn of a conversation resumes at the state the
    scheduler's prefix store kept with its rows, with the logits of a fresh prefill."""
    path = synthetic.make_checkpoint(tmp_path / arch, arch=arch, shape="tiny", seed=3, norm_noise=0.1,
                                     full_attention_interval=2)  # layer 0 Gated DeltaNet, layer 1 attention
    reference, model = load(path), load(path)
    reference.tokenizer.stop_ids = model.tokenizer.stop_ids = set()
    tok = reference.tokenizer
    jobs = [(tok.encode(p), n, {} if i % 3 else {"temperature": 0.9, "top_p": 0.9, "seed": i})
            for i, (p, n) in enumerate(zip(PROMPTS, [40, 3, 25, 60, 9, 33]))]
    long_prompt = [int(t) for t in np.random.default_rng(4).integers(3, 1000, 150)]
    jobs.append((long_prompt, 20, {}))
    # greedy jobs again with drafts of a twin in float activations (verifications in the batch,
    # each sequence's states rolled back to its last accepted token)
    draft = Speculation("draft", load(path, act="float"), max_draft=4, adaptive=False)
    jobs += [(ids, n, sampling, draft) for ids, n, sampling in jobs if not sampling]
    results, scheduler = run_scheduler(model, jobs, max_batch=4)
    assert scheduler._step is not None  # compiled, states per sequence (the MoE's shared expert in it)
    for (ids, n, sampling, *_), (tokens, finish) in zip(jobs, results):
        assert tokens == reference_ids(reference, ids, n, **sampling)
    spec = scheduler.speculative  # drafts rejected and rolled back (the MoE's twin happens to agree on all)
    assert spec.draft_tokens >= spec.accepted_tokens > 0 and (arch == "qwen3_5_moe" or spec.draft_tokens > spec.accepted_tokens)
    second = long_prompt + results[-1][0] + long_prompt[:30]  # the long prompt's next turn
    cache = model.new_cache(CONTEXT)
    start = scheduler.prefix.restore(cache, second)
    assert start == 128  # the last multiple of 64 before the first prompt's end
    reference.reset()
    np.testing.assert_array_equal(model.prefill_into(cache, second, start)[0], reference.prefill(second))


def test_flash_models_are_refused(checkpoint, tmp_path):
    converted = llm.convert(checkpoint, tmp_path / "q4", progress=False)
    with llm.load(converted, memory="flash", max_context=64, progress=False) as model:
        with pytest.raises(ValueError, match="memory='flash'"):
            Scheduler(model)
        with pytest.raises(ValueError, match="memory='flash'"):
            create_app(model, NAME)


def test_stop_tokens_and_ignore_eos(checkpoint, reference):
    """The model's stop tokens end a sequence ("stop", the token not emitted) unless ignore_eos."""
    ids = reference.tokenizer.encode(PROMPTS[4])
    expected = reference_ids(reference, ids, 6)
    model = load(checkpoint)
    model.tokenizer.stop_ids = {expected[2]}
    for ignore_eos, tokens, finish in ((False, expected[:2], "stop"), (True, expected, "length")):
        got = []
        scheduler = Scheduler(model)
        scheduler.submit(Sequence(ids, 6, Sampling(), lambda kind, value: got.append((kind, value)),
                                  ignore_eos=ignore_eos))
        scheduler.start()
        wait_until(lambda: got and got[-1][0] == "done", "the sequence did not finish")
        scheduler.stop(WAIT)
        assert got == [("token", t) for t in tokens] + [("done", finish)]


def test_a_failing_sequence_leaves_the_others(checkpoint, reference):
    ids = reference.tokenizer.encode(PROMPTS[5])
    events = [[], []]
    scheduler = Scheduler(load(checkpoint))
    seqs = [Sequence(ids, 8, Sampling(), lambda kind, value, i=i: events[i].append((kind, value))) for i in range(2)]
    seqs[0].sampler = lambda logits, context: 1 // 0
    for seq in seqs:
        scheduler.submit(seq)
    scheduler.start()
    wait_until(lambda: all(e and e[-1][0] != "token" for e in events), "the sequences did not finish")
    scheduler.stop(WAIT)
    assert events[0] == [("error", "ZeroDivisionError: integer division or modulo by zero")]
    assert events[1] == [("token", t) for t in reference_ids(reference, ids, 8)] + [("done", "length")]


def test_scheduler_queue_bound_and_closing(reference):
    scheduler = Scheduler(reference, max_batch=2, max_queue=1)
    seqs = [Sequence([1, 2, 3], 4, Sampling(), lambda kind, value: None) for _ in range(4)]
    for seq in seqs[:3]:
        scheduler.submit(seq)
    with pytest.raises(QueueFull):
        scheduler.submit(seqs[3])
    scheduler.stop()
    with pytest.raises(SchedulerClosed):
        scheduler.submit(seqs[3])
    with pytest.raises(ValueError, match="max_batch"):
        Scheduler(reference, max_batch=0)


# -- the OpenAI API through the openai client -------------------------------------------------------
def test_models_and_health(server):
    url, _ = server
    assert [m.id for m in client(url).models.list().data] == [NAME]
    health = httpx.get(url + "/health").json()
    assert health["status"] == "ok" and health["model"] == NAME
    client(url).completions.create(model=NAME, prompt="Hello", max_tokens=4, temperature=0,
                                   extra_body={"ignore_eos": True})
    after = httpx.get(url + "/health").json()
    # the decode steps' count, tokens and time (what a benchmark divides the HTTP side from)
    assert after["decode_steps"] > health["decode_steps"] and after["decoded_tokens"] > health["decoded_tokens"]
    assert after["decode_seconds"] > health["decode_seconds"] >= 0


def scrape(url, **kw) -> dict:
    """/metrics' samples: {(name, labels as a sorted tuple): value}."""
    r = httpx.get(url + "/metrics", timeout=WAIT, **kw)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in prometheus.text_string_to_metric_families(r.text) for s in family.samples}


def test_metrics(server):
    url, _ = server
    before = scrape(url)
    for name in ("qlinear_waiting_sequences", "qlinear_running_sequences", "qlinear_decode_steps_total",
                 "qlinear_decode_seconds_total", "qlinear_speculative_draft_tokens_total",
                 "qlinear_speculative_accepted_tokens_total", "qlinear_generated_tokens_total",
                 "qlinear_time_to_first_token_seconds_count"):
        assert (name, ()) in before, name
    answer = client(url).completions.create(model=NAME, prompt="Hello", max_tokens=4, temperature=0,
                                            extra_body={"ignore_eos": True})
    httpx.post(url + "/v1/completions", json={"model": NAME, "prompt": ""}, timeout=WAIT)  # a 400
    after = scrape(url)

    def grew(name, labels=()):
        return after[name, labels] - before.get((name, labels), 0)

    assert grew("qlinear_generated_tokens_total") == answer.usage.completion_tokens == 4
    assert grew("qlinear_time_to_first_token_seconds_count") == 1
    assert grew("qlinear_time_to_first_token_seconds_sum") > 0
    assert grew("qlinear_decode_steps_total") >= 3 and grew("qlinear_decode_seconds_total") > 0
    for status in ("200", "400"):
        assert grew("qlinear_requests_total", (("endpoint", "/v1/completions"), ("status", status))) == 1
    assert after["qlinear_requests_total", (("endpoint", "/metrics"), ("status", "200"))] >= 1
    httpx.get(url + "/no/such/path", timeout=WAIT)
    assert scrape(url)["qlinear_requests_total", (("endpoint", "other"), ("status", "404"))] >= 1


def test_prefix_cache_across_turns(checkpoint, reference):
    """A conversation's turns reuse the KV rows of the turn before, its reply included (prefilled
    as the template renders it once the answer ended) (OpenAI's
    usage.prompt_tokens_details.cached_tokens; /health; /metrics) and answer what prefilling the
    whole prompt answers; with cache_mb=0 nothing is reused."""
    tok = reference.tokenizer
    system = {"role": "system", "content": "Answer from this text. " + " ".join(PROMPTS) * 3}
    for cache_mb in (16, 0):
        with running_server(load(checkpoint), max_batch=2, cache_mb=cache_mb) as (url, _):
            before = scrape(url)
            messages, cached, expected = [system], [], []
            for turn in range(3):
                messages.append({"role": "user", "content": f"Question {turn}: {PROMPTS[turn]}"})
                out = client(url).chat.completions.create(model=NAME, messages=messages, max_tokens=8, temperature=0)
                ids = tok.prompt_ids(messages)
                assert out.choices[0].message.content == tok.decode(reference_ids(reference, ids, 8))
                cached.append(out.usage.prompt_tokens_details.cached_tokens)
                if turn:  # the previous turn, its reply included, was prefilled after it: reused
                    common = next((i for i, (a, b) in enumerate(zip(warmed, ids)) if a != b), len(warmed))
                    expected.append(min(common, len(ids) - 2))
                    assert expected[-1] > len(previous)  # past the previous prompt: its reply too
                previous = ids
                messages.append({"role": "assistant", "content": out.choices[0].message.content})
                warmed = tok.encode(tok.apply_chat_template(messages, add_generation_prompt=False))
            figures = httpx.get(url + "/health", timeout=WAIT).json()["prefix_cache"]
            after = scrape(url)
        if not cache_mb:
            assert cached == [0, 0, 0] and figures["bytes"] == 0
            continue
        assert cached[0] == 0 and cached[1:] == expected and min(expected) > 40
        assert figures["hits"] == 2 and figures["cached_tokens"] == sum(cached) and figures["warmed_tokens"] > 0
        assert 0 < figures["bytes"] <= figures["budget_bytes"] == 16 * 2**20
        assert after["qlinear_prefix_cache_cached_tokens_total", ()] - before[
            "qlinear_prefix_cache_cached_tokens_total", ()] == sum(cached)
        assert after["qlinear_prefix_cache_bytes", ()] == figures["bytes"]


def test_openapi_lists_every_route(server):
    url, app = server
    r = httpx.get(url + "/openapi.json", timeout=WAIT)
    assert r.status_code == 200
    doc = json.loads(r.text)
    assert doc["openapi"].startswith("3.")
    served = {(route.path, m.lower()) for route in app.routes for m in route.methods - {"HEAD"}}
    assert {(path, m) for path, ops in doc["paths"].items() for m in ops} == served
    chat = doc["paths"]["/v1/chat/completions"]["post"]
    ref = chat["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    schema = doc["components"]["schemas"][ref.rpartition("/")[2]]
    assert "messages" in schema["required"] and schema["properties"]["messages"]["type"] == "array"
    assert {"400", "401", "429", "503"} <= set(chat["responses"])
    fields = {"max_tokens", "temperature", "top_p", "seed", "stop", "stream", "ignore_eos", "speculative", "logprobs"}
    assert fields <= set(schema["properties"])


def test_chat_completion(server, reference):
    url, _ = server
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
    out = client(url).chat.completions.create(model=NAME, messages=messages, max_tokens=12, temperature=0)
    ids = reference.tokenizer.prompt_ids(messages)
    expected = reference_ids(reference, ids, 12)
    assert out.object == "chat.completion" and out.model == NAME and len(out.choices) == 1
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].message.content == reference.tokenizer.decode(expected)
    assert out.choices[0].finish_reason == "length"
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (len(ids), 12)
    assert out.usage.total_tokens == len(ids) + 12


def test_completion_and_token_prompt(server, reference):
    url, _ = server
    c = client(url)
    ids = reference.tokenizer.encode(PROMPTS[0])
    expected = reference.tokenizer.decode(reference_ids(reference, ids, 10))
    out = c.completions.create(model=NAME, prompt=PROMPTS[0], max_tokens=10, temperature=0)
    assert out.object == "text_completion" and out.choices[0].text == expected
    assert out.choices[0].finish_reason == "length" and out.usage.completion_tokens == 10
    assert c.completions.create(model=NAME, prompt=ids, max_tokens=10, temperature=0).choices[0].text == expected


def test_streaming(server, reference):
    url, _ = server
    c = client(url)
    messages = [{"role": "user", "content": "Tell me a story"}]
    expected = reference.tokenizer.decode(reference_ids(reference, reference.tokenizer.prompt_ids(messages), 20))
    chunks = list(c.chat.completions.create(model=NAME, messages=messages, max_tokens=20, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    assert all(ch.object == "chat.completion.chunk" for ch in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == expected
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 20

    pieces = list(c.completions.create(model=NAME, prompt=PROMPTS[1], max_tokens=15, temperature=0, stream=True))
    expected = reference.tokenizer.decode(reference_ids(reference, reference.tokenizer.encode(PROMPTS[1]), 15))
    assert "".join(p.choices[0].text for p in pieces) == expected
    assert pieces[-1].choices[0].finish_reason == "length"


def test_stream_ends_with_done(server):
    url, _ = server
    with httpx.stream("POST", url + "/v1/completions", timeout=WAIT,
                      json={"model": NAME, "prompt": "x", "max_tokens": 3, "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line]
    assert events[-1] == "data: [DONE]"
    assert all(e.startswith("data: ") for e in events)
    assert [json.loads(e[6:])["choices"][0]["finish_reason"] for e in events[:-1]][-1] == "length"


def test_stop_strings(server, reference):
    url, _ = server
    full = reference.tokenizer.decode(reference_ids(reference, reference.tokenizer.encode(PROMPTS[2]), 24))
    stop = full[len(full) // 2:len(full) // 2 + 3]
    cut = full[:full.index(stop)]
    c = client(url)
    out = c.completions.create(model=NAME, prompt=PROMPTS[2], max_tokens=24, temperature=0, stop=[stop, "\x00"])
    assert out.choices[0].text == cut and out.choices[0].finish_reason == "stop"
    chunks = list(c.completions.create(model=NAME, prompt=PROMPTS[2], max_tokens=24, temperature=0, stop=stop,
                                       stream=True))
    assert "".join(ch.choices[0].text for ch in chunks) == cut
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_seeded_sampling(server, reference):
    """temperature / top_p / seed per request: its own generator, the single-request path's draws."""
    url, _ = server
    c = client(url)
    ids = reference.tokenizer.encode(PROMPTS[3])
    expected = reference.tokenizer.decode(reference_ids(reference, ids, 16, temperature=1.2, top_p=0.8, seed=7))
    outs = [c.completions.create(model=NAME, prompt=PROMPTS[3], max_tokens=16, temperature=1.2, top_p=0.8, seed=7)
            for _ in range(2)]
    assert [o.choices[0].text for o in outs] == [expected, expected]


def test_concurrent_requests_equal_single_requests(server, reference):
    """Batch invariance end to end: 8 concurrent greedy requests (of different lengths, mixed
    streaming) on a server batching up to 4 give each the single-request output."""
    url, _ = server
    c = client(url)

    def ask(i):
        n = 8 + 5 * i
        if i % 2:
            chunks = c.completions.create(model=NAME, prompt=PROMPTS[i], max_tokens=n, temperature=0, stream=True)
            return "".join(ch.choices[0].text for ch in chunks)
        return c.completions.create(model=NAME, prompt=PROMPTS[i], max_tokens=n, temperature=0).choices[0].text

    with ThreadPoolExecutor(8) as pool:
        texts = list(pool.map(ask, range(8)))
    for i, text in enumerate(texts):
        ids = reference.tokenizer.encode(PROMPTS[i])
        assert text == reference.tokenizer.decode(reference_ids(reference, ids, 8 + 5 * i)), i


# -- errors -----------------------------------------------------------------------------------------
CHAT_HI = {"model": NAME, "messages": [{"role": "user", "content": "hi"}]}
BAD_REQUESTS = [
    ("/v1/chat/completions", b'{"model": "tiny", "messages": [', 400, None),
    ("/v1/chat/completions", b'[1, 2]', 400, None),
    ("/v1/chat/completions", {"model": NAME, "messages": "hello"}, 400, "messages"),
    ("/v1/chat/completions", {"model": NAME, "messages": [{"role": "user"}]}, 400, "messages"),
    ("/v1/chat/completions", {"model": NAME, "messages": [{"role": "user", "content": "hi"}],
                              "max_tokens": "5"}, 400, "max_tokens"),
    ("/v1/chat/completions", {"model": NAME, "messages": [{"role": "user", "content": "hi"}],
                              "temperature": "hot"}, 400, "temperature"),
    ("/v1/chat/completions", {"model": NAME, "messages": [{"role": "user", "content": "hi"}],
                              "stream": "yes"}, 400, "stream"),
    ("/v1/completions", {"model": NAME, "prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {"model": NAME, "prompt": "hi", "max_tokens": -3}, 400, "max_tokens"),
    ("/v1/completions", {"model": NAME, "prompt": "hi", "top_p": 0}, 400, "top_p"),
    ("/v1/completions", {"model": NAME, "prompt": "hi", "n": 2}, 400, "n"),
    ("/v1/completions", {"model": NAME, "prompt": "hi", "stop": [1]}, 400, "stop"),
    ("/v1/completions", {"model": NAME, "prompt": ""}, 400, "prompt"),
    ("/v1/completions", {"model": NAME, "prompt": [5, 100000]}, 400, "prompt"),
    ("/v1/completions", {"model": NAME, "prompt": "word " * 400}, 400, "prompt"),
    ("/v1/completions", {"model": NAME, "prompt": "hi", "max_tokens": CONTEXT}, 400, "prompt"),
    ("/v1/completions", {"model": NAME, "prompt": "hi", "speculative": "lookahead"}, 400, "speculative"),
    ("/v1/completions", {"model": NAME, "prompt": "hi", "speculative": True}, 400, "speculative"),
    ("/v1/completions", {"model": NAME, "prompt": "hi", "speculative": "draft"}, 400, "speculative"),  # no draft model
    ("/v1/chat/completions", {**CHAT_HI, "top_logprobs": 2}, 400, "top_logprobs"),
    ("/v1/chat/completions", {**CHAT_HI, "logprobs": False, "top_logprobs": 2}, 400, "top_logprobs"),
    ("/v1/chat/completions", {**CHAT_HI, "logprobs": True, "top_logprobs": 21}, 400, "top_logprobs"),
    ("/v1/chat/completions", {**CHAT_HI, "logprobs": True, "top_logprobs": -1}, 400, "top_logprobs"),
    ("/v1/chat/completions", {**CHAT_HI, "logprobs": True, "top_logprobs": 2.5}, 400, "top_logprobs"),
    ("/v1/chat/completions", {**CHAT_HI, "logprobs": "yes"}, 400, "logprobs"),
    ("/v1/chat/completions", {**CHAT_HI, "logprobs": 1}, 400, "logprobs"),
    ("/v1/completions", {"model": NAME, "prompt": "hi", "logprobs": 6}, 400, "logprobs"),
    ("/v1/completions", {"model": NAME, "prompt": "hi", "logprobs": -1}, 400, "logprobs"),
    ("/v1/completions", {"model": NAME, "prompt": "hi", "logprobs": True}, 400, "logprobs"),
    ("/v1/completions", {"model": NAME, "prompt": "hi", "logprobs": "3"}, 400, "logprobs"),
    ("/v1/completions", {"model": NAME, "prompt": "hi", "logit_bias": {"5": 101}}, 400, "logit_bias"),
    ("/v1/completions", {"model": NAME, "prompt": "hi", "logit_bias": {"5": True}}, 400, "logit_bias"),
    ("/v1/completions", {"model": NAME, "prompt": "hi", "logit_bias": {"-1": 1}}, 400, "logit_bias"),
    ("/v1/completions", {"model": NAME, "prompt": "hi", "logit_bias": {"100000": 1}}, 400, "logit_bias"),
    ("/v1/completions", {"model": NAME, "prompt": "hi", "logit_bias": [1]}, 400, "logit_bias"),
    ("/v1/chat/completions", {**CHAT_HI, "reasoning_effort": 3}, 400, "reasoning_effort"),
    ("/v1/chat/completions", {**CHAT_HI, "response_format": {"type": "json_schema", "json_schema": {
        "name": "a", "schema": {"type": "object", "x": -2**63 - 1}}}}, 400, "response_format"),
    ("/v1/chat/completions", {**CHAT_HI, "chat_template_kwargs": {"tools": []}}, 400, "chat_template_kwargs"),
    ("/v1/completions", {"model": "gpt-4", "prompt": "hi"}, 404, "model"),
    ("/v1/completions", {"prompt": "hi"}, 400, "model"),
    ("/v1/nothing", {}, 404, None),
]


@pytest.mark.parametrize("path,body,status,param", BAD_REQUESTS)
def test_bad_requests_get_openai_errors(server, path, body, status, param):
    url, _ = server
    r = httpx.post(url + path, timeout=WAIT, **({"content": body} if isinstance(body, bytes) else {"json": body}))
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert isinstance(error["message"], str) and error["message"] and "type" in error
    assert error.get("param") == param
    # and the server goes on serving
    ok = httpx.post(url + "/v1/completions", json={"model": NAME, "prompt": "hi", "max_tokens": 2, "temperature": 0},
                    timeout=WAIT)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2, ok.text


def test_logit_bias(server, reference):
    """OpenAI's logit_bias: +100 on a token makes greedy decoding pick it at every step; -100 on the
    greedy first token makes it never come; a slimmed-out or absent token changes nothing."""
    url, _ = server
    ids = reference.tokenizer.encode("def main():")
    plain = reference_ids(reference, ids, 6, temperature=0.0)
    favourite = (plain[0] + 7) % reference.config.vocab_size
    with client(url) as c:
        forced = c.completions.create(model=NAME, prompt=ids, max_tokens=6, temperature=0.0,
                                      logit_bias={str(favourite): 100}, logprobs=0)
        assert forced.choices[0].logprobs.tokens == [reference.tokenizer.decode([favourite])] * 6
        banned = c.completions.create(model=NAME, prompt=ids, max_tokens=1, temperature=0.0,
                                      logit_bias={str(plain[0]): -100}, logprobs=0)
        assert banned.choices[0].logprobs.tokens != [reference.tokenizer.decode([plain[0]])]
        same = c.completions.create(model=NAME, prompt=ids, max_tokens=6, temperature=0.0, logit_bias={})
        assert same.choices[0].text == reference.tokenizer.decode(plain)


def test_errors_through_the_client(server):
    url, _ = server
    c = client(url)
    with pytest.raises(openai.NotFoundError):
        c.completions.create(model="other", prompt="hi", max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="context"):
        c.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "word " * 400}])


def test_context_limit_is_prompt_plus_max_tokens(server):
    url, _ = server
    body = {"model": NAME, "prompt": [1] * 200, "max_tokens": CONTEXT - 200}
    assert httpx.post(url + "/v1/completions", json=body, timeout=WAIT).status_code == 200
    body["max_tokens"] += 1
    r = httpx.post(url + "/v1/completions", json=body, timeout=WAIT)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"


# -- speculative decoding ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def draft_server(checkpoint):
    """Requests decode speculatively by default, drafted by the same checkpoint at int8 (many
    drafts kept: an unrelated random draft would see few)."""
    draft = llm.load(checkpoint, bits=8, max_context=CONTEXT, progress=False)
    with running_server(load(checkpoint), max_batch=4, speculation=Speculation("draft", draft, max_draft=4)) as server:
        yield server


def complete(url, prompt, **fields):
    """A /v1/completions request's text (raw HTTP: "speculative": null goes as it is)."""
    r = httpx.post(url + "/v1/completions", json={"model": NAME, "prompt": prompt, **fields}, timeout=WAIT)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def test_speculative_requests_equal_plain_ones(draft_server, reference):
    """Greedy requests drafted by the draft model (the server's default, or asked for), by n-gram
    lookup, and not at all, running together (a streaming one among them): each gives the plain
    single-request text; /health counts the drafts and what they saved."""
    url, _ = draft_server
    before = httpx.get(url + "/health", timeout=WAIT).json()["speculative"]
    jobs = [(REPEATING, {}), (REPEATING, {"speculative": "ngram"}), (PROMPTS[1], {"speculative": "draft"}),
            (PROMPTS[0], {"speculative": None}), (REPEATING, {"speculative": "none"}), (PROMPTS[2], {"stream": True})]

    def ask(job):
        prompt, fields = job
        if fields.get("stream"):
            chunks = client(url).completions.create(model=NAME, prompt=prompt, max_tokens=24, temperature=0, stream=True)
            return "".join(ch.choices[0].text for ch in chunks)
        return complete(url, prompt, max_tokens=24, temperature=0, **fields)

    with ThreadPoolExecutor(len(jobs)) as pool:
        texts = list(pool.map(ask, jobs))
    for (prompt, fields), text in zip(jobs, texts):
        ids = reference.tokenizer.encode(prompt)
        assert text == reference.tokenizer.decode(reference_ids(reference, ids, 24)), fields
    figures = httpx.get(url + "/health", timeout=WAIT).json()["speculative"]
    assert figures["draft_tokens"] >= figures["accepted_tokens"] > before["accepted_tokens"]
    assert 0 < figures["acceptance_rate"] <= 1 and figures["tokens_per_step"] > 1
    assert figures["verifications"] > before["verifications"]


def test_speculative_sampling_with_a_seed_is_reproducible(draft_server):
    """A seeded sampled request gives one text, alone or beside another request (the draft
    lengths, and so the random draws, follow the acceptance, not the batch's timings)."""
    url, _ = draft_server
    for speculative in ("draft", "ngram"):
        fields = dict(max_tokens=20, temperature=0.8, top_p=0.9, seed=7, speculative=speculative)
        alone = complete(url, REPEATING, **fields)
        with ThreadPoolExecutor(2) as pool:
            other = pool.submit(complete, url, PROMPTS[3], max_tokens=30, temperature=0)
            together = complete(url, REPEATING, **fields)
            other.result()
        assert together == alone and alone


def test_speculative_field(server, reference):
    """On a server started without speculation: "ngram" per request (the plain text), and the
    refusals: an unknown value, "draft" without a draft model."""
    url, _ = server
    ids = reference.tokenizer.encode(REPEATING)
    assert complete(url, REPEATING, max_tokens=16, temperature=0, speculative="ngram") == \
        reference.tokenizer.decode(reference_ids(reference, ids, 16))
    for value, message in (("lookahead", "'speculative' must be"), ("draft", "--draft-model")):
        r = httpx.post(url + "/v1/completions", json={"model": NAME, "prompt": "hi", "speculative": value},
                       timeout=WAIT)
        assert r.status_code == 400 and message in r.json()["error"]["message"], r.text


# -- cancellation, auth, the bounded queue ----------------------------------------------------------
# -- logprobs ----------------------------------------------------------------------------------------
def post(url, path, **fields):
    r = httpx.post(url + path, json={"model": NAME, "temperature": 0, **fields}, timeout=WAIT)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def sse_choices(url, path, **fields):
    """A streamed request's chunks' choices (the usage chunk's none left out)."""
    with httpx.stream("POST", url + path, timeout=WAIT,
                      json={"model": NAME, "temperature": 0, "stream": True, **fields}) as r:
        assert r.status_code == 200
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    return [c for e in events for c in e["choices"]]


def expected_logprobs(model, ids, n):
    """The greedy tokens after ``ids`` and log_softmax of Model.logits at each of their positions."""
    generated = reference_ids(model, ids, n)
    return generated, expected_logprobs_of(model, ids + generated, len(ids))


def expected_logprobs_of(model, ids, start):
    """log_softmax (float64) of Model.logits(ids) at the positions deciding ids[start:]."""
    logits = model.logits(ids)[start - 1:-1].astype(np.float64)
    top = logits.max(axis=1, keepdims=True)
    return logits - top - np.log(np.exp(logits - top).sum(axis=1, keepdims=True))


def check_chat_logprobs(content, tokenizer, generated, lp, top):
    assert len(content) == len(generated)
    for entry, token, row in zip(content, generated, lp):
        text = tokenizer.hf.decode([token], skip_special_tokens=False)
        assert entry["token"] == text and entry["bytes"] == list(text.encode())
        assert abs(entry["logprob"] - row[token]) < 1e-4
        alternatives = [a["logprob"] for a in entry["top_logprobs"]]
        assert len(alternatives) == top and alternatives == sorted(alternatives, reverse=True)
        np.testing.assert_allclose(alternatives, np.sort(row)[::-1][:top], atol=1e-4)
        assert entry["top_logprobs"][0]["token"] == text  # greedy: the most likely one


def test_chat_logprobs_are_the_models_log_softmax(server, reference):
    """logprobs / top_logprobs: log_softmax of Model.logits at each generated position, the
    alternatives most likely first; streamed, the chunks' entries make the same list; a
    speculative (n-gram) request gives the same values."""
    url, _ = server
    messages = [{"role": "user", "content": REPEATING}]
    generated, lp = expected_logprobs(reference, reference.tokenizer.prompt_ids(messages), 12)
    fields = dict(messages=messages, max_tokens=12, logprobs=True, top_logprobs=3)
    choice = post(url, "/v1/chat/completions", **fields)
    assert choice["message"]["content"] == reference.tokenizer.decode(generated)
    assert choice["logprobs"]["refusal"] is None
    content = choice["logprobs"]["content"]
    check_chat_logprobs(content, reference.tokenizer, generated, lp, 3)
    assert post(url, "/v1/chat/completions", speculative="ngram", **fields)["logprobs"]["content"] == content
    streamed = [e for c in sse_choices(url, "/v1/chat/completions", **fields) if c["logprobs"]
                for e in c["logprobs"]["content"]]
    assert streamed == content
    # logprobs without top_logprobs: no alternatives; without logprobs: none at all
    plain = post(url, "/v1/chat/completions", messages=messages, max_tokens=4, logprobs=True)["logprobs"]["content"]
    assert [e["top_logprobs"] for e in plain] == [[]] * 4 and [e["logprob"] for e in plain] == \
        [e["logprob"] for e in content[:4]]
    assert post(url, "/v1/chat/completions", messages=messages, max_tokens=4)["logprobs"] is None
    # through the client too
    out = client(url).chat.completions.create(model=NAME, temperature=0, **fields)
    assert [t.logprob for t in out.choices[0].logprobs.content] == [e["logprob"] for e in content]


def test_completion_logprobs_are_the_models_log_softmax(server, reference):
    """Completions' 'logprobs': n: tokens, token_logprobs, top_logprobs (the n most likely and the
    chosen token) and text_offset; streamed, the chunks' parts make the same lists; the same
    with n-gram speculation."""
    url, _ = server
    generated, lp = expected_logprobs(reference, reference.tokenizer.encode(REPEATING), 12)
    fields = dict(prompt=REPEATING, max_tokens=12, logprobs=2)
    choice = post(url, "/v1/completions", **fields)
    out = choice["logprobs"]
    tokens = [reference.tokenizer.hf.decode([t], skip_special_tokens=False) for t in generated]
    assert out["tokens"] == tokens and "".join(tokens) == choice["text"]
    assert out["text_offset"] == [len("".join(tokens[:i])) for i in range(len(tokens))]
    np.testing.assert_allclose(out["token_logprobs"], [row[t] for t, row in zip(generated, lp)], atol=1e-4)
    for alternatives, token, row in zip(out["top_logprobs"], tokens, lp):
        values = list(alternatives.values())
        assert values == sorted(values, reverse=True) and token in alternatives
        np.testing.assert_allclose(values, np.sort(row)[::-1][:len(values)], atol=1e-4)
    assert post(url, "/v1/completions", speculative="ngram", **fields)["logprobs"] == out
    parts = [c["logprobs"] for c in sse_choices(url, "/v1/completions", **fields) if c["logprobs"]]
    assert {k: [x for p in parts for x in p[k]] for k in out} == out
    assert post(url, "/v1/completions", prompt=REPEATING, max_tokens=3)["logprobs"] is None
    zero = post(url, "/v1/completions", prompt=REPEATING, max_tokens=3, logprobs=0)["logprobs"]
    assert zero["top_logprobs"] == [{t: v} for t, v in zip(out["tokens"][:3], out["token_logprobs"][:3])]


def test_logprobs_of_a_slimmed_lm_head(checkpoint):
    """A slimmed lm head: logprobs over the rows it computes, its rows mapped to token ids."""
    keep = list(range(0, 200, 3))
    model = load(checkpoint, slim_vocab=keep)
    ids = model.tokenizer.encode(PROMPTS[0])
    done = threading.Event()
    seq = Sequence(ids, 6, Sampling(temperature=0), lambda kind, value: done.set() if kind != "token" else None,
                   ignore_eos=True, logprobs=4)
    scheduler = Scheduler(model, max_batch=2)
    scheduler.submit(seq)
    scheduler.start()
    try:
        assert done.wait(WAIT)
    finally:
        scheduler.stop(WAIT)
    entries = seq.entries
    generated = [token for token, _, _ in entries]
    assert len(entries) == 6 and all(t in keep for t in generated)
    lp = expected_logprobs_of(model, ids + generated, len(ids))
    for (token, logprob, top), row in zip(entries, lp):
        assert abs(logprob - row[token]) < 1e-4
        assert [t for t, _ in top] == list(np.argsort(-row, kind="stable")[:4]) and all(t in keep for t, _ in top)


def test_disconnect_cancels_and_frees_the_slot(checkpoint):
    model = load(checkpoint, max_context=4096)
    model.tokenizer.stop_ids = set()  # only the client's going away ends these
    with running_server(model, max_batch=2) as (url, app):
        scheduler = app.state.scheduler
        decode = scheduler._decode
        scheduler._decode = lambda: (time.sleep(0.002), decode())  # 4000 tokens take > 8 s
        for stream in (True, False):
            body = {"model": NAME, "prompt": "hello", "max_tokens": 4000, "stream": stream}
            with httpx.Client(timeout=WAIT) as http:
                if stream:
                    with http.stream("POST", url + "/v1/completions", json=body) as r:
                        next(line for line in r.iter_lines() if line.startswith("data: "))
                else:
                    with pytest.raises(httpx.ReadTimeout):
                        http.post(url + "/v1/completions", json=body, timeout=0.3)
            wait_until(lambda: scheduler.running == 0 and scheduler.waiting == 0, "the slot was not freed")
        assert scheduler.decoded_tokens < 2 * 4000
        r = httpx.post(url + "/v1/completions", json={"model": NAME, "prompt": "hi", "max_tokens": 3}, timeout=WAIT)
        assert r.status_code == 200


def test_api_key(checkpoint):
    with running_server(load(checkpoint), api_key="sesame") as (url, _):
        body = {"model": NAME, "prompt": "hi", "max_tokens": 2}
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sesame"}):
            r = httpx.post(url + "/v1/completions", json=body, headers=headers, timeout=WAIT)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert httpx.get(url + "/v1/models", timeout=WAIT).status_code == 401
        with pytest.raises(openai.AuthenticationError):
            client(url, api_key="wrong").models.list()
        assert client(url, api_key="sesame").completions.create(model=NAME, prompt="hi", max_tokens=2).usage
        assert httpx.get(url + "/health", timeout=WAIT).status_code == 200
        for path in ("/metrics", "/openapi.json"):  # as /v1/models
            assert httpx.get(url + path, timeout=WAIT).status_code == 401
            assert httpx.get(url + path, headers={"Authorization": "Bearer sesame"}, timeout=WAIT).status_code == 200


def test_queue_overflow_gets_429(checkpoint):
    with running_server(load(checkpoint), max_batch=1, max_queue=1) as (url, app):
        scheduler, gate = app.state.scheduler, threading.Event()
        model, forward = scheduler.model, scheduler.model._forward
        model._forward = lambda *a, **kw: (gate.wait(WAIT), forward(*a, **kw))[1]  # hold the first prefill
        body = {"model": NAME, "prompt": "hi", "max_tokens": 3}
        with ThreadPoolExecutor(2) as pool:
            held = [pool.submit(httpx.post, url + "/v1/completions", json=body, timeout=WAIT)]
            wait_until(lambda: scheduler.running == 1, "the first request did not start")
            held.append(pool.submit(httpx.post, url + "/v1/completions", json=body, timeout=WAIT))
            wait_until(lambda: scheduler.waiting == 1, "the second request did not queue")
            r = httpx.post(url + "/v1/completions", json=body, timeout=WAIT)
            assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_error"
            with pytest.raises(openai.RateLimitError):
                client(url).completions.create(model=NAME, prompt="hi", max_tokens=3)
            gate.set()
            assert [f.result().status_code for f in held] == [200, 200]


def test_command_line(checkpoint, monkeypatch):
    """qlinear-llm serve MODEL ...: the model loaded with the load options, served as asked."""
    from qlinear.llm import cli, serve

    seen = {}
    monkeypatch.setattr(serve, "serve", lambda model, name, **kw: seen.update(model=model, name=name, **kw))
    cli.main(["serve", str(checkpoint), "--port", "8123", "--max-batch", "3", "--max-queue", "5",
              "--api-key", "k", "--max-context", "128", "--kv-cache", "float16", "--speculative", "ngram",
              "--max-draft", "4"])
    assert seen["name"] == checkpoint.name and seen["model"].max_context == 128
    assert seen["model"].cache.k.dtype == np.float16
    assert {k: seen[k] for k in ("host", "port", "max_batch", "max_queue", "api_key")} == {
        "host": "127.0.0.1", "port": 8123, "max_batch": 3, "max_queue": 5, "api_key": "k"}
    assert (seen["speculation"].method, seen["speculation"].max_draft) == ("ngram", 4)
    cli.main(["serve", str(checkpoint), "--max-context", "128", "--speculative", "draft", "--draft-model",
              str(checkpoint), "--bits", "8"])
    assert seen["speculation"].draft_model.max_context == 128 and seen["speculation"].draft_model is not seen["model"]


# -- text: incremental decoding and stop strings ----------------------------------------------------
def spm_style_tokenizer():
    """A SentencePiece-style tokenizer (byte fallback, U+2581 spaces, one leading space stripped),
    as gguf_tokenizer builds for Llama vocabularies."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, normalizers

    vocab = {"<unk>": 0, **{f"<0x{b:02X}>": 1 + b for b in range(256)}}
    for piece in ["\u2581", "a", "b", "\u2581a", "\u2581b", "ab", "\u2581ab", "c", "\u2581c", "é"]:
        vocab[piece] = len(vocab)
    hf = HFTokenizer(models.BPE(vocab, [], unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    hf.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    hf.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                    decoders.Strip(" ", 1, 0)])
    return llm.Tokenizer(hf)


def test_stream_decoder_pieces_make_the_text(reference):
    """Pieces (multi-byte characters held back until complete) add up to decode(ids), for a
    byte-level BPE and a SentencePiece-style tokenizer; each push decodes a bounded window."""
    from qlinear.llm.runtime.tokenizer import StreamDecoder

    rng = np.random.default_rng(3)
    alphabet = ["a", "b", " ", "é", "日本", "🙂", "c", " ab", "\n"]
    for tok in (reference.tokenizer, spm_style_tokenizer()):
        for _ in range(100):
            text = "".join(rng.choice(alphabet, rng.integers(1, 30)))
            ids = tok.encode(text)
            dec = StreamDecoder(tok)
            pieces = [dec.push(i) for i in ids]
            assert "".join(pieces) + dec.flush() == tok.decode(ids) == text, (text, pieces)
            assert all("\ufffd" not in p for p in pieces)
        lengths, decode = [], tok.decode
        tok.decode = lambda ids: (lengths.append(len(ids)), decode(ids))[1]
        try:
            dec = StreamDecoder(tok)
            "".join(dec.push(i) for i in tok.encode("ab c " * 400))
        finally:
            del tok.decode
        assert max(lengths) <= 8


class PieceTokenizer:
    """Token i is PIECES[i]: text streams with known pieces."""

    PIECES = ["al", "pha", " be", "ta", " gam", "ma", " del", "ta"]

    def decode(self, ids):
        return "".join(self.PIECES[i] for i in ids)


def test_text_stream_stop_strings():
    from qlinear.llm.serve.streams import TextStream

    ids = list(range(len(PieceTokenizer.PIECES)))
    for stop, pieces, stopped in (
            (["gamma"], ["al", "pha", " be", "ta", " ", ""], True),      # "gam" held back, then cut
            (["zzz", "ta g"], ["al", "pha", " be", "", ""], True),        # "ta" held, "ta gam" has it
            (["pha b"], ["al", "", ""], True),
            (["nope"], ["al", "pha", " be", "ta", " gam", "ma", " del", "ta"], False),
            (["a "], ["al", "ph", ""], True)):
        text = TextStream(PieceTokenizer(), stop)
        got = []
        for i in ids:
            got.append(text.push(i))
            if text.stopped:
                break
        assert got == pieces and text.stopped == stopped, (stop, got)
        assert text.flush() == ""


def test_mailbox_delivers_in_order_with_one_wake_up_per_burst():
    """Events posted from another thread reach their queues in order; a burst posted before the
    loop runs (a decode step's tokens) is one wake-up of the loop, not one per event."""
    import asyncio

    from qlinear.llm.serve.streams import Mailbox

    async def main():
        loop = asyncio.get_running_loop()
        wake_ups = []
        real = loop.call_soon_threadsafe
        loop.call_soon_threadsafe = lambda f, *a: (wake_ups.append(f) if f == box._deliver else None, real(f, *a))[1]
        box, queues = Mailbox(loop), [asyncio.Queue() for _ in range(3)]

        def burst(n):  # posted from another thread while the loop is busy (here: waiting for it)
            t = threading.Thread(target=lambda: [box.post(queues[i % 3], i) for i in range(n)])
            t.start()
            t.join()

        burst(30)
        await asyncio.sleep(0)
        first = len(wake_ups)
        burst(6)  # a second burst after the first was delivered
        await asyncio.sleep(0)
        got = [[q.get_nowait() for _ in range(q.qsize())] for q in queues]
        return first, len(wake_ups), got

    first, total, got = asyncio.run(main())
    assert (first, total) == (1, 2)
    assert got == [[*range(0, 30, 3), 0, 3], [*range(1, 30, 3), 1, 4], [*range(2, 30, 3), 2, 5]]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread priorities are per thread on Linux only")
def test_event_loop_yields_to_the_decode_threads(server):
    """The event loop's thread runs 5 nice levels below the scheduler's (which decodes), so
    that streaming many clients' events does not slow the step."""
    _, app = server

    def nice(thread):
        with open(f"/proc/self/task/{thread.native_id}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[16])

    assert nice(app.state.event_loop_thread) == min(19, nice(app.state.scheduler._thread) + 5)
