"""Anthropic's Messages API (POST /v1/messages) through the real anthropic client: text answers
against the single-request path (system prompt, stop sequences, max_tokens, the model's stop
token), streamed events assembling to the whole message, tool_use / tool_result round trips on
Qwen2.5's tool template (forced calls through the grammar), the prefix cache's reuse reported as
cache_read_input_tokens, a reasoning model's thinking blocks, and bad requests answered 400 in
Anthropic's error shape. Servers run in-process on a loopback port (tests/test_serve.py's)."""

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")
httpx = pytest.importorskip("httpx")
anthropic = pytest.importorskip("anthropic")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_serve import (NAME, PROMPTS, WAIT, checkpoint, load, reference, reference_ids,  # noqa: E402,F401
                        running_server)
from test_tools import TIME, WEATHER, qwen_model  # noqa: E402,F401  (checkpoint, reference, qwen_model: fixtures)

from qlinear import llm  # noqa: E402
from qlinear.llm.serve.anthropic import Blocks, error_body  # noqa: E402
from qlinear.llm.serve.anthropic_request import translate  # noqa: E402
from qlinear.llm.serve.protocol import ApiError  # noqa: E402

GREEDY = {"temperature": 0}  # (the client takes sampling fields as extra_body)
TOOLS = [{"name": t["function"]["name"], "input_schema": t["function"]["parameters"],
          **({"description": t["function"]["description"]} if "description" in t["function"] else {})}
         for t in (WEATHER, TIME)]
QUESTION = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def server(checkpoint):
    with running_server(load(checkpoint), max_batch=4, max_queue=16) as (url, app):
        yield url, app


@pytest.fixture(scope="module")
def tool_server(qwen_model):
    with running_server(llm.load(qwen_model, bits=4, max_context=512, progress=False), max_batch=4) as (url, app):
        yield url, app


CLIENTS: dict = {}  # (url, key) -> its client, closed at the module's end


@pytest.fixture(scope="module", autouse=True)
def close_clients():
    yield
    while CLIENTS:
        CLIENTS.popitem()[1].close()


def client(url, api_key="unused"):
    if (url, api_key) not in CLIENTS:
        CLIENTS[url, api_key] = anthropic.Anthropic(base_url=url, api_key=api_key, max_retries=0, timeout=WAIT)
    return CLIENTS[url, api_key]


def streamed(c, **request):
    """The streamed message assembled by the client, and the events' types in order."""
    with c.messages.stream(**request) as stream:
        kinds = [event.type for event in stream]
        return stream.get_final_message(), kinds


def same_message(a, b) -> bool:
    """Equal but for the ids the server draws anew for every message and tool_use block, and for
    how much of the prompt the prefix cache held."""
    def plain(m):
        d = m.model_dump(exclude_none=True)
        d.pop("id")
        u = d["usage"]
        u["input_tokens"] += u.pop("cache_read_input_tokens")
        for block in d["content"]:
            block.pop("id", None)
            block.pop("parsed_output", None)  # (the streaming helper's)
        return d
    return plain(a) == plain(b)


def raw_events(url, body) -> list:
    """A streamed answer's (event name, data) pairs, read off the wire."""
    events, name = [], None
    with httpx.stream("POST", url + "/v1/messages", json={**body, "stream": True}, timeout=WAIT) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
                assert data["type"] == name
                events.append((name, data))
    return events


