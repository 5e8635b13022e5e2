"""Tool calls in qlinear-llm serve: tools rendered by the model's own chat template (Qwen2.5's,
on the model trained on the standard library), tool_choice required / named constrained to
Qwen's <tool_call> format so the arguments always parse, the openai client's round trip (call,
tool message, answer), streamed deltas assembling to the whole call; Llama 3's and Mistral's
formats parsed; bad tools, unknown functions and malformed tool messages answered 400."""

import json
import shutil
import sys
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

from qlinear import llm  # noqa: E402
from qlinear.llm.serve import tools  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from test_serve import client, running_server  # noqa: E402

NAME = "tiny"
# Qwen2.5-Instruct's chat template (tokenizer_config.json), its tool parts verbatim; the default
# system prompt shortened (the trained model's context is 512 tokens)
QWEN25_TEMPLATE = (
    "{%- if tools %}\n    {{- '<|im_start|>system\\n' }}\n    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- messages[0]['content'] }}\n    {%- else %}\n        {{- 'You are a helpful assistant.' }}\n"
    "    {%- endif %}\n    {{- \"\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user "
    "query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>\" }}\n"
    "    {%- for tool in tools %}\n        {{- \"\\n\" }}\n        {{- tool | tojson }}\n    {%- endfor %}\n"
    "    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, \\\"arguments\\\": "
    "<args-json-object>}\\n</tool_call><|im_end|>\\n\" }}\n{%- else %}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n    {%- else %}\n"
    "        {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}\n    {%- endif %}\n"
    "{%- endif %}\n{%- for message in messages %}\n"
    "    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) or "
    "(message.role == \"assistant\" and not message.tool_calls) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    "    {%- elif message.role == \"assistant\" %}\n        {{- '<|im_start|>' + message.role }}\n"
    "        {%- if message.content %}\n            {{- '\\n' + message.content }}\n        {%- endif %}\n"
    "        {%- for tool_call in message.tool_calls %}\n            {%- if tool_call.function is defined %}\n"
    "                {%- set tool_call = tool_call.function %}\n            {%- endif %}\n"
    "            {{- '\\n<tool_call>\\n{\"name\": \"' }}\n            {{- tool_call.name }}\n"
    "            {{- '\", \"arguments\": ' }}\n            {{- tool_call.arguments | tojson }}\n"
    "            {{- '}\\n</tool_call>' }}\n        {%- endfor %}\n        {{- '<|im_end|>\\n' }}\n"
    "    {%- elif message.role == \"tool\" %}\n"
    "        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != \"tool\") %}\n"
    "            {{- '<|im_start|>user' }}\n        {%- endif %}\n        {{- '\\n<tool_response>\\n' }}\n"
    "        {{- message.content }}\n        {{- '\\n</tool_response>' }}\n"
    "        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}\n"
    "            {{- '<|im_end|>\\n' }}\n        {%- endif %}\n    {%- endif %}\n{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}\n{%- endif %}\n")

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "integer", "minimum": -12,
                                                                                  "maximum": 14}},
                                       "required": ["zone"], "additionalProperties": False}}}
USER = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def qwen_model(tmp_path_factory):
    """The trained model with Qwen2.5's tool-rendering chat template."""
    out = tmp_path_factory.mktemp("qwen-tools") / "model"
    shutil.copytree(ROOT / "models" / "stdlib-qwen2", out)
    config = json.loads((out / "tokenizer_config.json").read_text())
    (out / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": QWEN25_TEMPLATE}))
    return out


@pytest.fixture(scope="module")
def server(qwen_model):
    with running_server(llm.load(qwen_model, bits=4, max_context=512, progress=False), max_batch=4) as (url, app):
        yield url, app


def arguments_valid(call, tool) -> dict:
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, tool["function"]["parameters"])
    return args


def test_template_renders_tools_and_tool_messages(qwen_model):
    tok = llm.load(qwen_model, bits=4, max_context=512, progress=False).tokenizer
    messages = [*USER, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "21 C"}]
    text = tok.apply_chat_template(messages, tools=[WEATHER])
    assert '<tools>\n{"type": "function", "function": {"name": "get_weather"' in text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    assert "<|im_start|>user\n<tool_response>\n21 C\n</tool_response><|im_end|>" in text


