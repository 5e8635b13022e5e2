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
from dataclasses import dataclass
from typing import Iterable, Optional

from . import gemma4 as synthetic_gemma4, gpt_oss as synthetic_gpt_oss, hybrid as synthetic_hybrid
from ..converted.convert import check_out_dir
from .hybrid import HYBRIDS  # noqa: F401  (the architectures make_checkpoint writes itself)

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


@dataclass(frozen=True)
class ChatFormat:
    """A family's chat template (its shape, shortened from the released tokenizer_config.json),
    its bos / eos (end of turn) / pad tokens and every special token in vocabulary order."""

    template: str
    bos: Optional[str]
    eos: str
    pad: str
    special: tuple


CHATML = ChatFormat(CHATML_TEMPLATE, None, "<|im_end|>", "<|endoftext|>", tuple(SPECIAL_TOKENS))
GEMMA = ChatFormat(
    "{{ bos_token }}{% for message in messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}",
    "<bos>", "<end_of_turn>", "<pad>", ("<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"))
PHI3 = ChatFormat(
    "{% for message in messages %}{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}",
    "<s>", "<|end|>", "<|endoftext|>",
    ("<unk>", "<s>", "</s>", "<|endoftext|>", "<|assistant|>", "<|end|>", "<|system|>", "<|user|>"))
MISTRAL = ChatFormat(
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
    "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% else %}{{ message['content'] + '</s>' }}{% endif %}"
    "{% endfor %}",
    "<s>", "</s>", "<unk>", ("<unk>", "<s>", "</s>", "[INST]", "[/INST]"))
OLMOE = ChatFormat(  # the Tulu turns of OLMoE's instruct model
    "{{ bos_token }}{% for message in messages %}{{ '<|' + message['role'] + '|>\n' + message['content'] }}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}{{ '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}",
    None, "<|endoftext|>", "<|padding|>", ("<|endoftext|>", "<|padding|>", "<|system|>", "<|user|>", "<|assistant|>"))

# arch -> (transformers config class, its fields beyond the shape, chat format)
ARCHS = {
    "qwen2": ("Qwen2Config", {}, CHATML),
    "llama": ("LlamaConfig", {"rope_theta": 500000.0}, CHATML),
    "qwen3": ("Qwen3Config", {}, CHATML),
    "mistral": ("MistralConfig", {"sliding_window": 4096}, MISTRAL),
    "gemma2": ("Gemma2Config", {"tie_word_embeddings": True, "sliding_window": 4096, "rope_theta": 10000.0}, GEMMA),
    "gemma3": ("Gemma3TextConfig", {"tie_word_embeddings": True, "sliding_window": 512}, GEMMA),
    "phi3": ("Phi3Config", {"rope_theta": 10000.0}, PHI3),
    "qwen3_moe": ("Qwen3MoeConfig", {"num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": True}, CHATML),
    "olmoe": ("OlmoeConfig", {"num_experts": 8, "num_experts_per_tok": 2}, OLMOE),  # experts: intermediate_size
    "mixtral": ("MixtralConfig", {"num_local_experts": 8, "num_experts_per_tok": 2}, MISTRAL),
    "qwen2_moe": ("Qwen2MoeConfig", {"num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": False}, CHATML),
    "gpt_oss": (None, {}, ChatFormat(synthetic_gpt_oss.HARMONY_TEMPLATE, None, "<|return|>", "<|endoftext|>",
                                     synthetic_gpt_oss.HARMONY_SPECIAL)),  # written in numpy (MXFP4 experts)
    "gemma4": (None, {}, GEMMA),  # written in numpy (transformers 5's layout)
    # conv layers around attention ones (layers 1 and 3 attend), the MLP's width as given
    "lfm2": ("Lfm2Config", {"block_auto_adjust_ff_dim": False, "full_attn_idxs": [1, 3], "tie_word_embeddings": True}, CHATML),
}
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


