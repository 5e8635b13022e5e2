"""quantize_model, calibrate, SmoothQuant / activation-aware scaling, clipping search and
sensitivity-driven mixed precision.

Everything here runs once, before inference, in float32 torch on the CPU; the result is a model
whose ``nn.Linear`` layers are ``QLinear`` modules holding packed weights.
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional, Sequence, Union

import torch
from torch import nn

from .._packed import pack_quantized
from .._scheme import ACT_QMAX, DEFAULT_ACT_BLOCK, act_block_size, group_of, qrange, scale_divisor, zero_point
from .module import QLinear

__all__ = ["calibrate", "Calibration", "LayerStats", "quantize_model", "QuantizeSummary",
           "fake_quantize_weight", "gptq_quantize", "GPTQResult"]

ALPHAS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
SEARCH_ROWS = 256  # calibration rows the alpha search evaluates
CLIP_SHRINK = tuple(1.0 - 0.025 * i for i in range(17))  # 1.0 .. 0.6


# --------------------------------------------------------------------------- calibration


@dataclass
class LayerStats:
    """What calibration recorded about one Linear's input ``x [rows, K]``."""
    absmax: torch.Tensor          # [K] max |x_k|
    sumsq: torch.Tensor           # [K] sum of x_k^2 (float64)
    rows: int
    samples: torch.Tensor         # [S, K] a deterministic subsample of the input rows
    producers: set = field(default_factory=set)  # norm modules whose output *is* this input
    xtx: Optional[torch.Tensor] = None  # [K, K] sum of x^T x over all rows (float64), hessian=True

    @property
    def mean_sq(self) -> torch.Tensor:
        return (self.sumsq / max(self.rows, 1)).float()


class Calibration(dict):
    """name of each ``nn.Linear`` -> LayerStats; ``check_batch`` is kept to verify foldings."""
    check_batch: Any = None


def _norm_like(m: nn.Module) -> bool:
    name = type(m).__name__
    return (isinstance(m, nn.LayerNorm) or name.endswith("RMSNorm") or name == "LayerNorm") \
        and isinstance(getattr(m, "weight", None), torch.Tensor) and "Gemma" not in name


def _call(model, batch):
    if isinstance(batch, dict):
        return model(**batch)
    if isinstance(batch, (tuple, list)):
        return model(*batch)
    return model(batch)


def calibrate(model: nn.Module, batches: Iterable, max_samples: int = 512, seed: int = 0,
              hessian: bool = False) -> Calibration:
    """Run ``model`` on ``batches`` (dicts are passed as keyword arguments, tuples as positional
    ones, anything else as the single argument) and record, for every ``nn.Linear``, per-channel
    maxima and second moments of its input and a subsample of ``max_samples`` input rows. Also
    notes which LayerNorm / RMSNorm output each Linear reads directly (a folding candidate).

    hessian: also accumulate ``X^T X`` over every input row ([K, K] float64 per Linear), which
    ``quantize_model(method="gptq")`` needs (memory: 8 K^2 bytes per Linear)."""
    if not isinstance(hessian, bool):
        raise TypeError(f"hessian must be a bool, got {type(hessian).__name__}")
    gen = torch.Generator().manual_seed(seed)
    stats: Calibration = Calibration()
    norm_out: dict[int, tuple[str, torch.Tensor]] = {}
    parts: dict[str, list] = {}
    handles = []

    def norm_hook(name):
        def hook(mod, inp, out):
            if isinstance(out, torch.Tensor):
                norm_out[id(out)] = (name, out)
        return hook

    def lin_hook(name):
        def hook(mod, inp):
            x = inp[0].detach()
            x2 = x.reshape(-1, x.shape[-1]).float()
            st = stats.get(name)
            if st is None:
                k = x2.shape[1]
                st = stats[name] = LayerStats(torch.zeros(k), torch.zeros(k, dtype=torch.float64), 0,
                                              torch.empty(0, k))
                parts[name] = []
            st.absmax = torch.maximum(st.absmax, x2.abs().amax(0))
            st.sumsq += (x2.double() ** 2).sum(0)
            st.rows += x2.shape[0]
            if hessian:
                xd = x2.double()
                st.xtx = xd.T @ xd if st.xtx is None else st.xtx.addmm_(xd.T, xd)
            if x2.shape[0] > max_samples:
                x2 = x2[torch.randperm(x2.shape[0], generator=gen)[:max_samples]]
            parts[name].append(x2.clone())
            if sum(p.shape[0] for p in parts[name]) > 4 * max_samples:
                allx = torch.cat(parts[name])
                parts[name] = [allx[torch.randperm(allx.shape[0], generator=gen)[:2 * max_samples]]]
            hit = norm_out.get(id(inp[0]))
            st.producers.add(hit[0] if hit is not None and hit[1] is inp[0] else None)
        return hook

    for name, m in model.named_modules():
        if isinstance(m, nn.Linear):
            handles.append(m.register_forward_pre_hook(lin_hook(name)))
        elif _norm_like(m):
            handles.append(m.register_forward_hook(norm_hook(name)))
    try:
        with torch.inference_mode():
            for batch in batches:
                if stats.check_batch is None:
                    stats.check_batch = batch
                norm_out.clear()
                _call(model, batch)
                norm_out.clear()
    finally:
        for h in handles:
            h.remove()
    for name, st in stats.items():
        allx = torch.cat(parts[name])
        if allx.shape[0] > max_samples:
            allx = allx[torch.randperm(allx.shape[0], generator=gen)[:max_samples]]
        st.samples = allx
    return stats


