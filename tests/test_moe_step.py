"""Routed experts (Qwen3-MoE) in the compiled decode step (csrc/qlinear/llm/moe.h): its logits are
the Python path's bit for bit (the Python blocks with the experts in numpy, routed by the same
compiled op), over shapes, top-k, norm_topk_prob on and off and tied router scores, at every ISA
level; a batched step's rows are the single sequences' steps; a prompt's rows grouped by expert
are the rows alone, whatever the threads."""

import dataclasses

import numpy as np
import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("torch")
pytest.importorskip("transformers")

import qlinear  # noqa: E402
from qlinear import _core, llm  # noqa: E402
from qlinear.llm import synthetic  # noqa: E402
from qlinear.llm.runtime.moe import MoeBlock  # noqa: E402

BASE = dict(arch="qwen3_moe", hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=512)
CASES = {  # experts of intermediate_size / 2
    "e8k2": dict(num_experts=8, num_experts_per_tok=2, norm_topk_prob=True),
    "e8k2_raw": dict(num_experts=8, num_experts_per_tok=2, norm_topk_prob=False),
    "e16k4_h96": dict(num_experts=16, num_experts_per_tok=4, norm_topk_prob=True, hidden_size=96,
                      intermediate_size=128, num_hidden_layers=3),
    "e4k1": dict(num_experts=4, num_experts_per_tok=1, norm_topk_prob=False),
    "e5k5": dict(num_experts=5, num_experts_per_tok=5, norm_topk_prob=False),  # every expert, k = E
}
PROMPT = [5, 17, 99, 3, 250, 41, 8, 77, 120, 9, 300, 64]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("moe")
    return {name: synthetic.make_checkpoint(root / name, seed=3, norm_noise=0.1, tokenizer_vocab=300,
                                            **{**BASE, **extra})
            for name, extra in CASES.items()}


def _load(path, bits, act, group=32):
    model = llm.load(path, bits=bits, group_size=group, act=act, max_context=64, progress=False)
    assert all(isinstance(b, MoeBlock) and b.core_moe is not None for b in model.blocks)
    return model


def _tie(model):
    """Router rows 1 and 2 made equal to row 0 (the same logits: ties at every rank)."""
    for b in model.blocks:
        b._router_w[1] = b._router_w[0]
        b._router_w[2] = b._router_w[0]


def _decode(model, steps=10):
    """Greedy decode after PROMPT (its prefill through the blocks): the logits of every step."""
    model.reset()
    model._forward(PROMPT, 0)
    out, token = [], 7
    for j in range(steps):
        logits = model._forward([token], len(PROMPT) + j)
        out.append(logits)
        token = int(logits.argmax())
    return out


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("bits, act, tie", [(4, "int8", False), (8, "int8", True), (4, "float", False)])
def test_compiled_step_equals_python_path(checkpoints, isa, case, bits, act, tie, monkeypatch):
    model = _load(checkpoints[case], bits, act)
    if tie:
        _tie(model)
    step = model._compiled_step()
    assert step is not None
    compiled = _decode(model)
    python = model.fork()
    python.compiled_decode = False
    with_core = _decode(python)
    for b in model.blocks:  # the experts in numpy: Linear calls, np.add.at in ascending expert order
        monkeypatch.setattr(b, "core_moe", None)
    in_numpy = _decode(python)
    for a, b, c in zip(compiled, with_core, in_numpy):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)


def test_ties_go_to_the_lower_expert(checkpoints):
    model = _load(checkpoints["e8k2"], 4, "int8")
    _tie(model)
    x = np.random.default_rng(0).standard_normal((200, 64)).astype(np.float32)
    top, w = model.blocks[0].route(x)
    first = np.isin(top, [0, 1, 2])
    # experts 0, 1, 2 score alike: a row takes them in that order, the lower ones first
    for row, mask in zip(top, first):
        chosen = row[mask].tolist()
        assert chosen == sorted(chosen) == list(range(len(chosen)))
        if chosen:
            assert np.all(np.diff(np.flatnonzero(mask)) == 1)  # consecutive ranks
    assert first.any() and (top == 1).any()


