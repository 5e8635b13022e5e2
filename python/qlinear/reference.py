"""The numpy reference: the executable form of qlinear's semantics (docs/semantics.md).

Every kernel is tested against these functions. They are written for clarity, not speed, and
round exactly as the kernels do (float32 arithmetic, float16 scales, round-half-to-even), so
that integer codes and accumulators agree exactly and float outputs to float rounding.

Weights ``w`` are ``[N, K]`` (``nn.Linear`` convention), activations ``x`` are ``[M, K]``,
``y = x @ w.T``. The scheme's constants (code ranges, zero points) come from ``qlinear._scheme``:

* weights, per group of ``group_size`` k: asymmetric ``scale = f16((max - min) / qmax)``,
  ``offset = f16(min)``, ``q = clip(rint((w - offset) / scale), 0, qmax)``; symmetric
  ``scale = f16(absmax / qmax)``, ``q = clip(rint(w / scale), qmin, qmax)``, stored code
  ``q + zero_point``; a zero scale stores ``q = 0``;
* activations, per row or ``act_block`` k: ``s = absmax / 127``, ``xq = clip(rint(x / s), -127, 127)``;
* ``y[m, n] = sum_j s_x[m, j] * (scale[n, j] * acc[m, n, j] + offset[n, j] * sum_{k in j} xq[m, k])
  + bias[n]`` with ``acc`` the exact integer sums of ``xq * q`` per group.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np

from ._scheme import ACT_QMAX, group_of, qrange, scale_divisor, zero_point

__all__ = [
    "QuantizedWeight", "quantize_weight", "dequantize_weight", "quantize_activation",
    "int_accumulators", "matmul_int8", "zero_point", "qrange",
]


class QuantizedWeight(NamedTuple):
    codes: np.ndarray             # uint8 [N, K], stored codes (symmetric: q + zero_point)
    scale: np.ndarray             # float16 [N, G]
    offset: Optional[np.ndarray]  # float16 [N, G], None for symmetric weights
    bits: int
    group_size: int               # semantic group (== K for per-channel)
    symmetric: bool


def quantize_weight(w, bits: int = 4, group_size: Optional[int] = 64,
                    symmetric: bool = False) -> QuantizedWeight:
    w = np.asarray(w, dtype=np.float32)
    n, k = w.shape
    g = group_of(k, group_size)
    ngroups = -(-k // g)
    qmin, qmax = qrange(bits, symmetric)
    div = np.float32(scale_divisor(bits, symmetric))
    codes = np.empty((n, k), np.uint8)
    scale = np.empty((n, ngroups), np.float16)
    offset = None if symmetric else np.empty((n, ngroups), np.float16)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        for j in range(ngroups):
            wg = w[:, j * g:(j + 1) * g]
            if symmetric:
                absmax = np.abs(wg).max(axis=1)
                s16 = (absmax / div).astype(np.float16)
                s = s16.astype(np.float32)[:, None]
                q = np.where(s == 0, np.float32(0), np.clip(np.rint(wg / s), qmin, qmax))
                codes[:, j * g:(j + 1) * g] = (q + zero_point(bits, True)).astype(np.uint8)
            else:
                lo, hi = wg.min(axis=1), wg.max(axis=1)
                s16 = ((hi - lo) / div).astype(np.float16)
                o16 = lo.astype(np.float16)
                s, o = s16.astype(np.float32)[:, None], o16.astype(np.float32)[:, None]
                q = np.where(s == 0, np.float32(0), np.clip(np.rint((wg - o) / s), qmin, qmax))
                codes[:, j * g:(j + 1) * g] = q.astype(np.uint8)
                offset[:, j] = o16
            scale[:, j] = s16
    return QuantizedWeight(codes, scale, offset, bits, g, symmetric)


def _per_k(a: np.ndarray, k: int, g: int) -> np.ndarray:
    """Expand a per-group array [R, G] to per-k [R, K]."""
    return np.repeat(a, g, axis=1)[:, :k]


def dequantize_weight(qw: QuantizedWeight, dtype=np.float32) -> np.ndarray:
    """The weights the kernels compute with, w' (float32 arithmetic, as the kernels)."""
    n, k = qw.codes.shape
    q = qw.codes.astype(np.float32) - np.float32(zero_point(qw.bits, qw.symmetric))
    w = _per_k(qw.scale.astype(np.float32), k, qw.group_size) * q
    if not qw.symmetric:
        w = _per_k(qw.offset.astype(np.float32), k, qw.group_size) + w
    return w.astype(dtype)