# -- text ----------------------------------------------------------------------------------------------
def test_text_round_trip_with_a_system_prompt(server, reference):
    """The system prompt (a string or text blocks) goes through the chat template as a system
    message: the answer is the single-request path's on that prompt, usage counts its tokens;
    max_tokens ends it (stop_reason max_tokens); the streamed message is the same message."""
    url, _ = server
    c, tok = client(url), reference.tokenizer
    system = "Answer in one line."
    ids = tok.prompt_ids([{"role": "system", "content": system}, {"role": "user", "content": PROMPTS[0]}])
    assert len(ids) > len(tok.prompt_ids([{"role": "user", "content": PROMPTS[0]}]))
    expected = tok.decode(reference_ids(reference, ids, 12))
    request = dict(model=NAME, max_tokens=12, system=system, messages=[{"role": "user", "content": PROMPTS[0]}],
                   extra_body=GREEDY)
    whole = c.messages.create(**request)
    assert whole.type == "message" and whole.role == "assistant" and whole.model == NAME
    assert whole.id.startswith("msg_") and [b.type for b in whole.content] == ["text"]
    assert whole.content[0].text == expected
    assert (whole.stop_reason, whole.stop_sequence) == ("max_tokens", None)
    u = whole.usage
    assert (u.input_tokens + u.cache_read_input_tokens, u.output_tokens, u.cache_creation_input_tokens) == (
        len(ids), 12, 0)
    blocks = c.messages.create(**{**request, "system": [{"type": "text", "text": "Answer in "},
                                                        {"type": "text", "text": "one line."}]})
    assert blocks.content[0].text == expected
    message, kinds = streamed(c, **request)
    assert same_message(message, whole)
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") == 1
    assert c.messages.count_tokens(model=NAME, system=system, messages=request["messages"]).input_tokens == len(ids)