@pytest.mark.parametrize("k, norm", [(1, False), (3, True), (3, False), (8, True)])
def test_route_is_the_softmax_top_k(k, norm):
    rng = np.random.default_rng(k)
    x = rng.standard_normal((64, 40)).astype(np.float32)
    router = rng.standard_normal((8, 40)).astype(np.float32)
    top, w = _core.moe_route(x, router, None, k, norm)
    logits = x.astype(np.float64) @ router.T.astype(np.float64)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    want = np.argsort(-p, axis=-1, kind="stable")[:, :k]
    np.testing.assert_array_equal(top, want)
    ww = np.take_along_axis(p, want, -1)
    if norm:
        ww /= ww.sum(-1, keepdims=True)
    np.testing.assert_allclose(w, ww, rtol=1e-5)
    assert top.dtype == np.int32 and w.dtype == np.float32


@pytest.mark.parametrize("bits, act", [(4, "int8"), (8, "float")])
def test_batched_step_rows_equal_single_sequences(checkpoints, bits, act):
    model = _load(checkpoints["e16k4_h96"], bits, act)
    prompts = [PROMPT, PROMPT[3:], [44, 45, 46], PROMPT[::-1]]
    tokens = [7, 200, 31, 7]
    singles, forks = [], []
    for p, t in zip(prompts, tokens):
        f = model.fork()
        f._forward(p, 0)
        g = model.fork()
        g._forward(p, 0)
        singles.append(f._forward([t], len(p)))
        forks.append(g)
    h = np.ascontiguousarray(model.embedding(tokens), np.float32)
    step = model._compiled_step()
    moe = model.blocks[0].core_moe
    before = moe.bytes_read
    logits = step.step_batch(h, [len(p) for p in prompts], [list(f.cache.k) for f in forks],
                             [list(f.cache.v) for f in forks], [64] * len(forks))
    for i, want in enumerate(singles):
        np.testing.assert_array_equal(logits[i:i + 1], want)
    one_row = sum(g.weight.nbytes + d.weight.nbytes for g, d in model.blocks[0].experts[:4])
    assert moe.bytes_read - before > one_row  # the rows chose different experts (each GEMM once)
    assert moe.bytes_read - before <= model.blocks[0].expert_bytes


@pytest.mark.parametrize("bits", [4, 8])
def test_prompt_rows_grouped_by_expert_are_the_rows_alone(checkpoints, bits):
    model = _load(checkpoints["e16k4_h96"], bits, "int8")
    moe = model.blocks[1].core_moe
    x = np.random.default_rng(1).standard_normal((70, 96)).astype(np.float32)
    threads = qlinear.get_num_threads()
    try:
        outs = []
        for n in (1, 2):
            qlinear.set_num_threads(n)
            outs.append(moe(x))
        alone = np.concatenate([moe(x[r:r + 1]) for r in range(len(x))])
    finally:
        qlinear.set_num_threads(threads)
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[0], alone)


def test_bad_routing_is_refused(checkpoints):
    model = _load(checkpoints["e8k2"], 4, "int8")
    b = model.blocks[0]
    x = np.zeros((1, 64), np.float32)
    with pytest.raises(ValueError, match="top_k 9 must be in 1..8"):
        _core.moe_route(x, b._router_w, None, 9, False)
    with pytest.raises(ValueError, match="top_k 0"):
        _core.moe_route(x, b._router_w, None, 0, False)
    gate_up = [(g.weight._h, None, True, 64) for g, _ in b.experts]
    with pytest.raises(ValueError, match="expert 0 down: weight has shape"):
        _core.moe_layer(b._router_w, None, list(zip(gate_up, gate_up)), 2, True)
    with pytest.raises(ValueError, match="7 experts given, the router has 8"):
        _core.moe_layer(b._router_w, None, [(None, None)] * 7, 2, True)
    cfg = b.cfg
    with pytest.raises(ValueError, match="the config has 8 experts, the block 7"):
        MoeBlock(cfg, b.attention, b.router, b.experts[:7], b.input_norm, b.post_norm)
    with pytest.raises(ValueError, match="experts_per_token 9 must be in 1..8"):
        MoeBlock(dataclasses.replace(cfg, experts_per_token=9), b.attention, b.router, b.experts,
                 b.input_norm, b.post_norm)


