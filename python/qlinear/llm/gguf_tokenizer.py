"""A GGUF file's tokenizer (``tokenizer.ggml.*`` metadata) rebuilt as a Hugging Face ``tokenizers``
tokenizer: byte-level BPE ("gpt2": vocab + merges, the pre-tokenizer named by
``tokenizer.ggml.pre``), control / user-defined tokens as added tokens, the chat template."""

from __future__ import annotations

from .tokenizer import Tokenizer

# llama.cpp's pre-tokenizer names -> the split pattern (None: GPT-2's own byte-level regex).
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_TOKENIZERS = {"qwen2": _QWEN2, "llama-bpe": _LLAMA3, "llama3": _LLAMA3, "smaug-bpe": _LLAMA3,
                  "gpt-2": None, "gpt2": None, "default": None}
CONTROL, USER_DEFINED = 3, 4      # tokenizer.ggml.token_type values


def read_tokenizer(f) -> tuple[Tokenizer, dict]:
    """(our Tokenizer, info for model.info) from a ``GGUFFile``."""
    from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers  # noqa: PLC0415
    from tokenizers import Tokenizer as HFTokenizer  # noqa: PLC0415

    kind = f.meta("tokenizer.ggml.model", str, required=True)
    if kind != "gpt2":
        raise f.error(f"tokenizer model {kind!r} is not supported (byte-level BPE 'gpt2' is; "
                      "SentencePiece 'llama' is not yet)")
    tokens = f.meta("tokenizer.ggml.tokens", list, required=True)
    merges = f.meta("tokenizer.ggml.merges", list, required=True)
    types = f.meta("tokenizer.ggml.token_type", list, default=[1] * len(tokens))
    if not all(isinstance(t, str) for t in tokens) or not all(isinstance(m, str) and " " in m for m in merges):
        raise f.error("tokenizer.ggml.tokens / merges must be strings ('a b' for a merge)")
    if len(types) != len(tokens) or not all(isinstance(t, int) for t in types):
        raise f.error("tokenizer.ggml.token_type must hold one int per token")
    vocab = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    pre = f.meta("tokenizer.ggml.pre", str, default="default")
    pattern = PRE_TOKENIZERS.get(pre)
    try:
        hf = HFTokenizer(models.BPE(vocab, pairs, ignore_merges=pattern is _LLAMA3))
    except Exception as e:  # tokenizers raises its own exception type
        raise f.error(f"tokenizer cannot be built ({e})") from None
    if pattern is None:
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        hf.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    hf.decoder = decoders.ByteLevel()
    added = [AddedToken(tokens[i], special=types[i] == CONTROL, normalized=False)
             for i in range(len(tokens)) if types[i] in (CONTROL, USER_DEFINED)]
    hf.add_tokens(added)

    def text(key):
        i = f.meta(key, int)
        return tokens[i] if i is not None and 0 <= i < len(tokens) else None

    stops = [t for t in (text("tokenizer.ggml.eos_token_id"), text("tokenizer.ggml.eot_token_id"),
                         "<|im_end|>", "<|endoftext|>", "<|eot_id|>") if t]
    tok = Tokenizer(hf, chat_template=f.meta("tokenizer.chat_template", str), stop_tokens=stops,
                    bos_token=text("tokenizer.ggml.bos_token_id"))
    info = {"tokenizer": f"gpt2 BPE, pre-tokenizer {pre!r}" +
            ("" if pre in PRE_TOKENIZERS else " (unknown: GPT-2's rules used)")}
    return tok, info
