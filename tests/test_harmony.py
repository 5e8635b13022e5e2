"""GPT-OSS's harmony replies: read by channel (runtime.harmony) against replies rendered by the
model's own chat template (tests/data/gpt_oss_chat_template.jinja, as OpenAI publishes it), and
served in OpenAI's shape (reasoning_content, content, tool_calls; streamed deltas assembling to the
whole reply) through the openai client, a synthetic GPT-OSS checkpoint behind the server."""
import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tokenizers")
sandbox = pytest.importorskip("jinja2.sandbox")

from qlinear import llm  # noqa: E402
from qlinear.llm import synthetic  # noqa: E402
from qlinear.llm.runtime import harmony  # noqa: E402
from qlinear.llm.runtime.tokenizer import Tokenizer  # noqa: E402

TEMPLATE = (Path(__file__).parent / "data" / "gpt_oss_chat_template.jinja").read_text()
SHAPE = dict(hidden_size=64, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1,
             num_hidden_layers=2, vocab_size=1024)
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}},
                   "required": ["city"], "additionalProperties": False}}}
SPECIALS = ["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|call|>", "<|return|>", "<|constrain|>"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A synthetic GPT-OSS checkpoint carrying GPT-OSS's own chat template."""
    path = synthetic.make_checkpoint(tmp_path_factory.mktemp("harmony") / "gpt_oss", "gpt_oss", seed=3, **SHAPE)
    cfg_path = path / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = TEMPLATE
    cfg_path.write_text(json.dumps(cfg))
    return path


@pytest.fixture(scope="module")
def tok(checkpoint):
    return Tokenizer.from_dir(checkpoint)


def render(messages, tools=None, add_generation_prompt=True, **variables):
    """The template rendered by jinja2 alone, as transformers does (messages in its form)."""
    env = sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = lambda m: (_ for _ in ()).throw(ValueError(m))
    env.globals["strftime_now"] = lambda f: __import__("time").strftime(f)
    env.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False)
    return env.from_string(TEMPLATE).render(messages=messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                            **variables)


def reply_ids(tok, turns, tools=None):
    """The ids the model would generate for the assistant ``turns`` (the template's rendering of
    them after the prompt's "<|start|>assistant")."""
    prompt = [{"role": "user", "content": "What is the weather in Paris?"}]
    head = tok.encode(render(prompt, tools))
    whole = tok.encode(render(prompt + turns, tools, add_generation_prompt=False))
    assert whole[:len(head)] == head
    return whole[len(head):]


def test_tokenizer_stops_at_call_and_return_not_at_end(tok):
    ids = {name: tok.hf.token_to_id(name) for name in SPECIALS}
    assert tok.replies is not None
    assert ids["<|end|>"] not in tok.stop_ids
    assert {ids["<|call|>"], ids["<|return|>"]} <= tok.stop_ids


def test_replies_the_template_renders_read_back(tok):
    """The template's own rendering of a reply (reasoning, then the answer) parsed back into them,
    a multi-byte character split across tokens included."""
    thinking, answer = "Paris is in France; the user wants weather. Ça va.", "It is sunny in Paris, 21 °C."
    ids = reply_ids(tok, [{"role": "assistant", "thinking": thinking, "content": answer}])
    assert ids[-1] == tok.hf.token_to_id("<|return|>")
    assert harmony.parse(tok, tok.replies, ids) == {"reasoning": thinking, "content": answer, "calls": []}


