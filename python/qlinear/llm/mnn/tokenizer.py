"""The tokenizer of an export as a ``tokenizers.Tokenizer``: ``tokenizer.json`` when present,
else ``tokenizer.mtok`` (see ``mtok``) or ``tokenizer.txt`` (type 3, "huggingface") converted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from .jsonfile import load_json
from .mtok import prefix_processor, read_header_lines, read_mtok


def _read_tokenizer_txt(path: Path):
    """tokenizer.txt of type 3 ("huggingface": vocab lines, then merges lines) -> tokenizer.json
    dict. The other text types (sentencepiece, tiktoken, bert) are refused."""
    data = path.read_bytes()
    ttype, special, stop, prefix, pos = read_header_lines(data, path)
    names = {0: "sentencepiece", 1: "tiktoken", 2: "bert", 3: "huggingface"}
    if ttype != 3:
        raise ValueError(f"{path}: MNN tokenizer type {ttype} ({names.get(ttype, 'unknown')}) is not "
                         "supported; put the model's tokenizer.json next to the export")
    lines = data[pos:].decode("utf-8", errors="surrogateescape").split("\n")
    try:
        n_vocab, n_merges = (int(x) for x in lines[0].split()[:2])
    except ValueError:
        raise ValueError(f"{path}: malformed vocabulary header") from None
    if len(lines) < 1 + n_vocab + n_merges:
        raise ValueError(f"{path}: truncated: {n_vocab} tokens and {n_merges} merges announced")
    vocab_list = lines[1:1 + n_vocab]
    vocab = {t: i for i, t in enumerate(vocab_list)}
    merges = []
    for line in lines[1 + n_vocab:1 + n_vocab + n_merges]:
        if line.startswith("#version") or not line.strip():
            continue
        parts = line.split(" ")
        if len(parts) != 2:
            raise ValueError(f"{path}: malformed merge line {line!r}")
        merges.append(parts)
    added = [{"id": i, "content": vocab_list[i], "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i in special if 0 <= i < n_vocab]
    bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    tj = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
          "normalizer": None, "pre_tokenizer": bl, "post_processor": prefix_processor(prefix, dict(enumerate(vocab_list))),
          "decoder": dict(bl),
          "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                    "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                    "ignore_merges": False, "vocab": vocab, "merges": merges}}
    return tj, stop, None, None, None


def read_tokenizer(export_dir, tokenizer_file: Optional[str] = None):
    """The export's tokenizer as ``(tokenizers.Tokenizer, stop ids, chat template, eos, bos)``.

    A ``tokenizer.json`` in the directory is used as is; otherwise ``tokenizer.mtok`` (or the file
    that config.json names) is converted into one."""
    from tokenizers import Tokenizer

    d = Path(export_dir)
    candidates = [tokenizer_file] if tokenizer_file else []
    candidates += ["tokenizer.mtok", "tokenizer.txt"]
    mnn_tok = next((d / c for c in candidates if c and (d / c).is_file()), None)
    stop, template, eos, bos = [], None, None, None
    if mnn_tok is not None:
        reader = read_mtok if mnn_tok.read_bytes()[:6].split()[1:2] == [b"4"] else _read_tokenizer_txt
        tj, stop, template, eos, bos = reader(mnn_tok)
    if (d / "tokenizer.json").is_file():
        try:
            tok = Tokenizer.from_file(str(d / "tokenizer.json"))
        except Exception as e:
            raise ValueError(f"{d / 'tokenizer.json'}: unreadable: {e}") from None
        cfg = d / "tokenizer_config.json"
        if cfg.is_file():
            tc = load_json(cfg, "tokenizer settings")
            template = template or tc.get("chat_template")
            eos = eos or _token_str(tc.get("eos_token"))
            bos = bos or _token_str(tc.get("bos_token"))
        if not stop and eos is not None and tok.token_to_id(eos) is not None:
            stop = [tok.token_to_id(eos)]
        return tok, stop, template, eos, bos
    if mnn_tok is None:
        raise ValueError(f"{d}: no tokenizer (tokenizer.mtok, tokenizer.txt or tokenizer.json)")
    try:
        tok = Tokenizer.from_str(json.dumps(tj))
    except Exception as e:
        raise ValueError(f"{mnn_tok}: could not be turned into a tokenizer: {e}") from None
    return tok, stop, template, eos, bos


def _token_str(t):
    if isinstance(t, dict):
        return t.get("content")
    return t or None