def test_round_trip_with_the_openai_client(server):
    """A named function: the call comes back parsed (finish_reason tool_calls, arguments valid);
    the assistant message and a tool message go back; the model answers in text."""
    url, _ = server
    c = client(url)
    r = c.chat.completions.create(model=NAME, messages=USER, tools=[WEATHER, TIME], temperature=0.7, seed=1,
                                  tool_choice={"type": "function", "function": {"name": "get_weather"}})
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    arguments_valid(call, WEATHER)
    messages = [*USER, choice.message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 21})}]
    r2 = c.chat.completions.create(model=NAME, messages=messages, tools=[WEATHER, TIME], tool_choice="none",
                                   temperature=0.7, seed=1, max_tokens=12)
    assert r2.choices[0].message.tool_calls is None and r2.choices[0].message.content
    assert r2.usage.prompt_tokens > r.usage.prompt_tokens  # the call and its result are in the prompt


def test_required_and_streamed_deltas_assemble_to_the_whole_call(server):
    """tool_choice required: one of the tools, valid arguments; the streamed deltas (index, id and
    name first, then the arguments) assemble to the non-streamed call (greedy: the same text)."""
    url, _ = server
    c = client(url)
    kw = dict(model=NAME, messages=USER, tools=[WEATHER, TIME], tool_choice="required", temperature=0, seed=0)
    whole = c.chat.completions.create(**kw).choices[0]
    (call,) = whole.message.tool_calls
    arguments_valid(call, {"get_weather": WEATHER, "get_time": TIME}[call.function.name])
    assembled, finish = {}, None
    for chunk in c.chat.completions.create(**kw, stream=True):
        delta = chunk.choices[0].delta
        assert not delta.content
        for d in delta.tool_calls or ():
            entry = assembled.setdefault(d.index, {"id": d.id, "name": d.function.name, "arguments": ""})
            entry["arguments"] += d.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    assert list(assembled) == [0] and assembled[0]["id"].startswith("call_")
    assert (assembled[0]["name"], assembled[0]["arguments"]) == (call.function.name, call.function.arguments)


def test_auto_without_a_call_is_content(server):
    url, _ = server
    r = client(url).chat.completions.create(model=NAME, messages=USER, tools=[WEATHER], temperature=0.7, seed=3,
                                            max_tokens=8)
    assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason == "length"


def test_formats_parse():
    plan = tools.ToolPlan([WEATHER], tools.QWEN, True, None)
    text = 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    content, calls = plan.calls(text)
    assert content == "Let me look.\n" and calls[0]["function"] == {"name": "get_weather",
                                                                     "arguments": '{"city": "Oslo"}'}
    assert plan.calls("<tool_call>\n{not json}\n</tool_call>") == ("<tool_call>\n{not json}\n</tool_call>", [])
    assert plan.calls('<tool_call>{"name": "nope", "arguments": {}}</tool_call>')[1] == []  # not a tool offered
    llama = tools.ToolPlan([WEATHER], tools.LLAMA3, True, None)  # <|python_tag|> is a special token: not in the text
    assert llama.calls(' {"name": "get_weather", "parameters": {"city": "Rome"}}')[1][0]["function"]["arguments"] \
        == '{"city": "Rome"}'
    assert llama.calls("It is sunny.") == ("It is sunny.", [])
    mistral = tools.ToolPlan([WEATHER, TIME], tools.MISTRAL, True, None)  # [TOOL_CALLS] likewise
    _, calls = mistral.calls('[{"name": "get_weather", "arguments": {"city": "Rome"}}, '
                             '{"name": "get_time", "arguments": {"zone": 1}}]')
    assert [c["function"]["name"] for c in calls] == ["get_weather", "get_time"]
    assert all(len(c["id"]) == 9 and c["id"].isalnum() for c in calls)  # as Mistral's templates demand
    assert tools.detect("{% if tools %}[TOOL_CALLS]{% endif %}") is tools.MISTRAL
    assert tools.detect("{% if tools %}<|python_tag|>{% endif %}") is tools.LLAMA3
    assert tools.detect(QWEN25_TEMPLATE) is tools.QWEN


def test_stream_splits_content_and_calls():
    s = tools.ToolStream(tools.ToolPlan([WEATHER], tools.QWEN, True, None))
    text = 'Sure.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    out, deltas = [], []
    for i in range(0, len(text), 3):
        content, d = s.push(text[i:i + 3])
        out.append(content)
        deltas += d
    tail, d = s.flush()
    assert "".join(out) + tail == "Sure." and len(deltas + d) == 2
    assert deltas[0]["function"]["name"] == "get_weather" and deltas[1]["function"]["arguments"] == '{"city": "Oslo"}'