def train_tokenizer(out_dir, vocab_size: int = 1024, text: Optional[Iterable[str]] = None,
                    chat: ChatFormat = CHATML, spm_bpe: bool = False):
    """Train a byte-level BPE tokenizer and save it HF-style into ``out_dir``, with ``chat``'s
    template and special tokens. ``spm_bpe``: Gemma's kind instead (spaces as U+2581, BPE over
    raw UTF-8 split at newlines only, unknown characters as <0xNN> byte tokens)."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(byte_fallback=spm_bpe))
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)] if spm_bpe else []
    if spm_bpe:
        tok.normalizer = normalizers.Replace(" ", "\u2581")
        tok.pre_tokenizer = pre_tokenizers.Split(Regex("[^\n]+|[\n]+"), behavior="isolated")
        tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    alphabet = [] if spm_bpe else pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(chat.special) + byte_tokens,
                                  initial_alphabet=alphabet, show_progress=False)
    tok.train_from_iterator(text if text is not None else local_text(), trainer=trainer)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    if byte_tokens:  # the byte tokens are the model's vocabulary, not tokens matched in the text
        saved = json.loads((out / "tokenizer.json").read_text())
        saved["added_tokens"] = [t for t in saved["added_tokens"] if t["content"] not in set(byte_tokens)]
        (out / "tokenizer.json").write_text(json.dumps(saved, ensure_ascii=False))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": chat.bos, "eos_token": chat.eos, "pad_token": chat.pad, "unk_token": None, "chat_template": chat.template, "model_max_length": 32768,
        "clean_up_tokenization_spaces": False,
    }, indent=2))
    return tok


def make_checkpoint(out_dir, arch: str = "qwen2", shape: str = "tiny", seed: int = 0,
                    tokenizer_vocab: Optional[int] = None, dtype: str = "float32", force: bool = False,
                    norm_noise: float = 0.0, **overrides) -> Path:
    """Write a random-initialized ``arch`` (see ARCHS) checkpoint of a named ``shape`` (see
    SHAPES; keyword overrides change single fields of the transformers config, e.g.
    ``vocab_size`` or ``sliding_window``) in ``dtype`` (float32 or bfloat16) with a locally
    trained tokenizer and the family's chat template. ``norm_noise``: RMSNorm weights get
    N(0, norm_noise) added (transformers initializes them all alike, which would hide a norm
    read wrongly). An existing non-empty ``out_dir`` is refused unless ``force``."""
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; known: {', '.join(SHAPES)}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if arch not in ARCHS and arch not in HYBRIDS:
        raise ValueError(f"unknown architecture {arch!r}; known: {', '.join([*ARCHS, *HYBRIDS])}")
    out = Path(out_dir)
    check_out_dir(out, force)
    if arch in HYBRIDS or arch in ("gpt_oss", "gemma4"):  # written in numpy (transformers 4.x has no class for them)
        if dtype != "float32":
            raise ValueError(f"{arch} checkpoints are written in float32 (got dtype {dtype!r})")
        fields = {**SHAPES[shape], **overrides}
        out.mkdir(parents=True, exist_ok=True)
        chat = CHATML if arch in HYBRIDS else ARCHS[arch][2]
        tok = train_tokenizer(out, vocab_size=tokenizer_vocab or min(fields["vocab_size"], 4096), chat=chat,
                              spm_bpe=arch == "gemma4")
        ids = {"bos_token_id": tok.token_to_id(chat.bos or chat.pad), "eos_token_id": tok.token_to_id(chat.eos),
               "pad_token_id": tok.token_to_id(chat.pad)}
        if arch == "gpt_oss":
            return synthetic_gpt_oss.write(out, fields, ids, seed, norm_noise)
        if arch == "gemma4":
            return synthetic_gemma4.write(out, fields, ids, seed, norm_noise)
        return synthetic_hybrid.write(out, arch, fields, ids, seed, norm_noise)

    import torch
    import transformers

    fields = {**SHAPES[shape], **overrides}
    out.mkdir(parents=True, exist_ok=True)
    tok_vocab = tokenizer_vocab or min(fields["vocab_size"], 4096)
    config_class, extra, chat = ARCHS[arch]
    tok = train_tokenizer(out, vocab_size=tok_vocab, chat=chat)
    common = dict(max_position_embeddings=4096, rms_norm_eps=1e-6, rope_theta=1000000.0,
                  tie_word_embeddings=False, bos_token_id=tok.token_to_id(chat.bos or chat.pad),
                  eos_token_id=tok.token_to_id(chat.eos), pad_token_id=tok.token_to_id(chat.pad),
                  dtype=dtype)
    common.update(extra)
    # (Qwen2, Llama and OLMoE take hidden / heads; the others' default, 128 or 256, would not fit)
    if arch not in ("qwen2", "llama", "olmoe"):
        common["head_dim"] = fields["hidden_size"] // fields["num_attention_heads"]
    if arch in ("qwen3_moe", "qwen2_moe"):  # experts half the shape's MLP width (transformers' default is a 30B's)
        common["moe_intermediate_size"] = fields["intermediate_size"] // 2
    if arch == "qwen2_moe":  # the shared expert as wide as the shape's MLP
        common["shared_expert_intermediate_size"] = fields["intermediate_size"]
    common.update(fields)
    config = getattr(transformers, config_class)(**common)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.eval()
    if norm_noise:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("norm.weight"):
                    p.add_(torch.randn_like(p) * norm_noise)
    model.save_pretrained(out, safe_serialization=True)
    (out / "generation_config.json").unlink(missing_ok=True)
    return out


def widen_checkpoint(src, out_dir, shape: str = "qwen2.5-0.5b", seed: int = 0, force: bool = False) -> Path:
    """A Qwen2 / Llama checkpoint grown to a larger ``shape`` (hidden size, query heads,
    intermediate size, layers; the vocabulary, head size and key-value heads kept) that computes
    the same function: the model's cost at that shape with a trained model's predictions (for
    speculative decoding's benchmarks: acceptance is the trained model's, verification pays for
    the larger weights).

    The residual stream gets zero dimensions: the embedding's new columns and every new output row
    of o / down are zero, the RMSNorm weights are scaled by sqrt(hidden / new hidden) and its
    epsilon by hidden / new hidden (the mean square now counts the zeros); new query heads (placed after
    the old ones of their key-value group) and new intermediate units read random weights and
    write through zero columns of o / down; new layers are random but for o and down, which are
    zero, so they add nothing to the residual. Weights are written in the source's dtype, the
    norms' in float32."""
    import torch
    from safetensors.torch import load_file, save_file

    src, out = Path(src), Path(out_dir)
    check_out_dir(out, force)
    cfg = json.loads((src / "config.json").read_text())
    new = {**cfg, **{k: v for k, v in SHAPES[shape].items() if k != "vocab_size"}}
    d = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    h0, h1, i0, i1 = cfg["hidden_size"], new["hidden_size"], cfg["intermediate_size"], new["intermediate_size"]
    kv, g0 = cfg["num_key_value_heads"], cfg["num_attention_heads"] // cfg["num_key_value_heads"]
    if new["num_key_value_heads"] != kv or new["hidden_size"] // new["num_attention_heads"] != d:
        raise ValueError(f"{shape}: widening keeps the key-value heads ({kv}) and the head size ({d})")
    g1 = new["num_attention_heads"] // kv
    if h1 < h0 or i1 < i0 or g1 < g0 or new["num_hidden_layers"] < cfg["num_hidden_layers"]:
        raise ValueError(f"{shape} is not larger than {src} in every dimension")
    new["head_dim"] = d
    new["rms_norm_eps"] = cfg["rms_norm_eps"] * h0 / h1  # mean square + epsilon, scaled alike: exact
    old = load_file(src / "model.safetensors")
    dtype = next(iter(old.values())).dtype
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape_):
        return torch.randn(*shape_, generator=gen) * 0.02

    heads = torch.tensor([g * g1 + j for g in range(kv) for j in range(g0)])  # old query heads' new places
    q_rows = (heads[:, None] * d + torch.arange(d)).reshape(-1)
    w = {}
    for name, t in old.items():
        t = t.float()
        if name.endswith("norm.weight") and t.shape == (h0,):
            w[name] = torch.cat([t, torch.ones(h1 - h0)]) * (h0 / h1) ** 0.5
        elif name == "model.embed_tokens.weight" or name == "lm_head.weight":
            w[name] = torch.cat([t, torch.zeros(t.shape[0], h1 - h0)], 1)
        elif ".q_proj." in name:
            if t.ndim == 2:
                w[name] = rand(new["num_attention_heads"] * d, h1)
                w[name][q_rows[:, None], torch.arange(h0)] = t
            else:  # the bias
                w[name] = rand(new["num_attention_heads"] * d)
                w[name][q_rows] = t
        elif ".k_proj.weight" in name or ".v_proj.weight" in name:
            w[name] = torch.cat([t, rand(t.shape[0], h1 - h0)], 1)
        elif ".o_proj.weight" in name:  # zero rows out (the new residual dims), new heads' columns zero
            w[name] = torch.zeros(h1, new["num_attention_heads"] * d)
            w[name][torch.arange(h0)[:, None], q_rows] = t
        elif ".gate_proj.weight" in name or ".up_proj.weight" in name:
            w[name] = rand(i1, h1)
            w[name][:i0, :h0] = t
        elif ".down_proj.weight" in name:
            w[name] = torch.zeros(h1, i1)
            w[name][:h0, :i0] = t
        else:  # k / v biases
            w[name] = t
    template = {n.split(".", 3)[3]: t for n, t in w.items() if n.startswith("model.layers.0.")}
    for layer in range(cfg["num_hidden_layers"], new["num_hidden_layers"]):
        for rest, t in template.items():
            silent = "o_proj" in rest or "down_proj" in rest
            w[f"model.layers.{layer}.{rest}"] = torch.zeros_like(t) if silent else (
                t.clone() if "norm" in rest else rand(*t.shape))
    out.mkdir(parents=True, exist_ok=True)
    # the scaled norm weights stay float32 (bfloat16 would round them); the rest the source's dtype
    save_file({n: (t if "norm" in n else t.to(dtype)).contiguous() for n, t in w.items()}, out / "model.safetensors",
              metadata={"format": "pt"})
    new.pop("layer_types", None)
    (out / "config.json").write_text(json.dumps(new, indent=2))
    for f in src.iterdir():
        if f.name.startswith("tokenizer") or f.name in ("special_tokens_map.json", "generation_config.json"):
            (out / f.name).write_bytes(f.read_bytes())
    return out
