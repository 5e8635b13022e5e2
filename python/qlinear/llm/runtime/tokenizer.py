"""Tokenizer: Hugging Face ``tokenizers`` for the text, the model's own chat template (jinja2)
for conversations, and incremental decoding for streaming."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Optional, Sequence, Union

Messages = Sequence[dict]


class Tokenizer:
    def __init__(self, tokenizer, chat_template: Optional[str] = None,
                 stop_tokens: Iterable[str] = (), bos_token: Optional[str] = None):
        self.hf = tokenizer
        self.chat_template = chat_template
        self.bos_token = bos_token
        self.stop_ids = {i for i in (tokenizer.token_to_id(t) for t in stop_tokens) if i is not None}
        self._template = None

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
                            tools: Optional[list] = None) -> str:
        """The template's text of ``messages``; ``tools``: function definitions (OpenAI's shape) the
        template renders, as transformers passes them."""
        if not self.chat_template:
            raise ValueError("this tokenizer has no chat template; pass a prompt string instead")
        for m in messages:
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise TypeError("messages must be dicts with str 'role' and 'content'")
        if self._template is None:
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = _raise
            env.filters["tojson"] = _tojson  # transformers' (jinja2's own escapes <, > and &)
            self._template = env.from_string(self.chat_template)
        return self._template.render(messages=list(messages), add_generation_prompt=add_generation_prompt,
                                     bos_token=self.bos_token or "", eos_token="", tools=tools)

    def prompt_ids(self, prompt: Union[str, Messages], tools: Optional[list] = None) -> list[int]:
        """A plain prompt is encoded as it is; a list of messages goes through the chat template."""
        if isinstance(prompt, str):
            return self.encode(prompt)
        if isinstance(prompt, (list, tuple)):
            return self.encode(self.apply_chat_template(prompt, tools=tools))
        raise TypeError(f"prompt must be a str or a list of messages, got {type(prompt).__name__}")


class StreamDecoder:
    """Turns a growing list of token ids into text pieces, holding back incomplete UTF-8. Each
    push decodes a window only (the tokens of the last piece and those after it: the text before
    them is complete), so a piece costs the same at any length of the text."""

    def __init__(self, tokenizer: Tokenizer):
        self.tok = tokenizer
        self.ids: list[int] = []
        self.start = 0  # the window: ids[start:]; ids[start:done] made the last piece
        self.done = 0

    def _new_text(self) -> tuple:
        seen = self.tok.decode(self.ids[self.start:self.done])
        text = self.tok.decode(self.ids[self.start:])
        return text[len(seen):], len(text) > len(seen)

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        piece, grew = self._new_text()
        if not grew or piece.endswith("\ufffd"):  # a multi-byte character is not complete yet
            return ""
        self.start, self.done = self.done, len(self.ids)
        return piece

    def flush(self) -> str:
        """The text held back (an incomplete character, as decode renders it), at the end."""
        piece, _ = self._new_text()
        self.start, self.done = self.done, len(self.ids)
        return piece


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
