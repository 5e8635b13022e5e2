"""What a flash model keeps in memory: the converted model's tensors read, each checked against
its CRC and copied out of the mapped file (so the page cache may drop the file), but for the
weights it streams."""

from __future__ import annotations

from pathlib import Path

from ..._format import check_crc
from ..converted import source as converted_source
from ..options import Options
from ..source import Source
from . import layout as flash_layout


def resident_source(d: Path, opts: Options, entries: dict, streamed: set) -> Source:
    """The converted model in ``d`` without the tensors named in ``streamed`` (the file is not
    verified whole: the streamed weights are checked as they are read), the rest resident."""
    path = d / converted_source.MODEL_FILE
    source = converted_source.read(d, opts, verify=False)
    for name in list(source.tensors):
        if name in streamed:
            del source.tensors[name]
        elif name in entries:
            check_crc(path, entries[name])
            source.tensors[name] = flash_layout.copy_resident(source.tensors[name])
    return source
