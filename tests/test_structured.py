"""Structured output in qlinear-llm serve: response_format json_object / json_schema by constrained
decoding (llguidance's token masks), on the model trained on the standard library (models/): it
writes Python, not JSON, so without the constraint its answers do not parse; with it they do and
validate (jsonschema), sampled at temperature 0.7, streamed or not, on a slimmed vocabulary too."""

import json
import random
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("starlette")
pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

from qlinear import llm  # noqa: E402
from qlinear.llm.runtime.generation import Sampler, Sampling  # noqa: E402
from qlinear.llm.serve import structured  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "models" / "stdlib-qwen2"
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))
import structured as bench  # noqa: E402  (bench/structured.py: the random schemas)
from test_serve import client, running_server  # noqa: E402

NAME = "tiny"  # test_serve.running_server's model name


def load(**options):
    return llm.load(MODEL, bits=4, max_context=1024, progress=False, **options)


@pytest.fixture(scope="module")
def server():
    with running_server(load(), max_batch=8, max_queue=64) as (url, app):
        yield url, app


def schema_format(schema, name="answer"):
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def ask(c, schema, seed, constrained=True, **kw):
    extra = {"response_format": schema_format(schema)} if constrained else {}
    kw = {"temperature": 0.7, "max_tokens": 256, **extra, **kw}
    return c.chat.completions.create(model=NAME, messages=[{"role": "user", "content": bench.prompt(schema)}],
                                     seed=seed, **kw)


def valid(text, schema) -> bool:
    try:
        jsonschema.validate(json.loads(text), schema)
        return True
    except (ValueError, jsonschema.ValidationError):
        return False


def test_random_schemas_from_8_clients_parse_and_validate(server):
    """48 requests (bench/structured.py serve runs 500), 8 at a time: every answer validates and
    ends because its object closed; the same requests without response_format do not."""
    url, _ = server
    rng = random.Random(7)
    schemas = [bench.random_schema(rng) for _ in range(48)]
    c = client(url)
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda i: ask(c, schemas[i], seed=i), range(len(schemas))))
    for schema, r in zip(schemas, answers):
        assert valid(r.choices[0].message.content, schema), (schema, r.choices[0].message.content)
        assert r.choices[0].finish_reason == "stop"
    free = [ask(c, s, seed=i, constrained=False, max_completion_tokens=64) for i, s in enumerate(schemas[:8])]
    assert sum(valid(r.choices[0].message.content, s) for s, r in zip(schemas, free)) == 0


def test_json_object_and_greedy_streaming_equals_whole(server):
    """json_object gives an object; a greedy streamed answer's deltas join to the whole answer."""
    url, _ = server
    c = client(url)
    answers = [c.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "A JSON object:"}],
                                         response_format={"type": "json_object"}, temperature=0.7, seed=seed,
                                         max_tokens=120) for seed in range(6)]
    closed = [r.choices[0].message.content for r in answers if r.choices[0].finish_reason == "stop"]
    assert closed and all(isinstance(json.loads(text), dict) for text in closed)  # free strings may run on
    schema = bench.random_schema(random.Random(11))
    whole = ask(c, schema, seed=0, temperature=0)
    chunks = ask(c, schema, seed=0, temperature=0, stream=True)
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == whole.choices[0].message.content and valid(text, schema)


def test_cut_at_max_tokens_and_logprobs_of_the_masked_distribution(server):
    """max_tokens cuts the JSON ("length"); the logprobs are those of the masked logits the
    sampler saw: every alternative listed is a token the grammar allowed there."""
    url, _ = server
    c = client(url)
    schema = {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}}, "required": ["color"],
              "additionalProperties": False}
    r = ask(c, schema, seed=1, max_completion_tokens=2)
    assert r.choices[0].finish_reason == "length"
    r = ask(c, schema, seed=1, logprobs=True, top_logprobs=5)
    assert json.loads(r.choices[0].message.content)["color"] in ("red", "green", "blue")
    first = r.choices[0].logprobs.content[0]
    assert first.token == "{" and first.logprob == 0.0  # the only token allowed first
    assert [t.token for t in first.top_logprobs] == ["{"]
    assert all(len(e.top_logprobs) in range(1, 6) for e in r.choices[0].logprobs.content)


