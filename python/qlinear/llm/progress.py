"""Progress bars for loading and converting (tqdm when installed and wanted, else silent)."""

from __future__ import annotations


class _Quiet:
    def update(self, n: int = 1) -> None:
        pass

    def set_description(self, desc: str) -> None:
        pass

    def close(self) -> None:
        pass


def progress(total: int, desc: str, enabled: bool, unit: str = "layer", leave: bool = False):
    """A bar of ``total`` steps on stderr, or an object with the same methods doing nothing."""
    if not enabled:
        return _Quiet()
    try:
        from tqdm.auto import tqdm  # noqa: PLC0415
    except ImportError:
        return _Quiet()
    return tqdm(total=total, desc=desc, unit=unit, leave=leave)