@pytest.mark.parametrize("header", ["template", "channel_first"])
def test_tool_calls_read_back(tok, header):
    """A call as the template writes it (``to=`` before the channel) and as the model often does
    (``to=`` after it, with <|constrain|>json); a call to a function not offered is reasoning."""
    if header == "template":
        msg = {"role": "assistant", "content": "", "thinking": "I need the tool.",
               "tool_calls": [{"id": "c", "type": "function",
                               "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}
        ids = reply_ids(tok, [msg], [WEATHER])
        assert ids[-1] == tok.hf.token_to_id("<|call|>")
    else:
        ids = tok.encode("<|channel|>analysis<|message|>I need the tool.<|end|><|start|>assistant<|channel|>"
                         "commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>")
    got = harmony.parse(tok, tok.replies, ids, {"get_weather"})
    assert got == {"reasoning": "I need the tool.", "content": "", "calls": [("get_weather", '{"city": "Paris"}')]}
    unoffered = harmony.parse(tok, tok.replies, ids, {"other"})
    assert unoffered["calls"] == [] and unoffered["reasoning"].endswith('{"city": "Paris"}')
    assert harmony.parse(tok, tok.replies, ids, None)["calls"] == []


def test_text_outside_the_format_is_content(tok):
    """A model that ignores the format: its text is the answer (held back only while it could
    still become a message's header)."""
    text = "Just an answer, no channels at all. " * 12
    got = harmony.parse(tok, tok.replies, tok.encode(text))
    assert got == {"reasoning": "", "content": text, "calls": []}
    cut = harmony.parse(tok, tok.replies, tok.encode("<|channel|>final<|message|>cut off mid"))
    assert cut["content"] == "cut off mid"


def test_streamed_parts_equal_the_whole_reply_on_random_tokens(tok):
    """Token soup (ordinary and special ids in any order): the parser never fails, its parts
    streamed one token at a time assemble to the whole parse, and no special token's text leaks."""
    rng = np.random.default_rng(0)
    special = [tok.hf.token_to_id(s) for s in SPECIALS]
    words = tok.encode("analysis final commentary to=functions.get_weather json {\"city\": \"Paris\"} hello é")
    for _ in range(300):
        ids = [int(rng.choice(special)) if rng.random() < 0.25 else int(rng.choice(words))
               for _ in range(rng.integers(1, 80))]
        parser = harmony.ReplyParser(tok, tok.replies, {"get_weather"})
        parts = [p for t in ids for p in parser.push(t)] + parser.flush()
        whole = harmony.parse(tok, tok.replies, ids, {"get_weather"})
        assert harmony.assemble(parts) == whole
        assert all(p.kind in ("reasoning", "content", "call", "arguments") for p in parts)
        assert not any(s in p.text for p in parts for s in SPECIALS)


def test_stop_strings_cut_the_answer_not_the_reasoning(tok):
    pytest.importorskip("starlette")
    from qlinear.llm.serve.replies import ReplyText, message

    ids = tok.encode("<|channel|>analysis<|message|>STOP is a word here<|end|><|start|>assistant<|channel|>final"
                     "<|message|>first part STOP second part<|return|>")
    stream = ReplyText(tok, ["STOP"])
    deltas = []
    for t in ids:
        deltas.append(stream.push(t))
        if stream.stopped:
            break
    deltas.append(stream.flush())
    got = message(deltas)
    assert got["reasoning_content"] == "STOP is a word here" and got["content"] == "first part "


def test_model_chat_answers_with_the_final_channel(checkpoint, tok):
    """Model.chat on a harmony model: the reply's final channel as the answer, its analysis in
    model.reasoning, the history carrying the answer only (as the template wants it)."""
    model = llm.load(checkpoint, bits=8, max_context=512, progress=False)
    messages = [{"role": "user", "content": "hello"}]
    ids = model.generate_ids(tok.prompt_ids(messages), 40, temperature=1.0, seed=5)
    expected = harmony.parse(tok, tok.replies, ids)
    model.reset()
    assert model.chat("hello", 40, temperature=1.0, seed=5) == expected["content"]
    assert model.reasoning == expected["reasoning"]
    assert model.history[-1] == {"role": "assistant", "content": expected["content"]}


# -- served ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def served(checkpoint):
    pytest.importorskip("starlette")
    pytest.importorskip("llguidance")
    openai = pytest.importorskip("openai")
    from test_serve import running_server

    with running_server(llm.load(checkpoint, bits=8, max_context=1024, progress=False), max_batch=4) as (url, _):
        yield openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60), url


def end_bias(tok, value=5.5):
    """A bias that makes a message end after a few tokens: the random model's logits are near-uniform."""
    return {str(tok.hf.token_to_id("<|end|>")): value}


def streamed(client, **request):
    """A streamed reply assembled from its deltas: (content, reasoning, calls, finish, chunks)."""
    content, reasoning, calls, finish, n = "", "", {}, None, 0
    for chunk in client.chat.completions.create(stream=True, **request):
        n += 1
        delta = chunk.choices[0].delta
        content += delta.content or ""
        reasoning += getattr(delta, "reasoning_content", None) or ""
        for c in delta.tool_calls or ():
            entry = calls.setdefault(c.index, {"name": "", "arguments": ""})
            entry["name"] += (c.function.name or "") if c.function else ""
            entry["arguments"] += (c.function.arguments or "") if c.function else ""
        finish = chunk.choices[0].finish_reason or finish
    return content, reasoning, [calls[i] for i in sorted(calls)], finish, n


def test_reasoning_and_content_are_separated(served, tok):
    """JSON output on the final channel after free reasoning: reasoning_content holds the analysis,
    content the JSON alone; the streamed deltas assemble to the same reply (same seed)."""
    client, _ = served
    schema = WEATHER["function"]["parameters"]
    seen_reasoning = 0
    for seed in range(8):
        request = dict(model="tiny", messages=[{"role": "user", "content": "Weather in Paris, as JSON?"}],
                       max_tokens=80, temperature=1.0, seed=seed, logit_bias=end_bias(tok),
                       response_format={"type": "json_schema", "json_schema": {"name": "w", "schema": schema}})
        whole = client.chat.completions.create(**request).choices[0]
        value = json.loads(whole.message.content)
        assert set(value) == {"city"} and len(value["city"]) <= 8
        reasoning = whole.message.reasoning_content
        assert isinstance(reasoning, str) and not any(s in reasoning + whole.message.content for s in SPECIALS)
        seen_reasoning += bool(reasoning)
        content, streamed_reasoning, calls, finish, chunks = streamed(client, **request)
        assert (content, streamed_reasoning, calls, finish) == (whole.message.content, reasoning, [],
                                                                whole.finish_reason)
        assert chunks > 3
    assert seen_reasoning >= 2  # the model reasoned first in some replies (it may go straight to the answer)


def test_a_tool_call_round_trip(served, tok):
    """tool_choice "required": a harmony call (reasoning first or not) comes back as tool_calls,
    its arguments under the function's schema, streamed alike; the call and its result sent back
    render through the template as transformers renders them (the prompt's token count), the
    first turn's prompt reused from the prefix cache."""
    client, _ = served
    question = [{"role": "user", "content": "What is the weather in Paris?"}]
    request = dict(model="tiny", messages=question, tools=[WEATHER], tool_choice="required", max_tokens=80,
                   temperature=1.0, seed=11, logit_bias=end_bias(tok), reasoning_effort="low")
    first = client.chat.completions.create(**request)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and call.id.startswith("call_")
    args = json.loads(call.function.arguments)
    assert set(args) == {"city"} and len(args["city"]) <= 8
    content, reasoning, calls, finish, _ = streamed(client, **request)
    assert (content, reasoning, finish) == ("", choice.message.reasoning_content, "tool_calls")
    assert calls == [{"name": "get_weather", "arguments": call.function.arguments}]

    follow_up = question + [
        {"role": "assistant", "content": None, "reasoning_content": choice.message.reasoning_content,
         "tool_calls": [{"id": call.id, "type": "function",
                         "function": {"name": "get_weather", "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"}]
    second = client.chat.completions.create(model="tiny", messages=follow_up, tools=[WEATHER], max_tokens=8,
                                            temperature=0.0, reasoning_effort="low")
    expected = render(question + [
        {"role": "assistant", "content": "", "thinking": choice.message.reasoning_content,
         "tool_calls": [{"id": call.id, "type": "function", "function": {"name": "get_weather", "arguments": args}}]},
        {"role": "tool", "content": "sunny, 21 C"}], [WEATHER], reasoning_effort="low")
    assert "Reasoning: low" in expected and "to=functions.get_weather<|channel|>commentary json" in expected
    assert second.usage.prompt_tokens == len(tok.encode(expected))
    assert second.usage.prompt_tokens_details.cached_tokens > 0


def test_reasoning_effort_and_template_variables_are_checked(served):
    _, url = served
    import httpx

    base = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    for extra, param in (({"reasoning_effort": "extreme"}, "reasoning_effort"),
                         ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs"),
                         ({"chat_template_kwargs": {"a b": 1}}, "chat_template_kwargs"),
                         ({"chat_template_kwargs": {"reasoning_effort": 5}}, "messages"),
                         ({"messages": [{"role": "assistant", "content": "x", "reasoning_content": 3}]}, "messages")):
        r = httpx.post(url + "/v1/chat/completions", json={**base, **extra}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (extra, r.text)
    r = httpx.post(url + "/v1/chat/completions", json={**base, "reasoning_effort": "high"}, timeout=30)
    assert r.status_code == 200