# --------------------------------------------------------------------------- fake quantization


def _grouped(w: torch.Tensor, g: int) -> torch.Tensor:
    n, k = w.shape
    pad = (-k) % g
    if pad:  # padded with copies of the row's first value: neither min nor max moves
        w = torch.cat([w, w[:, :1].expand(n, pad)], dim=1)
    return w.reshape(n, -1, g)


def _qparams(lo, hi, bits, symmetric):
    """float16-rounded (scale, offset) for ranges [lo, hi] (offset None if symmetric)."""
    div = scale_divisor(bits, symmetric)
    if symmetric:
        absmax = torch.maximum(lo.abs(), hi.abs())
        return (absmax / div).half().float(), None
    return ((hi - lo) / div).half().float(), lo.half().float()


def _codes(wg, scale, offset, bits, symmetric):
    """(stored codes, q) for grouped weights ``[N, G, g]`` (round half to even, as the kernels)."""
    safe = torch.where(scale == 0, torch.ones_like(scale), scale)
    qmin, qmax = qrange(bits, symmetric)
    centred = wg if symmetric else wg - offset
    q = torch.clamp(torch.round(centred / safe), qmin, qmax)
    q = torch.where(scale == 0, torch.zeros_like(q), q)
    return q + zero_point(bits, symmetric), q


def _dequant(q, scale, offset):
    return scale * q if offset is None else offset + scale * q


