"""The options of ``llm.load`` / ``llm.convert`` that shape a model (checked once)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Union

import numpy as np

from .._scheme import DEFAULT_ACT_BLOCK, ActBlock

KV_DTYPES = {"float32": np.float32, "float16": np.float16}


@dataclass(frozen=True)
class Options:
    bits: Optional[int] = 4            # 4 / 8: quantized weights; None: weights kept in float32
    group_size: Optional[int] = 64     # None: one scale per output row
    symmetric: bool = False
    act: str = "int8"                  # "int8": W4A8 / W8A8 kernels; "float": low-memory float path
    act_block: ActBlock = DEFAULT_ACT_BLOCK  # activation scales, as qlinear.matmul's act_block
    memory: str = "low"                # "normal" with act="float": dequantize weights at load;
                                       # "flash": FFN weights read from the file per forward
    disk_embedding: bool = True
    slim_vocab: Union[bool, Sequence[int]] = False
    kv_cache: str = "float32"          # the KV cache's element type: "float32" or "float16"

    def check(self) -> "Options":
        if self.bits not in (None, 4, 8):
            raise ValueError(f"bits must be 4, 8 or None, got {self.bits!r}")
        if self.act not in ("int8", "float"):
            raise ValueError(f"act must be 'int8' or 'float', got {self.act!r}")
        if self.memory not in ("low", "normal", "flash"):
            raise ValueError(f"memory must be 'low', 'normal' or 'flash', got {self.memory!r}")
        if self.kv_cache not in KV_DTYPES:
            raise ValueError(f"kv_cache must be 'float32' or 'float16', got {self.kv_cache!r}")
        if self.bits is None and self.act == "int8":
            raise ValueError("act='int8' needs quantized weights (bits=4 or 8); use act='float' with bits=None")
        return self
