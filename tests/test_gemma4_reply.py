"""Gemma 4's replies (runtime.gemma4_reply): read back from what Gemma 4's own chat template
(tests/data/gemma4_chat_template.jinja, as published with the model) renders (reasoning in the
thought channel, calls in Gemma's argument syntax), streamed one token at a time as they are
whole, with its markers as special tokens (which decoded text drops) or as plain text; and the
server's side: the reply's deltas, the stop at <|tool_response>, a forced call refused."""
import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tokenizers")
sandbox = pytest.importorskip("jinja2.sandbox")

from qlinear.llm import synthetic  # noqa: E402
from qlinear.llm.runtime import harmony  # noqa: E402
from qlinear.llm.runtime.gemma4_reply import MARKERS  # noqa: E402
from qlinear.llm.runtime.tokenizer import Tokenizer  # noqa: E402

TEMPLATE = (Path(__file__).parent / "data" / "gemma4_chat_template.jinja").read_text()
SPECIAL = ("<pad>", "<eos>", "<bos>", "<|turn>", "<turn|>", "<|think|>", "<|tool>", "<tool|>", "<tool_response|>",
           *MARKERS)
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}
ARGS = {"city": "Paris, \"the\" city", "days": 3, "options": {"unit": "C", "hourly": True, "limit": None},
        "tags": ["a b", 2.5, False], "empty": {}}


@pytest.fixture(scope="module", params=["special", "text"])
def tok(request, tmp_path_factory):
    """A tokenizer with Gemma 4's template, its markers special tokens or (``text``) plain text."""
    special = SPECIAL if request.param == "special" else SPECIAL[:3]
    out = tmp_path_factory.mktemp("gemma4") / request.param
    synthetic.train_tokenizer(out, 1024, chat=synthetic.ChatFormat(TEMPLATE, "<bos>", "<turn|>", "<pad>", special))
    return Tokenizer.from_dir(out)


def render(messages, tools=None, add_generation_prompt=True, **variables):
    env = sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = lambda m: (_ for _ in ()).throw(ValueError(m))
    return env.from_string(TEMPLATE).render(messages=messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                            bos_token="<bos>", **variables)


def reply_ids(tok, turn, tools=None, **variables):
    """The ids of the template's rendering of the assistant ``turn`` after the generation prompt."""
    prompt = [{"role": "user", "content": "What is the weather in Paris?"}]
    head = render(prompt, tools, **variables)
    whole = render(prompt + [turn], tools, add_generation_prompt=False, **variables)
    assert whole.startswith(head)
    return tok.encode(whole[len(head):])


def parse(tok, ids, functions=("get_weather",)):
    return harmony.parse(tok, tok.replies, ids, set(functions))


def test_the_format_is_recognized_and_stops_at_the_tool_response(tok):
    """(markers as text: the reply's text past <|tool_response> or <turn|> is dropped instead)"""
    assert tok.replies is not None and tok.replies.name == "gemma4"
    if tok.hf.token_to_id("<|tool_response>") is not None:
        assert {tok.hf.token_to_id("<|tool_response>"), tok.hf.token_to_id("<turn|>")} <= tok.stop_ids
    assert parse(tok, tok.encode("answer<|tool_response>more<turn|>")) == {"reasoning": "", "content": "answer",
                                                                          "calls": []}


