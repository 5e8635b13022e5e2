"""An export directory read as a whole: its settings, graph, weight records, norms, RoPE
frequencies, embedding file and tokenizer (see the package's docstring for the files)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np

from ..._arrays import bf16_to_float32
from .embedding import TiedEmbedding, tied_embedding
from .features import GEMMA_TYPES, embed_scale, final_softcap, gemma_config
from .graph import HEAD_NORMS, NORM_RE, PROJ_PARENT, hf_linear_name, read_graph, rope_from_graph, theta_from_inv_freq
from .jsonfile import load_json
from .tokenizer import read_tokenizer
from .weights import Linear, Linears, WeightFile, read_linear

_ARCHITECTURES = {"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM",
                  "mistral": "MistralForCausalLM", "gemma2": "Gemma2ForCausalLM",
                  "gemma3_text": "Gemma3ForCausalLM"}
SUPPORTED_MODEL_TYPES = tuple(_ARCHITECTURES)
QK_NORM_TYPES = ("qwen3", "gemma3_text")   # per-head q / k RMSNorms
# exports of model types whose text model we could read but the export holds more than it
NOT_TEXT_ONLY = {"gemma3": "Gemma 3 with vision (Gemma3ForConditionalGeneration): its vision model is not "
                           "supported; a text-only Gemma 3 (Gemma3ForCausalLM) exports as 'gemma3_text'"}


@dataclass
class MnnExport:
    """An export directory, read: weights by Hugging Face module name, config in HF terms."""

    path: Path
    config: dict                          # Hugging Face config.json terms
    linears: Mapping[str, Linear]         # "model.layers.0.self_attn.q_proj", ..., "lm_head" (read on access)
    norms: Dict[str, np.ndarray]          # "model.layers.0.input_layernorm", ..., "model.norm"
    embedding_path: Path                  # raw bf16 [vocab, hidden]; tied: llm.mnn.weight
    embedding_shape: Tuple[int, int]
    tokenizer: object                     # tokenizers.Tokenizer
    chat_template: Optional[str]
    stop_token_ids: List[int]
    bos_token: Optional[str] = None
    eos_token: Optional[str] = None
    rope_inv_freq: Optional[np.ndarray] = None   # float32 [head_dim // 2], as the graph holds it
    runtime_config: dict = field(default_factory=dict)   # the export's config.json
    llm_config: dict = field(default_factory=dict)       # the export's llm_config.json
    tied_embedding: Optional[TiedEmbedding] = None       # no embedding file: the lm head's records

    def embedding(self, mmap: bool = True) -> np.ndarray:
        """The embedding table as uint16 bf16 bits [vocab, hidden] (memory-mapped by default)."""
        if self.tied_embedding is not None:
            raise ValueError(f"{self.path}: the embedding is the lm head's quantized records, not a bf16 "
                             "table (see embed)")
        if mmap:
            return np.memmap(self.embedding_path, dtype=np.uint16, mode="r",
                             shape=self.embedding_shape)
        return np.fromfile(self.embedding_path, dtype=np.uint16).reshape(self.embedding_shape)

    def embed(self, ids) -> np.ndarray:
        """float32 rows of the embedding for token ids (unscaled: Gemma's graph scales them)."""
        if self.tied_embedding is not None:
            return self.tied_embedding(np.asarray(ids, dtype=np.int64))
        return bf16_to_float32(self.embedding()[np.asarray(ids, dtype=np.int64)])


def read_export(path, tokenizer: bool = True) -> MnnExport:
    """Read an ``llmexport`` output directory (see the module docstring) without dequantizing."""
    d = Path(path)
    if not d.is_dir():
        raise ValueError(f"{d}: not a directory (expected an MNN LLM export)")
    runtime = load_json(d / "config.json", "runtime settings")
    llm_cfg = load_json(d / "llm_config.json", "model settings")
    model_type = llm_cfg.get("model_type")
    if model_type in NOT_TEXT_ONLY:
        raise ValueError(f"{d / 'llm_config.json'}: model_type {model_type!r} is not supported: "
                         f"{NOT_TEXT_ONLY[model_type]}")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"{d / 'llm_config.json'}: model_type {model_type!r} is not supported "
                         f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})")
    for key in ("hidden_size", "layer_nums"):
        if not isinstance(llm_cfg.get(key), int):
            raise ValueError(f"{d / 'llm_config.json'}: missing {key!r}")
    gemma = model_type in GEMMA_TYPES   # sliding layers: see features
    if llm_cfg.get("is_mrope") or (llm_cfg.get("attention_type", "full") != "full" and not gemma):
        raise ValueError(f"{d / 'llm_config.json'}: attention_type={llm_cfg.get('attention_type')!r}, "
                         f"is_mrope={llm_cfg.get('is_mrope')!r}: only full attention with plain RoPE "
                         "is supported")
    for key in ("visual_model", "audio_model", "talker_model"):
        if key in runtime or key in llm_cfg:
            raise ValueError(f"{d}: multimodal exports ({key}) are not supported")
    hidden, n_layers = llm_cfg["hidden_size"], llm_cfg["layer_nums"]
    mnn_path = d / runtime.get("llm_model", "llm.mnn")
    weight_path = d / runtime.get("llm_weight", "llm.mnn.weight")
    graph = read_graph(mnn_path)
    wf = WeightFile(weight_path)

    linears: Dict[str, Linear] = {}
    norms: Dict[str, np.ndarray] = {}
    loose_norms = []
    eps = set()
    n_attention = 0
    for op in graph["oplists"]:
        t, name = op.get("type"), str(op.get("name", ""))
        if t == "Convolution":
            hf = hf_linear_name(name)
            if hf is None:
                raise ValueError(f"{mnn_path}: linear op {name!r} does not map to a known layer")
            if hf in linears:
                raise ValueError(f"{mnn_path}: two ops for {hf}")
            read_linear(wf, op, payload=False)  # checked now, read when used
            linears[hf] = op
        elif t == "LayerNorm":
            main = op.get("main") or {}
            if not main.get("useRMSNorm"):
                raise ValueError(f"{mnn_path}: norm {name!r} is a LayerNorm, not an RMSNorm")
            ext = main.get("external")
            if ext:
                gamma = wf.floats(int(ext[0]), int(ext[1]), f"norm {name} weight").copy()
                if len(ext) > 2 and int(ext[2]) and wf.floats(int(ext[0]) + int(ext[1]), int(ext[2]),
                                                              f"norm {name} bias").any():
                    raise ValueError(f"{mnn_path}: norm {name!r} has a bias (beta)")
            elif main.get("gamma"):
                gamma = np.asarray(main["gamma"], dtype=np.float32)
            else:
                raise ValueError(f"{mnn_path}: norm {name!r} has no weight")
            m = NORM_RE.match(name)
            kind = m.group(2).replace("/", ".") if m else None
            if kind not in HEAD_NORMS and gamma.shape != (hidden,):  # head norms: checked with head_dim
                raise ValueError(f"{weight_path}: norm {name}: {gamma.size} values, expected {hidden}")
            eps.add(float(main.get("epsilon", 1e-6)))
            if m:
                norms[f"model.layers.{m.group(1)}.{kind}"] = gamma
            else:
                loose_norms.append((name, gamma))
        elif t == "Attention":
            n_attention += 1
        elif t in ("Extra", "MoE", "LinearAttention"):
            raise ValueError(f"{mnn_path}: op {name!r} of type {t} is not supported")
    if len(loose_norms) != 1:
        raise ValueError(f"{mnn_path}: expected one final norm outside the layers, found "
                         f"{[n for n, _ in loose_norms]}")
    norms["model.norm"] = loose_norms[0][1]
    if n_attention != n_layers:
        raise ValueError(f"{mnn_path}: {n_attention} attention ops for {n_layers} layers")

    missing = [f"model.layers.{i}.{p}.{proj}" for i in range(n_layers)
               for proj, p in PROJ_PARENT.items() if f"model.layers.{i}.{p}.{proj}" not in linears]
    layer_norms = (("input_layernorm", "post_attention_layernorm")
                   + (("pre_feedforward_layernorm", "post_feedforward_layernorm") if gemma else ())
                   + (HEAD_NORMS if model_type in QK_NORM_TYPES else ()))
    missing += [f"model.layers.{i}.{n}" for i in range(n_layers) for n in layer_norms
                if f"model.layers.{i}.{n}" not in norms]
    stray = sorted(n for n in norms if n != "model.norm" and n.split(".", 3)[3] not in layer_norms)
    if stray:
        raise ValueError(f"{mnn_path}: norms a {model_type} export does not have ({stray[0]}, ...)")
    if "lm_head" not in linears:
        missing.append("lm_head")
    if missing:
        raise ValueError(f"{mnn_path}: missing from the graph: {', '.join(missing[:8])}"
                         + (" ..." if len(missing) > 8 else ""))
    extra = sorted(set(linears) - {f"model.layers.{i}.{p}.{proj}" for i in range(n_layers)
                                   for proj, p in PROJ_PARENT.items()} - {"lm_head"})
    if extra:
        raise ValueError(f"{mnn_path}: layers beyond layer_nums={n_layers}: {', '.join(extra[:4])}")

    def shape(name):
        common = (linears[name].get("main") or {}).get("common") or {}
        return int(common.get("outputCount", 0)), int(common.get("inputCount", 0))

    q_n, q_k = shape("model.layers.0.self_attn.q_proj")
    k_n, _ = shape("model.layers.0.self_attn.k_proj")
    inter, _ = shape("model.layers.0.mlp.gate_proj")
    vocab, lm_k = shape("lm_head")
    if q_k != hidden or lm_k != hidden:
        raise ValueError(f"{mnn_path}: linear input sizes {q_k}/{lm_k} differ from hidden_size {hidden}")
    inv_freq = rope_from_graph(graph)
    if inv_freq is None:
        raise ValueError(f"{mnn_path}: no RoPE frequency constant (/rotary/...) in the graph")
    head_dim = 2 * inv_freq.size
    if q_n % head_dim or k_n % head_dim:
        raise ValueError(f"{mnn_path}: q/k sizes {q_n}/{k_n} are not multiples of head_dim {head_dim}")
    for name, gamma in norms.items():
        if name.endswith(HEAD_NORMS) and gamma.shape != (head_dim,):
            raise ValueError(f"{weight_path}: norm {name}: {gamma.size} values, expected head_dim {head_dim}")
    if len(eps) != 1:
        raise ValueError(f"{mnn_path}: norms disagree on epsilon: {sorted(eps)}")
    def has_bias(name):
        ext = ((linears[name].get("main") or {}).get("external")) or [0, 0, 0, 0]
        return int(ext[3]) > 0

    q_bias, o_bias = has_bias("model.layers.0.self_attn.q_proj"), has_bias("model.layers.0.self_attn.o_proj")

    tied = None
    if "tie_embeddings" in llm_cfg:   # MNN's engine then reads the lm head's records, file or not
        tied = tied_embedding(wf, llm_cfg["tie_embeddings"], linears["lm_head"], vocab, hidden,
                              str(d / "llm_config.json"))
        emb_path = weight_path
    else:
        emb_path = d / runtime.get("embedding_file", "embeddings_bf16.bin")
        if not emb_path.is_file():
            others = sorted(p.name for p in d.glob("embeddings_*.bin"))
            raise ValueError(f"{emb_path}: missing (the bf16 embedding table)"
                             + (f"; found {', '.join(others)}: only bf16 embeddings are supported" if others else ""))
        expected = vocab * hidden * 2
        if emb_path.stat().st_size != expected:
            raise ValueError(f"{emb_path}: {emb_path.stat().st_size} bytes, expected {expected} "
                             f"(bf16 [{vocab}, {hidden}])")

    config = {
        "model_type": model_type,
        "architectures": [_ARCHITECTURES[model_type]],
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": n_layers,
        "num_attention_heads": q_n // head_dim,
        "num_key_value_heads": k_n // head_dim,
        "head_dim": head_dim,
        "rms_norm_eps": eps.pop(),
        "rope_theta": theta_from_inv_freq(inv_freq, head_dim),
        "vocab_size": vocab,
        "tie_word_embeddings": tied is not None,
        # Not recorded in an export; RoPE itself has no limit.
        "max_position_embeddings": int(llm_cfg.get("max_position_embeddings", 32768)),
        "attention_bias": q_bias,
        "attention_output_bias": o_bias,
        "hidden_act": "silu",
    }
    if gemma:
        config.update(gemma_config(graph, llm_cfg, hidden, n_layers, str(mnn_path)),
                      rope_local_base_freq=config["rope_theta"])   # one RoPE for all layers: see features
    elif (embed_scale(graph) is not None or final_softcap(graph) is not None
          or abs(float(llm_cfg.get("attn_scale", head_dim ** -0.5)) * head_dim ** 0.5 - 1) > 1e-6):
        raise ValueError(f"{mnn_path}: a {model_type} export with a scaled embedding, soft-capped logits "
                         f"or an attention scale other than head_dim ** -0.5 is not supported")
    tok = None
    stop, template, eos, bos = [], None, None, None
    if tokenizer:
        tok, stop, template, eos, bos = read_tokenizer(d, runtime.get("tokenizer_file"))
    jinja = llm_cfg.get("jinja") or {}
    template = jinja.get("chat_template") or template
    eos = jinja.get("eos") or eos
    bos = jinja.get("bos") or bos
    if tok is not None and eos is not None:
        eos_id = tok.token_to_id(eos)
        if eos_id is not None and eos_id not in stop:
            stop = list(stop) + [eos_id]
    if tok is not None:
        config["eos_token_id"] = stop[0] if len(stop) == 1 else list(stop)
    return MnnExport(path=d, config=config, linears=Linears(wf, linears), norms=norms, embedding_path=emb_path,
                     embedding_shape=(vocab, hidden), tied_embedding=tied,
                     tokenizer=tok, chat_template=template,
                     stop_token_ids=list(stop), bos_token=bos, eos_token=eos, rope_inv_freq=inv_freq,
                     runtime_config=runtime, llm_config=llm_cfg)
