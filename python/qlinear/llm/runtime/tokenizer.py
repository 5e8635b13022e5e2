"""Tokenizer: Hugging Face ``tokenizers`` for the text, the model's own chat template (jinja2)
for conversations, and incremental decoding for streaming."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Iterable, Optional, Sequence, Union

from .gemma4_reply import Gemma4Replies
from .harmony import Harmony
from .stream_decoder import StreamDecoder  # noqa: F401  (tokenizer.StreamDecoder)

Messages = Sequence[dict]


class Tokenizer:
    def __init__(self, tokenizer, chat_template: Optional[str] = None,
                 stop_tokens: Iterable[str] = (), bos_token: Optional[str] = None):
        self.hf = tokenizer
        self.chat_template = chat_template
        self.bos_token = bos_token
        # a template whose replies carry reasoning and calls in markers (GPT-OSS's harmony, Gemma
        # 4's), and the tokens for them: replies are read by those (None: as plain text)
        self.replies = Harmony.of(tokenizer, chat_template) or Gemma4Replies.of(tokenizer, chat_template)
        self.stop_ids = {i for i in (tokenizer.token_to_id(t) for t in stop_tokens) if i is not None}
        self._template = None

    @property
    def stop_ids(self) -> set:
        """The ids that end a reply (for harmony: <|call|> and <|return|>, not <|end|>, which
        closes one message of the reply; for Gemma 4 also <|tool_response>)."""
        return self._stop_ids if self.replies is None else self.replies.stop_ids(self._stop_ids)

    @stop_ids.setter
    def stop_ids(self, ids) -> None:
        self._stop_ids = set(ids)

    @classmethod
    def from_dir(cls, directory, extra_stop_ids: Iterable[int] = ()) -> "Tokenizer":
        """``tokenizer.json`` (+ ``tokenizer_config.json`` for the chat template and special tokens)."""
        from tokenizers import Tokenizer as HFTokenizer

        d = Path(directory)
        path = d / "tokenizer.json"
        if not path.is_file():
            raise ValueError(f"{d}: no tokenizer.json")
        try:
            hf = HFTokenizer.from_file(str(path))
        except Exception as e:  # tokenizers raises its own exception type
            raise ValueError(f"{path}: not a valid tokenizer file ({e})") from None
        cfg = {}
        if (d / "tokenizer_config.json").is_file():
            try:
                cfg = json.loads((d / "tokenizer_config.json").read_text())
            except json.JSONDecodeError as e:
                raise ValueError(f"{d / 'tokenizer_config.json'}: not JSON ({e})") from None
        tok = cls(hf, chat_template=_template_text(cfg.get("chat_template")),
                  stop_tokens=[t for t in (_token_text(cfg.get("eos_token")),
                                           "<|im_end|>", "<|endoftext|>", "<|eot_id|>",
                                           "<end_of_turn>", "<|end|>") if t],
                  bos_token=_token_text(cfg.get("bos_token")))
        tok.stop_ids |= set(extra_stop_ids)
        return tok

    @property
    def vocab_size(self) -> int:
        return self.hf.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self.hf.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=True)

    def apply_chat_template(self, messages: Messages, add_generation_prompt: bool = True,
                            tools: Optional[list] = None, **variables) -> str:
        """The template's text of ``messages``; ``tools``: function definitions (OpenAI's shape) the
        template renders, as transformers passes them; ``variables``: the template's own (GPT-OSS's
        ``reasoning_effort``, Qwen3's ``enable_thinking``, ...)."""
        if not self.chat_template:
            raise ValueError("this tokenizer has no chat template; pass a prompt string instead")
        for m in messages:
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise TypeError("messages must be dicts with str 'role' and 'content'")
        if self._template is None:
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = _raise
            env.globals["strftime_now"] = lambda fmt: time.strftime(fmt)  # transformers' (GPT-OSS's date line)
            env.filters["tojson"] = _tojson  # transformers' (jinja2's own escapes <, > and &)
            self._template = env.from_string(self.chat_template)
        from jinja2 import TemplateError

        try:
            return self._template.render(**variables, messages=list(messages), add_generation_prompt=add_generation_prompt,
                                         bos_token=self.bos_token or "", eos_token="", tools=tools)
        except TemplateError as e:  # e.g. a variable of the wrong kind for the template
            raise ValueError(f"chat template: {e}") from None

    def prompt_ids(self, prompt: Union[str, Messages], tools: Optional[list] = None, **variables) -> list[int]:
        """A plain prompt is encoded as it is; a list of messages goes through the chat template."""
        if isinstance(prompt, str):
            return self.encode(prompt)
        if isinstance(prompt, (list, tuple)):
            return self.encode(self.apply_chat_template(prompt, tools=tools, **variables))
        raise TypeError(f"prompt must be a str or a list of messages, got {type(prompt).__name__}")


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise(message):
    raise ValueError(f"chat template: {message}")


def _token_text(t):
    if isinstance(t, dict):  # {"content": "...", ...} in some tokenizer configs
        t = t.get("content")
    return t if isinstance(t, str) else None


def _template_text(t):
    if isinstance(t, list):  # named templates: take the default one
        t = next((x.get("template") for x in t if x.get("name") == "default"), None)
    return t if isinstance(t, str) else None
