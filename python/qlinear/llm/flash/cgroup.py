"""A memory limit that counts the page cache: a child memory cgroup of this process's own
(cgroup v2 ``memory.max`` or v1 ``memory.limit_in_bytes``; needs root), a command run inside it,
its peak usage (RSS + page cache) read back. For benchmarks and tests of memory="flash"."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Optional

ROOT = Path("/sys/fs/cgroup")


def _own_memory_cgroup() -> tuple[Optional[Path], str]:
    """(directory of this process's memory cgroup, "v1" / "v2"), or (None, why not)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError as e:
        return None, f"no /proc/self/cgroup ({e})"
    for line in lines:
        hid, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            d = ROOT / "memory" / path.lstrip("/")
            return (d, "v1") if (d / "memory.limit_in_bytes").exists() else (None, f"{d}: no memory.limit_in_bytes")
    for line in lines:
        hid, controllers, path = line.split(":", 2)
        if hid == "0":
            for base in (ROOT, ROOT / "unified"):
                if "memory" in (base / "cgroup.controllers").read_text().split() if (base / "cgroup.controllers").exists() else ():
                    return base / path.lstrip("/"), "v2"
    return None, "no memory cgroup controller is mounted"


def unavailable_reason() -> Optional[str]:
    """Why a limited child cgroup cannot be made here, or None if it can."""
    if os.geteuid() != 0:
        return "creating a memory cgroup needs root"
    d, kind = _own_memory_cgroup()
    if d is None:
        return kind
    if not os.access(d, os.W_OK):
        return f"{d} is not writable"
    return None


class MemoryCgroup:
    """``with MemoryCgroup(limit_bytes) as cg: cg.run([...])``; ``cg.peak`` after the run."""

    def __init__(self, limit_bytes: int, name: Optional[str] = None):
        why = unavailable_reason()
        if why is not None:
            raise ValueError(f"cannot make a memory cgroup: {why}")
        parent, self.kind = _own_memory_cgroup()
        self.dir = parent / (name or f"qlinear-flash-{os.getpid()}")
        self.limit = int(limit_bytes)

    def _file(self, v1: str, v2: str) -> Path:
        return self.dir / (v1 if self.kind == "v1" else v2)

    def __enter__(self) -> "MemoryCgroup":
        self.dir.mkdir()
        if self.kind == "v2" and not (self.dir / "memory.max").exists():
            (self.dir.parent / "cgroup.subtree_control").write_text("+memory")
        self._file("memory.limit_in_bytes", "memory.max").write_text(str(self.limit))
        return self

    def run(self, cmd: list, timeout: Optional[float] = None, **kw) -> subprocess.CompletedProcess:
        """Run ``cmd`` inside the cgroup (moved in before it execs) and wait for it."""
        procs = str(self.dir / "cgroup.procs")

        def enter():
            with open(procs, "w") as f:
                f.write(str(os.getpid()))

        self.reset_peak()
        return subprocess.run(cmd, preexec_fn=enter, timeout=timeout, **kw)

    def reset_peak(self) -> None:
        f = self._file("memory.max_usage_in_bytes", "memory.peak")
        try:
            f.write_text("0" if self.kind == "v1" else "1")
        except OSError:
            pass  # v2 kernels before 6.12 cannot reset memory.peak: a fresh cgroup per run then

    @property
    def peak(self) -> int:
        """Peak memory use (RSS + page cache) since the last run started."""
        return int(self._file("memory.max_usage_in_bytes", "memory.peak").read_text())

    def __exit__(self, *exc) -> None:
        try:
            self.dir.rmdir()
        except OSError:
            pass