def quantize_activation(x, act_block: Optional[int] = None) -> tuple[np.ndarray, np.ndarray]:
    """Returns (xq int8 [M, K], s float32 [M, ceil(K / act_block)] or [M, 1] per row)."""
    x = np.asarray(x).astype(np.float32)
    m, k = x.shape
    b = k if act_block is None or act_block >= k else int(act_block)
    nb = -(-k // b)
    xq = np.zeros((m, k), np.int8)
    s = np.empty((m, nb), np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        for j in range(nb):
            xb = x[:, j * b:(j + 1) * b]
            finite = np.isfinite(xb).all(axis=1)
            sj = np.abs(xb).max(axis=1) / np.float32(ACT_QMAX)
            sj = np.where(finite, sj, np.float32(np.nan)).astype(np.float32)
            ok = sj > 0
            safe = np.where(ok, sj, np.float32(1))[:, None]
            q = np.clip(np.rint(np.where(ok[:, None], xb, np.float32(0)) / safe), -ACT_QMAX, ACT_QMAX)
            xq[:, j * b:(j + 1) * b] = q.astype(np.int8)
            s[:, j] = sj
    return xq, s


def int_accumulators(xq: np.ndarray, qw: QuantizedWeight, segment: Optional[int] = None) -> np.ndarray:
    """acc[m, n, j] = sum over segment j (default: the weight groups) of xq * (code - zero_point),
    exact (int64)."""
    k = qw.codes.shape[1]
    seg = qw.group_size if segment is None else segment
    q = qw.codes.astype(np.int64) - zero_point(qw.bits, qw.symmetric)
    x = xq.astype(np.int64)
    return np.stack([x[:, j:j + seg] @ q[:, j:j + seg].T for j in range(0, k, seg)], axis=2)


def matmul_int8(x, qw: QuantizedWeight, bias=None, act_block: Optional[int] = None,
                segment: Optional[int] = None):
    """W4A8 / W8A8 reference. Returns (y float64 [M, N], magnitude float64 [M, N]).

    ``magnitude`` is the same sum with every term taken in absolute value, each term being the
    integer sum over a segment of ``segment`` k (default: the largest over which both the weight
    and the activation scales are constant): the scale of the float rounding that a kernel
    summing such segments in float32 may show (a few ulps of it per segment).
    ``act_block`` is None (per row), or a multiple or divisor of the weight group.
    """
    x = np.atleast_2d(np.asarray(x))
    m, k = x.shape
    g = qw.group_size
    a = k if act_block is None or act_block >= k else int(act_block)
    seg = int(np.gcd(g, a)) if segment is None else int(segment)  # both scales constant over it
    xq, s = quantize_activation(x, act_block)
    starts = np.arange(0, k, seg)
    acc = int_accumulators(xq, qw, seg).astype(np.float64)                  # [M, N, S]
    xsum = np.stack([xq[:, j:j + seg].astype(np.int64).sum(axis=1) for j in starts], axis=1)
    sx = s.astype(np.float64)[:, starts // a]                               # [M, S]
    scale = qw.scale.astype(np.float64)[:, starts // g][None]               # [1, N, S]
    terms = scale * acc
    mag = np.abs(terms)
    if not qw.symmetric:
        off = qw.offset.astype(np.float64)[:, starts // g][None] * xsum[:, None, :]
        terms = terms + off
        mag = mag + np.abs(off)
    with np.errstate(invalid="ignore"):
        y = (sx[:, None, :] * terms).sum(axis=2)
        mag = (np.abs(sx)[:, None, :] * mag).sum(axis=2)
    if bias is not None:
        b = np.asarray(bias, dtype=np.float32).astype(np.float64)
        y = y + b
        mag = mag + np.abs(b)
    return y, mag


def matmul_blocks_int8(x, raw: np.ndarray, fmt: str, k: int, bias=None, act_block: Optional[int] = None):
    """W-x-A8 reference of a block format (docs/semantics.md, section 6) over its file rows ``raw``
    (uint8 [N, bytes per row]). Returns (y float64 [M, N], magnitude float64 [M, N]).

    ``act_block``: None (per row) or a multiple of the format's super-block. Per super-block,
    ``A = sum_j sc[j] * sum_{k in j} xq v`` and ``B = sum_j mn[j] * sum_{k in j} xq`` (exact),
    ``y = sum_blocks s_x * (d * A + m * B)``; ``magnitude`` the same sum of absolute terms."""
    from . import blocks  # noqa: PLC0415

    f = blocks.block_format(fmt)
    p = blocks.decode(raw, f, k)
    x = np.atleast_2d(np.asarray(x, np.float32))
    m = x.shape[0]
    kp = p.values.shape[1]
    xp = np.zeros((m, kp), np.float32)
    xp[:, :k] = x
    a = kp if act_block is None or act_block >= k else int(act_block)
    xq, s = quantize_activation(xp, a)
    xq = xq.astype(np.int64)
    nb, per_sub = kp // f.super, f.super // f.sub
    v = p.values.astype(np.int64)
    dots = np.stack([xq[:, j * f.sub:(j + 1) * f.sub] @ v[:, j * f.sub:(j + 1) * f.sub].T
                     for j in range(kp // f.sub)], axis=2)                          # [M, N, subs]
    xs = xq.reshape(m, kp // f.sub, f.sub).sum(-1)                                   # [M, subs]
    A = (dots * p.sc[None].astype(np.int64)).reshape(m, -1, nb, per_sub).sum(-1)      # [M, N, nb]
    B = (xs[:, None, :] * p.mn[None].astype(np.int64)).reshape(m, -1, nb, per_sub).sum(-1)
    sx = s.astype(np.float64)[:, (np.arange(nb) * f.super) // a]                     # [M, nb]
    d, mm = p.d.astype(np.float64)[None], p.m.astype(np.float64)[None]              # [1, N, nb]
    with np.errstate(invalid="ignore"):
        y = (sx[:, None, :] * (d * A + mm * B)).sum(-1)
        mag = (np.abs(sx)[:, None, :] * (np.abs(d * A) + np.abs(mm * B))).sum(-1)
    if bias is not None:
        b = np.asarray(bias, np.float32).astype(np.float64)
        y, mag = y + b, mag + np.abs(b)
    return y, mag
