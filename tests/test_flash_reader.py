"""The flash reader's reads past the page cache (O_DIRECT, qlinear.llm.flash.reader): any offset,
length and scatter of views gives the bytes a buffered read gives; a read past the end of the file
is a short read (ValueError); a file system that refuses O_DIRECT falls back to buffered reads."""

import os

import numpy as np
import pytest

from qlinear.llm.flash.reader import CHUNK_BYTES, DIRECT_ALIGN, FlashReader, ReadPlan

DIRECT = ReadPlan(False, 3, CHUNK_BYTES, direct=True)
BUFFERED = ReadPlan(False, 3, CHUNK_BYTES)


@pytest.fixture
def data_file(tmp_path):
    data = np.random.default_rng(0).integers(0, 256, 5 * DIRECT_ALIGN + 123, dtype=np.uint8)
    path = tmp_path / "data.bin"
    path.write_bytes(data.tobytes())
    return path, data


def _read(reader, reads):
    """reads: [(offset, [sizes])] -> the views' bytes, each read one scatter of its sizes."""
    jobs, outs = [], []
    for offset, sizes in reads:
        views = [np.zeros(n, np.uint8) for n in sizes]
        outs.append(views)
        jobs.append([(offset, [memoryview(v) for v in views])])
    for job in jobs:
        reader.submit(job).wait()
    return outs


READS = [(0, [DIRECT_ALIGN]), (1, [10]), (DIRECT_ALIGN - 1, [2]), (4097, [3000, 7, 5000]),
         (3 * DIRECT_ALIGN, [2 * DIRECT_ALIGN + 123]), (5 * DIRECT_ALIGN + 100, [23]), (777, [1])]


def test_direct_reads_equal_the_files_bytes(data_file):
    path, data = data_file
    reader = FlashReader(path, DIRECT)
    try:
        if not reader.direct:
            pytest.skip(f"{path.parent}: the file system refuses O_DIRECT")
        for (offset, sizes), views in zip(READS, _read(reader, READS)):
            np.testing.assert_array_equal(np.concatenate(views), data[offset:offset + sum(sizes)])
        assert reader.stats.bytes == sum(sum(s) for _, s in READS)
    finally:
        reader.close()
    assert not reader.direct


@pytest.mark.parametrize("plan", [DIRECT, BUFFERED], ids=["direct", "buffered"])
def test_read_past_the_end_is_a_short_read(data_file, plan):
    path, data = data_file
    reader = FlashReader(path, plan)
    try:
        for offset, n in ((len(data) - 10, 11), (len(data), 1), (len(data) + DIRECT_ALIGN, 5)):
            with pytest.raises(ValueError, match="short read"):
                reader.submit([(offset, [memoryview(np.zeros(n, np.uint8))])]).wait()
        (view,), = _read(reader, [(len(data) - 10, [10])])   # the reader goes on
        np.testing.assert_array_equal(view, data[-10:])
    finally:
        reader.close()


def test_a_file_system_without_direct_reads_falls_back(data_file, monkeypatch):
    """open(O_DIRECT) refused (EINVAL, as tmpfs before Linux 6.6): buffered reads, the same bytes."""
    path, data = data_file
    real_open = os.open

    def no_direct(name, flags, *args, **kwargs):
        if flags & getattr(os, "O_DIRECT", 0):
            raise OSError(22, "Invalid argument")
        return real_open(name, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", no_direct)
    reader = FlashReader(path, DIRECT)
    try:
        assert not reader.direct
        for (offset, sizes), views in zip(READS, _read(reader, READS)):
            np.testing.assert_array_equal(np.concatenate(views), data[offset:offset + sum(sizes)])
    finally:
        reader.close()


def test_direct_reads_refused_later_go_buffered(data_file, monkeypatch):
    """open(O_DIRECT) accepted but its reads refused (EINVAL): the read is done buffered, and the
    reader stays buffered."""
    path, data = data_file
    reader = FlashReader(path, DIRECT)
    try:
        if not reader.direct:
            pytest.skip(f"{path.parent}: the file system refuses O_DIRECT")
        direct_fd, real_preadv = reader.direct_fd, os.preadv

        def refuse(fd, *args):
            if fd == direct_fd:
                raise OSError(22, "Invalid argument")
            return real_preadv(fd, *args)

        monkeypatch.setattr(os, "preadv", refuse)
        for (offset, sizes), views in zip(READS, _read(reader, READS)):
            np.testing.assert_array_equal(np.concatenate(views), data[offset:offset + sum(sizes)])
        assert not reader.direct
    finally:
        reader.close()


@pytest.mark.parametrize("plan", [DIRECT, BUFFERED], ids=["direct", "buffered"])
def test_a_reads_own_function_runs_after_it_and_its_error_is_the_jobs(data_file, plan):
    path, data = data_file
    reader = FlashReader(path, plan)
    try:
        done, views = [], [np.zeros(100, np.uint8) for _ in range(3)]

        def check(i):
            def after_read():
                np.testing.assert_array_equal(views[i], data[1000 * i:1000 * i + 100])   # read before it runs
                done.append(i)
            return after_read
        job_done = []
        reader.submit([(1000 * i, [memoryview(v)], check(i)) for i, v in enumerate(views)],
                      lambda ok: job_done.append((ok, sorted(done)))).wait()
        assert job_done == [(True, [0, 1, 2])]   # the job's own function after every read's

        def fails():
            raise ValueError("move failed")
        skipped = []
        with pytest.raises(ValueError, match="move failed"):
            reader.submit([(0, [memoryview(views[0])], fails)]).wait()
        with pytest.raises(ValueError, match="short read"):   # a read that fails runs no function
            reader.submit([(len(data), [memoryview(views[0])], lambda: skipped.append(1))]).wait()
        assert not skipped
    finally:
        reader.close()
