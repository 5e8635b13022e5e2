"""Helpers shared by the benchmark files."""

from __future__ import annotations

import pytest


def shape_id(shape) -> str:
    """(M, K, N) -> "MxKxN", the id benchmarks and reports use."""
    return "x".join(map(str, shape))


def blas_threads(threads: int):
    """A context limiting numpy's BLAS to `threads` threads; skips the case without threadpoolctl."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        pytest.skip("numpy thread control needs threadpoolctl (pip install threadpoolctl)")
    return threadpool_limits(limits=threads, user_api="blas")
