"""Reading parts of a model file into preallocated buffers with parallel ``preadv`` calls, on
worker threads (``os.preadv`` releases the GIL), while the caller computes.

A job is a list of reads; a read is (file offset, [destination memoryviews]) filled in order by
one ``preadv`` (a contiguous file range scattered into several buffers), and optionally a function
the worker runs once it succeeded (moving its bytes). Workers take reads from one queue, so
several are in flight at once (the disk's queue depth). After each read the pages it brought
into the page cache are dropped (``posix_fadvise(DONTNEED)``): the page cache does not grow
(under a memory limit that counts it, it does not push out what the model holds). A ``direct``
plan (the expert cache's) skips the page cache (O_DIRECT, the aligned range around the bytes
into the worker's buffer, copied out): on a Zen 5 VM random experts cost 0.52 ms of CPU per MB
through the page cache, 0.08-0.11 with O_DIRECT, which also read faster (2.0-2.6 vs 1.5 GB/s).

Every read checks its length (a truncated file gives a short read), and a job checks that the
file was not changed on disk since it was opened (size, modification time, inode): a model
file changed under a running model raises ValueError instead of giving garbage logits.
"""

from __future__ import annotations

import errno
import mmap
import os
import queue
import threading
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np

IOV_MAX = 1024          # iovecs per preadv (Linux's limit)
CHUNK_BYTES = 4 << 20   # a large read is split into reads of this size, for reads in flight
STREAM_CHUNK = 8 << 20  # the read size of one stream that the kernel's readahead keeps ahead of
READAHEAD_MIN_KB = 1024   # the device's readahead window from which one run is read with it
DIRECT_ALIGN = 4096     # O_DIRECT reads: offset, length and buffer aligned to this (>= the logical block)


def _open_direct(path: str) -> Optional[int]:
    """``path`` opened with O_DIRECT; None where refused (older tmpfs) or a first read fails."""
    fd = None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT | getattr(os, "O_CLOEXEC", 0))
        os.preadv(fd, [mmap.mmap(-1, DIRECT_ALIGN, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)], 0)
        return fd
    except (OSError, AttributeError):   # AttributeError: no O_DIRECT on this platform
        if fd is not None:
            os.close(fd)
        return None