def test_a_call_with_its_reasoning_reads_back(tok):
    """Thinking on: the template's thought channel and a call whose arguments use every kind of
    value (quotes and commas inside a string, nested objects, lists, null, booleans, floats)."""
    turn = {"role": "assistant", "content": "", "reasoning_content": "The user wants the weather.",
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": ARGS}}]}
    ids = reply_ids(tok, turn, [WEATHER], enable_thinking=True)
    got = parse(tok, ids)
    assert got["reasoning"] == "The user wants the weather." and got["content"] == ""
    ((name, args),) = got["calls"]
    assert name == "get_weather" and json.loads(args) == ARGS
    unoffered = parse(tok, ids, functions=("other",))
    assert unoffered["calls"] == [] and "call:get_weather{" in unoffered["content"]


def test_an_answer_reads_back(tok):
    """An answer as the template renders it, and after thinking as the model writes it (the
    template drops the thought from the history); with thinking off the prompt ends with an empty
    thought channel and the reply is the answer alone."""
    text = "It is sunny in Paris: 21 °C, ça va."
    got = parse(tok, reply_ids(tok, {"role": "assistant", "content": text}, enable_thinking=True))
    assert got == {"reasoning": "", "content": text, "calls": []}
    thought = tok.encode("<|channel>thought\nSunny, says the forecast.\n<channel|>" + text + "<turn|>")
    assert parse(tok, thought) == {"reasoning": "Sunny, says the forecast.", "content": text, "calls": []}
    assert render([{"role": "user", "content": "hi"}]).endswith("<|turn>model\n<|channel>thought\n<channel|>")


def test_streamed_parts_equal_the_whole_reply_on_random_tokens(tok):
    rng = np.random.default_rng(1)
    pieces = [tok.encode(m) for m in MARKERS] + [tok.encode(t) for t in ("thought\n", "call:get_weather", "{city:",
                                                                          "}", "hello ", "é", "\n")]
    for _ in range(300):
        ids = [t for _ in range(rng.integers(1, 30)) for t in pieces[rng.integers(len(pieces))]]
        parser = tok.replies.parser(tok, {"get_weather"})
        parts = [p for t in ids for p in parser.push(t)] + parser.flush()
        assert harmony.assemble(parts) == parse(tok, ids)


def test_server_deltas_and_forced_calls(tok):
    """The server's reply text: a call's deltas (index, id, name, then its arguments) assembling to
    the whole reply; tool_choice "required" refused with a 400 naming it."""
    pytest.importorskip("starlette")
    from qlinear.llm.serve import tool_formats
    from qlinear.llm.serve.protocol import ApiError
    from qlinear.llm.serve.replies import ReplyText, message
    from qlinear.llm.serve.tools import ToolPlan

    turn = {"role": "assistant", "content": "", "reasoning_content": "Let me look.",
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": ARGS}}]}
    ids = reply_ids(tok, turn, [WEATHER], enable_thinking=True)
    text = ReplyText(tok, [], ToolPlan([WEATHER], tool_formats.GEMMA4, True, None))
    deltas = [text.push(t) for t in ids] + [text.flush()]
    got = message([d for d in deltas if d])
    assert got["reasoning_content"] == "Let me look." and got["content"] is None
    (call,) = got["tool_calls"]
    assert call["function"]["name"] == "get_weather" and json.loads(call["function"]["arguments"]) == ARGS
    assert tool_formats.detect(TEMPLATE) is tool_formats.GEMMA4
    with pytest.raises(ApiError, match="tool_choice"):
        tool_formats.GEMMA4.grammar([WEATHER])


def test_served_through_the_openai_client(tmp_path):
    """A model with Gemma 4's template and markers behind the server: its chat replies parsed
    (streamed deltas assembling to the whole reply, with reasoning_content), a forced call a 400."""
    pytest.importorskip("starlette")
    openai = pytest.importorskip("openai")
    from qlinear import llm
    from test_serve import running_server

    path = synthetic.make_checkpoint(tmp_path / "g", "gemma3", shape="tiny", seed=2)
    synthetic.train_tokenizer(path, 1024, chat=synthetic.ChatFormat(TEMPLATE, "<bos>", "<turn|>", "<pad>", SPECIAL))
    model = llm.load(path, bits=8, max_context=512, progress=False)
    assert model.tokenizer.replies is not None
    with running_server(model, max_batch=2) as (url, _):
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
        request = dict(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=24, temperature=1.0,
                       seed=4, tools=[WEATHER], extra_body={"chat_template_kwargs": {"enable_thinking": True}},
                       logit_bias={str(model.tokenizer.hf.token_to_id("<|channel>")): 6.0,  # a thought, soon
                                   str(model.tokenizer.encode("\n")[0]): 5.0})
        whole = client.chat.completions.create(**request).choices[0].message
        content, reasoning = "", ""
        for chunk in client.chat.completions.create(stream=True, **request):
            delta = chunk.choices[0].delta
            content += delta.content or ""
            reasoning += getattr(delta, "reasoning_content", None) or ""
        assert (content, reasoning) == (whole.content or "", whole.reasoning_content)
        assert not any(m in content + reasoning for m in MARKERS) and reasoning
        with pytest.raises(openai.BadRequestError, match="tool_choice"):
            client.chat.completions.create(**{**request, "tool_choice": "required"})
