"""llm.perplexity: sliding-window perplexity against transformers, token by token; the KL
divergence from a base model (or its saved log-probabilities) against torch on the same logits."""

import math

import numpy as np
import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from qlinear import llm  # noqa: E402
from qlinear.llm.cli import main as cli  # noqa: E402
from qlinear.llm.perplexity import windows  # noqa: E402
from qlinear.llm.synthetic import make_checkpoint  # noqa: E402

SHAPE = dict(hidden_size=64, intermediate_size=176, num_attention_heads=4, num_key_value_heads=2,
             num_hidden_layers=2, vocab_size=512)
N = 70


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("ppl") / "hf", shape="tiny", seed=2, **SHAPE)


@pytest.fixture(scope="module")
def ids():
    return [int(t) for t in np.random.default_rng(5).integers(0, SHAPE["vocab_size"], N)]


def reference_nll(ckpt, ids, window, stride):
    """Token by token with transformers: token t (t >= 1) is scored once, by the first window
    (starts 0, stride, ...; ``window`` long) that reaches past it, from that window's start."""
    model = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float64).eval()
    starts = list(range(0, len(ids), stride))
    total = 0.0
    with torch.no_grad():
        for t in range(1, len(ids)):
            begin = next(s for s in starts if min(s + window, len(ids)) > t)
            logp = torch.log_softmax(model(torch.tensor([ids[begin:t]])).logits[0, -1], -1)
            total -= float(logp[ids[t]])
    return total / (len(ids) - 1)


@pytest.mark.parametrize("window, stride", [(16, 8), (24, 23), (32, 5), (N + 10, 4)])
def test_float_model_matches_transformers_token_by_token(ckpt, ids, window, stride):
    model = llm.load(ckpt, bits=None, act="float", progress=False)
    res = llm.perplexity(model, ids, window=window, stride=stride)
    want = reference_nll(ckpt, ids, window, stride)
    assert res.tokens == N - 1
    assert abs(res.nll - want) < 1e-4 * want
    assert res.perplexity == pytest.approx(math.exp(want), rel=1e-4)
    assert res.forward_tokens == sum(e - b for b, e, _ in windows(N, window, stride)) and res.tok_s > 0


@pytest.mark.parametrize("n, window, stride", [(70, 16, 8), (64, 16, 15), (65, 16, 15), (5, 16, 3), (40, 7, 1), (9, 2, 1)])
def test_windows_score_every_token_once_with_context(n, window, stride):
    scored = []
    for begin, end, first in windows(n, window, stride):
        assert end - begin <= window and begin < first
        assert begin == 0 or first - begin >= window - stride  # context before the first scored token
        scored += range(first, end)
    assert scored == list(range(1, n))


def test_quantized_model_moves_perplexity_and_text_input(ckpt, ids):
    """A text is encoded with the model's tokenizer; int4 moves the figure, int8 barely."""
    f = llm.load(ckpt, bits=None, act="float", progress=False)
    text = "def add(a, b):\n    return a + b\n" * 6
    assert llm.perplexity(f, text, 16, 8).nll == llm.perplexity(f, f.tokenizer.encode(text), 16, 8).nll
    ref = llm.perplexity(f, ids, 32, 16).nll
    q8 = llm.perplexity(llm.load(ckpt, bits=8, progress=False), ids, 32, 16).nll
    q4 = llm.perplexity(llm.load(ckpt, bits=4, progress=False), ids, 32, 16).nll
    assert abs(q8 - ref) < abs(q4 - ref) and abs(q4 - ref) > 0


@pytest.mark.parametrize("kwargs, match", [
    (dict(window=1, stride=1), "window must be >= 2"),
    (dict(window=16, stride=16), "must be smaller than window"),
    (dict(window=0, stride=1), "window must be a positive int"),
    (dict(window=16, stride=0), "stride must be a positive int"),
    (dict(window=128, stride=8), "exceeds the model's context"),
])
def test_bad_arguments(ckpt, ids, kwargs, match):
    model = llm.load(ckpt, bits=None, act="float", max_context=64, progress=False)
    with pytest.raises(ValueError, match=match):
        llm.perplexity(model, ids, **kwargs)
    with pytest.raises(ValueError, match="at least 2 tokens"):
        llm.perplexity(model, ids[:1], window=16, stride=8)
    with pytest.raises(TypeError, match="1-D sequence of ints"):
        llm.perplexity(model, [[1, 2], [3, 4]], window=16, stride=8)


