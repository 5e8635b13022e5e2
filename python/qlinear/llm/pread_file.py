"""Reading parts of a large file with pread: the page cache holds the file, the process only
what it keeps (a mapping would make every page read resident in the process)."""

from __future__ import annotations

import os


class PreadFile:
    def __init__(self, path):
        self.path = os.fspath(path)
        self._fd = os.open(self.path, os.O_RDONLY)
        self.size = os.fstat(self._fd).st_size

    def read(self, offset: int, length: int) -> bytes:
        """Exactly ``length`` bytes at ``offset``; ValueError if the file is shorter."""
        if self._fd is None:
            raise ValueError(f"{self.path}: the file is closed")
        data = os.pread(self._fd, length, offset) if length else b""
        if len(data) != length:
            raise ValueError(f"{self.path}: short read of {length} bytes at {offset} (truncated?)")
        return data

    def fileno(self) -> int:
        if self._fd is None:
            raise ValueError(f"{self.path}: the file is closed")
        return self._fd

    def close(self) -> None:
        fd, self._fd = getattr(self, "_fd", None), None
        if fd is not None:
            os.close(fd)

    def __del__(self):
        try:
            self.close()
        except OSError:
            pass
