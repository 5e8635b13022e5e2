"""Giving freed heap memory back to the OS while a model is read layer by layer."""

from __future__ import annotations

import ctypes

_malloc_trim = None


def trim_heap() -> None:
    """glibc's malloc_trim(0): loading makes a layer's transient arrays, and glibc keeps freed
    heap memory by default (its mmap threshold grows after the first large free), so without
    this the peak RSS of a load grows by the sum of the leftovers. A no-op elsewhere."""
    global _malloc_trim
    if _malloc_trim is None:
        try:
            _malloc_trim = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _malloc_trim = False
    if _malloc_trim:
        _malloc_trim(0)
