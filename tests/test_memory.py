"""Memory: no growth over many calls, and loading a packed file costs ~its size (mmap, no copy)."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import qlinear

UNDER_ASAN = "libasan" in os.environ.get("LD_PRELOAD", "")


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(UNDER_ASAN, reason="ASan's quarantine keeps freed memory resident")
def test_rss_flat_over_100k_calls(rng):
    pw4 = qlinear.pack_weight(rng.standard_normal((64, 64)).astype(np.float32), bits=4, group_size=32)
    pw8 = qlinear.pack_weight(rng.standard_normal((64, 64)).astype(np.float32), bits=8, group_size=32)
    x1 = rng.standard_normal(64).astype(np.float32)
    x4 = rng.standard_normal((4, 64)).astype(np.float16)

    def calls(n):
        for i in range(n):
            qlinear.matmul_w4a8(x1, pw4)
            if i % 4 == 0:
                qlinear.matmul_w8a8(x4, pw8)
                qlinear.matmul_float(x4, pw4)

    calls(10_000)
    before = rss_bytes()
    calls(100_000)
    growth = rss_bytes() - before
    assert growth < 1 << 20, f"RSS grew by {growth} bytes over 100,000 calls"


def test_loading_costs_about_the_file_size(tmp_path, rng):
    path, small = tmp_path / "big.qlw", tmp_path / "small.qlw"
    w = rng.standard_normal((6144, 8192)).astype(np.float32)
    qlinear.save_weight(path, qlinear.pack_weight(w, bits=4, group_size=64))
    qlinear.save_weight(small, qlinear.pack_weight(w[:64], bits=4, group_size=64))
    del w
    size = os.path.getsize(path)
    script = textwrap.dedent(f"""
        import numpy as np, qlinear
        def status(key):  # VmRSS / VmHWM (peak) of this process, in bytes
            with open("/proc/self/status") as f:
                return next(int(l.split()[1]) * 1024 for l in f if l.startswith(key + ":"))
        x = np.ones(8192, np.float32)
        qlinear.matmul_w4a8(x, qlinear.load_weight({str(small)!r}))  # warm every code path first
        before = status("VmRSS")
        pw = qlinear.load_weight({str(path)!r})           # mmap + CRC check of every byte
        y = qlinear.matmul_w4a8(x, pw)
        print(status("VmHWM") - before)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    extra = int(out.stdout.strip())
    # A copy of the file would double the cost; 4 MiB over 1.1x covers the worker threads' stacks
    # and, under qemu-user, the translation cache of code the small call did not reach.
    assert extra <= 1.1 * size + (4 << 20), f"loading a {size}-byte file raised the peak RSS by {extra} bytes"