def test_the_events_on_the_wire(server):
    """message_start (empty content, usage), a ping, one text block's start / deltas / stop,
    message_delta (stop_reason, the output tokens), message_stop; the deltas are the text."""
    url, _ = server
    body = {"model": NAME, "max_tokens": 6, "temperature": 0, "messages": [{"role": "user", "content": PROMPTS[1]}]}
    whole = httpx.post(url + "/v1/messages", json=body, timeout=WAIT).json()
    events = raw_events(url, body)
    names = [n for n, _ in events]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"}
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["output_tokens"] == 0
    assert events[2][1] == {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    text = "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta")
    assert [{"type": "text", "text": text}] == whole["content"]
    delta = events[-2][1]
    assert delta["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == whole["usage"]["output_tokens"] == 6


def test_stop_sequences(server, reference):
    """A stop sequence the greedy answer contains ends it before the sequence: stop_reason
    stop_sequence and which one; streamed alike."""
    url, _ = server
    c, tok = client(url), reference.tokenizer
    messages = [{"role": "user", "content": PROMPTS[2]}]
    full = tok.decode(reference_ids(reference, tok.prompt_ids(messages), 24))
    stop = full[len(full) // 2:len(full) // 2 + 3]
    assert stop.strip()
    request = dict(model=NAME, max_tokens=24, messages=messages, stop_sequences=["never seen", stop], extra_body=GREEDY)
    whole = c.messages.create(**request)
    assert (whole.stop_reason, whole.stop_sequence) == ("stop_sequence", stop)
    assert whole.content[0].text == full[:full.index(stop)]
    message, _ = streamed(c, **request)
    assert same_message(message, whole)


def test_the_models_stop_token_is_end_turn(checkpoint, reference):
    """The model's stop token ends the answer with stop_reason end_turn."""
    tok = reference.tokenizer
    messages = [{"role": "user", "content": PROMPTS[3]}]
    expected = reference_ids(reference, tok.prompt_ids(messages), 8)
    model = load(checkpoint)
    model.tokenizer.stop_ids = {expected[3]}
    with running_server(model) as (url, _):
        c = client(url)
        whole = c.messages.create(model=NAME, max_tokens=8, messages=messages, extra_body=GREEDY)
        message, _ = streamed(c, model=NAME, max_tokens=8, messages=messages, extra_body=GREEDY)
    assert (whole.stop_reason, whole.usage.output_tokens) == ("end_turn", 3)
    assert whole.content[0].text == tok.decode(expected[:3]) and same_message(message, whole)


def test_a_second_turn_reads_the_prefix_cache(server, reference):
    """The next turn's prompt starts with the first turn's (its reply included, prefilled once the
    answer ended): cache_read_input_tokens counts the reused tokens, the answer is unchanged."""
    url, _ = server
    c, tok = client(url), reference.tokenizer
    system = "Answer from this text. " + " ".join(PROMPTS) * 2
    turns = [{"role": "user", "content": "Question: what is it?"}]
    first = c.messages.create(model=NAME, max_tokens=8, system=system, messages=turns, extra_body=GREEDY)
    turns += [{"role": "assistant", "content": first.content[0].text}, {"role": "user", "content": "And then?"}]
    second = c.messages.create(model=NAME, max_tokens=8, system=system, messages=turns, extra_body=GREEDY)
    ids = tok.prompt_ids([{"role": "system", "content": system}, *turns])
    u = second.usage
    assert u.cache_read_input_tokens > first.usage.input_tokens + first.usage.cache_read_input_tokens
    assert u.input_tokens + u.cache_read_input_tokens == len(ids)
    assert second.content[0].text == tok.decode(reference_ids(reference, ids, 8))


def test_output_format_constrains_the_answer(server):
    """output_config.format: the text is JSON under the schema (the grammar's end ends it:
    end_turn), streamed alike."""
    url, _ = server
    c = client(url)
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"],
              "additionalProperties": False}
    request = dict(model=NAME, max_tokens=40, messages=[{"role": "user", "content": "Where?"}], extra_body=GREEDY,
                   output_config={"format": {"type": "json_schema", "schema": schema}})
    whole = c.messages.create(**request)
    jsonschema.validate(json.loads(whole.content[0].text), schema)
    assert whole.stop_reason == "end_turn"
    message, _ = streamed(c, **request)
    assert same_message(message, whole)


# -- tools -----------------------------------------------------------------------------------------------
def tool_uses(message) -> list:
    return [b for b in message.content if b.type == "tool_use"]


@pytest.mark.parametrize("choice", [{"type": "tool", "name": "get_weather"}, {"type": "any"}])
def test_a_forced_call_and_its_result(tool_server, qwen_model, choice):
    """tool_choice any / a named tool: the answer is one tool_use block (toolu_ id, input valid
    under its input_schema, stop_reason tool_use), streamed alike (input_json_delta); the call and
    a tool_result sent back render as the OpenAI-shaped messages do (tool_calls, a tool message),
    is_error marked in the result; the model then answers in text, the first prompt reused."""
    url, _ = tool_server
    c = client(url)
    request = dict(model=NAME, max_tokens=60, messages=QUESTION, tools=TOOLS, tool_choice=choice, extra_body=GREEDY)
    whole = c.messages.create(**request)
    assert whole.stop_reason == "tool_use"
    (call,) = tool_uses(whole)
    assert call.id.startswith("toolu_") and (choice["type"] == "any" or call.name == "get_weather")
    jsonschema.validate(call.input, {t["name"]: t for t in TOOLS}[call.name]["input_schema"])
    message, kinds = streamed(c, **request)
    assert same_message(message, whole) and "input_json" in kinds

    for is_error in (False, True):
        turns = QUESTION + [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in whole.content]},
                            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                                          "content": [{"type": "text", "text": "21 C"}],
                                                          "is_error": is_error}]}]
        answer = c.messages.create(model=NAME, max_tokens=10, messages=turns, tools=TOOLS,
                                   tool_choice={"type": "none"}, extra_body=GREEDY)
        assert not tool_uses(answer) and answer.content[0].text and answer.stop_reason in ("max_tokens", "end_turn")
        tok = llm.load(qwen_model, bits=4, max_context=512, progress=False).tokenizer
        openai_shaped = QUESTION + [
            {"role": "assistant", "content": "", "tool_calls": [{"id": call.id, "type": "function", "function": {
                "name": call.name, "arguments": call.input}}]},
            {"role": "tool", "tool_call_id": call.id, "name": call.name,
             "content": ("Error: " if is_error else "") + "21 C"}]
        ids = tok.prompt_ids(openai_shaped, tools=[WEATHER, TIME])
        u = answer.usage
        assert u.input_tokens + u.cache_read_input_tokens == len(ids)
        assert u.cache_read_input_tokens > 0  # the first request's prompt (the tools' system message) reused


def test_auto_without_a_call_is_text(tool_server):
    url, _ = tool_server
    whole = client(url).messages.create(model=NAME, max_tokens=8, messages=QUESTION, tools=TOOLS,
                                        extra_body={"temperature": 0.7})
    assert [b.type for b in whole.content] == ["text"] and whole.stop_reason == "max_tokens"


