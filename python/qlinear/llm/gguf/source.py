"""Source: a GGUF file (llama.cpp's format; Qwen2, Qwen3, Llama (which llama.cpp's converter
also writes Mistral as), Gemma 2 / 3, Phi-3, and the routed experts of Qwen3-MoE and OLMoE: each
expert cut from the stacked ``ffn_*_exps`` tensors). Metadata -> config (``gguf.config``), the GGUF
tokenizer rebuilt as a ``tokenizers`` one, weights mapped by tensor name (``blk.N.attn_q`` ...).

Codes are moved, not re-rounded: Q4_0 is our symmetric int4 group 32 (w = d (q - 8): code q,
zero point 8, float16 scale d), Q8_0 our symmetric int8 group 32 (code q + 128), and the block
formats (Q2_K .. Q6_K, Q5_0, Q4_1, Q5_1, IQ4_NL, IQ4_XS, MXFP4: ``qlinear.blocks``) are packed
from their rows as stored. A fused weight (q / k / v, gate / up) whose tensors the file stores in
different types (a Q4_K_M file's Q4_K q / k beside a Q6_K v) is a weight of parts
(``qlinear.stack_weights``), each part in its own format. Other types (F16, BF16, F32,
IQ2 / IQ3, ...) are dequantized with ``gguf.quants`` and quantized again at the requested bits;
``model.info["gguf_requantized"]`` lists them.

The embedding: F16 / BF16 / F32 tables are read on disk from the file like a checkpoint's; a
quantized ``token_embd`` is dequantized a row at a time from the mapped file (or as a whole
float32 table with ``disk_embedding=False``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional

import numpy as np

from ..._packed import PackedWeight, pack_blocks, pack_quantized, pack_weight, stack_weights
from ..config import ModelConfig
from . import gemma4, hybrid
from .config import read_config
from .embedding import FLOAT_EMBEDDINGS, embedding_of as _embedding, write_tokenizer  # noqa: F401  (convert's)
from .file import MAGIC, Blocks, GGUFFile, Moved, codes
from .tokenizer import read_tokenizer
from ..source import trim_heap
from ..options import Options
from ..source import progress
from ..source import Source, select_rows, slim_rows

KIND = "gguf"


def is_gguf(p: Path) -> bool:
    if not p.is_file():
        return False
    if p.suffix.lower() == ".gguf":
        return True
    with open(p, "rb") as fh:
        return fh.read(4) == MAGIC


def read(p: Path, opts: Options, progress_bar: bool = True, routed_experts: bool = True) -> Source:
    """``routed_experts=False``: a MoE model's experts are left out (read from the file on demand
    by ``memory="flash"``), their routers kept."""
    f = GGUFFile(p)
    cfg = read_config(f)
    tokenizer, info = read_tokenizer(f)
    tokenizer.stop_ids |= {cfg.eos_token_id} if cfg.eos_token_id is not None else set()
    w = _Weights(f, cfg, opts)
    H, I, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    tensors = {}
    bar = progress(cfg.num_layers + 1, "repacking", progress_bar)
    for i in range(cfg.num_layers):
        b, o = f"blk.{i}.", f"layers.{i}."
        if cfg.arch == "gemma4_text":  # per-layer shapes, shared KV, per-layer inputs
            tensors.update(gemma4.layer_tensors(w, cfg, i))
            f.drop_pages()
            bar.update(1)
            continue
        if cfg.mixer(i) == "delta":
            tensors.update(hybrid.delta_tensors(w, cfg, b, o))
        elif cfg.mixer(i) == "conv":
            tensors.update(hybrid.short_conv_tensors(w, cfg, b, o))
        elif cfg.attn_output_gate:
            tensors.update(hybrid.gated_attention_tensors(w, cfg, b, o))
        else:
            qkv = [(b + "attn_q", cfg.q_size, cfg.num_heads), (b + "attn_k", cfg.kv_size, cfg.num_kv_heads),
                   (b + "attn_v", cfg.kv_size, None)]
            if b + "attn_qkv.weight" in f.tensors:  # Phi-3: fused in the file, in our order
                qkv = [(b + "attn_qkv", cfg.q_size + 2 * cfg.kv_size, None)]
            tensors[o + "qkv"] = w.fused(o + "qkv", [(n + ".weight", (r, H), h) for n, r, h in qkv])
            if b + "attn_q.bias" in f.tensors:
                tensors[o + "qkv.bias"] = np.concatenate([w.vector(n + ".bias", r, h) for n, r, h in qkv])
            tensors[o + "o"] = w.fused(o + "o", [(b + "attn_output.weight", (H, cfg.q_size), None)])
            if b + "attn_output.bias" in f.tensors:  # (GPT-OSS)
                tensors[o + "o.bias"] = w.vector(b + "attn_output.bias", H)
            if cfg.attn_sinks:
                tensors[o + "sinks"] = w.vector(b + "attn_sinks.weight", cfg.num_heads)
        if cfg.num_experts:
            tensors.update(w.experts(b, o) if routed_experts else w.router(b, o))
        else:
            gate_up = [(b + "ffn_gate.weight", (I, H), None), (b + "ffn_up.weight", (I, H), None)]
            if b + "ffn_gate.weight" not in f.tensors and cfg.arch == "phi3":  # ffn_up: gate, then up
                gate_up = [(b + "ffn_up.weight", (2 * I, H), None)]
            tensors[o + "gate_up"] = w.fused(o + "gate_up", gate_up)
            tensors[o + "down"] = w.fused(o + "down", [(b + "ffn_down.weight", (H, I), None)])
        tensors[o + "input_norm"] = w.vector(b + "attn_norm.weight", H)
        # (Qwen3.5's and GPT-OSS's MLP input norm is its post_attention_norm)
        post = ("post_attention_norm.weight" if (cfg.mixers and cfg.arch != "lfm2") or cfg.arch == "gpt_oss"
                else "ffn_norm.weight")
        tensors[o + "post_norm"] = w.vector(b + post, H)
        if cfg.qk_norm and not cfg.attn_output_gate and cfg.mixer(i) == "attention":  # Qwen3, Gemma 3, LFM2 (per head); OLMoE (all heads)
            q, k = (cfg.q_size, cfg.kv_size) if cfg.qk_norm_whole else (hd, hd)
            tensors[o + "q_norm"] = w.vector(b + "attn_q_norm.weight", q)
            tensors[o + "k_norm"] = w.vector(b + "attn_k_norm.weight", k)
        if cfg.sandwich_norms:  # Gemma: the attention's and the MLP's outputs normalized too
            tensors[o + "attn_out_norm"] = w.vector(b + "post_attention_norm.weight", H)
            tensors[o + "mlp_out_norm"] = w.vector(b + "post_ffw_norm.weight", H)
        f.drop_pages()
        trim_heap()
        bar.update(1)
    # (LFM2's final norm is its embedding_norm, which llama.cpp's converter names token_embd_norm)
    tensors["norm"] = w.vector("token_embd_norm.weight" if cfg.arch == "lfm2" else "output_norm.weight", H)
    tensors.update(gemma4.model_tensors(w, cfg) if cfg.arch == "gemma4_text" else {})
    head = "token_embd.weight" if cfg.tie_word_embeddings else "output.weight"
    tensors["lm_head"] = w.fused("lm_head", [(head, (cfg.vocab_size, H), None)])
    rows = slim_rows(opts.slim_vocab, cfg, tokenizer)
    if rows is not None:
        tensors["lm_head"], tensors["lm_rows"] = select_rows(tensors["lm_head"], rows), rows
    f.drop_pages()
    bar.update(1)
    bar.close()
    embedding = _embedding(f, cfg)
    inv_freq = None
    if "rope_freqs.weight" in f.tensors and cfg.arch != "gemma4_text":  # Llama 3.x: per-frequency divisors
        factors = f.dequantize(f.tensor("rope_freqs.weight", (hd // 2,)))
        inv_freq = 1.0 / (cfg.rope_theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd)) / factors
    bits = {t.bits for t in tensors.values() if isinstance(t, PackedWeight)}
    groups = {t.group_size for t in tensors.values() if isinstance(t, PackedWeight)}
    quantization = {"bits": bits.pop() if len(bits) == 1 else None,
                    "group_size": groups.pop() if len(groups) == 1 else None, "symmetric": None}
    info.update(w.info())
    info["embedding"] = f.tensors["token_embd.weight"].tensor_type.name
    return Source(KIND, p, cfg, tokenizer, embedding, tensors, quantization, info=info, rope_inv_freq=inv_freq,
                  per_layer_embedding=gemma4.per_layer_table(f, cfg))


def _unpermute(x: np.ndarray, heads: Optional[int]) -> np.ndarray:
    """Undo llama.cpp's Q/K row order for Llama (its converter interleaves each head's two
    rotary halves): back to Hugging Face's rotate-half order."""
    if heads is None:
        return x
    return x.reshape(heads, x.shape[0] // heads // 2, 2, *x.shape[1:]).swapaxes(1, 2).reshape(x.shape)


_LAYERS = ("blk.", "per_layer_model_proj.")  # (Gemma 4's projection of the embedding into every layer's input)
_ABOVE_4_BITS = {"Q8_1", "Q8_K"}  # re-quantized at int8 at least (the others of more bits are moved)


class _Weights:
    def __init__(self, f: GGUFFile, cfg: ModelConfig, opts: Options):
        self.f, self.opts, self.llama, self.cfg = f, opts, cfg.arch in ("llama", "mixtral"), cfg
        self.moved, self.requantized = [], []
        # a float tensor among quantized ones was left float by llama-quantize (a width its
        # types do not fit): at int8 at least, not below the file (an all-float file: ``bits``)
        self.floats_kept = {t.name for t in f.tensors.values() if t.name.startswith(_LAYERS) and len(t.shape) >= 2
                            and t.tensor_type.name in FLOAT_EMBEDDINGS}
        if len(self.floats_kept) == sum(1 for t in f.tensors.values() if t.name.startswith(_LAYERS) and len(t.shape) >= 2):
            self.floats_kept = set()

    def experts(self, b: str, o: str) -> dict:
        """A routed MLP: the router (``ffn_gate_inp``, float as the runtime keeps it) and each
        expert's gate / up fused and its down, cut from the [experts, rows, k] tensors
        ``ffn_{gate,up,down}_exps``, codes moved as for dense weights."""
        cfg, H = self.cfg, self.cfg.hidden_size
        E, M = cfg.num_experts, cfg.moe_intermediate_size
        out = self.router(b, o)
        stacks = {part: self._stacked(f"{b}ffn_{part}_exps.weight", shape)
                  for part, shape in (("gate", (E, M, H)), ("up", (E, M, H)), ("down", (E, H, M)))}
        if cfg.shared_expert_size:  # Qwen3.5-MoE: the shared expert and its gate row (float)
            S = cfg.shared_expert_size
            out[o + "shared_gate_up"] = self.fused(o + "shared_gate_up", [(b + "ffn_gate_shexp.weight", (S, H), None),
                                                                        (b + "ffn_up_shexp.weight", (S, H), None)])
            out[o + "shared_down"] = self.fused(o + "shared_down", [(b + "ffn_down_shexp.weight", (H, S), None)])
            name = b + "ffn_gate_inp_shexp.weight"  # [1, hidden], or [hidden] once requantized
            t = self.f.tensors.get(name)
            shape = (H,) if t is not None and len(t.shape) == 1 else (1, H)
            out[o + "shared_gate"] = np.array(self.f.dequantize(self.f.tensor(name, shape))).reshape(H)
        for e in range(E):
            out[f"{o}experts.{e}.gate_up"] = self._fuse(f"{o}experts.{e}.gate_up", [stacks["gate"](e), stacks["up"](e)],
                                                        [f"{b}ffn_gate_exps.weight[{e}]", f"{b}ffn_up_exps.weight[{e}]"])
            out[f"{o}experts.{e}.down"] = self._fuse(f"{o}experts.{e}.down", [stacks["down"](e)],
                                                     [f"{b}ffn_down_exps.weight[{e}]"])
        return out

    def _expert_biases(self, b: str, o: str) -> dict:
        cfg = self.cfg
        E, M, H = cfg.num_experts, cfg.moe_intermediate_size, cfg.hidden_size
        out = {}
        stacked = {part: np.array(self.f.dequantize(self.f.tensor(f"{b}ffn_{part}_exps.bias", shape)))
                   for part, shape in (("gate", (E, M)), ("up", (E, M)), ("down", (E, H)))}
        for e in range(E):
            out[f"{o}experts.{e}.gate_up.bias"] = np.concatenate([stacked["gate"][e], stacked["up"][e]])
            out[f"{o}experts.{e}.down.bias"] = stacked["down"][e]
        return out

    def router(self, b: str, o: str) -> dict:
        """The router (float, as the runtime keeps it) and its bias where the file has one; the
        experts' biases too where it has them (GPT-OSS: small, resident also when the experts are
        read from the file on demand)."""
        cfg = self.cfg
        out = {o + "router": np.array(self.f.dequantize(self.f.tensor(b + "ffn_gate_inp.weight",
                                                                     (cfg.num_experts, cfg.hidden_size))))}
        if b + "ffn_gate_inp.bias" in self.f.tensors:
            out[o + "router.bias"] = self.vector(b + "ffn_gate_inp.bias", cfg.num_experts)
        if b + "ffn_gate_exps.bias" in self.f.tensors:
            out.update(self._expert_biases(b, o))
        return out

    def _stacked(self, name: str, shape: tuple):
        """expert -> its part of a [experts, rows, k] tensor, as ``_part`` gives a 2-D one."""
        t = self.f.tensor(name, shape)
        E, rows, k = shape
        m = codes(t, (E * rows, k)) if self.opts.bits is not None else None
        if m is None:
            w = self.f.dequantize(t).reshape(E * rows, k)
            return lambda e: (w[e * rows:(e + 1) * rows], t.tensor_type.name)
        label = f"{name} ({t.tensor_type.name})"  # listed once in model.info, not once per expert
        return lambda e: dataclasses.replace(m.rows(slice(e * rows, (e + 1) * rows)), label="" if e else label)

    def vector(self, name, n, heads=None):
        v = np.array(self.f.dequantize(self.f.tensor(name, (n,))))  # a copy: no view of the mapped file
        return _unpermute(v, heads) if self.llama else v

    def _part(self, name, shape, heads, rows=None):
        """A weight's codes (moved), or its float rows; ``rows``: those rows only, in that order."""
        t = self.f.tensor(name, shape)
        m = codes(t) if self.opts.bits is not None else None
        order = rows
        if self.llama and heads is not None:
            order = _unpermute(np.arange(shape[0]), heads)
        if m is not None:
            m.label = f"{name} ({t.tensor_type.name})"
            return m if order is None else m.rows(order)
        w = self.f.dequantize(t)
        return (w if order is None else w[order]), t.tensor_type.name

    def fused(self, what, specs):
        return self._fuse(what, [self._part(*s) for s in specs], [s[0] for s in specs])

    def _fuse(self, what, parts, names):
        opts = self.opts
        if opts.bits is None:
            return np.concatenate([p[0] for p in parts])
        kinds = {(p.fmt if isinstance(p, Blocks) else f"int{p.bits}" if isinstance(p, Moved) else "float")
                 for p in parts}
        if len(kinds) > 1:  # stored in different types: a weight of parts, each packed alone
            return stack_weights([self._fuse(what, [p], [name]) for p, name in zip(parts, names)])
        if isinstance(parts[0], Blocks):
            for p in parts:
                if p.label:
                    self.moved.append(p.label)
            raw = np.concatenate([p.raw for p in parts]) if len(parts) > 1 else parts[0].raw
            return pack_blocks(raw, parts[0].fmt, (raw.shape[0], parts[0].k))
        return self._fuse_affine(what, parts, names)

    def _fuse_affine(self, what, parts, names):
        opts = self.opts
        moved = [p for p in parts if isinstance(p, Moved)]
        if moved and len({m.bits for m in moved}) == 1:
            bits, symmetric = moved[0].bits, all(m.symmetric for m in moved)
            group, label = 32, f"int{moved[0].bits} group 32"
        else:
            parts = [(self._float(p), p.label.rsplit(" ", 1)[-1].strip("()")) if isinstance(p, Moved) else p
                     for p in parts]
            bits, group, symmetric = opts.bits, opts.group_size, opts.symmetric
            # types of more than 4 bits per weight (Q5_*, Q6_K, ...) are re-quantized to int8 at
            # least: at int4 their own rounding and ours stack up (a Q4_K_M file of a 0.5B model,
            # most of it Q5_0 / Q6_K: logits cosine against llama.cpp 0.89 at int4, 0.9989 at int8)
            if any(p[1] in _ABOVE_4_BITS for p in parts) or any(n.split("[")[0] in self.floats_kept for n in names):
                bits = max(bits, 8)
            label = f"int{bits} group {group}"
        out = []
        for p, name in zip(parts, names):
            if not isinstance(p, Moved):
                self.requantized.append(f"{name} ({p[1]} -> {label})")
                c, sc, off = pack_weight(p[0], bits=bits, group_size=group, symmetric=symmetric).unpack()
                p = Moved(c, sc, off, bits, symmetric)
            elif p.label:
                self.moved.append(p.label)
            out.append(p if symmetric else p.asymmetric())
        if any(m is None for m in out):  # -zp * scale overflows float16: quantize the weight afresh
            self.requantized.append(f"{what} (float16 offset overflow -> {label})")
            w = np.concatenate([self._float(p) if isinstance(p, Moved) else p[0] for p in parts])
            return pack_weight(w, bits=bits, group_size=group, symmetric=False)
        return pack_quantized(np.concatenate([m.codes for m in out]), np.concatenate([m.scale for m in out]),
                              None if symmetric else np.concatenate([m.offset for m in out]),
                              bits, group, symmetric)

    @staticmethod
    def _float(m: Moved) -> np.ndarray:
        c = m.codes.astype(np.float32).reshape(m.codes.shape[0], -1, 32)
        if m.symmetric:
            w = (c - (8 if m.bits == 4 else 128)) * m.scale.astype(np.float32)[..., None]
        else:
            w = m.offset.astype(np.float32)[..., None] + m.scale.astype(np.float32)[..., None] * c
        return w.reshape(m.codes.shape)

    def info(self) -> dict:
        return {"gguf_moved": self.moved, "gguf_requantized": self.requantized}
