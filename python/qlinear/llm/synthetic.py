"""Small LLM checkpoints built locally, for tests, examples and benchmarks (no hub needed).

A checkpoint here is what a Hugging Face repository holds: ``config.json``, ``model.safetensors``
and a tokenizer (``tokenizer.json`` + ``tokenizer_config.json`` with a chat template). Weights
are random (transformers' own initialization, seeded); the tokenizer is a byte-level BPE trained
with ``tokenizers`` on local text (Python's standard library sources by default).

Needs ``torch`` and ``transformers`` (the ``llm-dev`` extra).
"""

from __future__ import annotations

import json
import os
import sysconfig
from pathlib import Path
from typing import Iterable, Optional

# Shapes worth having by name. "qwen2.5-0.5b" is Qwen2.5-0.5B's geometry (vocab included).
SHAPES = {
    "tiny": dict(hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=1024),
    "small": dict(hidden_size=256, intermediate_size=704, num_hidden_layers=4,
                  num_attention_heads=8, num_key_value_heads=2, vocab_size=2048),
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, vocab_size=151936),
}

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# Qwen2's ChatML template (system prompt optional; generation prompt opens the assistant turn).
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def local_text(limit_bytes: int = 1_000_000) -> Iterable[str]:
    """Text that every machine with Python has: the standard library's sources."""
    root = Path(sysconfig.get_paths()["stdlib"])
    total = 0
    for path in sorted(root.glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        yield text
        total += len(text)
        if total >= limit_bytes:
            break


def train_tokenizer(out_dir, vocab_size: int = 1024, text: Optional[Iterable[str]] = None):
    """Train a byte-level BPE tokenizer and save it HF-style into ``out_dir``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(text if text is not None else local_text(), trainer=trainer)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "unk_token": None, "chat_template": CHATML_TEMPLATE, "model_max_length": 32768,
        "clean_up_tokenization_spaces": False,
    }, indent=2))
    return tok


def make_checkpoint(out_dir, arch: str = "qwen2", shape: str = "tiny", seed: int = 0,
                    tokenizer_vocab: Optional[int] = None, dtype: str = "float32", **overrides):
    """Write a random-initialized ``arch`` ("qwen2" or "llama") checkpoint of a named ``shape``
    (see SHAPES; keyword overrides change single fields) with a locally trained tokenizer."""
    import torch
    import transformers

    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; known: {', '.join(SHAPES)}")
    fields = {**SHAPES[shape], **overrides}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok_vocab = tokenizer_vocab or min(fields["vocab_size"], 4096)
    tok = train_tokenizer(out, vocab_size=tok_vocab)
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    common = dict(max_position_embeddings=4096, rms_norm_eps=1e-6, rope_theta=1000000.0,
                  tie_word_embeddings=False, bos_token_id=ids["<|endoftext|>"],
                  eos_token_id=ids["<|im_end|>"], dtype=dtype)
    common.update(fields)
    if arch == "qwen2":
        config = transformers.Qwen2Config(**common)
    elif arch == "llama":
        config = transformers.LlamaConfig(**{**common, "rope_theta": 500000.0})
    else:
        raise ValueError(f"unknown architecture {arch!r}; known: qwen2, llama")
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.eval()
    model.save_pretrained(out, safe_serialization=True)
    (out / "generation_config.json").unlink(missing_ok=True)
    return out


def main(argv=None) -> None:
    import argparse

    p = argparse.ArgumentParser(prog="qlinear-llm make-test-model",
                                description="Write a random-initialized HF checkpoint with a locally trained tokenizer.")
    p.add_argument("out_dir")
    p.add_argument("--arch", default="qwen2", choices=["qwen2", "llama"])
    p.add_argument("--shape", default="tiny", choices=list(SHAPES))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--vocab-size", type=int, default=None, help="override the model's vocabulary size")
    args = p.parse_args(argv)
    extra = {} if args.vocab_size is None else {"vocab_size": args.vocab_size}
    make_checkpoint(args.out_dir, args.arch, args.shape, args.seed, **extra)
    print(os.fspath(args.out_dir))


if __name__ == "__main__":
    main()