def test_slimmed_vocabulary_maps_rows_to_tokens():
    """A slimmed lm head (its rows are the token ids lm_rows, 100 ids dropped below the others:
    row i is not token i): the mask goes over its rows, and the output still validates."""
    kept = [t for t in range(3500) if not 100 <= t < 200]
    slim = load(slim_vocab=kept)
    assert slim.lm_rows.tolist() == kept
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9},
                                               "s": {"type": "string", "maxLength": 5}},
              "required": ["n", "s"], "additionalProperties": False}
    with running_server(slim) as (url, _):
        c = client(url)
        answers = [c.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "x"}],
                                             response_format=schema_format(schema), temperature=0.7, seed=seed,
                                             max_tokens=100) for seed in range(4)]
    assert all(valid(r.choices[0].message.content, schema) for r in answers)


def test_constrained_sequences_do_not_decode_speculatively(server):
    """A request asking for n-gram drafts with a schema decodes one token per step (drafts would
    need a mask per row) and validates."""
    url, app = server
    schema = bench.random_schema(random.Random(5))
    before = app.state.scheduler.speculative.decode_steps
    r = client(url).chat.completions.create(model=NAME, messages=[{"role": "user", "content": bench.prompt(schema)}],
                                            response_format=schema_format(schema), temperature=0, max_tokens=256,
                                            extra_body={"speculative": "ngram"})
    assert valid(r.choices[0].message.content, schema)
    assert app.state.scheduler.speculative.decode_steps == before


def test_mask_unit():
    """Constraint.mask on a slimmed head: exactly the rows of allowed tokens stay."""
    tok = load().tokenizer
    brace = tok.encode("{")[0]
    rows = np.array([5, brace, 4095, 7, 4096 + 10])  # the last: past the tokenizer (never allowed)
    g = structured.Grammars(tok, rows)
    c = g.constraint(structured.json_grammar({"type": "object"}))
    out = c.mask(np.zeros(len(rows), np.float32))
    assert np.isfinite(out).tolist() == [False, True, False, False, False]
    # a padded lm head (rows past the tokenizer's 4,096 tokens, favoured by the logits): never chosen
    padded = structured.Grammars(tok).constraint(structured.json_grammar({"type": "object"}))
    logits = np.zeros(5000, np.float32)
    logits[4096:] = 50
    row, masked = padded.sample(Sampler(Sampling(temperature=1.0, seed=0)), logits, True)
    assert row < 4096 and tok.decode([row]).strip().startswith("{") and masked.shape == (5000,)
    assert not np.isfinite(masked[4096:]).any() and np.isfinite(masked).sum() == len(padded.allowed(5000).nonzero()[0])


@pytest.mark.parametrize("fmt, message", [
    ({"type": "xml"}, "'response_format' must be an object with 'type'"),
    ("json", "'response_format' must be an object with 'type'"),
    ({"type": "json_schema"}, "non-empty string 'name'"),
    ({"type": "json_schema", "json_schema": {"name": "a", "schema": [1]}}, "must be a JSON Schema object"),
    ({"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "nosuch"}}}, "nosuch"),
    ({"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object", "required": 3}}}, "required"),
    ({"type": "json_schema", "json_schema": {"name": "a", "schema": {"$ref": "#/definitions/missing"}}},
     "missing"),
])
def test_bad_response_format_is_400(server, fmt, message):
    url, _ = server
    r = httpx.post(url + "/v1/chat/completions", json={"model": NAME, "messages": [{"role": "user", "content": "x"}],
                                                       "response_format": fmt}, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert message in error["message"] and error["param"] == "response_format"
