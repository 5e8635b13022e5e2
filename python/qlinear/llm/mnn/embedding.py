"""The embedding of an export with tied embeddings: no ``embeddings_bf16.bin``, the rows are the
lm head's quantized records, which ``llm_config.json`` points at (``tie_embeddings = [codes
offset, block parameters offset, their bytes, bits, block]``). Rows are dequantized as MNN's
engine does (``zero + scale * (code - 2^(bits-1))`` in float32, the ``offset + scale * code`` of
the linear records) and read with pread, one row at a time (or all of them, ``open(False)``)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..runtime.embedding import MemoryEmbedding, _check_ids
from .weights import QuantizedLinear, WeightFile, _unpack_codes


class TiedEmbedding:
    """[vocab, hidden] rows of the lm head's records in ``llm.mnn.weight``."""

    dtype = "float32"   # of the rows as computed (sqrt(hidden) for Gemma in float32, as the graph)

    def __init__(self, wf: WeightFile, codes_at: int, alpha_at: int, vocab: int, hidden: int,
                 bits: int, n_blocks: int, symmetric: bool):
        self.wf, self.codes_at, self.alpha_at = wf, codes_at, alpha_at
        self.vocab_size, self.hidden_size, self.bits, self.n_blocks = vocab, hidden, bits, n_blocks
        self.per_block = 1 if symmetric else 2
        self.row_bytes = hidden * bits // 8
        self.alpha_row = 4 * n_blocks * self.per_block

    @property
    def path(self) -> str:
        return str(self.wf.path)

    def _rows(self, first: int, n: int) -> np.ndarray:
        packed = self.wf.bytes(self.codes_at + first * self.row_bytes, n * self.row_bytes, "tied embedding codes")
        codes = _unpack_codes(packed, self.bits, n * self.hidden_size).reshape(n, self.hidden_size)
        alpha = self.wf.floats(self.alpha_at + first * self.alpha_row, n * self.alpha_row,
                               "tied embedding block parameters").reshape(n, self.n_blocks, self.per_block)
        scale = alpha[..., -1]
        zero = alpha[..., 0] if self.per_block == 2 else np.zeros_like(scale)
        offset = (zero - np.float32(1 << (self.bits - 1)) * scale).astype(np.float32)
        group = None if self.n_blocks == 1 else self.hidden_size // self.n_blocks
        return QuantizedLinear(codes, scale, offset, self.bits, group).dequantize()

    def __call__(self, ids: Sequence[int]) -> np.ndarray:
        ids = _check_ids(ids, self.vocab_size)
        return np.concatenate([self._rows(int(t), 1) for t in ids])

    def raw(self) -> np.ndarray:
        """The whole table, float32 [vocab, hidden]."""
        return self._rows(0, self.vocab_size)

    def open(self, on_disk: bool):
        return self if on_disk else MemoryEmbedding(self.raw())


def tied_embedding(wf: WeightFile, tie, head_op: dict, vocab: int, hidden: int, where: str) -> TiedEmbedding:
    """The TiedEmbedding ``tie`` (``llm_config.json``'s ``tie_embeddings``) describes, checked to be
    the lm head's own records (``head_op``, the graph's lm head)."""
    if not (isinstance(tie, list) and len(tie) == 5 and all(isinstance(x, int) for x in tie)):
        raise ValueError(f"{where}: tie_embeddings must be 5 integers, got {tie!r}")
    codes_at, alpha_at, alpha_bytes, bits, block = tie
    if codes_at == 0:   # llmexport --embed_bit: its own quantized file
        raise ValueError(f"{where}: a quantized embedding file (embeddings_int{bits}.bin) is not supported")
    main = head_op.get("main") or {}
    ext = [int(x) for x in main.get("external") or [0, 0, 0]]
    head_bits = int((main.get("quanParameter") or {}).get("aMaxOrBits", 0))
    n_blocks = 1 if block == 0 else hidden // block
    code_bytes = vocab * hidden * bits // 8
    per_block = alpha_bytes // (4 * n_blocks * vocab) if n_blocks * vocab else 0
    if (bits != head_bits or block < 0 or (block and hidden % block) or per_block not in (1, 2)
            or alpha_bytes != 4 * per_block * n_blocks * vocab
            or codes_at != ext[0] + ext[1] - code_bytes or alpha_at != ext[0] + ext[1] or alpha_bytes != ext[2]):
        raise ValueError(f"{where}: tie_embeddings {tie} do not describe the lm head's records "
                         f"(external {ext[:3]}, {head_bits}-bit)")
    return TiedEmbedding(wf, codes_at, alpha_at, vocab, hidden, bits, n_blocks, symmetric=per_block == 1)