def read_ahead_path(path) -> Optional[str]:
    """The sysfs file of the kernel's readahead window (read_ahead_kb) of the block device
    holding ``path``; None where there is none (not a block device, no sysfs)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    dev = f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    for q in (os.path.join(dev, "queue"), os.path.join(os.path.realpath(dev), "..", "queue")):
        if os.path.exists(os.path.join(q, "read_ahead_kb")):
            return os.path.join(q, "read_ahead_kb")
    return None


def device_read_ahead_kb(path) -> Optional[int]:
    """read_ahead_kb of the device holding ``path`` (None: unknown)."""
    where = read_ahead_path(path)
    try:
        with open(where) as f:
            return int(f.read())
    except (TypeError, OSError, ValueError):
        return None


@dataclass(frozen=True)
class ReadPlan:
    """How a run of the file is read: with the kernel's readahead or without, on how many
    threads, in reads of how many bytes; ``direct``: O_DIRECT where the file system allows it."""

    readahead: bool
    threads: int
    chunk: int
    direct: bool = False


def checked_threads(threads: Optional[int]) -> Optional[int]:
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"reader threads must be an int >= 1, got {threads!r}")
    return threads


def read_plan(path, one_run: bool, threads: Optional[int] = None, direct: bool = False) -> ReadPlan:
    """The plan for reading ``path``'s streamed FFNs (``one_run``: one run of the file).

    One run on a device whose readahead window is large is read as one stream, by one thread:
    the kernel's readahead keeps the device busy, and several threads' reads interleave into a
    pattern the device does not see as a stream. Otherwise without readahead, exactly the bytes
    asked for (between attention weights it would run on into them; a small window only adds
    reads of its own), with several reads in flight for the device's queue. Qwen2.5-1.5B-shaped
    bench model under a 573 MB limit, Zen 4 VM (8 MiB read_ahead_kb): one stream 3.4-4.6 tok/s
    (1.6-2.1 GB/s), four threads 2.8-3.5; 128 KB read_ahead_kb: four threads without readahead
    2.6-3.0, one thread 2.1. ``direct``: reads without readahead skip the page cache."""
    threads = checked_threads(threads)
    ra_kb = device_read_ahead_kb(path)
    if one_run and ra_kb is not None and ra_kb >= READAHEAD_MIN_KB:
        return ReadPlan(True, threads or 1, STREAM_CHUNK)
    return ReadPlan(False, threads or 4, CHUNK_BYTES, direct)


@dataclass
class ReadStats:
    bytes: int = 0
    reads: int = 0
    jobs: int = 0
    sizes: dict = field(default_factory=dict)   # read size -> count

    def add(self, nbytes: int) -> None:
        self.bytes += nbytes
        self.reads += 1
        self.sizes[nbytes] = self.sizes.get(nbytes, 0) + 1


class Job:
    """Reads submitted together; ``wait()`` returns when all are done (or raises the error).
    ``after(ok)``: run by the worker that finishes the last read, before the job is done (e.g.
    moving what was read into place; ok: every read succeeded)."""

    def __init__(self, reads: list, after: Optional[Callable[[bool], None]] = None):
        self.reads, self.after = reads, after
        self._left = len(reads)
        self._lock = threading.Lock()
        self._done = threading.Event()
        self.error: Optional[BaseException] = None
        if not reads:
            self._done.set()

    def _finish_one(self, error: Optional[BaseException]) -> bool:
        with self._lock:
            if error is not None and self.error is None:
                self.error = error
            self._left -= 1
            return self._left == 0

    def wait(self) -> None:
        self._done.wait()
        if self.error is not None:
            raise self.error

    @property
    def done(self) -> bool:
        return self._done.is_set()


def split_reads(offset: int, views: Sequence[memoryview], chunk: int = CHUNK_BYTES) -> list:
    """Reads covering the contiguous file range at ``offset`` that ``views`` fill in order: one
    read per ``chunk`` bytes (a view larger than that split), at most IOV_MAX views each."""
    reads, cur, cur_bytes, start = [], [], 0, offset
    for v in views:
        v = memoryview(v).cast("B")
        while len(v):
            take = min(len(v), chunk - cur_bytes)
            cur.append(v[:take])
            cur_bytes += take
            v = v[take:]
            if cur_bytes == chunk or len(cur) == IOV_MAX:
                reads.append((start, cur))
                start, cur, cur_bytes = start + cur_bytes, [], 0
    if cur:
        reads.append((start, cur))
    return reads


class FlashReader:
    """Worker threads reading one file. ``submit(reads)`` -> Job; ``close()`` stops the workers
    and closes the file (also at garbage collection of the owner: see ``flash``)."""

    def __init__(self, path, plan: ReadPlan = ReadPlan(True, 4, CHUNK_BYTES), drop_cache: bool = True):
        workers, readahead = plan.threads, plan.readahead
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"reader workers must be an int >= 1, got {workers!r}")
        self.path = os.fspath(path)
        self.plan = plan   # plan.chunk: the read size its users split their reads into
        self.fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        self.identity = self._identity()
        self.drop_cache = drop_cache and hasattr(os, "posix_fadvise")
        if not readahead and hasattr(os, "posix_fadvise"):
            # the bytes asked for and no more: the kernel's readahead runs on past the end of each
            # range (up to the device's read_ahead_kb, 8 MiB on some virtual disks)
            os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_RANDOM)
        self.direct_fd = _open_direct(self.path) if plan.direct and not readahead else None
        self._refused_fd: Optional[int] = None
        self._staging = threading.local()   # direct reads: each worker's page-aligned buffer
        self.stats = ReadStats()
        self._stats_lock = threading.Lock()
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._work, name=f"qlinear-flash-reader-{i}", daemon=True)
                         for i in range(workers)]
        for t in self._threads:
            t.start()

    def _identity(self) -> tuple:
        st = os.fstat(self.fd)
        return st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev

    def check_unchanged(self) -> None:
        """ValueError if the file was truncated, rewritten or touched since it was opened."""
        if self.fd is None:
            raise ValueError(f"{self.path}: the model is closed")
        now = self._identity()
        if now != self.identity:
            raise ValueError(f"{self.path}: the model file changed on disk while the model was running "
                             f"(size {self.identity[0]} -> {now[0]} bytes); reload it")

    def submit(self, reads: list, after: Optional[Callable[[bool], None]] = None) -> Job:
        if self.fd is None:
            raise ValueError(f"{self.path}: the model is closed")
        job = Job(reads, after)
        with self._stats_lock:
            self.stats.jobs += 1
        for r in reads:
            self._queue.put((job, r))
        return job

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            job, (offset, views, *on_read) = item
            error = None
            try:
                want = sum(len(v) for v in views)
                n = self._read(offset, views, want)
                if n != want:
                    raise ValueError(f"{self.path}: short read: {n} of {want} bytes at offset {offset} "
                                     "(the model file was truncated?)")
                if self.drop_cache and self.direct_fd is None:
                    os.posix_fadvise(self.fd, offset, want, os.POSIX_FADV_DONTNEED)
                with self._stats_lock:
                    self.stats.add(want)
                if on_read:
                    on_read[0]()
            except (OSError, ValueError, TypeError) as e:
                error = e if isinstance(e, ValueError) else ValueError(f"{self.path}: read failed: {e}")
            if job._finish_one(error):
                if job.error is None:
                    try:
                        self.check_unchanged()
                    except ValueError as e:
                        job.error = e
                if job.after is not None:
                    try:
                        job.after(job.error is None)
                    except (ValueError, TypeError) as e:
                        job.error = job.error or (e if isinstance(e, ValueError) else ValueError(f"{self.path}: {e}"))
                job._done.set()

    def _read(self, offset: int, views: Sequence[memoryview], want: int) -> int:
        """One read; direct: the aligned range around it into this worker's buffer, copied out."""
        fd = self.direct_fd
        if fd is None:
            return os.preadv(self.fd, views, offset)
        start = offset - offset % DIRECT_ALIGN
        span = -(-(offset + want - start) // DIRECT_ALIGN) * DIRECT_ALIGN
        buf = getattr(self._staging, "buf", b"")
        if len(buf) < span:
            buf = self._staging.buf = mmap.mmap(-1, span, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        try:
            n = os.preadv(fd, [memoryview(buf)[:span]], start) - (offset - start)
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
            self.direct_fd, self._refused_fd = None, fd   # O_DIRECT opened but its reads refused
            return os.preadv(self.fd, views, offset)
        got, at = np.frombuffer(buf, np.uint8, span), offset - start
        for v in views:   # numpy copies without holding the GIL
            np.copyto(np.frombuffer(v, np.uint8), got[at:at + len(v)])
            at += len(v)
        return min(max(n, 0), want)

    @property
    def direct(self) -> bool:   # reads past the page cache (O_DIRECT)
        return self.direct_fd is not None

    @property
    def alive_threads(self) -> int:
        return sum(t.is_alive() for t in self._threads)

    def close(self) -> None:
        """Stop the workers (after the reads queued) and close the file; idempotent."""
        if self.fd is None:
            return
        for _ in self._threads:
            self._queue.put(None)
        for t in self._threads:
            if t is not threading.current_thread():
                t.join()
        for fd in {self.fd, self.direct_fd, self._refused_fd} - {None}:
            os.close(fd)
        self.fd = self.direct_fd = self._refused_fd = None