def test_blocks_of_reply_deltas():
    """The blocks a reply's deltas make (reasoning, text, calls in order), the events building
    them, and a call whose arguments are not an object: input {} (not forced: possible)."""
    blocks = Blocks(thinking=True)
    events = []
    for delta in ({"reasoning_content": "Hm"}, {"reasoning_content": "."}, {"content": "Let me see."},
                  {"tool_calls": [{"index": 0, "id": "c", "function": {"name": "f", "arguments": ""}}]},
                  {"tool_calls": [{"index": 0, "function": {"arguments": '{"a": '}}]},
                  {"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]},
                  {"tool_calls": [{"index": 1, "id": "d", "function": {"name": "g", "arguments": "{oops"}}]}):
        events += blocks.push(delta)
    events += blocks.close()
    kinds = [b["type"] for b in blocks.content]
    assert kinds == ["thinking", "text", "tool_use", "tool_use"]
    assert blocks.content[0]["thinking"] == "Hm." and blocks.content[1]["text"] == "Let me see."
    assert [b["input"] for b in blocks.content[2:]] == [{"a": 1}, {}]
    names = [e for e, _ in events]
    assert names.count("content_block_start") == 4 == names.count("content_block_stop")
    assert ("content_block_delta", {"index": 2, "delta": {"type": "input_json_delta", "partial_json": '{"a": 1}'}}) \
        in events
    dropped = Blocks(thinking=False)
    dropped.push({"reasoning_content": "Hm", "content": "Yes"})
    assert [b["type"] for b in dropped.content] == ["text"]


def test_messages_map_onto_chat_messages():
    """tool_use -> the assistant's tool_calls (thinking: its reasoning_content; redacted thinking
    dropped), tool_result -> tool messages before the user's text (joined), system -> the first message;
    with short ids (Mistral's templates) one id maps to the same 9 characters on both sides."""
    body = {"model": NAME, "max_tokens": 5, "system": [{"type": "text", "text": "S"}], "top_k": 3,
            "stop_sequences": ["\n\n"], "thinking": {"type": "disabled"}, "messages": [
                {"role": "user", "content": "Q"},
                {"role": "assistant", "content": [{"type": "thinking", "thinking": "T", "signature": ""},
                                                  {"type": "redacted_thinking", "data": "x"},
                                                  {"type": "text", "text": "A"},
                                                  {"type": "tool_use", "id": "toolu_1", "name": "f",
                                                   "input": {"x": 1}}]},
                {"role": "user", "content": [{"type": "text", "text": "and "},
                                             {"type": "tool_result", "tool_use_id": "toolu_1", "content": "R",
                                              "is_error": True},
                                             {"type": "text", "text": "U"}]}],
            "tools": [{"name": "f", "input_schema": {"type": "object"}}], "tool_choice": {"type": "any"}}
    ask = translate(body)
    assert (ask.stop, ask.top_k, ask.thinking) == (["\n\n"], 3, False)
    assert ask.body["messages"] == [
        {"role": "system", "content": "S"}, {"role": "user", "content": "Q"},
        {"role": "assistant", "content": "A", "reasoning_content": "T", "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "Error: R"}, {"role": "user", "content": "and U"}]
    assert ask.body["tools"] == [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    assert ask.body["tool_choice"] == "required"
    short = translate(body, short_ids=True).body["messages"]
    assert short[2]["tool_calls"][0]["id"] == short[3]["tool_call_id"] != "toolu_1"
    assert len(short[3]["tool_call_id"]) == 9 and short[3]["tool_call_id"].isalnum()


# -- a reasoning model --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def harmony_server(tmp_path_factory):
    from test_harmony import SHAPE, TEMPLATE
    from qlinear.llm import synthetic

    path = synthetic.make_checkpoint(tmp_path_factory.mktemp("harmony") / "gpt_oss", "gpt_oss", seed=3, **SHAPE)
    config = json.loads((path / "tokenizer_config.json").read_text())
    (path / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TEMPLATE}))
    with running_server(llm.load(path, bits=8, max_context=1024, progress=False), max_batch=4) as (url, _):
        yield url


def test_reasoning_comes_back_as_thinking_blocks(harmony_server):
    """GPT-OSS's analysis channel as a thinking block (before the call, forced by tool_choice
    any), streamed alike; thinking disabled drops it and leaves the rest as it was (greedy)."""
    c = client(harmony_server)
    seen = 0
    for question in ("Weather in Paris?", "Weather in Oslo?", "Weather in Rome, please?", "Is it cold in Lima?"):
        request = dict(model=NAME, max_tokens=30, messages=[{"role": "user", "content": question}],
                       tools=TOOLS[:1], tool_choice={"type": "any"}, extra_body=GREEDY)
        whole = c.messages.create(**request)
        kinds = [b.type for b in whole.content]
        assert kinds in (["thinking"], ["tool_use"]), kinds
        message, _ = streamed(c, **request)
        assert same_message(message, whole)
        if kinds == ["thinking"]:
            seen += 1
            assert whole.content[0].thinking and "<|" not in whole.content[0].thinking
            assert whole.stop_reason == "max_tokens"
            off = c.messages.create(**request, thinking={"type": "disabled"})
            assert off.content == [] and off.usage.output_tokens == whole.usage.output_tokens
    assert seen


# -- errors -----------------------------------------------------------------------------------------------
HI = [{"role": "user", "content": "hi"}]
ABSENT = object()  # a field left out of the request
BAD = [
    ({"messages": HI, "max_tokens": ABSENT}, 400, "'max_tokens' is required"),
    ({"messages": HI, "max_tokens": 0}, 400, "'max_tokens' is required: an integer >= 1, got 0"),
    ({"messages": [{"role": "system", "content": "x"}, *HI]}, 400, "the top-level 'system'"),
    ({"messages": [{"role": "tool", "content": "x"}]}, 400, "the role must be \"user\" or \"assistant\""),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type":
                                                                           "image/png", "data": "AAAA"}}]}]},
     400, "messages[0].content[0]: image blocks are not supported"),
    ({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]}, 400, "document blocks"),
    ({"messages": [{"role": "user", "content": []}]}, 400, "non-empty list of content blocks"),
    ({"messages": []}, 400, "'messages' must be a non-empty list"),
    ({"messages": [*HI, {"role": "assistant", "content": "The"}]}, 400, "prefilled assistant reply is not supported"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "1"}]}]},
     400, "answers no tool call of an earlier assistant message"),
    ({"messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": "x"}]},
                   *HI]}, 400, "an object 'input'"),
    ({"messages": HI, "system": [{"type": "image"}]}, 400, "'system'[0]: image blocks"),
    ({"messages": HI, "temperature": 1.5}, 400, "'temperature' must be a number in [0, 1]"),
    ({"messages": HI, "top_k": -1}, 400, "'top_k' must be an integer >= 0"),
    ({"messages": HI, "stop_sequences": [""]}, 400, "'stop_sequences' must be a list"),
    ({"messages": HI, "stop_sequences": "x"}, 400, "'stop_sequences' must be a list"),
    ({"messages": HI, "thinking": {"type": "sometimes"}}, 400, "'thinking' must be an object"),
    ({"messages": HI, "tools": [{"name": "f", "input_schema": {"type": "object"}}]}, 400, "does not render tools"),
    ({"messages": HI, "tools": [{"name": "f", "input_schema": {"type": "object", "x": -2**63 - 1}}]}, 400,
     "the schema cannot be used"),
    ({"messages": HI, "tools": [{"type": "web_search_20250305", "name": "web_search"}]}, 400,
     "the tool type \"web_search_20250305\" is not supported"),
    ({"messages": HI, "tool_choice": {"type": "any"}}, 400, "'tool_choice' needs 'tools'"),
    ({"messages": HI, "tool_choice": {"type": "sometimes"}}, 400, "'tool_choice' must be"),
    ({"messages": HI, "output_config": {"format": {"type": "xml"}}}, 400, "'output_config.format' must be"),
    ({"messages": HI, "output_config": 3}, 400, "'output_config' must be an object"),
    ({"messages": HI, "model": "claude-sonnet-4-5"}, 404, "the model 'claude-sonnet-4-5' does not exist"),
]