def fake_quantize_weight(w: torch.Tensor, bits: int, group_size: Optional[int], symmetric: bool = False,
                         shrink: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The float32 weight the kernels would compute with (``shrink`` [N, G] narrows each
    group's range); ``group_size=None`` is per-channel."""
    n, k = w.shape
    wg = _grouped(w.float(), group_of(k, group_size))
    lo, hi = wg.amin(-1, keepdim=True), wg.amax(-1, keepdim=True)
    if shrink is not None:
        lo, hi = lo * shrink[..., None], hi * shrink[..., None]
    scale, offset = _qparams(lo, hi, bits, symmetric)
    _, q = _codes(wg, scale, offset, bits, symmetric)
    return _dequant(q, scale, offset).reshape(n, -1)[:, :k]


def _fake_quantize_act(x: torch.Tensor, act_block: int) -> torch.Tensor:
    """Dynamic int8 absmax activations, one scale per row and ``act_block`` k (float simulation)."""
    m, k = x.shape
    pad = (-k) % act_block
    xp = torch.nn.functional.pad(x, (0, pad)).reshape(m, -1, act_block)
    s = xp.abs().amax(-1, keepdim=True) / ACT_QMAX
    safe = torch.where(s == 0, torch.ones_like(s), s)
    return (torch.clamp(torch.round(xp / safe), -ACT_QMAX, ACT_QMAX) * s).reshape(m, -1)[:, :k]


# --------------------------------------------------------------------------- the recipe


@dataclass
class _Plan:
    name: str
    module: nn.Linear
    weight: torch.Tensor                   # float32 [N, K], smoothing applied
    bias: Optional[torch.Tensor]
    stats: Optional[LayerStats]
    samples: Optional[torch.Tensor] = None  # input rows in the smoothed frame
    in_scale: Optional[torch.Tensor] = None
    smoothing: str = "-"
    alpha: Optional[float] = None
    bits: int = 4
    group_size: Optional[int] = 64
    shrink: Optional[torch.Tensor] = None
    err4: float = float("nan")
    err8: float = float("nan")
    in_div: Optional[torch.Tensor] = None   # the QLinear reads x / in_div (1/s folded upstream)
    out_div: Optional[torch.Tensor] = None  # and writes y / out_div (its rows carry a later 1/s)
    hess: Optional[torch.Tensor] = None     # X^T X of the input in the smoothed frame (float64)
    gptq: Optional["GPTQResult"] = None


@dataclass
class QuantizeSummary:
    """What quantize_model did; ``str()`` gives a table."""
    layers: list
    bytes_before: int
    bytes_after: int
    weights: int
    packed_bytes: int

    @property
    def replaced(self) -> int:
        return len(self.layers)

    @property
    def bits_per_weight(self) -> float:
        """Average stored bits per weight of the replaced layers (codes, scales and offsets)."""
        return self.packed_bytes * 8 / max(self.weights, 1)

    def __str__(self) -> str:
        rows = [f"{'layer':<45} {'shape':>11} {'int':>3} {'group':>5} {'bits/w':>6} "
                f"{'smoothing':<10} {'alpha':>5} {'clip':>5} {'method':>6} {'err int4':>8} {'err int8':>8}"]
        for r in self.layers:
            g = "chan" if r["group_size"] is None else str(r["group_size"])
            a = "-" if r["alpha"] is None else f"{r['alpha']:.1f}"
            clip = "-" if r["clip_mean"] is None else f"{r['clip_mean']:.3f}"
            rows.append(f"{r['name']:<45} {r['shape'][0]:>5}x{r['shape'][1]:<5} {r['bits']:>3} {g:>5} "
                        f"{r['bits_per_weight']:>6.3f} {r['smoothing']:<10} {a:>5} {clip:>5} {r.get('method', 'rtn'):>6} "
                        f"{r['err_int4']:>8.4f} {r['err_int8']:>8.4f}")
        rows.append(f"{self.replaced} layers replaced; {self.bytes_before / 1e6:.2f} MB -> "
                    f"{self.bytes_after / 1e6:.2f} MB; {self.bits_per_weight:.3f} bits per weight")
        return "\n".join(rows)


def _matches(name: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) or name == p or name.startswith(p + ".") for p in patterns)


# Linear -> the Linear whose output rows it reads unchanged per channel (a folding target), by
# name: attention output <- value projection, gated MLP down <- up projection.
_LINEAR_PRODUCERS = (
    ("attention.output.dense", "attention.self.value"),   # BERT
    ("self_attn.o_proj", "self_attn.v_proj"),             # Llama, Qwen2, Mistral
    ("mlp.down_proj", "mlp.up_proj"),                     # gated MLPs: act(gate) * up
)


def _linear_producer(name: str, linears: dict) -> Optional[str]:
    for consumer, producer in _LINEAR_PRODUCERS:
        if name.endswith(consumer):
            cand = name[: -len(consumer)] + producer
            if cand in linears and linears[cand].out_features == linears[name].in_features:
                return cand
    return None


def _rel_err(x, w, wq, xq) -> float:
    ref = x @ w.T
    return float(((xq @ wq.T - ref).norm() / ref.norm().clamp_min(1e-30)) ** 2)


def _act_sim(x, act, block):
    return _fake_quantize_act(x, block) if act == "int8" else x


def _smooth_scale(stats_absmax, weights, alpha):
    wmax = torch.stack([w.abs().amax(0) for w in weights]).amax(0).clamp_min(1e-8)
    xmax = stats_absmax.clamp_min(1e-8)
    s = xmax ** alpha / wmax ** (1 - alpha)
    s = s / torch.sqrt(s.max() * s.min())  # the product of the extremes is 1: a neutral level
    return s.clamp(1e-4, 1e4)


def _search_alpha(plans, samples, absmax, alpha, bits, group_size, symmetric, act, act_block):
    """Per group of Linears sharing one input: the smoothing scale s (None = none) minimising the
    sum of their relative output errors on the calibration rows, over ``alpha`` candidates."""
    if not isinstance(alpha, str):  # a fixed alpha is applied, as asked
        return float(alpha), _smooth_scale(absmax, [p.weight for p in plans], float(alpha))
    x = samples[:SEARCH_ROWS]
    k = x.shape[1]
    block = act_block_size(k, group_size, act_block)
    refs = [x @ p.weight.T for p in plans]
    norms = [r.norm().clamp_min(1e-30) for r in refs]
    best = (math.inf, None, None)
    for a in [None] + list(ALPHAS):
        s = None if a is None else _smooth_scale(absmax, [p.weight for p in plans], a)
        xq = _act_sim(x if s is None else x / s, act, block)
        err = 0.0
        for p, ref, nrm in zip(plans, refs, norms):
            wq = fake_quantize_weight(p.weight if s is None else p.weight * s, bits, group_size, symmetric)
            err += float(((xq @ wq.T - ref).norm() / nrm) ** 2)
        if err < best[0]:
            best = (err, a, s)
    return best[1], best[2]


def _clip_search(w, x, bits, group_size, symmetric):
    """Per group: the range shrink factor minimising ||X_g (W_g - W'_g)^T||^2 over the calibration
    rows ``x`` (the group's own columns; groups are independent)."""
    n, k = w.shape
    g = group_of(k, group_size)
    wg = _grouped(w, g)                                   # [N, G, g]
    pad = wg.shape[1] * g - k
    xg = torch.nn.functional.pad(x, (0, pad)).reshape(x.shape[0], -1, g)  # [S, G, g]
    hess = torch.einsum("sgi,sgj->gij", xg, xg)           # per-group second moments [G, g, g]
    lo, hi = wg.amin(-1, keepdim=True), wg.amax(-1, keepdim=True)
    best_err = torch.full(wg.shape[:2], math.inf)
    best = torch.ones(wg.shape[:2])
    for c in CLIP_SHRINK:
        scale, offset = _qparams(lo * c, hi * c, bits, symmetric)
        _, q = _codes(wg, scale, offset, bits, symmetric)
        d = wg - _dequant(q, scale, offset)               # [N, G, g]
        err = (torch.einsum("ngi,gij->ngj", d, hess) * d).sum(-1)
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        best = torch.where(better, torch.full_like(best, c), best)
    return best


def _pack(w, bits, group_size, symmetric, shrink):
    n, k = w.shape
    wg = _grouped(w, group_of(k, group_size))
    lo, hi = wg.amin(-1, keepdim=True), wg.amax(-1, keepdim=True)
    if shrink is not None:
        lo, hi = lo * shrink[..., None], hi * shrink[..., None]
    scale, offset = _qparams(lo, hi, bits, symmetric)
    codes, _ = _codes(wg, scale, offset, bits, symmetric)
    codes = codes.reshape(n, -1)[:, :k].to(torch.uint8).numpy()
    sc = scale[..., 0].half().numpy()
    off = None if offset is None else offset[..., 0].half().numpy()
    return pack_quantized(codes, sc, off, bits, group_size, symmetric)


GPTQ_BLOCK = 128      # columns per lazy batch update
GPTQ_DAMP = 0.3       # dampening, a fraction of the Hessian's mean diagonal (chosen on a calibration split: python -m qlinear.accuracy --tune-damp)


@dataclass
class GPTQResult:
    """One Linear quantized by ``gptq_quantize``: what ``pack_quantized`` stores, and ``W'``."""
    codes: torch.Tensor            # uint8 [N, K] stored codes (symmetric: q + zero_point)
    scale: torch.Tensor            # float16 [N, G]
    offset: Optional[torch.Tensor]  # float16 [N, G], None if symmetric
    weight: torch.Tensor           # float32 [N, K] the weight the kernels compute with
    shrink: Optional[torch.Tensor]  # [N, G] the clipping chosen per group (None: no search)
    bits: int
    group_size: Optional[int]
    symmetric: bool

    def pack(self):
        off = None if self.offset is None else self.offset.numpy()
        return pack_quantized(self.codes.numpy(), self.scale.numpy(), off, self.bits, self.group_size,
                              self.symmetric)


def _group_params(wg, hg, bits, symmetric, clip):
    """float16-rounded (scale, offset, shrink) [N] of the weights ``wg [N, g]`` of one group; with
    ``clip``, the range shrink minimising the rounding error weighted by ``hg [g, g]``."""
    lo, hi = wg.amin(1), wg.amax(1)
    if not clip:
        s, o = _qparams(lo, hi, bits, symmetric)
        return s, o, None
    best_err = torch.full(lo.shape, math.inf)
    best = torch.ones_like(lo)
    for c in CLIP_SHRINK:
        s, o = _qparams(lo * c, hi * c, bits, symmetric)
        _, q = _codes(wg, s[:, None], None if o is None else o[:, None], bits, symmetric)
        d = wg - _dequant(q, s[:, None], None if o is None else o[:, None])
        err = ((d @ hg) * d).sum(1)
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        best = torch.where(better, torch.full_like(best, c), best)
    s, o = _qparams(lo * best, hi * best, bits, symmetric)
    return s, o, best


def _inverse_hessian_chol(h: torch.Tensor, damp: float) -> torch.Tensor:
    """Upper Cholesky factor of ``(H + damp * mean(diag H) * I)^-1`` (float64); the dampening
    grows tenfold until ``H`` is positive definite."""
    k = h.shape[0]
    eye = torch.eye(k, dtype=torch.float64)
    level = float(h.diagonal().mean())
    level = level if level > 0 else 1.0
    for _ in range(8):
        chol, info = torch.linalg.cholesky_ex(h + damp * level * eye)
        if int(info) == 0:
            hinv = torch.cholesky_inverse(chol)
            u, info = torch.linalg.cholesky_ex(hinv, upper=True)
            if int(info) == 0:
                return u
        damp *= 10
    raise ValueError("the calibration Hessian is not positive definite even with strong dampening")


def gptq_quantize(w: torch.Tensor, hessian: torch.Tensor, bits: int = 4, group_size: Optional[int] = 64,
                  symmetric: bool = False, clip: bool = False, act_order: bool = False,
                  block: int = GPTQ_BLOCK, damp: float = GPTQ_DAMP) -> GPTQResult:
    """GPTQ (Frantar et al., 2022) in qlinear's format: the columns of ``w [N, K]`` are rounded one
    by one, each one's rounding error spread over the columns not yet rounded through the upper
    Cholesky factor of the inverse of ``hessian`` (``X^T X`` of the calibration inputs, [K, K]),
    with lazy updates in blocks of ``block`` columns.

    A group's float16 scale and offset are fixed when its first column is reached, from the
    weights as updated so far (min / max, or with ``clip`` the shrink of the range minimising the
    Hessian-weighted rounding error of the group); every code is computed with the stored scale
    and offset, so ``W'`` is exactly what the kernels use. ``act_order``: columns in order of
    decreasing Hessian diagonal, the groups' parameters then fixed up front from ``w`` (groups stay
    contiguous in k, as the format stores them). Deterministic."""
    w = w.detach().float()
    n, k = w.shape
    if tuple(hessian.shape) != (k, k):
        raise ValueError(f"hessian must have shape ({k}, {k}), got {tuple(hessian.shape)}")
    g = group_of(k, group_size)
    ngroups = -(-k // g)
    h = hessian.detach().double().clone()
    dead = h.diagonal() == 0  # inputs never seen: decoupled from the others
    h[dead, :] = 0
    h[:, dead] = 0
    h[dead, dead] = 1
    hg_all = h.float()
    scale = torch.zeros(n, ngroups)
    offset = None if symmetric else torch.zeros(n, ngroups)
    shrink = torch.ones(n, ngroups) if clip else None

    def fix_group(j, wg):
        s, o, c = _group_params(wg, hg_all[j * g:j * g + wg.shape[1], j * g:j * g + wg.shape[1]],
                                bits, symmetric, clip)
        scale[:, j] = s
        if offset is not None:
            offset[:, j] = o
        if shrink is not None:
            shrink[:, j] = c

    if act_order:
        perm = torch.argsort(h.diagonal(), descending=True, stable=True)
        for j in range(ngroups):
            fix_group(j, w[:, j * g:(j + 1) * g])
        hp = h[perm][:, perm]
        u = _inverse_hessian_chol(hp, damp).float()
        wp = w[:, perm].clone()
    else:
        perm = None
        u = _inverse_hessian_chol(h, damp).float()
        wp = w.clone()
    col_group = (torch.arange(k) if perm is None else perm) // g
    qmin, qmax = qrange(bits, symmetric)
    qs = torch.empty(n, k)
    for i1 in range(0, k, block):
        i2 = min(i1 + block, k)
        w1 = wp[:, i1:i2].clone()
        err1 = torch.zeros_like(w1)
        for i in range(i2 - i1):
            c = i1 + i
            j = int(col_group[c])
            if perm is None and c % g == 0:  # the group's first column: fix its range now
                need, have = min(g, k - c), i2 - c
                fix_group(j, w1[:, i:i + need] if need <= have else torch.cat([w1[:, i:], wp[:, i2:c + need]], 1))
            s = scale[:, j]
            col = w1[:, i]
            safe = torch.where(s == 0, torch.ones_like(s), s)
            centred = col if offset is None else col - offset[:, j]
            q = torch.clamp(torch.round(centred / safe), qmin, qmax)
            q = torch.where(s == 0, torch.zeros_like(q), q)
            dq = s * q if offset is None else offset[:, j] + s * q
            qs[:, c] = q
            e = (col - dq) / u[c, c]
            w1[:, i:].addr_(e, u[c, c:i2], alpha=-1)  # in place: no [N, block] temporary
            err1[:, i] = e
        wp[:, i2:] -= err1 @ u[i1:i2, i2:]
    if perm is not None:
        qs = qs[:, torch.argsort(perm)]
    per_k = lambda a: a.repeat_interleave(g, dim=1)[:, :k]  # noqa: E731
    wq = per_k(scale) * qs if offset is None else per_k(offset) + per_k(scale) * qs
    codes = (qs + zero_point(bits, symmetric)).to(torch.uint8)
    return GPTQResult(codes, scale.half(), None if offset is None else offset.half(), wq, shrink,
                      bits, group_size, symmetric)


def _check_fold(model, batch, apply, undo, ref) -> bool:
    """Apply a folding, run ``batch`` and keep it only if the output is unchanged (the folded
    scale reached exactly the intended Linears, e.g. not a residual branch)."""
    apply()
    with torch.inference_mode():
        out = _first_tensor(_call(model, _head(batch)))
    ok = float((out - ref).norm() / ref.norm().clamp_min(1e-30)) < 1e-4
    if not ok:
        undo()
    return ok


def _head(batch, n: int = 4):
    """The first ``n`` rows of a batch (tensors of a dict / tuple, or a tensor): folding checks."""
    if isinstance(batch, torch.Tensor):
        return batch[:n]
    if isinstance(batch, dict):
        return {k: _head(v, n) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(_head(v, n) if isinstance(v, torch.Tensor) else v for v in batch)
    return batch


def _first_tensor(out):
    if isinstance(out, torch.Tensor):
        return out.float()
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (tuple, list)) or hasattr(out, "to_tuple"):
        seq = out.to_tuple() if hasattr(out, "to_tuple") else out
        for o in seq:
            t = _first_tensor(o)
            if t is not None:
                return t
    return None


def quantize_model(model: nn.Module, bits: int = 4, group_size: Optional[int] = 64,
                   symmetric: bool = False, act: str = "int8",
                   act_block: Union[None, int, str] = DEFAULT_ACT_BLOCK, skip: Sequence[str] = (),
                   smooth: Union[None, float, str] = None, calibration: Optional[Calibration] = None,
                   clip_search: bool = False, bits_budget: Optional[float] = None,
                   int8_layers: Sequence[str] = (), int8_group_size: Optional[int] = 128,
                   method: str = "rtn", act_order: bool = False, damp: float = GPTQ_DAMP) -> QuantizeSummary:
    """Replace the ``nn.Linear`` layers of ``model`` in place by ``QLinear``; returns a summary.

    bits, group_size, symmetric: the weights' format (``group_size=None``: per channel).
    act, act_block: the kernels' activation mode (see ``qlinear.matmul``).
    skip: name patterns (``fnmatch``, or a module prefix) of Linears to leave in float.
    smooth: SmoothQuant ``s_j = max|X_j|^a / max|W_j|^(1-a)`` with ``a = smooth`` (a float), or
      ``"search"``: per set of Linears sharing an input, the ``a`` in 0, 0.1, .., 1 (or no
      smoothing) that minimises their output error on the calibration rows (activation-aware
      scaling as AWQ). ``1/s`` is folded into the producing LayerNorm / RMSNorm or Linear (value
      projection, MLP up projection) when a test run shows the output unchanged, else applied to
      the input as a per-channel ``in_scale``.
    clip_search: choose each group's range (a shrink of [min, max]) minimising
      ``||X_g (W_g - W'_g)^T||^2`` on the calibration rows (the format and kernels are unchanged).
    bits_budget: keep the most sensitive Linears at int8 (group ``int8_group_size``) while the
      average bits per weight (scales and offsets counted) stays within the budget.
    int8_layers: name patterns of Linears always kept at int8.
    calibration: from ``calibrate(model, batches)``; needed by smooth, clip_search, bits_budget
      and method="gptq" (which needs ``calibrate(..., hessian=True)``).
    method: ``"rtn"`` rounds each weight to nearest; ``"gptq"`` rounds column by column with the
      error fed back through the inverse Hessian of the calibration inputs (``gptq_quantize``), in
      the smoothed frame, with the clipping search choosing each group's range when
      ``clip_search``. Linears kept at int8 use GPTQ at 8 bits; Linears the calibration never
      saw are rounded to nearest.
    act_order: with method="gptq", round the columns in order of decreasing input energy.
    damp: with method="gptq", the fraction of each Hessian's mean diagonal added to its diagonal
      (larger: closer to round-to-nearest, less fitted to the calibration inputs).
    """
    if not isinstance(method, str):
        raise TypeError(f"method must be a str ('rtn' or 'gptq'), got {type(method).__name__}")
    if method not in ("rtn", "gptq"):
        raise ValueError(f"method must be 'rtn' or 'gptq', got {method!r}")
    if not isinstance(act_order, bool):
        raise TypeError(f"act_order must be a bool, got {type(act_order).__name__}")
    if act_order and method != "gptq":
        raise ValueError("act_order applies to method='gptq' only")
    if isinstance(damp, bool) or not isinstance(damp, (int, float)) or not 0 < damp < 1e3:
        raise ValueError(f"damp must be a positive number (a fraction of the Hessian's mean diagonal), got {damp!r}")
    if method == "gptq":
        if calibration is None:
            raise ValueError("method='gptq' needs calibration=qlinear.torch.calibrate(model, batches, hessian=True)")
        if not any(st.xtx is not None for st in calibration.values()):
            raise ValueError("method='gptq' needs the input Hessians: calibrate(model, batches, hessian=True)")
    if act not in ("int8", "float"):
        raise ValueError(f"act must be 'int8' or 'float', got {act!r}")
    if bits not in (4, 8):
        raise ValueError(f"bits must be 4 or 8, got {bits!r}")
    needs = [n for n, v in (("smooth", smooth), ("clip_search", clip_search), ("bits_budget", bits_budget)) if v]
    if needs and calibration is None:
        raise ValueError(f"{', '.join(needs)} need calibration=qlinear.torch.calibrate(model, batches)")
    if isinstance(smooth, str) and smooth != "search":
        raise ValueError(f"smooth must be None, a float alpha or 'search', got {smooth!r}")

    saved_threads = torch.get_num_threads()
    torch.set_num_threads(1)  # many small tensor ops: on a busy machine, OpenMP barriers cost more than they save
    try:
        return _quantize_model(model, bits, group_size, symmetric, act, act_block, skip, smooth, calibration,
                               clip_search, bits_budget, int8_layers, int8_group_size, method, act_order,
                               float(damp))
    finally:
        torch.set_num_threads(saved_threads)


def _quantize_model(model, bits, group_size, symmetric, act, act_block, skip, smooth, calibration,
                    clip_search, bits_budget, int8_layers, int8_group_size, method, act_order, damp):
    modules = dict(model.named_modules())
    linears = {n: m for n, m in modules.items() if isinstance(m, nn.Linear) and not _matches(n, skip)}
    plans = {}
    for n, m in linears.items():
        st = None if calibration is None else calibration.get(n)
        plans[n] = _Plan(n, m, m.weight.detach().float().clone(),
                         None if m.bias is None else m.bias.detach().float().clone(), st,
                         None if st is None else st.samples.clone(), bits=bits, group_size=group_size,
                         hess=None if st is None or st.xtx is None or method != "gptq" else st.xtx.clone())
    bytes_before = sum(m.weight.numel() * m.weight.element_size()
                       + (0 if m.bias is None else m.bias.numel() * m.bias.element_size()) for m in linears.values())

    if smooth is not None:
        _apply_smoothing(model, modules, linears, plans, smooth, calibration, bits, group_size,
                         symmetric, act, act_block)

    if calibration is not None:  # per-layer error estimates (and the clipping search)
        for p in plans.values():
            if p.samples is None:
                continue
            x = p.samples
            blk = act_block_size(x.shape[1], group_size, act_block)
            xq = _act_sim(x, act, blk)
            if p.hess is not None:
                p.gptq = gptq_quantize(p.weight, p.hess, bits, group_size, symmetric, clip_search, act_order,
                                       damp=damp)
                p.shrink = p.gptq.shrink
                wq = p.gptq.weight
            else:
                if clip_search:
                    p.shrink = _clip_search(p.weight, x, bits, group_size, symmetric)
                wq = fake_quantize_weight(p.weight, bits, group_size, symmetric, p.shrink)
            p.err4 = _rel_err(x, p.weight, wq, xq)
            xq8 = _act_sim(x, act, act_block_size(x.shape[1], int8_group_size, act_block))
            p.err8 = _rel_err(x, p.weight, fake_quantize_weight(p.weight, 8, int8_group_size, symmetric), xq8)

    for n, p in plans.items():
        if _matches(n, int8_layers):
            p.bits, p.group_size, p.shrink = 8, int8_group_size, None
    if bits_budget is not None and bits == 4:
        _mixed_precision(plans, bits_budget, symmetric, int8_group_size)

    rows, weights, packed_bytes, bytes_after = [], 0, 0, 0
    for n, p in plans.items():
        if p.hess is not None and (p.gptq is None or p.gptq.bits != p.bits or p.gptq.group_size != p.group_size):
            p.gptq = gptq_quantize(p.weight, p.hess, p.bits, p.group_size, symmetric, False, act_order,
                                   damp=damp)
        pw = p.gptq.pack() if p.gptq is not None else _pack(p.weight, p.bits, p.group_size, symmetric, p.shrink)
        q = QLinear(pw, p.bias, act=act, act_block=act_block, in_scale=p.in_scale)
        _set_module(model, n, q)
        weights += p.weight.numel()
        packed_bytes += pw.nbytes
        bytes_after += pw.nbytes + sum(0 if t is None else t.numel() * 4 for t in (q.bias, q.in_scale))
        rows.append({"name": n, "shape": tuple(p.weight.shape), "bits": p.bits, "group_size": p.group_size,
                     "bits_per_weight": pw.bits_per_weight, "smoothing": p.smoothing, "alpha": p.alpha,
                     "clip_mean": None if p.shrink is None else float(p.shrink.mean()),
                     "err_int4": math.sqrt(p.err4), "err_int8": math.sqrt(p.err8),
                     "method": "gptq" if p.gptq is not None else "rtn",
                     "in_div": p.in_div, "out_div": p.out_div})
    return QuantizeSummary(rows, bytes_before, bytes_after, weights, packed_bytes)


def _bits_per_weight(k, bits, group_size, symmetric):
    ngroups = -(-k // group_of(k, group_size))
    return bits + ngroups * (16 if symmetric else 32) / k


def _mixed_precision(plans, budget, symmetric, int8_group_size):
    """Greedy: promote to int8 the Linears with the largest error reduction per extra stored bit
    until the average bits per weight would exceed ``budget``."""
    def cost(p, bits, g):
        n, k = p.weight.shape
        return n * k * _bits_per_weight(k, bits, g, symmetric)

    total_w = sum(p.weight.numel() for p in plans.values())
    used = sum(cost(p, p.bits, p.group_size) for p in plans.values())
    cands = [p for p in plans.values() if p.bits == 4 and not math.isnan(p.err4)]
    # squared relative output error is what each layer adds to the model's output error
    cands.sort(key=lambda p: -(p.err4 - p.err8) / (cost(p, 8, int8_group_size) - cost(p, 4, p.group_size)))
    for p in cands:
        extra = cost(p, 8, int8_group_size) - cost(p, 4, p.group_size)
        if (used + extra) / total_w <= budget:
            used += extra
            p.bits, p.group_size, p.shrink = 8, int8_group_size, None


def _set_module(model, name, new):
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, new)


def _apply_smoothing(model, modules, linears, plans, smooth, calib, bits, group_size, symmetric, act, act_block):
    batch = calib.check_batch
    ref = None
    if batch is not None:
        with torch.inference_mode():
            ref = _first_tensor(_call(model, _head(batch)))
    # groups of Linears that read the same tensor
    groups: dict[tuple, list] = {}
    for n in linears:
        st = calib.get(n)
        if st is None:
            continue
        prods = st.producers
        norm = next(iter(prods)) if len(prods) == 1 and None not in prods else None
        if norm is not None:
            key = ("norm", norm)
        else:
            lp = _linear_producer(n, linears)
            key = ("linear", lp) if lp is not None else ("self", n)
        groups.setdefault(key, []).append(n)

    for (kind, prod), names in groups.items():
        ps = [plans[n] for n in names]
        st = calib[names[0]]
        alpha, s = _search_alpha(ps, st.samples, st.absmax, smooth, bits, group_size, symmetric, act, act_block)
        for p in ps:
            p.alpha = alpha
        if s is None:
            continue
        folded = False
        if kind in ("norm", "linear") and ref is not None:
            tgt = modules[prod]
            w0 = tgt.weight.detach().clone()
            b0 = None if getattr(tgt, "bias", None) is None else tgt.bias.detach().clone()
            consumers = [linears[n] for n in names]
            cw0 = [c.weight.detach().clone() for c in consumers]

            def apply():
                with torch.no_grad():
                    sv = s.to(tgt.weight.dtype)
                    if kind == "norm":
                        tgt.weight.div_(sv)
                    else:
                        tgt.weight.div_(sv[:, None])
                    if b0 is not None:
                        tgt.bias.div_(sv)
                    for c in consumers:
                        c.weight.mul_(s.to(c.weight.dtype))

            def undo():
                with torch.no_grad():
                    tgt.weight.copy_(w0)
                    if b0 is not None:
                        tgt.bias.copy_(b0)
                    for c, w in zip(consumers, cw0):
                        c.weight.copy_(w)

            folded = _check_fold(model, batch, apply, undo, ref)
            if folded and kind == "linear" and prod in plans:  # the producer's own plan sees the fold
                pp = plans[prod]
                pp.weight = pp.weight / s[:, None]
                if pp.bias is not None:
                    pp.bias = pp.bias / s
                pp.out_div = s if pp.out_div is None else pp.out_div * s
        for p in ps:
            p.weight = p.weight * s
            p.samples = p.samples / s
            if p.hess is not None:  # X -> X / s
                sd = s.double()
                p.hess = p.hess / (sd[:, None] * sd[None, :])
            if folded:
                p.in_div = s
                p.smoothing = f"fold:{prod.rsplit('.', 1)[-1]}" if kind == "linear" else "fold:norm"
            else:
                p.in_scale = 1.0 / s
                p.smoothing = "in_scale"
