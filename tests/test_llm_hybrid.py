"""Hybrid models (Qwen3.5 dense and MoE: Gated DeltaNet layers beside gated attention; LFM2: short
convolutions beside attention) on small random checkpoints written here (``synthetic``;
transformers 4.x has no class for Qwen3.5, its LFM2 is checked in test_llm_archs.py): their
logits against transformers 5.x (the tests that need it skip without it, and fail so with
QLINEAR_REQUIRE_TRANSFORMERS5=1, as CI's transformers-5 environment sets), the recurrent state's
rules (docs/semantics.md, "Recurrent state"), and what a hostile file gets."""

import json
import shutil

import numpy as np
import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("safetensors")

from _llm_reference import assert_compiled_step_equals_python  # noqa: E402
from qlinear import llm  # noqa: E402
from qlinear import _core  # noqa: E402
from qlinear.llm import synthetic  # noqa: E402
from qlinear.llm.runtime import delta_net, prefix_cache  # noqa: E402
from qlinear.llm.runtime.speculative import Speculation  # noqa: E402

SHAPE = dict(hidden_size=128, intermediate_size=352, num_attention_heads=4, num_key_value_heads=2,
             num_hidden_layers=4, vocab_size=1024)  # layers 0-2 Gated DeltaNet, layer 3 attention
FORMS = {"qwen3_5": ("qwen3_5", {}), "qwen3_5_moe": ("qwen3_5_moe", {}),
         "qwen3_5_multimodal": ("qwen3_5", {"multimodal": True}),
         "qwen3_5_moe_multimodal": ("qwen3_5_moe", {"multimodal": True}),
         "lfm2": ("lfm2", {})}  # layers 1 and 3 attend (synthetic's LFM2)
STATEFUL = ["qwen3_5", "qwen3_5_moe", "lfm2"]
IDS = [int(t) for t in np.random.default_rng(7).integers(0, 1000, 150)]  # three chunks of 64


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("hybrid")
    out = {name: synthetic.make_checkpoint(root / name, arch, seed=0, norm_noise=0.1, **SHAPE, **extra)
           for name, (arch, extra) in FORMS.items()}
    out["lfm2_other"] = synthetic.make_checkpoint(root / "lfm2_other", "lfm2", seed=1, norm_noise=0.1, **SHAPE)
    return out


def reference_logits(transformers5, path, ids):
    torch, transformers = transformers5
    cfg = json.loads((path / "config.json").read_text())
    auto = transformers.AutoModelForImageTextToText if "text_config" in cfg else transformers.AutoModelForCausalLM
    model = auto.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