@pytest.mark.parametrize("body, status, message", BAD)
def test_bad_requests_get_anthropic_errors(server, body, status, message):
    url, _ = server
    body = {k: v for k, v in {"model": NAME, "max_tokens": 4, **body}.items() if v is not ABSENT}
    r = httpx.post(url + "/v1/messages", json=body, timeout=WAIT)
    assert r.status_code == status, r.text
    error = r.json()
    assert error["type"] == "error" and set(error["error"]) == {"type", "message"}
    assert error["error"]["type"] == ("not_found_error" if status == 404 else "invalid_request_error")
    assert message in error["error"]["message"], error


def test_bad_tool_requests(tool_server):
    url, _ = tool_server
    c = client(url)
    with pytest.raises(anthropic.BadRequestError, match="\"get_time\", which is not among the tools"):
        c.messages.create(model=NAME, max_tokens=4, messages=QUESTION, tools=TOOLS[:1],
                          tool_choice={"type": "tool", "name": "get_time"})
    with pytest.raises(anthropic.BadRequestError, match="input_schema must be a JSON Schema object"):
        c.messages.create(model=NAME, max_tokens=4, messages=QUESTION, tools=[{"name": "f", "input_schema": []}])
    with pytest.raises(anthropic.BadRequestError, match="names a function twice"):
        c.messages.create(model=NAME, max_tokens=4, messages=QUESTION, tools=TOOLS + TOOLS[:1])