def _slots(block, order):
    """_core.moe_experts over slots holding block's experts in ``order`` (slot i: expert order[i])."""
    def spec(m):
        return (m.weight._h, None, m.act == "int8", int(m._block))
    cfg = block.cfg
    return _core.moe_experts([(spec(block.experts[e][0]), spec(block.experts[e][1])) for e in order],
                             cfg.num_experts, cfg.experts_per_token)


@pytest.mark.parametrize("bits, act, rows", [(4, "int8", 1), (4, "int8", 70), (8, "float", 5)])
def test_experts_run_from_slots_in_any_grouping_equal_the_layer(checkpoints, bits, act, rows):
    """The flash path's routed MLP (experts run as their slots fill, in any order and grouping)
    gives the in-memory MoeLayer's bits, at 1 and 2 threads."""
    model = _load(checkpoints["e16k4_h96"], bits, act)
    b = model.blocks[1]
    rng = np.random.default_rng(rows)
    order = rng.permutation(16)
    core, slot_of = _slots(b, order), {int(e): i for i, e in enumerate(order)}
    x = rng.standard_normal((rows, 96)).astype(np.float32)
    top, w = b.route(x)
    threads = qlinear.get_num_threads()
    try:
        for n in (1, 2):
            qlinear.set_num_threads(n)
            want = b.core_moe(x)
            for _ in range(3):
                core.begin(x, top, w)
                used = [int(e) for e in rng.permutation(np.unique(top))]
                cuts = sorted(rng.choice(np.arange(1, len(used)), min(2, len(used) - 1), replace=False)) \
                    if len(used) > 1 else []
                for group in np.split(np.array(used), cuts):
                    core.run([int(e) for e in group], [slot_of[int(e)] for e in group])
                np.testing.assert_array_equal(core.finish(), want)
    finally:
        qlinear.set_num_threads(threads)


def test_experts_from_slots_refuse_misuse(checkpoints):
    model = _load(checkpoints["e8k2"], 4, "int8")
    b = model.blocks[0]
    core = _slots(b, range(8))
    x = np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32)
    top, w = b.route(x)
    with pytest.raises(ValueError, match="no rows begun"):
        core.run([0], [0])
    with pytest.raises(ValueError, match="no rows begun"):
        core.finish()
    with pytest.raises(TypeError, match="top must be an integer array"):
        core.begin(x, top.astype(np.float32), w)
    with pytest.raises(ValueError, match=r"top must be \[3, 2\]"):
        core.begin(x, top[:2], w)
    with pytest.raises(ValueError, match="top names expert 8 of 8"):
        core.begin(x, np.full_like(top, 8), w)
    with pytest.raises(ValueError, match="x"):
        core.begin(x[:, :10], top, w)
    core.begin(x, top, w)
    used = [int(e) for e in np.unique(top)]
    unused = next(e for e in range(8) if e not in used)
    with pytest.raises(ValueError, match=f"expert {unused} is not one the rows chose"):
        core.run([unused], [0])
    with pytest.raises(ValueError, match="slot 8 of 8"):
        core.run([used[0]], [8])
    with pytest.raises(ValueError, match="2 experts but 1 slots"):
        core.run(used[:2], [0])
    with pytest.raises(ValueError, match=f"expert {used[0]} given twice"):
        core.run([used[0], used[0]], [0, 1])
    with pytest.raises(ValueError, match="slot -1 of 8"):
        core.run([used[1], used[0]], [used[1], -1])   # refused whole: used[1] still to run
    core.run([used[0]], [used[0]])
    with pytest.raises(ValueError, match=f"expert {used[0]} is not one the rows chose and has not run"):
        core.run([used[0]], [used[0]])   # twice
    with pytest.raises(ValueError, match=f"expert {used[1]} has not run"):
        core.finish()
    spec = (b.experts[0][0].weight._h, None, True, 64)
    with pytest.raises(ValueError, match="slot 0 down: weight has shape"):
        _core.moe_experts([(spec, spec)], 8, 2)
    with pytest.raises(TypeError, match="slot 0 must be a tuple"):
        _core.moe_experts([spec], 8, 2)
    with pytest.raises(ValueError, match="top_k 9 must be in 1..8"):
        _core.moe_experts([(spec, (b.experts[0][1].weight._h, None, True, 64))], 8, 9)
    with pytest.raises(ValueError, match="none given"):
        _core.moe_experts([], 8, 2)