def cosines(a, b):
    return np.sum(a * b, 1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


@pytest.mark.parametrize("form", list(FORMS))
def test_float_weights_match_transformers(checkpoints, transformers5, form):
    """150 positions: three 64-chunks of the delta rule's prefill (the last one partial)."""
    ref = reference_logits(transformers5, checkpoints[form], IDS)
    out = llm.load(checkpoints[form], bits=None, act="float", max_context=256, progress=False).logits(IDS)
    assert np.abs(out - ref).max() <= 1e-4 * np.abs(ref).max()


# Against the float path (which matches transformers above), mean cosine over 150 positions,
# checkpoint seeds 0-4: dense int8 0.9990-0.9993, W4A8 g64 0.918-0.928; MoE int8 0.990-0.995 (router
# near-ties flipped by the rounding, as Mixtral's), W4A8 0.90-0.93. Random weights make the
# delta layers' q / k / v / z projections the sensitive ones: keeping delta_in in float lifts
# W4A8 to 0.968, the other projections move it by < 0.01.
MIN_COS = {("qwen3_5", 8): 0.999, ("qwen3_5", 4): 0.91, ("qwen3_5_moe", 8): 0.988, ("qwen3_5_moe", 4): 0.89}


@pytest.mark.parametrize("form", ["qwen3_5", "qwen3_5_moe"])
@pytest.mark.parametrize("bits", [8, 4])
def test_quantized_logits_stay_close(checkpoints, form, bits):
    ref = llm.load(checkpoints[form], bits=None, act="float", max_context=256, progress=False).logits(IDS)
    model = llm.load(checkpoints[form], bits=bits, group_size=64, act="int8", max_context=256, progress=False)
    assert cosines(model.logits(IDS), ref).mean() >= MIN_COS[(form, bits)]


def test_text_only_and_multimodal_forms_are_one_model(checkpoints):
    """The published multimodal form (text_config, model.language_model. tensors, an MTP head
    beside them) loads as the text-only checkpoint of the same weights does, bit for bit."""
    for text, multi in (("qwen3_5", "qwen3_5_multimodal"), ("qwen3_5_moe", "qwen3_5_moe_multimodal")):
        a = llm.load(checkpoints[text], bits=4, max_context=128, progress=False)
        b = llm.load(checkpoints[multi], bits=4, max_context=128, progress=False)
        assert a.config == b.config
        np.testing.assert_array_equal(a.logits(IDS[:40]), b.logits(IDS[:40]))


@pytest.mark.parametrize("form", STATEFUL)
def test_decode_with_state_equals_full_forward(checkpoints, form):
    """Greedy tokens decoded one at a time (the recurrent form) are the argmax of the
    teacher-forced logits (the chunked form); the cache holds no rows for the stateful layers."""
    model = llm.load(checkpoints[form], bits=4, max_context=256, progress=False)
    model.tokenizer.stop_ids = set()
    rows = {"lfm2": [0, 256, 0, 256]}.get(form, [0, 0, 0, 256])
    assert [model.cache.k[i].shape[1] for i in range(4)] == rows
    gen = model.generate_ids(IDS[:20], 30)
    assert len(gen) == 30
    full = model.logits(IDS[:20] + gen)
    assert full[19:-1].argmax(-1).tolist() == gen
    model.reset()
    assert model.generate_ids(IDS[:20], 30) == gen  # reset zeroed the states



# -- numpy references of the delta rule's forms ----------------------------------------------------
CHUNK = 64


def conv_inputs(layer, y, conv_state):
    """The conv, SiLU and norms of rows y (numpy): q, k [v_heads, n, dk], v [v_heads, n, dv], beta,
    g [n, v_heads], z [n, vd]; conv_state updated."""
    cfg = layer.cfg
    n, C, K = y.shape[0], cfg.delta_conv_dim, cfg.conv_kernel
    nk, nv, dk, dv = cfg.delta_k_heads, cfg.delta_v_heads, cfg.delta_k_dim, cfg.delta_v_dim
    vd = nv * dv
    window = np.concatenate([conv_state, y[:, :C]])
    acc = window[0:n] * layer.conv[0]
    for j in range(1, K):
        acc += window[j:j + n] * layer.conv[j]
    conv_state[:] = window[n:]
    h = acc / (1 + np.exp(-acc))
    l2 = lambda x: x / np.sqrt(np.sum(x * x, -1, keepdims=True) + np.float32(1e-6))  # noqa: E731
    q = l2(h[:, :nk * dk].reshape(n, nk, dk)) * np.float32(dk ** -0.5)
    k = l2(h[:, nk * dk:2 * nk * dk].reshape(n, nk, dk))
    v = h[:, 2 * nk * dk:].reshape(n, nv, dv)
    spread = (lambda x: np.tile(x, (1, nv // nk, 1))) if cfg.delta_tiled_heads else \
        (lambda x: np.repeat(x, nv // nk, axis=1))
    q, k = spread(q), spread(k)
    b, a = y[:, C + vd:C + vd + nv], y[:, C + vd + nv:]
    beta = 1 / (1 + np.exp(-b))
    g = layer.neg_a * np.logaddexp(0, a + layer.dt_bias)
    return (q.transpose(1, 0, 2).astype(np.float32), k.transpose(1, 0, 2).astype(np.float32),
            v.transpose(1, 0, 2).astype(np.float32), beta.astype(np.float32), g.astype(np.float32), y[:, C:C + vd])


def gated_readout(layer, o, z):
    cfg = layer.cfg
    n = o.shape[0]
    o = o.reshape(n, cfg.delta_v_heads, cfg.delta_v_dim)
    o = o / np.sqrt(np.mean(o * o, -1, keepdims=True) + np.float32(cfg.rms_norm_eps)) * layer.norm
    return o.reshape(n, -1) * (z / (1 + np.exp(-z)))


def chunked(state: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray, beta: np.ndarray,
            g: np.ndarray, start: int) -> np.ndarray:
    """The delta rule over positions start.. in chunks cut at multiples of CHUNK (absolute), each
    chunk in the WY / UT form; ``state`` updated in place; the readout [n, h * dv]."""
    h, n, dv = v.shape
    out = np.empty((h, n, dv), np.float32)
    cuts = [0] + [c - start for c in range((start // CHUNK + 1) * CHUNK, start + n, CHUNK)] + [n]
    for a, b in zip(cuts[:-1], cuts[1:]):
        out[:, a:b] = _chunk(state, q[:, a:b], k[:, a:b], v[:, a:b], beta[a:b].T, g[a:b].T)
    return out.transpose(1, 0, 2).reshape(n, h * dv)


def _chunk(state, q, k, v, beta, g):
    """One chunk of L positions: q, k [h, L, dk], v [h, L, dv], beta, g [h, L]."""
    L = q.shape[1]
    G = np.cumsum(g, axis=1)                                        # log decay from the chunk's start
    lower = np.tril(np.ones((L, L), bool))
    decay = np.exp(np.where(lower, G[:, :, None] - G[:, None, :], -np.inf)).astype(np.float32)  # i >= j
    kb = k * beta[:, :, None]
    # (I + strictly lower (beta_i k_i . k_j decay_ij)) [u, w] = [beta v, beta k exp(G)]: the updates
    # of the chunk's positions as if each saw the ones before it
    system = np.tril((kb @ k.transpose(0, 2, 1)) * decay, -1) + np.eye(L, dtype=np.float32)
    eG = np.exp(G)[:, :, None]
    uw = np.linalg.solve(system, np.concatenate([v * beta[:, :, None], kb * eG], axis=2)).astype(np.float32)
    u, w = uw[:, :, :v.shape[2]], uw[:, :, v.shape[2]:]
    new_v = u - w @ state                                           # what the state did not predict
    out = (q * eG) @ state + ((q @ k.transpose(0, 2, 1)) * decay) @ new_v
    last = G[:, -1:]
    state *= np.exp(last)[:, :, None]
    state += (k * np.exp(last - G)[:, :, None]).transpose(0, 2, 1) @ new_v
    return out


def recurrent(state, q, k, v, beta, g):
    """The delta rule position by position (numpy; the reference of both compiled forms):
    ``state`` [h, dk, dv] updated in place; the readout [n, h * dv]. q, k [h, n, dk], v [h, n, dv],
    beta, g [n, h]."""
    h, n, dv = v.shape
    out = np.empty((n, h, dv), np.float32)
    for t in range(n):
        state *= np.exp(g[t])[:, None, None]
        kt = k[:, t:t + 1]
        delta = (v[:, t] - (kt @ state)[:, 0]) * beta[t][:, None]
        state += kt.transpose(0, 2, 1) * delta[:, None, :]
        out[t] = (q[:, t:t + 1] @ state)[:, 0]
    return out.reshape(n, h * dv)


def _layer(rng, tiled, k_heads=2, v_heads=4, dk=16, dv=24, kernel=4):
    from qlinear.llm.config import ModelConfig
    from qlinear.llm.runtime.layers import Linear

    cfg = ModelConfig(arch="qwen3_5_text", hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                      num_kv_heads=1, head_dim=16, vocab_size=64, rms_norm_eps=1e-6, rope_theta=1e4,
                      max_position_embeddings=256, tie_word_embeddings=False, attention_bias=False,
                      mixers=("delta",), delta_k_heads=k_heads, delta_v_heads=v_heads, delta_k_dim=dk,
                      delta_v_dim=dv, conv_kernel=kernel, delta_tiled_heads=tiled)
    C, vd = cfg.delta_conv_dim, v_heads * dv
    eye = Linear(np.eye(C + vd + 2 * v_heads, dtype=np.float32))
    return delta_net.GatedDeltaNet(cfg, 0, eye, Linear(np.eye(vd, dtype=np.float32)),
                                   rng.standard_normal((C, 1, kernel)).astype(np.float32) * 0.5,
                                   rng.standard_normal(v_heads).astype(np.float32),
                                   -rng.uniform(0.01, 8, v_heads).astype(np.float32),
                                   1 + 0.1 * rng.standard_normal(dv).astype(np.float32))


@pytest.mark.parametrize("tiled", [False, True])
def test_compiled_token_equals_the_chunked_rule(tiled):
    """The compiled one-token step (``_core.delta_rows``: conv, norms, gates, the recurrent rule,
    the gated readout) row after row, against the numpy chunked form over the same rows (grouped
    and tiled value heads, a start off a chunk boundary): the same readouts and states to
    float32 rounding."""
    rng = np.random.default_rng(1)
    layer = _layer(rng, tiled)
    y = rng.standard_normal((100, layer.proj.shape[0])).astype(np.float32)
    shapes = delta_net.GatedDeltaNet.state_shapes(layer.cfg)
    states = [[rng.standard_normal(s).astype(np.float32) * 0.1 for s in shapes] for _ in range(2)]
    states[1] = [a.copy() for a in states[0]]
    one = np.concatenate([layer.mix(y[i:i + 1], *states[0], 37 + i) for i in range(len(y))])
    many = layer.mix(y, *states[1], 37)
    np.testing.assert_allclose(one, many, rtol=0, atol=1e-4 * np.abs(many).max())
    for a, b in zip(*states):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-4 * np.abs(b).max())


@pytest.mark.parametrize("tiled", [False, True])
def test_compiled_chunked_rule_equals_numpy(tiled):
    """The compiled prefill form (``_core.delta_chunked``) against the numpy reference (conv,
    norms, the chunked rule at absolute 64-chunks, the gated readout): the same readouts and states
    to float32 rounding, from non-zero states, starting off a chunk boundary."""
    rng = np.random.default_rng(4)
    layer = _layer(rng, tiled)
    y = rng.standard_normal((150, layer.proj.shape[0])).astype(np.float32)
    shapes = delta_net.GatedDeltaNet.state_shapes(layer.cfg)
    ours = [rng.standard_normal(s).astype(np.float32) * 0.1 for s in shapes]
    ref = [a.copy() for a in ours]
    got = _core.delta_chunked(y, 37, layer.geometry(), layer.conv, layer.dt_bias, layer.neg_a, layer.norm, *ours)
    q, k, v, beta, g, z = conv_inputs(layer, y, ref[0])
    want = gated_readout(layer, chunked(ref[1], q, k, v, beta, g, 37), z)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * np.abs(want).max())
    for a, b in zip(ours, ref):
        np.testing.assert_allclose(a, b, rtol=0, atol=2e-5 * np.abs(b).max())


def test_compiled_token_is_the_same_at_every_level():
    """delta_rows and delta_chunked give the same bits at every ISA level (their loops in one
    fixed order)."""
    import qlinear

    rng = np.random.default_rng(2)
    layer = _layer(rng, False, k_heads=2, v_heads=4, dk=32, dv=40)
    y = rng.standard_normal((70, layer.proj.shape[0])).astype(np.float32)  # (the chunked rows cross 64)
    shapes = delta_net.GatedDeltaNet.state_shapes(layer.cfg)
    results, previous = {}, qlinear.cpu_info()["active_isa"]
    for level in qlinear.cpu_info()["available_isas"]:
        qlinear.set_isa(level)
        st = [np.full(s, 0.01, np.float32) for s in shapes]
        chunked_rows = _core.delta_chunked(y[2:], 62, layer.geometry(), layer.conv, layer.dt_bias, layer.neg_a,
                                           layer.norm, *st)
        results[level] = (layer.mix(y[:1], *st, 0), layer.mix(y[1:2], *st, 1), chunked_rows, *st)
    qlinear.set_isa(previous)
    assert len(results) > 1 or results.keys() == {"scalar"}
    first = next(iter(results.values()))
    for got in results.values():
        for a, b in zip(got, first):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("form", ["qwen3_5", "qwen3_5_moe", "lfm2"])
@pytest.mark.parametrize("kv_cache", ["float32", "float16"])
def test_compiled_step_equals_the_python_blocks(checkpoints, kv_cache, form):
    """The compiled decode step (Gated DeltaNet layers and gated attention in C++; the MoE's routed
    and shared experts) gives the Python blocks' logits, states and KV rows bit for bit, one token
    at a time and as a speculative verification's block (step_block)."""
    assert_compiled_step_equals_python(
        lambda: llm.load(checkpoints[form], bits=4, max_context=256, kv_cache=kv_cache, progress=False), IDS, 4)


def test_chunked_rule_equals_recurrent_rule():
    """The two forms of the delta rule on the same inputs: the same outputs and final state to
    float32 rounding, from a non-zero state, a start off a chunk boundary, grouped heads."""
    rng = np.random.default_rng(0)
    h, n, dk, dv = 4, 150, 16, 24
    q, k = (rng.standard_normal((h, n, dk)).astype(np.float32) for _ in range(2))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    q /= np.linalg.norm(q, axis=-1, keepdims=True) * np.sqrt(dk)
    v = rng.standard_normal((h, n, dv)).astype(np.float32)
    beta = rng.uniform(0, 1, (n, h)).astype(np.float32)
    g = -rng.uniform(0, 2, (n, h)).astype(np.float32)
    s0 = rng.standard_normal((h, dk, dv)).astype(np.float32) * 0.1
    s1, s2 = s0.copy(), s0.copy()
    a = chunked(s1, q, k, v, beta, g, start=37)
    b = recurrent(s2, q, k, v, beta, g)
    np.testing.assert_allclose(a, b, rtol=0, atol=2e-5 * np.abs(b).max())
    np.testing.assert_allclose(s1, s2, rtol=0, atol=2e-5 * np.abs(s2).max())


@pytest.mark.parametrize("form", ["recurrent", "chunked"])
def test_prefill_cut_into_forwards_is_exact(checkpoints, monkeypatch, form):
    """Prefill cut into forwards gives the logits of one pass bit for bit: anywhere with the
    recurrent prefill (its rows are one-token steps), at multiples of the chunk (64, 128) with
    the chunked one (chunks sit at absolute positions)."""
    monkeypatch.setattr(delta_net.GatedDeltaNet, "prefill_form", form)
    model = llm.load(checkpoints["qwen3_5"], bits=4, max_context=256, progress=False)
    one = model.logits(IDS)
    for cut in (64, 128) if form == "chunked" else (7, 64, 100):
        monkeypatch.setattr(prefix_cache, "PREFILL_CHUNK", cut)
        np.testing.assert_array_equal(model.logits(IDS), one)


@pytest.mark.parametrize("form", ["qwen3_5", "lfm2"])
def test_rollback_replays_the_state(checkpoints, form):
    """A guarded run of 6 one-token steps rolled back to 2 of them: the states (conv inputs,
    recurrent matrices) and the next logits are those of running the 2 alone, bit for bit."""
    model = llm.load(checkpoints[form], bits=4, max_context=256, progress=False)
    model.prefill(IDS[:30])
    cache = model.cache
    cache.guard(30, 6)
    for j, t in enumerate(IDS[30:36]):
        model._forward([t], 30 + j)
    cache.rollback(32)
    after = model._forward([IDS[32]], 32)
    states = [[a.copy() for a in st] for st in cache.states if st is not None]
    twin = llm.load(checkpoints[form], bits=4, max_context=256, progress=False)
    twin.prefill(IDS[:30])
    for j, t in enumerate(IDS[30:32]):
        twin._forward([t], 30 + j)
    np.testing.assert_array_equal(twin._forward([IDS[32]], 32), after)
    for st, ref in zip(states, [st for st in twin.cache.states if st is not None]):
        for a, b in zip(st, ref):
            np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="recurrent state back to position 10"):
        cache.rollback(10)  # before the guarded run: no snapshot there


@pytest.mark.parametrize("form", STATEFUL)
def test_speculative_greedy_equals_plain(checkpoints, form):
    """Drafts of 4 from the same weights with float activations (a hybrid draft model: its own
    states guarded and rolled back too), mostly accepted, some rejected part way (the states
    rolled back to the last accepted token): the tokens of plain greedy decoding. (n-gram
    drafts never match a random model's text.)"""
    model = llm.load(checkpoints[form], bits=4, max_context=512, progress=False)
    drafts = [llm.load(checkpoints[form], bits=4, act="float", max_context=512, progress=False)]
    if form == "lfm2":  # its twin agrees on every token: a draft of other weights is rejected too
        drafts.append(llm.load(checkpoints["lfm2_other"], bits=4, max_context=512, progress=False))
    model.tokenizer.stop_ids = set()
    plain = model.generate_ids(IDS[:40], 60)
    drafted = accepted = 0
    for draft in drafts:
        spec = model.generate_ids(IDS[:40], 60, speculative=Speculation("draft", draft, max_draft=4, adaptive=False))
        assert spec == plain
        drafted, accepted = drafted + model.stats.draft_tokens, accepted + model.stats.accepted_tokens
    assert drafted > accepted > 0


@pytest.mark.parametrize("form", ["qwen3_5", "lfm2"])
def test_a_second_turn_resumes_at_the_state_snapshot(checkpoints, form):
    """A prefill keeps the states at the last multiple of 64 before its end; a next prompt that
    shares that much (a conversation's next turn: the reply's rows came from decode steps)
    resumes there: the logits and tokens of prefilling it all, bit for bit. One that departs
    before it starts from 0; one that extends a cache prefilled to its end resumes at the end."""
    model = llm.load(checkpoints[form], bits=4, max_context=512, progress=False)
    fresh = llm.load(checkpoints[form], bits=4, max_context=512, progress=False)
    model.tokenizer.stop_ids = fresh.tokenizer.stop_ids = set()
    turn = IDS[:150]
    reply = model.generate_ids(turn, 20)
    second = turn + reply + IDS[100:140]
    np.testing.assert_array_equal(model.prefill(second), fresh.prefill(second))
    assert model.stats.reused_tokens == 128
    assert model.generate_ids(second, 20) == fresh.generate_ids(second, 20)
    other = IDS[:50] + IDS[100:140]
    np.testing.assert_array_equal(model.prefill(other), fresh.prefill(other))
    assert model.stats.reused_tokens == 0
    model.logits(IDS[:64])  # prefilled to its end: resumed there
    np.testing.assert_array_equal(model.prefill(IDS[:130]), fresh.prefill(IDS[:130]))
    assert model.stats.reused_tokens == 64


@pytest.mark.parametrize("form", ["qwen3_5_moe", "lfm2"])
def test_prefix_cache_keeps_states_with_the_rows(checkpoints, form):
    """The prefix store (the server's) keeps a state snapshot with the block where a prefill's
    snapshot fell, beside the attention layers' rows: another cache resumes there exactly."""
    model = llm.load(checkpoints[form], bits=4, max_context=512, progress=False)
    fresh = llm.load(checkpoints[form], bits=4, max_context=512, progress=False)
    store = prefix_cache.PrefixCache(64)
    first = model.new_cache(512)
    model.prefill_into(first, IDS[:140], 0, store)
    assert store.nbytes > sum(a.nbytes for st in first.states if st is not None for a in st)
    ids = IDS[:140] + IDS[10:60]
    cache = model.new_cache(512)
    start = store.restore(cache, ids)
    assert start == 128
    np.testing.assert_array_equal(model.prefill_into(cache, ids, start, store)[0], fresh.prefill(ids))


def test_converted_model_equals_the_checkpoint(checkpoints, tmp_path):
    from qlinear.llm.converted.convert import convert

    for form in ("qwen3_5", "qwen3_5_moe_multimodal", "lfm2"):
        out = convert(checkpoints[form], tmp_path / form, bits=4, progress=False)
        a = llm.load(out, max_context=256, progress=False).logits(IDS)
        b = llm.load(checkpoints[form], bits=4, max_context=256, progress=False).logits(IDS)
        np.testing.assert_array_equal(a, b)


# -- hostile files ---------------------------------------------------------------------------------
def _edit(src, dst, config=None, drop=(), reshape=None):
    from safetensors.numpy import load_file, save_file

    shutil.copytree(src, dst)
    if config is not None:
        cfg = json.loads((dst / "config.json").read_text())
        config(cfg)
        (dst / "config.json").write_text(json.dumps(cfg))
    if drop or reshape:
        w = load_file(str(dst / "model.safetensors"))
        for name in drop:
            del w[name]
        for name, shape in (reshape or {}).items():
            w[name] = np.zeros(shape, np.float32)
        save_file(w, str(dst / "model.safetensors"))
    return dst


HOSTILE = {
    "layer_types_length": (dict(config=lambda c: c["layer_types"].pop()), "layer_types must list 4"),
    "layer_types_value": (dict(config=lambda c: c["layer_types"].__setitem__(0, "mamba")), "layer_types must list"),
    "heads": (dict(config=lambda c: c.__setitem__("linear_num_value_heads", 3)), "not a multiple of"),
    "rotary": (dict(config=lambda c: c["rope_parameters"].__setitem__("partial_rotary_factor", 1.5)),
               "partial_rotary_factor"),
    "conv_missing": (dict(drop=["model.layers.1.linear_attn.conv1d.weight"]), "conv1d.weight"),
    "decay_missing": (dict(drop=["model.layers.0.linear_attn.A_log"]), "A_log"),
    "conv_shape": (dict(reshape={"model.layers.2.linear_attn.conv1d.weight": (256, 1, 3)}), "layers.2.conv"),
    "state_shape": (dict(config=lambda c: c.__setitem__("linear_value_head_dim", 8)), "has shape"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_files_are_refused(checkpoints, tmp_path, case):
    edits, match = HOSTILE[case]
    path = _edit(checkpoints["qwen3_5"], tmp_path / case, **edits)
    with pytest.raises(ValueError, match=match):
        llm.load(path, bits=4, max_context=64, progress=False)


def test_multimodal_config_without_text_config_is_refused(checkpoints, tmp_path):
    path = _edit(checkpoints["qwen3_5_multimodal"], tmp_path / "m", config=lambda c: c.pop("text_config"))
    with pytest.raises(ValueError, match="text_config"):
        llm.load(path, bits=4, max_context=64, progress=False)


def test_flash_is_refused_by_name(checkpoints, tmp_path):
    """memory='flash' (weights read from disk per forward) does not run hybrids yet: a clear error
    from convert(flash=True) and from load, not a failure inside."""
    from qlinear.llm.converted.convert import convert

    with pytest.raises(ValueError, match="hybrid"):
        convert(checkpoints["qwen3_5_moe"], tmp_path / "f", bits=4, progress=False, flash=True)
    plain = convert(checkpoints["qwen3_5_moe"], tmp_path / "p", bits=4, progress=False)
    with pytest.raises(ValueError, match="memory='flash' is not supported for hybrid"):
        llm.load(plain, memory="flash", max_context=64, progress=False)

