"""``tokenizer.mtok``, MNN's binary tokenizer (type 4, "pipeline": a binary form of
tokenizer.json), and the text header it shares with ``tokenizer.txt``."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np


class _Reader:
    def __init__(self, data: bytes, path: Path, pos: int = 0):
        self.data, self.path, self.pos = data, path, pos

    def take(self, n: int, what: str) -> bytes:
        if self.pos + n > len(self.data):
            raise ValueError(f"{self.path}: truncated ({what} at byte {self.pos})")
        b = self.data[self.pos:self.pos + n]
        self.pos += n
        return b

    def u8(self, what="a byte"):
        return self.take(1, what)[0]

    def u16(self, what="a length"):
        return struct.unpack("<H", self.take(2, what))[0]

    def u32(self, what="a count"):
        return struct.unpack("<I", self.take(4, what))[0]

    def str(self, what="a string"):
        return self.take(self.u16(what), what).decode("utf-8", errors="surrogateescape")

    def table(self, what="a normalization table"):
        n = self.u32(what)
        entries = {}
        for _ in range(n):
            cp = self.u32(what)
            entries[cp] = self.take(self.u16(what), what)
        return entries


def _mtok_normalizer(r: _Reader):
    t = r.u8("normalizer type")
    if t == 0:
        return None
    if t == 2:
        return {"type": "Prepend", "prepend": r.str()}
    if t == 3:
        pattern, content = r.str(), r.str()
        return {"type": "Replace", "pattern": {"String": pattern}, "content": content}
    if t == 4:
        return {"type": "Sequence", "normalizers": [_mtok_normalizer(r) for _ in range(r.u32())]}
    if t in (5, 7):
        clean, chinese, strip, lower = r.take(4, "normalizer flags")
        if t == 7:
            r.table()
        if (clean, chinese, strip, lower) == (0, 0, 0, 1):
            return {"type": "Lowercase"}
        if (clean, chinese, strip, lower) == (0, 0, 1, 0):
            return {"type": "Sequence", "normalizers": [{"type": "NFD"}, {"type": "StripAccents"}]}
        return {"type": "BertNormalizer", "clean_text": bool(clean), "handle_chinese_chars": bool(chinese),
                "strip_accents": bool(strip), "lowercase": bool(lower)}
    if t == 6:
        table = r.table()
        # NFKC's table maps U+FB01 (the "fi" ligature); NFC's does not.
        return {"type": "NFKC" if 0xFB01 in table else "NFC"}
    if t == 8:
        left, right = r.take(2, "strip flags")
        return {"type": "Strip", "strip_left": bool(left), "strip_right": bool(right)}
    raise ValueError(f"{r.path}: unknown normalizer type {t} at byte {r.pos - 1}")


_SPLIT_BEHAVIOR = {0: "Isolated", 1: "Removed", 2: "MergedWithPrevious"}


def _metaspace(r: _Reader) -> dict:
    """A Metaspace pre-tokenizer or decoder: replacement string, prepend flag."""
    rep = r.str()
    return {"type": "Metaspace", "replacement": rep,
            "prepend_scheme": "always" if r.u8() else "never", "split": True}


def _mtok_pre_tokenizer(r: _Reader):
    t = r.u8("pre-tokenizer type")
    if t == 0:
        return None
    if t == 1:
        return {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                "use_regex": bool(r.u8())}
    if t == 2:
        return {"type": "Digits", "individual_digits": bool(r.u8())}
    if t == 3:
        return _metaspace(r)
    if t == 4:
        pattern = r.str()
        invert, behavior = r.take(2, "split flags")
        if behavior not in _SPLIT_BEHAVIOR:
            raise ValueError(f"{r.path}: unknown split behavior {behavior}")
        return {"type": "Split", "pattern": {"Regex": pattern},
                "behavior": _SPLIT_BEHAVIOR[behavior], "invert": bool(invert)}
    if t == 5:
        return {"type": "BertPreTokenizer"}
    if t == 6:
        return {"type": "Sequence", "pretokenizers": [_mtok_pre_tokenizer(r) for _ in range(r.u32())]}
    raise ValueError(f"{r.path}: unknown pre-tokenizer type {t} at byte {r.pos - 1}")


def _mtok_decoder(r: _Reader):
    t = r.u8("decoder type")
    if t == 0:
        return {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    if t == 1:
        return {"type": "ByteFallback"}
    if t == 2:
        return _metaspace(r)
    if t == 3:
        prefix = r.str()
        return {"type": "WordPiece", "prefix": prefix, "cleanup": bool(r.u8())}
    if t == 4:
        return {"type": "Fuse"}
    if t == 5:
        pattern, content = r.str(), r.str()
        return {"type": "Replace", "pattern": {"String": pattern}, "content": content}
    if t == 6:
        content = r.str()
        start, stop = struct.unpack("<II", r.take(8, "strip decoder"))
        return {"type": "Strip", "content": content, "start": start, "stop": stop}
    if t == 7:
        return {"type": "Sequence", "decoders": [_mtok_decoder(r) for _ in range(r.u32())]}
    raise ValueError(f"{r.path}: unknown decoder type {t} at byte {r.pos - 1}")


def read_header_lines(data: bytes, path: Path):
    """The text header shared by tokenizer.mtok and tokenizer.txt: magic + type, the counts of
    special / stop / prefix ids, then those ids. Returns (type, special, stop, prefix, pos)."""
    lines, pos = [], 0
    for _ in range(3):
        end = data.find(b"\n", pos)
        if end < 0:
            raise ValueError(f"{path}: truncated header")
        lines.append(data[pos:end].decode("ascii", errors="replace").split())
        pos = end + 1
    try:
        magic, ttype = (int(x) for x in lines[0][:2])
        n_special, n_stop, n_prefix = (int(x) for x in lines[1][:3])
        ids = [int(x) for x in lines[2]]
    except ValueError:
        raise ValueError(f"{path}: malformed header") from None
    if magic != 430:
        raise ValueError(f"{path}: not an MNN tokenizer (magic {magic}, expected 430)")
    if len(ids) != n_special + n_stop + n_prefix:
        raise ValueError(f"{path}: header lists {len(ids)} ids, expected {n_special + n_stop + n_prefix}")
    special = ids[:n_special]
    stop = ids[n_special:n_special + n_stop]
    prefix = ids[n_special + n_stop:]
    return ttype, special, stop, prefix, pos


def read_mtok(path: Path):
    """tokenizer.mtok (type 4, "pipeline"): a binary form of tokenizer.json. Returns
    (tokenizer.json dict, stop ids, chat template, eos token, bos token)."""
    data = path.read_bytes()
    ttype, special, stop, prefix, pos = read_header_lines(data, path)
    if ttype != 4:
        raise ValueError(f"{path}: tokenizer type {ttype}, expected 4 (pipeline)")
    r = _Reader(data, path, pos)
    normalizer = _mtok_normalizer(r)
    pre_tokenizer = _mtok_pre_tokenizer(r)
    mtype = r.u8("model type")
    if mtype != 0:
        kinds = {1: "WordPiece", 2: "Unigram"}
        raise ValueError(f"{path}: {kinds.get(mtype, f'type {mtype}')} tokenizer models are not "
                         "supported (BPE only)")
    vocab_size = r.u32("vocabulary size")
    byte_fallback, byte_level = r.take(2, "BPE flags")
    n_merges = r.u32("merge count")
    vocab = {}
    for _ in range(vocab_size):
        tok = r.str("a vocabulary entry")
        vocab[tok] = r.u32("a token id")
    id_to_tok = {i: t for t, i in vocab.items()}
    merges = []
    raw = r.take(12 * n_merges, "the merges")
    triples = np.frombuffer(raw, dtype="<u4").reshape(-1, 3)
    for a, b, rank in sorted(triples.tolist(), key=lambda x: x[2]):
        if a not in id_to_tok or b not in id_to_tok:
            raise ValueError(f"{path}: merge of unknown token ids ({a}, {b})")
        merges.append([id_to_tok[a], id_to_tok[b]])
    decoder = _mtok_decoder(r)
    added = []
    for _ in range(r.u32("added token count")):
        aid = r.u32("an added token id")
        sp, lstrip, rstrip = r.take(3, "added token flags")
        content = r.str("an added token")
        added.append({"id": aid, "content": content, "single_word": False, "lstrip": bool(lstrip),
                      "rstrip": bool(rstrip), "normalized": not sp, "special": bool(sp)})
    template = r.take(r.u32("chat template length"), "chat template").decode("utf-8", errors="replace")
    eos = r.str("eos token")
    r.u8("flags")
    bos = r.str("bos token") if r.pos < len(data) else ""
    if byte_level and not _has_type(pre_tokenizer, "ByteLevel"):
        bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
        pre_tokenizer = bl if pre_tokenizer is None else {"type": "Sequence",
                                                         "pretokenizers": [pre_tokenizer, bl]}
    tj = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": normalizer, "pre_tokenizer": pre_tokenizer,
        "post_processor": prefix_processor(prefix, id_to_tok),
        "decoder": decoder,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": bool(byte_fallback),
                  "ignore_merges": False, "vocab": vocab, "merges": merges},
    }
    return tj, stop, template or None, eos or None, bos or None


def _has_type(node, name) -> bool:
    if node is None:
        return False
    if node.get("type") == name:
        return True
    return any(_has_type(p, name) for p in node.get("pretokenizers", []))


def prefix_processor(prefix, id_to_tok):
    if not prefix:
        return None
    names = [id_to_tok.get(i, f"<prefix_{i}>") for i in prefix]
    single = [{"SpecialToken": {"id": n, "type_id": 0}} for n in names] + [{"Sequence": {"id": "A", "type_id": 0}}]
    pair = single + [{"Sequence": {"id": "B", "type_id": 1}}]
    return {"type": "TemplateProcessing", "single": single, "pair": pair,
            "special_tokens": {n: {"id": n, "ids": [i], "tokens": [n]} for n, i in zip(names, prefix)}}
