"""The server's OpenAPI 3.1 description (GET /openapi.json), written by hand after protocol.py:
the endpoints, the request bodies' fields with their types, the answers and the error bodies."""

from __future__ import annotations

from .anthropic_request import MAX_STOP_SEQUENCES, THINKING
from .protocol import MAX_STOP_STRINGS, REASONING_EFFORT, SPECULATIVE


def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(description: str, schema: dict) -> dict:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


ERRORS = {
    "400": "a malformed body, a field of the wrong type or out of range, or a prompt beyond the context",
    "401": "a missing or wrong API key (when the server has one: Authorization: Bearer KEY)",
    "404": "a model the server does not serve",
    "429": "the queue is full; retry later",
    "503": "the server is shutting down",
}

_NULLABLE_INT = {"type": ["integer", "null"], "minimum": 1}
_COMMON = {  # the fields both generation endpoints take (protocol.parse_request)
    "model": {"type": "string", "description": "the served model's name (GET /v1/models)"},
    "stream": {"type": "boolean", "default": False, "description": "answer as server-sent events"},
    "stream_options": {"type": "object", "properties": {"include_usage": {"type": ["boolean", "null"]}}},
    "max_tokens": {**_NULLABLE_INT, "description": "default: up to the end of the context"},
    "temperature": {"type": "number", "minimum": 0, "maximum": 2, "default": 1, "description": "0: greedy"},
    "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1, "default": 1},
    "seed": {"type": ["integer", "null"], "minimum": -2**63, "maximum": 2**63 - 1},
    "stop": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string", "minLength": 1},
                                            "maxItems": MAX_STOP_STRINGS}, {"type": "null"}]},
    "n": {"type": "integer", "enum": [1]},
    "presence_penalty": {"type": "number", "enum": [0]},
    "frequency_penalty": {"type": "number", "enum": [0]},
    "ignore_eos": {"type": "boolean", "default": False, "description": "generate max_tokens whatever comes"},
    "speculative": {"type": ["string", "null"], "enum": [*SPECULATIVE, None],
                    "description": "speculative decoding for this request (null: off; absent: the server's default)"},
    "response_format": {"oneOf": [
        {"type": "object", "required": ["type"], "properties": {"type": {"type": "string",
                                                                          "enum": ["text", "json_object"]}}},
        {"type": "object", "required": ["type", "json_schema"], "properties": {
            "type": {"type": "string", "enum": ["json_schema"]},
            "json_schema": {"type": "object", "required": ["name"], "properties": {
                "name": {"type": "string"}, "schema": {"type": "object"}, "strict": {"type": ["boolean", "null"]}}}}}],
        "description": "JSON output by constrained decoding (the schema's grammar masks the tokens)"},
    "logit_bias": {"type": ["object", "null"], "propertyNames": {"pattern": "^[0-9]+$"},
                   "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100},
                   "description": "token id -> added to its logit before sampling"},
}
_FUNCTION = {"type": "object", "required": ["name"], "properties": {
    "name": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"}, "description": {"type": "string"},
    "parameters": {"type": "object", "description": "a JSON Schema (default: no arguments)"}}}
_TOOL_CALL = {"type": "object", "required": ["id", "function"], "properties": {
    "id": {"type": "string"}, "type": {"type": "string", "enum": ["function"]},
    "function": {"type": "object", "required": ["name"], "properties": {
        "name": {"type": "string"}, "arguments": {"type": "string", "description": "a JSON object"}}}}}
