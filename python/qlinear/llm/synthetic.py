"""Small LLM checkpoints built locally, for tests, examples and benchmarks (no hub needed).

A checkpoint here is what a Hugging Face repository holds: ``config.json``, ``model.safetensors``
and a tokenizer (``tokenizer.json`` + ``tokenizer_config.json`` with a chat template). Weights
are random (transformers' own initialization, seeded); the tokenizer is a byte-level BPE trained
with ``tokenizers`` on local text (Python's standard library sources by default).

Needs ``torch`` and ``transformers``. ``qlinear-llm make-test-model`` is the command line.
"""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path
from typing import Iterable, Optional

from .convert import check_out_dir

# Shapes worth having by name. "qwen2.5-0.5b" is Qwen2.5-0.5B's geometry (vocab included).
DTYPES = ("float32", "bfloat16")
SHAPES = {
    "tiny": dict(hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=1024),
    "small": dict(hidden_size=256, intermediate_size=704, num_hidden_layers=4,
                  num_attention_heads=8, num_key_value_heads=2, vocab_size=2048),
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, vocab_size=151936),
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                         num_attention_heads=12, num_key_value_heads=2, vocab_size=151936),
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
                    tokenizer_vocab: Optional[int] = None, dtype: str = "float32", force: bool = False,
                    **overrides) -> Path:
    """Write a random-initialized ``arch`` ("qwen2" or "llama") checkpoint of a named ``shape``
    (see SHAPES; keyword overrides change single fields, e.g. ``vocab_size``) in ``dtype``
    (float32 or bfloat16) with a locally trained tokenizer. An existing non-empty ``out_dir``
    is refused unless ``force``."""
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; known: {', '.join(SHAPES)}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if arch not in ("qwen2", "llama"):
        raise ValueError(f"unknown architecture {arch!r}; known: qwen2, llama")
    out = Path(out_dir)
    check_out_dir(out, force)

    import torch
    import transformers

    fields = {**SHAPES[shape], **overrides}
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
    else:
        config = transformers.LlamaConfig(**{**common, "rope_theta": 500000.0})
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.eval()
    model.save_pretrained(out, safe_serialization=True)
    (out / "generation_config.json").unlink(missing_ok=True)
    return out