BAD = [
    ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools", "tools[0].function.name"),
    ({"tools": [{"type": "retrieval"}]}, "tools", "tools[0] must be"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "nosuch"}}}]}, "tools",
     "tools[0].function.parameters: the schema cannot be used"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_time"}}}, "tool_choice",
     "\"get_time\", which is not among the tools (get_weather)"),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice", "'tool_choice' must be"),
    ({"tool_choice": "required"}, "tool_choice", "'tool_choice' needs 'tools'"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "x": -2**63 - 1}}}]},
     "tools", "tools[0].function.parameters: the schema cannot be used"),  # beyond what llguidance reads
    ({"tools": [WEATHER, WEATHER]}, "tools", "names a function twice"),
    ({"messages": [*USER, {"role": "tool", "content": "21"}]}, "messages", "needs the 'tool_call_id'"),
    ({"messages": [*USER, {"role": "tool", "tool_call_id": "x", "content": "21"}]}, "messages",
     "answers no tool call of an earlier assistant message"),
    ({"messages": [*USER, {"role": "assistant", "tool_calls": [{"id": "x", "type": "function", "function": {
        "name": "get_weather", "arguments": "{city"}}]}]}, "messages", "arguments must be a JSON object"),
    ({"messages": [*USER, {"role": "assistant", "tool_calls": "x"}]}, "messages", "'tool_calls' must be"),
    ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format",
     "cannot be combined"),
]


@pytest.mark.parametrize("extra, param, message", BAD)
def test_bad_tools_and_tool_messages_are_400(server, extra, param, message):
    url, _ = server
    r = httpx.post(url + "/v1/chat/completions", json={"model": NAME, "messages": USER, **extra}, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert message in error["message"] and error["param"] == param, error


def test_tools_on_a_template_without_them_is_400(tmp_path):
    """The trained model's own template (plain ChatML) does not render tools: 400, not a prompt
    that silently leaves them out."""
    model = llm.load(ROOT / "models" / "stdlib-qwen2", bits=4, max_context=512, progress=False)
    with running_server(model) as (url, _):
        r = httpx.post(url + "/v1/chat/completions", json={"model": NAME, "messages": USER, "tools": [WEATHER]},
                       timeout=30)
        ok = httpx.post(url + "/v1/chat/completions", json={"model": NAME, "messages": USER, "max_tokens": 2},
                        timeout=30)
    assert r.status_code == 400 and "does not render tools" in r.json()["error"]["message"]
    assert ok.status_code == 200


def test_openapi_describes_the_fields(server):
    url, _ = server
    doc = httpx.get(url + "/openapi.json", timeout=30).json()
    chat = doc["components"]["schemas"]["ChatCompletionRequest"]
    jsonschema.Draft202012Validator.check_schema(chat)
    assert {"response_format", "tools", "tool_choice", "parallel_tool_calls"} <= set(chat["properties"])
    round_trip = [*USER, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "21 C"}]
    jsonschema.validate({"model": NAME, "messages": round_trip, "tools": [WEATHER, TIME], "tool_choice": "required",
                         "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {}}}}, chat)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"model": NAME, "messages": USER, "tool_choice": "sometimes"}, chat)


@pytest.mark.parametrize("fmt, text", [
    (tools.QWEN, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}\n</tool_call>'),
    (tools.LLAMA3, '{"name": "get_weather", "parameters": {"city": "Oslo", "unit": "celsius"}}'),
    (tools.MISTRAL, '[{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}]'),
])
def test_forced_call_grammars_take_a_call_and_end(qwen_model, fmt, text):
    """Each format's grammar for tool_choice required: a call with valid arguments goes through to
    the grammar's end (the sequence stops there); arguments off the schema do not."""
    from qlinear.llm.serve import structured

    tok = llm.load(qwen_model, bits=4, max_context=512, progress=False).tokenizer
    grammars = structured.Grammars(tok)
    c = grammars.constraint(fmt.grammar([WEATHER, TIME]))
    assert all(c.advance(t) for t in tok.encode(text)) and c.done
    assert fmt.parse(text)[1] == [("get_weather", '{"city": "Oslo", "unit": "celsius"}')]
    bad = grammars.constraint(fmt.grammar([WEATHER]))
    assert not all(bad.advance(t) for t in tok.encode(text.replace("celsius", "kelvin")))
