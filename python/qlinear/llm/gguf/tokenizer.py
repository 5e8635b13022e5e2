"""A GGUF file's tokenizer (``tokenizer.ggml.*`` metadata) rebuilt as a Hugging Face ``tokenizers``
tokenizer: byte-level BPE ("gpt2": vocab + merges, the pre-tokenizer named by
``tokenizer.ggml.pre``) or SentencePiece BPE ("llama": pieces and scores, merges derived from the
scores as transformers' converter does, byte fallback); control / user-defined tokens as added
tokens; the chat template."""

from __future__ import annotations

from ..runtime.tokenizer import Tokenizer

# llama.cpp's pre-tokenizer names -> the split pattern (None: GPT-2's own byte-level regex).
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_TOKENIZERS = {"qwen2": _QWEN2, "llama-bpe": _LLAMA3, "llama3": _LLAMA3, "smaug-bpe": _LLAMA3,
                  "gpt-2": None, "gpt2": None, "default": None}
NORMAL, UNKNOWN, CONTROL, USER_DEFINED = 1, 2, 3, 4      # tokenizer.ggml.token_type values


def read_tokenizer(f) -> tuple[Tokenizer, dict]:
    """(our Tokenizer, info for model.info) from a ``GGUFFile``."""
    from tokenizers import AddedToken  # noqa: PLC0415

    kind = f.meta("tokenizer.ggml.model", str, required=True)
    if kind not in ("gpt2", "llama", "gemma4"):
        raise f.error(f"tokenizer model {kind!r} is not supported (byte-level BPE 'gpt2', SentencePiece 'llama', "
                      "Gemma 4's 'gemma4')")
    tokens = f.meta("tokenizer.ggml.tokens", list, required=True)
    types = f.meta("tokenizer.ggml.token_type", list, default=[NORMAL] * len(tokens))
    if not all(isinstance(t, str) for t in tokens):
        raise f.error("tokenizer.ggml.tokens must be strings")
    if len(types) != len(tokens) or not all(isinstance(t, int) for t in types):
        raise f.error("tokenizer.ggml.token_type must hold one int per token")
    vocab = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)
    pre = f.meta("tokenizer.ggml.pre", str, default="default")
    try:
        hf = (_sentencepiece(f, tokens, types, vocab) if kind == "llama" else _spm_bpe(f, vocab) if kind == "gemma4"
              else _byte_level(f, vocab, pre))
        hf.add_tokens([AddedToken(tokens[i], special=types[i] == CONTROL, normalized=False)
                       for i in range(len(tokens)) if types[i] in (CONTROL, USER_DEFINED)])
    except ValueError:
        raise
    except Exception as e:  # tokenizers raises its own exception type
        raise f.error(f"tokenizer cannot be built ({e})") from None

    def text(key):
        i = f.meta(key, int)
        return tokens[i] if i is not None and 0 <= i < len(tokens) else None

    stops = [t for t in (text("tokenizer.ggml.eos_token_id"), text("tokenizer.ggml.eot_token_id"),
                         "<|im_end|>", "<|endoftext|>", "<|eot_id|>") if t]
    tok = Tokenizer(hf, chat_template=f.meta("tokenizer.chat_template", str), stop_tokens=stops,
                    bos_token=text("tokenizer.ggml.bos_token_id"))
    if kind == "llama":
        info = {"tokenizer": "SentencePiece BPE (merges from the scores, byte fallback)"}
    elif kind == "gemma4":
        info = {"tokenizer": "Gemma 4 BPE (spaces as U+2581, merges over raw UTF-8, byte fallback)"}
    else:
        info = {"tokenizer": f"gpt2 BPE, pre-tokenizer {pre!r}" +
                ("" if pre in PRE_TOKENIZERS else " (unknown: GPT-2's rules used)")}
    return tok, info


def _byte_level(f, vocab: dict, pre: str):
    from tokenizers import Regex, decoders, models, pre_tokenizers  # noqa: PLC0415
    from tokenizers import Tokenizer as HFTokenizer  # noqa: PLC0415

    pattern = PRE_TOKENIZERS.get(pre)
    hf = HFTokenizer(models.BPE(vocab, _merges(f), ignore_merges=pattern is _LLAMA3))
    if pattern is None:
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        hf.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    hf.decoder = decoders.ByteLevel()
    return hf


def _merges(f) -> list:
    merges = f.meta("tokenizer.ggml.merges", list, required=True)
    if not all(isinstance(m, str) and " " in m for m in merges):
        raise f.error("tokenizer.ggml.merges must be strings 'a b'")
    return [tuple(m.split(" ", 1)) for m in merges]


def _spm_bpe(f, vocab: dict):
    """Gemma 4's BPE, as llama.cpp runs it: spaces as U+2581 (none prepended), the text split at
    newlines only, the merges over raw UTF-8, bytes outside the vocabulary as <0xXX> pieces."""
    from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers  # noqa: PLC0415
    from tokenizers import Tokenizer as HFTokenizer  # noqa: PLC0415

    hf = HFTokenizer(models.BPE(vocab, _merges(f), byte_fallback=True))
    hf.normalizer = normalizers.Replace(" ", "\u2581")
    hf.pre_tokenizer = pre_tokenizers.Split(Regex("[^\n]+|[\n]+"), behavior="isolated")
    hf.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    return hf


def _sentencepiece(f, tokens: list, types: list, vocab: dict):
    """SentencePiece BPE as transformers' LlamaTokenizerFast builds it: merges ordered by the
    merged piece's score, spaces as U+2581 with one prepended, bytes outside the vocabulary as
    <0xXX> pieces."""
    from tokenizers import decoders, models, normalizers  # noqa: PLC0415
    from tokenizers import Tokenizer as HFTokenizer  # noqa: PLC0415

    scores = f.meta("tokenizer.ggml.scores", list, required=True)
    if len(scores) != len(tokens) or not all(isinstance(x, (int, float)) for x in scores):
        raise f.error("tokenizer.ggml.scores must hold one number per token")
    pieces = {t: i for t, i in vocab.items() if types[i] in (NORMAL, USER_DEFINED)}
    merges = []
    for merged in sorted(pieces, key=lambda t: -scores[pieces[t]]):
        local = [(merged[:j], merged[j:]) for j in range(1, len(merged))
                 if merged[:j] in pieces and merged[j:] in pieces]
        merges += sorted(local, key=lambda p: (vocab[p[0]], vocab[p[1]]))
    unk = next((tokens[i] for i, t in enumerate(types) if t == UNKNOWN), None)
    hf = HFTokenizer(models.BPE(vocab, merges, unk_token=unk, fuse_unk=True, byte_fallback=True))
    hf.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    hf.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                    decoders.Strip(" ", 1, 0)])
    return hf