_CHAT = {
    "messages": {"type": "array", "minItems": 1, "items": {
        "type": "object", "required": ["role"], "properties": {
            "role": {"type": "string", "enum": ["system", "developer", "user", "assistant", "tool"]},
            "content": {"oneOf": [{"type": "string"}, {"type": "array", "items": {
                "type": "object", "required": ["type", "text"],
                "properties": {"type": {"type": "string", "enum": ["text"]}, "text": {"type": "string"}}}},
                {"type": "null"}]},
            "tool_calls": {"type": "array", "minItems": 1, "items": _TOOL_CALL,
                           "description": "an assistant message's calls"},
            "tool_call_id": {"type": "string", "description": "a tool message: the call it answers"},
            "reasoning_content": {"type": ["string", "null"], "description": "an assistant message's reasoning"}}}},
    "reasoning_effort": {"type": ["string", "null"], "enum": [*REASONING_EFFORT, None],
                         "description": "passed to the chat template (GPT-OSS's system message)"},
    "chat_template_kwargs": {"type": ["object", "null"], "description": "the chat template's own variables"},
    "max_completion_tokens": _NULLABLE_INT,
    "logprobs": {"type": "boolean", "default": False},
    "top_logprobs": {"type": ["integer", "null"], "minimum": 0, "maximum": 20},
    "tools": {"type": "array", "items": {"type": "object", "required": ["type", "function"], "properties": {
        "type": {"type": "string", "enum": ["function"]}, "function": _FUNCTION}},
              "description": "functions the model may call, rendered by its chat template"},
    "tool_choice": {"oneOf": [{"type": "string", "enum": ["none", "auto", "required"]},
                              {"type": "object", "required": ["type", "function"], "properties": {
                                  "type": {"type": "string", "enum": ["function"]},
                                  "function": {"type": "object", "required": ["name"],
                                               "properties": {"name": {"type": "string"}}}}}],
                    "description": "required or a named function: the output is constrained to one call"},
    "parallel_tool_calls": {"type": "boolean"},
}
_PROMPT_TEXT = {"type": "string", "minLength": 1}
_PROMPT_IDS = {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}}
_COMPLETION = {
    "prompt": {"anyOf": [_PROMPT_TEXT, _PROMPT_IDS,
                         {"type": "array", "minItems": 1, "maxItems": 1, "items": {"anyOf": [_PROMPT_TEXT, _PROMPT_IDS]}}],
               "description": "one prompt: text or token ids (or a batch of one of them)"},
    "logprobs": {"type": ["integer", "null"], "minimum": 0, "maximum": 5},
    "echo": {"type": "boolean", "enum": [False]},
    "suffix": {"type": ["string", "null"]},
}
SCHEMAS = {
    "ChatCompletionRequest": {"type": "object", "required": ["model", "messages"], "properties": {**_COMMON, **_CHAT},
                              # top_logprobs only with logprobs: true
                              "if": {"required": ["top_logprobs"], "properties": {"top_logprobs": {"type": "integer"}}},
                              "then": {"required": ["logprobs"], "properties": {"logprobs": {"const": True}}}},
    "CompletionRequest": {"type": "object", "required": ["model", "prompt"], "properties": {**_COMMON, **_COMPLETION}},
    "Error": {"type": "object", "required": ["error"], "properties": {"error": {
        "type": "object", "required": ["message", "type"], "properties": {
            "message": {"type": "string"}, "type": {"type": "string"},
            "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}}},
}

_TEXT_BLOCK = {"type": "object", "required": ["type", "text"], "properties": {
    "type": {"type": "string", "enum": ["text"]}, "text": {"type": "string"}}}
_BLOCK = {"oneOf": [  # Anthropic's content blocks this server reads (images and documents: 400)
    _TEXT_BLOCK,
    {"type": "object", "required": ["type", "id", "name", "input"], "properties": {
        "type": {"type": "string", "enum": ["tool_use"]}, "id": {"type": "string", "minLength": 1},
        "name": {"type": "string"}, "input": {"type": "object"}}},
    {"type": "object", "required": ["type", "tool_use_id"], "properties": {
        "type": {"type": "string", "enum": ["tool_result"]}, "tool_use_id": {"type": "string", "minLength": 1},
        "content": {"oneOf": [{"type": "string"}, {"type": "array", "items": _TEXT_BLOCK}]},
        "is_error": {"type": "boolean"}}},
    {"type": "object", "required": ["type", "thinking"], "properties": {
        "type": {"type": "string", "enum": ["thinking"]}, "thinking": {"type": "string"},
        "signature": {"type": "string"}}},
    {"type": "object", "required": ["type"], "properties": {
        "type": {"type": "string", "enum": ["redacted_thinking"]}}}]}
_MESSAGES = {  # anthropic_request.translate
    "model": _COMMON["model"],
    "max_tokens": {"type": "integer", "minimum": 1},
    "messages": {"type": "array", "minItems": 1, "items": {
        "type": "object", "required": ["role", "content"], "properties": {
            "role": {"type": "string", "enum": ["user", "assistant"]},
            "content": {"oneOf": [{"type": "string"}, {"type": "array", "minItems": 1, "items": _BLOCK}]}}},
        "description": "user and assistant turns, the last the user's"},
    "system": {"oneOf": [{"type": "string"}, {"type": "array", "items": _TEXT_BLOCK}]},
    "stop_sequences": {"type": "array", "maxItems": MAX_STOP_SEQUENCES, "items": {"type": "string", "minLength": 1}},
    "stream": _COMMON["stream"],
    "temperature": {"type": "number", "minimum": 0, "maximum": 1, "default": 1},
    "top_p": _COMMON["top_p"],
    "top_k": {"type": "integer", "minimum": 0, "description": "0: off"},
    "tools": {"type": "array", "items": {"type": "object", "required": ["name", "input_schema"], "properties": {
        "name": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"}, "description": {"type": "string"},
        "input_schema": {"type": "object", "required": ["type"], "properties": {"type": {"const": "object"}}}}}},
    "tool_choice": {"type": "object", "required": ["type"], "properties": {
        "type": {"type": "string", "enum": ["auto", "any", "tool", "none"]}, "name": {"type": "string"},
        "disable_parallel_tool_use": {"type": "boolean"}},
        "if": {"properties": {"type": {"const": "tool"}}}, "then": {"required": ["type", "name"]},
        "description": "any or a named tool: the output is constrained to one call"},
    "metadata": {"type": "object", "description": "ignored"},
    "output_config": {"type": "object", "properties": {"format": {
        "type": "object", "required": ["type", "schema"], "properties": {
            "type": {"type": "string", "enum": ["json_schema"]}, "schema": {"type": "object"}}}},
        "description": "format: the answer is JSON under the schema (constrained decoding); effort is ignored"},
    "thinking": {"type": "object", "required": ["type"], "properties": {
        "type": {"type": "string", "enum": list(THINKING)}, "budget_tokens": {"type": "integer", "minimum": 0}},
        "description": "disabled: a reasoning model's reasoning is not returned"},
}
SCHEMAS["MessagesRequest"] = {"type": "object", "required": ["model", "max_tokens", "messages"],
                              "properties": _MESSAGES}
SCHEMAS["CountTokensRequest"] = {"type": "object", "required": ["model", "messages"],
                                 "properties": {k: v for k, v in _MESSAGES.items() if k != "max_tokens"}}
SCHEMAS["AnthropicError"] = {"type": "object", "required": ["type", "error"], "properties": {
    "type": {"const": "error"}, "error": {"type": "object", "required": ["type", "message"], "properties": {
        "type": {"type": "string"}, "message": {"type": "string"}}}}}
EVENTS = ("message_start", "ping", "content_block_start", "content_block_delta", "content_block_stop", "message_delta",
          "message_stop", "error")
_ANTHROPIC_EVENT = {"type": "object", "required": ["event", "data"], "properties": {
    "event": {"type": "string", "enum": list(EVENTS)},
    "data": {"type": "string", "contentMediaType": "application/json",
             "contentSchema": {"type": "object", "required": ["type"], "properties": {"type": {"enum": list(EVENTS)}}}}},
    "description": "an event: its name, and its data (a JSON object whose type is the name)"}

_EVENT = {"anyOf": [{"type": "object"}, {"const": "[DONE]"}], "description": "an event's data: a chunk, or [DONE]"}


def _generation(summary: str, request: str, answer: str, statuses: tuple) -> dict:
    return {"post": {
        "summary": summary,
        "requestBody": {"required": True, "content": {"application/json": {"schema": _ref(request)}}},
        "responses": {"200": {"description": f"{answer}; with stream: true, server-sent events of its chunks "
                                             "ending with `data: [DONE]`",
                              "content": {"application/json": {"schema": {"type": "object"}},
                                          "text/event-stream": {"schema": _EVENT}}},
                      **{s: _json(ERRORS[s], _ref("Error")) for s in statuses}}}}


def _messages(summary: str, request: str, answer: str, streams: bool) -> dict:
    """An Anthropic Messages operation: its errors in Anthropic's shape."""
    content = {"application/json": {"schema": {"type": "object"}},
               **({"text/event-stream": {"schema": _ANTHROPIC_EVENT}} if streams else {})}
    return {"post": {
        "summary": summary,
        "requestBody": {"required": True, "content": {"application/json": {"schema": _ref(request)}}},
        "responses": {"200": {"description": answer, "content": content},
                      **{s: _json(ERRORS[s], _ref("AnthropicError")) for s in ("400", "401", "404", "429", "503")
                         if streams or s not in ("429", "503")}}}}


def _get(summary: str, answer: dict, auth: bool = True) -> dict:
    responses = {"200": answer, **({"401": _json(ERRORS["401"], _ref("Error"))} if auth else {})}
    return {"get": {"summary": summary, "responses": responses}}


def _or_null(schema: dict) -> dict:
    """``schema`` or null (protocol.py takes a null optional field as absent, as OpenAI does)."""
    if "null" in schema.get("type", ()) or {"type": "null"} in schema.get("oneOf", ()):
        return schema
    return {"anyOf": [schema, {"type": "null"}]}


def _served(request: dict, model_name: str) -> dict:
    """A request's schema whose ``model`` is the one served (another gets 404) and whose optional
    fields may be null."""
    fields = {name: field if name in request["required"] else _or_null(field)
              for name, field in request["properties"].items()}
    return {**request, "properties": {**fields, "model": {**fields["model"], "enum": [model_name]}}}


def document(model_name: str) -> dict:
    """The OpenAPI document of a server of ``model_name``."""
    return {
        "openapi": "3.1.0",
        "info": {"title": "qlinear-llm serve", "version": "1", "description": f"An OpenAI-compatible API (and "
                                                                               f"Anthropic's Messages) serving "
                                                                               f"'{model_name}'."},
        "paths": {
            "/v1/chat/completions": _generation("A chat completion (the model's chat template)",
                                                "ChatCompletionRequest", "a chat.completion",
                                                ("400", "401", "404", "429", "503")),
            "/v1/completions": _generation("A text completion", "CompletionRequest", "a text_completion",
                                           ("400", "401", "404", "429", "503")),
            "/v1/messages": _messages("Anthropic's Messages API (the model's chat template)", "MessagesRequest",
                                      "a message; with stream: true, Anthropic's server-sent events", True),
            "/v1/messages/count_tokens": _messages("The prompt's token count of a Messages request",
                                                   "CountTokensRequest", "{\"input_tokens\": N}", False),
            "/v1/models": _get("The served model", _json("a list of one model", {"type": "object"})),
            "/health": _get("The server's state: running and waiting requests, decode figures",
                            _json("status ok and the scheduler's figures", {"type": "object"}), auth=False),
            "/metrics": _get("Prometheus metrics", {"description": "the Prometheus text format", "content": {
                "text/plain": {"schema": {"type": "string"}}}}),
            "/openapi.json": _get("This document", _json("an OpenAPI 3.1 document", {"type": "object"})),
        },
        "components": {"schemas": {**SCHEMAS, **{name: _served(SCHEMAS[name], model_name) for name in (
            "ChatCompletionRequest", "CompletionRequest", "MessagesRequest", "CountTokensRequest")}}},
    }
