"""A numpy forward of a Qwen2/Llama decoder from an MNN export, for tests only.

Weights are the export's records dequantized to float32 (``w = lo + scale * code``, as MNN
computes them); activations in float64. RMSNorm, RoPE (the export's own inverse frequencies, in
the rotate-half layout of Hugging Face), grouped-query causal attention, SwiGLU MLP.
"""

import numpy as np


def _weight(linear):
    w = linear.dequantize() if hasattr(linear, "dequantize") else np.asarray(linear, np.float32)
    return w.astype(np.float64), getattr(linear, "bias", None)


def _quantize_rows(x, block):
    """Dynamic int8 absmax quantization of activations (per row, or per row and k-block)."""
    t, k = x.shape
    blk = k if block is None else block
    xb = x.reshape(t, k // blk, blk)
    s = np.abs(xb).max(-1, keepdims=True) / 127.0
    q = np.where(s > 0, np.rint(xb / np.where(s > 0, s, 1)), 0)
    return (q * s).reshape(t, k)


def _linear(x, linear, act=False):
    w, b = _weight(linear)
    if act:
        x = _quantize_rows(x, None if act == "row" else getattr(linear, "group_size", None))
    y = x @ w.T
    return y if b is None else y + b


def _rms_norm(x, g, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * g


def _rope(x, cos, sin):
    half = x.shape[-1] // 2
    rot = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rot * sin


def forward(export, ids, act=False):
    """Logits float64 [len(ids), vocab] of ``export`` (an ``MnnExport``) on token ids (teacher forcing).

    ``act``: False (float activations), "row" or "block" (int8 activations per row, or per row and
    weight block, quantized before every linear layer)."""
    cfg = export.config
    n_heads, n_kv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps = cfg["rms_norm_eps"]
    t = len(ids)
    x = export.embed(ids).astype(np.float64)
    inv_freq = np.asarray(export.rope_inv_freq, np.float64)
    ang = np.arange(t, dtype=np.float64)[:, None] * inv_freq[None, :]
    ang = np.concatenate([ang, ang], axis=-1)            # [t, hd]
    cos, sin = np.cos(ang)[None], np.sin(ang)[None]      # [1, t, hd]
    mask = np.triu(np.full((t, t), -np.inf), k=1)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = _rms_norm(x, export.norms[p + "input_layernorm"], eps)
        q = _linear(h, export.linears[p + "self_attn.q_proj"], act).reshape(t, n_heads, hd).transpose(1, 0, 2)
        k = _linear(h, export.linears[p + "self_attn.k_proj"], act).reshape(t, n_kv, hd).transpose(1, 0, 2)
        v = _linear(h, export.linears[p + "self_attn.v_proj"], act).reshape(t, n_kv, hd).transpose(1, 0, 2)
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        rep = n_heads // n_kv
        k, v = np.repeat(k, rep, axis=0), np.repeat(v, rep, axis=0)
        s = q @ k.transpose(0, 2, 1) / np.sqrt(hd) + mask
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        a = (s @ v).transpose(1, 0, 2).reshape(t, n_heads * hd)
        x = x + _linear(a, export.linears[p + "self_attn.o_proj"], act)
        h = _rms_norm(x, export.norms[p + "post_attention_layernorm"], eps)
        g = _linear(h, export.linears[p + "mlp.gate_proj"], act)
        u = _linear(h, export.linears[p + "mlp.up_proj"], act)
        x = x + _linear(g / (1.0 + np.exp(-g)) * u, export.linears[p + "mlp.down_proj"], act)
    x = _rms_norm(x, export.norms["model.norm"], eps)
    return _linear(x, export.linears["lm_head"], act)


def compare(a, b):
    """(mean cosine over positions, min cosine, top-1 agreement) of two [T, vocab] logit arrays."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    cos = (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))
    top1 = float(np.mean(a.argmax(-1) == b.argmax(-1)))
    return float(cos.mean()), float(cos.min()), top1


def transformers_logits(checkpoints: dict) -> tuple:
    """(ids, {name: transformers' fp32 logits}) for a fixed 80-token sequence per checkpoint."""
    import torch
    import transformers

    ids = [int(t) for t in np.random.default_rng(7).integers(0, 1000, 80)]
    out = {}
    for name, path in checkpoints.items():
        model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        with torch.no_grad():
            out[name] = model(torch.tensor([ids])).logits[0].numpy()
    return ids, out


def cosines(a, b):
    return np.sum(a * b, 1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def assert_compiled_step_equals_python(load, ids, layers):
    """Two models of ``load()``, one on the compiled decode step, one on the Python blocks, after a
    prefill of ids[:40]: the same logits bit for bit for one-token steps at 40..51 and a verify
    block of 52..56, and the same caches (a stateful layer's states, else its KV rows)."""
    models = [load() for _ in range(2)]
    models[1].compiled_decode = False
    for m in models:
        m.prefill(ids[:40])
    for j, t in enumerate(ids[40:52]):
        a, b = (m._forward([t], 40 + j) for m in models)
        np.testing.assert_array_equal(a, b)
    assert models[0]._step is not None and models[1]._step is None
    a, b = (m.verify(ids[52:57], 52) for m in models)
    np.testing.assert_array_equal(a, b)
    for i in range(layers):
        for x, y in zip(*(m.cache.states[i] or (m.cache.k[i], m.cache.v[i]) for m in models)):
            np.testing.assert_array_equal(x, y)


def assert_prefix_reuse_equals_fresh(load, ids, monkeypatch, cuts=(7, 64, 100), kept=140):
    """A prefill cut into forwards anywhere (sliding rings wrapped between cuts) and a prefix
    restored from the store give one pass's logits bit for bit. ``load()``: a fresh model of
    max_context 512; ``ids``: at least ``kept`` + 50 tokens."""
    from qlinear.llm.runtime import prefix_cache  # noqa: PLC0415

    model = load()
    one = model.logits(ids)
    for cut in cuts:
        monkeypatch.setattr(prefix_cache, "PREFILL_CHUNK", cut)
        np.testing.assert_array_equal(model.logits(ids), one)
    monkeypatch.undo()
    store = prefix_cache.PrefixCache(64)
    model.prefill_into(model.new_cache(512), ids[:kept], 0, store)
    second = ids[:kept] + ids[10:60]
    cache = model.new_cache(512)
    assert store.restore(cache, second) == kept  # the first prompt's rows, the rings' included
    np.testing.assert_array_equal(model.prefill_into(cache, second, kept, store)[0], load().prefill(second))