def test_cli(ckpt, tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text("import os\nprint(os.getcwd())\n" * 20)
    cli(["perplexity", str(ckpt), str(text), "--window", "32", "--stride", "16", "--bits", "none", "--act", "float"])
    out = capsys.readouterr().out
    model = llm.load(ckpt, bits=None, act="float", progress=False)
    want = llm.perplexity(model, text.read_text(), 32, 16)
    assert f"perplexity {want.perplexity:.4f}" in out and "tok/s" in out
    with pytest.raises(SystemExit, match="cannot read"):
        cli(["perplexity", str(ckpt), str(tmp_path / "missing.txt")])


@pytest.mark.parametrize("n, window", [(70, 16), (64, 16), (15, 16), (33, 2)])
def test_chunks_are_llama_perplexitys(n, window):
    """Non-overlapping chunks, a partial last one dropped, each scoring its second half."""
    spans = windows(n, window, 1, scheme="chunks")
    assert [b for b, _, _ in spans] == list(range(0, n - window + 1, window))
    for begin, end, first in spans:
        assert end - begin == window and first == begin + window // 2 + 1


def torch_reference(model, base, ids, window, stride, scheme):
    """Mean nll, per-token KL(base || model) and top-1 agreement from the two models' logits over
    the same windows, by torch."""
    nll, kld, same = [], [], []
    for begin, end, first in windows(len(ids), window, stride, scheme):
        lo, hi = first - 1 - begin, end - 1 - begin
        q = torch.log_softmax(torch.from_numpy(model.logits(ids[begin:end])[lo:hi]).double(), -1)
        p = torch.log_softmax(torch.from_numpy(base.logits(ids[begin:end])[lo:hi]).double(), -1)
        target = torch.tensor(ids[first:end])
        nll.append(-q[torch.arange(len(q)), target])
        kld.append(torch.nn.functional.kl_div(q, p, reduction="none", log_target=True).sum(-1))
        same.append(q.argmax(-1) == p.argmax(-1))
    return torch.cat(nll).mean().item(), torch.cat(kld), torch.cat(same).double().mean().item()


@pytest.mark.parametrize("scheme, window, stride", [("sliding", 24, 8), ("chunks", 16, 1)])
def test_kl_divergence_matches_torch_on_the_same_logits(ckpt, ids, scheme, window, stride):
    base = llm.load(ckpt, bits=None, act="float", progress=False)
    q4 = llm.load(ckpt, bits=4, group_size=32, progress=False)
    res = llm.perplexity(q4, ids, window, stride, scheme=scheme, base=base)
    nll, kld, same = torch_reference(q4, base, ids, window, stride, scheme)
    d = res.divergence
    assert res.nll == pytest.approx(nll, rel=1e-9) and res.tokens == len(kld)
    assert d.mean == pytest.approx(kld.mean().item(), rel=1e-9) and d.mean > 0
    assert d.median == pytest.approx(kld.quantile(0.5).item(), rel=1e-9)
    assert d.p99 == pytest.approx(kld.quantile(0.99).item(), rel=1e-9)
    assert d.max == pytest.approx(kld.max().item(), rel=1e-9)
    assert d.top1_agreement == pytest.approx(same)
    assert d.base_perplexity == pytest.approx(llm.perplexity(base, ids, window, stride, scheme=scheme).perplexity)
    itself = llm.perplexity(base, ids, window, stride, scheme=scheme, base=base).divergence
    assert itself.max == 0 and itself.top1_agreement == 1


def test_saved_base_gives_the_models_divergence(ckpt, ids, tmp_path):
    base = llm.load(ckpt, bits=None, act="float", progress=False)
    q4 = llm.load(ckpt, bits=4, group_size=32, progress=False)
    saved = tmp_path / "base.qlw"
    llm.perplexity(base, ids, 24, 8, save_base=saved)
    from_file = llm.perplexity(q4, ids, 24, 8, base=saved).divergence
    from_model = llm.perplexity(q4, ids, 24, 8, base=base).divergence
    assert from_file.mean == pytest.approx(from_model.mean, rel=2e-2, abs=1e-5)  # float16 log-probs
    assert from_file.top1_agreement == from_model.top1_agreement
    with pytest.raises(ValueError, match="over other tokens"):
        llm.perplexity(q4, ids[:-1], 24, 8, base=saved)
    with pytest.raises(ValueError, match="computed with"):
        llm.perplexity(q4, ids, 32, 8, base=saved)
    bad = tmp_path / "bad.qlw"
    bad.write_bytes(saved.read_bytes()[:200])
    with pytest.raises(ValueError, match="not a base log-probabilities file"):
        llm.perplexity(q4, ids, 24, 8, base=bad)


def test_cli_kl_divergence(ckpt, tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text("import os\nprint(os.getcwd())\n" * 20)
    saved = tmp_path / "base.qlw"
    cli(["perplexity", str(ckpt), str(text), "--window", "32", "--stride", "16", "--bits", "none", "--act", "float",
         "--save-base", str(saved)])
    capsys.readouterr()
    for base in (str(ckpt), str(saved)):
        cli(["perplexity", str(ckpt), str(text), "--window", "32", "--stride", "16", "--bits", "4",
             "--kl-divergence", base])
        out = capsys.readouterr().out
        assert "KL divergence mean" in out and "same top token" in out