def test_errors_through_the_client(server, checkpoint):
    """The client raises its own error classes from the server's status and body; the API key
    as the client sends it (x-api-key)."""
    url, _ = server
    with pytest.raises(anthropic.NotFoundError):
        client(url).messages.create(model="nope", max_tokens=4, messages=HI)
    with pytest.raises(anthropic.BadRequestError, match="image blocks are not supported"):
        client(url).messages.create(model=NAME, max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}]}])
    with running_server(load(checkpoint, max_context=64), api_key="sesame") as (keyed, _):
        with pytest.raises(anthropic.AuthenticationError):
            client(keyed, api_key="wrong").messages.create(model=NAME, max_tokens=2, messages=HI)
        answer = client(keyed, api_key="sesame").messages.create(model=NAME, max_tokens=2, messages=HI)
        assert answer.usage.output_tokens == 2
        r = httpx.get(keyed + "/v1/messages", timeout=WAIT)  # other routes' errors on its path: its shape too
        assert r.status_code == 405 and r.json()["type"] == "error"


def test_error_kinds():
    kinds = {s: error_body(ApiError(s, "m"))["error"]["type"] for s in (400, 401, 404, 413, 429, 500, 503)}
    assert kinds == {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                     413: "request_too_large", 429: "rate_limit_error", 500: "api_error", 503: "overloaded_error"}


def test_answers_follow_the_openapi_document(server):
    """A whole and a streamed answer (each event: its name, its JSON data) and an error, checked by
    schemathesis against the served document."""
    schemathesis = pytest.importorskip("schemathesis")
    url, _ = server
    schema = schemathesis.openapi.from_dict(httpx.get(url + "/openapi.json", timeout=WAIT).json())
    for body in ({"stream": True}, {}, {"max_tokens": 0}):
        case = schema["/v1/messages"]["POST"].Case(body={"model": NAME, "max_tokens": 3, "messages": HI, **body},
                                                   media_type="application/json")
        response = case.call(base_url=url, timeout=WAIT)
        assert response.status_code == (400 if "max_tokens" in body else 200)
        case.validate_response(response, excluded_checks=[schemathesis.checks.positive_data_acceptance])


def test_openapi_describes_messages(server):
    url, _ = server
    doc = httpx.get(url + "/openapi.json", timeout=WAIT).json()
    schema = doc["components"]["schemas"]["MessagesRequest"]
    jsonschema.Draft202012Validator.check_schema(schema)
    assert {"model", "max_tokens", "messages"} == set(schema["required"])
    jsonschema.validate({"model": NAME, "max_tokens": 5, "messages": [*QUESTION, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "name": "get_weather", "input": {}}]}, {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t", "content": "21", "is_error": False}]}],
        "tools": TOOLS, "tool_choice": {"type": "tool", "name": "get_weather"}}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"model": NAME, "messages": HI}, schema)
    assert "/v1/messages/count_tokens" in doc["paths"]
