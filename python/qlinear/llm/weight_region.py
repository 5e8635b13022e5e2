"""A model's packed weights in one region of memory on transparent huge pages.

A decode step reads every active weight once per token (~118 MB for the Qwen2.5-0.5B-shaped MoE
bench model at 4 bits): on 4 KiB pages that is ~28,000 pages, each a TLB miss and a page walk
beside the weights' own cache misses; on 2 MiB pages it is ~60. Linux backs an anonymous private
mapping with huge pages where it is advised so (``MADV_HUGEPAGE``, honoured unless
/sys/kernel/mm/transparent_hugepage/enabled says "never"), one 2 MiB-aligned range at a time; the
separate numpy buffers of a few hundred KB that the loaders pack into never are. So ``llm.load``
copies the packed weights that live in process memory into one such region and drops the
originals, handing their memory back to the system every 32 MB moved (glibc keeps freed heap
memory otherwise), so the resident size does not grow and its peak only by that much; weights
mapped from a file stay mapped (page cache, shared between processes). docs/llm.md, "Weights on
huge pages", has the measured effect.

QLINEAR_HUGE_PAGES=0 in the environment keeps every weight where its loader put it.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import os
import sys

import numpy as np

from .._packed import PackedWeight

HUGE_PAGE = 2 << 20
_ALIGN = 64  # each weight starts on a cache line
_THP_SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"
_TRIM_EVERY = 32 << 20


def available() -> bool:
    """Whether huge pages can be asked for here (Linux with transparent huge pages not "never",
    and not turned off by QLINEAR_HUGE_PAGES=0)."""
    if os.environ.get("QLINEAR_HUGE_PAGES", "1") == "0":
        return False
    if not sys.platform.startswith("linux") or not hasattr(mmap, "MADV_HUGEPAGE"):
        return False
    try:
        with open(_THP_SETTING) as f:
            return "[never]" not in f.read()
    except OSError:  # no sysfs (a container may hide it): advising is harmless
        return True


def _mapped(w: PackedWeight) -> bool:
    """Whether ``w``'s bytes lie in a mapping (their chain of buffer owners ends in an mmap): a
    mapped file, or a region placed before."""
    obj = w.buffer.base
    for _ in range(16):
        if isinstance(obj, mmap.mmap):
            return True
        nxt = obj.obj if isinstance(obj, memoryview) else getattr(obj, "base", None)
        if nxt is None:
            return False
        obj = nxt
    return False


@functools.lru_cache(maxsize=None)
def _malloc_trim():
    """glibc's malloc_trim, or None (another C library)."""
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None


def _return_freed_memory() -> None:
    """Hand the heap's free pages back to the system (the originals just dropped)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def _region(nbytes: int) -> np.ndarray:
    """``nbytes`` of zeroed anonymous private memory starting on a 2 MiB boundary, advised as huge pages."""
    mm = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    whole = np.frombuffer(mm, np.uint8)
    start = -whole.ctypes.data % HUGE_PAGE
    mm.madvise(mmap.MADV_HUGEPAGE, start, nbytes)  # before the first touch: faults then take 2 MiB
    return whole[start:start + nbytes]


def place(tensors: dict) -> int:
    """Move the PackedWeights of ``tensors`` (a name -> tensor dict, changed in place) that live in
    process memory into one huge-page region, in the dict's order; returns the bytes moved (0
    where huge pages are not available)."""
    if not available():
        return 0
    names = _movable(tensors)
    if not names:
        return 0
    try:
        region = _region(sum(_size(tensors[same[0]]) for same in names.values()))
    except OSError:  # a kernel without transparent huge pages refuses the advice: nothing to gain
        return 0
    at = trimmed = 0
    for same in names.values():
        placed = tensors[same[0]].copy_to(region[at:at + tensors[same[0]].nbytes])
        for name in same:
            tensors[name] = placed  # the original's last reference gone: freed
        at += _size(placed)
        if at - trimmed >= _TRIM_EVERY:
            _return_freed_memory()
            trimmed = at
    _return_freed_memory()
    return at


def _movable(tensors: dict) -> dict:
    """id -> the names of each PackedWeight in process memory (a weight held under several names
    is moved once)."""
    names: dict = {}
    for name, t in tensors.items():
        if isinstance(t, PackedWeight) and not _mapped(t):
            names.setdefault(id(t), []).append(name)
    return names


def _size(w: PackedWeight) -> int:
    return -(-w.nbytes // _ALIGN) * _ALIGN
